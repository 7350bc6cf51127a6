"""The embedded default store: one SQLite file, safe to share between processes.

Design:

* **Off the event loop.** Every call runs the stdlib :mod:`sqlite3` on the
  store's own worker thread (:mod:`mimo_ctx._sqlite_worker`: a queue of jobs run
  one at a time, each result handed back with one wake-up of the caller's event
  loop) and under a thread lock, so the loop never waits on a lock or the disk
  and the single connection is never used by two threads at once. A caller
  cancelled before its job starts takes it back; one cancelled while it runs
  waits for it to finish, so a transaction is never left half-done. Two
  exceptions. A small message write (a turn's one or two messages) runs on the
  caller's thread when nothing waits for the connection and the write cannot
  wait either: WAL mode with ``synchronous=NORMAL`` (no ``fsync`` in the
  commit), the write lock taken with a busy timeout of 0 (held elsewhere, the
  write goes to the worker thread, which waits for it), no checkpoint in the
  commit; it costs the loop ~0.1-0.5 ms and saves the two threads' wake-ups
  (see :mod:`mimo_ctx._sqlite_worker`). And the change feed after this store's
  own writes, when nobody else has committed since, is answered from what it
  wrote, checked by one query of the connection's ``data_version`` (which only
  other connections' commits change) that reads the WAL index in shared memory
  and never waits (``mimo_ctx.store._sqlite_feed``): the read that follows every
  turn's write costs no hand-off to the worker thread.
* **WAL mode** (readers do not block the writer) and a **busy timeout** (30 s by
  default), so processes sharing the file wait for each other instead of
  failing with "database is locked". ``synchronous=NORMAL``: in WAL mode a crash
  of the process loses nothing committed; only a power cut can lose the last
  transactions (never corrupt the file). Pass ``synchronous="FULL"`` to trade
  speed for that too. WAL checkpoints run on the worker thread between jobs
  (when idle, and at the latest every 128 writing calls), not inside a write's
  commit; see :mod:`mimo_ctx._sqlite_worker`.
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
  (SPEC R2.2) and the part lengths it was summed from, which are put back into the
  loaded message's cache, so a cold load never re-serialises a message to count it,
  nor a rebuild a result it marks compacted.
* **What it just wrote is not parsed again.** The store keeps the last few
  hundred messages it wrote (bounded in count and payload size), keyed by id and
  change-feed number; reading one of those versions back (the change feed after a
  record or a rebuild, a listing) returns the object it was given. Messages are
  values (as with :class:`~mimo_ctx.store.in_memory.InMemoryStore`): build a new
  one, or ``model_copy`` it, to change it; never change a stored one in place.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Final, Unpack

import anyio.lowlevel

from mimo_ctx._util import now_ms
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message
from mimo_ctx.session import (
    ACTIVE_ACTOR_STATUSES,
    Actor,
    Session,
    SessionState,
    StateChange,
    Task,
)
from mimo_ctx.store._common import (
    SQLITE,
    HostCommit,
    MessageQuery,
    MessageSelect,
    RebuildCommit,
    SQLStoreBase,
    UserMessageQuery,
    host_node,
    in_task_order,
)
from mimo_ctx.store._reads import RebuildReadRequest, RebuildReads
from mimo_ctx.store._sqlite_base import (
    SQL_CURRENT_SEQ,
    AlreadyCommitted,
    MessageRow,
    SQLiteBase,
    SQLiteOptions,
    compaction_edit,
    message_json,
    message_row,
    read_transaction,
)
from mimo_ctx.store._sqlite_feed import data_version
from mimo_ctx.store._sqlite_schema import SCHEMA_VERSION, write_transaction
from mimo_ctx.store.base import (
    HostIndex,
    apply_state_change,
    check_user_message_window,
)

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]


# -- statements (module constants so tests can check their query plans) ------
_MESSAGE_COLUMNS: Final = "id, seq, token_estimate, insert_seq, payload, part_units"
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
# The watermark is the writer's (set_watermark) and the state changes field by
# field (update_session_state): replacing the session from an older copy keeps both.
_SQL_REPLACE_SESSION: Final = (
    "UPDATE sessions SET time_created = ?, payload = json_set(?,"
    " '$.watermark', json_extract(payload, '$.watermark'),"
    " '$.state', json(json_extract(payload, '$.state'))) WHERE id = ?"
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


_ACTIVE_STATUSES_SQL: Final = ", ".join(f"'{s}'" for s in sorted(ACTIVE_ACTOR_STATUSES))
_SQL_TASKS: Final = "SELECT payload FROM tasks WHERE session_id = ?"
_SQL_ACTORS: Final = "SELECT payload FROM actors WHERE session_id = ? ORDER BY time_created, id"
_SQL_ACTIVE_ACTORS: Final = (
    "SELECT payload FROM actors WHERE session_id = ?"
    f" AND background = 1 AND status IN ({_ACTIVE_STATUSES_SQL}) ORDER BY time_created, id"
)


class SQLiteStore(SQLiteBase, SQLStoreBase):
    """A :class:`~mimo_ctx.store.base.Store` in one SQLite file (the embedded default).

    The file is opened on first use; ``await SQLiteStore.open(path)`` or
    ``async with SQLiteStore(path) as store:`` open it at once, so a bad file is
    reported there. ``path=":memory:"`` gives a private in-memory database.

    Example:
        >>> async with SQLiteStore("agent.db") as store:  # doctest: +SKIP
        ...     await store.create_session(Session(time_created=0))
    """

    _dialect = SQLITE

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], **options: Unpack[SQLiteOptions]
    ) -> SQLiteStore:
        """Create a store and open its file now (arguments as for the constructor).

        Raises:
            StoreError: The file cannot be opened, is not an SQLite database, is
                not a mimo_ctx store, or has a newer schema. The file is unchanged.
        """
        store = cls(path, **options)
        await store._run(lambda _conn: None)
        return store

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
    async def _append(self, batch: list[Message]) -> None:
        def insert(conn: sqlite3.Connection, rows: Sequence[MessageRow]) -> tuple[int, range]:
            first = self._insert_messages(conn, rows, "append_messages")
            return first, range(first, first + len(rows))

        await self._write_batch(batch, insert)

    async def _update(self, batch: list[Message]) -> None:
        def update(conn: sqlite3.Connection, rows: Sequence[MessageRow]) -> tuple[int, list[int]]:
            first = self._next_seq(conn)
            return first, self._update_messages(conn, rows, "update_messages")

        await self._write_batch(batch, update)

    async def _upsert(self, batch: list[Message]) -> None:
        await self._write_batch(batch, self._upsert_messages)

    async def get_message(self, message_id: str) -> Message | None:
        """Return one message by id, or ``None``."""

        def run(conn: sqlite3.Connection) -> Message | None:
            row = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            return None if row is None else self._load_message(row)

        return await self._run(run)

    async def _fetch_messages(self, tail: str, params: Sequence[object]) -> list[Message]:
        return await self._run(lambda conn: self._fetched(conn, tail, params))

    def _fetched(
        self, conn: sqlite3.Connection, tail: str, params: Sequence[object]
    ) -> list[Message]:
        """The messages of ``SELECT <message columns> FROM messages <tail>`` (worker thread)."""
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages {tail}"
        return [self._load_message(r) for r in conn.execute(sql, params)]

    async def read_for_rebuild(self, request: RebuildReadRequest) -> RebuildReads:
        """A rebuild's reads (:mod:`mimo_ctx.store._reads`) in one worker-thread call.

        The same answers as :meth:`list_messages`, :meth:`list_actors`,
        :meth:`list_tasks` and :meth:`list_user_messages`, read on one snapshot.
        """
        self._check_open()
        session_id = request.session_id
        selects: list[MessageSelect | None] = [
            self._messages_select(
                MessageQuery(session_id, None, request.since, None, request.exclude_agent)
            )
        ]
        for read in request.users:
            limit = check_user_message_window(read.first, read.last)
            selects.append(
                self._user_messages_select(
                    UserMessageQuery(
                        session_id, MAIN_AGENT, read.before, limit, newest=read.last is not None
                    )
                )
            )

        def run(conn: sqlite3.Connection) -> tuple[list[str], list[str], list[list[Message]]]:
            def body() -> tuple[list[str], list[str], list[list[Message]]]:
                tasks = [str(r[0]) for r in conn.execute(_SQL_TASKS, (session_id,))]
                actors = [str(r[0]) for r in conn.execute(_SQL_ACTIVE_ACTORS, (session_id,))]
                listed: list[list[Message]] = []
                for select in selects:
                    rows = [] if select is None else self._fetched(conn, select.tail, select.params)
                    if select is not None and select.reverse:
                        rows.reverse()
                    listed.append(rows)
                return tasks, actors, listed

            return read_transaction(conn, body)

        tasks, actors, listed = await self._run(run)
        return RebuildReads(
            tasks=in_task_order(self._parse(Task, p) for p in tasks),
            actors=[self._parse(Actor, p) for p in actors],
            since=listed[0],
            users=dict(zip(request.users, listed[1:], strict=True)),
        )

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

        # After this store's own writes, with nobody else's since, the answer is
        # known without the worker thread (see mimo_ctx.store._sqlite_feed); on the
        # caller's thread like an inline write, and yielding by the same rule.
        await anyio.lowlevel.checkpoint_if_cancelled()
        started = time.perf_counter()
        known = self.changes_known(session_id, seq)
        if known is not None:
            await self._ran_on_loop(started)
            return known

        def run(conn: sqlite3.Connection) -> tuple[list[Message], int]:
            def body() -> tuple[list[Message], int, int | None]:
                # The version of the snapshot the feed is read on (see _committed).
                version = data_version(conn)
                rows = conn.execute(_SQL_CHANGES, (session_id, seq)).fetchall()
                current = int(conn.execute(SQL_CURRENT_SEQ).fetchone()[0])
                return [self._load_message(r) for r in rows], current, version

            changed, current, version = read_transaction(conn, body)
            self._feed_read(version, current)
            return changed, current

        return await self._run(run)

    async def _commit_rebuild(self, commit: RebuildCommit) -> bool:
        """Write a checked :meth:`commit_rebuild` in one transaction, once per usage key."""
        session_id, boundary, batch = commit.session_id, commit.boundary, commit.updated

        def run(conn: sqlite3.Connection) -> bool:
            # The boundary (the rebuilt body: up to hundreds of KB) bound as its
            # UTF-8 bytes, never decoded into a str (see message_json).
            boundary_row = message_row(boundary, message_json(boundary))
            # Micro-compacted copies are written as edits of their rows when each
            # still is the version it was made from (mimo_ctx._marks): nothing of
            # them is serialised. Otherwise (or when a row moved on) in full.
            edits = [compaction_edit(m) for m in batch]
            marked = [e for e in edits if e is not None] if None not in edits else []
            rows = [] if marked else [message_row(m) for m in batch]

            def body() -> tuple[int, list[int]]:
                if not self._session_exists(conn, session_id):
                    raise StoreError(f"commit_rebuild: unknown session {session_id!r}")
                # The key goes in first: the UNIQUE constraint, not a prior
                # check, decides which of several concurrent commits wins.
                try:
                    conn.execute(
                        "INSERT INTO rebuilds (session_id, usage_key, boundary_id,"
                        " time_committed) VALUES (?, ?, ?, ?)",
                        (session_id, commit.usage_key, boundary.id, now_ms()),
                    )
                except sqlite3.IntegrityError:
                    raise AlreadyCommitted from None
                # Inside the same transaction: a boundary inserted after the usage
                # message already recovered it (R1.4), whoever wrote it.
                newer = conn.execute(
                    _SQL_NEWER_BOUNDARY, (boundary.agent, commit.usage_key, session_id)
                ).fetchone()
                if newer is not None:
                    raise AlreadyCommitted
                first = self._insert_messages(conn, [boundary_row], "commit_rebuild")
                kept = self._mark_compacted(conn, marked, session_id) if marked else None
                if kept is None:
                    if not rows:
                        rows.extend(message_row(m) for m in batch)
                    kept = self._update_contents(
                        conn, rows, [m.insert_seq for m in batch], "commit_rebuild", session_id
                    )
                if commit.state is not None:
                    self._change_state(conn, session_id, commit.state)
                return first, kept

            try:
                first, kept = self._write_transaction(conn, body)
            except AlreadyCommitted:
                return False
            # The boundary took `first`, the updated messages the numbers after it.
            sizes = [len(r[8]) for r in rows] if rows else [e.size for e in marked]
            self._remember_sized(
                [boundary, *batch],
                [len(boundary_row[8]), *sizes],
                range(first, first + 1 + len(batch)),
                [first, *kept],
            )
            self._report(range(first, first + 1 + len(batch)), [boundary, *batch])
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
                current = int(conn.execute(SQL_CURRENT_SEQ).fetchone()[0])
                nodes = [host_node(r) for r in rows]
                return HostIndex(
                    nodes=nodes, head=None if head is None else str(head[0]), seq=current
                )

            return read_transaction(conn, body)

        return await self._run(run)

    async def _commit_host_history(self, commit: HostCommit) -> bool:
        """Write a checked :meth:`commit_host_history` in one transaction.

        Inline (on the caller's thread) when it is small and nothing waits, like a
        message write (see :mod:`mimo_ctx._sqlite_worker`); its message rows go to
        the known change feed, so the window's refresh after it needs no read.
        """
        session_id, agent, nodes, move = commit.session_id, commit.agent, commit.nodes, commit.move
        messages = [*commit.messages, *commit.updated]
        split = len(commit.messages)
        rows: list[MessageRow] = []

        def run(conn: sqlite3.Connection) -> bool:
            if not rows:  # made already when an inline write fell back to the thread
                rows.extend(message_row(m) for m in messages)
            numbers: list[int] = []
            insert_seqs: list[int] = []

            def body() -> None:
                if not self._session_exists(conn, session_id):
                    raise StoreError(f"commit_host_history: unknown session {session_id!r}")
                if move is not None:
                    row = conn.execute(_SQL_HOST_HEAD, (session_id, agent)).fetchone()
                    if (None if row is None else str(row[0])) != move.expected:
                        raise AlreadyCommitted
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
                        raise AlreadyCommitted from None
                if split:
                    first = self._insert_messages(conn, rows[:split], "commit_host_history")
                    numbers.extend(range(first, first + split))
                    insert_seqs.extend(numbers)  # a new row's insert_seq is its seq
                changed = rows[split:]
                kept = self._update_messages(conn, changed, "commit_host_history", session_id)
                if changed:
                    before, count = self._taken[-1]
                    numbers.extend(range(before + 1, before + 1 + count))
                    insert_seqs.extend(kept)
                if move is not None:
                    conn.execute(
                        "INSERT INTO host_heads (session_id, agent, head) VALUES (?, ?, ?)"
                        " ON CONFLICT (session_id, agent) DO UPDATE SET head = excluded.head",
                        (session_id, agent, move.head),
                    )

            try:
                self._write_transaction(conn, body)
            except AlreadyCommitted:
                return False
            self._remember(messages, rows, numbers, insert_seqs)
            self._report(numbers, messages)
            return True

        inline = self._inline_rows(messages)
        if inline is not None:
            rows.extend(inline)
            return await self._run_write(run)
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
            return [str(r[0]) for r in conn.execute(_SQL_TASKS, (session_id,))]

        return in_task_order(self._parse(Task, p) for p in await self._run(run))

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
        sql = _SQL_ACTIVE_ACTORS if active_only else _SQL_ACTORS

        def run(conn: sqlite3.Connection) -> list[str]:
            return [str(r[0]) for r in conn.execute(sql, (session_id,))]

        return [self._parse(Actor, p) for p in await self._run(run)]
