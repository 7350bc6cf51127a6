"""Access to the test PostgreSQL server for tests outside tests/store/test_postgres.py.

Same rules as that module: the DSN comes from ``MIMO_CTX_PG_DSN``
(``scripts/start_postgres.sh`` starts a throwaway server and prints it); without
a reachable server, or without asyncpg, the tests skip with the reason, except
under ``CI=true``, where CI starts the server, so they fail instead.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
import pytest

__all__ = ["DSN_ENV", "IN_CI", "SchemaNames", "admin", "require_pg_dsn", "run_in_thread"]

IN_CI = os.environ.get("CI", "").strip().lower() == "true"
DSN_ENV = "MIMO_CTX_PG_DSN"


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the PostgreSQL tests must run in CI)", pytrace=False)
    pytest.skip(reason)


def run_in_thread(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``fn`` on a fresh event loop in a helper thread (for sync fixtures)."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(anyio.run(fn))
        except BaseException as exc:  # handed back to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


async def admin(dsn: str, *statements: str) -> None:
    """Run statements on a plain connection (schema drops and the like)."""
    import asyncpg

    connect = cast("Callable[..., Awaitable[Any]]", asyncpg.connect)  # pyright: ignore[reportUnknownMemberType]
    conn = await connect(dsn, timeout=10)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def require_pg_dsn() -> str:
    """The test server's DSN; skips (fails under CI) without asyncpg or a server."""
    try:
        import asyncpg  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError as exc:
        if IN_CI:
            raise
        pytest.skip(f'PostgreSQL tests need asyncpg (pip install "mimo-ctx[postgres]"): {exc}')
    dsn = os.environ.get(DSN_ENV, "").strip()
    if not dsn:
        _unavailable(
            f"{DSN_ENV} is not set, so there is no PostgreSQL server to test against; "
            f'start one with `export {DSN_ENV}="$(bash scripts/start_postgres.sh)"`'
        )
    try:
        run_in_thread(lambda: admin(dsn, "SELECT 1"))
    except Exception as exc:
        _unavailable(f"the PostgreSQL server in {DSN_ENV} is unreachable: {exc!r}")
    return dsn


class SchemaNames:
    """Fresh PostgreSQL schema names for one test; :meth:`drop_all` removes them."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.names: list[str] = []

    def new(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}_{len(self.names)}"
        self.names.append(name)
        return name

    def drop_all(self) -> None:
        if self.names:
            drops = [f'DROP SCHEMA IF EXISTS "{n}" CASCADE' for n in self.names]
            run_in_thread(lambda: admin(self.dsn, *drops))
