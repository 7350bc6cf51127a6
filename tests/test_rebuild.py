"""Boundary message and micro-compaction, the pure half of the rebuild (SPEC R4, A4)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.compaction import build_boundary_message, build_compaction_message, micro_compact
from mimo_ctx.config import DEFAULT_MICRO_COMPACT_TOOLS
from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    Message,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStateRunning,
    ToolTime,
)


def _tool(tool: str, *, t: int, agent: str = "main", compacted: int | None = None) -> Message:
    return Message(
        session_id="s",
        role="assistant",
        agent=agent,
        time_created=t,
        finish="tool-calls",
        parts=[
            ToolPart(
                call_id=f"c{t}",
                tool=tool,
                state=ToolStateCompleted(
                    input={"x": 1}, output="big output", time=ToolTime(compacted=compacted)
                ),
            )
        ],
    )


def test_r4_5_a4_compacts_listed_tools_after_the_watermark_time_only() -> None:
    before = _tool("read", t=100)
    same_time = _tool("read", t=200)
    after = _tool("bash", t=201)
    sub_agent = _tool("grep", t=202, agent="explore")
    stateful = _tool("task", t=203)
    changed = micro_compact(
        [before, same_time, after, sub_agent, stateful],
        after_time=200,
        tools=DEFAULT_MICRO_COMPACT_TOOLS,
        now_ms=999,
    )
    assert [m.id for m in changed] == [after.id, sub_agent.id]
    for message in changed:
        part = message.parts[0]
        assert isinstance(part, ToolPart)
        assert isinstance(part.state, ToolStateCompleted)
        assert part.state.time.compacted == 999
        assert part.state.output == "big output"  # nothing deleted
    # The inputs are values: untouched.
    original = after.parts[0]
    assert isinstance(original, ToolPart)
    assert isinstance(original.state, ToolStateCompleted)
    assert original.state.time.compacted is None


def test_a4_tool_names_match_case_insensitively() -> None:
    """Claude Code names its tools ``Read``, ``Bash``, ``WebFetch``..."""
    messages = [_tool(name, t=300 + i) for i, name in enumerate(["Read", "Bash", "WebFetch"])]
    changed = micro_compact(messages, after_time=0, tools=DEFAULT_MICRO_COMPACT_TOOLS, now_ms=1)
    assert len(changed) == 3


def test_a4_skips_boundary_errors_running_and_already_compacted() -> None:
    done = _tool("read", t=10, compacted=5)
    failed = Message(
        session_id="s",
        role="assistant",
        time_created=11,
        parts=[ToolPart(call_id="e", tool="read", state=ToolStateError(error="boom"))],
    )
    running = Message(
        session_id="s",
        role="assistant",
        time_created=12,
        parts=[ToolPart(call_id="r", tool="read", state=ToolStateRunning())],
    )
    skipped = _tool("read", t=13)
    changed = micro_compact(
        [done, failed, running, skipped],
        after_time=0,
        tools=DEFAULT_MICRO_COMPACT_TOOLS,
        now_ms=7,
        skip_ids={skipped.id},
    )
    assert changed == []


def test_a4_split_tool_results_are_compacted_too() -> None:
    result = Message(
        session_id="s",
        role="tool",
        time_created=50,
        parts=[
            ToolResultPart(call_id="c1", tool="grep", output="hits"),
            ToolResultPart(call_id="c2", tool="grep", output="boom", is_error=True),
        ],
    )
    (changed,) = micro_compact([result], after_time=0, tools=("grep",), now_ms=3)
    ok, error = changed.parts
    assert isinstance(ok, ToolResultPart)
    assert ok.time.compacted == 3
    assert isinstance(error, ToolResultPart)
    assert error.time.compacted is None


@given(st.lists(st.sampled_from(["read", "bash", "task", "Read", "memory"]), max_size=12))
def test_a4_micro_compaction_is_idempotent(tools: list[str]) -> None:
    messages = [_tool(name, t=i + 1) for i, name in enumerate(tools)]
    once = micro_compact(messages, after_time=0, tools=DEFAULT_MICRO_COMPACT_TOOLS, now_ms=9)
    by_id = {m.id: m for m in once}
    merged = [by_id.get(m.id, m) for m in messages]
    assert micro_compact(merged, after_time=0, tools=DEFAULT_MICRO_COMPACT_TOOLS, now_ms=10) == []


def test_r4_3_r4_4_boundary_message_shape() -> None:
    watermark = Message(session_id="s", role="assistant", time_created=1_000, agent="main")
    boundary = build_boundary_message(
        watermark=watermark,
        digest_up_to="msg_z",
        directory="/mem/sessions/s",
        number=2,
        index_text="## Checkpoint\n...",
        body="The sections below ...",
        actors_text="## Active Actors\n...",
    )
    assert boundary.role == "user"
    assert boundary.time_created == 1_001  # back-dated: sorts right after the watermark
    assert boundary.id > watermark.id  # but the newest id
    checkpoint, index, body, actors = boundary.parts
    assert isinstance(checkpoint, CheckpointPart)
    assert (checkpoint.covered_up_to, checkpoint.digest_up_to) == (watermark.id, "msg_z")
    assert (checkpoint.directory, checkpoint.number) == ("/mem/sessions/s", 2)
    for part, text in ((index, "## Checkpoint"), (body, "The sections"), (actors, "## Active")):
        assert isinstance(part, TextPart)
        assert part.synthetic
        assert part.text.startswith(text)
    assert boundary.is_boundary


def test_r1_4a_compaction_message_covers_up_to_the_watermark() -> None:
    watermark = Message(session_id="s", role="assistant", time_created=50, agent="explore")
    message = build_compaction_message(watermark=watermark, summary="did things", auto=True)
    (part,) = message.parts
    assert isinstance(part, CompactionPart)
    assert part.covered_up_to == watermark.id
    assert message.agent == "explore"
    assert message.time_created == 51
    assert message.is_boundary


def test_r4_3_boundary_id_is_newer_than_the_newest_message_across_clocks() -> None:
    from mimo_ctx import ids

    watermark = Message(session_id="s", role="assistant", time_created=1_000)
    newest = ids.ascending("msg", timestamp_ms=4_000_000_000_000)  # a clock far ahead
    boundary = build_boundary_message(
        watermark=watermark,
        digest_up_to=None,
        directory="d",
        number=1,
        index_text="i",
        body="b",
        actors_text="a",
        newer_than=newest,
    )
    assert boundary.id > newest
    compaction = build_compaction_message(
        watermark=watermark, summary="s", auto=True, newer_than=newest
    )
    assert compaction.id > newest
