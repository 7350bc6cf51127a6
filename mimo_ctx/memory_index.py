"""A full-text index of the memory files, on SQLite FTS5 (SPEC R5.6).

The index is a cache of the memory directory: every ``*.md`` and ``*.txt`` file
under a session's directory, its project's directory and the global directory
(SPEC A13), cut into line chunks and kept in an FTS5 table. It serves two
readers: the ``memory`` tool's search (ranked by FTS5's bm25) and the
``# Memory keys index`` section of the rebuild body (:meth:`MemoryIndex.paths`).

Design:

* **Reconciled with the disk, incrementally.** :meth:`MemoryIndex.reconcile`
  walks the three scope directories and compares each file's ``(size, mtime_ns)``
  with what was indexed: new and changed files are (re)indexed, deleted ones
  removed, the rest untouched. Files written by anything (the writer, the host, a
  person with an editor) appear at the next reconcile.
* **Scoped.** Every file row carries its scope (``session`` + session id,
  ``project`` + project id, or ``global``). A search or a path listing sees only
  one session, its project and the global scope, never another session's files
  (session isolation is a security property, SPEC R5.4).
* **Never outside the root.** Directory symlinks are not followed; a file
  symlink is indexed only when its target resolves inside the memory root; a
  scope directory whose real path leaves the root is skipped.
* **Chunks with line numbers.** A chunk is a paragraph (lines up to a blank
  line), at most :data:`CHUNK_MAX_LINES` lines or :data:`CHUNK_MAX_CHARS`
  characters, stored with its first line number; a hit reports the first line of
  the chunk that contains a query term.
* **Queries never raise.** The query is split on whitespace and each word is
  quoted as an FTS5 string literal (``"`` doubled), joined with ``OR``; the
  operators and syntax characters of FTS5 (``AND OR NOT NEAR * ^ : - ( ) "``)
  are therefore plain text. Words without a letter or digit are dropped; a query
  with none gives no hits.
* **CJK text.** FTS5's ``unicode61`` tokenizer keeps a run of CJK characters as
  one token, so ``数据库`` would not match inside ``我们的数据库很慢``. Each chunk
  also stores its CJK runs in a second column with every character as its own
  token; a CJK query word becomes a phrase of its characters, so it matches any
  occurrence of the sequence.
* **Text decoding.** Files are read as UTF-8 with invalid bytes replaced; a file
  with a NUL byte in its first 8 KiB is treated as binary and not indexed.
* **Off the event loop.** All SQLite and file work runs on the index's own
  worker thread, one job at a time under a thread lock, as in
  :class:`~mimo_ctx.store.sqlite.SQLiteStore` (:mod:`mimo_ctx._sqlite_worker`).

The database is a cache: a file written by an other schema version, or for an
other memory root, is emptied and rebuilt rather than refused.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

from mimo_ctx._index_listing import Listings, key_paths, read_listing
from mimo_ctx._sqlite_worker import SQLiteWorker
from mimo_ctx.errors import StoreError
from mimo_ctx.memory import is_hard_link

if TYPE_CHECKING:
    from mimo_ctx.memory import MemoryLayout

__all__ = [
    "CHUNK_MAX_CHARS",
    "CHUNK_MAX_LINES",
    "INDEXED_SUFFIXES",
    "INDEX_SCHEMA_VERSION",
    "MemoryHit",
    "MemoryIndex",
    "ReconcileStats",
    "ScopeKind",
    "fts_match_expression",
]


INDEX_SCHEMA_VERSION: Final = 1
"""Schema version of the index database (``PRAGMA user_version``)."""

INDEXED_SUFFIXES: Final = frozenset({".md", ".txt"})
"""File name suffixes (compared case-insensitively) the index reads."""

CHUNK_MAX_LINES: Final = 20
"""A chunk ends after this many lines even without a blank line."""

CHUNK_MAX_CHARS: Final = 2000
"""A chunk ends once it holds this many characters (a longer line is one chunk)."""

MAX_FILE_BYTES: Final = 16 * 1024 * 1024
"""Only this many bytes of a file are indexed (bounded memory per file)."""

_BINARY_PROBE: Final = 8192
_MAX_QUERY_WORDS: Final = 32
_MAX_QUERY_CHARS: Final = 2000
_SNIPPET_CHARS: Final = 200
_BATCH_BYTES: Final = 8 * 1024 * 1024
_ZWSP: Final = "\u200b"

ScopeKind = Literal["session", "project", "global"]

# Scripts written without spaces between words: CJK ideographs (with extension
# blocks and compatibility ideographs), kana and the CJK symbols/fullwidth forms
# that FTS5's unicode61 would glue to them.
_CJK: Final = re.compile(
    "[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]+"
)

_OUR_TABLES: Final = frozenset({"meta", "files", "chunks"})

_SCHEMA: Final = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE files (
        id INTEGER PRIMARY KEY,
        path TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        scope TEXT NOT NULL,
        size INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        indexed INTEGER NOT NULL,
        first_row INTEGER NOT NULL,
        n_rows INTEGER NOT NULL
    )""",
    "CREATE INDEX files_by_scope ON files (kind, scope)",
    # body: the chunk as written; cjk: its CJK runs, one token per character.
    # The rowids of one file's chunks are the range first_row .. first_row+n_rows-1,
    # so a file's chunks are deleted by rowid range without an extra table.
    """CREATE VIRTUAL TABLE chunks USING fts5(
        body, cjk, file_id UNINDEXED, line UNINDEXED,
        tokenize = 'unicode61 remove_diacritics 2'
    )""",
)


# ORDER BY the FTS5 "rank" column alone (bm25 by default) lets FTS5 sort inside
# the virtual table and stream rows in rank order, so the join stops after LIMIT
# in-scope rows; any extra sort key forces a temporary B-tree over every match
# (2-3x slower for common words on 100 MB).
_SEARCH_SQL: Final = (
    "SELECT f.path, f.kind, c.line, c.body, c.rank "
    "FROM chunks AS c JOIN files AS f ON f.id = c.file_id "
    "WHERE chunks MATCH ? AND ("
    "f.kind = 'global' OR (f.kind = 'project' AND f.scope = ?) "
    "OR (f.kind = 'session' AND f.scope = ?)) "
    "ORDER BY c.rank LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class MemoryHit:
    """One search hit.

    Attributes:
        path: The file, relative to the memory root, ``/``-separated.
        line: 1-based number of the first line of the hit that contains a query term.
        snippet: That line, cut to about 200 characters around the term.
        score: FTS5 bm25 score (lower is better).
        scope: ``session``, ``project`` or ``global``.
    """

    path: str
    line: int
    snippet: str
    score: float
    scope: ScopeKind


@dataclass(frozen=True, slots=True)
class ReconcileStats:
    """What one :meth:`MemoryIndex.reconcile` changed.

    Attributes:
        added: Files indexed for the first time.
        updated: Files re-indexed because their size or mtime changed.
        removed: Files dropped because they are gone from the disk.
        unchanged: Files left as they were.
        skipped: Files seen but not indexed (binary, or symlinks out of the root).
    """

    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    skipped: int = 0


class _Seen(NamedTuple):
    # A tuple, not a dataclass: a scan makes one per file of a scope at every rebuild.
    path: str  # relative, posix
    real: str  # the file to read
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class _Scope:
    kind: ScopeKind
    scope: str
    directory: Path


# -- pure helpers --------------------------------------------------------------------------------


def _cjk_tokens(text: str) -> str:
    """The CJK runs of ``text`` with every character a separate FTS5 token."""
    runs = _CJK.findall(text)
    if not runs:
        return ""
    return " ".join(_ZWSP.join(run) for run in runs)


def _has_word_char(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def _query_terms(query: str) -> list[str]:
    """Split a query into terms, each to be quoted as one FTS5 string.

    Words are split on whitespace; inside a word, CJK runs become their own
    terms with a separator between the characters, so FTS5 reads them as a
    phrase over the ``cjk`` column. Terms without a letter or digit are dropped.
    """
    terms: list[str] = []
    for word in query.replace("\x00", " ")[:_MAX_QUERY_CHARS].split():
        pos = 0
        for match in _CJK.finditer(word):
            terms.append(word[pos : match.start()])
            terms.append(_ZWSP.join(match.group(0)))
            pos = match.end()
        terms.append(word[pos:])
    kept: list[str] = []
    for term in terms:
        if term and _has_word_char(term) and term not in kept:
            kept.append(term)
    return kept[:_MAX_QUERY_WORDS]


def fts_match_expression(query: str) -> str | None:
    """Turn free text into an FTS5 MATCH expression that cannot be a syntax error.

    Each word is quoted as an FTS5 string literal (inner ``"`` doubled) and the
    words are joined with ``OR``, so bm25 ranks chunks holding more of them
    first. FTS5 operators and syntax characters in the query are plain text.

    Args:
        query: What the model typed.

    Returns:
        The expression, or ``None`` when the query has no letter or digit (no hits).
    """
    terms = _query_terms(query)
    if not terms:
        return None
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def _chunk_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield ``(first line number, chunk text)``; blank lines separate chunks."""
    lines = text.split("\n")
    start = 0
    buf: list[str] = []
    size = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.removesuffix("\r")
        if not line.strip():
            if buf:
                yield start, "\n".join(buf)
                buf, size = [], 0
            continue
        if not buf:
            start = number
        buf.append(line)
        size += len(line) + 1
        if len(buf) >= CHUNK_MAX_LINES or size >= CHUNK_MAX_CHARS:
            yield start, "\n".join(buf)
            buf, size = [], 0
    if buf:
        yield start, "\n".join(buf)


def _fold(text: str) -> str:
    return text.casefold()


def _locate(body: str, first_line: int, terms: Sequence[str]) -> tuple[int, str]:
    """The line of ``body`` holding a query term first, and a snippet of it."""
    needles = [_fold(t.replace(_ZWSP, "")) for t in terms]
    lines = body.split("\n")
    for offset, line in enumerate(lines):
        folded = _fold(line)
        positions = [i for i in (folded.find(n) for n in needles if n) if i >= 0]
        if positions:
            return first_line + offset, _snippet(line, min(positions))
    # FTS5 matched through tokenizer folding (diacritics, split words): the
    # chunk start is still a good pointer.
    return first_line, _snippet(lines[0], 0)


def _snippet(line: str, at: int) -> str:
    line = line.strip() if len(line) <= _SNIPPET_CHARS else line
    if len(line) <= _SNIPPET_CHARS:
        return line
    start = max(0, min(at - _SNIPPET_CHARS // 3, len(line) - _SNIPPET_CHARS))
    piece = line[start : start + _SNIPPET_CHARS].strip()
    prefix = "…" if start > 0 else ""
    suffix = "…" if start + _SNIPPET_CHARS < len(line) else ""
    return f"{prefix}{piece}{suffix}"


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _scan(scope: _Scope, root_real: str, root: Path) -> tuple[list[_Seen], int]:
    """List the indexable files of one scope directory; also count skipped symlinks."""
    directory = scope.directory
    try:
        base_real = os.path.realpath(directory)
    except OSError:
        return [], 0
    if not _inside(base_real, root_real) or not os.path.isdir(base_real):
        return [], 0
    seen: list[_Seen] = []
    skipped = 0
    root_prefix = os.path.join(str(root), "")
    top = os.fspath(directory)
    # A layout's scopes lie under the root: each relative path is a cut of one length.
    cut = len(root_prefix) if top.startswith(root_prefix) and os.sep == "/" else -1
    for entry in _walk_files(top):
        full = entry.path
        real = full
        try:
            if entry.is_symlink():
                real = os.path.realpath(full)
                if not _inside(real, root_real):
                    skipped += 1
                    continue
                st = os.stat(real)
            else:
                # The entry's own lstat: for anything but a symlink it is the stat.
                st = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # vanished or unreadable between listing and stat
        if not stat.S_ISREG(st.st_mode):
            continue
        if is_hard_link(st):
            skipped += 1  # its other name may be anywhere: never indexed
            continue
        rel = full[cut:] if cut >= 0 else _relative(full, root, root_prefix)
        seen.append(_Seen(rel, real, st.st_size, st.st_mtime_ns))
    return seen, skipped


def _walk_files(top: str) -> list[os.DirEntry[str]]:
    """The files ``os.walk(top, followlinks=False)`` lists with a name the index reads.

    In its order, as entries with their paths and ``lstat`` (no path joins). A link to
    a directory is never entered (a link to "/" cannot pull the whole disk in); an
    unreadable directory is skipped. Depth first with a stack, not nested generators.
    """
    files: list[os.DirEntry[str]] = []
    pending = [top]
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                entries = list(listing)
        except OSError:
            continue
        directories: list[str] = []
        for entry in entries:
            try:
                is_directory = entry.is_dir()
            except OSError:
                is_directory = False
            if is_directory:
                directories.append(entry.path)
                continue
            # Hidden files (editor swap files, atomic-write temporaries) are not memory.
            name = entry.name
            dot = name.rfind(".")
            if dot > 0 and name[0] != "." and name[dot:].lower() in INDEXED_SUFFIXES:
                files.append(entry)
        # The first directory is entered next, its own directories before the second.
        pending.extend(d for d in reversed(directories) if not os.path.islink(d))
    return files


def _relative(full: str, root: Path, root_prefix: str) -> str:
    """``full`` relative to ``root``, with ``/`` separators.

    The scope directories are under the root (absolute, normalised), so the walk's
    paths start with it and the prefix is cut off; ``relpath`` (two ``abspath``
    calls and a split per file) only for anything else.
    """
    if full.startswith(root_prefix):
        rel = full[len(root_prefix) :]
        return rel if os.sep == "/" else Path(rel).as_posix()
    return Path(os.path.relpath(full, root)).as_posix()


def _read_text(real: str) -> str | None:
    """The file's text (invalid UTF-8 replaced), or ``None`` for binary/unreadable."""
    try:
        with open(real, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES)
    except OSError:
        return None
    if b"\x00" in data[:_BINARY_PROBE]:
        return None
    return data.decode("utf-8", errors="replace")


# -- the index -----------------------------------------------------------------------------------


class MemoryIndex(SQLiteWorker):
    """SQLite FTS5 index of a memory root's files (see the module docstring).

    One index may serve many sessions; each query names its session and
    project. ``db_path=":memory:"`` keeps the index in memory (rebuilt per
    process); a file path keeps it between runs, so a restart only reads the
    files that changed.

    Example:
        >>> index = MemoryIndex("memory-index.sqlite3")  # doctest: +SKIP
        >>> await index.reconcile(layout, session_id="ses_1", project_id="p")  # doctest: +SKIP
        >>> hits = await index.search(  # doctest: +SKIP
        ...     "rate limit", session_id="ses_1", project_id="p")
    """

    def __init__(self, db_path: str | os.PathLike[str] = ":memory:") -> None:
        """Prepare an index on ``db_path`` (opened on first use).

        Args:
            db_path: The index database file (created if missing), or ``":memory:"``.
        """
        super().__init__(db_path, label="memory index")
        # The files table's rows per scope, as this connection last saw them.
        self._listings = Listings()

    # -- plumbing (the worker thread is SQLiteWorker's) --------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            if self._path != ":memory:" and not self._path.startswith("file:"):
                # The index is a cache: its folder is created on first use.
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self._path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open memory index {self._path}: {exc}") from exc
        try:
            self._initialise(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(
                f"{self._path} is not a usable memory index database ({exc}); "
                "delete it (it is a cache) or pass another path"
            ) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _current(conn: sqlite3.Connection) -> bool:
        """True when the database holds an index of our schema version.

        Raises:
            sqlite3.DatabaseError: Not a database, or a database of someone else's.
        """
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version == INDEX_SCHEMA_VERSION and tables >= _OUR_TABLES:
            return True
        if tables and not _OUR_TABLES & tables:
            raise sqlite3.DatabaseError("it holds tables that are not a memory index")
        return False

    def _initialise(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA busy_timeout = 30000")
        current = self._current(conn)
        self._pragmas(conn)
        if current:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Checked again under the write lock: another connection may have
            # created the schema meanwhile.
            if not self._current(conn):
                # Empty, or an older/newer index: it is a cache, so start over.
                for name in ("chunks", "files", "meta"):
                    conn.execute(f"DROP TABLE IF EXISTS {name}")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {INDEX_SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _pragmas(self, conn: sqlite3.Connection) -> None:
        if self._path != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")

    # -- reconcile -------------------------------------------------------------------------------
    async def reconcile(
        self, layout: MemoryLayout, *, session_id: str, project_id: str | None
    ) -> ReconcileStats:
        """Bring the index in line with the disk for one session, its project and global.

        Walks the three scope directories, indexes new files and files whose size
        or mtime changed, and drops files that are gone. Other sessions' rows are
        left alone.

        Args:
            layout: The memory layout (gives the root and the scope directories).
            session_id: The session whose directory is reconciled.
            project_id: The project whose directory is reconciled; ``None`` for none.

        Returns:
            Counts of what changed.

        Raises:
            PathEscapeError: The layout refuses the session or project id.
            StoreError: The index database failed.
        """
        return await self._run(lambda conn: self._reconcile(conn, layout, session_id, project_id))

    async def reconciled_paths(
        self, layout: MemoryLayout, *, session_id: str, project_id: str | None
    ) -> list[str]:
        """:meth:`reconcile`, then :meth:`paths`, in one worker-thread call.

        What a rebuild's memory keys index needs (R5.6): one hand-off to the
        index's thread instead of two.
        """

        def run(conn: sqlite3.Connection) -> list[str]:
            self._reconcile(conn, layout, session_id, project_id)
            scopes = [("session", session_id), ("global", "")]
            if project_id is not None:
                scopes.append(("project", project_id))
            # The rows the reconcile just compared (or wrote), unless another
            # connection committed meanwhile: then the database is asked.
            kept = self._listings.indexed_paths(conn, scopes)
            if kept is None:
                return self._paths(conn, session_id, project_id, exclude_injected=True)
            return key_paths(kept, session_id, project_id, exclude_injected=True)

        return await self._run(run)

    def _reconcile(
        self,
        conn: sqlite3.Connection,
        layout: MemoryLayout,
        session_id: str,
        project_id: str | None,
    ) -> ReconcileStats:
        root = Path(layout.root)
        scopes = [_Scope("session", session_id, layout.session_dir(session_id))]
        if project_id is not None:
            scopes.append(_Scope("project", project_id, layout.project_dir(project_id)))
        scopes.append(_Scope("global", "", layout.global_dir()))
        # MemoryLayout.root is already absolute and symlink-free.
        root_key = str(root)
        if self._check_root(conn, root_key):
            self._listings.clear()
        totals = ReconcileStats()
        for scope in scopes:
            seen, skipped = _scan(scope, root_key, root)
            stats = self._apply(conn, scope, seen, self._listings)
            totals = ReconcileStats(
                added=totals.added + stats.added,
                updated=totals.updated + stats.updated,
                removed=totals.removed + stats.removed,
                unchanged=totals.unchanged + stats.unchanged,
                skipped=totals.skipped + stats.skipped + skipped,
            )
        return totals

    @staticmethod
    def _check_root(conn: sqlite3.Connection, root_key: str) -> bool:
        """Empty the index when it was built for another memory root (then True)."""
        row = conn.execute("SELECT value FROM meta WHERE key = 'root'").fetchone()
        if row is not None and row[0] == root_key:
            return False
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM chunks")
            conn.execute("DELETE FROM files")
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('root', ?)", (root_key,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return True

    @staticmethod
    def _begin(conn: sqlite3.Connection) -> int:
        """Start a write transaction; return the next free chunk rowid.

        Recomputed at every transaction because another process sharing the
        file may have added chunks in between (max(rowid) of an FTS5 table
        would be a scan; the files table knows every file's range).
        """
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT coalesce(max(first_row + n_rows), 1) FROM files").fetchone()
        return int(row[0])

    @staticmethod
    def _apply(
        conn: sqlite3.Connection, scope: _Scope, seen: Sequence[_Seen], listings: Listings
    ) -> ReconcileStats:
        # Cheap check without the write lock first, on the rows as last seen: a
        # reconcile with nothing changed (the common case, every memory search and
        # rebuild) neither takes the lock nor reads the scope's rows again.
        listed, version = listings.of(conn, scope.kind, scope.scope)
        gone, todo = listed.changes(seen)
        if not gone and not todo:
            return ReconcileStats(unchanged=len(seen))
        added = updated = skipped = 0
        foreign = False
        next_row = MemoryIndex._begin(conn)
        try:
            # Again under the lock: another process may have done part of it.
            known = read_listing(conn, scope.kind, scope.scope)
            gone, todo = known.changes(seen)
            for path in gone:
                MemoryIndex._drop_path(conn, path)
                known.stamps.pop(path, None)
                known.indexed.discard(path)
            batch = 0
            for item in todo:
                if item.path in known.stamps:
                    updated += 1
                else:
                    added += 1
                # Also drops a row of this path under another scope (a moved layout).
                dropped = MemoryIndex._drop_path(conn, item.path)
                foreign = foreign or dropped not in (None, (scope.kind, scope.scope))
                known.stamps[item.path] = (item.size, item.mtime_ns)
                known.indexed.discard(item.path)
                text = _read_text(item.real)
                if text is None:
                    # Remember binary files too, so they are not re-read every time.
                    skipped += 1
                    conn.execute(
                        "INSERT INTO files (path, kind, scope, size, mtime_ns, indexed, "
                        "first_row, n_rows) VALUES (?, ?, ?, ?, ?, 0, 0, 0)",
                        (item.path, scope.kind, scope.scope, item.size, item.mtime_ns),
                    )
                    continue
                known.indexed.add(item.path)
                chunks = list(_chunk_lines(text))
                cursor = conn.execute(
                    "INSERT INTO files (path, kind, scope, size, mtime_ns, indexed, "
                    "first_row, n_rows) VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
                    (
                        item.path,
                        scope.kind,
                        scope.scope,
                        item.size,
                        item.mtime_ns,
                        next_row,
                        len(chunks),
                    ),
                )
                conn.executemany(
                    "INSERT INTO chunks (rowid, body, cjk, file_id, line) VALUES (?, ?, ?, ?, ?)",
                    [
                        (next_row + i, body, _cjk_tokens(body), cursor.lastrowid, line)
                        for i, (line, body) in enumerate(chunks)
                    ],
                )
                next_row += len(chunks)
                batch += len(text)
                # Batches of about _BATCH_BYTES per transaction: a crash keeps
                # what was committed, and other processes get the write lock
                # between batches.
                if batch >= _BATCH_BYTES:
                    conn.execute("COMMIT")
                    next_row = MemoryIndex._begin(conn)
                    batch = 0
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            listings.clear()  # a batch may have committed: read everything again
            raise
        listings.written(conn, scope.kind, scope.scope, known, version=version, foreign=foreign)
        return ReconcileStats(
            added=added,
            updated=updated,
            removed=len(gone),
            unchanged=len(seen) - len(todo),
            skipped=skipped,
        )

    @staticmethod
    def _drop_path(conn: sqlite3.Connection, path: str) -> tuple[str, str] | None:
        """Drop the row of ``path`` and its chunks; return the ``(kind, scope)`` it had."""
        row = conn.execute(
            "SELECT id, first_row, n_rows, kind, scope FROM files WHERE path = ?", (path,)
        )
        found = row.fetchone()
        if found is None:
            return None
        file_id, first, n_rows, kind, scope = found
        if n_rows:
            conn.execute(
                "DELETE FROM chunks WHERE rowid BETWEEN ? AND ?", (first, first + n_rows - 1)
            )
        conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return str(kind), str(scope)

    # -- queries -----------------------------------------------------------------------------------
    async def search(
        self, query: str, *, session_id: str, project_id: str | None, limit: int = 10
    ) -> list[MemoryHit]:
        """Search the files of one session, its project and the global scope.

        Call :meth:`reconcile` first to see the disk's current state. Hits are
        ordered by bm25 (best first), then by path and line.

        Args:
            query: Free text; FTS5 syntax in it is treated as plain words.
            session_id: The session whose files are searched (and no other's).
            project_id: The session's project; ``None`` for none.
            limit: At most this many hits (>= 1).

        Returns:
            The hits; empty when the query has no letter or digit.

        Raises:
            StoreError: The index database failed, or ``limit`` < 1.
        """
        if limit < 1:
            raise StoreError(f"limit must be at least 1, got {limit}")
        expression = fts_match_expression(query)
        if expression is None:
            return []
        terms = _query_terms(query)

        def run(conn: sqlite3.Connection) -> list[MemoryHit]:
            # Ties in rank are ordered by path and line here (see _SEARCH_SQL).
            rows = conn.execute(_SEARCH_SQL, (expression, project_id, session_id, limit)).fetchall()
            hits: list[MemoryHit] = []
            for path, kind, first_line, body, score in rows:
                line, snippet = _locate(body, first_line, terms)
                hits.append(MemoryHit(path, line, snippet, float(score), kind))
            hits.sort(key=lambda h: (h.score, h.path, h.line))
            return hits

        return await self._run(run)

    async def paths(
        self, session_id: str, project_id: str | None, *, exclude_injected: bool = True
    ) -> list[str]:
        """Relative paths for the ``# Memory keys index`` section (SPEC R5.6, A6).

        The same selection as :func:`mimo_ctx.memory.list_memory_files`, read from
        the index instead of the disk: the indexed ``*.md`` files of the session,
        its project and the global scope, sorted by path, without checkpoint
        "learning" files (``checkpoint-learning*.md``) and, with
        ``exclude_injected``, without the files the rebuild body injects whole
        (the session's ``checkpoint.md``, the project's and the global
        ``MEMORY.md``). Binary files are left out. Call :meth:`reconcile` first.

        Args:
            session_id: The session.
            project_id: The session's project; ``None`` for none.
            exclude_injected: Leave out the three injected files.

        Returns:
            ``/``-separated paths relative to the memory root.
        """
        return await self._run(
            lambda conn: self._paths(
                conn, session_id, project_id, exclude_injected=exclude_injected
            )
        )

    @staticmethod
    def _paths(
        conn: sqlite3.Connection, session_id: str, project_id: str | None, *, exclude_injected: bool
    ) -> list[str]:
        rows = conn.execute(
            "SELECT path FROM files WHERE indexed = 1 AND ("
            "(kind = 'session' AND scope = ?) OR (kind = 'project' AND scope = ?) "
            "OR kind = 'global') ORDER BY path",
            (session_id, project_id),
        ).fetchall()
        paths = [str(path) for (path,) in rows]
        return key_paths(paths, session_id, project_id, exclude_injected=exclude_injected)
