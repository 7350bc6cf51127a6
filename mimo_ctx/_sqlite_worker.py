"""One SQLite connection driven from a worker thread: the plumbing shared by the
SQLite store and the memory index.

The capacity limiter keeps each database to one worker thread at a time (other
callers queue in the event loop, not in blocked threads), so the event loop never
blocks on SQLite; the lock guards the connection against any other thread (e.g. a
second event loop).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import Self, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import AsyncResource

from mimo_ctx.errors import StoreError

__all__ = ["SQLiteWorker"]

_T = TypeVar("_T")


class SQLiteWorker(AsyncResource):
    """Base of the SQLite-backed classes: a lazily opened connection on a worker thread.

    Subclasses implement :meth:`_connect`; ``label`` names the object in errors
    (``"SQLite store"``, ``"memory index"``).
    """

    def __init__(self, path: str | os.PathLike[str], *, label: str) -> None:
        self._path = os.fspath(path)
        self._label = label
        self._limiter = anyio.CapacityLimiter(1)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    @property
    def path(self) -> str:
        """The database path as given."""
        return self._path

    async def __aenter__(self) -> Self:
        await self._run(lambda _conn: None)
        return self

    async def aclose(self) -> None:
        """Close the connection; later calls raise ``StoreError``. Idempotent."""
        if self._closed:
            return
        self._closed = True

        def close() -> None:
            with self._lock:
                self._release()
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()

        # Shielded: a cancelled caller must still release the connection.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(close, limiter=self._limiter)

    @abstractmethod
    def _connect(self) -> sqlite3.Connection:
        """Open the connection (called once, on the worker thread, under the lock)."""

    def _release(self) -> None:
        """Close what a subclass opened besides the connection (worker thread, under
        the lock, before the connection: the last connection to close checkpoints)."""
        return

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the {self._label} {self._path} is closed")

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        self._check_open()
        return await anyio.to_thread.run_sync(self._call, fn, limiter=self._limiter)

    def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            self._check_open()
            conn = self._conn
            if conn is None:
                conn = self._conn = self._connect()
            try:
                return fn(conn)
            except (sqlite3.Error, OverflowError) as exc:
                # OverflowError: a value beyond SQLite's 64-bit integers.
                raise StoreError(f"{self._label} {self._path}: {exc}") from exc
