"""What :class:`~mimo_ctx.store.postgres.PostgresStore` stands on (private).

The pool (opened on first use, schema version checked), pooled connections whose
driver errors become :class:`~mimo_ctx.errors.StoreError`, write transactions
under the sessions' advisory locks, and rows read back into models. The store's
methods, the :class:`~mimo_ctx.store.base.Store` contract, are in
:mod:`mimo_ctx.store.postgres`; the writer lease uses the same connections.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypedDict, TypeVar

import anyio
from pydantic import BaseModel, ValidationError

from mimo_ctx._aio import shielded
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import Message, set_insert_seq, stored_part_units
from mimo_ctx.session import Session, SessionState, StateChange
from mimo_ctx.store._common import restore_row_caches
from mimo_ctx.store._pg_driver import (
    DB_ERRORS,
    SESSION_LOCK_CLASS,
    Connection,
    Pool,
    create_pool,
    lock_key,
    no_reset,
    quiet_rollback,
    redact,
)
from mimo_ctx.store._pg_schema import (
    SCHEMA_VERSION,
    Statements,
    quote_schema,
    stored_version,
    upgrade,
)
from mimo_ctx.store.base import (
    apply_state_change,
)
from mimo_ctx.tokens import estimate_message_tokens

__all__ = [
    "AlreadyCommitted",
    "MessageColumns",
    "PostgresBase",
    "PostgresOptions",
    "last_versions",
    "message_columns",
    "stamp",
]

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)


class AlreadyCommitted(Exception):
    """Internal: the usage key of a rebuild is taken; roll back and answer False."""


# Columns of a message row as written, one array per column for unnest().
MessageColumns = tuple[
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
    list[str | None],
]


def message_columns(messages: Sequence[Message]) -> MessageColumns:
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
        # After the estimates: the lengths each was summed from, when computed here.
        [stored_part_units(m) for m in messages],
    )


def stamp(messages: Sequence[Message], insert_seqs: dict[str, int]) -> None:
    """Give the messages just written their place in the write order."""
    for message in messages:
        insert_seq = insert_seqs.get(message.id)
        if insert_seq is not None:
            set_insert_seq(message, insert_seq)


def last_versions(messages: Sequence[Message]) -> list[Message]:
    """Keep the last version of each id, at its last position (a write replaces)."""
    last = {m.id: i for i, m in enumerate(messages)}
    return [m for i, m in enumerate(messages) if last[m.id] == i]


class PostgresOptions(TypedDict, total=False):
    """The keyword arguments of a PostgreSQL store (see :class:`PostgresBase`)."""

    schema: str
    create_schema: bool
    min_size: int
    max_size: int
    command_timeout: float
    statement_cache_size: int


class PostgresBase:
    """The pool, connections, transactions and row loading of a PostgreSQL store."""

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

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the store's tables."""
        return self._schema

    @property
    def dsn(self) -> str:
        """The connection string as given (it may hold a password)."""
        return self._dsn

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

    async def _write_batch(
        self, batch: Sequence[Message], body: Callable[[Connection], Awaitable[dict[str, int]]]
    ) -> None:
        """Write a batch of messages with ``body`` (see :meth:`_write`) and stamp them.

        ``body`` returns the insert_seq of each message it wrote, by id. An empty
        batch writes nothing (a closed store still refuses it).
        """
        if not batch:
            self._check_open()
            return
        stamp(batch, await self._write([m.session_id for m in batch], body))

    def _load_message(self, estimate: Any, payload: Any, insert_seq: Any, units: Any) -> Message:
        return restore_row_caches(self._parse(Message, payload), estimate, insert_seq, units)

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
        inserted = await conn.fetch(self._sql.insert_messages, *message_columns(messages))
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
        batch = last_versions(messages)
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
        updated = await conn.fetch(self._sql.update_messages, *message_columns(batch))
        if len(updated) != len(batch):  # pragma: no cover - sessions never change under us
            raise StoreError(f"{what}: a message changed session meanwhile; nothing written")
        return {str(r[0]): int(r[1]) for r in updated}
