"""Helpers of the integration tests: a middleware on a small window, with its events."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import ContextRebuilt, Event
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import InMemoryStore, Store
from mimo_ctx.triggers import ModelLimits

# usable = 90,000 tokens; writer thresholds at 18k/36k/54k/72k (SPEC R1.2, A3).
LIMITS = ModelLimits(100_000, input_limit=100_000)


@dataclass
class Engine:
    """A running middleware, its store and every event it emitted."""

    middleware: ContextMiddleware
    store: Store
    events: list[Event] = field(default_factory=list[Event])

    @property
    def rebuilds(self) -> list[ContextRebuilt]:
        return [e for e in self.events if isinstance(e, ContextRebuilt)]


@asynccontextmanager
async def running(
    tmp_path: Path, *, store: Store | None = None, config: RebuildConfig | None = None
) -> AsyncGenerator[Engine]:
    """A middleware entered for the block (the task group of its writers is the
    block's: enter and leave it in the test's own task)."""
    used = store or InMemoryStore()
    engine = Engine(ContextMiddleware(used, tmp_path / "memory", model=LIMITS, config=config), used)
    engine.middleware.events.handlers.append(engine.events.append)
    async with engine.middleware:
        yield engine
