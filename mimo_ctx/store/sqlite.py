"""The embedded default store: one SQLite file, safe to share between processes.

Design:

* **Off the event loop.** Every call runs the stdlib :mod:`sqlite3` in a worker
  thread (:func:`anyio.to_thread.run_sync`) behind a per-store capacity limiter of
  one and a thread lock, so the loop never blocks on disk I/O and the single
  connection is never used by two threads at once. A cancelled caller waits for
  its statement to finish, so a transaction is never left half-done.
* **WAL mode** (readers do not block the writer) and a **busy timeout** (30 s by
  default), so processes sharing the file wait for each other instead of
  failing with "database is locked". ``synchronous=NORMAL``: in WAL mode a crash
  of the process loses nothing committed; only a power cut can lose the last
  transactions (never corrupt the file). Pass ``synchronous="FULL"`` to trade
  speed for that too.
* **One transaction per write** (``BEGIN IMMEDIATE``), validated inside the
  transaction: a rejected batch writes nothing.
* **Versioned schema** (``PRAGMA user_version``), created on first open and
  upgraded step by step (``mimo_ctx.store._sqlite_schema.MIGRATIONS``) in one
  write transaction. A file that is not an SQLite database, or an SQLite
  database that is not ours, is refused with a
  :class:`~mimo_ctx.errors.StoreError` naming the file, and left byte-for-byte
  unchanged.
* **Hot queries are single indexed lookups**: the newest boundary and the newest
  finished assistant (by write order, ``insert_seq``) use partial indexes on flag
  columns, the change feed an index on ``(session_id, seq)``; payloads are
  pydantic JSON, parsed with pydantic-core. Each message row also stores the default token estimate
  (SPEC R2.2), which is put back into the loaded message's cache, so a cold load
  never re-serialises a message to count it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from mimo_ctx._sqlite_worker import SQLiteWorker
from mimo_ctx._util import now_ms
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message, set_insert_seq
from mimo_ctx.session import (
    ACTIVE_ACTOR_STATUSES,
    Actor,
    Session,
    SessionState,
    StateChange,
    Task,
    task_order_key,
)
from mimo_ctx.store._sqlite_schema import SCHEMA_VERSION, open_database, write_transaction
from mimo_ctx.store.base import (
    HeadMove,
    HostIndex,
    HostNode,
    apply_state_change,
    check_host_commit,
    check_rebuild_arguments,
    check_user_message_window,
)
from mimo_ctx.tokens import estimate_message_tokens

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)

# -- statements (module constants so tests can check their query plans) ------
_MESSAGE_COLUMNS: Final = "id, seq, token_estimate, insert_seq, payload"
_SQL_LATEST_BOUNDARY: Final = (
    f"SELECT {_MESSAGE_COLUMNS} FROM messages"
    " WHERE session_id = ? AND agent = ? AND is_boundary = 1 ORDER BY insert_seq DESC LIMIT 1"
)
_SQL_LATEST_FINISHED_BY_AGENT: Final = (
    f"SELECT {_MESSAGE_COLUMNS} FROM messages"
    " WHERE session_id = ? AND agent = ? AND is_finished_assistant = 1"
    " ORDER BY insert_seq DESC LIMIT 1"
)
_SQL_LATEST_FINISHED: Final = (
    f"SELECT {_MESSAGE_COLUMNS} FROM messages"
    " WHERE session_id = ? AND is_finished_assistant = 1 ORDER BY insert_seq DESC LIMIT 1"
)
# A boundary of the agent inserted after the usage message (commit_rebuild, R1.4).
_SQL_NEWER_BOUNDARY: Final = (
    "SELECT 1 FROM messages AS u JOIN messages AS b ON b.session_id = u.session_id"
    " AND b.agent = ? AND b.is_boundary = 1 AND b.insert_seq > u.insert_seq"
    " WHERE u.id = ? AND u.session_id = ? LIMIT 1"
)
_SQL_CHANGES: Final = (
    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND seq > ? ORDER BY seq"
)
_SQL_CURRENT_SEQ: Final = "SELECT value FROM counters WHERE name = 'seq'"
# The watermark is the writer's (set_watermark) and the state changes field by
# field (update_session_state): replacing the session from an older copy keeps both.
_SQL_REPLACE_SESSION: Final = (
    "UPDATE sessions SET time_created = ?, payload = json_set(?,"
    " '$.watermark', json_extract(payload, '$.watermark'),"
    " '$.state', json(json_extract(payload, '$.state'))) WHERE id = ?"
)
_SQL_INSERT_MESSAGE: Final = (
    "INSERT INTO messages (id, session_id, agent, role, time_created, is_boundary,"
    " is_finished_assistant, token_estimate, payload, off_branch, seq, insert_seq)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# A known id of another session is left alone (no row returned): messages never move.
# insert_seq is left alone on an update, as below.
_SQL_UPSERT_MESSAGE: Final = (
    _SQL_INSERT_MESSAGE + " ON CONFLICT (id) DO UPDATE SET agent = excluded.agent,"
    " role = excluded.role, time_created = excluded.time_created,"
    " is_boundary = excluded.is_boundary, is_finished_assistant = excluded.is_finished_assistant,"
    " token_estimate = excluded.token_estimate, payload = excluded.payload, seq = excluded.seq"
    " WHERE messages.session_id = excluded.session_id RETURNING insert_seq"
)
# insert_seq is left alone: an update keeps the insertion's place in the write order.
_SQL_UPDATE_MESSAGE: Final = (
    "UPDATE messages SET agent = ?, role = ?, time_created = ?, is_boundary = ?,"
    " is_finished_assistant = ?, token_estimate = ?, payload = ?, off_branch = ?, seq = ?"
    " WHERE id = ? AND session_id = ? RETURNING insert_seq"
)
_SQL_HOST_NODES: Final = (
    "SELECT chain, parent, fingerprint, depth, message_ids, seq FROM host_nodes"
    " WHERE session_id = ? AND agent = ? AND seq > ? ORDER BY seq"
)
_SQL_HOST_HEAD: Final = "SELECT head FROM host_heads WHERE session_id = ? AND agent = ?"
_SQL_INSERT_HOST_NODE: Final = (
    "INSERT INTO host_nodes (session_id, agent, chain, parent, fingerprint, depth,"
    " message_ids, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)

# Row of a message as written: id, session_id, agent, role, time_created,
# is_boundary, is_finished_assistant, token_estimate, payload, off_branch.
_MessageRow = tuple[str, str, str, str, int, int, int, int, str, int]

_ACTIVE_STATUSES_SQL: Final = ", ".join(f"'{s}'" for s in sorted(ACTIVE_ACTOR_STATUSES))
_SQLITE_MAX_INT: Final = 2**63 - 1
_IN_CHUNK: Final = 500  # ids per "IN (...)" lookup, well under SQLite's variable limit
_WRITTEN_ENTRIES: Final = 512
_WRITTEN_CHARS: Final = 16_000_000


class _AlreadyCommitted(Exception):
    """Internal: the usage key of a rebuild is taken; roll back and answer False."""


def _message_row(message: Message) -> _MessageRow:
    try:
        payload = message.model_dump_json()
    except (ValueError, RecursionError) as exc:
        # Bytes that are not UTF-8 or nesting beyond the serialiser's limit in a tool
        # input: refuse the write, naming the message, rather than fail raw.
        raise StoreError(
            f"message {message.id!r} cannot be stored as JSON ({exc}); nothing written"
        ) from exc
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
    )


def _read_transaction(conn: sqlite3.Connection, body: Callable[[], _T]) -> _T:
    """Run ``body`` on one consistent snapshot (several SELECTs that must agree)."""
    conn.execute("BEGIN")
    try:
        return body()
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class SQLiteStore(SQLiteWorker):
    """A :class:`~mimo_ctx.store.base.Store` in one SQLite file (the embedded default).

    The file is opened on first use; ``await SQLiteStore.open(path)`` or
    ``async with SQLiteStore(path) as store:`` open it at once, so a bad file is
    reported there. ``path=":memory:"`` gives a private in-memory database.

    Example:
        >>> async with SQLiteStore("agent.db") as store:  # doctest: +SKIP
        ...     await store.create_session(Session(time_created=0))
    """

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
            synchronous: SQLite's ``synchronous`` setting (see the module docstring).
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

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        read_only: bool = False,
    ) -> SQLiteStore:
        """Create a store and open its file now (arguments as for the constructor).

        Raises:
            StoreError: The file cannot be opened, is not an SQLite database, is
                not a mimo_ctx store, or has a newer schema. The file is unchanged.
        """
        store = cls(path, busy_timeout=busy_timeout, synchronous=synchronous, read_only=read_only)
        await store._run(lambda _conn: None)
        return store

    # -- plumbing (the worker thread is SQLiteWorker's) --------------------------
    def _connect(self) -> sqlite3.Connection:
        return open_database(
            self._path,
            busy_timeout=self._busy_timeout,
            synchronous=self._synchronous,
            read_only=self._read_only,
        )

    def _load_message(self, row: tuple[Any, ...]) -> Message:
        message_id, seq, estimate, insert_seq, payload = row
        written = self._written.get((message_id, seq))
        if written is not None:
            # This store wrote exactly this version (same id, same change-feed
            # number): the object it was given is what the payload parses to.
            return written[0]
        message = self._parse(Message, payload)
        # The row's estimate was computed from this very payload at write time.
        message._token_estimate = int(estimate)  # pyright: ignore[reportPrivateUsage]
        set_insert_seq(message, int(insert_seq))
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
        rows: Sequence[_MessageRow],
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
        written = self._written
        for message, row, seq, insert_seq in zip(messages, rows, seqs, insert_seqs, strict=True):
            set_insert_seq(message, insert_seq)
            written[(message.id, seq)] = (message, len(row[8]))
            self._written_chars += len(row[8])
        while written and (len(written) > _WRITTEN_ENTRIES or self._written_chars > _WRITTEN_CHARS):
            _, (_, chars) = written.popitem(last=False)
            self._written_chars -= chars

    @staticmethod
    def _next_seq(conn: sqlite3.Connection) -> int:
        """The number the next write takes. Inside a write transaction."""
        return int(conn.execute(_SQL_CURRENT_SEQ).fetchone()[0]) + 1

    @staticmethod
    def _session_exists(conn: sqlite3.Connection, session_id: str) -> bool:
        row = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return row is not None

    @staticmethod
    def _take_seqs(conn: sqlite3.Connection, count: int) -> int:
        """Reserve ``count`` sequence numbers; return the first. Inside a write tx."""
        current = int(conn.execute(_SQL_CURRENT_SEQ).fetchone()[0])
        conn.execute("UPDATE counters SET value = ? WHERE name = 'seq'", (current + count,))
        return current + 1

    def _insert_messages(
        self, conn: sqlite3.Connection, rows: Sequence[_MessageRow], what: str
    ) -> int:
        """Validate and insert new message rows; return the first one's seq. Inside a write tx."""
        for session_id in {r[1] for r in rows}:
            if not self._session_exists(conn, session_id):
                raise StoreError(f"{what}: unknown session {session_id!r}; nothing written")
        ids = [r[0] for r in rows]
        for chunk in _chunks(ids, _IN_CHUNK):
            marks = ",".join("?" * len(chunk))
            found = conn.execute(
                f"SELECT id FROM messages WHERE id IN ({marks})", tuple(chunk)
            ).fetchone()
            if found is not None:
                raise StoreError(f"{what}: message id {found[0]!r} already exists; nothing written")
        first = self._take_seqs(conn, len(rows))
        conn.executemany(
            _SQL_INSERT_MESSAGE, [(*r, first + i, first + i) for i, r in enumerate(rows)]
        )
        return first

    def _update_messages(
        self,
        conn: sqlite3.Connection,
        rows: Sequence[_MessageRow],
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
            found = conn.execute(_SQL_UPDATE_MESSAGE, (*r[2:], first + i, mid, sid)).fetchone()
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

    def _upsert_messages(
        self, conn: sqlite3.Connection, rows: Sequence[_MessageRow]
    ) -> tuple[int, list[int]]:
        """Insert new rows and replace known ones; the first seq and each insert_seq."""
        for session_id in {r[1] for r in rows}:
            if not self._session_exists(conn, session_id):
                raise StoreError(
                    f"upsert_messages: unknown session {session_id!r}; nothing written"
                )
        first = self._take_seqs(conn, len(rows))
        kept: list[int] = []
        for i, r in enumerate(rows):
            found = conn.execute(_SQL_UPSERT_MESSAGE, (*r, first + i, first + i)).fetchone()
            if found is None:
                stored = conn.execute(
                    "SELECT session_id FROM messages WHERE id = ?", (r[0],)
                ).fetchone()
                raise StoreError(
                    f"upsert_messages: message {r[0]!r} belongs to session "
                    f"{stored[0] if stored else None!r}, not {r[1]!r}; nothing written"
                )
            kept.append(int(found[0]))
        return first, kept

    # -- sessions -------------------------------------------------------------
    async def create_session(self, session: Session) -> None:
        """Store a new session. Raises ``StoreError`` if its id exists."""
        payload = session.model_dump_json()

        def run(conn: sqlite3.Connection) -> None:
            def body() -> None:
                if self._session_exists(conn, session.id):
                    raise StoreError(f"session {session.id!r} already exists")
                conn.execute(
                    "INSERT INTO sessions (id, time_created, payload) VALUES (?, ?, ?)",
                    (session.id, session.time_created, payload),
                )

            write_transaction(conn, body)

        await self._run(run)

    async def get_session(self, session_id: str) -> Session | None:
        """Return the session, or ``None`` when there is none with that id."""

        def run(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT payload FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            return None if row is None else str(row[0])

        payload = await self._run(run)
        return None if payload is None else self._parse(Session, payload)

    async def update_session(self, session: Session) -> None:
        """Replace a stored session, keeping its watermark and state.

        Raises:
            StoreError: The session does not exist.
        """
        payload = session.model_dump_json()

        def run(conn: sqlite3.Connection) -> None:
            def body() -> None:
                cursor = conn.execute(
                    _SQL_REPLACE_SESSION, (session.time_created, payload, session.id)
                )
                if cursor.rowcount != 1:
                    raise StoreError(f"unknown session {session.id!r}")

            write_transaction(conn, body)

        await self._run(run)

    async def update_session_state(self, session_id: str, change: StateChange) -> SessionState:
        """Apply ``change`` to the stored state in one write transaction; return the new state.

        See :meth:`mimo_ctx.store.base.Store.update_session_state`.
        """

        def run(conn: sqlite3.Connection) -> SessionState:
            return write_transaction(conn, lambda: self._change_state(conn, session_id, change))

        return await self._run(run)

    def _change_state(
        self, conn: sqlite3.Connection, session_id: str, change: StateChange
    ) -> SessionState:
        """Read, change and write the session's state. Inside a write transaction."""
        row = conn.execute(
            "SELECT json_extract(payload, '$.state') FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"unknown session {session_id!r}")
        stored = self._parse(SessionState, str(row[0]))
        new = apply_state_change(session_id, stored, change)
        conn.execute(
            "UPDATE sessions SET payload = json_set(payload, '$.state', json(?)) WHERE id = ?",
            (new.model_dump_json(), session_id),
        )
        return new

    async def list_sessions(self) -> list[Session]:
        """Return every session, oldest ``(time_created, id)`` first."""

        def run(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT payload FROM sessions ORDER BY time_created, id")
            return [str(r[0]) for r in rows]

        return [self._parse(Session, p) for p in await self._run(run)]

    async def get_watermark(self, session_id: str) -> str | None:
        """Return the session's watermark; ``None`` when unset or the session is unknown."""

        def run(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT json_extract(payload, '$.watermark') FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
            return None if row is None or row[0] is None else str(row[0])

        return await self._run(run)

    async def set_watermark(self, session_id: str, message_id: str) -> None:
        """Persist the watermark. Raises ``StoreError`` if the session is unknown."""

        def run(conn: sqlite3.Connection) -> None:
            def body() -> None:
                # One statement edits the JSON in place: atomic with respect to a
                # concurrent update_session, and no parse/serialise round trip.
                cursor = conn.execute(
                    "UPDATE sessions SET payload = json_set(payload, '$.watermark', ?)"
                    " WHERE id = ?",
                    (message_id, session_id),
                )
                if cursor.rowcount != 1:
                    raise StoreError(f"unknown session {session_id!r}")

            write_transaction(conn, body)

        await self._run(run)

    # -- messages -------------------------------------------------------------
    async def append_messages(self, messages: Sequence[Message]) -> None:
        """Append new messages in one transaction.

        Raises:
            StoreError: An id already exists (or repeats in the batch) or a session
                is unknown; nothing is written.
        """
        batch = list(messages)
        _reject_repeated_ids(batch, "append_messages")
        if not batch:
            return

        def run(conn: sqlite3.Connection) -> None:
            # Serialise before taking the write lock, to hold it briefly.
            rows = [_message_row(m) for m in batch]
            first = write_transaction(
                conn, lambda: self._insert_messages(conn, rows, "append_messages")
            )
            numbers = range(first, first + len(rows))
            self._remember(batch, rows, numbers, numbers)

        await self._run(run)

    async def update_messages(self, messages: Sequence[Message]) -> None:
        """Replace stored messages (same ids) in one transaction.

        Raises:
            StoreError: A message does not exist or would move to another session;
                nothing is written.
        """
        batch = list(messages)
        if not batch:
            return

        def run(conn: sqlite3.Connection) -> None:
            rows = [_message_row(m) for m in batch]

            def body() -> tuple[int, list[int]]:
                first = self._next_seq(conn)
                return first, self._update_messages(conn, rows, "update_messages")

            first, kept = write_transaction(conn, body)
            self._remember(batch, rows, range(first, first + len(rows)), kept)

        await self._run(run)

    async def upsert_messages(self, messages: Sequence[Message]) -> None:
        """Store messages in one transaction: new ids appended, known ids replaced.

        See :meth:`mimo_ctx.store.base.Store.upsert_messages`. A replaced message
        keeps its place in the write order (``insert_seq``), as an update does.

        Raises:
            StoreError: A session is unknown, an id repeats in the batch, or a known
                id belongs to another session; nothing is written.
        """
        batch = list(messages)
        _reject_repeated_ids(batch, "upsert_messages")
        if not batch:
            return

        def run(conn: sqlite3.Connection) -> None:
            rows = [_message_row(m) for m in batch]
            first, kept = write_transaction(conn, lambda: self._upsert_messages(conn, rows))
            self._remember(batch, rows, range(first, first + len(rows)), kept)

        await self._run(run)

    async def get_message(self, message_id: str) -> Message | None:
        """Return one message by id, or ``None``."""

        def run(conn: sqlite3.Connection) -> Message | None:
            row = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            return None if row is None else self._load_message(row)

        return await self._run(run)

    async def list_messages(
        self,
        session_id: str,
        *,
        agent: str | None = MAIN_AGENT,
        since: tuple[int, str] | None = None,
        last: int | None = None,
        exclude_agent: str | None = None,
    ) -> list[Message]:
        """List a session's messages ordered by ``(time_created, id)``.

        See :meth:`mimo_ctx.store.base.Store.list_messages`.
        """
        if last is not None and last < 0:
            raise StoreError(f"list_messages: last must be >= 0, got {last}")
        if last == 0:
            return []
        where = ["session_id = ?", "off_branch = 0"]
        params: list[object] = [session_id]
        if agent is not None:
            where.append("agent = ?")
            params.append(agent)
        if exclude_agent is not None:
            where.append("agent != ?")
            params.append(exclude_agent)
        if since is not None:
            # Row-value comparison: SQLite turns it into an index range scan.
            where.append("(time_created, id) >= (?, ?)")
            params.extend(since)
        return await self._select_messages(" AND ".join(where), params, last=last, newest=True)

    async def list_user_messages(
        self,
        session_id: str,
        *,
        agent: str = MAIN_AGENT,
        first: int | None = None,
        last: int | None = None,
        before: tuple[int, str] | None = None,
    ) -> list[Message]:
        """The agent's user messages that are not boundaries, by ``(time_created, id)``.

        See :meth:`mimo_ctx.store.base.Store.list_user_messages`; read through the
        ``messages_user`` partial index.
        """
        limit = check_user_message_window(first, last)
        if limit == 0:
            return []
        where = (
            "session_id = ? AND agent = ? AND role = 'user' AND is_boundary = 0 AND off_branch = 0"
        )
        params: list[object] = [session_id, agent]
        if before is not None:
            where += " AND (time_created, id) < (?, ?)"
            params.extend(before)
        return await self._select_messages(where, params, last=limit, newest=last is not None)

    async def _select_messages(
        self, where: str, params: list[object], *, last: int | None, newest: bool
    ) -> list[Message]:
        """Messages matching ``where`` by ``(time_created, id)``, at most ``last`` of them.

        ``newest``: the newest ``last`` (read backwards, returned oldest first);
        otherwise the oldest.
        """
        order = "DESC" if newest and last is not None else "ASC"
        sql = (
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE {where}"
            f" ORDER BY time_created {order}, id {order}"
        )
        if last is not None:
            sql += " LIMIT ?"
            # A huge configured window means "no limit"; SQLite integers are 64-bit.
            params = [*params, min(last, _SQLITE_MAX_INT)]

        def run(conn: sqlite3.Connection) -> list[Message]:
            messages = [self._load_message(r) for r in conn.execute(sql, params)]
            if order == "DESC":
                messages.reverse()
            return messages

        return await self._run(run)

    async def count_messages(self, session_id: str, *, agent: str | None = None) -> int:
        """Count a session's messages (of one agent, or of all when ``agent`` is None)."""

        def run(conn: sqlite3.Connection) -> int:
            if agent is None:
                row = conn.execute(
                    "SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)
                ).fetchone()
            else:
                row = conn.execute(
                    "SELECT COUNT(*) FROM messages WHERE session_id = ? AND agent = ?",
                    (session_id, agent),
                ).fetchone()
            return int(row[0])

        return await self._run(run)

    async def latest_finished_assistant(
        self, session_id: str, *, agent: str | None = MAIN_AGENT
    ) -> Message | None:
        """The newest (by id) assistant message whose ``finish`` is set."""

        def run(conn: sqlite3.Connection) -> Message | None:
            if agent is None:
                row = conn.execute(_SQL_LATEST_FINISHED, (session_id,)).fetchone()
            else:
                row = conn.execute(_SQL_LATEST_FINISHED_BY_AGENT, (session_id, agent)).fetchone()
            return None if row is None else self._load_message(row)

        return await self._run(run)

    async def latest_boundary(self, session_id: str) -> Message | None:
        """The newest (by id) main-agent user message with a checkpoint or compaction part."""

        def run(conn: sqlite3.Connection) -> Message | None:
            row = conn.execute(_SQL_LATEST_BOUNDARY, (session_id, MAIN_AGENT)).fetchone()
            return None if row is None else self._load_message(row)

        return await self._run(run)

    async def changes_since(self, session_id: str, seq: int) -> tuple[list[Message], int]:
        """Messages of the session written after ``seq``, in write order, and the current seq.

        Both are read from one snapshot, so nothing written concurrently (by this
        or another process) can fall between them.
        """

        def run(conn: sqlite3.Connection) -> tuple[list[Message], int]:
            def body() -> tuple[list[Message], int]:
                rows = conn.execute(_SQL_CHANGES, (session_id, seq)).fetchall()
                current = int(conn.execute(_SQL_CURRENT_SEQ).fetchone()[0])
                return [self._load_message(r) for r in rows], current

            return _read_transaction(conn, body)

        return await self._run(run)

    async def commit_rebuild(
        self,
        session_id: str,
        *,
        usage_key: str,
        boundary: Message,
        updated: Sequence[Message],
        state: StateChange | None = None,
    ) -> bool:
        """Append ``boundary`` and replace ``updated`` in one transaction, once per usage key.

        See :meth:`mimo_ctx.store.base.Store.commit_rebuild`.

        Raises:
            StoreError: The session is unknown, the boundary id exists, or an
                updated message is missing or belongs to another session; nothing
                is written and the key stays unused.
        """
        batch = list(updated)
        check_rebuild_arguments(session_id, boundary, batch)

        def run(conn: sqlite3.Connection) -> bool:
            boundary_row = _message_row(boundary)
            rows = [_message_row(m) for m in batch]

            def body() -> tuple[int, list[int]]:
                if not self._session_exists(conn, session_id):
                    raise StoreError(f"commit_rebuild: unknown session {session_id!r}")
                # The key goes in first: the UNIQUE constraint, not a prior
                # check, decides which of several concurrent commits wins.
                try:
                    conn.execute(
                        "INSERT INTO rebuilds (session_id, usage_key, boundary_id,"
                        " time_committed) VALUES (?, ?, ?, ?)",
                        (session_id, usage_key, boundary.id, now_ms()),
                    )
                except sqlite3.IntegrityError:
                    raise _AlreadyCommitted from None
                # Inside the same transaction: a boundary inserted after the usage
                # message already recovered it (R1.4), whoever wrote it.
                newer = conn.execute(
                    _SQL_NEWER_BOUNDARY, (boundary.agent, usage_key, session_id)
                ).fetchone()
                if newer is not None:
                    raise _AlreadyCommitted
                first = self._insert_messages(conn, [boundary_row], "commit_rebuild")
                kept = self._update_messages(conn, rows, "commit_rebuild", session_id)
                if state is not None:
                    self._change_state(conn, session_id, state)
                return first, kept

            try:
                first, kept = write_transaction(conn, body)
            except _AlreadyCommitted:
                return False
            # The boundary took `first`, the updated messages the numbers after it.
            self._remember(
                [boundary, *batch],
                [boundary_row, *rows],
                range(first, first + 1 + len(rows)),
                [first, *kept],
            )
            return True

        return await self._run(run)

    # -- tasks and actors ----------------------------------------------------
    # -- host index -------------------------------------------------------------
    async def host_index(self, session_id: str, *, agent: str, since: int = 0) -> HostIndex:
        """The host nodes written after ``since`` and the head (see the Store contract)."""

        def run(conn: sqlite3.Connection) -> HostIndex:
            def body() -> HostIndex:
                rows = conn.execute(_SQL_HOST_NODES, (session_id, agent, since)).fetchall()
                head = conn.execute(_SQL_HOST_HEAD, (session_id, agent)).fetchone()
                current = int(conn.execute(_SQL_CURRENT_SEQ).fetchone()[0])
                nodes = [
                    HostNode(
                        chain=str(r[0]),
                        parent=str(r[1]),
                        fingerprint=str(r[2]),
                        depth=int(r[3]),
                        message_ids=[str(i) for i in json.loads(r[4])],
                        seq=int(r[5]),
                    )
                    for r in rows
                ]
                return HostIndex(
                    nodes=nodes, head=None if head is None else str(head[0]), seq=current
                )

            return _read_transaction(conn, body)

        return await self._run(run)

    async def commit_host_history(
        self,
        session_id: str,
        *,
        agent: str,
        nodes: Sequence[HostNode] = (),
        messages: Sequence[Message] = (),
        updated: Sequence[Message] = (),
        move: HeadMove | None = None,
    ) -> bool:
        """Store host messages, their nodes and the head in one transaction.

        See :meth:`mimo_ctx.store.base.Store.commit_host_history`.
        """
        new = list(messages)
        changed = list(updated)
        check_host_commit(session_id, nodes, [*new, *changed])
        _reject_repeated_ids(new, "commit_host_history")

        def run(conn: sqlite3.Connection) -> bool:
            new_rows = [_message_row(m) for m in new]
            changed_rows = [_message_row(m) for m in changed]

            def body() -> None:
                if not self._session_exists(conn, session_id):
                    raise StoreError(f"commit_host_history: unknown session {session_id!r}")
                if move is not None:
                    row = conn.execute(_SQL_HOST_HEAD, (session_id, agent)).fetchone()
                    if (None if row is None else str(row[0])) != move.expected:
                        raise _AlreadyCommitted
                if nodes:
                    first = self._take_seqs(conn, len(nodes))
                    try:
                        conn.executemany(
                            _SQL_INSERT_HOST_NODE,
                            [
                                (
                                    session_id,
                                    agent,
                                    n.chain,
                                    n.parent,
                                    n.fingerprint,
                                    n.depth,
                                    json.dumps(n.message_ids),
                                    first + i,
                                )
                                for i, n in enumerate(nodes)
                            ],
                        )
                    except sqlite3.IntegrityError:
                        # The primary key, not a prior check, decides which of two
                        # workers stores a host message.
                        raise _AlreadyCommitted from None
                if new_rows:
                    self._insert_messages(conn, new_rows, "commit_host_history")
                self._update_messages(conn, changed_rows, "commit_host_history", session_id)
                if move is not None:
                    conn.execute(
                        "INSERT INTO host_heads (session_id, agent, head) VALUES (?, ?, ?)"
                        " ON CONFLICT (session_id, agent) DO UPDATE SET head = excluded.head",
                        (session_id, agent, move.head),
                    )

            try:
                write_transaction(conn, body)
            except _AlreadyCommitted:
                return False
            return True

        return await self._run(run)

    async def upsert_task(self, task: Task) -> None:
        """Insert or replace a task (keyed by session id and task id)."""
        payload = task.model_dump_json()

        def run(conn: sqlite3.Connection) -> None:
            def body() -> None:
                conn.execute(
                    "INSERT INTO tasks (session_id, id, payload) VALUES (?, ?, ?)"
                    " ON CONFLICT (session_id, id) DO UPDATE SET payload = excluded.payload",
                    (task.session_id, task.id, payload),
                )

            write_transaction(conn, body)

        await self._run(run)

    async def get_task(self, session_id: str, task_id: str) -> Task | None:
        """Return one task of a session, or ``None``."""

        def run(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT payload FROM tasks WHERE session_id = ? AND id = ?", (session_id, task_id)
            ).fetchone()
            return None if row is None else str(row[0])

        payload = await self._run(run)
        return None if payload is None else self._parse(Task, payload)

    async def list_tasks(self, session_id: str) -> list[Task]:
        """Return the session's tasks, terminal ones included, in natural id order."""

        def run(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT payload FROM tasks WHERE session_id = ?", (session_id,))
            return [str(r[0]) for r in rows]

        tasks = [self._parse(Task, p) for p in await self._run(run)]
        tasks.sort(key=lambda t: (task_order_key(t.id), t.id))
        return tasks

    async def upsert_actor(self, actor: Actor) -> None:
        """Insert or replace an actor (keyed by its id).

        Raises:
            StoreError: The id belongs to an actor of another session (an actor
                never moves between sessions, SPEC R5.4).
        """
        payload = actor.model_dump_json()

        def run(conn: sqlite3.Connection) -> None:
            def body() -> None:
                row = conn.execute(
                    "SELECT session_id FROM actors WHERE id = ?", (actor.id,)
                ).fetchone()
                if row is not None and row[0] != actor.session_id:
                    raise StoreError(
                        f"actor {actor.id!r} belongs to another session; "
                        f"it cannot be written for session {actor.session_id!r}"
                    )
                conn.execute(
                    "INSERT INTO actors (id, session_id, status, background, time_created,"
                    " payload) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                    " status = excluded.status, background = excluded.background,"
                    " time_created = excluded.time_created, payload = excluded.payload",
                    (
                        actor.id,
                        actor.session_id,
                        actor.status,
                        int(actor.background),
                        actor.time_created,
                        payload,
                    ),
                )

            write_transaction(conn, body)

        await self._run(run)

    async def get_actor(self, session_id: str, actor_id: str) -> Actor | None:
        """Return one actor, only if it belongs to ``session_id`` (SPEC R5.4)."""

        def run(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT payload FROM actors WHERE id = ? AND session_id = ?",
                (actor_id, session_id),
            ).fetchone()
            return None if row is None else str(row[0])

        payload = await self._run(run)
        return None if payload is None else self._parse(Actor, payload)

    async def list_actors(self, session_id: str, *, active_only: bool = False) -> list[Actor]:
        """Return this session's actors, oldest first (never another session's, R5.4).

        ``active_only`` keeps background actors with status pending or running.
        """
        sql = "SELECT payload FROM actors WHERE session_id = ?"
        if active_only:
            sql += f" AND background = 1 AND status IN ({_ACTIVE_STATUSES_SQL})"
        sql += " ORDER BY time_created, id"

        def run(conn: sqlite3.Connection) -> list[str]:
            return [str(r[0]) for r in conn.execute(sql, (session_id,))]

        return [self._parse(Actor, p) for p in await self._run(run)]


def _reject_repeated_ids(messages: Sequence[Message], what: str) -> None:
    seen: set[str] = set()
    for m in messages:
        if m.id in seen:
            raise StoreError(f"{what}: message id {m.id!r} appears twice; nothing written")
        seen.add(m.id)
