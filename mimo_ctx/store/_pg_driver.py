"""The asyncpg plumbing the PostgreSQL store and lease share (private).

asyncpg has no annotations: the few methods we call are typed here once, as
small protocols, and its two entry points are wrapped. The rest are the helpers
every statement path needs: the advisory-lock keys, DSN redaction for error
messages, shielded awaits and rollbacks.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol, cast

import anyio


def missing_driver() -> ImportError:
    """The error of an import without asyncpg: it names the extra to install."""
    return ImportError('mimo_ctx.store.postgres needs asyncpg: pip install "mimo-ctx[postgres]"')


try:
    import asyncpg
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise missing_driver() from _exc

__all__ = [
    "DB_ERRORS",
    "MIGRATION_LOCK_CLASS",
    "SESSION_LOCK_CLASS",
    "Connection",
    "Pool",
    "Record",
    "affected",
    "close_or_terminate",
    "connect",
    "create_pool",
    "lock_key",
    "missing_driver",
    "no_reset",
    "quiet_rollback",
    "redact",
]


# Class ids of our two-key advisory locks ("mimo", "mimp"): the (int4, int4) key
# space is separate from the single-bigint one applications tend to use.
SESSION_LOCK_CLASS: Final = 0x6D696D6F
MIGRATION_LOCK_CLASS: Final = 0x6D696D70

DB_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


# -- typed views of the asyncpg objects we use ---------------------------------
class Record(Protocol):
    def __getitem__(self, index: int, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    async def execute(self, query: str, *args: object) -> str: ...

    async def fetch(self, query: str, *args: object) -> list[Record]: ...

    async def fetchrow(self, query: str, *args: object) -> Record | None: ...

    async def fetchval(self, query: str, *args: object, column: int = 0) -> Any: ...

    async def add_listener(
        self, channel: str, callback: Callable[[Any, int, str, str], None]
    ) -> None: ...

    def add_termination_listener(self, callback: Callable[[Any], None]) -> None: ...

    async def close(self) -> None: ...

    def is_closed(self) -> bool: ...

    def terminate(self) -> None: ...


class Pool(Protocol):
    def acquire(
        self, *, timeout: float | None = None
    ) -> AbstractAsyncContextManager[Connection]: ...

    async def close(self) -> None: ...

    def terminate(self) -> None: ...


async def connect(dsn: str, **kwargs: Any) -> Connection:
    # asyncpg has no annotations: its two entry points are typed here, once.
    connect: Callable[..., Awaitable[object]] = asyncpg.connect  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast("Connection", await connect(dsn, **kwargs))


async def create_pool(dsn: str, **kwargs: Any) -> Pool:
    create: Callable[..., Awaitable[object]] = asyncpg.create_pool  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast("Pool", await create(dsn, **kwargs))


async def no_reset(_connection: object) -> None:
    """Pool reset hook: our calls leave no session state behind.

    asyncpg's default reset sends a query on every release (unlisten, unlock,
    reset settings): a wasted round trip for us. An open transaction is still
    rolled back by asyncpg itself before this hook runs.
    """


def redact(dsn: str) -> str:
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


def lock_key(schema: str, session_id: str) -> int:
    """The int4 key of a session's advisory lock (a collision only costs waiting)."""
    digest = hashlib.blake2b(f"{schema}\x00{session_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def affected(status: str) -> int:
    """Rows affected, from a command status such as ``UPDATE 1``."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


async def close_or_terminate(closing: Pool | Connection, grace: float) -> None:
    """Close a pool or connection gracefully, or terminate it after ``grace`` seconds.

    Shielded: a cancelled caller must still release the connections; a server
    that does not answer (or a broken socket) ends in ``terminate()``.
    """
    with anyio.CancelScope(shield=True):
        try:
            with anyio.fail_after(grace):
                await closing.close()
        except (*DB_ERRORS, TimeoutError):
            closing.terminate()


async def quiet_rollback(conn: Connection) -> None:
    """Roll back; a connection too broken for that is discarded by the pool anyway."""
    if conn.is_closed():
        return
    try:
        await conn.execute("ROLLBACK")
    except DB_ERRORS:
        conn.terminate()
