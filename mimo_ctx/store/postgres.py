"""A PostgreSQL store for agent services that run many workers (SPEC R1.4, R4, A3).

Any worker may serve the next turn of a session, so every guarantee the
embedded stores give with in-process locks is given here by the database:

* **Once per usage across workers** (SPEC R1.4, R4). :meth:`PostgresStore.commit_rebuild`
  inserts the rebuild's key into ``rebuilds``, whose primary key is
  ``(session_id, usage_key)``, in the same transaction as the boundary message,
  the micro-compaction updates and the session's state change. The key goes in
  first with ``ON CONFLICT DO NOTHING``: the constraint, not a prior check,
  decides which of several concurrent commits wins; the losers write nothing and
  get ``False``.
* **A change feed no reader can skip.** Every message write takes the next value
  of the store-wide sequence ``message_seq``. Sequence values are handed out at
  call time but become visible at commit, so a plain "rows with ``seq > n``" read
  could return ``current = 12`` while a transaction holding 11 for the same
  session has not committed yet, and the next read (``seq > 12``) would miss it
  for good. So each write transaction first takes a per-session *exclusive*
  transaction-level advisory lock and only then draws sequence values, and
  :meth:`PostgresStore.changes_since` takes the same lock *shared* before it reads
  the rows and the sequence's current value. While the reader holds it, every
  write of that session that drew a value has committed (and is visible to the
  reader's next statement) and no new one can draw a value, so every later write
  of the session gets a number above the ``current`` returned. Writers of
  different sessions never wait for each other; readers never wait for readers.
  Advisory locks live in shared memory: a read writes nothing to disk, and the
  lock and the read travel in one round trip (the schema's ``changes_since()``
  function).
* **One writer per session across workers** (SPEC A3): :class:`PostgresWriterLease`,
  a lease row with an expiry kept by the database clock, so a crashed worker's
  lease lapses and another worker takes over; waiters learn of a release through
  ``LISTEN``/``NOTIFY`` and, as a fallback, by polling with backoff.

Driver: **asyncpg** (``pip install "mimo-ctx[postgres]"``). It is one
self-contained wheel (no libpq to install in the image), has a connection pool
and ``LISTEN`` support built in, and caches prepared statements, which keeps the
per-turn lookups to one round trip each. psycopg 3 would have brought typed
APIs, but needs libpq (or its binary extra) plus a separate pool package; asyncpg's
missing annotations are covered here by small :class:`typing.Protocol` views of
the few methods we call. Like asyncpg, this store needs anyio's asyncio backend.

Schema: versioned (:mod:`mimo_ctx.store._pg_schema`), in its own PostgreSQL
schema (``mimo_ctx`` by default) so it can share a database. Create or upgrade
it with :func:`upgrade` (the CLI's ``mimo-ctx db upgrade --dsn ...``), or pass
``create_schema=True`` to do it on first use. A store refuses to work on a
schema that is missing, older or newer than this code, with a
:class:`~mimo_ctx.errors.StoreError` saying what to do.

Deployment notes:

* **Memory files stay on a filesystem path.** Checkpoints, notes, project memory
  and task files are plain files (SPEC R5), read by the model through its file
  tools, so they are not moved into the database: every worker must mount the
  same memory root (a shared volume: NFS, EFS, a CSI volume ...) at the same
  path. Files are written atomically (temporary file + rename), which such
  volumes support within one directory.
* **Connection poolers.** Behind PgBouncer in transaction mode, pass
  ``statement_cache_size=0`` (unless the pooler tracks prepared statements) and
  give :class:`PostgresWriterLease` ``listen=False``: ``LISTEN`` needs a session,
  and the lease then learns of releases by polling alone (at most
  ``max_poll_interval`` late).
* **Connections.** Each store holds a pool of ``min_size`` to ``max_size``
  connections; a lease that listens holds one more.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Self, Unpack

import anyio

from mimo_ctx.store._pg_driver import missing_driver

try:
    # Checked again here (the driver module may be imported already): every
    # import of this module names the extra to install when the driver is missing.
    import asyncpg  # noqa: F401  # pyright: ignore[reportUnusedImport]
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise missing_driver() from _exc

from mimo_ctx.checkpoint.lease import LeaseHolder
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message
from mimo_ctx.session import Actor, Session, SessionState, StateChange, Task
from mimo_ctx.store._common import (
    POSTGRES,
    HostCommit,
    RebuildCommit,
    SQLStoreBase,
    host_node,
    in_task_order,
)
from mimo_ctx.store._pg_base import (
    AlreadyCommitted,
    PostgresBase,
    PostgresOptions,
    message_columns,
    stamp,
)
from mimo_ctx.store._pg_driver import (
    SESSION_LOCK_CLASS,
    Connection,
    affected,
    close_or_terminate,
    lock_key,
    quiet_rollback,
)
from mimo_ctx.store._pg_lease import PostgresWriterLease
from mimo_ctx.store._pg_schema import (
    SCHEMA_VERSION,
    render,
    upgrade,
)
from mimo_ctx.store.base import (
    HostIndex,
)

__all__ = [
    "SCHEMA_VERSION",
    "LeaseHolder",
    "PostgresStore",
    "PostgresWriterLease",
    "upgrade",
]


class PostgresStore(PostgresBase, SQLStoreBase):
    """A :class:`~mimo_ctx.store.base.Store` in PostgreSQL, shared by many workers.

    The pool is opened on first use; ``await PostgresStore.open(dsn)`` or
    ``async with PostgresStore(dsn) as store:`` open it at once, so a bad DSN or
    a missing schema is reported there.

    Example:
        >>> await upgrade("postgresql://app@db/agents")  # doctest: +SKIP
        >>> async with PostgresStore("postgresql://app@db/agents") as store:  # doctest: +SKIP
        ...     await store.create_session(Session(time_created=0))
    """

    _dialect = POSTGRES

    @classmethod
    async def open(cls, dsn: str, **options: Unpack[PostgresOptions]) -> PostgresStore:
        """Create a store (arguments as for the constructor) and open its pool now.

        Raises:
            StoreError: The server cannot be reached, or the schema is missing (and
                ``create_schema`` is false), older, newer, or not a mimo_ctx store.
        """
        store = cls(dsn, **options)
        await store._ready()
        return store

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def upgrade(self) -> int:
        """Create or upgrade this store's schema; see :func:`upgrade`."""
        self._check_open()
        return await upgrade(self._dsn, schema=self._schema)

    # -- sessions -------------------------------------------------------------
    async def create_session(self, session: Session) -> None:
        """Store a new session. Raises ``StoreError`` if its id exists."""
        payload = session.model_dump_json()
        async with self._connection() as conn:
            status = await conn.execute(
                self._sql.insert_session,
                session.id,
                session.time_created,
                session.watermark,
                payload,
            )
        if affected(status) != 1:
            raise StoreError(f"session {session.id!r} already exists")

    async def get_session(self, session_id: str) -> Session | None:
        """Return the session, or ``None`` when there is none with that id."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.get_session, session_id)
        return None if row is None else self._load_session(row[0], row[1], row[2])

    async def update_session(self, session: Session) -> None:
        """Replace a stored session, keeping its stored watermark (SPEC R2.1) and state.

        Raises:
            StoreError: The session does not exist.
        """
        payload = session.model_dump_json()
        async with self._connection() as conn:
            status = await conn.execute(
                self._sql.update_session, session.id, session.time_created, payload
            )
        if affected(status) != 1:
            raise StoreError(f"unknown session {session.id!r}")

    async def list_sessions(self) -> list[Session]:
        """Return every session, oldest ``(time_created, id)`` first."""
        async with self._connection() as conn:
            rows = await conn.fetch(self._sql.list_sessions)
        return [self._load_session(r[0], r[1], r[2]) for r in rows]

    async def get_watermark(self, session_id: str) -> str | None:
        """Return the session's watermark; ``None`` when unset or the session is unknown."""
        async with self._connection() as conn:
            value = await conn.fetchval(self._sql.get_watermark, session_id)
        return None if value is None else str(value)

    async def set_watermark(self, session_id: str, message_id: str) -> None:
        """Persist the watermark. Raises ``StoreError`` if the session is unknown."""
        async with self._connection() as conn:
            status = await conn.execute(self._sql.set_watermark, session_id, message_id)
        if affected(status) != 1:
            raise StoreError(f"unknown session {session_id!r}")

    # -- messages -------------------------------------------------------------
    async def _append(self, batch: list[Message]) -> None:
        await self._write_batch(
            batch, lambda conn: self._insert_messages(conn, batch, "append_messages")
        )

    async def _update(self, batch: list[Message]) -> None:
        await self._write_batch(
            batch, lambda conn: self._update_messages(conn, batch, "update_messages")
        )

    async def _upsert(self, batch: list[Message]) -> None:
        """Checked before any sequence value is drawn, like the other writes."""

        async def body(conn: Connection) -> dict[str, int]:
            row = await conn.fetchrow(
                self._sql.check_upsert,
                sorted({m.session_id for m in batch}),
                [m.id for m in batch],
                [m.session_id for m in batch],
            )
            if row is not None and row[0] is not None:
                raise StoreError(f"upsert_messages: unknown session {row[0]!r}; nothing written")
            if row is not None and row[1] is not None:
                raise StoreError(
                    f"upsert_messages: message {row[1]!r} belongs to another session; "
                    "nothing written"
                )
            written = await conn.fetch(self._sql.upsert_messages, *message_columns(batch))
            if len(written) != len(batch):  # pragma: no cover - sessions never change under us
                raise StoreError("upsert_messages: a message changed session meanwhile")
            return {str(r[0]): int(r[1]) for r in written}

        await self._write_batch(batch, body)

    async def get_message(self, message_id: str) -> Message | None:
        """Return one message by id, or ``None``."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.get_message, message_id)
        return None if row is None else self._load_message(row[0], row[1], row[2], row[3])

    async def _fetch_messages(self, tail: str, params: Sequence[object]) -> list[Message]:
        sql = render(
            f"SELECT token_estimate, payload, insert_seq, part_units FROM {{s}}.messages {tail}",
            self._schema,
        )
        async with self._connection() as conn:
            rows = await conn.fetch(sql, *params)
        return [self._load_message(r[0], r[1], r[2], r[3]) for r in rows]

    async def count_messages(self, session_id: str, *, agent: str | None = None) -> int:
        """Count a session's messages (of one agent, or of all when ``agent`` is None)."""
        async with self._connection() as conn:
            if agent is None:
                value = await conn.fetchval(self._sql.count_all, session_id)
            else:
                value = await conn.fetchval(self._sql.count_agent, session_id, agent)
        return int(value)

    async def latest_finished_assistant(
        self, session_id: str, *, agent: str | None = MAIN_AGENT
    ) -> Message | None:
        """The newest (by id) assistant message whose ``finish`` is set."""
        async with self._connection() as conn:
            if agent is None:
                row = await conn.fetchrow(self._sql.latest_finished, session_id)
            else:
                row = await conn.fetchrow(self._sql.latest_finished_by_agent, session_id, agent)
        return None if row is None else self._load_message(row[0], row[1], row[2], row[3])

    async def latest_boundary(self, session_id: str) -> Message | None:
        """The newest (by id) main-agent user message with a checkpoint or compaction part."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.latest_boundary, session_id, MAIN_AGENT)
        return None if row is None else self._load_message(row[0], row[1], row[2], row[3])

    async def changes_since(self, session_id: str, seq: int) -> tuple[list[Message], int]:
        """Messages of the session written after ``seq``, in write order, and the current seq.

        Reads under the session's lock taken shared (see the module docstring), so
        a write of this session still in flight is either in the answer or gets a
        number above the one returned.
        """
        key = lock_key(self._schema, session_id)
        async with self._connection() as conn:
            # One round trip: the schema's changes_since() takes the lock, then
            # reads (see mimo_ctx.store._pg_schema).
            rows = await conn.fetch(
                self._sql.changes_call, session_id, seq, SESSION_LOCK_CLASS, key
            )
        current = int(rows[0][2])
        changed = [self._load_message(r[0], r[1], r[3], r[4]) for r in rows if r[1] is not None]
        return changed, current

    async def _commit_rebuild(self, commit: RebuildCommit) -> bool:
        """Write a checked :meth:`commit_rebuild`, once per usage key.

        The key is claimed first, against the ``rebuilds`` primary key, by the
        same transaction that writes everything else: across processes and
        machines exactly one commit per key succeeds (SPEC R1.4, R4). The
        newer-boundary check runs in that transaction too, under the session's
        write lock, so no boundary can be inserted between it and the commit.
        """
        session_id, boundary = commit.session_id, commit.boundary
        for m in commit.updated:
            if m.session_id != session_id:
                raise StoreError(
                    f"commit_rebuild: message {m.id!r} belongs to session {m.session_id!r}, "
                    f"not {session_id!r}; nothing written"
                )

        async def body(conn: Connection) -> dict[str, int]:
            key = commit.usage_key
            row = await conn.fetchrow(self._sql.claim_rebuild, session_id, key, boundary.id)
            if row is None or not row[0]:
                raise StoreError(f"commit_rebuild: unknown session {session_id!r}")
            if not row[1]:
                raise AlreadyCommitted
            if await conn.fetchval(self._sql.newer_boundary, session_id, key, boundary.agent):
                raise AlreadyCommitted  # that usage was recovered (R1.4); the claim rolls back
            written = await self._insert_messages(conn, [boundary], "commit_rebuild")
            written.update(await self._update_messages(conn, commit.updated, "commit_rebuild"))
            if commit.state is not None:
                await self._change_state(conn, session_id, commit.state)
            return written

        try:
            written = await self._write([session_id], body)
        except AlreadyCommitted:
            return False
        stamp([boundary, *commit.updated], written)
        return True

    async def update_session_state(self, session_id: str, change: StateChange) -> SessionState:
        """Apply ``change`` to the stored state under the session's lock; return the new state.

        See :meth:`mimo_ctx.store.base.Store.update_session_state`.
        """

        async def body(conn: Connection) -> SessionState:
            return await self._change_state(conn, session_id, change)

        return await self._write([session_id], body)

    # -- tasks and actors ----------------------------------------------------
    # -- host index -------------------------------------------------------------
    async def host_index(self, session_id: str, *, agent: str, since: int = 0) -> HostIndex:
        """The host nodes written after ``since`` and the head (see the Store contract).

        Read under the session's lock taken shared, like the change feed, so a
        node still being written is either in the answer or numbered above ``seq``.
        """
        key = lock_key(self._schema, session_id)
        async with self._connection() as conn:
            await conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            try:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock_shared($1, $2)", SESSION_LOCK_CLASS, key
                )
                rows = await conn.fetch(self._sql.host_nodes, session_id, agent, since)
                head = await conn.fetchval(self._sql.host_head, session_id, agent)
                current = await conn.fetchval(self._sql.current_seq)
            finally:
                with anyio.CancelScope(shield=True):
                    await quiet_rollback(conn)
        nodes = [host_node(r) for r in rows]
        return HostIndex(nodes=nodes, head=None if head is None else str(head), seq=int(current))

    async def _commit_host_history(self, commit: HostCommit) -> bool:
        """Write a checked :meth:`commit_host_history` in one transaction.

        The transaction holds the session's write lock, the head is compared under
        it, and the ``host_nodes`` primary key refuses a node another worker stored
        first.
        """
        session_id, agent, nodes, move = commit.session_id, commit.agent, commit.nodes, commit.move

        async def body(conn: Connection) -> None:
            if not await conn.fetchval(self._sql.session_exists, session_id):
                raise StoreError(f"commit_host_history: unknown session {session_id!r}")
            if move is not None:
                head = await conn.fetchval(self._sql.host_head, session_id, agent)
                if (None if head is None else str(head)) != move.expected:
                    raise AlreadyCommitted
            if nodes:
                inserted = await conn.fetch(
                    self._sql.insert_host_nodes,
                    session_id,
                    agent,
                    [n.chain for n in nodes],
                    [n.parent for n in nodes],
                    [n.fingerprint for n in nodes],
                    [n.depth for n in nodes],
                    [json.dumps(n.message_ids) for n in nodes],
                )
                if len(inserted) != len(nodes):
                    raise AlreadyCommitted
            if commit.messages:
                await self._insert_messages(conn, commit.messages, "commit_host_history")
            await self._update_messages(conn, commit.updated, "commit_host_history")
            if move is not None:
                await conn.execute(self._sql.move_head, session_id, agent, move.head)

        try:
            await self._write([session_id], body)
        except AlreadyCommitted:
            return False
        return True

    async def upsert_task(self, task: Task) -> None:
        """Insert or replace a task (keyed by session id and task id)."""
        payload = task.model_dump_json()
        async with self._connection() as conn:
            await conn.execute(self._sql.upsert_task, task.session_id, task.id, payload)

    async def get_task(self, session_id: str, task_id: str) -> Task | None:
        """Return one task of a session, or ``None``."""
        async with self._connection() as conn:
            payload = await conn.fetchval(self._sql.get_task, session_id, task_id)
        return None if payload is None else self._parse(Task, payload)

    async def list_tasks(self, session_id: str) -> list[Task]:
        """Return the session's tasks, terminal ones included, in natural id order."""
        async with self._connection() as conn:
            rows = await conn.fetch(self._sql.list_tasks, session_id)
        return in_task_order(self._parse(Task, r[0]) for r in rows)

    async def upsert_actor(self, actor: Actor) -> None:
        """Insert or replace an actor (keyed by its id).

        Raises:
            StoreError: The id belongs to an actor of another session (an actor
                never moves between sessions, SPEC R5.4).
        """
        payload = actor.model_dump_json()
        async with self._connection() as conn:
            written = await conn.fetchval(
                self._sql.upsert_actor,
                actor.id,
                actor.session_id,
                actor.status,
                actor.background,
                actor.time_created,
                payload,
            )
        if written is None:
            raise StoreError(
                f"actor {actor.id!r} belongs to another session; "
                f"it cannot be written for session {actor.session_id!r}"
            )

    async def get_actor(self, session_id: str, actor_id: str) -> Actor | None:
        """Return one actor, only if it belongs to ``session_id`` (SPEC R5.4)."""
        async with self._connection() as conn:
            payload = await conn.fetchval(self._sql.get_actor, actor_id, session_id)
        return None if payload is None else self._parse(Actor, payload)

    async def list_actors(self, session_id: str, *, active_only: bool = False) -> list[Actor]:
        """Return this session's actors, oldest first (never another session's, R5.4).

        ``active_only`` keeps background actors with status pending or running.
        """
        sql = self._sql.list_active_actors if active_only else self._sql.list_actors
        async with self._connection() as conn:
            rows = await conn.fetch(sql, session_id)
        return [self._parse(Actor, r[0]) for r in rows]

    async def aclose(self) -> None:
        """Close the pool; later calls raise ``StoreError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        await close_or_terminate(pool, 30)
