"""The SQLite worker thread: hand-off, order, errors, cancellation, idle end, other loops."""

# The worker's own plumbing (its job runner, thread, connection) is what is tested.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

import mimo_ctx._sqlite_worker as worker_module
from mimo_ctx._sqlite_worker import SQLiteWorker
from mimo_ctx.errors import StoreError
from mimo_ctx.store.sqlite import SQLiteStore
from tests.store.builders import T0, make_session, user


class _Worker(SQLiteWorker):
    def __init__(self, path: str | Path = ":memory:") -> None:
        super().__init__(path, label="test worker")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute("CREATE TABLE IF NOT EXISTS log (n INTEGER)")
        return conn


def _logged(conn: sqlite3.Connection) -> list[int]:
    return [int(r[0]) for r in conn.execute("SELECT n FROM log ORDER BY rowid")]


async def test_jobs_run_on_one_worker_thread_in_the_order_they_were_queued() -> None:
    async with _Worker() as worker:
        threads: set[int] = set()
        entered, release = threading.Event(), threading.Event()

        def hold(_conn: sqlite3.Connection) -> None:
            entered.set()
            release.wait(10)

        def insert(n: int) -> Callable[[sqlite3.Connection], None]:
            def job(conn: sqlite3.Connection) -> None:
                threads.add(threading.get_ident())
                conn.execute("INSERT INTO log (n) VALUES (?)", (n,))

            return job

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker._run, hold)
            await anyio.to_thread.run_sync(entered.wait, 10)
            # Queued while the thread is busy: they run afterwards, first queued first.
            for n in range(20):
                tg.start_soon(worker._run, insert(n))
                await anyio.lowlevel.checkpoint()
            release.set()
        assert await worker._run(_logged) == list(range(20))
        assert len(threads) == 1
        assert threading.get_ident() not in threads


async def test_an_error_in_the_job_is_raised_in_the_caller_and_the_worker_goes_on() -> None:
    async with _Worker() as worker:

        def fail(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO missing_table VALUES (1)")

        with pytest.raises(StoreError, match="missing_table"):
            await worker._run(fail)

        def boom(_conn: sqlite3.Connection) -> None:
            raise ValueError("not an SQLite error")

        with pytest.raises(ValueError, match="not an SQLite error"):
            await worker._run(boom)
        await worker._run(lambda conn: conn.execute("INSERT INTO log (n) VALUES (7)"))
        assert await worker._run(_logged) == [7]


async def test_a_failed_store_write_raises_in_the_caller_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        session = make_session()
        await store.create_session(session)
        kept = user(session.id, "a", t=T0)
        await store.upsert_messages([kept])
        stray = user("ses_unknown", "b", t=T0 + 1)
        with pytest.raises(StoreError, match="unknown session"):
            await store.upsert_messages([stray])
        after = user(session.id, "c", t=T0 + 2)
        await store.upsert_messages([after])
    async with SQLiteStore(path) as reopened:
        stored = await reopened.list_messages(session.id)
    assert [m.id for m in stored] == [kept.id, after.id]


async def test_a_caller_cancelled_while_queued_withdraws_its_job() -> None:
    async with _Worker() as worker:
        entered, release = threading.Event(), threading.Event()

        def hold(_conn: sqlite3.Connection) -> None:
            entered.set()
            release.wait(10)

        ran = threading.Event()

        def job(conn: sqlite3.Connection) -> None:
            ran.set()
            conn.execute("INSERT INTO log (n) VALUES (1)")

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker._run, hold)
            await anyio.to_thread.run_sync(entered.wait, 10)
            with anyio.CancelScope() as scope:
                tg.start_soon(release_later, release, scope)
                await worker._run(job)
            assert scope.cancelled_caught
        assert await worker._run(_logged) == []
        assert not ran.is_set()


async def release_later(release: threading.Event, scope: anyio.CancelScope) -> None:
    await anyio.sleep(0.05)
    scope.cancel()  # the job is still queued behind the held one
    await anyio.sleep(0.05)
    release.set()


async def test_a_caller_cancelled_while_its_job_runs_waits_for_it_to_finish() -> None:
    async with _Worker() as worker:
        entered, release = threading.Event(), threading.Event()

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO log (n) VALUES (1)")
            entered.set()
            release.wait(10)
            conn.execute("INSERT INTO log (n) VALUES (2)")
            conn.execute("COMMIT")

        finished_before_cancel_returned: list[bool] = []

        async def cancel_when_running(scope: anyio.CancelScope) -> None:
            await anyio.to_thread.run_sync(entered.wait, 10)
            scope.cancel()
            await anyio.sleep(0.05)
            release.set()

        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:
                tg.start_soon(cancel_when_running, scope)
                await worker._run(job)
            finished_before_cancel_returned.append(release.is_set())
            assert scope.cancelled_caught
        assert finished_before_cancel_returned == [True]
        assert await worker._run(_logged) == [1, 2]


async def test_the_thread_ends_when_idle_and_starts_again_with_the_next_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_module, "_THREAD_IDLE", 0.05)
    async with _Worker() as worker:
        first = await worker._run(lambda _conn: threading.get_ident())
        thread = worker._thread
        assert thread is not None
        await anyio.to_thread.run_sync(thread.join, 5)
        assert worker._thread is None
        assert threading.get_ident() != first
        await worker._run(lambda conn: conn.execute("INSERT INTO log (n) VALUES (3)"))
        assert worker._thread is not None
        # The connection outlives the thread: what was written is still there.
        assert await worker._run(_logged) == [3]


async def test_callers_on_other_event_loops_get_their_own_results(tmp_path: Path) -> None:
    worker = _Worker(tmp_path / "shared.db")
    results: dict[int, list[int]] = {}

    def other_loop(n: int) -> None:
        async def main() -> None:
            for i in range(20):
                await worker._run(
                    lambda conn, i=i: conn.execute("INSERT INTO log (n) VALUES (?)", (n * 100 + i,))
                )
            results[n] = await worker._run(
                lambda conn: [
                    int(r[0])
                    for r in conn.execute(
                        "SELECT n FROM log WHERE n / 100 = ? ORDER BY rowid", (n,)
                    )
                ]
            )

        anyio.run(main)

    threads = [threading.Thread(target=other_loop, args=(n,)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        await anyio.to_thread.run_sync(t.join, 30)
    await worker.aclose()
    assert results == {n: [n * 100 + i for i in range(20)] for n in (1, 2, 3)}


async def test_calls_after_aclose_raise_and_queued_ones_are_refused() -> None:
    worker = _Worker()
    await worker._run(lambda conn: conn.execute("INSERT INTO log (n) VALUES (1)"))
    thread = worker._thread
    assert thread is not None
    await worker.aclose()
    # Closed: the thread ends at once rather than after its idle wait.
    await anyio.to_thread.run_sync(thread.join, 2)
    assert not thread.is_alive()
    assert worker._thread is None
    await worker.aclose()
    with pytest.raises(StoreError, match="closed"):
        await worker._run(_logged)
    assert worker._conn is None
