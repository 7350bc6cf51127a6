"""What :class:`~mimo_ctx.store.sqlite.SQLiteStore` stands on (private).

The file opened on the worker thread (:mod:`mimo_ctx.store._sqlite_schema`),
rows read back into models, and the message writes every write path shares:
sequence numbers for the change feed, inserts, updates and upserts validated
inside the caller's transaction. The store's methods, the
:class:`~mimo_ctx.store.base.Store` contract, are in :mod:`mimo_ctx.store.sqlite`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict, TypeVar

import anyio.lowlevel
from pydantic import BaseModel, ValidationError

from mimo_ctx._marks import marked_from, set_row_version
from mimo_ctx._sqlite_worker import SQLiteWorker
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import (
    Message,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    part_units,
    set_insert_seq,
    stored_part_units,
)
from mimo_ctx.store._common import restore_row_caches
from mimo_ctx.store._sqlite_feed import KnownFeed, data_version
from mimo_ctx.store._sqlite_schema import open_database, write_transaction
from mimo_ctx.tokens import estimate_message_tokens

__all__ = [
    "INLINE_CHARS",
    "INLINE_MESSAGES",
    "IN_CHUNK",
    "SQL_CURRENT_SEQ",
    "SQL_INSERT_MESSAGE",
    "SQL_UPDATE_MESSAGE",
    "SQL_UPSERT_MESSAGE",
    "WRITTEN_CHARS",
    "WRITTEN_ENTRIES",
    "AlreadyCommitted",
    "CompactionEdit",
    "MessageRow",
    "SQLiteBase",
    "SQLiteOptions",
    "chunks",
    "compaction_edit",
    "message_json",
    "message_payload",
    "message_row",
    "read_transaction",
]

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)

_NOT_READ: Final = -1  # no data_version is negative

SQL_CURRENT_SEQ: Final = "SELECT value FROM counters WHERE name = 'seq'"
_SQL_TAKE_SEQS: Final = "UPDATE counters SET value = value + ? WHERE name = 'seq' RETURNING value"

# The payload may come as text or as its UTF-8 bytes (message_json): stored as TEXT
# either way, so SQLite's JSON functions read every row alike.
SQL_INSERT_MESSAGE: Final = (
    "INSERT INTO messages (id, session_id, agent, role, time_created, is_boundary,"
    " is_finished_assistant, token_estimate, payload, off_branch, part_units, seq, insert_seq)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS TEXT), ?, ?, ?, ?)"
)

# A known id of another session is left alone (no row returned): messages never move.
# insert_seq is left alone on an update, as below.
SQL_UPSERT_MESSAGE: Final = (
    SQL_INSERT_MESSAGE + " ON CONFLICT (id) DO UPDATE SET agent = excluded.agent,"
    " role = excluded.role, time_created = excluded.time_created,"
    " is_boundary = excluded.is_boundary, is_finished_assistant = excluded.is_finished_assistant,"
    " token_estimate = excluded.token_estimate, payload = excluded.payload,"
    " part_units = excluded.part_units, seq = excluded.seq"
    " WHERE messages.session_id = excluded.session_id RETURNING insert_seq"
)

# insert_seq is left alone: an update keeps the insertion's place in the write order.
SQL_UPDATE_MESSAGE: Final = (
    "UPDATE messages SET agent = ?, role = ?, time_created = ?, is_boundary = ?,"
    " is_finished_assistant = ?, token_estimate = ?, payload = CAST(? AS TEXT), off_branch = ?,"
    " part_units = ?, seq = ? WHERE id = ? AND session_id = ? RETURNING insert_seq"
)

# An update that changes only a message's content: the row's other columns already
# hold the new values (checked by the WHERE), so none of the indexes on them is
# touched; the write order (insert_seq) is the one the caller's copy carries.
_SQL_UPDATE_CONTENT: Final = (
    "UPDATE messages SET token_estimate = ?, payload = CAST(? AS TEXT), part_units = ?, seq = ?"
    " WHERE id = ? AND session_id = ? AND agent = ? AND role = ? AND time_created = ?"
    " AND is_boundary = ? AND is_finished_assistant = ? AND off_branch = ? AND insert_seq = ?"
)


def _sql_mark_results(marks: int) -> str:
    """The UPDATE writing a micro-compacted copy as an edit of its row, ``marks`` results.

    Each marked result's ``compacted`` and ``placeholder`` are set in the JSON in
    place (a path and a value each); only while the row is the version the copy
    was made from (``seq``), so every other column and value is the source's.
    """
    pairs = ", ".join(["?, ?, ?, ?"] * marks)
    return (
        f"UPDATE messages SET token_estimate = ?, payload = json_set(payload, {pairs}),"
        " part_units = ?, seq = ? WHERE id = ? AND session_id = ? AND seq = ? AND insert_seq = ?"
    )


# Row of a message as written: id, session_id, agent, role, time_created,
# is_boundary, is_finished_assistant, token_estimate, payload, off_branch, part_units.
# The payload is text, or its UTF-8 bytes for an insert (SQL_INSERT_MESSAGE casts them).
MessageRow = tuple[str, str, str, str, int, int, int, int, str | bytes, int, str | None]

IN_CHUNK: Final = 500  # ids per "IN (...)" lookup, well under SQLite's variable limit

WRITTEN_ENTRIES: Final = 512

WRITTEN_CHARS: Final = 16_000_000

INLINE_MESSAGES: Final = 4
"""Messages a write may hold to run inline (mimo_ctx._sqlite_worker): a turn's."""

INLINE_CHARS: Final = 32_768
"""Payload characters an inline write may hold: what the event loop serialises and
writes itself stays around half a millisecond (~8 pages); more goes to the thread."""


class AlreadyCommitted(Exception):
    """Internal: the usage key of a rebuild is taken; roll back and answer False."""


def message_json(message: Message) -> bytes:
    """The JSON a message row stores, as UTF-8 bytes (``StoreError`` naming it when it has none).

    What :func:`message_payload` decodes. An insert binds the bytes themselves
    (:data:`SQL_INSERT_MESSAGE` stores them as TEXT): for a large text beyond
    Latin-1 (CJK, emoji) Python's decoding of the serialiser's UTF-8 into a
    ``str`` costs several times the serialisation (~3 ms against ~0.5 ms for a
    230 KB boundary of Chinese with emoji), and SQLite wants UTF-8 anyway.
    """
    try:
        return message.__pydantic_serializer__.to_json(message)
    except (ValueError, RecursionError) as exc:
        # Bytes that are not UTF-8 or nesting beyond the serialiser's limit in a tool
        # input: refuse the write, naming the message, rather than fail raw.
        raise StoreError(
            f"message {message.id!r} cannot be stored as JSON ({exc}); nothing written"
        ) from exc


def message_payload(message: Message) -> str:
    """The JSON a message row stores (``StoreError`` naming it when it has none)."""
    return message_json(message).decode()


def message_row(message: Message, payload: str | bytes | None = None) -> MessageRow:
    """The row of ``message`` (``payload``: its :func:`message_payload` or
    :func:`message_json`, when made already; bytes only for an insert)."""
    if payload is None:
        payload = message_payload(message)
    # Off-branch messages are never the newest boundary or finished answer.
    listed = not message.off_branch
    return (
        message.id,
        message.session_id,
        message.agent,
        message.role,
        message.time_created,
        int(listed and message.is_boundary),
        int(listed and message.role == "assistant" and message.finish is not None),
        estimate_message_tokens(message),
        payload,
        int(message.off_branch),
        # After the estimate: the lengths it was summed from, when it was computed here.
        stored_part_units(message),
    )


@dataclass(frozen=True, slots=True)
class CompactionEdit:
    """A micro-compacted copy as an edit of its stored row (see :mod:`mimo_ctx._marks`).

    Attributes:
        id: The message.
        version: The row's change-feed number the copy was made from.
        insert_seq: The message's write order (unchanged by the edit).
        values: JSON path and value pairs, four per marked result: its time's
            ``compacted`` and ``placeholder``.
        estimate: The copy's token estimate.
        units: The copy's part lengths as stored (:func:`stored_part_units`).
        size: About the copy's payload length (the sum of its parts' JSON lengths).
    """

    id: str
    version: int
    insert_seq: int
    values: tuple[Any, ...]
    estimate: int
    units: str | None
    size: int


def compaction_edit(message: Message) -> CompactionEdit | None:
    """``message`` as an edit of its stored row, when it is a micro-compacted copy.

    ``None`` for any other message, and for a copy whose source's row version or
    part lengths are unknown: it is written in full.
    """
    mark = marked_from(message)
    insert_seq = message.insert_seq
    units = part_units(message)
    if mark is None or insert_seq is None or units is None or None in units:
        return None
    version, indexes = mark
    values: list[Any] = []
    for index in indexes:
        part = message.parts[index]
        if isinstance(part, ToolPart) and isinstance(part.state, ToolStateCompleted):
            path, time = f"$.parts[{index}].state.time", part.state.time
        elif isinstance(part, ToolResultPart):
            path, time = f"$.parts[{index}].time", part.time
        else:  # pragma: no cover - micro-compaction marks only these
            return None
        values += (f"{path}.compacted", time.compacted, f"{path}.placeholder", time.placeholder)
    return CompactionEdit(
        id=message.id,
        version=version,
        insert_seq=insert_seq,
        values=tuple(values),
        estimate=estimate_message_tokens(message),
        units=stored_part_units(message),
        size=sum(u for u in units if u is not None),
    )


def _texts_fit(messages: Sequence[Message]) -> bool:
    """Whether the messages' texts and outputs stay within :data:`INLINE_CHARS`.

    A count over the parts' own strings, before anything is serialised: a long
    text or tool output sends the write to the thread without the event loop
    serialising it.
    """
    chars = 0
    for message in messages:
        for part in message.parts:
            if part.type == "tool":
                # Not getattr with a default: a missing field costs pydantic's
                # __getattr__ and an AttributeError, several µs per pending call.
                state = part.state
                if isinstance(state, ToolStateCompleted):
                    chars += len(state.output)
                elif isinstance(state, ToolStateError):
                    chars += len(state.error)
            elif isinstance(part, TextPart | ReasoningPart):
                chars += len(part.text)
            elif part.type == "tool_result":
                chars += len(part.output)
            elif part.type == "compaction":
                chars += len(part.summary)
            elif part.type == "file":
                chars += len(part.url)
    return chars <= INLINE_CHARS


def read_transaction(conn: sqlite3.Connection, body: Callable[[], _T]) -> _T:
    """Run ``body`` on one consistent snapshot (several SELECTs that must agree)."""
    conn.execute("BEGIN")
    try:
        return body()
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class SQLiteOptions(TypedDict, total=False):
    """The keyword arguments of an SQLite store (see :class:`SQLiteBase`)."""

    busy_timeout: float
    synchronous: Literal["NORMAL", "FULL"]
    read_only: bool


class SQLiteBase(SQLiteWorker):
    """The file, row loading and message writes of an SQLite store."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        read_only: bool = False,
    ) -> None:
        """Prepare a store on ``path`` (nothing is opened yet).

        Args:
            path: The database file, created with its schema if missing, or
                ``":memory:"``.
            busy_timeout: Seconds a write waits for another connection (another
                process) holding the write lock before failing.
            synchronous: SQLite's ``synchronous`` setting (see the store's module
                docstring); with ``"FULL"`` no write runs on the event loop's thread.
            read_only: Open an existing store without writing anything to the file
                (a file holding no store is refused, not created; a read-only mount
                works); every write then raises ``StoreError``.
        """
        if busy_timeout < 0:
            raise StoreError(f"busy_timeout must be >= 0 seconds, got {busy_timeout}")
        if synchronous not in ("NORMAL", "FULL"):
            raise StoreError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        super().__init__(path, label="SQLite store")
        self._busy_timeout = busy_timeout
        # Messages this store wrote, by (id, change-feed number): see _remember.
        self._written: OrderedDict[tuple[str, int], tuple[Message, int]] = OrderedDict()
        self._written_chars = 0
        self._synchronous: Literal["NORMAL", "FULL"] = synchronous
        self._read_only = read_only
        # Message writes may run inline (mimo_ctx._sqlite_worker): never when a
        # commit must reach the disk (FULL) before it returns. The connection
        # rests without waits between jobs (that module) unless read-only: the
        # change feed's check then reads its data_version without waiting.
        self._inline_allowed = synchronous == "NORMAL" and not read_only
        self._rest_allowed = not read_only
        # The change feed as far as this store wrote it (see _sqlite_feed): kept
        # while the connection rests (WAL, writable). Written under the lock, on
        # whichever thread runs the write; `changes_known` reads it under the lock
        # too, tried from the event loop.
        self._feed = KnownFeed()
        # Per worker call: the numbers its transaction took, the message rows it
        # reports having written with them, and the connection's data_version read
        # inside its write transaction (_NOT_READ: not needed, the feed's stands).
        self._taken: list[tuple[int, int]] = []
        self._reported: list[tuple[int, Message]] | None = None
        self._version_in_tx: int | None = _NOT_READ

    def _connect(self) -> sqlite3.Connection:
        return open_database(
            self._path,
            busy_timeout=self._busy_timeout,
            synchronous=self._synchronous,
            read_only=self._read_only,
        )

    def _release(self) -> None:
        self._feed.forget()

    def _locked(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def feeding(conn: sqlite3.Connection) -> _T:
            self._taken, self._reported = [], None
            self._version_in_tx = _NOT_READ
            done = False
            try:
                result = fn(conn)
                done = True
                return result
            finally:
                taken, reported = self._taken, self._reported
                self._taken, self._reported = [], None
                if not done:
                    if taken:  # an error after a commit, maybe: know nothing
                        self._feed.forget()
                elif taken:
                    self._committed(taken, reported)

        return super()._locked(feeding)

    def _feed_kept(self) -> bool:
        """Whether this store keeps its change feed (the connection rests: WAL, writable)."""
        return bool(self._thread_settings)

    def _write_transaction(self, conn: sqlite3.Connection, body: Callable[[], _T]) -> _T:
        """:func:`write_transaction` for a write that takes change-feed numbers.

        A transaction rolled back gave its numbers back: the feed forgets them,
        whether the error reaches the caller or the writer answers for it.
        """
        try:
            return write_transaction(conn, body)
        except BaseException:
            self._taken.clear()
            self._version_in_tx = _NOT_READ
            raise

    def _committed(
        self, taken: Sequence[tuple[int, int]], reported: Sequence[tuple[int, Message]] | None
    ) -> None:
        """A worker call's transaction took ``taken`` and committed: bring the known
        feed along. Under the lock.

        The connection's ``data_version`` changes only with other connections'
        commits, never with its own, so the feed's version stands after this
        store's writes; it was read again inside the transaction (under the write
        lock, so nobody else committed after it) when it was not known or the
        numbers showed someone else's write before this one (see _take_seqs).
        """
        if not self._feed_kept():
            return
        feed = self._feed
        feed.wrote(taken[0][0], taken[-1][0] + taken[-1][1], reported)
        if self._version_in_tx != _NOT_READ:
            feed.version = self._version_in_tx if feed.start is not None else None

    def _report(self, numbers: Iterable[int], messages: Iterable[Message]) -> None:
        """The message rows this worker call's transaction wrote, with their numbers."""
        self._reported = list(zip(numbers, messages, strict=True))

    def _feed_read(self, version: int | None, current: int) -> None:
        """The file's feed was read up to ``current`` on the snapshot of ``version``."""
        if not self._feed_kept():
            return
        self._feed.read(current)
        self._feed.version = version

    def changes_known(self, session_id: str, seq: int) -> tuple[list[Message], int] | None:
        """The change feed after ``seq`` without the worker thread, when nothing is in doubt.

        Runs on the caller's thread: tries the lock (a running call means ``None``),
        then checks the connection's ``data_version``, which reads the WAL index in
        shared memory and never waits (the resting connection's busy timeout is 0).
        ``None``: read the file.
        """
        if not self._lock.acquire(blocking=False):
            return None
        try:
            conn, feed = self._conn, self._feed
            if self._closed or conn is None or not self._resting or feed.version is None:
                return None
            known = feed.after(session_id, seq)
            if known is None or data_version(conn) != feed.version:
                return None
            return known
        finally:
            self._lock.release()

    def _load_message(self, row: tuple[Any, ...]) -> Message:
        message_id, seq, estimate, insert_seq, payload, units = row
        written = self._written.get((message_id, seq))
        if written is not None:
            # This store wrote exactly this version (same id, same change-feed
            # number): the object it was given is what the payload parses to.
            return written[0]
        message = restore_row_caches(self._parse(Message, payload), estimate, insert_seq, units)
        set_row_version(message, int(seq))
        return message

    def _parse(self, model: type[_M], payload: str) -> _M:
        try:
            return model.model_validate_json(payload)
        except ValidationError as exc:
            if any(e["type"] == "json_invalid" for e in exc.errors()):
                # pydantic-core's JSON parser stops at 200 levels of nesting and its
                # serialiser only at about 250: a tool input nested in between was
                # written and must read back. The stdlib parser goes deeper.
                with contextlib.suppress(ValueError, RecursionError):
                    return model.model_validate(json.loads(payload))
            raise StoreError(
                f"SQLite store {self._path}: a stored {model.__name__} is invalid: {exc}"
            ) from exc

    def _remember(
        self,
        messages: Sequence[Message],
        rows: Sequence[MessageRow],
        seqs: Sequence[int],
        insert_seqs: Sequence[int],
    ) -> None:
        """Stamp the messages just committed and keep them, by (id, change-feed number).

        A message this store wrote is read back (the change feed after a record or
        a rebuild, a listing) without parsing its payload again. The key names one
        version: another process's write of the same id takes a new number. Bounded
        in entries and in payload characters, oldest out first. Runs on the worker
        thread after the commit, before any other call can read these rows.
        """
        self._remember_sized(messages, [len(r[8]) for r in rows], seqs, insert_seqs)

    def _remember_sized(
        self,
        messages: Sequence[Message],
        sizes: Sequence[int],
        seqs: Sequence[int],
        insert_seqs: Sequence[int],
    ) -> None:
        """:meth:`_remember` with each payload's size in characters (or a close estimate)."""
        written = self._written
        for message, size, seq, insert_seq in zip(messages, sizes, seqs, insert_seqs, strict=True):
            set_insert_seq(message, insert_seq)
            set_row_version(message, seq)
            written[(message.id, seq)] = (message, size)
            self._written_chars += size
        while written and (len(written) > WRITTEN_ENTRIES or self._written_chars > WRITTEN_CHARS):
            _, (_, chars) = written.popitem(last=False)
            self._written_chars -= chars

    async def _write_batch(
        self,
        batch: Sequence[Message],
        write: Callable[[sqlite3.Connection, Sequence[MessageRow]], tuple[int, Sequence[int]]],
    ) -> None:
        """Write a batch of messages in one write transaction and remember them.

        ``write`` gets the rows inside the transaction and returns the first
        change-feed number it took (the batch takes that one and the next ones)
        and each message's insert_seq. An empty batch writes nothing (a closed
        store still refuses it).
        """
        if not batch:
            self._check_open()
            return
        rows: list[MessageRow] = []
        payloads: list[str] = []

        def run(conn: sqlite3.Connection) -> None:
            if not rows:  # made already when an inline write fell back to the thread
                # Serialise before taking the write lock, to hold it briefly.
                made = payloads or [None] * len(batch)
                rows.extend(message_row(m, p) for m, p in zip(batch, made, strict=True))
            first, insert_seqs = self._write_transaction(conn, lambda: write(conn, rows))
            numbers = range(first, first + len(rows))
            self._remember(batch, rows, numbers, insert_seqs)
            self._report(numbers, batch)

        self._check_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        inline = self._inline_rows(batch, payloads)
        if inline is not None:
            rows.extend(inline)
            await self._write_checked(run)
            return
        await self._run(run)

    def _inline_rows(
        self, batch: Sequence[Message], payloads: list[str] | None = None
    ) -> list[MessageRow] | None:
        """The rows of ``batch`` when it may be written inline now, else None.

        The payloads' size decides (the texts counted first leave out tool inputs
        and metadata); ``payloads`` receives them once made, so a batch too large
        goes to the thread without serialising it again.
        """
        if len(batch) > INLINE_MESSAGES or not self._inline_ready() or not _texts_fit(batch):
            return None
        made = [message_payload(m) for m in batch]
        if payloads is not None:
            payloads.extend(made)
        if sum(map(len, made)) > INLINE_CHARS:
            return None
        return [message_row(m, p) for m, p in zip(batch, made, strict=True)]

    @staticmethod
    def _next_seq(conn: sqlite3.Connection) -> int:
        """The number the next write takes. Inside a write transaction."""
        return int(conn.execute(SQL_CURRENT_SEQ).fetchone()[0]) + 1

    @staticmethod
    def _session_exists(conn: sqlite3.Connection, session_id: str) -> bool:
        row = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return row is not None

    def _take_seqs(self, conn: sqlite3.Connection, count: int) -> int:
        """Reserve ``count`` sequence numbers; return the first. Inside a write tx."""
        # One statement moves the counter and reads it: every message write takes
        # numbers, so a separate read first would cost each write a statement.
        current = int(conn.execute(_SQL_TAKE_SEQS, (count,)).fetchone()[0]) - count
        if not self._taken and self._feed_kept():
            feed = self._feed
            if feed.version is None or feed.start is None or current != feed.head:
                # Not known, or someone else wrote since: the version now, under the
                # write lock, is the one this commit leaves (see _committed).
                self._version_in_tx = data_version(conn)
        self._taken.append((current, count))
        return current + 1

    def _insert_messages(
        self, conn: sqlite3.Connection, rows: Sequence[MessageRow], what: str
    ) -> int:
        """Validate and insert new message rows; return the first one's seq. Inside a write tx.

        Nothing is looked up first: the table's constraints refuse a known id and
        an unknown session, and only a refused insert looks, to say why, with the
        errors a check of every session and then every id up front would give.
        """
        first = self._take_seqs(conn, len(rows))
        try:
            conn.executemany(
                SQL_INSERT_MESSAGE, [(*r, first + i, first + i) for i, r in enumerate(rows)]
            )
        except sqlite3.IntegrityError:
            self._check_sessions(conn, rows, what)
            ids = [r[0] for r in rows]
            for chunk in chunks(ids, IN_CHUNK):
                marks = ",".join("?" * len(chunk))
                # Rows stored before this batch: the ones it inserted before the
                # refused row took numbers from ``first`` on.
                found = conn.execute(
                    f"SELECT id FROM messages WHERE id IN ({marks}) AND seq < ?", (*chunk, first)
                ).fetchone()
                if found is not None:
                    raise StoreError(
                        f"{what}: message id {found[0]!r} already exists; nothing written"
                    ) from None
            raise
        return first

    def _update_messages(
        self,
        conn: sqlite3.Connection,
        rows: Sequence[MessageRow],
        what: str,
        session_id: str | None = None,
    ) -> list[int]:
        """Replace existing message rows; return their insert_seqs. Inside a write tx."""
        if not rows:
            return []
        kept: list[int] = []
        first = self._take_seqs(conn, len(rows))
        for i, r in enumerate(rows):
            mid, sid = r[0], r[1]
            if session_id is not None and sid != session_id:
                raise StoreError(
                    f"{what}: message {mid!r} belongs to session {sid!r}, not "
                    f"{session_id!r}; nothing written"
                )
            found = conn.execute(SQL_UPDATE_MESSAGE, (*r[2:], first + i, mid, sid)).fetchone()
            if found is not None:
                kept.append(int(found[0]))
            else:
                stored = conn.execute(
                    "SELECT session_id FROM messages WHERE id = ?", (mid,)
                ).fetchone()
                if stored is None:
                    raise StoreError(f"{what}: message {mid!r} does not exist; nothing written")
                raise StoreError(
                    f"{what}: message {mid!r} belongs to session {stored[0]!r}, "
                    f"not {sid!r}; nothing written"
                )
        return kept

    def _mark_compacted(
        self,
        conn: sqlite3.Connection,
        edits: Sequence[CompactionEdit],
        session_id: str,
    ) -> list[int] | None:
        """Write micro-compacted copies as edits of their rows; their insert_seqs. In a write tx.

        ``edits`` come from :func:`compaction_edit`, one per message. Each row gets
        its marked results' two values set in its JSON, the copy's estimate and
        part lengths, and the next change-feed number, where it is still the
        version the copy was made from: nothing is serialised. ``None`` when any row
        is not (changed since, or its JSON refused), with the numbers given back:
        the caller writes the batch in full, which rewrites any row edited here.
        """
        if not edits:
            return []
        first = self._take_seqs(conn, len(edits))
        by_marks: dict[int, list[tuple[Any, ...]]] = {}
        for i, e in enumerate(edits):
            params = (e.estimate, *e.values, e.units, first + i, e.id, session_id, e.version)
            by_marks.setdefault(len(e.values) // 4, []).append((*params, e.insert_seq))
        written = 0
        try:
            for marks, params in by_marks.items():
                written += conn.executemany(_sql_mark_results(marks), params).rowcount
        except sqlite3.OperationalError as exc:
            # A payload SQLite's JSON functions refuse ("malformed JSON": deeper
            # than their limit): the full rewrite serialises it instead. Any other
            # error (the disk's) fails the transaction as it would have anyway.
            if "JSON" not in str(exc):
                raise
            written = -1
        if written == len(edits):
            return [e.insert_seq for e in edits]
        self._taken.pop()
        conn.execute("UPDATE counters SET value = ? WHERE name = 'seq'", (first - 1,))
        return None

    def _update_contents(
        self,
        conn: sqlite3.Connection,
        rows: Sequence[MessageRow],
        insert_seqs: Sequence[int | None],
        what: str,
        session_id: str,
    ) -> list[int]:
        """Replace message rows whose content alone changed; their insert_seqs. Inside a write tx.

        What a rebuild's micro-compaction writes: only the parts changed, so the
        rows already hold every other column. One ``executemany`` sets payload,
        estimate and change-feed number where the row agrees with the rest
        (``insert_seqs``: each message's as read); when any row does not (another
        writer changed it since, or the message carries no write order), the
        whole batch is written again by :meth:`_update_messages`, which checks
        each row and replaces every column (the same numbers, so nothing is
        written twice in the feed).
        """
        if not rows:
            return []
        first = self._next_seq(conn)
        if None not in insert_seqs:
            params = [
                (r[7], r[8], r[10], first + i, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[9], seq)
                for i, (r, seq) in enumerate(zip(rows, insert_seqs, strict=True))
            ]
            if all(r[1] == session_id for r in rows):
                self._take_seqs(conn, len(rows))
                if conn.executemany(_SQL_UPDATE_CONTENT, params).rowcount == len(rows):
                    return [seq for seq in insert_seqs if seq is not None]
                # Give the numbers back: the full update takes them again.
                self._taken.pop()
                conn.execute("UPDATE counters SET value = ? WHERE name = 'seq'", (first - 1,))
        return self._update_messages(conn, rows, what, session_id)

    def _upsert_messages(
        self, conn: sqlite3.Connection, rows: Sequence[MessageRow]
    ) -> tuple[int, list[int]]:
        """Insert new rows and replace known ones; the first seq and each insert_seq.

        The sessions are not looked up first: the row's foreign key already makes
        SQLite refuse a new message of an unknown session (a replaced one keeps
        its session), so only a refused write looks, to say why, and the errors
        are the ones a check of every session up front would give.
        """
        first = self._take_seqs(conn, len(rows))
        kept: list[int] = []
        for i, r in enumerate(rows):
            try:
                found = conn.execute(SQL_UPSERT_MESSAGE, (*r, first + i, first + i)).fetchone()
            except sqlite3.IntegrityError:
                self._check_sessions(conn, rows, "upsert_messages")
                raise
            if found is None:
                self._check_sessions(conn, rows, "upsert_messages")
                stored = conn.execute(
                    "SELECT session_id FROM messages WHERE id = ?", (r[0],)
                ).fetchone()
                raise StoreError(
                    f"upsert_messages: message {r[0]!r} belongs to session "
                    f"{stored[0] if stored else None!r}, not {r[1]!r}; nothing written"
                )
            kept.append(int(found[0]))
        return first, kept

    def _check_sessions(
        self, conn: sqlite3.Connection, rows: Sequence[MessageRow], what: str
    ) -> None:
        """Raise for the first unknown session of ``rows``. Inside a write tx."""
        for session_id in {r[1] for r in rows}:
            if not self._session_exists(conn, session_id):
                raise StoreError(f"{what}: unknown session {session_id!r}; nothing written")
