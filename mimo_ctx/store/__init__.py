"""Storage: the :class:`Store` contract and its two implementations.

* :class:`SQLiteStore` — the embedded default: one SQLite file (WAL mode),
  shareable between processes.
* :class:`InMemoryStore` — dicts in memory, for tests and short-lived agents.

:func:`open_store` picks one from a path.
"""

from __future__ import annotations

import os

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
from mimo_ctx.store.memory import InMemoryStore, task_order_key
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
    "open_store",
    "task_order_key",
]


async def open_store(path: str | os.PathLike[str] | None = None) -> Store:
    """Open a store: SQLite at ``path``, or an :class:`InMemoryStore` when ``path`` is None.

    The SQLite file is opened (and its schema created) before this returns, so
    a bad file is reported here.

    Raises:
        StoreError: The file cannot be used (see :meth:`SQLiteStore.open`).
    """
    if path is None:
        return InMemoryStore()
    return await SQLiteStore.open(path)
