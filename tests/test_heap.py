"""The heap release after rebuilds (mimo_ctx._heap, RebuildConfig.release_memory_after_rebuild).

Its rate limit (``release_memory_interval``): at most one release starts per
interval in the process, and a release asked for meanwhile is coalesced into one
at the interval's end, never lost -- the limiter on a fake clock (examples and a
simulation of random requests), the handler on the event loop, and two
middlewares sharing the limit.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.from_thread
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mimo_ctx._heap as heap
from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import ContextRebuilt, Event
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import InMemoryStore
from mimo_ctx.testing import ScriptedModel, ScriptStep, tool_round
from mimo_ctx.triggers import ModelLimits


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return False


_READ_HEAP = heap.read_heap
"""The real reading (the handlers' tests replace it: every release they ask for runs)."""


@pytest.fixture(autouse=True)
def _fresh_lookup(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    heap._load_trim.cache_clear()  # pyright: ignore[reportPrivateUsage]
    heap._load_mallinfo2.cache_clear()  # pyright: ignore[reportPrivateUsage]
    # Each test starts with no release behind it (the limiter and gate are process-wide).
    monkeypatch.setattr(heap, "_LIMITER", heap.ReleaseLimiter())
    monkeypatch.setattr(heap, "_GATE", heap.ReleaseGate())
    # No reading: the gate lets every release through (its own tests below).
    monkeypatch.setattr(heap, "read_heap", lambda: None)
    yield
    heap._load_trim.cache_clear()  # pyright: ignore[reportPrivateUsage]
    heap._load_mallinfo2.cache_clear()  # pyright: ignore[reportPrivateUsage]


def _answers(version: str) -> Callable[[str], str]:
    def confstr(name: str) -> str:
        assert name == "CS_GNU_LIBC_VERSION"
        return version

    return confstr


def test_without_glibc_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_glibc(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(heap.os, "confstr", no_glibc)
    assert heap.release_free_heap() is False
    assert heap.release_if_worthwhile(heap.ReleaseGate()) is False
    monkeypatch.setattr(heap.os, "confstr", _answers("musl 1.2"))
    heap._load_trim.cache_clear()  # pyright: ignore[reportPrivateUsage]
    assert heap.release_free_heap() is False
    heap._load_mallinfo2.cache_clear()  # pyright: ignore[reportPrivateUsage]
    reading = _READ_HEAP()
    assert reading is not None  # the resident size is Linux's, not glibc's
    assert reading.free is None  # but mallinfo2 is glibc's
    assert reading.slack == reading.resident


def test_glibc_trims_every_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    class FakeTrim:
        argtypes: object = None
        restype: object = None

        def __call__(self, pad: int) -> int:
            calls.append(pad)
            return 1

    class FakeLibc:
        malloc_trim = FakeTrim()

    opened: list[str] = []

    def cdll(name: str) -> FakeLibc:
        opened.append(name)
        return FakeLibc()

    monkeypatch.setattr(heap.os, "confstr", _answers("glibc 2.36"))
    monkeypatch.setattr(heap.ctypes, "CDLL", cdll)
    assert heap.release_free_heap() is True
    assert heap.release_free_heap() is True
    assert calls == [0, 0]  # pad 0: every arena, keep nothing spare
    assert opened == ["libc.so.6"]  # looked up once


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's; other C libraries have none")
def test_freed_blocks_between_live_ones_go_back_to_the_system() -> None:
    # 100 KB blocks stay below glibc's mmap threshold, so they come from the heap;
    # keeping every tenth one pins the heap's top, so free() alone returns nothing.
    blocks = [bytes(100_000) + bytes([i % 256]) for i in range(2_000)]
    kept = blocks[::10]
    del blocks
    before = _rss_anon_kib()
    assert heap.release_free_heap() is True
    after = _rss_anon_kib()
    assert before - after > 100_000, (before, after)  # ~180 MB were free inside the heap
    assert len(kept) == 200


LIMITS = ModelLimits(100_000, input_limit=100_000)


async def _rebuild_once(tmp_path: Path, config: RebuildConfig) -> tuple[list[Event], int]:
    released: list[int] = []
    events: list[Event] = []
    done = anyio.Event()

    def fake_release() -> bool:  # runs in a worker thread
        released.append(1)
        anyio.from_thread.run_sync(done.set)
        return True

    model = ScriptedModel(
        [tool_round("grep", 3000, seed=i, pattern=f"p{i}") for i in range(8)]
        + [ScriptStep(text="Done.")]
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heap, "release_free_heap", fake_release)
        async with ContextMiddleware(
            InMemoryStore(), tmp_path / "mem", model=LIMITS, config=config, on_event=events.append
        ) as mw:
            session = await mw.open_session(system="You are careful.")
            await mw.add_user_message(session.id, "Search the repo.")
            for _ in range(9):
                await mw.turn(session.id, model.complete)
            assert not released  # turns alone release nothing
            report = await mw.rebuild(session.id)
            assert report.outcome == "rebuilt"
            # It runs in the background, off the loop (leaving would cancel it).
            # Turned off, give it the time it would take all the same.
            with anyio.move_on_after(5 if config.release_memory_after_rebuild else 0.3):
                await done.wait()
            await mw.turn(session.id, model.complete)
    return events, len(released)


async def test_a_rebuild_releases_the_heap_once(tmp_path: Path) -> None:
    events, released = await _rebuild_once(tmp_path, RebuildConfig())
    assert [e.outcome for e in events if isinstance(e, ContextRebuilt)] == ["rebuilt"]
    assert released == 1


async def test_the_release_can_be_turned_off(tmp_path: Path) -> None:
    _, released = await _rebuild_once(tmp_path, RebuildConfig(release_memory_after_rebuild=False))
    assert released == 0


# -- the rate limit ---------------------------------------------------------------------------


def test_one_release_per_interval_and_requests_meanwhile_coalesce() -> None:
    limiter = heap.ReleaseLimiter()
    assert limiter.request(0.0, 1.0) == 0.0  # nothing before: at once
    assert limiter.request(0.1, 1.0) is None  # one is on its way
    limiter.start(0.1)
    assert limiter.request(0.2, 1.0) is None  # running: one more follows it
    assert limiter.request(0.3, 1.0) is None  # ... one, for both
    assert limiter.finish(0.4) == pytest.approx(0.7)  # at 1.1, an interval after 0.1
    limiter.start(1.1)
    assert limiter.finish(1.2) is None  # nobody asked meanwhile: done
    assert limiter.request(1.5, 1.0) == pytest.approx(0.6)  # too soon: waits for 2.1
    assert limiter.request(1.6, 1.0) is None
    limiter.start(2.1)
    assert limiter.finish(2.2) is None
    assert limiter.request(9.0, 1.0) == 0.0  # long after: at once


def test_each_request_names_its_interval_and_the_shortest_wins() -> None:
    limiter = heap.ReleaseLimiter()
    assert limiter.request(0.0, 5.0) == 0.0
    limiter.start(0.0)
    assert limiter.request(0.1, 5.0) is None
    assert limiter.request(0.2, 0.5) is None
    assert limiter.finish(0.3) == pytest.approx(0.2)  # 0.5 after the start at 0
    limiter.start(0.5)
    assert limiter.finish(0.6) is None
    assert limiter.request(0.7, 0.0) == 0.0  # 0: no wait at all


def test_an_abandoned_release_leaves_nothing_scheduled() -> None:
    limiter = heap.ReleaseLimiter()
    assert limiter.request(0.0, 1.0) == 0.0
    limiter.start(0.0)
    assert limiter.finish(0.1) is None
    assert limiter.request(0.2, 1.0) == pytest.approx(0.8)
    limiter.abandon()  # its task was cancelled while it waited
    assert limiter.request(0.3, 1.0) == pytest.approx(0.7)  # scheduled afresh


@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=40),
    duration=st.floats(min_value=0.0, max_value=2.0),
    interval=st.floats(min_value=0.0, max_value=2.0),
)
def test_releases_keep_the_interval_and_every_request_is_served(
    gaps: list[float], duration: float, interval: float
) -> None:
    # Requests at the given gaps on a fake clock, each release lasting `duration`,
    # driven as HeapRelease._release drives them (a finish, then a start, then a
    # request when they fall on the same instant).
    requests = list(itertools.accumulate(gaps))
    limiter = heap.ReleaseLimiter()
    starts: list[float] = []
    ends: list[float] = []
    served: list[int] = []  # requests handled before each start
    handled = 0
    due: float | None = None
    running_until: float | None = None
    while handled < len(requests) or due is not None or running_until is not None:
        events: list[tuple[float, int]] = []
        if running_until is not None:
            events.append((running_until, 0))
        if due is not None:
            events.append((due, 1))
        if handled < len(requests):
            events.append((requests[handled], 2))
        now, kind = min(events)
        if kind == 0:
            ends.append(now)
            running_until = None
            wait = limiter.finish(now)
            due = None if wait is None else now + wait
        elif kind == 1:
            due = None
            limiter.start(now)
            starts.append(now)
            served.append(handled)
            running_until = now + duration
        else:
            handled += 1
            wait = limiter.request(now, interval)
            if wait is not None:
                assert due is None
                assert running_until is None
                due = now + wait
    assert not limiter.scheduled
    assert not limiter.running
    assert 1 <= len(starts) <= len(requests)
    # Never two starts closer than the interval.
    assert all(b - a >= interval - 1e-9 for a, b in itertools.pairwise(starts))
    # Every request is served by a release starting at or after it.
    assert all(any(start >= r for start in starts) for r in requests)
    # And no later than the limit asks: the first request after the previous start,
    # the previous release's end, an interval after its start, whichever is latest.
    assert starts[0] == requests[0]
    for k in range(1, len(starts)):
        first_after = requests[served[k - 1]]
        expected = max(first_after, ends[k - 1], starts[k - 1] + interval)
        assert starts[k] == pytest.approx(expected, abs=1e-9)


_EVERY_300_MS = RebuildConfig(release_memory_interval=0.3)


def _rebuilt() -> ContextRebuilt:
    return ContextRebuilt(session_id="ses_x", time=1, outcome="rebuilt", manual=False)


class _Releases:
    """The releases the handlers ran, counted instead of run (``release`` is the fake)."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self._changed = anyio.Event()

    def release(self) -> bool:  # runs in a worker thread
        anyio.from_thread.run_sync(self._note, time.monotonic())
        return True

    def _note(self, at: float) -> None:
        self.calls.append(at)
        self._changed.set()
        self._changed = anyio.Event()

    async def until(self, count: int) -> None:
        with anyio.fail_after(5):
            while len(self.calls) < count:
                await self._changed.wait()


async def test_a_burst_of_rebuilds_releases_at_once_and_once_more_after_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    releases = _Releases()
    calls = releases.calls
    monkeypatch.setattr(heap, "release_free_heap", releases.release)
    async with anyio.create_task_group() as group:
        handler = heap.HeapRelease(lambda: group, _EVERY_300_MS)
        first = time.monotonic()
        for _ in range(5):
            handler(_rebuilt())
            await anyio.sleep(0.01)
        await releases.until(1)
        assert len(calls) == 1  # the first at once, the other four wait...
        assert calls[0] - first < 0.3
        await releases.until(2)  # ... for one more, an interval after the first started
        assert calls[1] - first >= 0.3
        handler(ContextRebuilt(session_id="ses_x", time=1, outcome="skipped", manual=False))
        await anyio.sleep(0.4)
    assert len(calls) == 2  # nothing dropped the window: nothing asked


async def test_every_middleware_of_the_process_shares_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    releases = _Releases()
    calls = releases.calls
    monkeypatch.setattr(heap, "release_free_heap", releases.release)
    async with anyio.create_task_group() as one, anyio.create_task_group() as two:
        handlers = [
            heap.HeapRelease(lambda: one, _EVERY_300_MS),
            heap.HeapRelease(lambda: two, _EVERY_300_MS),
        ]
        for i in range(6):
            handlers[i % 2](_rebuilt())
            await anyio.sleep(0.01)
        await releases.until(2)
        await anyio.sleep(0.4)
    assert len(calls) == 2


async def test_a_middleware_closing_while_its_release_waits_leaves_it_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    releases = _Releases()
    calls = releases.calls
    monkeypatch.setattr(heap, "release_free_heap", releases.release)
    async with anyio.create_task_group() as closing:
        handler = heap.HeapRelease(lambda: closing, _EVERY_300_MS)
        handler(_rebuilt())
        await releases.until(1)
        handler(_rebuilt())  # waits for the interval in `closing`...
        closing.cancel_scope.cancel()  # ... which ends before it
    assert len(calls) == 1
    async with anyio.create_task_group() as other:
        heap.HeapRelease(lambda: other, _EVERY_300_MS)(_rebuilt())
        await releases.until(2)
    assert len(calls) == 2  # scheduled afresh, not folded into the abandoned one


async def test_with_no_running_task_group_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    releases = _Releases()
    monkeypatch.setattr(heap, "release_free_heap", releases.release)
    heap.HeapRelease(lambda: None, _EVERY_300_MS)(_rebuilt())
    async with anyio.create_task_group() as group:
        heap.HeapRelease(lambda: group, _EVERY_300_MS)(_rebuilt())
        await releases.until(1)  # at once: the first never reached the limiter


# -- the gate: a release only when it could give back enough -------------------------------

_MIB = 1 << 20


def _reading(resident_mib: int, free_mib: int | None = None) -> heap.HeapReading:
    return heap.HeapReading(resident_mib * _MIB, None if free_mib is None else free_mib * _MIB)


def test_the_gate_asks_for_a_sixteenth_of_the_resident_size_more_slack() -> None:
    gate = heap.ReleaseGate()
    assert gate.worth(_reading(320, 120))  # the first release: always
    gate.released(_reading(300, 100))  # floor: 100 MiB free (their pages given back)
    assert not gate.worth(_reading(300, 100))  # nothing new to give back
    assert not gate.worth(_reading(420, 100))  # the live data grew, not the slack
    assert not gate.worth(_reading(420, 114))  # 14 MiB more free, 26.25 asked for
    assert gate.worth(_reading(420, 130))  # 30 MiB more: worth it
    assert gate.worth(_reading(300, 130))  # freed, resident unchanged: 30 MiB more
    gate.released(_reading(290, 120))
    assert gate.floor == 120 * _MIB


def test_the_floor_follows_reused_blocks_down() -> None:
    gate = heap.ReleaseGate()
    gate.released(_reading(160, 100))
    assert not gate.worth(_reading(160, 80))  # free blocks were reused
    assert gate.floor == 80 * _MIB
    assert gate.worth(_reading(160, 95))  # 15 MiB above the new floor (10 asked for)


def test_a_small_heap_asks_for_at_least_a_mib() -> None:
    gate = heap.ReleaseGate()
    gate.released(heap.HeapReading(8 * _MIB, 4 * _MIB))
    assert not gate.worth(heap.HeapReading(8 * _MIB, 4 * _MIB + 900_000))
    assert gate.worth(heap.HeapReading(8 * _MIB, 5 * _MIB))


def test_without_mallinfo2_the_resident_growth_counts() -> None:
    gate = heap.ReleaseGate()
    gate.released(_reading(300))
    assert not gate.worth(_reading(310))
    assert gate.worth(_reading(330))


_readings = st.builds(
    heap.HeapReading,
    st.integers(min_value=0, max_value=1 << 32),
    st.none() | st.integers(min_value=0, max_value=1 << 32),
)


@given(
    steps=st.lists(st.tuples(_readings, _readings), min_size=1, max_size=30),
    min_bytes=st.integers(min_value=0, max_value=1 << 26),
    min_share=st.floats(min_value=0.0, max_value=0.5),
)
def test_a_skipped_release_holds_back_less_than_the_gain_asked_for(
    steps: list[tuple[heap.HeapReading, heap.HeapReading]], min_bytes: int, min_share: float
) -> None:
    # Each step: a reading before a release may run, and the reading after it if it did.
    gate = heap.ReleaseGate(min_bytes=min_bytes, min_share=min_share)
    after_last: int | None = None  # the slack right after the last release
    least: int | None = None  # the least slack seen since
    for before, after in steps:
        asked = max(min_bytes, before.resident * min_share)
        worth = gate.worth(before)
        if after_last is None:
            assert worth  # the first release always runs
        else:
            assert least is not None
            # It runs exactly when the slack grew by what is asked over its least since.
            assert worth == (before.slack - least >= asked)
            if not worth:
                # What the skip leaves resident is bounded by the gain asked for.
                assert before.slack < after_last + asked
        if worth:
            gate.released(after)
            after_last = least = after.slack
        else:
            assert least is not None
            least = min(least, before.slack)
        assert gate.floor == least


def test_a_release_runs_only_when_the_gate_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([_reading(400, 200), _reading(300, 100), _reading(300, 100), None, None])
    released: list[int] = []

    def release() -> bool:
        released.append(1)
        return True

    monkeypatch.setattr(heap, "read_heap", lambda: next(readings))
    monkeypatch.setattr(heap, "release_free_heap", release)
    gate = heap.ReleaseGate()
    assert heap.release_if_worthwhile(gate) is True  # first: read, released, read again
    assert gate.floor == 100 * _MIB
    assert heap.release_if_worthwhile(gate) is False  # nothing new: not released
    assert heap.release_if_worthwhile(gate) is True  # no reading: released as before
    assert released == [1, 1]
    assert gate.floor == 100 * _MIB  # no reading after it either: the floor stays


@pytest.mark.skipif(not _glibc(), reason="mallinfo2 and malloc_trim are glibc's")
def test_on_a_real_heap_only_what_was_freed_since_is_worth_a_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(heap, "read_heap", _READ_HEAP)
    first = _READ_HEAP()
    assert first is not None
    assert first.free is not None
    # A fixed gain asked for (not a share of the test process's resident size, which
    # depends on what ran before): far above what other threads free meanwhile, far
    # below the 180 MB freed below.
    gate = heap.ReleaseGate(min_bytes=50 << 20, min_share=0.0)
    # 100 KB blocks come from the heap; every tenth kept pins the pages between them.
    blocks = [bytes(100_000) + bytes([i % 256]) for i in range(2_000)]
    kept = blocks[::10]
    del blocks
    before = _rss_anon_kib()
    assert heap.release_if_worthwhile(gate) is True
    assert before - _rss_anon_kib() > 100_000
    assert heap.release_if_worthwhile(gate) is False  # at once: nothing new to give back
    live = [bytes(100_000) + bytes([i % 256]) for i in range(2_000)]  # 200 MB, all alive
    assert heap.release_if_worthwhile(gate) is False  # more in use is no slack
    # Nor are Python's small objects: CPython maps their arenas itself, outside malloc,
    # so they add to the resident size but nothing a release could give back.
    small = [(i,) for i in range(1_500_000)]  # ~110 MB of tuples
    assert heap.release_if_worthwhile(gate) is False
    del small
    more = live[::10]
    del live  # 180 MB freed between live blocks
    before = _rss_anon_kib()
    assert heap.release_if_worthwhile(gate) is True
    assert before - _rss_anon_kib() > 100_000
    assert len(kept) + len(more) == 400
