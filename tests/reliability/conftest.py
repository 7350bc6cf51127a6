"""Shared fixtures and builders of the reliability suite (issue 10).

Sessions are built directly in the store (no model turns) so a test reaches the
trigger line in milliseconds; the soak test drives a scripted model instead.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from mimo_ctx.events import Event
from mimo_ctx.messages import (
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.sections import BODY_INTRO
from mimo_ctx.store import InMemoryStore, SQLiteStore, Store
from mimo_ctx.testing import filler_text
from mimo_ctx.triggers import ModelLimits
from tests.reliability._workers import SharedStore

# usable = 90000 tokens (R1.2: input limit 100k, ratio 0.90).
LIMITS = ModelLimits(100_000, input_limit=100_000)
USABLE = 90_000
SYSTEM = "You are a careful coding agent."


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Both embedded stores."""
    s: Store = (
        InMemoryStore() if request.param == "memory" else await SQLiteStore.open(tmp_path / "s.db")
    )
    yield s
    await s.aclose()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    """The SQLite store alone (file-level faults, processes)."""
    s = await SQLiteStore.open(tmp_path / "s.db")
    yield s
    await s.aclose()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def assistant_with_tool(
    session_id: str,
    *,
    at: int,
    usage: int,
    tool: str = "read",
    tokens: int = 4000,
    seed: int = 0,
    agent: str = "main",
    arguments: dict[str, object] | None = None,
) -> Message:
    """A finished assistant message with one completed tool call and its usage."""
    return Message(
        session_id=session_id,
        role="assistant",
        agent=agent,
        time_created=at,
        time_completed=at,
        finish="tool-calls",
        usage=TokenUsage(input=usage),
        parts=[
            ToolPart(
                call_id=f"call_{seed}_{at}",
                tool=tool,
                state=ToolStateCompleted(
                    input=dict(arguments or {"file_path": f"src/m{seed}.py"}),
                    output=filler_text(tokens, seed=seed),
                    time=ToolTime(start=at, end=at),
                ),
            )
        ],
    )


def user(session_id: str, text: str, *, at: int, agent: str = "main") -> Message:
    return Message(
        session_id=session_id,
        role="user",
        agent=agent,
        time_created=at,
        parts=[TextPart(text=text)],
    )


async def fill_to_trigger(
    mw: ContextMiddleware,
    session_id: str,
    *,
    request: str = "Refactor every module. Never touch tests.",
    rounds: int = 24,
    tokens: int = 4000,
    agent: str = "main",
    final_usage: int = USABLE + 500,
) -> list[Message]:
    """Append a user request and ``rounds`` tool rounds; the last usage crosses the line.

    Messages are appended, not recorded, so no writer starts: the next
    ``prepare`` is what hits the trigger (and runs the ensure-checkpoint path).
    """
    t0 = now_ms() - 10_000
    messages = [user(session_id, request, at=t0, agent=agent)]
    for i in range(rounds):
        usage = final_usage if i == rounds - 1 else (i + 1) * (final_usage // rounds)
        messages.append(
            assistant_with_tool(
                session_id, at=t0 + 1 + i, usage=usage, tokens=tokens, seed=i, agent=agent
            )
        )
    await mw.append(messages)
    return messages


def boundaries(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.is_boundary]


def recorder() -> tuple[list[Event], Callable[[Event], None]]:
    events: list[Event] = []
    return events, events.append


async def settle(mw: ContextMiddleware, session_id: str) -> None:
    """Let a background writer finish (bounded: a deliberately hung one stays)."""
    await anyio.lowlevel.checkpoint()
    for _ in range(3):
        await mw.wait_for_writer(session_id, timeout=0.05)
        await anyio.lowlevel.checkpoint()


def body_text(message: Message) -> str:
    """The rebuild body part of a boundary message, stored or as sent (R4.4)."""
    (body,) = [
        p.text for p in message.parts if isinstance(p, TextPart) and p.text.startswith(BODY_INTRO)
    ]
    return body


@pytest.fixture(params=["sqlite", "postgres"])
async def shared(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SharedStore]:
    """A store several worker processes share: one SQLite file, or one PostgreSQL schema."""
    if request.param == "sqlite":
        path = tmp_path / "shared.db"
        sqlite = await SQLiteStore.open(path)
        yield SharedStore(sqlite, {"kind": "sqlite", "path": str(path)}, tmp_path)
        await sqlite.aclose()
        return
    from tests.pg_support import SchemaNames, require_pg_dsn

    names = SchemaNames(require_pg_dsn())
    from mimo_ctx.store.postgres import PostgresStore

    schema = names.new()
    pg = await PostgresStore.open(names.dsn, schema=schema, create_schema=True)
    try:
        yield SharedStore(pg, {"kind": "postgres", "dsn": names.dsn, "schema": schema}, tmp_path)
    finally:
        await pg.aclose()
        names.drop_all()
