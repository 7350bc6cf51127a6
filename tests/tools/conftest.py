"""Fixtures of the tool tests: a memory root, stores, and two sessions in one store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import Message, TextPart, ToolPart, ToolStateCompleted, ToolTime
from mimo_ctx.store import Actor, InMemoryStore, Session, SQLiteStore, Store, Task
from mimo_ctx.tools import SessionTools

T0 = 1_750_000_000_000
"""A fixed epoch-ms origin for test timestamps."""


@dataclass
class World:
    """Two sessions (A in project ``proj``, B in project ``other``) in one store."""

    store: Store
    layout: MemoryLayout
    a: str
    b: str
    a_messages: list[Message]
    b_messages: list[Message]
    tools_a: SessionTools
    tools_b: SessionTools


def text_message(session_id: str, role: str, text: str, *, t: int, agent: str = "main") -> Message:
    """A user or assistant message with one text part."""
    return Message.model_validate(
        {
            "session_id": session_id,
            "role": role,
            "agent": agent,
            "time_created": t,
            "finish": "stop" if role == "assistant" else None,
            "parts": [TextPart(text=text)],
        }
    )


def tool_message(session_id: str, *, t: int, output: str, compacted: bool) -> Message:
    """An assistant message with one completed ``bash`` call (optionally compacted)."""
    state = ToolStateCompleted(
        input={"cmd": "cat build.log"},
        output=output,
        time=ToolTime(start=t, end=t + 1, compacted=t + 2 if compacted else None),
    )
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=t,
        finish="tool-calls",
        parts=[TextPart(text="let me look"), ToolPart(call_id="call_1", tool="bash", state=state)],
    )


def make_task(session_id: str, task_id: str, status: str = "open", summary: str = "") -> Task:
    """A task of ``session_id``."""
    return Task.model_validate(
        {
            "id": task_id,
            "session_id": session_id,
            "parent_id": task_id.rpartition(".")[0] or None,
            "status": status,
            "summary": summary or f"task {task_id}",
            "time_created": T0,
            "time_updated": T0,
        }
    )


def make_actor(session_id: str, actor_id: str, status: str = "running") -> Actor:
    """A background actor of ``session_id``."""
    return Actor.model_validate(
        {
            "id": actor_id,
            "session_id": session_id,
            "agent": "explorer",
            "description": f"actor {actor_id}",
            "status": status,
            "time_created": T0,
            "time_last_activity": T0 + 1000,
        }
    )


@pytest.fixture
def layout(tmp_path: Path) -> MemoryLayout:
    """A memory layout on a fresh directory (the root itself is created)."""
    root = tmp_path / "memory"
    root.mkdir()
    return MemoryLayout(root)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A fresh store of each implementation."""
    s: Store = InMemoryStore() if request.param == "memory" else await SQLiteStore.open(":memory:")
    yield s
    await s.aclose()


@pytest.fixture
async def world(store: Store, layout: MemoryLayout) -> AsyncIterator[World]:
    """Sessions A and B with messages, tasks, actors and memory files of their own."""
    a = Session(id="ses_a", project_id="proj", time_created=T0)
    b = Session(id="ses_b", project_id="other", time_created=T0)
    await store.create_session(a)
    await store.create_session(b)
    a_messages = [
        text_message(a.id, "user", "please fix the build", t=T0 + 10),
        tool_message(a.id, t=T0 + 20, output="ERROR line 42: missing semicolon", compacted=True),
        text_message(a.id, "assistant", "fixed the semicolon", t=T0 + 30),
        text_message(a.id, "user", "now run the tests", t=T0 + 40),
        text_message(a.id, "assistant", "all tests pass", t=T0 + 50),
    ]
    b_messages = [text_message(b.id, "user", "secret of session b: platypus", t=T0 + 15)]
    await store.append_messages([*a_messages, *b_messages])
    for task in (
        make_task(a.id, "T1", "in_progress", "fix the build"),
        make_task(a.id, "T1.1", "done", "find the error"),
        make_task(a.id, "T2"),
        make_task(b.id, "T9", summary="b's task"),
        make_task(b.id, "T1", summary="b's own T1"),
    ):
        await store.upsert_task(task)
    for actor in (
        make_actor(a.id, "act_a"),
        make_actor(a.id, "act_a_done", "completed"),
        make_actor(b.id, "act_b"),
    ):
        await store.upsert_actor(actor)
    layout.session_dir(a.id).mkdir(parents=True)
    layout.session_dir(b.id).mkdir(parents=True)
    layout.project_dir("proj").mkdir(parents=True)
    layout.project_dir("other").mkdir(parents=True)
    layout.global_dir().mkdir(parents=True)
    layout.notes_path(a.id).write_text("notes of a\nthe build uses make\n", encoding="utf-8")
    layout.notes_path(b.id).write_text("notes of b: platypus\n", encoding="utf-8")
    layout.project_memory_path("proj").write_text(
        "# Project memory\n\n## Rules\n- always run the linter\n- the deploy key lives in vault\n",
        encoding="utf-8",
    )
    layout.project_memory_path("other").write_text("# Other\nplatypus facts\n", encoding="utf-8")
    layout.global_memory_path().write_text("# Global\nprefer small commits\n", encoding="utf-8")
    tools_a = SessionTools(store, layout, a.id, a.project_id, clock=lambda: T0 + 61_000)
    tools_b = SessionTools(store, layout, b.id, clock=lambda: T0 + 61_000)
    yield World(store, layout, a.id, b.id, a_messages, b_messages, tools_a, tools_b)
    await tools_a.aclose()
    await tools_b.aclose()
