"""WAL checkpoints are the SQLite worker thread's own work, never a caller's commit's.

Observed on the files: SQLite's checkpoint copies the log's pages into the main
file, so the main file grows when (and only when) a checkpoint ran; the log
file only stays small when checkpoints keep letting the next write start it over.
"""

# The thresholds are the module's; the tests set them to make each rule show.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import pytest

import mimo_ctx._sqlite_worker as worker_module
from mimo_ctx.store.sqlite import SQLiteStore
from tests.store.builders import T0, make_session, user

_PAGE = 4096
_FRAME = _PAGE + 24  # a WAL frame: its header and one page


def _sizes(path: Path) -> tuple[int, int]:
    """The main file's and the log's sizes in bytes."""
    wal = Path(f"{path}-wal")
    return path.stat().st_size, wal.stat().st_size if wal.exists() else 0


async def _write(store: SQLiteStore, session_id: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        # ~4 KB of text: the row spills into overflow pages, a write adds ~10 frames.
        await store.upsert_messages([user(session_id, f"message {i} " + "x" * 4000, t=T0 + i)])


async def _main_file_grows(path: Path, than: int, seconds: float = 10.0) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        size = _sizes(path)[0]
        if size > than:
            return size
        await anyio.sleep(0.02)
    return _sizes(path)[0]


async def test_writes_leave_the_checkpoint_to_the_idle_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_IDLE", 0.5)
    monkeypatch.setattr(worker_module, "CHECKPOINT_WRITES", 10**6)
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        session = make_session()
        await store.create_session(session)
        await anyio.sleep(0.7)  # the schema's pages checkpointed while idle
        main_before, _ = _sizes(path)
        started = time.monotonic()
        await _write(store, session.id, 150)
        writing = time.monotonic() - started
        main_after, wal = _sizes(path)
        if writing < 0.4:  # no idle moment fell between the writes
            # More than SQLite's automatic 1,000 pages went into the log, and no
            # commit copied them into the main file.
            assert wal > 1_000 * _FRAME, wal
            assert main_after == main_before
        assert await _main_file_grows(path, main_before + 150 * _PAGE) > main_before + 150 * _PAGE
        assert await store.count_messages(session.id) == 150
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 150


async def test_the_log_stays_bounded_without_an_idle_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_IDLE", 60.0)
    monkeypatch.setattr(worker_module, "CHECKPOINT_WRITES", 16)
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        session = make_session()
        await store.create_session(session)
        largest = 0
        for block in range(20):
            await _write(store, session.id, 10, start=block * 10)
            largest = max(largest, _sizes(path)[1])
        # 16 writes of ~10-15 frames, plus the one that starts the log over.
        assert largest < 20 * 16 * _FRAME, largest
        assert _sizes(path)[0] > 200 * _PAGE  # the pages reached the main file
        assert await store.count_messages(session.id) == 200


async def test_a_reader_holding_the_log_delays_the_checkpoint_and_fails_no_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_IDLE", 0.05)
    monkeypatch.setattr(worker_module, "CHECKPOINT_WRITES", 4)
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        session = make_session()
        await store.create_session(session)
        await _write(store, session.id, 2)
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2
            # Checkpoints run (idle and by count) and cannot copy what the reader
            # may still need; every write succeeds regardless.
            for block in range(5):
                await _write(store, session.id, 8, start=2 + block * 8)
                await anyio.sleep(0.1)
            assert reader.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2
            main_pinned, _ = _sizes(path)
        finally:
            reader.execute("COMMIT")
            reader.close()
        await _write(store, session.id, 1, start=42)
        assert await _main_file_grows(path, main_pinned) > main_pinned
        assert await store.count_messages(session.id) == 43


async def test_the_change_feed_stays_known_across_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_IDLE", 0.05)
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        session = make_session()
        await store.create_session(session)
        _, seq = await store.changes_since(session.id, 0)
        main_before, _ = _sizes(path)
        await _write(store, session.id, 3)
        assert await _main_file_grows(path, main_before) > main_before
        # A job queued now runs after the checkpoint (the same thread): it is over.
        await store._run(lambda _conn: None)
        known = store.changes_known(session.id, seq)
        assert known is not None
        assert [m.parts for m in known[0]] == [
            m.parts for m in (await store.list_messages(session.id))
        ]


async def test_a_failing_checkpoint_fails_no_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_IDLE", 0.01)
    monkeypatch.setattr(worker_module, "CHECKPOINT_WRITES", 2)
    # Every checkpoint the thread tries raises inside SQLite.
    monkeypatch.setattr(worker_module, "_SQL_CHECKPOINT", "PRAGMA no_such_table_function()")
    attempts: list[int] = []
    checkpoint = worker_module.SQLiteWorker._checkpoint

    def counted(self: worker_module.SQLiteWorker) -> None:
        attempts.append(1)
        checkpoint(self)

    monkeypatch.setattr(worker_module.SQLiteWorker, "_checkpoint", counted)
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        session = make_session()
        await store.create_session(session)
        thread = store._thread
        for block in range(4):
            await _write(store, session.id, 3, start=block * 3)
            await anyio.sleep(0.05)
        assert await store.count_messages(session.id) == 12
        assert len(attempts) >= 4
        assert store._thread is thread  # the errors did not end the worker thread
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 12
