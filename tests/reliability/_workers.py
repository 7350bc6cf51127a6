"""Test-side machinery for several worker processes on one session (issue 17).

:func:`run_workers` starts one ``_session_worker`` process per script, waits until
every one is ready, lets them go together and returns their JSON reports.
:class:`SharedStore` is the store they share (an SQLite file or a PostgreSQL
schema) as the test process sees it, plus the spec the workers open it from.
:func:`seed_session` builds the session the scenarios start from.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc
import anyio.to_thread

from mimo_ctx.memory import write_text_atomic
from mimo_ctx.messages import Message, TextPart, TokenUsage, ToolPart, ToolStateCompleted, ToolTime
from mimo_ctx.store import Session, Store
from mimo_ctx.testing import filler_text

REPO_ROOT = Path(__file__).resolve().parents[2]
USABLE = 90_000


@dataclass
class SharedStore:
    """The store the workers share, and how they open it."""

    store: Store
    spec: dict[str, Any]
    root: Path

    @property
    def memory_root(self) -> Path:
        return self.root / "shared-memory"


async def seed_session(
    shared: SharedStore,
    *,
    rounds: int = 24,
    tokens: int = 4000,
    checkpoint: bool = True,
    final_usage: int = USABLE + 500,
) -> tuple[Session, list[Message]]:
    """A session whose last assistant usage is ``final_usage`` (over the trigger line).

    With ``checkpoint``, ``checkpoint.md`` is on disk and the watermark set (the
    middle of the history), so a rebuild needs no writer run first.
    """
    store = shared.store
    t0 = time.time_ns() // 1_000_000 - 10_000
    session = Session(time_created=t0 - 1)
    await store.create_session(session)
    messages = [
        Message(
            session_id=session.id,
            role="user",
            time_created=t0,
            parts=[TextPart(text="Refactor every module. Never touch tests.")],
        )
    ]
    for i in range(rounds):
        at = t0 + 1 + i
        usage = final_usage if i == rounds - 1 else (i + 1) * 3500
        messages.append(
            Message(
                session_id=session.id,
                role="assistant",
                time_created=at,
                time_completed=at,
                finish="tool-calls",
                usage=TokenUsage(input=usage),
                parts=[
                    TextPart(text=f"step seed-{i}"),
                    ToolPart(
                        call_id=f"call_seed_{i}",
                        tool="read",
                        state=ToolStateCompleted(
                            input={"file_path": f"src/seed-{i}.py"},
                            output=filler_text(tokens, seed=i),
                            time=ToolTime(start=at, end=at),
                        ),
                    ),
                ],
            )
        )
    await store.append_messages(messages)
    if checkpoint:
        path = shared.memory_root / "sessions" / session.id / "checkpoint.md"
        await write_text_atomic(path, "Topic: refactoring\n\n## Active intent\nRefactor.\n")
        await store.set_watermark(session.id, messages[rounds // 2].id)
    return session, messages


async def run_workers(
    shared: SharedStore,
    session_id: str,
    scripts: list[dict[str, Any]],
    *,
    within: float = 240,
) -> list[dict[str, Any]]:
    """Run one worker process per script until all are done; return their reports.

    A script holds ``steps`` and optionally ``hooks``, ``clock_offset_ms`` and
    ``writer`` (see ``_session_worker``).
    """
    root = shared.root
    sync = root / f"sync-{time.time_ns()}"
    sync.mkdir()
    processes: list[anyio.abc.Process] = []
    outputs = ["" for _ in scripts]
    errors = ["" for _ in scripts]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        for index, script in enumerate(scripts):
            args = root / f"args-{sync.name}-{index}.json"
            args.write_text(
                json.dumps(
                    {
                        "index": index,
                        "sync_dir": str(sync),
                        "store": shared.spec,
                        "memory_root": str(shared.memory_root),
                        "index_path": str(root / f"worker-{index}" / "memory-index.sqlite3"),
                        "session_id": session_id,
                        **script,
                    }
                )
            )
            processes.append(
                await anyio.open_process(
                    [sys.executable, "-m", "tests.reliability._session_worker", str(args)],
                    env=env,
                    cwd=REPO_ROOT,
                )
            )

        async def read(index: int) -> None:
            stdout = processes[index].stdout
            assert stdout is not None
            async for chunk in stdout:
                outputs[index] += chunk.decode()
                if all(o.startswith("ready\n") for o in outputs):
                    (sync / "go").touch()

        async def read_errors(index: int) -> None:
            stderr = processes[index].stderr
            assert stderr is not None
            async for chunk in stderr:
                errors[index] += chunk.decode(errors="replace")

        with anyio.fail_after(within):
            async with anyio.create_task_group() as tg:
                for index in range(len(scripts)):
                    tg.start_soon(read, index)
                    tg.start_soon(read_errors, index)
            for process in processes:
                await process.wait()
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
    reports: list[dict[str, Any]] = []
    for index, process in enumerate(processes):
        lines = outputs[index].strip().splitlines()
        failure = f"worker {index} exited {process.returncode}: {errors[index][-4000:]}"
        assert process.returncode == 0, failure
        assert lines, failure
        report = json.loads(lines[-1])
        assert "error" not in report, f"worker {index}: {report['error']}"
        reports.append(report)
    return reports


def step(report: dict[str, Any], op: str, nth: int = 0) -> dict[str, Any]:
    """The ``nth`` step of kind ``op`` a worker ran."""
    return [s for s in report["steps"] if s["op"] == op][nth]


async def rebuild_keys(shared: SharedStore, session_id: str) -> dict[str, str]:
    """The store's once-per-usage rows of a session: boundary id -> usage key."""
    if shared.spec["kind"] == "sqlite":
        import sqlite3

        def read() -> list[tuple[str, str]]:
            conn = sqlite3.connect(shared.spec["path"])
            try:
                rows = conn.execute(
                    "SELECT boundary_id, usage_key FROM rebuilds WHERE session_id = ?",
                    (session_id,),
                ).fetchall()
                return [(str(b), str(k)) for b, k in rows]
            finally:
                conn.close()

        return dict(await anyio.to_thread.run_sync(read))
    import asyncpg

    connect = cast("Callable[..., Awaitable[Any]]", asyncpg.connect)  # pyright: ignore[reportUnknownMemberType]
    conn = await connect(shared.spec["dsn"])
    try:
        rows: list[Any] = await conn.fetch(
            f'SELECT boundary_id, usage_key FROM "{shared.spec["schema"]}".rebuilds'
            " WHERE session_id = $1",
            session_id,
        )
        return {str(r[0]): str(r[1]) for r in rows}
    finally:
        await conn.close()
