"""``mimo-ctx db upgrade``: the PostgreSQL store's migration step (issue 11).

Errors are one line with exit code 2 and never show a password. The upgrade
itself runs against the test server (``MIMO_CTX_PG_DSN``); without one those
tests skip, except under ``CI=true``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import anyio
import anyio.to_thread
import pytest

from tests.cli.conftest import run_cli
from tests.cli.test_cli_errors import assert_one_line_error
from tests.pg_support import SchemaNames, require_pg_dsn


@pytest.fixture
def schemas() -> Iterator[SchemaNames]:
    names = SchemaNames(require_pg_dsn())
    yield names
    names.drop_all()


def test_db_upgrade_creates_the_schema_and_is_idempotent(schemas: SchemaNames) -> None:
    from mimo_ctx.store.postgres import SCHEMA_VERSION

    name = schemas.new()
    first = run_cli("db", "upgrade", "--dsn", schemas.dsn, "--schema", name, "--json")
    assert first.code == 0, first.err
    assert first.json() == {"schema": name, "version": SCHEMA_VERSION, "supported": SCHEMA_VERSION}
    again = run_cli("db", "upgrade", "--dsn", schemas.dsn, "--schema", name)
    assert again.code == 0, again.err
    assert f"'{name}' is at store schema version {SCHEMA_VERSION}" in again.out
    assert again.err == ""


async def test_db_upgrade_makes_the_store_usable(schemas: SchemaNames) -> None:
    """The store refuses a missing schema and points at this command; after it, it opens."""
    from mimo_ctx.errors import StoreError
    from mimo_ctx.store import open_store

    name = schemas.new()
    with pytest.raises(StoreError, match="mimo-ctx db upgrade"):
        await open_store(schemas.dsn, schema=name)
    # The command runs its own event loop: off this test's loop, in a thread.
    run = await anyio.to_thread.run_sync(
        lambda: run_cli("db", "upgrade", "--dsn", schemas.dsn, "--schema", name)
    )
    assert run.code == 0, run.err
    store = await open_store(schemas.dsn, schema=name)
    try:
        assert await store.list_sessions() == []
    finally:
        await store.aclose()


def test_db_upgrade_refuses_a_foreign_schema(schemas: SchemaNames) -> None:
    from tests.pg_support import admin, run_in_thread

    name = schemas.new()
    run_in_thread(
        lambda: admin(schemas.dsn, f'CREATE SCHEMA "{name}"', f'CREATE TABLE "{name}".t (id int)')
    )
    run = run_cli("db", "upgrade", "--dsn", schemas.dsn, "--schema", name)
    assert_one_line_error(run)
    assert "not a mimo_ctx store" in run.err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--dsn", "host=db password=s3cret"], "postgresql://"),
        (["--dsn", "/var/lib/store.db"], "postgresql://"),
        (["--dsn", "postgresql://app:s3cret@127.0.0.1:1/db"], "cannot connect"),
        (["--dsn", "postgresql://app:s3cret@127.0.0.1:1/db", "--schema", "Bad-Name"], "schema"),
        ([], "--dsn"),
    ],
)
def test_db_upgrade_errors_are_one_line_without_the_password(
    argv: list[str], expected: str
) -> None:
    run = run_cli("db", "upgrade", *argv)
    assert_one_line_error(run)
    assert expected in run.err
    assert "s3cret" not in run.err


def test_db_needs_an_action() -> None:
    run = run_cli("db")
    assert_one_line_error(run)
    assert "ACTION" in run.err


def test_db_upgrade_without_asyncpg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "mimo_ctx.store.postgres", raising=False)
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    run = run_cli("db", "upgrade", "--dsn", "postgresql://app@127.0.0.1:1/db")
    assert_one_line_error(run)
    assert 'pip install "mimo-ctx[postgres]"' in run.err


def test_db_is_listed_in_help() -> None:
    run = run_cli("--help")
    assert run.code == 0
    assert "db" in run.out
    assert run_cli("db", "upgrade", "--help").code == 0
