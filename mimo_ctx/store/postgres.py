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
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
from pydantic import BaseModel, ValidationError

try:
    # Checked here, before the private modules: every import of this module
    # names the extra to install when the driver is missing.
    import asyncpg  # noqa: F401  # pyright: ignore[reportUnusedImport]
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'mimo_ctx.store.postgres needs asyncpg: pip install "mimo-ctx[postgres]"'
    ) from _exc

from mimo_ctx._aio import shielded
from mimo_ctx.checkpoint.lease import LeaseHolder
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message, set_insert_seq
from mimo_ctx.session import Actor, Session, SessionState, StateChange, Task, task_order_key
from mimo_ctx.store._pg_driver import (
    DB_ERRORS,
    SESSION_LOCK_CLASS,
    Connection,
    Pool,
    affected,
    create_pool,
    lock_key,
    no_reset,
    quiet_rollback,
    redact,
)
from mimo_ctx.store._pg_lease import PostgresWriterLease
from mimo_ctx.store._pg_schema import (
    SCHEMA_VERSION,
    Statements,
    quote_schema,
    render,
    stored_version,
    upgrade,
)
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

__all__ = [
    "SCHEMA_VERSION",
    "LeaseHolder",
    "PostgresStore",
    "PostgresWriterLease",
    "upgrade",
]

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)


class _AlreadyCommitted(Exception):
    """Internal: the usage key of a rebuild is taken; roll back and answer False."""


# Columns of a message row as written, one array per column for unnest().
_MessageColumns = tuple[
    list[str],
    list[str],
    list[str],
    list[str],
    list[int],
    list[bool],
    list[bool],
    list[int],
    list[str],
    list[bool],
]


def _message_columns(messages: Sequence[Message]) -> _MessageColumns:
    # Off-branch messages are never the newest boundary or finished answer.
    return (
        [m.id for m in messages],
        [m.session_id for m in messages],
        [m.agent for m in messages],
        [m.role for m in messages],
        [m.time_created for m in messages],
        [m.is_boundary and not m.off_branch for m in messages],
        [m.role == "assistant" and m.finish is not None and not m.off_branch for m in messages],
        [estimate_message_tokens(m) for m in messages],
        [m.model_dump_json() for m in messages],
        [m.off_branch for m in messages],
    )


def _reject_repeated_ids(messages: Sequence[Message], what: str) -> None:
    seen: set[str] = set()
    for m in messages:
        if m.id in seen:
            raise StoreError(f"{what}: message id {m.id!r} appears twice; nothing written")
        seen.add(m.id)


def _stamp(messages: Sequence[Message], insert_seqs: dict[str, int]) -> None:
    """Give the messages just written their place in the write order."""
    for message in messages:
        insert_seq = insert_seqs.get(message.id)
        if insert_seq is not None:
            set_insert_seq(message, insert_seq)


def _last_versions(messages: Sequence[Message]) -> list[Message]:
    """Keep the last version of each id, at its last position (a write replaces)."""
    last = {m.id: i for i, m in enumerate(messages)}
    return [m for i, m in enumerate(messages) if last[m.id] == i]


# -- the store ------------------------------------------------------------------
class PostgresStore:
    """A :class:`~mimo_ctx.store.base.Store` in PostgreSQL, shared by many workers.

    The pool is opened on first use; ``await PostgresStore.open(dsn)`` or
    ``async with PostgresStore(dsn) as store:`` open it at once, so a bad DSN or
    a missing schema is reported there.

    Example:
        >>> await upgrade("postgresql://app@db/agents")  # doctest: +SKIP
        >>> async with PostgresStore("postgresql://app@db/agents") as store:  # doctest: +SKIP
        ...     await store.create_session(Session(time_created=0))
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "mimo_ctx",
        create_schema: bool = False,
        min_size: int = 1,
        max_size: int = 10,
        command_timeout: float = 60.0,
        statement_cache_size: int = 100,
    ) -> None:
        """Prepare a store on ``dsn`` (nothing is opened yet).

        Args:
            dsn: A libpq connection string or URI.
            schema: The PostgreSQL schema (namespace) of the store's tables.
            create_schema: Create or upgrade the schema on first use (as
                :func:`upgrade` does) instead of refusing to start without it.
            min_size: Connections the pool keeps open.
            max_size: Most connections the pool opens.
            command_timeout: Seconds one statement (a lock wait included) may take
                before it is cancelled and the call fails with ``StoreError``.
            statement_cache_size: Prepared statements cached per connection; 0
                behind a pooler that cannot keep them (see the module docstring).
        """
        try:
            quote_schema(schema)
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        if not 0 <= min_size <= max_size or max_size < 1:
            raise StoreError(
                f"pool sizes must satisfy 0 <= min_size <= max_size and max_size >= 1, "
                f"got min_size={min_size}, max_size={max_size}"
            )
        if not command_timeout > 0:
            raise StoreError(f"command_timeout must be > 0 seconds, got {command_timeout}")
        if statement_cache_size < 0:
            raise StoreError(f"statement_cache_size must be >= 0, got {statement_cache_size}")
        self._dsn = dsn
        self._schema = schema
        self._create_schema = create_schema
        self._pool_options: dict[str, Any] = {
            "min_size": min_size,
            "max_size": max_size,
            "command_timeout": command_timeout,
            "statement_cache_size": statement_cache_size,
            "reset": no_reset,
            "server_settings": {"application_name": "mimo_ctx"},
        }
        self._where = f"PostgreSQL store {redact(dsn)} (schema {schema})"
        self._sql = Statements.for_schema(schema)
        self._open_lock = anyio.Lock()
        self._pool: Pool | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        schema: str = "mimo_ctx",
        create_schema: bool = False,
        min_size: int = 1,
        max_size: int = 10,
        command_timeout: float = 60.0,
        statement_cache_size: int = 100,
    ) -> PostgresStore:
        """Create a store and open its pool now.

        Raises:
            StoreError: The server cannot be reached, or the schema is missing (and
                ``create_schema`` is false), older, newer, or not a mimo_ctx store.
        """
        store = cls(
            dsn,
            schema=schema,
            create_schema=create_schema,
            min_size=min_size,
            max_size=max_size,
            command_timeout=command_timeout,
            statement_cache_size=statement_cache_size,
        )
        await store._ready()
        return store

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the store's tables."""
        return self._schema

    @property
    def dsn(self) -> str:
        """The connection string as given (it may hold a password)."""
        return self._dsn

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def upgrade(self) -> int:
        """Create or upgrade this store's schema; see :func:`upgrade`."""
        self._check_open()
        return await upgrade(self._dsn, schema=self._schema)

    # -- plumbing ---------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the {self._where} is closed")

    async def _ready(self) -> Pool:
        self._check_open()
        pool = self._pool
        if pool is not None:
            return pool
        async with self._open_lock:
            self._check_open()
            if self._pool is None:
                self._pool = await self._open_pool()
            return self._pool

    async def _open_pool(self) -> Pool:
        if self._create_schema:
            await upgrade(self._dsn, schema=self._schema)
        try:
            pool = await create_pool(self._dsn, **self._pool_options)
        except (*DB_ERRORS, ValueError) as exc:
            raise StoreError(f"cannot connect to {self._where}: {exc}") from exc
        try:
            async with pool.acquire() as conn:
                version = await stored_version(conn, self._schema)
        except BaseException as exc:
            pool.terminate()
            if isinstance(exc, DB_ERRORS):
                raise StoreError(f"{self._where}: {exc}") from exc
            raise
        if version != SCHEMA_VERSION:
            pool.terminate()
            if version == 0:
                raise StoreError(
                    f"{self._where} has no mimo_ctx schema: run `mimo-ctx db upgrade --dsn ...`"
                    " (mimo_ctx.store.postgres.upgrade) or pass create_schema=True"
                )
            if version < SCHEMA_VERSION:
                raise StoreError(
                    f"{self._where} has store schema version {version}, older than "
                    f"{SCHEMA_VERSION}: run `mimo-ctx db upgrade --dsn ...`"
                )
            raise StoreError(
                f"{self._where} has store schema version {version}; this mimo_ctx supports "
                f"up to {SCHEMA_VERSION}. Upgrade mimo_ctx to use it"
            )
        return pool

    @asynccontextmanager
    async def _connection(self) -> AsyncGenerator[Connection, None]:
        """A pooled connection; driver errors become ``StoreError``."""
        pool = await self._ready()
        try:
            async with pool.acquire() as conn:
                yield conn
        except DB_ERRORS as exc:
            raise StoreError(f"{self._where}: {exc}") from exc

    async def _write(
        self, session_ids: Sequence[str], body: Callable[[Connection], Awaitable[_T]]
    ) -> _T:
        """Run ``body`` in one transaction holding the sessions' write locks.

        The locks are taken in key order, so two multi-session batches cannot
        deadlock. The transaction is shielded from cancellation, like the SQLite
        store's statements: a cancelled caller waits for its commit or rollback
        (bounded by ``command_timeout``), so whether a write happened is never in
        doubt afterwards.
        """
        keys = sorted({lock_key(self._schema, s) for s in session_ids})
        # One round trip: BEGIN and the lock calls travel as one simple query.
        # The keys are integers we computed, so formatting them in is safe.
        begin = "BEGIN ISOLATION LEVEL READ COMMITTED;" + "".join(
            f"SELECT pg_advisory_xact_lock({SESSION_LOCK_CLASS}, {k});" for k in keys
        )

        async def transaction(conn: Connection) -> _T:
            await conn.execute(begin)
            try:
                result = await body(conn)
            except BaseException:
                await quiet_rollback(conn)
                raise
            await conn.execute("COMMIT")
            return result

        async with self._connection() as conn:
            return await shielded(transaction(conn))

    def _load_message(self, estimate: Any, payload: Any, insert_seq: Any) -> Message:
        message = self._parse(Message, payload)
        # The row's estimate was computed from this very payload at write time.
        message._token_estimate = int(estimate)  # pyright: ignore[reportPrivateUsage]
        set_insert_seq(message, int(insert_seq))
        return message

    def _load_session(self, watermark: Any, payload: Any, state: Any) -> Session:
        session = self._parse(Session, payload)
        # The columns are the truth: the payload's copies may predate set_watermark
        # and the state writes.
        session.watermark = None if watermark is None else str(watermark)
        if state is not None:
            session.state = self._parse(SessionState, state)
        return session

    async def _change_state(
        self, conn: Connection, session_id: str, change: StateChange
    ) -> SessionState:
        """Read, change and write the session's state. Inside a write transaction."""
        row = await conn.fetchrow(self._sql.get_state, session_id)
        if row is None:
            raise StoreError(f"unknown session {session_id!r}")
        if row[0] is not None:
            stored = self._parse(SessionState, row[0])
        else:
            stored = self._parse(Session, row[1]).state
        new = apply_state_change(session_id, stored, change)
        await conn.execute(self._sql.set_state, session_id, new.model_dump_json())
        return new

    def _parse(self, model: type[_M], payload: Any) -> _M:
        try:
            return model.model_validate_json(str(payload))
        except ValidationError as exc:
            raise StoreError(f"{self._where}: a stored {model.__name__} is invalid: {exc}") from exc

    async def _insert_messages(
        self, conn: Connection, messages: Sequence[Message], what: str
    ) -> dict[str, int]:
        """Validate and insert new messages; return their insert_seqs. Inside a write tx.

        Everything is checked before any sequence value is drawn: sequences are
        not rolled back, and a rejected write must not move the change feed.
        """
        row = await conn.fetchrow(
            self._sql.check_new,
            sorted({m.session_id for m in messages}),
            [m.id for m in messages],
        )
        if row is not None and row[0] is not None:
            raise StoreError(f"{what}: unknown session {row[0]!r}; nothing written")
        if row is not None and row[1] is not None:
            raise StoreError(f"{what}: message id {row[1]!r} already exists; nothing written")
        inserted = await conn.fetch(self._sql.insert_messages, *_message_columns(messages))
        if len(inserted) != len(messages):
            # A concurrent transaction (of another session) committed one of these
            # ids since the check; the caller's rollback drops the rest.
            written = {str(r[0]) for r in inserted}
            taken = next(m.id for m in messages if m.id not in written)
            raise StoreError(f"{what}: message id {taken!r} already exists; nothing written")
        return {str(r[0]): int(r[1]) for r in inserted}

    async def _update_messages(
        self, conn: Connection, messages: Sequence[Message], what: str
    ) -> dict[str, int]:
        """Replace existing messages; return their insert_seqs. Inside a write transaction.

        Checked first, for the same reason as :meth:`_insert_messages`.
        """
        batch = _last_versions(messages)
        if not batch:
            return {}
        stored = {
            str(r[0]): str(r[1])
            for r in await conn.fetch(self._sql.message_sessions, [m.id for m in batch])
        }
        for m in batch:
            if m.id not in stored:
                raise StoreError(f"{what}: message {m.id!r} does not exist; nothing written")
            if stored[m.id] != m.session_id:
                raise StoreError(
                    f"{what}: message {m.id!r} belongs to session {stored[m.id]!r}, "
                    f"not {m.session_id!r}; nothing written"
                )
        updated = await conn.fetch(self._sql.update_messages, *_message_columns(batch))
        if len(updated) != len(batch):  # pragma: no cover - sessions never change under us
            raise StoreError(f"{what}: a message changed session meanwhile; nothing written")
        return {str(r[0]): int(r[1]) for r in updated}

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
    async def append_messages(self, messages: Sequence[Message]) -> None:
        """Append new messages in one transaction.

        Raises:
            StoreError: An id already exists (or repeats in the batch) or a session
                is unknown; nothing is written.
        """
        batch = list(messages)
        _reject_repeated_ids(batch, "append_messages")
        if not batch:
            self._check_open()
            return

        async def body(conn: Connection) -> dict[str, int]:
            return await self._insert_messages(conn, batch, "append_messages")

        _stamp(batch, await self._write([m.session_id for m in batch], body))

    async def update_messages(self, messages: Sequence[Message]) -> None:
        """Replace stored messages (same ids) in one transaction.

        Raises:
            StoreError: A message does not exist or would move to another session;
                nothing is written.
        """
        batch = list(messages)
        if not batch:
            self._check_open()
            return

        async def body(conn: Connection) -> dict[str, int]:
            return await self._update_messages(conn, batch, "update_messages")

        _stamp(batch, await self._write([m.session_id for m in batch], body))

    async def upsert_messages(self, messages: Sequence[Message]) -> None:
        """Store messages in one transaction: new ids appended, known ids replaced.

        See :meth:`mimo_ctx.store.base.Store.upsert_messages`. Checked before any
        sequence value is drawn, like the other writes; a replaced message keeps its
        place in the write order (``insert_seq``), as an update does.

        Raises:
            StoreError: A session is unknown, an id repeats in the batch, or a known
                id belongs to another session; nothing is written.
        """
        batch = list(messages)
        _reject_repeated_ids(batch, "upsert_messages")
        if not batch:
            self._check_open()
            return

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
            written = await conn.fetch(self._sql.upsert_messages, *_message_columns(batch))
            if len(written) != len(batch):  # pragma: no cover - sessions never change under us
                raise StoreError("upsert_messages: a message changed session meanwhile")
            return {str(r[0]): int(r[1]) for r in written}

        _stamp(batch, await self._write([m.session_id for m in batch], body))

    async def get_message(self, message_id: str) -> Message | None:
        """Return one message by id, or ``None``."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.get_message, message_id)
        return None if row is None else self._load_message(row[0], row[1], row[2])

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
        self._check_open()
        if last == 0:
            return []
        where = ["session_id = $1", "NOT off_branch"]
        params: list[object] = [session_id]
        if agent is not None:
            params.append(agent)
            where.append(f"agent = ${len(params)}")
        if exclude_agent is not None:
            params.append(exclude_agent)
            where.append(f"agent <> ${len(params)}")
        if since is not None:
            # A row comparison: PostgreSQL scans the (…, time_created, id) index
            # from that key.
            params.extend(since)
            where.append(f"(time_created, id) >= (${len(params) - 1}, ${len(params)})")
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
        ``messages_user`` partial index (schema version 2).
        """
        limit = check_user_message_window(first, last)
        self._check_open()
        if limit == 0:
            return []
        where = (
            "session_id = $1 AND agent = $2 AND role = 'user' AND NOT is_boundary"
            " AND NOT off_branch"
        )
        params: list[object] = [session_id, agent]
        if before is not None:
            params.extend(before)
            where += f" AND (time_created, id) < (${len(params) - 1}, ${len(params)})"
        return await self._select_messages(where, params, last=limit, newest=last is not None)

    async def _select_messages(
        self, where: str, params: list[object], *, last: int | None, newest: bool
    ) -> list[Message]:
        """Messages matching ``where`` by ``(time_created, id)``, at most ``last`` of them.

        ``newest``: the newest ``last`` (read backwards, returned oldest first);
        otherwise the oldest.
        """
        order = "DESC" if newest and last is not None else "ASC"
        sql = render(
            f"SELECT token_estimate, payload, insert_seq FROM {{s}}.messages WHERE {where}"
            f" ORDER BY time_created {order}, id {order}",
            self._schema,
        )
        if last is not None:
            params = [*params, last]
            sql += f" LIMIT ${len(params)}"
        async with self._connection() as conn:
            rows = await conn.fetch(sql, *params)
        messages = [self._load_message(r[0], r[1], r[2]) for r in rows]
        if order == "DESC":
            messages.reverse()
        return messages

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
        return None if row is None else self._load_message(row[0], row[1], row[2])

    async def latest_boundary(self, session_id: str) -> Message | None:
        """The newest (by id) main-agent user message with a checkpoint or compaction part."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.latest_boundary, session_id, MAIN_AGENT)
        return None if row is None else self._load_message(row[0], row[1], row[2])

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
        changed = [self._load_message(r[0], r[1], r[3]) for r in rows if r[1] is not None]
        return changed, current

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

        See :meth:`mimo_ctx.store.base.Store.commit_rebuild`. The key is claimed
        first, against the ``rebuilds`` primary key, by the same transaction that
        writes everything else: across processes and machines exactly one commit
        per key succeeds (SPEC R1.4, R4). The newer-boundary check runs in that
        transaction too, under the session's write lock, so no boundary can be
        inserted between it and the commit.

        Raises:
            StoreError: The session is unknown, the boundary id exists, or an
                updated message is missing or belongs to another session; nothing
                is written and the key stays unused.
        """
        batch = list(updated)
        check_rebuild_arguments(session_id, boundary, batch)
        for m in batch:
            if m.session_id != session_id:
                raise StoreError(
                    f"commit_rebuild: message {m.id!r} belongs to session {m.session_id!r}, "
                    f"not {session_id!r}; nothing written"
                )

        async def body(conn: Connection) -> dict[str, int]:
            row = await conn.fetchrow(self._sql.claim_rebuild, session_id, usage_key, boundary.id)
            if row is None or not row[0]:
                raise StoreError(f"commit_rebuild: unknown session {session_id!r}")
            if not row[1]:
                raise _AlreadyCommitted
            if await conn.fetchval(self._sql.newer_boundary, session_id, usage_key, boundary.agent):
                raise _AlreadyCommitted  # that usage was recovered (R1.4); the claim rolls back
            written = await self._insert_messages(conn, [boundary], "commit_rebuild")
            written.update(await self._update_messages(conn, batch, "commit_rebuild"))
            if state is not None:
                await self._change_state(conn, session_id, state)
            return written

        try:
            written = await self._write([session_id], body)
        except _AlreadyCommitted:
            return False
        _stamp([boundary, *batch], written)
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
        nodes = [
            HostNode(
                chain=str(r[0]),
                parent=str(r[1]),
                fingerprint=str(r[2]),
                depth=int(r[3]),
                message_ids=[str(i) for i in json.loads(str(r[4]))],
                seq=int(r[5]),
            )
            for r in rows
        ]
        return HostIndex(nodes=nodes, head=None if head is None else str(head), seq=int(current))

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

        See :meth:`mimo_ctx.store.base.Store.commit_host_history`: the transaction
        holds the session's write lock, the head is compared under it, and the
        ``host_nodes`` primary key refuses a node another worker stored first.
        """
        new = list(messages)
        changed = list(updated)
        check_host_commit(session_id, nodes, [*new, *changed])
        _reject_repeated_ids(new, "commit_host_history")

        async def body(conn: Connection) -> None:
            if not await conn.fetchval(self._sql.session_exists, session_id):
                raise StoreError(f"commit_host_history: unknown session {session_id!r}")
            if move is not None:
                head = await conn.fetchval(self._sql.host_head, session_id, agent)
                if (None if head is None else str(head)) != move.expected:
                    raise _AlreadyCommitted
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
                    raise _AlreadyCommitted
            if new:
                await self._insert_messages(conn, new, "commit_host_history")
            await self._update_messages(conn, changed, "commit_host_history")
            if move is not None:
                await conn.execute(self._sql.move_head, session_id, agent, move.head)

        try:
            await self._write([session_id], body)
        except _AlreadyCommitted:
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
        tasks = [self._parse(Task, r[0]) for r in rows]
        tasks.sort(key=lambda t: (task_order_key(t.id), t.id))
        return tasks

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
        # Shielded: a cancelled caller must still release the connections.
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(30):
                    await pool.close()
            except (*DB_ERRORS, TimeoutError):
                pool.terminate()
