"""Storage: the :class:`Store` contract and its implementations.

* :class:`SQLiteStore` — the embedded default: one SQLite file (WAL mode),
  shareable between processes.
* :class:`InMemoryStore` — dicts in memory, for tests and short-lived agents.
* :class:`~mimo_ctx.store.postgres.PostgresStore` — PostgreSQL, for many workers
  on many machines (``pip install "mimo-ctx[postgres]"``). It lives in
  :mod:`mimo_ctx.store.postgres` and is imported only when asked for, so
  ``import mimo_ctx`` never needs asyncpg.

:func:`open_store` picks one from a path or a ``postgresql://`` URL.
"""

from __future__ import annotations

import os

from mimo_ctx.errors import StoreError
from mimo_ctx.session import task_order_key
from mimo_ctx.store.base import (
    ACTIVE_ACTOR_STATUSES,
    TERMINAL_TASK_STATUSES,
    Actor,
    ActorStatus,
    RequestPrefix,
    Session,
    SessionState,
    Store,
    Task,
    TaskStatus,
)
from mimo_ctx.store.in_memory import InMemoryStore
from mimo_ctx.store.sqlite import SCHEMA_VERSION, SQLiteStore

__all__ = [
    "ACTIVE_ACTOR_STATUSES",
    "SCHEMA_VERSION",
    "TERMINAL_TASK_STATUSES",
    "Actor",
    "ActorStatus",
    "InMemoryStore",
    "RequestPrefix",
    "SQLiteStore",
    "Session",
    "SessionState",
    "Store",
    "Task",
    "TaskStatus",
    "is_postgres_url",
    "open_store",
    "task_order_key",
]


_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` is a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(location, str) and location.strip().lower().startswith(_POSTGRES_SCHEMES)


async def open_store(
    path: str | os.PathLike[str] | None = None,
    *,
    schema: str | None = None,
    create_schema: bool = False,
) -> Store:
    """Open a store from where it lives.

    * ``None`` — a new :class:`InMemoryStore`;
    * a ``postgresql://user:password@host:5432/db`` URL (or ``postgres://``) — a
      :class:`~mimo_ctx.store.postgres.PostgresStore` with its pool open;
    * anything else — an SQLite file (created with its schema when missing).

    The store is opened before this returns, so a bad file, an unreachable
    server or a missing schema is reported here.

    Args:
        path: Where the store lives (see above).
        schema: PostgreSQL only: the schema (namespace) of the store's tables;
            default ``mimo_ctx``.
        create_schema: PostgreSQL only: create or upgrade the schema now instead
            of requiring ``mimo-ctx db upgrade --dsn ...`` first.

    Raises:
        StoreError: The store cannot be used (see :meth:`SQLiteStore.open` and
            :meth:`~mimo_ctx.store.postgres.PostgresStore.open`), or a
            PostgreSQL-only option was given for another store.
        ImportError: A PostgreSQL URL without asyncpg installed (the message
            names the ``postgres`` extra).
    """
    if path is not None and is_postgres_url(path):
        from mimo_ctx.store.postgres import PostgresStore

        return await PostgresStore.open(
            str(path).strip(), schema=schema or "mimo_ctx", create_schema=create_schema
        )
    if schema is not None or create_schema:
        raise StoreError(
            "open_store: schema= and create_schema= apply to PostgreSQL stores only "
            f"(a postgresql:// URL), not to {'an in-memory store' if path is None else repr(path)}"
        )
    if path is None:
        return InMemoryStore()
    return await SQLiteStore.open(path)
