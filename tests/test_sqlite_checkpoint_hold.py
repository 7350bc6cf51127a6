"""A checkpoint hold keeps the SQLite worker's idle checkpoint out of a model call.

While a hold is outstanding (a wrapped call between its two writes, the SDK
building its request), the idle checkpoint waits; it runs once the last hold is
released, after the usual idle time. Nothing is lost: the checkpoint by count is
never held, no hold outlasts the limit, and closing ignores the holds. Observed
through the thread's checkpoint calls and on the files (a checkpoint copies the
log's pages into the main file).
"""

# The thresholds are the module's; the tests set them to make each rule show.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

import mimo_ctx._sqlite_worker as worker_module
from mimo_ctx._sqlite_worker import CheckpointHold, SQLiteWorker
from mimo_ctx.store.sqlite import SQLiteStore
from tests.store.builders import T0, make_session, user


def _main_size(path: Path) -> int:
    return path.stat().st_size


def _log_size(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


@pytest.fixture
def checkpoints(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each checkpoint of a worker thread started (monotonic seconds), listed
    once it is over."""
    runs: list[float] = []
    original = SQLiteWorker._checkpoint

    def spy(self: SQLiteWorker) -> None:
        started = time.monotonic()
        original(self)
        runs.append(started)

    monkeypatch.setattr(SQLiteWorker, "_checkpoint", spy)
    monkeypatch.setattr(worker_module, "CHECKPOINT_IDLE", 0.05)
    return runs


async def _write(store: SQLiteStore, session_id: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        # ~4 KB: the row spills into overflow pages, a checkpoint grows the main file.
        await store.upsert_messages([user(session_id, f"message {i} " + "x" * 4000, t=T0 + i)])


async def _wait_for(runs: list[float], count: int, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(runs) >= count:
            return
        await anyio.sleep(0.01)


async def _opened(path: Path) -> tuple[SQLiteStore, str]:
    store = SQLiteStore(path)
    await store.__aenter__()
    session = make_session()
    await store.create_session(session)
    return store, session.id


async def test_a_held_checkpoint_runs_after_the_release(
    tmp_path: Path, checkpoints: list[float]
) -> None:
    path = tmp_path / "agent.db"
    store, sid = await _opened(path)
    try:
        await _wait_for(checkpoints, 1)  # the session's own write, checkpointed idle
        runs = len(checkpoints)
        main_before = _main_size(path)
        hold = store.hold_checkpoints()
        await _write(store, sid, 3)
        await anyio.sleep(0.4)  # eight idle delays: each would have checkpointed
        assert len(checkpoints) == runs
        assert _main_size(path) == main_before
        released = time.monotonic()
        hold.release()
        await _wait_for(checkpoints, runs + 1)
        assert len(checkpoints) == runs + 1
        # After the idle delay counted from the release, not at once.
        assert checkpoints[-1] - released >= 0.04
        assert _main_size(path) > main_before
    finally:
        await store.aclose()


async def test_every_hold_must_end_and_a_second_release_does_nothing(
    tmp_path: Path, checkpoints: list[float]
) -> None:
    store, sid = await _opened(tmp_path / "agent.db")
    try:
        await _wait_for(checkpoints, 1)
        runs = len(checkpoints)
        first, second = store.hold_checkpoints(), store.hold_checkpoints()
        await _write(store, sid, 2)
        first.release()
        first.release()  # not a release of the second hold
        await anyio.sleep(0.3)
        assert len(checkpoints) == runs
        with second:
            pass
        await _wait_for(checkpoints, runs + 1)
        assert len(checkpoints) == runs + 1
        assert store._holds == 0
    finally:
        await store.aclose()


async def test_no_hold_outlasts_the_limit(
    tmp_path: Path, checkpoints: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_HOLD_LIMIT", 0.3)
    # An inline write under a hold leaves the idle thread asleep until its own
    # timeout (see _wake): the limit counts once it looks.
    monkeypatch.setattr(worker_module, "_THREAD_IDLE", 0.2)
    store, sid = await _opened(tmp_path / "agent.db")
    try:
        await _wait_for(checkpoints, 1)
        runs = len(checkpoints)
        taken = time.monotonic()
        store.hold_checkpoints()  # never released: a call that never ends
        await _write(store, sid, 2)
        await _wait_for(checkpoints, runs + 1)
        assert len(checkpoints) == runs + 1
        assert checkpoints[-1] - taken >= 0.29
    finally:
        await store.aclose()


async def test_the_checkpoint_by_count_is_never_held(
    tmp_path: Path, checkpoints: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_WRITES", 4)
    path = tmp_path / "agent.db"
    store, sid = await _opened(path)
    try:
        await _wait_for(checkpoints, 1)
        runs = len(checkpoints)
        with store.hold_checkpoints():
            # Inline writes leave the count to the thread: hand every write to it.
            for i in range(12):
                await store._run(lambda _conn: None)
                await store.upsert_messages([user(sid, f"m{i} " + "x" * 4000, t=T0 + i)])
            assert len(checkpoints) > runs
        assert await store.count_messages(sid) == 12
    finally:
        await store.aclose()


async def test_closing_ignores_the_holds_and_keeps_every_write(
    tmp_path: Path, checkpoints: list[float]
) -> None:
    path = tmp_path / "agent.db"
    store, sid = await _opened(path)
    hold = store.hold_checkpoints()
    await _write(store, sid, 5)
    with anyio.fail_after(5):
        await store.aclose()  # does not wait for the hold
    hold.release()  # after the close: nothing to wake, nothing raised
    # The last connection's close copied the log into the main file.
    assert _log_size(path) == 0
    async with SQLiteStore(path) as again:
        assert await again.count_messages(sid) == 5


async def test_a_hold_of_nothing_releases_quietly() -> None:
    hold = CheckpointHold(None)
    hold.release()
    with hold:
        pass


async def test_an_inline_write_under_a_hold_leaves_the_thread_asleep(
    tmp_path: Path, checkpoints: list[float]
) -> None:
    store, sid = await _opened(tmp_path / "agent.db")
    try:
        await _wait_for(checkpoints, 1)  # the thread now waits without a checkpoint due
        runs = len(checkpoints)
        with store.hold_checkpoints():
            await _write(store, sid, 1)
            # No wake-up queued for the thread: the release is the one that wakes it.
            assert store._parked
            assert store._jobs.empty()
        assert not store._parked
        await _wait_for(checkpoints, runs + 1)
        assert len(checkpoints) == runs + 1
    finally:
        await store.aclose()
