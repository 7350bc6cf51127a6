"""The checkpoint writers under a cross-worker lease (SPEC A3, R1.4, R3).

Several "workers" are several :class:`ContextMiddleware` instances in one event
loop, sharing one store, one memory root and one :class:`InMemoryWriterLease`:
the lease rules are the same as with PostgreSQL (tests/store/test_multiworker.py
runs them across OS processes), without a database. A worker that "crashed" is
a lease taken by an owner that never renews or releases it.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from mimo_ctx.checkpoint import (
    CheckpointDraft,
    InMemoryWriterLease,
    LeaseInfo,
    OfflineCheckpointWriter,
    WriterLease,
    WriterRequest,
)
from mimo_ctx.config import RebuildConfig, WriterConfig, load_config
from mimo_ctx.errors import ConfigError, StoreError
from mimo_ctx.events import ContextRebuilt, Event, WriterFailed, WriterFinished, WriterStarted
from mimo_ctx.memory import write_text_atomic
from mimo_ctx.messages import (
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.store import InMemoryStore, Session, SQLiteStore, Store
from mimo_ctx.testing import filler_text
from mimo_ctx.triggers import ModelLimits

# usable = 90000 tokens (R1.2); no early writer thresholds unless a test asks.
LIMITS = ModelLimits(100_000, input_limit=100_000)
USABLE = 90_000
T0 = 1_750_000_000_000


def _config(*, ttl: float = 60.0, thresholds: tuple[str, ...] | None = ()) -> RebuildConfig:
    return RebuildConfig(writer=WriterConfig(thresholds=thresholds, lease_ttl=ttl))


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = (
        InMemoryStore() if request.param == "memory" else await SQLiteStore.open(tmp_path / "s.db")
    )
    yield s
    await s.aclose()


def history(session_id: str, *, rounds: int = 24, final_usage: int = USABLE + 500) -> list[Message]:
    """A user request and ``rounds`` tool rounds; the last assistant usage is ``final_usage``."""
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
        usage = final_usage if i == rounds - 1 else (i + 1) * (final_usage // rounds)
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


async def new_session(store: Store, **kwargs: int) -> Session:
    session = Session(time_created=T0 - 1)
    await store.create_session(session)
    await store.append_messages(history(session.id, **kwargs))
    return session


def recorder() -> tuple[list[Event], Callable[[Event], None]]:
    events: list[Event] = []
    return events, events.append


class GatedWriter:
    """The offline writer behind a gate a test opens; records its runs."""

    def __init__(self, *, gated: bool = True) -> None:
        self.gate = anyio.Event()
        if not gated:
            self.gate.set()
        self.started = anyio.Event()
        self.calls = 0
        self.cancelled = False
        self.before_return: Callable[[WriterRequest], Awaitable[None]] | None = None

    @property
    def name(self) -> str:
        return "gated"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        self.calls += 1
        self.started.set()
        try:
            await self.gate.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        draft = OfflineCheckpointWriter().build(request)
        if self.before_return is not None:
            await self.before_return(request)
        return draft


async def steal(lease: InMemoryWriterLease, session_id: str) -> LeaseInfo:
    """Another worker takes the lease over (as after a lapse), for a long time."""
    held = await lease.holder(session_id)
    assert held is not None
    assert await lease.release(session_id, held.owner)
    assert await lease.acquire(session_id, "usurper", ttl=600)
    return held


# --------------------------------------------------------------------------- the lease itself


async def test_a3_in_memory_lease_cycle() -> None:
    store = InMemoryStore()
    session = Session(time_created=T0)
    await store.create_session(session)
    lease = InMemoryWriterLease(store)
    assert isinstance(lease, WriterLease)
    sid = session.id
    assert await lease.holder(sid) is None
    assert await lease.wait_released(sid, 5)  # nobody holds it
    assert await lease.acquire(sid, "alpha", 600)
    first = await lease.holder(sid)
    assert first is not None
    assert isinstance(first, LeaseInfo)
    assert (first.owner, first.generation) == ("alpha", 1)
    assert 0 < first.expires_in <= 600
    assert await lease.acquire(sid, "alpha", 600)  # extends, same generation
    again = await lease.holder(sid)
    assert again is not None
    assert again.generation == 1
    assert not await lease.acquire(sid, "beta", 600)
    assert not await lease.renew(sid, "beta", 600)
    assert await lease.renew(sid, "alpha", 600)
    assert not await lease.set_watermark_if_held(sid, "beta", "msg_1")
    assert await lease.set_watermark_if_held(sid, "alpha", "msg_1")
    assert await store.get_watermark(sid) == "msg_1"
    assert not await lease.wait_released(sid, 0.05)
    assert not await lease.release(sid, "beta")
    assert await lease.release(sid, "alpha")
    assert not await lease.release(sid, "alpha")
    assert not await lease.renew(sid, "alpha", 600)
    assert await lease.acquire(sid, "beta", 600)
    taken = await lease.holder(sid)
    assert taken is not None
    assert (taken.owner, taken.generation) == ("beta", 2)
    # The run alpha held is over: beta holds a newer generation.
    assert await lease.wait_released(sid, 0.05, generation=1)
    assert await lease.acquire("ses_unknown", "x", 1)
    with pytest.raises(StoreError, match="ses_unknown"):
        await lease.set_watermark_if_held("ses_unknown", "x", "msg_1")
    for ttl in (0, -1, math.inf, math.nan):
        with pytest.raises(StoreError, match="ttl"):
            await lease.acquire(sid, "gamma", ttl)


async def test_a3_in_memory_lease_lapses_and_wakes_waiters() -> None:
    lease = InMemoryWriterLease(InMemoryStore())
    assert await lease.acquire("ses_a", "crashed", 0.05)
    with anyio.fail_after(30):
        assert await lease.wait_released("ses_a", 3600)  # woken at the expiry
    assert await lease.holder("ses_a") is None
    assert not await lease.renew("ses_a", "crashed", 600)
    assert await lease.acquire("ses_a", "survivor", 600)
    results: list[bool] = []

    async def waiter() -> None:
        results.append(await lease.wait_released("ses_a", 3600))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(waiter)
            await anyio.lowlevel.checkpoint()
            assert await lease.release("ses_a", "survivor")
    assert results == [True, True, True]


def test_a3_lease_ttl_is_configurable_and_validated() -> None:
    assert WriterConfig().lease_ttl == 60
    assert load_config({"checkpoint": {"writer": {"lease_ttl": 5}}}).writer.lease_ttl == 5
    for bad in (0, -1, "soon", math.inf):
        with pytest.raises(ConfigError, match=r"checkpoint\.writer\.lease_ttl"):
            load_config({"checkpoint": {"writer": {"lease_ttl": bad}}})


# --------------------------------------------------------------------------- the coordinator


async def test_a3_request_is_skipped_while_another_worker_writes(
    store: Store, tmp_path: Path
) -> None:
    """Another worker holds the lease: no writer starts here; writer_running() (this
    worker only) does not see the other writer, a wait does; once it is free, a writer
    starts."""
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=_config(), writer_lease=lease
    ) as mw:
        assert await lease.acquire(session.id, "other-worker", 600)
        assert await mw.start_writer(session.id, reason="test") == "skipped"
        assert not mw.writer_running(session.id)
        assert await mw.wait_for_writer(session.id, timeout=0.05) == "timeout"
        assert await lease.release(session.id, "other-worker")
        assert await mw.start_writer(session.id, reason="test") == "started"
        assert mw.writer_running(session.id)
        assert await mw.wait_for_writer(session.id, timeout=60) == "finished"
        assert await store.get_watermark(session.id) is not None
        # The run released its lease.
        assert await lease.holder(session.id) is None
        # Nothing new to cover: skipped, and the lease is not kept.
        assert await mw.start_writer(session.id, reason="again") == "skipped"
        assert await lease.holder(session.id) is None


async def test_a3_threshold_is_not_marked_while_another_worker_writes(
    store: Store, tmp_path: Path
) -> None:
    """A3: while a writer runs (here: on another worker) no threshold is marked,
    so it fires later."""
    lease = InMemoryWriterLease(store)
    session = Session(time_created=T0 - 1)
    await store.create_session(session)
    messages = history(session.id, rounds=12, final_usage=40_000)
    await store.append_messages(messages[:-1])
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=_config(thresholds=None), writer_lease=lease
    ) as mw:
        assert await lease.acquire(session.id, "other-worker", 600)
        await mw.record(messages[-1])  # usage 40000 crosses the 18000 and 36000 thresholds
        assert not mw.writer_running(session.id)
        stored = await store.get_session(session.id)
        assert stored is not None
        assert stored.state.crossed_thresholds == []
        assert await lease.release(session.id, "other-worker")
        await mw.record(messages[-1])  # the same usage again: now it fires
        assert mw.writer_running(session.id)
        assert await mw.wait_for_writer(session.id, timeout=60) == "finished"
        stored = await store.get_session(session.id)
        assert stored is not None
        assert stored.state.crossed_thresholds == [18_000, 36_000]


async def test_r3_2_wait_follows_a_writer_on_another_worker(store: Store, tmp_path: Path) -> None:
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=_config(), writer_lease=lease
    ) as mw:
        assert await mw.wait_for_writer(session.id, timeout=5) == "idle"
        assert await lease.acquire(session.id, "other-worker", 600)
        assert await mw.wait_for_writer(session.id, timeout=0.05) == "timeout"
        results: list[str] = []

        async def waiter() -> None:
            results.append(await mw.wait_for_writer(session.id, timeout=3600))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.lowlevel.checkpoint()
                # The other worker finishes: watermark persisted, lease released.
                assert await lease.set_watermark_if_held(session.id, "other-worker", "msg_x")
                assert await lease.release(session.id, "other-worker")
        assert results == ["finished"]


async def test_a3_r1_4_two_workers_50_concurrent_prepares_one_writer_one_boundary(
    store: Store, tmp_path: Path
) -> None:
    """Two workers on one store, 50 concurrent prepare() each, the last usage over
    the line and no checkpoint yet: one writer runs (the lease), the other worker
    waits for it instead of failing over to a plain compaction, and exactly one
    boundary is inserted for that usage (R1.4)."""
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    count = await store.count_messages(session.id, agent=None)
    events, on_event = recorder()
    writer = GatedWriter()
    views: list[RequestView] = []
    async with (
        ContextMiddleware(
            store,
            tmp_path / "mem",
            model=LIMITS,
            config=_config(),
            writer=writer,
            fallback_writer=False,
            on_event=on_event,
            writer_lease=lease,
        ) as first,
        ContextMiddleware(
            store,
            tmp_path / "mem",
            model=LIMITS,
            config=_config(),
            writer=writer,
            fallback_writer=False,
            on_event=on_event,
            writer_lease=lease,
        ) as second,
    ):

        async def one(mw: ContextMiddleware) -> None:
            views.append(await mw.prepare(session.id))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(one, first)
                    tg.start_soon(one, second)
                await writer.started.wait()
                # Both workers are in the rebuild now: one writes, one waits.
                await anyio.sleep(0.05)
                writer.gate.set()
    assert writer.calls == 1
    assert len([e for e in events if isinstance(e, WriterStarted)]) == 1
    assert [e.outcome for e in events if isinstance(e, ContextRebuilt)] == ["rebuilt"]
    reports = [v.rebuild for v in views if v.rebuild is not None]
    assert sorted(r.outcome for r in reports) in (["rebuilt"], ["already-recovered", "rebuilt"])
    stored = await store.list_messages(session.id, agent=None)
    assert sum(m.is_boundary for m in stored) == 1
    assert len({v.boundary_id for v in views}) == 1
    assert len(stored) == count + 1  # nothing lost, nothing doubled


class _RacingStore(InMemoryStore):
    """Runs ``race`` once, at the first session read: another worker acts between this
    worker's trigger check and its rebuild."""

    race: Callable[[], Awaitable[object]] | None = None

    async def get_session(self, session_id: str) -> Session | None:
        race, self.race = self.race, None
        if race is not None:
            await race()
        return await super().get_session(session_id)


async def test_r1_4_a3_usage_recovered_by_another_worker_meanwhile_starts_no_writer(
    tmp_path: Path,
) -> None:
    """The checkpoint is on disk; worker B sees the usage over the line, then worker A
    rebuilds for it before B's rebuild reads the boundaries. B must not take A's fresh
    boundary for a stale checkpoint (and start a writer, then wait for it): the usage is
    recovered, B answers ``already-recovered`` and writes nothing."""
    store = _RacingStore()
    session = await new_session(store)
    messages = await store.list_messages(session.id)
    memory = tmp_path / "mem"
    checkpoint = memory / "sessions" / session.id / "checkpoint.md"
    await write_text_atomic(checkpoint, "Topic: refactoring\n\n## Active intent\nRefactor.\n")
    await store.set_watermark(session.id, messages[12].id)
    a_events, on_a = recorder()
    b_events, on_b = recorder()
    lease = InMemoryWriterLease(store)
    config = _config()
    async with (
        ContextMiddleware(
            store, memory, model=LIMITS, config=config, writer_lease=lease, on_event=on_a
        ) as worker_a,
        ContextMiddleware(
            store, memory, model=LIMITS, config=config, writer_lease=lease, on_event=on_b
        ) as worker_b,
    ):

        async def a_rebuilds() -> None:
            view = await worker_a.prepare(session.id)
            assert view.rebuild is not None
            assert view.rebuild.outcome == "rebuilt"

        store.race = a_rebuilds
        with anyio.fail_after(30):
            view = await worker_b.prepare(session.id)
    assert view.rebuild is not None
    assert view.rebuild.outcome == "already-recovered"
    assert [e for e in b_events if isinstance(e, WriterStarted)] == []
    assert [e for e in a_events if isinstance(e, WriterStarted)] == []
    stored = await store.list_messages(session.id)
    assert sum(m.is_boundary for m in stored) == 1
    assert view.boundary_id == next(m.id for m in stored if m.is_boundary)


async def test_a3_abandoned_lease_is_taken_over_after_it_lapses(
    store: Store, tmp_path: Path
) -> None:
    """A worker died holding the lease (it never renews or releases it). The next
    worker to rebuild waits for the lease to lapse, takes over, writes the
    checkpoint itself and inserts the boundary; no message is lost."""
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    count = await store.count_messages(session.id, agent=None)
    events, on_event = recorder()
    assert await lease.acquire(session.id, "dead-worker", 0.3)
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        config=_config(),
        on_event=on_event,
        writer_lease=lease,
    ) as mw:
        with anyio.fail_after(60):
            view = await mw.prepare(session.id)
    assert view.rebuild is not None
    assert view.rebuild.outcome == "rebuilt"
    (started,) = [e for e in events if isinstance(e, WriterStarted)]
    assert "take over" in started.reason
    assert await store.get_watermark(session.id) == view.rebuild.watermark
    assert await store.count_messages(session.id, agent=None) == count + 1
    assert await lease.holder(session.id) is None


async def test_a3_writer_that_lost_its_lease_persists_nothing(store: Store, tmp_path: Path) -> None:
    """The lease changes hands while the writer works (it lapsed during a stall):
    the fence before checkpoint.md stops the run; no file, no watermark."""
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    events, on_event = recorder()
    writer = GatedWriter(gated=False)
    stolen: list[LeaseInfo] = []

    async def usurp(request: WriterRequest) -> None:
        stolen.append(await steal(lease, request.session_id))

    writer.before_return = usurp
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        config=_config(),
        writer=writer,
        fallback_writer=False,
        on_event=on_event,
        writer_lease=lease,
    ) as mw:
        assert await mw.start_writer(session.id, reason="test") == "started"
        assert await mw.wait_for_writer(session.id, timeout=60) == "failed"
    assert len(stolen) == 1
    assert not mw.layout.checkpoint_path(session.id).exists()
    assert await store.get_watermark(session.id) is None
    (failed,) = [e for e in events if isinstance(e, WriterFailed)]
    assert "lease" in failed.error
    assert not [e for e in events if isinstance(e, WriterFinished)]
    holder = await lease.holder(session.id)
    assert holder is not None
    assert holder.owner == "usurper"  # the usurper's lease was left alone


async def test_a3_lost_renewal_cancels_the_running_writer(store: Store, tmp_path: Path) -> None:
    """While the writer runs the lease is renewed every ttl/3; a renewal refused
    (another worker holds the lease now) cancels the writer at once."""
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    writer = GatedWriter()  # never opened: only a cancellation ends it
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        config=_config(ttl=0.3),
        writer=writer,
        fallback_writer=False,
        writer_lease=lease,
    ) as mw:
        assert await mw.start_writer(session.id, reason="test") == "started"
        with anyio.fail_after(30):
            await writer.started.wait()
            await steal(lease, session.id)
            assert await mw.wait_for_writer(session.id, timeout=3600) == "failed"
    assert writer.cancelled
    assert not mw.layout.checkpoint_path(session.id).exists()
    assert await store.get_watermark(session.id) is None


async def test_a3_lease_is_renewed_while_a_slow_writer_runs(store: Store, tmp_path: Path) -> None:
    """A writer slower than the lease's ttl keeps its lease (renewals) and succeeds."""
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    writer = GatedWriter()
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        config=_config(ttl=0.6),
        writer=writer,
        fallback_writer=False,
        writer_lease=lease,
    ) as mw:
        assert await mw.start_writer(session.id, reason="test") == "started"
        with anyio.fail_after(30):
            await writer.started.wait()
            first = await lease.holder(session.id)
            await anyio.sleep(1.5)  # more than two ttls
            still = await lease.holder(session.id)
            writer.gate.set()
            assert await mw.wait_for_writer(session.id, timeout=3600) == "finished"
    assert first is not None
    assert still is not None
    assert (still.owner, still.generation) == (first.owner, first.generation)
    assert await store.get_watermark(session.id) is not None
    assert await lease.holder(session.id) is None


async def test_r3_3_closing_the_middleware_releases_the_lease(store: Store, tmp_path: Path) -> None:
    """A writer still running when the middleware closes is cancelled and its
    lease released at once (shielded), so other workers need not wait for it to
    lapse."""
    lease = InMemoryWriterLease(store)
    session = await new_session(store)
    writer = GatedWriter()
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        config=_config(),
        writer=writer,
        fallback_writer=False,
        writer_lease=lease,
    ) as mw:
        assert await mw.start_writer(session.id, reason="test") == "started"
        await writer.started.wait()
        assert await lease.holder(session.id) is not None
    assert writer.cancelled
    assert await lease.holder(session.id) is None


async def test_a3_without_a_lease_only_this_workers_writer_counts(
    store: Store, tmp_path: Path
) -> None:
    session = await new_session(store)
    writer = GatedWriter()
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=_config(), writer=writer
    ) as mw:
        assert not mw.writer_running(session.id)
        assert await mw.wait_for_writer(session.id, timeout=60) == "idle"
        assert await mw.start_writer(session.id, reason="test") == "started"
        assert mw.writer_running(session.id)
        writer.gate.set()
        assert await mw.wait_for_writer(session.id, timeout=60) == "finished"
        assert not mw.writer_running(session.id)
        assert await mw.wait_for_writer(session.id, timeout=60) == "idle"
