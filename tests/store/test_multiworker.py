"""Several workers on one PostgreSQL store: the middleware end to end (issue 11).

Every worker is an OS process (tests/store/multiworker_worker.py) with its own
:class:`ContextMiddleware`, :class:`PostgresStore` pool and
:class:`PostgresWriterLease`; the workers share the memory root, as a deployment
shares a volume. The guarantees under test:

* **Once per usage across workers** (SPEC R1.4, R4): two processes x 50
  concurrent ``prepare()`` calls on a session whose last assistant usage is over
  the trigger line insert exactly one boundary, and run the checkpoint writer
  once (SPEC A3: the lease).
* **A crashed writer is taken over** (SPEC A3, R3.2): a worker killed (SIGKILL)
  while its writer holds the session's lease blocks nobody for good; another
  worker's rebuild waits for the lease to lapse, writes the checkpoint itself
  and inserts the boundary. Nothing is lost.

The server comes from ``MIMO_CTX_PG_DSN``; without one these tests skip, except
under ``CI=true`` (see tests/pg_support.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from mimo_ctx.checkpoint import WriterLease
from mimo_ctx.events import Event, WriterStarted
from mimo_ctx.memory import write_text_atomic
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import Message, TextPart, TokenUsage, ToolPart, ToolStateCompleted, ToolTime
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import Session
from mimo_ctx.testing import filler_text
from tests.pg_support import IN_CI, SchemaNames, require_pg_dsn

try:
    from mimo_ctx.store.postgres import PostgresStore, PostgresWriterLease

    from .multiworker_worker import LIMITS, USABLE, config
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    if IN_CI:
        raise
    pytest.skip(
        f'PostgreSQL tests need asyncpg (pip install "mimo-ctx[postgres]"): {exc}',
        allow_module_level=True,
    )

REPO_ROOT = Path(__file__).resolve().parents[2]
T0 = 1_750_000_000_000
TTL = 2.0  # seconds: a killed worker's lease lapses quickly


@pytest.fixture
def schemas() -> Iterator[SchemaNames]:
    names = SchemaNames(require_pg_dsn())
    yield names
    names.drop_all()


@pytest.fixture
async def pg_store(schemas: SchemaNames) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(schemas.dsn, schema=schemas.new(), create_schema=True)
    yield store
    await store.aclose()


def history(session_id: str, *, rounds: int = 24) -> list[Message]:
    """A user request and tool rounds; the last assistant usage is over the line."""
    messages = [
        Message(
            session_id=session_id,
            role="user",
            time_created=T0,
            parts=[TextPart(text="Refactor every module. Never touch tests.")],
        )
    ]
    for i in range(rounds):
        at = T0 + 1 + i
        usage = USABLE + 500 if i == rounds - 1 else (i + 1) * 3500
        messages.append(
            Message(
                session_id=session_id,
                role="assistant",
                time_created=at,
                time_completed=at,
                finish="tool-calls",
                usage=TokenUsage(input=usage),
                parts=[
                    ToolPart(
                        call_id=f"call_{i}",
                        tool="read",
                        state=ToolStateCompleted(
                            input={"file_path": f"src/m{i}.py"},
                            output=filler_text(4000, seed=i),
                            time=ToolTime(start=at, end=at),
                        ),
                    )
                ],
            )
        )
    return messages


def _spawn(mode: str, cfg: dict[str, Any]) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.store.multiworker_worker", mode, json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )


async def _read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    with anyio.fail_after(120):
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
    if not line:
        _, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
        pytest.fail(f"worker exited early (code {proc.returncode}): {err}")
    return line.strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def _worker_config(store: PostgresStore, session_id: str, tmp_path: Path, n: int) -> dict[str, Any]:
    return {
        "dsn": store.dsn,
        "schema": store.schema,
        "session_id": session_id,
        "memory_root": str(tmp_path / "shared-memory"),
        "index": str(tmp_path / f"worker-{n}" / "memory-index.sqlite3"),
        "ttl": TTL,
        "count": 50,
    }


def test_postgres_lease_is_a_writer_lease(schemas: SchemaNames) -> None:
    lease: WriterLease = PostgresWriterLease(PostgresStore(schemas.dsn))  # static check too
    assert isinstance(lease, WriterLease)


@pytest.mark.parametrize("checkpoint", ["none-yet", "on-disk"])
async def test_r1_4_a3_two_processes_50_concurrent_prepares_one_boundary(
    pg_store: PostgresStore, tmp_path: Path, checkpoint: str
) -> None:
    """Two worker processes x 50 concurrent prepare() on one session over the
    trigger line: exactly one boundary for that usage, every view starts at it,
    and the checkpoint writer ran once across both workers (when the rebuild had
    to write the checkpoint first) -- the other worker waited for it through the
    lease instead of writing its own or falling back to a plain compaction."""
    session = Session(time_created=T0 - 1)
    await pg_store.create_session(session)
    messages = history(session.id)
    await pg_store.append_messages(messages)
    if checkpoint == "on-disk":
        memory_root = tmp_path / "shared-memory"
        path = memory_root / "sessions" / session.id / "checkpoint.md"
        await write_text_atomic(path, "Topic: refactoring\n\n## Active intent\nRefactor.\n")
        await pg_store.set_watermark(session.id, messages[12].id)
    count = await pg_store.count_messages(session.id)

    procs = [_spawn("prepare", _worker_config(pg_store, session.id, tmp_path, n)) for n in range(2)]
    try:
        for proc in procs:
            assert await _read_line(proc) == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(await _read_line(proc)) for proc in procs]
        for proc in procs:
            assert await anyio.to_thread.run_sync(lambda p=proc: p.wait(timeout=120)) == 0
    finally:
        for proc in procs:
            _stop(proc)

    views = [v for r in results for v in r["views"]]
    assert len(views) == 100
    outcomes = sorted(v["outcome"] for v in views if v["outcome"] is not None)
    assert outcomes in (["rebuilt"], ["already-recovered", "rebuilt"])
    stored = await pg_store.list_messages(session.id, agent=None)
    (boundary,) = [m for m in stored if m.is_boundary]
    assert {v["boundary_id"] for v in views} == {boundary.id}
    assert len(stored) == count + 1  # nothing lost, nothing doubled
    writer_runs = [reason for r in results for reason in r["writer_runs"]]
    assert len(writer_runs) == (1 if checkpoint == "none-yet" else 0)
    checkpoint_part = boundary.checkpoint_part
    assert checkpoint_part is not None
    assert checkpoint_part.covered_up_to == await pg_store.get_watermark(session.id)


async def test_a3_worker_killed_holding_the_writer_lease_is_taken_over(
    pg_store: PostgresStore, tmp_path: Path
) -> None:
    """A worker's rebuild takes the writer lease and its writer runs; the worker
    is killed (SIGKILL: no release, no cleanup). Another worker's rebuild cannot
    write while the lease lives, learns when it lapses (one ttl after the last
    renewal), writes the checkpoint itself and inserts the boundary. Every
    message is still there, plus the boundary."""
    session = Session(time_created=T0 - 1)
    await pg_store.create_session(session)
    await pg_store.append_messages(history(session.id))
    count = await pg_store.count_messages(session.id)
    lease = PostgresWriterLease(pg_store)
    try:
        proc = _spawn("hang", _worker_config(pg_store, session.id, tmp_path, 0))
        try:
            assert await _read_line(proc) == "holding"
            holder = await lease.holder(session.id)
            assert holder is not None
            assert f":{proc.pid}:" in holder.owner  # the dying worker holds it
            proc.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
        finally:
            _stop(proc)
        assert proc.returncode == -signal.SIGKILL
        # The dead worker left no checkpoint and no watermark behind.
        assert await pg_store.get_watermark(session.id) is None

        events: list[Event] = []
        async with (
            MemoryIndex(tmp_path / "worker-1" / "memory-index.sqlite3") as index,
            ContextMiddleware(
                pg_store,
                tmp_path / "shared-memory",
                model=LIMITS,
                config=config(TTL),
                on_event=events.append,
                memory_index=index,
                writer_lease=lease,
            ) as survivor,
        ):
            with anyio.fail_after(120):
                view = await survivor.prepare(session.id)
    finally:
        await lease.aclose()

    assert view.rebuild is not None
    assert view.rebuild.outcome == "rebuilt"
    (started,) = [e for e in events if isinstance(e, WriterStarted)]
    assert "take over" in started.reason
    watermark = await pg_store.get_watermark(session.id)
    assert watermark is not None
    assert watermark == view.rebuild.watermark
    checkpoint = tmp_path / "shared-memory" / "sessions" / session.id / "checkpoint.md"
    assert checkpoint.read_text(encoding="utf-8").strip()
    stored = await pg_store.list_messages(session.id, agent=None)
    assert len(stored) == count + 1
    assert [m.id for m in stored if m.is_boundary] == [view.boundary_id]
    taken = await PostgresWriterLease(pg_store).holder(session.id)
    assert taken is None  # the survivor released its lease
