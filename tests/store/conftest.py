"""Fixtures of the store tests: every contract test runs against every store."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from mimo_ctx.store import InMemoryStore, SQLiteStore, Store

StoreFactory = Callable[[], Awaitable[Store]]

STORE_KINDS = ("memory", "sqlite-file", "sqlite-memory")


def make_factory(kind: str, directory: Path) -> StoreFactory:
    """Return a function making a fresh, empty store of ``kind`` on each call."""
    counter = itertools.count()

    async def factory() -> Store:
        if kind == "memory":
            return InMemoryStore()
        if kind == "sqlite-memory":
            return await SQLiteStore.open(":memory:")
        return await SQLiteStore.open(directory / f"store-{next(counter)}.db")

    return factory


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of fresh stores, parametrised over every implementation."""
    return make_factory(str(request.param), tmp_path)


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[Store]:
    """A fresh store of each implementation, closed after the test."""
    s = await store_factory()
    yield s
    await s.aclose()
