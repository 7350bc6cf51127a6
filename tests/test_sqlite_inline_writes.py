"""Inline message writes of the SQLite store: on the caller's thread only when nothing waits.

Where a write ran is seen on the connection itself: a trace callback records the
thread that executes each ``COMMIT``.
"""

# The worker's plumbing (its connection, thresholds) is what is tested.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import mimo_ctx._sqlite_worker as worker_module
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import (
    Message,
    TextPart,
    ToolPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
)
from mimo_ctx.store.sqlite import SQLiteStore
from tests.store.builders import T0, assistant, make_session, user

_PAGE = 4096


def _commits(store: SQLiteStore) -> list[int]:
    """The thread of each ``COMMIT`` the store's connection runs from now on."""
    threads: list[int] = []

    def trace(statement: str) -> None:
        if statement == "COMMIT":
            threads.append(threading.get_ident())

    assert store._conn is not None
    store._conn.set_trace_callback(trace)
    return threads


def _size(path: Path) -> int:
    return path.stat().st_size


def _texts(messages: list[Message]) -> list[str]:
    return [p.text for m in messages for p in m.parts if isinstance(p, TextPart)]


async def _open(path: Path | str, **options: object) -> tuple[SQLiteStore, str]:
    store = await SQLiteStore.open(path, **options)  # pyright: ignore[reportArgumentType]
    session = make_session()
    await store.create_session(session)
    return store, session.id


async def test_a_small_write_commits_on_the_callers_thread(tmp_path: Path) -> None:
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        threads = _commits(store)
        first = user(sid, "hello", t=T0)
        await store.append_messages([first])
        await store.upsert_messages([assistant(sid, "hi", t=T0 + 1)])
        await store.upsert_messages([first.model_copy(update={"parts": [TextPart(text="hey")]})])
        assert threads == [threading.get_ident()] * 3
        assert _texts(await store.list_messages(sid)) == ["hey", "hi"]  # the update landed
    with sqlite3.connect(tmp_path / "agent.db") as raw:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2


async def test_the_first_write_opens_the_connection_on_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.db"
    store, sid = await _open(path)
    await store.aclose()
    opened_on: list[int] = []
    connect = SQLiteStore._connect

    def recorded(self: SQLiteStore) -> sqlite3.Connection:
        opened_on.append(threading.get_ident())
        return connect(self)

    monkeypatch.setattr(SQLiteStore, "_connect", recorded)
    async with SQLiteStore(path) as fresh:
        assert opened_on
        assert opened_on[0] != threading.get_ident()
        threads = _commits(fresh)
        await fresh.append_messages([user(sid, "a", t=T0)])
        assert threads == [threading.get_ident()]


async def test_a_write_lock_held_elsewhere_sends_the_write_to_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store, sid = await _open(path, busy_timeout=30.0)
    async with store:
        threads = _commits(store)
        holder = sqlite3.connect(path, isolation_level=None)
        ticks = 0
        written_at: list[float] = []
        released = 0.0

        async def tick() -> None:
            nonlocal ticks
            while not written_at:
                ticks += 1
                await anyio.sleep(0.01)

        async def write() -> None:
            await store.append_messages([user(sid, "waits for the lock", t=T0)])
            written_at.append(time.monotonic())

        try:
            holder.execute("BEGIN IMMEDIATE")
            async with anyio.create_task_group() as tg:
                tg.start_soon(tick)
                tg.start_soon(write)
                await anyio.sleep(0.4)
                # The loop kept running while the write waited on the thread.
                assert not written_at
                assert ticks >= 10
                released = time.monotonic()
                holder.execute("COMMIT")
        finally:
            holder.close()
        assert written_at[0] >= released
        assert len(threads) == 1
        assert threads[0] != threading.get_ident()
        # With the lock free again, the next write is inline.
        await store.append_messages([user(sid, "inline again", t=T0 + 1)])
        assert threads[1] == threading.get_ident()
        assert await store.count_messages(sid) == 2


async def test_writes_keep_their_order_between_inline_and_the_thread(tmp_path: Path) -> None:
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        threads = _commits(store)
        order: list[str] = []

        async def write(message: Message) -> None:
            order.append(message.id)
            await store.upsert_messages([message])

        def hold(_conn: sqlite3.Connection) -> None:
            time.sleep(0.05)

        async with anyio.create_task_group() as tg:
            for n in range(40):
                if n in (5, 20):  # a job on the thread: the writes after it queue behind
                    tg.start_soon(store._run, hold)
                    await anyio.lowlevel.checkpoint()
                tg.start_soon(write, user(sid, f"m{n}", t=T0 + 40 - n))
                if n % 3 == 0:
                    await anyio.lowlevel.checkpoint()
        stored = await store.list_messages(sid)
        by_write = sorted(stored, key=lambda m: m.insert_seq or 0)
        assert [m.id for m in by_write] == order
        me = threading.get_ident()
        assert me in threads  # both ways were taken
        assert any(t != me for t in threads)


async def test_a_cancelled_caller_writes_nothing(tmp_path: Path) -> None:
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.append_messages([user(sid, "never", t=T0)])
        assert scope.cancelled_caught
        assert await store.count_messages(sid) == 0


async def test_a_caller_cancelled_while_its_write_waits_for_the_lock_lets_it_finish(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.db"
    store, sid = await _open(path)
    async with store:
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")

            async def release_later(scope: anyio.CancelScope) -> None:
                await anyio.sleep(0.1)
                scope.cancel()  # the write runs on the thread, waiting for the lock
                await anyio.sleep(0.1)
                holder.execute("COMMIT")

            scope = anyio.CancelScope()
            async with anyio.create_task_group() as tg:
                with scope:
                    tg.start_soon(release_later, scope)
                    await store.append_messages([user(sid, "finished", t=T0)])
            assert scope.cancelled_caught
        finally:
            holder.close()
        # The transaction was never left half-done: it finished, whole.
        assert _texts(await store.list_messages(sid)) == ["finished"]


@pytest.mark.parametrize("how", ["full", "memory"])
async def test_full_synchronous_and_no_wal_never_write_inline(tmp_path: Path, how: str) -> None:
    if how == "full":
        store, sid = await _open(tmp_path / "agent.db", synchronous="FULL")
    else:
        store, sid = await _open(":memory:")
    async with store:
        threads = _commits(store)
        for n in range(3):
            await store.upsert_messages([user(sid, f"m{n}", t=T0 + n)])
        assert len(threads) == 3
        assert threading.get_ident() not in threads


def _big_input(sid: str) -> list[Message]:
    # Nothing the text count sees: the payload's size sends it to the thread.
    message = Message(
        session_id=sid,
        role="assistant",
        time_created=T0,
        parts=[
            ToolPart(
                call_id="c1",
                tool="write",
                state=ToolStatePending(input={"content": "x" * 100_000}),
            )
        ],
    )
    return [message]


def _tool_state(sid: str, state: ToolStateCompleted | ToolStateError) -> list[Message]:
    part = ToolPart(call_id="c1", tool="read", state=state)
    return [Message(session_id=sid, role="assistant", time_created=T0, parts=[part])]


def _long_output(sid: str) -> list[Message]:
    return _tool_state(sid, ToolStateCompleted(output="x" * 100_000))


def _long_error(sid: str) -> list[Message]:
    return _tool_state(sid, ToolStateError(error="x" * 100_000))


def _long_text(sid: str) -> list[Message]:
    return [user(sid, "x" * 100_000, t=T0)]


def _many(sid: str) -> list[Message]:
    return [user(sid, f"m{n}", t=T0 + n) for n in range(5)]


@pytest.mark.parametrize(
    "batch",
    [_long_text, _big_input, _long_output, _long_error, _many],
    ids=["long text", "long tool input", "long tool output", "long tool error", "many"],
)
async def test_large_writes_go_to_the_thread(
    tmp_path: Path, batch: Callable[[str], list[Message]]
) -> None:
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        threads = _commits(store)
        messages = batch(sid)
        await store.append_messages(messages)
        assert len(threads) == 1
        assert threads[0] != threading.get_ident()
        assert await store.count_messages(sid) == len(messages)


async def _failures(path: Path, **options: object) -> tuple[list[str], int]:
    """The errors of failing writes on a new store; the thread its first write ran on."""
    store, sid = await _open(path, **options)
    other = make_session()
    await store.create_session(other)
    async with store:
        threads = _commits(store)
        kept = user(sid, "kept", t=T0)
        await store.append_messages([kept])
        failures = [
            lambda: store.append_messages([kept]),
            lambda: store.append_messages([user("ses_unknown", "b", t=T0)]),
            lambda: store.upsert_messages([user("ses_unknown", "b", t=T0)]),
            lambda: store.upsert_messages([kept.model_copy(update={"session_id": other.id})]),
            lambda: store.update_messages([user(sid, "missing", t=T0)]),
        ]
        seen: list[str] = []
        for fail in failures:
            with pytest.raises(StoreError) as caught:
                await fail()
            # Ids and the path differ between two files: the rest must not.
            text = str(caught.value).replace(str(path), "<path>")
            seen.append(_without_ids(text.replace(sid, "<sid>").replace(other.id, "<other>")))
        assert await store.count_messages(sid) == 1
    return seen, threads[0]


async def test_errors_are_the_same_inline_and_on_the_thread(tmp_path: Path) -> None:
    inline, inline_thread = await _failures(tmp_path / "inline.db")
    thread, thread_thread = await _failures(tmp_path / "thread.db", synchronous="FULL")
    assert inline_thread == threading.get_ident()
    assert thread_thread != threading.get_ident()
    assert inline == thread


def _without_ids(text: str) -> str:
    return re.sub(r"'(msg|ses)_[^']*'", "<id>", text)


async def test_an_inline_commit_never_runs_the_automatic_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite's own checkpoint after 8 pages of log; the thread's only after a minute.
    monkeypatch.setattr(worker_module, "WAL_BACKSTOP_PAGES", 8)
    monkeypatch.setattr(worker_module, "CHECKPOINT_IDLE", 60.0)
    monkeypatch.setattr(worker_module, "CHECKPOINT_WRITES", 10**6)
    sizes: dict[str, tuple[int, int]] = {}
    for name, options in (("inline", {}), ("thread", {"synchronous": "FULL"})):
        path = tmp_path / f"{name}.db"
        store, sid = await _open(path, **options)
        async with store:
            await store._run(
                lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            )
            before = _size(path)
            for n in range(20):
                await store.upsert_messages([user(sid, f"m{n} " + "x" * 4000, t=T0 + n)])
            sizes[name] = (before, _size(path))
            assert _size(Path(f"{path}-wal")) > 8 * _PAGE
    before, after = sizes["inline"]
    assert after == before  # no commit copied the log into the main file
    before, after = sizes["thread"]
    assert after > before  # the same writes on the thread: the backstop ran in a commit


def _settings(conn: sqlite3.Connection) -> tuple[int, int]:
    busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    pages = conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    return int(busy), int(pages)


async def test_between_jobs_the_connection_rests_without_waits(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store, sid = await _open(path, busy_timeout=7.0)
    async with store:
        assert store._conn is not None
        # Resting: a write lock held elsewhere answers at once, no checkpoint runs.
        assert _settings(store._conn) == (0, 0)
        # A job of the thread has the store's own busy timeout and backstop.
        during = await store._run(_settings)
        assert during == (7000, worker_module.WAL_BACKSTOP_PAGES)
        assert _settings(store._conn) == (0, 0)
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        await store.append_messages([user(sid, "inline", t=T0)])
        store._conn.set_trace_callback(None)
        assert not [s for s in statements if "busy_timeout" in s or "checkpoint" in s]
    async with SQLiteStore(path, read_only=True) as reader:
        assert reader._conn is not None
        assert _settings(reader._conn)[0] == 30_000  # read-only: never rests


class _Clock:
    """A ``perf_counter`` that moves ``step`` seconds at each call (the worker's hold
    measure), and the real ``monotonic`` for everything else."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()


async def _writes_between_ticks(store: SQLiteStore, sid: str, count: int) -> list[int]:
    """Write ``count`` messages in a loop; how many writes ran between two ticks of a
    task that only yields (the loop's other tasks)."""
    written = 0
    runs: list[int] = []
    done = False

    async def tick() -> None:
        last = 0
        while not done:
            await anyio.lowlevel.checkpoint()
            runs.append(written - last)
            last = written

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await anyio.lowlevel.checkpoint()  # the ticker is waiting for its turn
        for n in range(count):
            await store.append_messages([user(sid, f"m{n}", t=T0 + n)])
            written += 1
        done = True
    return [r for r in runs if r]


async def test_inline_writes_yield_once_they_ran_on_the_loop_for_a_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        threads = _commits(store)
        # Each inline write holds the loop 0.35 ms by this clock (one step between
        # its two readings): the third since a yield reaches the 1 ms slice.
        monkeypatch.setattr(worker_module, "time", _Clock(0.00035))
        runs = await _writes_between_ticks(store, sid, 30)
        assert threads == [threading.get_ident()] * 30  # all inline
        assert max(runs) == 3  # never more between two turns of the others
        assert runs.count(3) >= 8  # and the writes below a slice did not yield


async def test_inline_writes_in_a_loop_let_other_tasks_run(tmp_path: Path) -> None:
    # Real time: 200 writes run on the loop well over a slice, so the others run.
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        runs = await _writes_between_ticks(store, sid, 200)
        assert len(runs) >= 2


@contextlib.asynccontextmanager
async def _loop_ticks() -> AsyncGenerator[Callable[[], int]]:
    """Run a task that only yields, counting its turns (the loop's other tasks getting
    theirs) while the block runs; the block gets a reader of the count so far."""
    ticks = 0
    done = False

    async def tick() -> None:
        nonlocal ticks
        while not done:
            await anyio.lowlevel.checkpoint()
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await anyio.lowlevel.checkpoint()  # the ticker is waiting for its turn
        try:
            yield lambda: ticks
        finally:
            done = True


async def test_a_turns_write_and_feed_read_cost_no_loop_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Below a slice, a write and the known feed read after it never yield: the
    # turn's own await (the model call) gives the others their turn.
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        _, seq = await store.changes_since(sid, 0)
        monkeypatch.setattr(worker_module, "time", _Clock(0.0))
        async with _loop_ticks() as ticks:
            before = ticks()
            for n in range(5):
                await store.append_messages([user(sid, f"m{n}", t=T0 + n)])
                changed, seq = await store.changes_since(sid, seq)
                assert len(changed) == 1
            during = ticks() - before
        assert during == 0


async def test_the_slice_counts_the_work_since_the_callers_last_yield(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two writes (0.7 ms by this clock), then the caller's own await (a model call)
    # lets the others run: the two writes after it start a new count and do not
    # yield, although four in all are past the 1 ms slice.
    store, sid = await _open(tmp_path / "agent.db")
    async with store:
        monkeypatch.setattr(worker_module, "time", _Clock(0.00035))
        async with _loop_ticks() as ticks:
            for n in range(2):
                await store.append_messages([user(sid, f"a{n}", t=T0 + n)])
            await anyio.lowlevel.checkpoint()  # the caller's await between turns
            before = ticks()
            for n in range(2):
                await store.append_messages([user(sid, f"b{n}", t=T0 + 10 + n)])
            during = ticks() - before
            # Still bounded: a third write since the yield reaches the slice.
            await store.append_messages([user(sid, "c", t=T0 + 20)])
            after = ticks() - before
        assert during == 0
        assert after == 1
