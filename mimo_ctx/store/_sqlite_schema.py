"""The schema of :class:`~mimo_ctx.store.sqlite.SQLiteStore` and how a store file is opened.

Opening reads before anything writes: a file that is not an SQLite database, or
a database that is not ours (other tables, no version), is refused with a
:class:`~mimo_ctx.errors.StoreError` and left byte-for-byte unchanged. A new
file gets WAL mode and the schema in one ``BEGIN IMMEDIATE`` transaction; the
version is ``PRAGMA user_version``. An older file is upgraded step by step
(:data:`MIGRATIONS`) in that transaction.

Read-only opening (``read_only=True``, what ``mimo-ctx render`` uses) writes
nothing at all: no schema, no WAL switch, ``query_only`` on. A file without a
store (an empty file included) is refused instead of becoming one. On a
read-only mount SQLite cannot create the WAL index (``-shm``) a WAL database
needs even for reading; the file is then opened ``immutable`` (nobody can be
writing it there).
"""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal, TypeVar

from mimo_ctx.errors import StoreError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "open_database", "write_transaction"]

_T = TypeVar("_T")

# Our tables: a database holding other tables but not these is someone else's.
_OUR_TABLES: Final = frozenset(
    {"counters", "sessions", "messages", "rebuilds", "tasks", "actors", "host_nodes", "host_heads"}
)

_SCHEMA: Final = (
    # Store-wide counters; "seq" numbers message writes for the change feed.
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT INTO counters (name, value) VALUES ('seq', 0)",
    """CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        time_created INTEGER NOT NULL,
        payload TEXT NOT NULL
    )""",
    "CREATE INDEX sessions_by_time ON sessions (time_created, id)",
    """CREATE TABLE messages (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        agent TEXT NOT NULL,
        role TEXT NOT NULL,
        time_created INTEGER NOT NULL,
        is_boundary INTEGER NOT NULL,
        is_finished_assistant INTEGER NOT NULL,
        token_estimate INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        payload TEXT NOT NULL
    )""",
    "CREATE INDEX messages_by_agent_time ON messages (session_id, agent, time_created, id)",
    "CREATE INDEX messages_by_time ON messages (session_id, time_created, id)",
    "CREATE INDEX messages_by_seq ON messages (session_id, seq)",
    # Partial indexes: only flagged rows, so the hot "newest X" lookups read one
    # index entry from the end of a small b-tree.
    """CREATE INDEX messages_finished_by_agent ON messages (session_id, agent, id)
        WHERE is_finished_assistant = 1""",
    """CREATE INDEX messages_finished ON messages (session_id, id)
        WHERE is_finished_assistant = 1""",
    """CREATE INDEX messages_boundaries ON messages (session_id, agent, id)
        WHERE is_boundary = 1""",
    # One row per committed rebuild; the UNIQUE constraint is what makes
    # commit_rebuild once-per-usage across tasks and processes.
    """CREATE TABLE rebuilds (
        session_id TEXT NOT NULL REFERENCES sessions (id),
        usage_key TEXT NOT NULL,
        boundary_id TEXT NOT NULL,
        time_committed INTEGER NOT NULL,
        UNIQUE (session_id, usage_key)
    )""",
    """CREATE TABLE tasks (
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (session_id, id)
    )""",
    """CREATE TABLE actors (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        status TEXT NOT NULL,
        background INTEGER NOT NULL,
        time_created INTEGER NOT NULL,
        payload TEXT NOT NULL
    )""",
    "CREATE INDEX actors_by_session ON actors (session_id, time_created, id)",
)

_USER_MESSAGES_INDEX: Final = (
    # Version 2: the main history's user messages, for the rebuild's "Recent user
    # input" over the whole history without reading every message.
    """CREATE INDEX IF NOT EXISTS messages_user ON messages (session_id, agent, time_created, id)
        WHERE role = 'user' AND is_boundary = 0""",
)


_INSERT_ORDER: Final = (
    # Version 3: the write order of insertions decides "newer than" (R1.4 as
    # amended), not ids, which come from the writing worker's clock.
    "ALTER TABLE messages ADD COLUMN insert_seq INTEGER NOT NULL DEFAULT 0",
    # Rows written before: their insertion order was not kept; ids were the rule
    # then, so rank them by id (1..n, below every number the counter hands out).
    """UPDATE messages SET insert_seq = ranked.n
        FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS n FROM messages) AS ranked
        WHERE messages.id = ranked.id""",
    "UPDATE counters SET value = MAX(value, (SELECT COUNT(*) FROM messages)) WHERE name = 'seq'",
    "DROP INDEX messages_finished_by_agent",
    "DROP INDEX messages_finished",
    "DROP INDEX messages_boundaries",
    """CREATE INDEX messages_finished_by_agent ON messages (session_id, agent, insert_seq)
        WHERE is_finished_assistant = 1""",
    """CREATE INDEX messages_finished ON messages (session_id, insert_seq)
        WHERE is_finished_assistant = 1""",
    """CREATE INDEX messages_boundaries ON messages (session_id, agent, insert_seq)
        WHERE is_boundary = 1""",
)


_HOST_INDEX: Final = (
    # Version 4: messages the host left behind (mimo_ctx.reconcile): kept, never listed.
    "ALTER TABLE messages ADD COLUMN off_branch INTEGER NOT NULL DEFAULT 0",
    # The host index: one row per host message and the conversation before it.
    # The primary key is what keeps two workers from storing one host message twice.
    """CREATE TABLE host_nodes (
        session_id TEXT NOT NULL REFERENCES sessions (id),
        agent TEXT NOT NULL,
        chain TEXT NOT NULL,
        parent TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        depth INTEGER NOT NULL,
        message_ids TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (session_id, agent, chain)
    )""",
    "CREATE INDEX host_nodes_by_seq ON host_nodes (session_id, agent, seq)",
    """CREATE TABLE host_heads (
        session_id TEXT NOT NULL REFERENCES sessions (id),
        agent TEXT NOT NULL,
        head TEXT NOT NULL,
        PRIMARY KEY (session_id, agent)
    )""",
)

_PART_UNITS: Final = (
    # Version 5: the part lengths each row's token_estimate was summed from
    # (mimo_ctx.messages.stored_part_units), so a message read back and changed in
    # one nested object (a rebuild marking a result) is estimated without
    # serialising it again. NULL: unknown (rows written before).
    "ALTER TABLE messages ADD COLUMN part_units TEXT",
)

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    _SCHEMA,
    _USER_MESSAGES_INDEX,
    _INSERT_ORDER,
    _HOST_INDEX,
    _PART_UNITS,
)
"""Statements of each schema version, oldest first: version ``n`` is ``MIGRATIONS[n - 1]``
(append-only: a released version's statements never change)."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The schema version this module writes (``PRAGMA user_version``)."""


def write_transaction(conn: sqlite3.Connection, body: Callable[[], _T]) -> _T:
    """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction; roll back on any error."""
    # IMMEDIATE takes the write lock up front (waiting up to busy_timeout), so a
    # transaction never fails half-way because another writer got in first.
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def open_database(
    path: str,
    *,
    busy_timeout: float,
    synchronous: Literal["NORMAL", "FULL"],
    read_only: bool = False,
) -> sqlite3.Connection:
    """Open the store file, check what it holds, and create the schema if it is new.

    With ``read_only`` nothing is written (see the module docstring).

    Raises:
        StoreError: The file cannot be opened, is not an SQLite database, is not a
            mimo_ctx store, or has a newer schema; read-only: it holds no store.
            The file is then unchanged.
    """
    if read_only:
        return _open_read_only(path, busy_timeout)
    try:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        # check_same_thread=False: calls may land on different worker
        # threads; the store's worker serialises them.
        conn = sqlite3.connect(
            path,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open SQLite store {path}: {exc}") from exc
    try:
        _initialise(conn, path, busy_timeout, synchronous)
    except BaseException:
        conn.close()
        raise
    return conn


def _initialise(conn: sqlite3.Connection, path: str, busy_timeout: float, synchronous: str) -> None:
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    # Read before anything writes: a file that is not a database fails here
    # ("file is not a database") and has not been touched.
    try:
        version, tables = _inspect(conn)
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"{path} is not a readable SQLite database ({exc}); the file was left unchanged"
        ) from exc
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has store schema version {version}; this mimo_ctx "
            f"supports up to {SCHEMA_VERSION}. Upgrade mimo_ctx to open it"
        )
    if version == 0 and tables and not tables <= _OUR_TABLES:
        raise StoreError(
            f"{path} is an SQLite database but not a mimo_ctx store "
            f"(it has tables {sorted(tables)}); the file was left unchanged"
        )
    if path != ":memory:":
        _enable_wal(conn, path, busy_timeout)
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    if version < SCHEMA_VERSION:
        write_transaction(conn, lambda: _create_schema(conn))


def _open_read_only(path: str, busy_timeout: float) -> sqlite3.Connection:
    file = Path(path)
    if path == ":memory:" or not file.is_file():
        raise StoreError(f"no SQLite store file at {path} (opened read-only: nothing is created)")
    uri = f"file:{urllib.parse.quote(str(file.absolute()))}?mode=ro"
    try:
        try:
            conn, version, tables = _connect_read_only(uri, busy_timeout)
        except sqlite3.OperationalError as exc:
            # A WAL database on a read-only mount: its WAL index cannot be made.
            if not _is_read_only_error(exc):
                raise
            conn, version, tables = _connect_read_only(f"{uri}&immutable=1", busy_timeout)
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"{path} is not a readable SQLite database ({exc}); the file was left unchanged"
        ) from exc
    if version != SCHEMA_VERSION or not tables >= _OUR_TABLES:
        conn.close()
        if file.stat().st_size == 0:
            what = "an empty file, not a mimo_ctx store"
        elif version == 0 or (version == SCHEMA_VERSION and not tables >= _OUR_TABLES):
            what = "no mimo_ctx store"
        elif version > SCHEMA_VERSION:
            what = f"store schema version {version} (this mimo_ctx reads {SCHEMA_VERSION})"
        else:
            # Upgrading writes: a read-only open cannot do it.
            what = (
                f"store schema version {version}, older than this mimo_ctx's "
                f"{SCHEMA_VERSION} (open it once read-write to upgrade it)"
            )
        raise StoreError(f"{path} holds {what}; opened read-only, it was left unchanged")
    return conn


def _connect_read_only(
    uri: str, busy_timeout: float
) -> tuple[sqlite3.Connection, int, frozenset[str]]:
    conn = sqlite3.connect(
        uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        conn.execute("PRAGMA query_only = ON")
        version, tables = _inspect(conn)
    except BaseException:
        conn.close()
        raise
    return conn, version, tables


def _is_read_only_error(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text


def _inspect(conn: sqlite3.Connection) -> tuple[int, frozenset[str]]:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return version, frozenset(str(r[0]) for r in rows)


def _enable_wal(conn: sqlite3.Connection, path: str, busy_timeout: float) -> None:
    # Switching to WAL needs a moment of exclusive access; two processes
    # opening a new file together can see "locked" here even with a busy
    # timeout, so retry until the timeout.
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
    if mode.lower() != "wal":
        warnings.warn(
            f"SQLite store {path}: WAL mode unavailable (journal_mode={mode}); "
            "readers will block writers",
            RuntimeWarning,
            stacklevel=2,
        )


def _create_schema(conn: sqlite3.Connection) -> None:
    # Re-read inside the write transaction: another process may have created
    # the schema since we looked.
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version >= SCHEMA_VERSION:
        return
    for step in MIGRATIONS[version:]:
        for statement in step:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
