"""The send rules (SPEC A10, R8.1, R4.5): what of a stored history reaches a model."""

from __future__ import annotations

from typing import Any

from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    FilePart,
    Message,
    MessageFailure,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    ToolTime,
)
from mimo_ctx.view import (
    CHECKPOINT_SUMMARY_HEADER,
    COMPACTED_PLACEHOLDER,
    COMPACTION_SUMMARY_HEADER,
    INTERRUPTED_TOOL_ERROR,
    apply_send_rules,
    has_real_content,
    subtask_text,
    tool_results_by_call,
)

_counter = iter(range(1, 10_000))


def _msg(role: Role, parts: list[Part], **extra: Any) -> Message:
    n = next(_counter)
    return Message(
        id=f"msg_{n:06d}", session_id="ses_1", role=role, time_created=n, parts=parts, **extra
    )


def _completed(call_id: str = "c1", output: str = "out", **state: Any) -> ToolPart:
    return ToolPart(
        call_id=call_id,
        tool="read",
        state=ToolStateCompleted(input={"path": "a.py"}, output=output, **state),
    )


def test_constants_match_the_spec() -> None:
    """SPEC A10 / R4.5 / R8.1 wording is fixed."""
    assert COMPACTED_PLACEHOLDER == "[Old tool result content cleared]"
    assert INTERRUPTED_TOOL_ERROR == "[Tool execution was interrupted]"
    assert CHECKPOINT_SUMMARY_HEADER == "Summary of previous conversation from checkpoint files:"
    assert COMPACTION_SUMMARY_HEADER == "Summary of previous conversation:"


def test_a10_ignored_text_dropped_synthetic_kept() -> None:
    msg = _msg(
        "user",
        [
            TextPart(text="shown"),
            TextPart(text="hidden", ignored=True),
            TextPart(text="library text", synthetic=True),
        ],
    )
    [out] = apply_send_rules([msg])
    assert [p.text for p in out.parts if isinstance(p, TextPart)] == ["shown", "library text"]


def test_r8_1_checkpoint_part_reads_the_fixed_header() -> None:
    boundary = _msg(
        "user",
        [CheckpointPart(covered_up_to="msg_000001"), TextPart(text="body", synthetic=True)],
    )
    [out] = apply_send_rules([boundary])
    first = out.parts[0]
    assert isinstance(first, TextPart)
    assert first.text == "Summary of previous conversation from checkpoint files:"
    assert first.synthetic
    assert first.id == boundary.parts[0].id  # deterministic: same part id every turn
    assert isinstance(out.parts[1], TextPart)


def test_a10_compaction_part_reads_header_blank_line_summary() -> None:
    [out] = apply_send_rules([_msg("user", [CompactionPart(summary="We fixed the parser.")])])
    [part] = out.parts
    assert isinstance(part, TextPart)
    assert part.text == "Summary of previous conversation:\n\nWe fixed the parser."


def test_a10_compaction_without_summary_is_the_header_alone() -> None:
    [out] = apply_send_rules([_msg("user", [CompactionPart(summary="")])])
    [part] = out.parts
    assert isinstance(part, TextPart)
    assert part.text == COMPACTION_SUMMARY_HEADER


def test_r4_5_compacted_tool_part_reads_placeholder_and_loses_attachments() -> None:
    image = FilePart(mime="image/png", url="data:image/png;base64,AAAA")
    call = _completed(output="x" * 5000, attachments=[image], time=ToolTime(compacted=5))
    [out] = apply_send_rules([_msg("assistant", [call], finish="tool-calls")])
    [part] = out.parts
    assert isinstance(part, ToolPart)
    assert isinstance(part.state, ToolStateCompleted)
    assert part.state.output == "[Old tool result content cleared]"
    assert part.state.attachments == []
    assert part.state.input == {"path": "a.py"}  # the call itself is kept


def test_r4_5_uncompacted_result_is_sent_unchanged() -> None:
    msg = _msg("assistant", [_completed(output="keep me")], finish="tool-calls")
    [out] = apply_send_rules([msg])
    assert out is msg  # unchanged messages are shared (their token cache stays valid)


def test_r4_5_compacted_tool_result_part_reads_placeholder() -> None:
    call = ToolPart(call_id="c1", tool="bash", state=ToolStatePending(input={"cmd": "ls"}))
    result = ToolResultPart(call_id="c1", tool="bash", output="big", time=ToolTime(compacted=9))
    out = apply_send_rules([_msg("assistant", [call]), _msg("tool", [result])])
    sent = out[1].parts[0]
    assert isinstance(sent, ToolResultPart)
    assert sent.output == COMPACTED_PLACEHOLDER


def test_a10_pending_and_running_calls_become_interrupted_errors() -> None:
    pending = ToolPart(call_id="p", tool="bash", state=ToolStatePending(input={"cmd": "make"}))
    running = ToolPart(
        call_id="r",
        tool="bash",
        state=ToolStateRunning(input={"cmd": "test"}, time=ToolTime(start=3)),
    )
    [out] = apply_send_rules([_msg("assistant", [pending, running])])
    states = [p.state for p in out.parts if isinstance(p, ToolPart)]
    assert all(isinstance(s, ToolStateError) for s in states)
    assert [s.error for s in states if isinstance(s, ToolStateError)] == [
        "[Tool execution was interrupted]"
    ] * 2
    assert [s.input for s in states] == [{"cmd": "make"}, {"cmd": "test"}]
    assert isinstance(states[1], ToolStateError)
    assert states[1].time.start == 3


def test_a10_pending_call_answered_by_a_later_result_part_is_not_interrupted() -> None:
    """Provider storage: the result is a separate ToolResultPart; it is the call's result."""
    call = ToolPart(call_id="c9", tool="grep", state=ToolStatePending(input={"q": "x"}))
    result = ToolResultPart(call_id="c9", tool="grep", output="found")
    view = apply_send_rules([_msg("assistant", [call]), _msg("tool", [result])])
    sent_call = view[0].parts[0]
    assert isinstance(sent_call, ToolPart)
    assert isinstance(sent_call.state, ToolStatePending)
    assert tool_results_by_call(view) == {"c9": result}


def test_a10_errored_assistant_is_skipped() -> None:
    failed = _msg(
        "assistant",
        [TextPart(text="half an answer")],
        error=MessageFailure(name="APIError", message="boom"),
    )
    assert apply_send_rules([failed]) == []


def test_a10_aborted_assistant_with_real_content_is_kept() -> None:
    aborted = MessageFailure(name="AbortedError", aborted=True)
    with_text = _msg("assistant", [TextPart(text="partial")], error=aborted)
    with_call = _msg("assistant", [_completed()], error=aborted)
    blank = _msg("assistant", [TextPart(text="  \n")], error=aborted)
    thinking_only = _msg("assistant", [ReasoningPart(text="hmm", signature="s")], error=aborted)
    ignored_only = _msg("assistant", [TextPart(text="x", ignored=True)], error=aborted)
    out = apply_send_rules([with_text, with_call, blank, thinking_only, ignored_only])
    assert [m.id for m in out] == [with_text.id, with_call.id]
    assert has_real_content(with_call)
    assert not has_real_content(thinking_only)


def test_a10_results_of_a_skipped_call_are_not_sent() -> None:
    """A result whose call was skipped would be an orphan, which providers reject."""
    call = ToolPart(call_id="c1", tool="bash", state=ToolStatePending())
    failed = _msg("assistant", [call], error=MessageFailure(name="APIError"))
    result = _msg("tool", [ToolResultPart(call_id="c1", tool="bash", output="?")])
    user = _msg("user", [TextPart(text="again")])
    assert [m.id for m in apply_send_rules([failed, result, user])] == [user.id]


def test_a10_second_result_for_one_call_is_not_sent() -> None:
    call = ToolPart(call_id="c1", tool="bash", state=ToolStatePending())
    first = ToolResultPart(call_id="c1", tool="bash", output="one")
    second = ToolResultPart(call_id="c1", tool="bash", output="two")
    out = apply_send_rules([_msg("assistant", [call]), _msg("tool", [first, second])])
    assert out[1].parts == [first]


def test_a10_result_before_its_call_is_an_orphan() -> None:
    result = _msg("tool", [ToolResultPart(call_id="c1", tool="bash", output="early")])
    call = _msg("assistant", [_completed("c1")])
    assert [m.id for m in apply_send_rules([result, call])] == [call.id]


def test_a10_opaque_parts_dropped_and_empty_messages_dropped() -> None:
    opaque = OpaquePart(source="pydantic-ai", kind="builtin-tool-call", data={"x": 1})
    mixed = _msg("assistant", [TextPart(text="hello"), opaque])
    only_opaque = _msg("assistant", [opaque])
    only_ignored = _msg("user", [TextPart(text="x", ignored=True)])
    empty = _msg("user", [])
    out = apply_send_rules([mixed, only_opaque, only_ignored, empty])
    assert [m.id for m in out] == [mixed.id]
    assert [p.type for p in out[0].parts] == ["text"]


def test_a10_subtask_is_sent_as_text() -> None:
    part = SubtaskPart(agent="explore", description="find the parser", prompt="Look in src/.")
    [out] = apply_send_rules([_msg("user", [part])])
    [text] = out.parts
    assert isinstance(text, TextPart)
    assert text.text == "Subtask for agent explore: find the parser\n\nLook in src/."
    assert subtask_text(SubtaskPart(agent="a", command="review")) == "Subtask for agent a: /review"


def test_a10_reasoning_and_files_pass_through() -> None:
    reasoning = ReasoningPart(text="think", signature="sig")
    file = FilePart(mime="image/png", url="https://x/y.png")
    msg = _msg("user", [file])
    out = apply_send_rules([msg, _msg("assistant", [reasoning, TextPart(text="a")])])
    assert out[0] is msg
    assert out[1].parts[0] is reasoning


def test_a10_never_mutates_its_input() -> None:
    history = [
        _msg("user", [CheckpointPart(covered_up_to="m"), TextPart(text="x", ignored=True)]),
        _msg(
            "assistant",
            [
                _completed(time=ToolTime(compacted=1)),
                ToolPart(call_id="c2", tool="t", state=ToolStateRunning()),
            ],
            error=MessageFailure(name="AbortedError", aborted=True),
        ),
    ]
    before = [m.model_dump() for m in history]
    out = apply_send_rules(history)
    assert [m.model_dump() for m in history] == before
    assert all(o is not h for o, h in zip(out, history, strict=True))
