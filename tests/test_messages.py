"""Tests of the message model (mimo_ctx.messages) and of the shared session strategy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from strategies import (
    ToolResultForm,
    checkpoint_parts,
    compaction_parts,
    file_parts,
    messages,
    opaque_parts,
    parts,
    reasoning_parts,
    sessions,
    subtask_parts,
    text_parts,
    token_usages,
    tool_parts,
    tool_result_parts,
    tool_states_completed,
    tool_states_error,
    tool_states_pending,
    tool_states_running,
)

from mimo_ctx import ids
from mimo_ctx.messages import (
    MAIN_AGENT,
    CheckpointPart,
    CompactionPart,
    Message,
    Part,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStatePending,
    ToolStateRunning,
)
from mimo_ctx.tokens import estimate_message_tokens

_PART_KINDS: dict[str, st.SearchStrategy[Any]] = {
    "text": text_parts(),
    "reasoning": reasoning_parts(),
    "tool": tool_parts(),
    "tool_result": tool_result_parts(),
    "file": file_parts(),
    "subtask": subtask_parts(),
    "checkpoint": checkpoint_parts(),
    "compaction": compaction_parts(),
    "opaque": opaque_parts(),
}
_TOOL_STATES: dict[str, st.SearchStrategy[Any]] = {
    "pending": tool_states_pending(),
    "running": tool_states_running(),
    "completed": tool_states_completed(),
    "error": tool_states_error(),
}


def _message(*parts: Part, role: str = "user") -> Message:
    return Message.model_validate(
        {"session_id": "ses_x", "role": role, "time_created": 1, "parts": list(parts)}
    )


def _json_round_trip(model: BaseModel) -> Message:
    return Message.model_validate_json(model.model_dump_json())


# ------------------------------------------------------------------ JSON round trip


@pytest.mark.parametrize("kind", sorted(_PART_KINDS))
@given(data=st.data())
def test_json_round_trip_is_lossless_for_every_part_kind(kind: str, data: st.DataObject) -> None:
    part = data.draw(_PART_KINDS[kind])
    assert part.type == kind
    message = _message(part, role="assistant")
    restored = _json_round_trip(message)
    assert restored == message
    assert restored.parts[0] == part
    assert type(restored.parts[0]) is type(part)


@pytest.mark.parametrize("status", sorted(_TOOL_STATES))
@given(data=st.data())
def test_json_round_trip_is_lossless_for_every_tool_state(status: str, data: st.DataObject) -> None:
    state = data.draw(_TOOL_STATES[status])
    part = ToolPart(call_id="call_1", tool="bash", state=state)
    restored = _json_round_trip(_message(part, role="assistant")).parts[0]
    assert isinstance(restored, ToolPart)
    assert restored.state.status == status
    assert restored == part


@given(messages())
def test_json_round_trip_is_lossless_for_any_message(message: Message) -> None:
    restored = _json_round_trip(message)
    assert restored == message
    # Through plain JSON text too (what a store or a file writes).
    via_text = Message.model_validate(json.loads(json.dumps(message.model_dump(mode="json"))))
    assert via_text == message


@given(sessions())
def test_json_round_trip_is_lossless_for_sessions(session: list[Message]) -> None:
    assert [_json_round_trip(m) for m in session] == session


# ------------------------------------------------------------------ validation


def test_unknown_part_type_is_rejected_naming_the_type() -> None:
    raw = {
        "session_id": "ses_x",
        "role": "user",
        "time_created": 1,
        "parts": [{"type": "text", "text": "ok"}, {"type": "step-start", "id": "prt_1"}],
    }
    with pytest.raises(ValidationError) as info:
        Message.model_validate(raw)
    assert "'step-start'" in str(info.value)
    assert "parts.1" in str(info.value)


def test_unknown_part_type_is_rejected_from_json_too() -> None:
    raw = '{"session_id":"s","role":"user","time_created":1,"parts":[{"type":"patch"}]}'
    with pytest.raises(ValidationError, match="'patch'"):
        Message.model_validate_json(raw)


def test_part_without_type_is_rejected() -> None:
    with pytest.raises(ValidationError, match="type"):
        Message.model_validate(
            {"session_id": "s", "role": "user", "time_created": 1, "parts": [{"text": "x"}]}
        )


def test_unknown_field_is_rejected_naming_it() -> None:
    with pytest.raises(ValidationError, match="colour"):
        TextPart.model_validate({"type": "text", "text": "x", "colour": "red"})


def test_unknown_tool_status_is_rejected_naming_it() -> None:
    with pytest.raises(ValidationError, match="'cancelled'"):
        ToolPart.model_validate(
            {"call_id": "c", "tool": "bash", "state": {"status": "cancelled", "input": {}}}
        )


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValidationError, match="role"):
        Message.model_validate({"session_id": "s", "role": "system", "time_created": 1})


def test_defaults() -> None:
    message = _message(TextPart(text="hi"))
    assert message.agent == MAIN_AGENT == "main"
    assert ids.timestamp_of(message.id) >= 0
    assert message.id.startswith("msg_")
    assert message.parts[0].id.startswith("prt_")
    assert message.usage is None
    assert not message.summary


# ------------------------------------------------------------------ cached estimate


def test_model_copy_with_update_drops_the_cached_token_estimate() -> None:
    message = _message(TextPart(text="a" * 400))
    before = estimate_message_tokens(message)
    longer = message.model_copy(update={"parts": [TextPart(text="a" * 4000)]})
    assert estimate_message_tokens(longer) > before
    assert estimate_message_tokens(message) == before


def test_model_copy_without_update_keeps_the_cached_token_estimate() -> None:
    message = _message(TextPart(text="a" * 400))
    estimate = estimate_message_tokens(message)
    copy = message.model_copy()
    assert copy._token_estimate == estimate  # pyright: ignore[reportPrivateUsage]
    deep = message.model_copy(deep=True)
    assert deep._token_estimate == estimate  # pyright: ignore[reportPrivateUsage]


def test_model_copy_with_an_update_of_other_fields_also_drops_the_estimate() -> None:
    message = _message(TextPart(text="a" * 400))
    estimate_message_tokens(message)
    copy = message.model_copy(update={"metadata": {"k": 1}})
    assert copy._token_estimate is None  # pyright: ignore[reportPrivateUsage]


# ------------------------------------------------------------------ boundaries


def test_r4_4_user_message_with_checkpoint_part_is_a_boundary() -> None:
    checkpoint = CheckpointPart(covered_up_to="msg_1")
    message = _message(checkpoint, TextPart(text="body", synthetic=True))
    assert message.is_boundary
    assert message.checkpoint_part is checkpoint


def test_r1_4a_user_message_with_compaction_part_is_a_boundary_without_checkpoint() -> None:
    message = _message(CompactionPart(summary="earlier work"))
    assert message.is_boundary
    assert message.checkpoint_part is None


def test_assistant_message_with_checkpoint_part_is_not_a_boundary() -> None:
    checkpoint = CheckpointPart(covered_up_to="msg_1")
    message = _message(checkpoint, role="assistant")
    assert not message.is_boundary
    assert message.checkpoint_part is checkpoint


def test_plain_user_message_is_not_a_boundary() -> None:
    message = _message(TextPart(text="hello"), TextPart(text="x", synthetic=True))
    assert not message.is_boundary
    assert message.checkpoint_part is None
    assert not _message().is_boundary


@given(messages())
def test_is_boundary_property(message: Message) -> None:
    kinds = {p.type for p in message.parts}
    assert message.is_boundary == (
        message.role == "user" and bool(kinds & {"checkpoint", "compaction"})
    )
    first = next((p for p in message.parts if p.type == "checkpoint"), None)
    assert message.checkpoint_part is first


# ------------------------------------------------------------------ usage


def test_r1_2_context_tokens_is_the_total_when_given() -> None:
    usage = TokenUsage(input=10, output=20, cache_read=30, cache_write=40, total=500)
    assert usage.context_tokens == 500


def test_r1_2_context_tokens_sums_input_output_and_cache_without_total() -> None:
    usage = TokenUsage(input=10, output=20, reasoning=7, cache_read=30, cache_write=40)
    # Reasoning is already part of output for every supported provider.
    assert usage.context_tokens == 100


def test_r1_2_context_tokens_treats_a_zero_total_as_missing() -> None:
    # The original reads `total || input + output + ...`: a zero total is no total.
    assert TokenUsage(input=5, output=1, total=0).context_tokens == 6


@given(token_usages())
def test_r1_2_context_tokens_property(usage: TokenUsage) -> None:
    summed = usage.input + usage.output + usage.cache_read + usage.cache_write
    assert usage.context_tokens == (usage.total or summed)


def test_negative_usage_is_rejected() -> None:
    with pytest.raises(ValidationError, match="input"):
        TokenUsage(input=-1)


# ------------------------------------------------------------------ the session strategy


def _check_session_conventions(session: list[Message], form: ToolResultForm) -> None:
    assert session
    assert len({m.session_id for m in session}) == 1
    msg_ids = [m.id for m in session]
    assert msg_ids == sorted(msg_ids)
    assert len(set(msg_ids)) == len(msg_ids)
    times = [m.time_created for m in session]
    assert times == sorted(times)
    assert all(ids.timestamp_of(m.id) == m.time_created for m in session)
    assert session[0].role == "user"
    assert session[0].agent == MAIN_AGENT

    pending: dict[str, tuple[int, str]] = {}  # call id -> (index, agent)
    for index, message in enumerate(session):
        for part in message.parts:
            if isinstance(part, ToolPart) and isinstance(part.state, ToolStatePending):
                assert form != "inline"
                pending[part.call_id] = (index, message.agent)
            if isinstance(part, ToolResultPart):
                assert form != "inline"
                assert message.role == "tool"
                call_index, agent = pending.pop(part.call_id)
                assert call_index < index
                assert agent == message.agent
            if isinstance(part, ToolPart) and isinstance(part.state, ToolStateCompleted):
                assert form != "split"
        if message.role == "assistant" and message.finish is not None:
            assert message.usage is not None
        if message.role == "assistant" and message.agent == MAIN_AGENT:
            # A split call's results arrive before the agent's next assistant message.
            assert all(i >= index or session[i].agent != MAIN_AGENT for i, _ in pending.values())
    assert not pending, "every split call has its result"
    running = [
        m
        for m in session
        if any(isinstance(p, ToolPart) and isinstance(p.state, ToolStateRunning) for p in m.parts)
    ]
    if running:
        assert running == [session[-1]]
        assert session[-1].finish is None


@pytest.mark.parametrize("form", ["inline", "split", "mixed"])
@given(data=st.data())
def test_sessions_strategy_keeps_its_documented_conventions(
    form: ToolResultForm, data: st.DataObject
) -> None:
    session = data.draw(sessions(tool_results=form))
    _check_session_conventions(session, form)


@given(sessions(sub_agents=False, min_turns=2))
def test_sessions_strategy_without_sub_agents(session: list[Message]) -> None:
    assert all(m.agent == MAIN_AGENT for m in session)
    assert sum(m.role == "user" for m in session) >= 2


@given(sessions(unfinished=False))
def test_sessions_strategy_finished_session_ends_with_a_stop(session: list[Message]) -> None:
    assert session[-1].role == "assistant"
    assert session[-1].finish == "stop"


@given(parts())
def test_every_part_kind_dumps_its_type_and_id(part: Part) -> None:
    dumped = part.model_dump(mode="json")
    assert dumped["type"] == part.type
    assert dumped["id"] == part.id
