"""Concurrency (issue 10 §1): one boundary per usage under concurrent callers,
parallel sessions, and two OS processes sharing one SQLite file (SPEC R1.4, R4, A3).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.store import SQLiteStore, Store

from .conftest import LIMITS, SYSTEM, boundaries, fill_to_trigger

WORKER = Path(__file__).with_name("_process_worker.py")


async def test_r1_4_hundred_concurrent_prepares_insert_one_boundary(
    store: Store, tmp_path: Path
) -> None:
    """100 concurrent prepare() calls for one usage: exactly one boundary, one
    rebuild report, every view starts at that boundary, nothing else is written."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        before = await store.count_messages(session.id)
        views: list[RequestView] = []

        async def one() -> None:
            views.append(await mw.prepare(session.id))

        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(one)

        assert len(views) == 100
        reports = [v.rebuild for v in views if v.rebuild is not None]
        assert [r.outcome for r in reports] == ["rebuilt"]
        stored = await store.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1
        assert {v.boundary_id for v in views} == {boundaries(stored)[0].id}
        # Nothing deleted, nothing duplicated: exactly the boundary was added.
        assert await store.count_messages(session.id) == before + 1


async def test_r1_4_twenty_sessions_rebuild_in_parallel(store: Store, tmp_path: Path) -> None:
    """20 sessions, 5 concurrent prepares each, all at once: every session gets
    exactly one boundary of its own, every writer finishes, no lock is left held."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        sessions = [await mw.open_session(system=SYSTEM) for _ in range(20)]
        for session in sessions:
            await fill_to_trigger(mw, session.id, request=f"Task of {session.id}.")
        counts = {s.id: await store.count_messages(s.id) for s in sessions}
        views: dict[str, list[RequestView]] = {s.id: [] for s in sessions}

        async def one(session_id: str) -> None:
            views[session_id].append(await mw.prepare(session_id))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    for session in sessions:
                        tg.start_soon(one, session.id)

        for session in sessions:
            outcomes = [v.rebuild.outcome for v in views[session.id] if v.rebuild is not None]
            assert outcomes == ["rebuilt"], session.id
            stored = await store.list_messages(session.id, agent=None)
            (boundary,) = boundaries(stored)
            assert boundary.session_id == session.id
            assert f"Task of {session.id}." in boundary.parts[2].model_dump_json()
            assert await store.count_messages(session.id) == counts[session.id] + 1
            assert not mw.writer_running(session.id)
            assert not mw._sessions[session.id].lock.locked()  # pyright: ignore[reportPrivateUsage]


@pytest.mark.parametrize("barrier", [True, False], ids=["forced-race", "natural-race"])
async def test_r1_4_two_processes_share_one_sqlite_file(tmp_path: Path, barrier: bool) -> None:
    """Two OS processes, each with its own ContextMiddleware on the same SQLite file
    and memory root, cross the trigger line for the same usage while appending
    messages one write at a time. Exactly one boundary is inserted for that usage
    (the store's UNIQUE(session_id, usage_key) decides), no "database is locked"
    reaches either caller, and every appended message is stored.

    ``forced-race``: both processes are held inside ``commit_rebuild`` until both
    reached it, so both really try to commit for the same usage key."""
    db = tmp_path / "shared.db"
    memory_root = tmp_path / "mem"
    store = await SQLiteStore.open(db)
    async with ContextMiddleware(store, memory_root, model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
    before = await store.count_messages(session.id)
    await store.aclose()

    sync = tmp_path / "sync"
    sync.mkdir()
    workers, appends = 2, 100
    processes: list[anyio.abc.Process] = []
    outputs: list[str] = ["", ""]
    try:
        for index in range(workers):
            args = tmp_path / f"args{index}.json"
            args.write_text(
                json.dumps(
                    {
                        "index": index,
                        "workers": workers,
                        "sync_dir": str(sync),
                        "db": str(db),
                        "memory_root": str(memory_root),
                        "session_id": session.id,
                        "barrier": barrier,
                        "appends": appends,
                    }
                )
            )
            env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
            processes.append(
                await anyio.open_process([sys.executable, str(WORKER), str(args)], env=env)
            )

        async def read_all(index: int) -> None:
            stdout = processes[index].stdout
            assert stdout is not None
            async for chunk in stdout:
                outputs[index] += chunk.decode()
                if outputs[index].startswith("ready\n") and all(
                    o.startswith("ready\n") for o in outputs
                ):
                    (sync / "go").touch()

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for index in range(workers):
                    tg.start_soon(read_all, index)
            for process in processes:
                await process.wait()
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()

    reports = [json.loads(o.strip().splitlines()[-1]) for o in outputs]
    for report in reports:
        assert "error" not in report, report["error"]
    assert all(p.returncode == 0 for p in processes)
    if barrier:
        # Both reached the commit for the same usage; exactly one won.
        assert sorted(c for r in reports for c in r["commits"]) == [False, True]
    outcomes = sorted(str(o) for r in reports for o in r["outcomes"])
    assert outcomes.count("rebuilt") == 1
    assert set(outcomes) <= {"rebuilt", "already-recovered", "None"}

    async with SQLiteStore(db) as check:
        stored = await check.list_messages(session.id, agent=None)
        (boundary,) = boundaries(stored)
        assert {r["boundary_id"] for r in reports} == {boundary.id}
        ids = {m.id for m in stored}
        for report in reports:
            assert len(report["appended"]) == appends
            assert set(report["appended"]) <= ids  # no lost writes
        assert len(stored) == before + workers * appends + 1
