"""Two worker processes serve alternate runs of one framework conversation (issue 16).

A pydantic-ai agent and a LangChain agent, each with mimo_ctx, run in two OS
processes of their own (tests/integrations/_framework_worker.py) on one store, a
SQLite file or a PostgreSQL schema. The host hands turn after turn to one worker
then the other, every run with the whole history the framework returned last; a
tool round every fifth turn. After 50 turns: nothing raised, every message of the
conversation is stored exactly once, in order, every tool call once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mimo_ctx.messages import Message, TextPart, ToolPart, ToolResultPart
from mimo_ctx.store import SQLiteStore, Store
from tests.pg_support import SchemaNames, require_pg_dsn
from tests.worker_process import WorkerProcess

HERE = Path(__file__).resolve().parent
SID = "s-workers"
TURNS = 50


class _Worker(WorkerProcess):
    """An agent with mimo_ctx in its own OS process."""

    def __init__(self, framework: str, store: str, memory: Path) -> None:
        super().__init__(HERE / "_framework_worker.py", framework, store, SID, str(memory))

    def run(self, history: list[Any], prompt: str, turn: int, tool: bool) -> list[Any]:
        request = {"history": history, "prompt": prompt, "turn": turn, "tool": tool}
        out: list[Any] = self.ask(request)["history"]
        return out


def _alternate(framework: str, store: str, memory: Path) -> list[Any]:
    workers = [_Worker(framework, store, memory / str(n)) for n in range(2)]
    history: list[Any] = []
    try:
        for turn in range(TURNS):
            grown = workers[turn % 2].run(history, f"Turn {turn}.", turn, turn % 5 == 4)
            assert grown[: len(history)] == history  # the framework's own list is untouched
            history = grown
    finally:
        for worker in workers:
            worker.close()
    return history


def _user_texts(stored: list[Message]) -> list[str]:
    return [
        "".join(p.text for p in m.parts if isinstance(p, TextPart))
        for m in stored
        if m.role == "user"
    ]


async def _check_pydantic_ai(store: Store, history: list[Any]) -> None:
    stored = await store.list_messages(SID)
    assert await store.count_messages(SID) == len(stored)
    assert _user_texts(stored) == [f"Turn {t}." for t in range(TURNS)]
    answers = [m for m in history if m["kind"] == "response"]
    assert len([m for m in stored if m.role == "assistant"]) == len(answers)
    calls = [p.call_id for m in stored for p in m.parts if isinstance(p, ToolPart)]
    assert calls == [f"call_{t}" for t in range(TURNS) if t % 5 == 4]
    results = [p.call_id for m in stored for p in m.parts if isinstance(p, ToolResultPart)]
    assert results == calls


async def _check_langchain(store: Store, history: list[Any]) -> None:
    stored = await store.list_messages(SID)
    assert await store.count_messages(SID) == len(stored) == len(history)
    assert _user_texts(stored) == [f"Turn {t}." for t in range(TURNS)]
    assert [m.role for m in stored] == [
        {"human": "user", "ai": "assistant", "tool": "tool"}[m["type"]] for m in history
    ]
    calls = [p.call_id for m in stored for p in m.parts if isinstance(p, ToolPart)]
    assert calls == [f"call_{t}" for t in range(TURNS) if t % 5 == 4]
    results = [p.call_id for m in stored for p in m.parts if isinstance(p, ToolResultPart)]
    assert results == calls


_CHECKS: dict[str, Callable[[Store, list[Any]], Any]] = {
    "pydantic-ai": _check_pydantic_ai,
    "langchain": _check_langchain,
}


@pytest.fixture
def pg_schema() -> Iterator[tuple[str, str]]:
    names = SchemaNames(require_pg_dsn())
    try:
        yield names.dsn, names.new()
    finally:
        names.drop_all()


@pytest.mark.parametrize("framework", ["pydantic-ai", "langchain"])
def test_two_worker_processes_on_one_sqlite_file(framework: str, tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    history = _alternate(framework, f"sqlite:{path}", tmp_path / "memory")

    async def check() -> None:
        async with SQLiteStore(path) as store:
            await _CHECKS[framework](store, history)

    anyio.run(check)


@pytest.mark.parametrize("framework", ["pydantic-ai", "langchain"])
def test_two_worker_processes_on_one_postgres_schema(
    framework: str, tmp_path: Path, pg_schema: tuple[str, str]
) -> None:
    dsn, schema = pg_schema
    history = _alternate(framework, f"pg:{schema}", tmp_path / "memory")

    async def check() -> None:
        from mimo_ctx.store.postgres import PostgresStore

        async with await PostgresStore.open(dsn, schema=schema) as store:
            await _CHECKS[framework](store, history)

    anyio.run(check)
