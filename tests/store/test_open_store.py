"""``open_store`` picks PostgreSQL from a ``postgresql://`` URL (issue 11), lazily.

``import mimo_ctx`` must not import asyncpg: PostgreSQL is an optional extra.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mimo_ctx.errors import StoreError
from mimo_ctx.store import InMemoryStore, SQLiteStore, is_postgres_url, open_store
from tests.pg_support import SchemaNames, require_pg_dsn

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("postgresql://app@db:5432/agents", True),
        ("postgres://app@db/agents", True),
        ("  PostgreSQL://app@db/agents", True),
        ("postgresql.db", False),
        ("/srv/postgresql://weird", False),
        ("host=db dbname=agents", False),
        (Path("postgresql:/x"), False),
    ],
)
def test_is_postgres_url(location: str | Path, expected: bool) -> None:
    assert is_postgres_url(location) is expected


def test_import_mimo_ctx_does_not_import_asyncpg() -> None:
    code = (
        "import sys, mimo_ctx, mimo_ctx.store, mimo_ctx.cli, mimo_ctx.middleware\n"
        "assert 'asyncpg' not in sys.modules, 'asyncpg imported'\n"
        "assert 'mimo_ctx.store.postgres' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


async def test_postgres_only_options_are_refused_for_other_stores(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="PostgreSQL stores only"):
        await open_store(schema="mimo_ctx")
    with pytest.raises(StoreError, match="PostgreSQL stores only"):
        await open_store(tmp_path / "s.db", create_schema=True)
    assert not (tmp_path / "s.db").exists()
    memory = await open_store()
    assert isinstance(memory, InMemoryStore)
    on_disk = await open_store(tmp_path / "s.db")
    assert isinstance(on_disk, SQLiteStore)
    await on_disk.aclose()


async def test_postgres_url_without_asyncpg_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "mimo_ctx.store.postgres", raising=False)
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    with pytest.raises(ImportError, match=r'pip install "mimo-ctx\[postgres\]"'):
        await open_store("postgresql://app@127.0.0.1:1/db")


@pytest.fixture
def schemas() -> Iterator[SchemaNames]:
    names = SchemaNames(require_pg_dsn())
    yield names
    names.drop_all()


async def test_open_store_opens_postgres_from_a_url(schemas: SchemaNames) -> None:
    from mimo_ctx.store.postgres import PostgresStore

    name = schemas.new()
    with pytest.raises(StoreError, match="mimo-ctx db upgrade"):
        await open_store(schemas.dsn, schema=name)
    store = await open_store(schemas.dsn, schema=name, create_schema=True)
    try:
        assert isinstance(store, PostgresStore)
        assert store.schema == name
        assert await store.list_sessions() == []
    finally:
        await store.aclose()
