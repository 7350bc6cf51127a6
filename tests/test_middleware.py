"""End-to-end tests of the rebuild engine (SPEC R1, R3, R4, R7.4, R8, A3, A4, A10, A12).

A scripted agent (``mimo_ctx.testing.ScriptedModel``: reports usage, makes tool
calls) runs through :class:`ContextMiddleware` on both embedded stores.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from mimo_ctx.checkpoint import CheckpointDraft, OfflineCheckpointWriter, WriterRequest
from mimo_ctx.config import PushCaps, RebuildConfig, WriterConfig
from mimo_ctx.errors import ContextOverflowError, MimoCtxError
from mimo_ctx.events import (
    AutoRebuildDisabled,
    ContextRebuilt,
    Event,
    UsagePending,
    WaitingForWriter,
    WriterFailed,
    WriterFinished,
    WriterStarted,
)
from mimo_ctx.messages import (
    Message,
    TextPart,
    ToolPart,
    ToolStateCompleted,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.reminders import PER_TURN_MARKER
from mimo_ctx.sections import BODY_INTRO
from mimo_ctx.store import InMemoryStore, Session, SQLiteStore, Store
from mimo_ctx.testing import FakeOverflowError, ScriptedModel, ScriptStep, filler_text, tool_round
from mimo_ctx.triggers import ModelLimits
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER, COMPACTED_PLACEHOLDER

# usable = 90000; writer thresholds 18000/36000/54000/72000 (A3).
LIMITS = ModelLimits(100_000, input_limit=100_000)
SYSTEM = "You are a careful coding agent."


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = (
        InMemoryStore() if request.param == "memory" else await SQLiteStore.open(tmp_path / "s.db")
    )
    yield s
    await s.aclose()


class ControlledWriter:
    """A writer whose behaviour a test switches: ok, slow or failing."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls = 0
        self.release = anyio.Event()

    @property
    def name(self) -> str:
        return "controlled"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        self.calls += 1
        if self.mode == "slow":
            await self.release.wait()
        if self.mode == "fail":
            raise RuntimeError("model unavailable")
        return OfflineCheckpointWriter().build(request)


async def settle(mw: ContextMiddleware, session_id: str) -> None:
    """Let a background writer finish (bounded: a deliberately slow one stays)."""
    await anyio.lowlevel.checkpoint()
    for _ in range(3):  # a finished writer may start the pending one
        await mw.wait_for_writer(session_id, timeout=0.05)
        await anyio.lowlevel.checkpoint()


async def run_turns(
    mw: ContextMiddleware, session_id: str, model: ScriptedModel, turns: int
) -> list[Message]:
    replies: list[Message] = []
    for _ in range(turns):
        replies.append(await mw.turn(session_id, model.complete))
        await settle(mw, session_id)
    return replies


async def run_until_rebuild(
    mw: ContextMiddleware, session_id: str, model: ScriptedModel, *, max_turns: int = 60
) -> int:
    """Take turns until one of them ran a rebuild; return how many turns it took."""
    for turn in range(1, max_turns + 1):
        await mw.turn(session_id, model.complete)
        await settle(mw, session_id)
        if model.requests[-1].rebuild is not None:
            return turn
    raise AssertionError(f"no rebuild within {max_turns} turns")


def boundaries(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.is_boundary]


def texts(message: Message) -> list[str]:
    return [p.text for p in message.parts if isinstance(p, TextPart)]


def recorder() -> tuple[list[Event], Callable[[Event], None]]:
    events: list[Event] = []
    return events, events.append


async def test_r1_a3_r8_scripted_session_end_to_end(store: Store, tmp_path: Path) -> None:
    """Thresholds start writers, the 90% line inserts exactly one boundary, and the
    next request has exactly the R8.1 shape; later tool rounds are sent as they are."""
    events, on_event = recorder()
    steps = [tool_round("read", 3000, seed=i, file_path=f"src/m{i}.py") for i in range(45)]
    model = ScriptedModel(steps)
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM, tools=[{"name": "read"}])
        first = await mw.add_user_message(session.id, "Refactor every module. Never touch tests.")
        await run_turns(mw, session.id, model, 26)
        # A user message late in the session: it must survive verbatim (R8.1 (3)).
        late = await mw.add_user_message(session.id, "Also keep the public API stable.")
        # A sub-agent's tool result after the watermark is micro-compacted too (A4).
        sub = Message(
            session_id=session.id,
            role="assistant",
            agent="explore",
            time_created=late.time_created + 1,
            finish="stop",
            parts=[
                ToolPart(
                    call_id="sub1",
                    tool="grep",
                    state=ToolStateCompleted(input={"pattern": "x"}, output="hits"),
                )
            ],
        )
        await mw.append([sub])
        await run_turns(mw, session.id, model, 10)

        started = [e for e in events if isinstance(e, WriterStarted)]
        finished = [e for e in events if isinstance(e, WriterFinished)]
        # A3: every default threshold below the line fired once (the rebuild's own
        # run that brings the offline checkpoint up to now is not a threshold).
        at_thresholds = [e for e in started if e.reason.startswith("usage ")]
        assert any(e.reason.startswith("fresh checkpoint") for e in started)
        assert [int(e.reason.split(">= ")[1]) for e in at_thresholds][:4] == [
            18000,
            36000,
            54000,
            72000,
        ]
        assert len(finished) == len(started)

        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert len(rebuilt) == 1
        assert rebuilt[0].outcome == "rebuilt"
        assert any(isinstance(e, UsagePending) for e in events)
        stored = await store.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1
        boundary = boundaries(stored)[0]
        checkpoint = boundary.checkpoint_part
        assert checkpoint is not None
        watermark = await store.get_message(checkpoint.covered_up_to)
        assert watermark is not None
        # R4.3: back-dated to watermark + 1 ms, but the newest id at insert time.
        assert boundary.time_created == watermark.time_created + 1
        assert checkpoint.digest_up_to is not None
        assert all(m.id < boundary.id for m in stored if m.id <= checkpoint.digest_up_to)

        # The first request after the insert, message by message (R8.1).
        index = next(i for i, r in enumerate(model.requests) if r.rebuild is not None)
        view = model.requests[index]
        assert view.prefix.system == SYSTEM
        assert view.prefix.tools == [{"name": "read"}]
        head = view.messages[0]
        assert head.id == boundary.id
        head_texts = texts(head)
        assert head_texts[0] == CHECKPOINT_SUMMARY_HEADER
        assert head_texts[1].startswith("## Checkpoint\n")
        assert head_texts[2].startswith(BODY_INTRO)
        assert "# Recent user input (verbatim)" in head_texts[2]
        assert "Refactor every module. Never touch tests." in head_texts[2]
        assert "# Recent activity" in head_texts[2]
        assert head_texts[3].startswith("## Active Actors")
        # Verbatim user messages after the watermark follow, as they are.
        rest = view.messages[1:]
        assert [m.id for m in rest if m.role == "user"] == [late.id]
        assert texts(rest[0])[0] == "Also keep the public API stable."
        # Everything the digest covers is gone from the request (R7.3); only the
        # open tool round the agent is in the middle of stays, uncleared (beyond).
        (open_round,) = [m for m in rest if m.role != "user"]
        assert open_round.id == max(
            m.id
            for m in stored
            if m.role == "assistant" and m.agent == "main" and m.id < boundary.id
        )
        (call,) = open_round.parts
        assert isinstance(call, ToolPart)
        assert isinstance(call.state, ToolStateCompleted)
        assert call.state.output != COMPACTED_PLACEHOLDER
        assert open_round.id > checkpoint.digest_up_to
        # R8.2: nothing before the watermark is sent.
        assert first.id not in {m.id for m in view.messages}
        assert view.tokens < 90_000 * 0.5

        # R7.4: tool rounds after the insert are sent as they are.
        later = model.requests[index + 2]
        sent_after = [m for m in later.messages if m.role == "assistant"]
        assert len(sent_after) == 3  # the open round kept live + two rounds after the insert
        for message in sent_after:
            part = message.parts[0]
            assert isinstance(part, ToolPart)
            assert isinstance(part.state, ToolStateCompleted)
            assert part.state.output != COMPACTED_PLACEHOLDER
            assert len(part.state.output) > 10_000

        # R4.5 / A4: results after the watermark compacted, every agent, nothing deleted.
        after = [
            m for m in stored if m.time_created > watermark.time_created and m.id < boundary.id
        ]
        compacted = [
            p
            for m in after
            for p in m.parts
            if isinstance(p, ToolPart)
            and isinstance(p.state, ToolStateCompleted)
            and p.state.time.compacted is not None
        ]
        assert compacted
        stored_sub = await store.get_message(sub.id)
        assert stored_sub is not None
        sub_part = stored_sub.parts[0]
        assert isinstance(sub_part, ToolPart)
        assert isinstance(sub_part.state, ToolStateCompleted)
        assert sub_part.state.time.compacted is not None
        assert sub_part.state.output == "hits"  # cleared in requests only
        assert rebuilt[0].compacted_results == len(compacted)  # the sub-agent result included


async def test_r1_4_same_usage_never_recovered_twice(store: Store, tmp_path: Path) -> None:
    model = ScriptedModel([tool_round("bash", 4000, seed=i, command="make") for i in range(30)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Build it.")
        await run_until_rebuild(mw, session.id, model)
        stored = await store.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1
        # The last usage is still over the line, but it is recovered: ids decide.
        for _ in range(5):
            view = await mw.prepare(session.id)
            assert view.rebuild is None
        stored = await store.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1


async def test_r1_4_concurrent_prepares_insert_one_boundary(store: Store, tmp_path: Path) -> None:
    """50 concurrent prepare() calls for the same usage insert one boundary."""
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="a") for i in range(30)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Read everything.")
        for _ in range(23):
            view = await mw.prepare(session.id)
            if view.rebuild is not None:
                break
            await mw.record(await model.complete(view))
            await settle(mw, session.id)
        count_before = await store.count_messages(session.id)
        views: list[RequestView] = []

        async def one() -> None:
            views.append(await mw.prepare(session.id))

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(one)
        assert sum(v.rebuild is not None for v in views) == 1
        stored = await store.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1
        assert len({v.boundary_id for v in views}) == 1
        # Nothing is deleted: exactly one message (the boundary) was added.
        assert await store.count_messages(session.id) == count_before + 1


async def test_r1_1b_overflow_rebuilds_once_and_retry_succeeds(
    store: Store, tmp_path: Path
) -> None:
    """A provider overflow below the trigger line leads to one rebuild and one retry."""
    events, on_event = recorder()
    model = ScriptedModel(
        [tool_round("read", 4000, seed=i, file_path="b") for i in range(30)],
        overflow_above=60_000,
    )
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 18)
        assert model.overflow_errors == 1
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert len(rebuilt) == 1
        stored = await store.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1
        # The retry was sent on the rebuilt context and answered.
        failed = next(i for i, r in enumerate(model.requests) if r.tokens > 60_000)
        retry = model.requests[failed + 1]
        assert retry.boundary_id is not None
        assert retry.messages[0].id == retry.boundary_id
        assert model.requests[failed + 1].tokens < 60_000


async def test_r1_4_second_overflow_for_same_usage_raises(store: Store, tmp_path: Path) -> None:
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="c") for i in range(30)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 10)
        model.overflow_above = 0  # the provider now refuses everything
        with pytest.raises(ContextOverflowError) as info:
            await mw.turn(session.id, model.complete)
        assert isinstance(info.value.__cause__, FakeOverflowError)
        assert model.overflow_errors == 2  # the first try and the one retry: no loop
        stored = await store.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1


async def test_on_error_passes_other_errors_through(store: Store, tmp_path: Path) -> None:
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")

        async def broken(view: RequestView) -> Message:
            raise PermissionError("401 invalid api key")

        with pytest.raises(PermissionError, match="invalid api key"):
            await mw.turn(session.id, broken)
        assert await mw.on_error(session.id, RuntimeError("rate limited (429)")) is False
        stored = await store.list_messages(session.id, agent=None)
        assert not boundaries(stored)


async def test_r7_4_manual_rebuild_folds_the_whole_tail(store: Store, tmp_path: Path) -> None:
    events, on_event = recorder()
    model = ScriptedModel(
        [tool_round("grep", 3000, seed=i, pattern=f"p{i}") for i in range(8)]
        + [ScriptStep(text="Finished the search.")]
    )
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Search the repo.")
        await run_turns(mw, session.id, model, 9)
        requests_before = len(model.requests)
        report = await mw.rebuild(session.id)
        assert report.outcome == "rebuilt"
        assert report.trigger == "manual"
        # A manual rebuild starts no model turn (A3).
        assert len(model.requests) == requests_before
        view = await mw.prepare(session.id)
        assert view.messages[0].id == report.boundary_id
        # Idle: the whole tail is folded; only user messages may follow.
        assert all(m.role == "user" for m in view.messages)
        body = texts(view.messages[0])[2]
        assert "- assistant: Finished the search." in body
        assert any(getattr(e, "status", "").startswith("Context rebuild: rebuilt") for e in events)


async def test_r3_2_slow_writer_rebuilds_from_checkpoint_on_disk(
    store: Store, tmp_path: Path
) -> None:
    events, on_event = recorder()
    writer = ControlledWriter()
    config = RebuildConfig(writer=WriterConfig(wait_with_watermark=0.2))
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="d") for i in range(30)])
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=config, writer=writer, on_event=on_event
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 14)  # usage ~56k: writers ran at 18k/36k/54k
        on_disk = await store.get_watermark(session.id)
        assert on_disk is not None
        writer.mode = "slow"
        with anyio.fail_after(10):
            await run_until_rebuild(mw, session.id, model)  # crosses 72k (slow writer), 90k
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert [e.outcome for e in rebuilt] == ["rebuilt"]
        assert rebuilt[0].watermark == on_disk  # the checkpoint that was on disk
        assert any(isinstance(e, WaitingForWriter) for e in events)
        writer.release.set()


async def test_r3_3_failing_writer_rebuilds_from_checkpoint_on_disk(
    store: Store, tmp_path: Path
) -> None:
    events, on_event = recorder()
    writer = ControlledWriter()
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="e") for i in range(30)])
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        writer=writer,
        fallback_writer=False,
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 14)
        on_disk = await store.get_watermark(session.id)
        writer.mode = "fail"
        await run_until_rebuild(mw, session.id, model)
        assert any(isinstance(e, WriterFailed) for e in events)
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert [(e.outcome, e.watermark) for e in rebuilt] == [("rebuilt", on_disk)]


async def test_writer_fallback_produces_the_checkpoint(store: Store, tmp_path: Path) -> None:
    """issue 8 item 3: a failing model writer falls back to the offline writer."""
    events, on_event = recorder()
    writer = ControlledWriter()
    writer.mode = "fail"
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="f") for i in range(10)])
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, writer=writer, on_event=on_event
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 6)
        finished = [e for e in events if isinstance(e, WriterFinished)]
        assert finished
        assert finished[0].writer == "offline"
        assert any(isinstance(e, WriterFailed) and e.writer == "controlled" for e in events)


async def test_r3_3_cancelled_wait_leaves_no_task_or_lock(store: Store, tmp_path: Path) -> None:
    writer = ControlledWriter()
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="g") for i in range(30)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, writer=writer) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 14)
        writer.mode = "slow"
        # Cross 72k: a slow writer starts and stays in flight.
        while (await store.latest_finished_assistant(session.id)) is not None:
            view = await mw.prepare(session.id)
            await mw.record(await model.complete(view))
            await settle(mw, session.id)
            last = await store.latest_finished_assistant(session.id)
            assert last is not None
            assert last.usage is not None
            if last.usage.context_tokens >= 90_000:
                break
        assert mw.writer_running(session.id)
        tasks_before = len(asyncio.all_tasks())
        count_before = await store.count_messages(session.id)
        with anyio.move_on_after(0.2) as scope:
            await mw.prepare(session.id)  # waits (30 s bound) for the slow writer
        assert scope.cancelled_caught
        assert len(asyncio.all_tasks()) == tasks_before
        assert not mw._sessions[session.id].lock.locked()  # pyright: ignore[reportPrivateUsage]
        assert await store.count_messages(session.id) == count_before
        # The session keeps working: once the writer finishes, the rebuild runs.
        writer.release.set()
        with anyio.fail_after(10):
            view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"


async def test_r5_9_loop_guard_when_the_live_tail_alone_exceeds_the_line(
    store: Store, tmp_path: Path
) -> None:
    """The user pastes more than the trigger line while the writer is down: the
    message stays live after the watermark (user messages are never folded), so
    each rebuild frees almost nothing. After two such rebuilds in a row automatic
    rebuilds stop for the session and an event says so; no rebuild loop."""
    events, on_event = recorder()
    writer = ControlledWriter()
    model = ScriptedModel(
        [tool_round("read", 4000, seed=i, file_path="h") for i in range(14)]
        + [ScriptStep(text=f"working on it {i}") for i in range(12)]
    )
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        writer=writer,
        fallback_writer=False,
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 14)
        assert await store.get_watermark(session.id) is not None
        writer.mode = "fail"
        await mw.add_user_message(session.id, filler_text(95_000, seed=3))
        await run_turns(mw, session.id, model, 8)
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        disabled = [e for e in events if isinstance(e, AutoRebuildDisabled)]
        assert len(rebuilt) == 3
        assert len(disabled) == 1
        assert len(disabled[0].freed_fractions) == 2
        assert all(f < 0.10 for f in disabled[0].freed_fractions)
        # Each rebuild still fits everything but the live tail under the line.
        assert all(e.tokens_after is not None and e.tokens_after < 100_000 for e in rebuilt)
        count = len(boundaries(await store.list_messages(session.id, agent=None)))
        for _ in range(3):
            await mw.turn(session.id, model.complete)
        assert len(boundaries(await store.list_messages(session.id, agent=None))) == count
        # A manual rebuild is still possible.
        report = await mw.rebuild(session.id)
        assert report.boundary_id is not None


async def test_r1_4a_sub_agent_gets_a_plain_compaction(store: Store, tmp_path: Path) -> None:
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="s") for i in range(30)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Main task.")
        await mw.add_user_message(session.id, "Explore the code.", agent="explore")
        for _ in range(25):
            await mw.turn(session.id, model.complete, agent="explore")
        sub = await store.list_messages(session.id, agent="explore")
        compactions = [m for m in sub if m.is_boundary]
        assert len(compactions) == 1
        assert compactions[0].checkpoint_part is None
        assert compactions[0].parts[0].type == "compaction"
        # The main agent was never rebuilt (R1.4a) and has no boundary.
        assert await store.latest_boundary(session.id) is None
        view = await mw.prepare(session.id, agent="explore")
        assert view.messages[0].id == compactions[0].id
        assert texts(view.messages[0])[0].startswith("Summary of previous conversation:")


async def test_r8_3_per_turn_reminder_in_memory_only(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mimo_ctx._window.MEMORY_RECHECK_SECONDS", 0.0)
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Hello.")
        view = await mw.prepare(session.id)
        # No memory files, no tasks: no reminder (A12).
        assert not any(PER_TURN_MARKER in t for m in view.messages for t in texts(m))
        notes = mw.layout.notes_path(session.id)
        notes.parent.mkdir(parents=True)
        notes.write_text("- remember the port 8080\n")
        view = await mw.prepare(session.id)
        last_user = [m for m in view.messages if m.role == "user"][-1]
        assert sum(PER_TURN_MARKER in t for t in texts(last_user)) == 1
        view = await mw.prepare(session.id)
        last_user = [m for m in view.messages if m.role == "user"][-1]
        assert sum(PER_TURN_MARKER in t for t in texts(last_user)) == 1  # never duplicated
        stored = await store.list_messages(session.id)
        assert not any(PER_TURN_MARKER in t for m in stored for t in texts(m))  # never stored


async def test_r8_1_prefix_is_frozen_and_byte_identical(store: Store, tmp_path: Path) -> None:
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM, tools=[{"name": "read", "x": [1, 2]}])
        again = await mw.open_session(session.id, system="something else")
        assert again.prefix == session.prefix
        await mw.add_user_message(session.id, "Hi.")
        first = await mw.prepare(session.id)
        second = await mw.prepare(session.id)
        assert first.prefix.model_dump_json() == second.prefix.model_dump_json()


async def test_middleware_requires_running_context(store: Store, tmp_path: Path) -> None:
    """Used without ``async with``, a middleware fails at the first call with the fix in
    the message, not at the first rebuild turns later."""
    mw = ContextMiddleware(store, tmp_path / "mem", model=LIMITS)
    session = Session(time_created=0)
    await store.create_session(session)
    for call in (
        mw.open_session(system=SYSTEM),
        mw.prepare(session.id),
        mw.rebuild(session.id),
        mw.start_writer(session.id, reason="test"),
    ):
        with pytest.raises(MimoCtxError, match="async with"):
            await call
    with pytest.raises(MimoCtxError, match="async with"):
        mw.host_history(session.id)
    async with mw:
        with pytest.raises(MimoCtxError, match="unknown session"):
            await mw.prepare("ses_missing")


async def test_events_stream_delivers_typed_events(store: Store, tmp_path: Path) -> None:
    received: list[Event] = []
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="i") for i in range(8)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        with mw.events.subscribe() as stream:
            session = await mw.open_session(system=SYSTEM)
            await mw.add_user_message(session.id, "Go.")
            await run_turns(mw, session.id, model, 6)
            while True:
                try:
                    received.append(stream.receive_nowait())
                except anyio.WouldBlock:
                    break
    assert any(isinstance(e, WriterStarted) for e in received)
    assert all(e.session_id == session.id for e in received)


def _tokens(views: list[RequestView]) -> list[int]:
    return [v.tokens for v in views]


async def test_stored_message_count_never_decreases(store: Store, tmp_path: Path) -> None:
    model = ScriptedModel([tool_round("bash", 4000, seed=i, command="ls") for i in range(40)])
    counts: list[int] = []
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        for _ in range(40):
            await mw.turn(session.id, model.complete)
            await settle(mw, session.id)
            counts.append(await store.count_messages(session.id))
        await mw.rebuild(session.id)
        counts.append(await store.count_messages(session.id))
    assert counts == sorted(counts)
    assert max(_tokens(model.requests)) < 100_000
    assert math.isclose(len(counts), 41)


async def test_a3_ensure_checkpoint_path_writes_then_rebuilds(store: Store, tmp_path: Path) -> None:
    """No watermark yet when the line is crossed: a writer runs and is awaited first."""
    events, on_event = recorder()
    config = RebuildConfig(writer=WriterConfig(thresholds=()))  # no early writers
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="j") for i in range(30)])
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=config, on_event=on_event
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_until_rebuild(mw, session.id, model)
        statuses = [getattr(e, "status", "") for e in events]
        assert "Writing checkpoint…" in statuses
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert [e.outcome for e in rebuilt] == ["rebuilt"]
        assert await store.get_watermark(session.id) == rebuilt[0].watermark


async def test_a3_writer_failed_falls_back_to_plain_compaction(
    store: Store, tmp_path: Path
) -> None:
    events, on_event = recorder()
    writer = ControlledWriter()
    writer.mode = "fail"
    config = RebuildConfig(writer=WriterConfig(thresholds=()))
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="k") for i in range(30)])
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        config=config,
        writer=writer,
        fallback_writer=False,
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_until_rebuild(mw, session.id, model)
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert [e.outcome for e in rebuilt] == ["writer-failed"]
        report = model.requests[-1].rebuild
        assert report is not None
        assert report.fallback == "compaction"
        head = model.requests[-1].messages[0]
        assert texts(head)[0].startswith("Summary of previous conversation:")
        assert await store.get_watermark(session.id) is None


async def test_a3_checkpoint_off_falls_back_to_plain_compaction(
    store: Store, tmp_path: Path
) -> None:
    events, on_event = recorder()
    config = RebuildConfig(checkpoint_enabled=False)
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="l") for i in range(30)])
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=config, on_event=on_event
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_until_rebuild(mw, session.id, model)
        assert not any(isinstance(e, WriterStarted) for e in events)
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert [e.outcome for e in rebuilt] == ["checkpoint-off"]
        assert not mw.layout.checkpoint_path(session.id).exists()


async def test_r4_2_empty_body_is_insert_failed(store: Store, tmp_path: Path) -> None:
    """R4.2/R5.1: nothing to inject → no boundary, outcome insert-failed, no fallback."""
    config = RebuildConfig(push_caps=PushCaps(recent_user=0))
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="m") for i in range(8)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, config=config) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 7)
        assert await store.get_watermark(session.id) is not None
        mw.layout.checkpoint_path(session.id).write_text("")
        count = await store.count_messages(session.id)
        report = await mw.rebuild(session.id)
        assert report.outcome == "insert-failed"
        assert report.boundary_id is None
        assert await store.count_messages(session.id) == count


async def test_r5_6_memory_keys_index_reconciles_files_written_outside_tools(
    store: Store, tmp_path: Path
) -> None:
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="n") for i in range(6)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM, project_id="proj")
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 6)
        ideas = mw.layout.session_dir(session.id) / "ideas.md"
        ideas.write_text("# Ideas\n\n- cache the parser\n")
        report = await mw.rebuild(session.id)
        assert report.boundary_id is not None
        view = await mw.prepare(session.id)
        body = texts(view.messages[0])[2]
        keys = body.split("# Memory keys index\n", 1)[1].split("\n\n", 1)[0]
        assert f"- sessions/{session.id}/ideas.md" in keys.splitlines()
        # Injected files are not listed again (R5.6).
        assert "checkpoint.md" not in keys
        # The model's memory tool searches the same index.
        found = await mw.tools(session.id).call(
            "memory", {"operation": "search", "query": "parser"}
        )
        assert "ideas.md" in found


async def test_stale_checkpoint_starts_a_writer_before_the_next_rebuild(
    store: Store, tmp_path: Path
) -> None:
    """Beyond R3.2: below 25000 usable tokens no threshold starts a writer (A3); a
    rebuild whose checkpoint has not moved since the last one refreshes it first, so
    the live tail does not grow rebuild after rebuild."""
    events, on_event = recorder()
    small = ModelLimits(25_000, input_limit=25_000)
    model = ScriptedModel([tool_round("read", 2000, seed=i, file_path="o") for i in range(40)])
    async with ContextMiddleware(store, tmp_path / "mem", model=small, on_event=on_event) as mw:
        assert mw.thresholds == []
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_until_rebuild(mw, session.id, model)
        await run_until_rebuild(mw, session.id, model)
        rebuilt = [e for e in events if isinstance(e, ContextRebuilt)]
        assert len(rebuilt) == 2
        first, second = rebuilt
        assert first.watermark is not None
        assert second.watermark is not None
        assert second.watermark > first.watermark
        reasons = [e.reason for e in events if isinstance(e, WriterStarted)]
        assert any(r.startswith("stale checkpoint") for r in reasons)
        assert second.tokens_after is not None
        assert second.tokens_after < 22_500 // 2


async def test_mid_loop_rebuild_keeps_the_open_round_in_provider_form(
    store: Store, tmp_path: Path
) -> None:
    """Provider-format histories keep results in ``tool`` messages: a rebuild right
    after such a round keeps the call and its result live, uncleared (beyond R7.4)."""
    from mimo_ctx.messages import TokenUsage, ToolResultPart, ToolStatePending

    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="p") for i in range(12)])
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Go.")
        await run_turns(mw, session.id, model, 12)
        last = await store.latest_finished_assistant(session.id)
        assert last is not None
        call = Message(
            session_id=session.id,
            role="assistant",
            time_created=last.time_created + 10,
            finish="tool-calls",
            usage=TokenUsage(input=95_000, output=50),
            parts=[
                ToolPart(call_id="split-1", tool="bash", state=ToolStatePending(input={"c": "ls"}))
            ],
        )
        result = Message(
            session_id=session.id,
            role="tool",
            time_created=last.time_created + 11,
            parts=[ToolResultPart(call_id="split-1", tool="bash", output="file-a file-b")],
        )
        await mw.append([call, result])
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        assert [m.id for m in view.messages[-2:]] == [call.id, result.id]
        (sent_result,) = view.messages[-1].parts
        assert isinstance(sent_result, ToolResultPart)
        assert sent_result.output == "file-a file-b"
        stored = await store.get_message(result.id)
        assert stored is not None
        part = stored.parts[0]
        assert isinstance(part, ToolResultPart)
        assert part.time.compacted is None


async def test_open_session_refuses_ids_that_cannot_name_a_directory(
    store: Store, tmp_path: Path
) -> None:
    from mimo_ctx.errors import PathEscapeError

    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        with pytest.raises(PathEscapeError):
            await mw.open_session("../escape")
        with pytest.raises(PathEscapeError):
            await mw.open_session(project_id="a/b")
        assert await store.list_sessions() == []
