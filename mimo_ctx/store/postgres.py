"""A PostgreSQL store for agent services that run many workers (SPEC R1.4, R4, A3).

Any worker may serve the next turn of a session, so every guarantee the
embedded stores give with in-process locks is given here by the database:

* **Once per usage across workers** (SPEC R1.4, R4). :meth:`PostgresStore.commit_rebuild`
  inserts the rebuild's key into ``rebuilds``, whose primary key is
  ``(session_id, usage_key)``, in the same transaction as the boundary message,
  the micro-compaction updates and the optional session replace. The key goes in
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

import hashlib
import math
import re
import urllib.parse
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, Self, TypeVar, cast

import anyio
from pydantic import BaseModel, ValidationError

try:
    import asyncpg
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'mimo_ctx.store.postgres needs asyncpg: pip install "mimo-ctx[postgres]"'
    ) from _exc

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message
from mimo_ctx.store._pg_schema import (
    CHANGES_QUERY,
    MIGRATIONS,
    SCHEMA_VERSION,
    quote_schema,
    render,
)
from mimo_ctx.store.base import (
    ACTIVE_ACTOR_STATUSES,
    Actor,
    Session,
    Task,
    check_rebuild_arguments,
)
from mimo_ctx.store.in_memory import task_order_key
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

# Class ids of our two-key advisory locks ("mimo", "mimp"): the (int4, int4) key
# space is separate from the single-bigint one applications tend to use.
_SESSION_LOCK_CLASS: Final = 0x6D696D6F
_MIGRATION_LOCK_CLASS: Final = 0x6D696D70

_DB_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


# -- typed views of the asyncpg objects we use ---------------------------------
class _Record(Protocol):
    def __getitem__(self, index: int, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class _Connection(Protocol):
    async def execute(self, query: str, *args: object) -> str: ...

    async def fetch(self, query: str, *args: object) -> list[_Record]: ...

    async def fetchrow(self, query: str, *args: object) -> _Record | None: ...

    async def fetchval(self, query: str, *args: object, column: int = 0) -> Any: ...

    async def add_listener(
        self, channel: str, callback: Callable[[Any, int, str, str], None]
    ) -> None: ...

    def add_termination_listener(self, callback: Callable[[Any], None]) -> None: ...

    async def close(self) -> None: ...

    def is_closed(self) -> bool: ...

    def terminate(self) -> None: ...


class _Pool(Protocol):
    def acquire(
        self, *, timeout: float | None = None
    ) -> AbstractAsyncContextManager[_Connection]: ...

    async def close(self) -> None: ...

    def terminate(self) -> None: ...


async def _connect(dsn: str, **kwargs: Any) -> _Connection:
    # asyncpg has no annotations: its two entry points are typed here, once.
    connect: Callable[..., Awaitable[object]] = asyncpg.connect  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast("_Connection", await connect(dsn, **kwargs))


async def _create_pool(dsn: str, **kwargs: Any) -> _Pool:
    create: Callable[..., Awaitable[object]] = asyncpg.create_pool  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast("_Pool", await create(dsn, **kwargs))


async def _no_reset(_connection: object) -> None:
    """Pool reset hook: our calls leave no session state behind.

    asyncpg's default reset sends a query on every release (unlisten, unlock,
    reset settings): a wasted round trip for us. An open transaction is still
    rolled back by asyncpg itself before this hook runs.
    """


def _redact(dsn: str) -> str:
    """The DSN without its password, for error messages."""
    if "://" in dsn:
        parts = urllib.parse.urlsplit(dsn)
        if parts.password is not None:
            host = parts.netloc.rsplit("@", 1)[-1]
            user = parts.username or ""
            parts = parts._replace(netloc=f"{user}:***@{host}")
        query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parts.query)
        return urllib.parse.urlunsplit(parts._replace(query=query))
    return re.sub(r"(?i)(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn)


def _lock_key(schema: str, session_id: str) -> int:
    """The int4 key of a session's advisory lock (a collision only costs waiting)."""
    digest = hashlib.blake2b(f"{schema}\x00{session_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def _affected(status: str) -> int:
    """Rows affected, from a command status such as ``UPDATE 1``."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


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
]


def _message_columns(messages: Sequence[Message]) -> _MessageColumns:
    return (
        [m.id for m in messages],
        [m.session_id for m in messages],
        [m.agent for m in messages],
        [m.role for m in messages],
        [m.time_created for m in messages],
        [m.is_boundary for m in messages],
        [m.role == "assistant" and m.finish is not None for m in messages],
        [estimate_message_tokens(m) for m in messages],
        [m.model_dump_json() for m in messages],
    )


def _reject_repeated_ids(messages: Sequence[Message], what: str) -> None:
    seen: set[str] = set()
    for m in messages:
        if m.id in seen:
            raise StoreError(f"{what}: message id {m.id!r} appears twice; nothing written")
        seen.add(m.id)


def _last_versions(messages: Sequence[Message]) -> list[Message]:
    """Keep the last version of each id, at its last position (a write replaces)."""
    last = {m.id: i for i, m in enumerate(messages)}
    return [m for i, m in enumerate(messages) if last[m.id] == i]


# Rows of messages, one column array each, numbered in batch order. The CTE is
# materialised (it calls a volatile function), so each row draws its sequence
# value exactly once, in batch order.
_UNNEST_MESSAGES: Final = """WITH u AS (
    SELECT v.*, nextval('{s}.message_seq') AS seq FROM (
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                             $6::boolean[], $7::boolean[], $8::integer[], $9::text[])
            WITH ORDINALITY AS w(id, session_id, agent, role, time_created, is_boundary,
                                 is_finished_assistant, token_estimate, payload, ord)
        ORDER BY ord
    ) AS v
)"""


@dataclass(frozen=True, slots=True)
class _Sql:
    """Every statement of the store, rendered for one schema."""

    latest_boundary: str
    latest_finished: str
    latest_finished_by_agent: str
    changes: str
    changes_call: str
    get_message: str
    insert_messages: str
    update_messages: str
    message_sessions: str
    check_new: str
    insert_session: str
    get_session: str
    update_session: str
    list_sessions: str
    get_watermark: str
    set_watermark: str
    claim_rebuild: str
    upsert_task: str
    get_task: str
    list_tasks: str
    upsert_actor: str
    get_actor: str
    list_actors: str
    list_active_actors: str
    count_all: str
    count_agent: str

    @classmethod
    def for_schema(cls, schema: str) -> _Sql:
        cols = "token_estimate, payload"
        active = ", ".join(f"'{s}'" for s in sorted(ACTIVE_ACTOR_STATUSES))
        statements = {
            "latest_boundary": f"SELECT {cols} FROM {{s}}.messages WHERE session_id = $1"
            " AND agent = $2 AND is_boundary ORDER BY id DESC LIMIT 1",
            "latest_finished": f"SELECT {cols} FROM {{s}}.messages WHERE session_id = $1"
            " AND is_finished_assistant ORDER BY id DESC LIMIT 1",
            "latest_finished_by_agent": f"SELECT {cols} FROM {{s}}.messages"
            " WHERE session_id = $1 AND agent = $2 AND is_finished_assistant"
            " ORDER BY id DESC LIMIT 1",
            "changes": CHANGES_QUERY,
            "changes_call": "SELECT out_estimate, out_payload, out_current"
            " FROM {s}.changes_since($1, $2, $3, $4)",
            "get_message": f"SELECT {cols} FROM {{s}}.messages WHERE id = $1",
            "insert_messages": _UNNEST_MESSAGES
            + " INSERT INTO {s}.messages (id, session_id, agent, role, time_created,"
            " is_boundary, is_finished_assistant, token_estimate, payload, seq)"
            " SELECT id, session_id, agent, role, time_created, is_boundary,"
            " is_finished_assistant, token_estimate, payload, seq FROM u ORDER BY ord"
            " ON CONFLICT (id) DO NOTHING RETURNING id",
            "update_messages": _UNNEST_MESSAGES
            + " UPDATE {s}.messages AS m SET agent = u.agent, role = u.role,"
            " time_created = u.time_created, is_boundary = u.is_boundary,"
            " is_finished_assistant = u.is_finished_assistant,"
            " token_estimate = u.token_estimate, payload = u.payload, seq = u.seq"
            " FROM u WHERE m.id = u.id AND m.session_id = u.session_id RETURNING m.id",
            "message_sessions": "SELECT id, session_id FROM {s}.messages"
            " WHERE id = ANY($1::text[])",
            # (first unknown session, first id of the batch already stored)
            "check_new": "SELECT (SELECT min(s) FROM unnest($1::text[]) AS s WHERE NOT EXISTS"
            " (SELECT 1 FROM {s}.sessions WHERE id = s)), (SELECT w.id FROM unnest($2::text[])"
            " WITH ORDINALITY AS w (id, ord) JOIN {s}.messages AS m ON m.id = w.id"
            " ORDER BY w.ord LIMIT 1)",
            "insert_session": "INSERT INTO {s}.sessions (id, time_created, watermark, payload)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING",
            "get_session": "SELECT watermark, payload FROM {s}.sessions WHERE id = $1",
            # The watermark column is left alone: only set_watermark moves it (R2.1).
            "update_session": "UPDATE {s}.sessions SET time_created = $2, payload = $3"
            " WHERE id = $1",
            "list_sessions": "SELECT watermark, payload FROM {s}.sessions"
            " ORDER BY time_created, id",
            "get_watermark": "SELECT watermark FROM {s}.sessions WHERE id = $1",
            "set_watermark": "UPDATE {s}.sessions SET watermark = $2 WHERE id = $1",
            # (session exists, key claimed by this transaction)
            "claim_rebuild": "WITH ins AS (INSERT INTO {s}.rebuilds (session_id, usage_key,"
            " boundary_id) SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM {s}.sessions"
            " WHERE id = $1) ON CONFLICT (session_id, usage_key) DO NOTHING RETURNING 1)"
            " SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = $1),"
            " EXISTS (SELECT 1 FROM ins)",
            "upsert_task": "INSERT INTO {s}.tasks (session_id, id, payload) VALUES ($1, $2, $3)"
            " ON CONFLICT (session_id, id) DO UPDATE SET payload = EXCLUDED.payload",
            "get_task": "SELECT payload FROM {s}.tasks WHERE session_id = $1 AND id = $2",
            "list_tasks": "SELECT payload FROM {s}.tasks WHERE session_id = $1",
            # An actor never moves between sessions (R5.4): the conditional update
            # makes that check and the write one atomic statement.
            "upsert_actor": "INSERT INTO {s}.actors AS a (id, session_id, status, background,"
            " time_created, payload) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO UPDATE"
            " SET status = EXCLUDED.status, background = EXCLUDED.background,"
            " time_created = EXCLUDED.time_created, payload = EXCLUDED.payload"
            " WHERE a.session_id = EXCLUDED.session_id RETURNING id",
            "get_actor": "SELECT payload FROM {s}.actors WHERE id = $1 AND session_id = $2",
            "list_actors": "SELECT payload FROM {s}.actors WHERE session_id = $1"
            " ORDER BY time_created, id",
            "list_active_actors": "SELECT payload FROM {s}.actors WHERE session_id = $1"
            f" AND background AND status IN ({active}) ORDER BY time_created, id",
            "count_all": "SELECT count(*) FROM {s}.messages WHERE session_id = $1",
            "count_agent": "SELECT count(*) FROM {s}.messages WHERE session_id = $1 AND agent = $2",
        }
        return cls(**{name: render(sql, schema) for name, sql in statements.items()})


# -- schema versions -------------------------------------------------------------
async def _stored_version(conn: _Connection, schema: str) -> int:
    """The schema version in the database; 0 when there is no version table."""
    table = f"{quote_schema(schema)}.schema_version"
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
    if not exists:
        return 0
    version = await conn.fetchval(f"SELECT version FROM {table}")
    return 0 if version is None else int(version)


async def _upgrade_on(conn: _Connection, schema: str, where: str) -> int:
    """Run the pending migrations in one transaction; roll back on any error."""
    await conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
    try:
        await _migrate(conn, schema, where)
        await conn.execute("COMMIT")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _quiet_rollback(conn)
        raise
    return SCHEMA_VERSION


async def _migrate(conn: _Connection, schema: str, where: str) -> None:
    """The body of :func:`_upgrade_on`, inside its transaction."""
    quoted = quote_schema(schema)
    # Two workers upgrading at once: the second waits, then finds it done.
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, $2)", _MIGRATION_LOCK_CLASS, _lock_key(schema, "")
    )
    # Checked before CREATE: CREATE SCHEMA IF NOT EXISTS needs the CREATE
    # privilege on the database even when the schema is there.
    if not await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema
    ):
        await conn.execute(f"CREATE SCHEMA {quoted}")
    version = await _stored_version(conn, schema)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} has store schema version {version}; this mimo_ctx supports up to "
            f"{SCHEMA_VERSION}. Upgrade mimo_ctx to use it"
        )
    if version == 0:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", schema
        )
        if tables:
            names = [str(r[0]) for r in tables]
            raise StoreError(
                f"{where}: schema {schema!r} holds tables {names} but is not a mimo_ctx "
                "store; choose another schema. Nothing was changed"
            )
        await conn.execute(
            f"CREATE TABLE {quoted}.schema_version (one boolean PRIMARY KEY DEFAULT true"
            " CHECK (one), version integer NOT NULL,"
            " time_upgraded timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        await conn.execute(f"INSERT INTO {quoted}.schema_version (version) VALUES (0)")
    for number in range(version + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[number - 1]:
            await conn.execute(render(statement, schema))
        await conn.execute(
            f"UPDATE {quoted}.schema_version SET version = $1, time_upgraded = clock_timestamp()",
            number,
        )


async def _shielded(work: Awaitable[_T]) -> _T:
    """Await ``work`` shielded from cancellation (the caller is cancelled afterwards)."""
    done: list[_T] = []
    with anyio.CancelScope(shield=True):
        done.append(await work)
    return done[0]


async def _quiet_rollback(conn: _Connection) -> None:
    """Roll back; a connection too broken for that is discarded by the pool anyway."""
    if conn.is_closed():
        return
    try:
        await conn.execute("ROLLBACK")
    except _DB_ERRORS:
        conn.terminate()


async def upgrade(dsn: str, *, schema: str = "mimo_ctx") -> int:
    """Create or upgrade the store schema in a PostgreSQL database.

    Safe to run from several workers at once (they take turns) and again and
    again (an up-to-date schema is left alone). Each version's migration runs in
    one transaction with the version bump, so a failed upgrade changes nothing.
    This is what ``mimo-ctx db upgrade --dsn ...`` runs.

    Args:
        dsn: A libpq connection string or URI
            (``postgresql://user:password@host:5432/db``).
        schema: The PostgreSQL schema (namespace) holding the store's tables.

    Returns:
        The schema version now in the database (:data:`SCHEMA_VERSION`).

    Raises:
        StoreError: The database cannot be reached, the schema holds tables that
            are not a mimo_ctx store, or it has a newer version than this code.
    """
    where = f"PostgreSQL {_redact(dsn)} (schema {schema})"
    try:
        quote_schema(schema)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    try:
        conn = await _connect(dsn, timeout=30)
    except (*_DB_ERRORS, ValueError) as exc:
        raise StoreError(f"cannot connect to {where}: {exc}") from exc
    try:
        return await _upgrade_on(conn, schema, where)
    except _DB_ERRORS as exc:
        raise StoreError(f"upgrading {where} failed: {exc}") from exc
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()


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
            "reset": _no_reset,
            "server_settings": {"application_name": "mimo_ctx"},
        }
        self._where = f"PostgreSQL store {_redact(dsn)} (schema {schema})"
        self._sql = _Sql.for_schema(schema)
        self._open_lock = anyio.Lock()
        self._pool: _Pool | None = None
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

    async def _ready(self) -> _Pool:
        self._check_open()
        pool = self._pool
        if pool is not None:
            return pool
        async with self._open_lock:
            self._check_open()
            if self._pool is None:
                self._pool = await self._open_pool()
            return self._pool

    async def _open_pool(self) -> _Pool:
        if self._create_schema:
            await upgrade(self._dsn, schema=self._schema)
        try:
            pool = await _create_pool(self._dsn, **self._pool_options)
        except (*_DB_ERRORS, ValueError) as exc:
            raise StoreError(f"cannot connect to {self._where}: {exc}") from exc
        try:
            async with pool.acquire() as conn:
                version = await _stored_version(conn, self._schema)
        except BaseException as exc:
            pool.terminate()
            if isinstance(exc, _DB_ERRORS):
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
    async def _connection(self) -> AsyncGenerator[_Connection, None]:
        """A pooled connection; driver errors become ``StoreError``."""
        pool = await self._ready()
        try:
            async with pool.acquire() as conn:
                yield conn
        except _DB_ERRORS as exc:
            raise StoreError(f"{self._where}: {exc}") from exc

    async def _write(
        self, session_ids: Sequence[str], body: Callable[[_Connection], Awaitable[_T]]
    ) -> _T:
        """Run ``body`` in one transaction holding the sessions' write locks.

        The locks are taken in key order, so two multi-session batches cannot
        deadlock. The transaction is shielded from cancellation, like the SQLite
        store's statements: a cancelled caller waits for its commit or rollback
        (bounded by ``command_timeout``), so whether a write happened is never in
        doubt afterwards.
        """
        keys = sorted({_lock_key(self._schema, s) for s in session_ids})
        # One round trip: BEGIN and the lock calls travel as one simple query.
        # The keys are integers we computed, so formatting them in is safe.
        begin = "BEGIN ISOLATION LEVEL READ COMMITTED;" + "".join(
            f"SELECT pg_advisory_xact_lock({_SESSION_LOCK_CLASS}, {k});" for k in keys
        )

        async def transaction(conn: _Connection) -> _T:
            await conn.execute(begin)
            try:
                result = await body(conn)
            except BaseException:
                await _quiet_rollback(conn)
                raise
            await conn.execute("COMMIT")
            return result

        async with self._connection() as conn:
            return await _shielded(transaction(conn))

    def _load_message(self, estimate: Any, payload: Any) -> Message:
        message = self._parse(Message, payload)
        # The row's estimate was computed from this very payload at write time.
        message._token_estimate = int(estimate)  # pyright: ignore[reportPrivateUsage]
        return message

    def _load_session(self, watermark: Any, payload: Any) -> Session:
        session = self._parse(Session, payload)
        # The column is the truth: the payload's copy may predate set_watermark.
        session.watermark = None if watermark is None else str(watermark)
        return session

    def _parse(self, model: type[_M], payload: Any) -> _M:
        try:
            return model.model_validate_json(str(payload))
        except ValidationError as exc:
            raise StoreError(f"{self._where}: a stored {model.__name__} is invalid: {exc}") from exc

    async def _insert_messages(
        self, conn: _Connection, messages: Sequence[Message], what: str
    ) -> None:
        """Validate and insert new messages. Inside a write transaction.

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

    async def _update_messages(
        self, conn: _Connection, messages: Sequence[Message], what: str
    ) -> None:
        """Replace existing messages. Inside a write transaction.

        Checked first, for the same reason as :meth:`_insert_messages`.
        """
        batch = _last_versions(messages)
        if not batch:
            return
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
        if _affected(status) != 1:
            raise StoreError(f"session {session.id!r} already exists")

    async def get_session(self, session_id: str) -> Session | None:
        """Return the session, or ``None`` when there is none with that id."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.get_session, session_id)
        return None if row is None else self._load_session(row[0], row[1])

    async def update_session(self, session: Session) -> None:
        """Replace a stored session, keeping its stored watermark (SPEC R2.1).

        Raises:
            StoreError: The session does not exist.
        """
        payload = session.model_dump_json()
        async with self._connection() as conn:
            status = await conn.execute(
                self._sql.update_session, session.id, session.time_created, payload
            )
        if _affected(status) != 1:
            raise StoreError(f"unknown session {session.id!r}")

    async def list_sessions(self) -> list[Session]:
        """Return every session, oldest ``(time_created, id)`` first."""
        async with self._connection() as conn:
            rows = await conn.fetch(self._sql.list_sessions)
        return [self._load_session(r[0], r[1]) for r in rows]

    async def get_watermark(self, session_id: str) -> str | None:
        """Return the session's watermark; ``None`` when unset or the session is unknown."""
        async with self._connection() as conn:
            value = await conn.fetchval(self._sql.get_watermark, session_id)
        return None if value is None else str(value)

    async def set_watermark(self, session_id: str, message_id: str) -> None:
        """Persist the watermark. Raises ``StoreError`` if the session is unknown."""
        async with self._connection() as conn:
            status = await conn.execute(self._sql.set_watermark, session_id, message_id)
        if _affected(status) != 1:
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

        async def body(conn: _Connection) -> None:
            await self._insert_messages(conn, batch, "append_messages")

        await self._write([m.session_id for m in batch], body)

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

        async def body(conn: _Connection) -> None:
            await self._update_messages(conn, batch, "update_messages")

        await self._write([m.session_id for m in batch], body)

    async def get_message(self, message_id: str) -> Message | None:
        """Return one message by id, or ``None``."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.get_message, message_id)
        return None if row is None else self._load_message(row[0], row[1])

    async def list_messages(
        self,
        session_id: str,
        *,
        agent: str | None = MAIN_AGENT,
        since: tuple[int, str] | None = None,
        last: int | None = None,
    ) -> list[Message]:
        """List a session's messages ordered by ``(time_created, id)``.

        See :meth:`mimo_ctx.store.base.Store.list_messages`.
        """
        if last is not None and last < 0:
            raise StoreError(f"list_messages: last must be >= 0, got {last}")
        self._check_open()
        if last == 0:
            return []
        where = ["session_id = $1"]
        params: list[object] = [session_id]
        if agent is not None:
            params.append(agent)
            where.append(f"agent = ${len(params)}")
        if since is not None:
            # A row comparison: PostgreSQL scans the (…, time_created, id) index
            # from that key.
            params.extend(since)
            where.append(f"(time_created, id) >= (${len(params) - 1}, ${len(params)})")
        order = "DESC" if last is not None else "ASC"
        sql = render(
            f"SELECT token_estimate, payload FROM {{s}}.messages WHERE {' AND '.join(where)}"
            f" ORDER BY time_created {order}, id {order}",
            self._schema,
        )
        if last is not None:
            params.append(last)
            sql += f" LIMIT ${len(params)}"
        async with self._connection() as conn:
            rows = await conn.fetch(sql, *params)
        messages = [self._load_message(r[0], r[1]) for r in rows]
        if last is not None:
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
        return None if row is None else self._load_message(row[0], row[1])

    async def latest_boundary(self, session_id: str) -> Message | None:
        """The newest (by id) main-agent user message with a checkpoint or compaction part."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.latest_boundary, session_id, MAIN_AGENT)
        return None if row is None else self._load_message(row[0], row[1])

    async def changes_since(self, session_id: str, seq: int) -> tuple[list[Message], int]:
        """Messages of the session written after ``seq``, in write order, and the current seq.

        Reads under the session's lock taken shared (see the module docstring), so
        a write of this session still in flight is either in the answer or gets a
        number above the one returned.
        """
        key = _lock_key(self._schema, session_id)
        async with self._connection() as conn:
            # One round trip: the schema's changes_since() takes the lock, then
            # reads (see mimo_ctx.store._pg_schema).
            rows = await conn.fetch(
                self._sql.changes_call, session_id, seq, _SESSION_LOCK_CLASS, key
            )
        current = int(rows[0][2])
        changed = [self._load_message(r[0], r[1]) for r in rows if r[1] is not None]
        return changed, current

    async def commit_rebuild(
        self,
        session_id: str,
        *,
        usage_key: str,
        boundary: Message,
        updated: Sequence[Message],
        session: Session | None = None,
    ) -> bool:
        """Append ``boundary`` and replace ``updated`` in one transaction, once per usage key.

        See :meth:`mimo_ctx.store.base.Store.commit_rebuild`. The key is claimed
        first, against the ``rebuilds`` primary key, by the same transaction that
        writes everything else: across processes and machines exactly one commit
        per key succeeds (SPEC R1.4, R4).

        Raises:
            StoreError: The session is unknown, the boundary id exists, an updated
                message is missing or belongs to another session, or ``session`` is
                another session; nothing is written and the key stays unused.
        """
        batch = list(updated)
        check_rebuild_arguments(session_id, boundary, batch, session)
        for m in batch:
            if m.session_id != session_id:
                raise StoreError(
                    f"commit_rebuild: message {m.id!r} belongs to session {m.session_id!r}, "
                    f"not {session_id!r}; nothing written"
                )
        session_payload = None if session is None else session.model_dump_json()

        async def body(conn: _Connection) -> None:
            row = await conn.fetchrow(self._sql.claim_rebuild, session_id, usage_key, boundary.id)
            if row is None or not row[0]:
                raise StoreError(f"commit_rebuild: unknown session {session_id!r}")
            if not row[1]:
                raise _AlreadyCommitted
            await self._insert_messages(conn, [boundary], "commit_rebuild")
            await self._update_messages(conn, batch, "commit_rebuild")
            if session is not None:
                await conn.execute(
                    self._sql.update_session, session_id, session.time_created, session_payload
                )

        try:
            await self._write([session_id], body)
        except _AlreadyCommitted:
            return False
        return True

    # -- tasks and actors ----------------------------------------------------
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
            except (*_DB_ERRORS, TimeoutError):
                pool.terminate()


# -- cross-worker writer lease (SPEC A3) ------------------------------------------
@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a session's writer lease.

    Attributes:
        owner: The holder's owner string.
        generation: Grows by one each time the lease changes hands.
        expires_in: Seconds until the lease lapses, by the database clock.
    """

    owner: str
    generation: int
    expires_in: float


class PostgresWriterLease:
    """One checkpoint writer per session across workers (SPEC A3), kept in PostgreSQL.

    A lease is a row of ``writer_leases`` with an owner and an expiry, both set by
    single atomic statements using the database's clock (workers' clocks may
    disagree). A worker that crashes stops renewing, its lease lapses after
    ``ttl`` seconds and another worker can take it. Releasing a lease sends a
    ``NOTIFY``, so :meth:`wait_released` returns at once; it also polls with
    backoff (up to ``max_poll_interval``) and wakes at the lease's expiry, so
    it needs no notification to be correct.

    ``owner`` strings must be unique per holder (for example
    ``f"{hostname}:{pid}:{uuid4()}"``): the same owner acquiring again just
    extends its lease.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        listen: bool = True,
        min_poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
    ) -> None:
        """Use ``store``'s database, schema and pool.

        Args:
            store: The store whose database holds the leases.
            listen: Learn of releases through ``LISTEN`` on one extra connection;
                without it, through polling alone.
            min_poll_interval: First polling delay in seconds; doubled each poll.
            max_poll_interval: Longest polling delay in seconds.
        """
        if not 0 < min_poll_interval <= max_poll_interval:
            raise StoreError(
                "poll intervals must satisfy 0 < min_poll_interval <= max_poll_interval, got "
                f"{min_poll_interval} and {max_poll_interval}"
            )
        self._store = store
        self._listen = listen
        self._min_poll = min_poll_interval
        self._max_poll = max_poll_interval
        self._channel = f"{store.schema}_writer_lease"
        self._listener: _Connection | None = None
        self._listener_lock = anyio.Lock()
        self._waiters: dict[str, set[anyio.Event]] = {}
        self._closed = False
        s = store.schema
        self._sql_acquire = render(
            "INSERT INTO {s}.writer_leases AS l (session_id, owner, generation, acquired_at,"
            " expires_at) VALUES ($1, $2, 1, clock_timestamp(),"
            " clock_timestamp() + make_interval(secs => $3))"
            " ON CONFLICT (session_id) DO UPDATE SET"
            # The same live owner extends its lease; anyone else starts a new one.
            " generation = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > clock_timestamp()"
            " THEN l.generation ELSE l.generation + 1 END,"
            " acquired_at = CASE WHEN l.owner = EXCLUDED.owner"
            " AND l.expires_at > clock_timestamp() THEN l.acquired_at ELSE clock_timestamp() END,"
            " owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at"
            " WHERE l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner"
            " RETURNING generation",
            s,
        )
        self._sql_renew = render(
            "UPDATE {s}.writer_leases SET expires_at = clock_timestamp()"
            " + make_interval(secs => $3) WHERE session_id = $1 AND owner = $2"
            " AND expires_at > clock_timestamp() RETURNING generation",
            s,
        )
        # -infinity rather than a delete: the generation keeps counting (see
        # wait_released). pg_notify is delivered when the statement commits.
        self._sql_release = render(
            "WITH r AS (UPDATE {s}.writer_leases SET expires_at = '-infinity'"
            " WHERE session_id = $1 AND owner = $2 AND expires_at > clock_timestamp()"
            " RETURNING session_id) SELECT pg_notify($3, session_id) FROM r",
            s,
        )
        self._sql_state = render(
            "SELECT owner, generation, CASE WHEN expires_at > clock_timestamp()"
            " THEN extract(epoch FROM expires_at - clock_timestamp())::float8 ELSE 0 END"
            " FROM {s}.writer_leases WHERE session_id = $1",
            s,
        )
        # FOR SHARE holds off a takeover until this statement commits, so the
        # watermark is only written by a holder whose lease is live throughout.
        self._sql_fenced_watermark = render(
            "WITH held AS (SELECT 1 FROM {s}.writer_leases WHERE session_id = $1"
            " AND owner = $2 AND expires_at > clock_timestamp() FOR SHARE),"
            " w AS (UPDATE {s}.sessions SET watermark = $3 WHERE id = $1"
            " AND EXISTS (SELECT 1 FROM held) RETURNING 1)"
            " SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = $1), EXISTS (SELECT 1 FROM w)",
            s,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the PostgreSQL writer lease is closed")

    @staticmethod
    def _check_ttl(ttl: float) -> None:
        if not (ttl > 0 and math.isfinite(ttl)):
            raise StoreError(f"lease ttl must be a finite number of seconds > 0, got {ttl}")

    async def acquire(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take the session's writer lease for ``ttl`` seconds if nobody holds it.

        Returns:
            ``True`` when ``owner`` now holds the lease (taken, taken over after
            the previous holder's expiry, or extended because ``owner`` held it);
            ``False`` when another owner holds a live lease.
        """
        self._check_open()
        self._check_ttl(ttl)
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            generation = await conn.fetchval(self._sql_acquire, session_id, owner, float(ttl))
        return generation is not None

    async def renew(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s live lease to ``ttl`` seconds from now.

        Returns:
            ``False`` when ``owner`` no longer holds a live lease: it lapsed or was
            released. The holder must then stop writing (another worker may have
            taken over).
        """
        self._check_open()
        self._check_ttl(ttl)
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            generation = await conn.fetchval(self._sql_renew, session_id, owner, float(ttl))
        return generation is not None

    async def release(self, session_id: str, owner: str) -> bool:
        """Give the lease up and wake the waiters.

        Returns:
            ``True`` when ``owner`` held a live lease; ``False`` (nothing changed)
            otherwise.
        """
        self._check_open()
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            rows = await conn.fetch(self._sql_release, session_id, owner, self._channel)
        return bool(rows)

    async def holder(self, session_id: str) -> LeaseHolder | None:
        """The live holder of the session's lease, or ``None`` when it is free."""
        self._check_open()
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            row = await conn.fetchrow(self._sql_state, session_id)
        if row is None or float(row[2]) <= 0:
            return None
        return LeaseHolder(owner=str(row[0]), generation=int(row[1]), expires_in=float(row[2]))

    async def set_watermark_if_held(self, session_id: str, owner: str, message_id: str) -> bool:
        """Persist the watermark only while ``owner`` holds a live lease (a fenced write).

        A writer that stalled past its lease's expiry cannot then overwrite the
        watermark of the worker that took over.

        Returns:
            ``True`` when written; ``False`` (nothing written) when ``owner`` does
            not hold a live lease.

        Raises:
            StoreError: The session is unknown.
        """
        self._check_open()
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            row = await conn.fetchrow(self._sql_fenced_watermark, session_id, owner, message_id)
        if row is None or not row[0]:
            raise StoreError(f"unknown session {session_id!r}")
        return bool(row[1])

    async def wait_released(
        self,
        session_id: str,
        timeout: float,  # noqa: ASYNC109 - a bound the caller gets from SPEC A3, not a cancel
        *,
        generation: int | None = None,
    ) -> bool:
        """Wait until the lease held now (or the given ``generation``) is over.

        Over means released, lapsed, or taken by a later holder: the writer run
        the caller waits for has ended either way.

        Args:
            session_id: The session.
            timeout: Seconds to wait at most.
            generation: The holder to wait for (from :meth:`holder`); by default
                whoever holds the lease when the call starts.

        Returns:
            ``True`` when the lease is over (at once if nobody held it), ``False``
            on timeout.
        """
        self._check_open()
        deadline = anyio.current_time() + max(0.0, timeout)
        event = anyio.Event()
        waiters = self._waiters.setdefault(session_id, set())
        waiters.add(event)
        try:
            # Listening before the first look: a release after it is heard.
            await self._ensure_listener()
            state = await self._state(session_id)
            if state is None:
                return True
            watched = state[0] if generation is None else generation
            delay = self._min_poll
            while True:
                if state is None or state[0] != watched:
                    return True
                now = anyio.current_time()
                if now >= deadline:
                    return False
                # Wake at the latest at the expiry, the next poll or the deadline.
                with anyio.move_on_after(min(delay, state[1] + 0.001, deadline - now)):
                    await event.wait()
                if event.is_set():
                    waiters.discard(event)
                    event = anyio.Event()
                    waiters.add(event)
                else:
                    delay = min(delay * 2, self._max_poll)
                state = await self._state(session_id)
        finally:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(session_id, None)

    async def _state(self, session_id: str) -> tuple[int, float] | None:
        """(generation, seconds left) of the live lease, or ``None`` when there is none."""
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            row = await conn.fetchrow(self._sql_state, session_id)
        if row is None or float(row[2]) <= 0:
            return None
        return int(row[1]), float(row[2])

    async def _ensure_listener(self) -> None:
        if not self._listen:
            return
        async with self._listener_lock:
            self._check_open()
            if self._listener is not None and not self._listener.is_closed():
                return
            self._listener = None
            where = self._store._where  # pyright: ignore[reportPrivateUsage]
            try:
                conn = await _connect(self._store.dsn, timeout=30)
            except (*_DB_ERRORS, ValueError) as exc:
                raise StoreError(f"cannot connect to {where}: {exc}") from exc
            try:
                await conn.add_listener(self._channel, self._notified)
            except _DB_ERRORS as exc:
                conn.terminate()
                raise StoreError(f"{where}: LISTEN failed: {exc}") from exc
            # A lost connection is replaced at the next wait; polling covers the gap.
            conn.add_termination_listener(self._listener_lost)
            self._listener = conn

    def _listener_lost(self, _conn: Any) -> None:
        self._listener = None

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for event in self._waiters.get(payload, ()):
            event.set()

    async def aclose(self) -> None:
        """Close the listening connection (the store's pool stays open). Idempotent."""
        self._closed = True
        conn, self._listener = self._listener, None
        if conn is None or conn.is_closed():
            return
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(10):
                    await conn.close()
            except (*_DB_ERRORS, TimeoutError):
                conn.terminate()
