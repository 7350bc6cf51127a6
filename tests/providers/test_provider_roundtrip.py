"""Round trips provider payload -> internal -> payload, and the validator over converter output.

Issue 5 items 3 and 4: a round trip keeps content, order and tool pairing (parallel
calls included); every payload the converters build from any history, however
messy (SPEC A10 cases: failed and aborted messages, interrupted calls, compacted
results, orphan results), passes :func:`validate_request`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from provider_strategies import (
    anthropic_payloads,
    histories,
    openai_chat_payloads,
    openai_responses_payloads,
)

from mimo_ctx.messages import Message, ToolPart, ToolResultPart
from mimo_ctx.providers.anthropic import from_anthropic, to_anthropic
from mimo_ctx.providers.openai import (
    from_openai_chat,
    from_openai_responses,
    to_openai_chat,
    to_openai_responses,
)
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.view import apply_send_rules

_SETTINGS = settings(max_examples=150, deadline=None)


@_SETTINGS
@given(openai_chat_payloads())
def test_openai_chat_round_trip_is_exact(payload: list[dict[str, Any]]) -> None:
    validate_request(payload, format="openai-chat")
    system, messages = from_openai_chat(payload, session_id="ses_rt")
    assert to_openai_chat(messages, system=system) == payload


@_SETTINGS
@given(openai_responses_payloads())
def test_openai_responses_round_trip_is_exact(items: list[dict[str, Any]]) -> None:
    validate_request(items, format="openai-responses")
    system, messages = from_openai_responses(items, session_id="ses_rt")
    assert system is None
    assert to_openai_responses(messages) == items


@_SETTINGS
@given(anthropic_payloads())
def test_anthropic_round_trip_is_exact(payload: list[dict[str, Any]]) -> None:
    validate_request({"system": "be brief", "messages": payload}, format="anthropic")
    system, messages = from_anthropic("be brief", payload, session_id="ses_rt")
    assert to_anthropic(messages, system=system) == ("be brief", payload)


@_SETTINGS
@given(anthropic_payloads())
def test_anthropic_results_are_joined_into_their_calls(payload: list[dict[str, Any]]) -> None:
    """No tool message is left over: every tool_result joins its tool_use."""
    _, messages = from_anthropic(None, payload, session_id="ses_rt")
    assert all(m.role != "tool" for m in messages)
    calls = [p for m in messages for p in m.parts if isinstance(p, ToolPart)]
    assert all(c.state.status in ("completed", "error") for c in calls)


@_SETTINGS
@given(openai_chat_payloads())
def test_openai_chat_to_anthropic_keeps_pairing(payload: list[dict[str, Any]]) -> None:
    """Cross-provider: a chat history re-sent to Anthropic is valid and keeps every call."""
    _, messages = from_openai_chat(payload, session_id="ses_rt")
    _, out = to_anthropic(messages)
    validate_request(out, format="anthropic")
    sent = [b["id"] for m in out for b in m["content"] if b["type"] == "tool_use"]
    expected = [c["id"] for m in payload for c in m.get("tool_calls", [])]
    assert sent == expected


def _calls(view: list[Message]) -> list[str]:
    return [
        p.call_id for m in view if m.role == "assistant" for p in m.parts if isinstance(p, ToolPart)
    ]


@settings(max_examples=400, deadline=None)
@given(histories())
def test_every_converter_output_passes_the_validator(history: list[Message]) -> None:
    chat = to_openai_chat(history, system="sys")
    validate_request(chat, format="openai-chat")
    responses = to_openai_responses(history)
    validate_request({"input": responses}, format="openai-responses")
    system, messages = to_anthropic(history, system="sys")
    assert system == "sys"
    validate_request({"system": system, "messages": messages}, format="anthropic")

    # Every call the view sends reaches every provider, each with one result.
    calls = _calls(apply_send_rules(history))
    assert [c["id"] for m in chat for c in m.get("tool_calls", [])] == calls
    assert [i["call_id"] for i in responses if i["type"] == "function_call"] == calls
    assert [b["id"] for m in messages for b in m["content"] if b["type"] == "tool_use"] == calls


@settings(max_examples=300, deadline=None)
@given(histories())
def test_send_rules_are_idempotent_and_pure(history: list[Message]) -> None:
    before = [m.model_dump() for m in history]
    once = apply_send_rules(history)
    assert [m.model_dump() for m in history] == before
    assert [m.model_dump() for m in apply_send_rules(once)] == [m.model_dump() for m in once]
    for message in once:
        assert message.parts
        for part in message.parts:
            assert part.type not in ("opaque", "checkpoint", "compaction", "subtask")
            assert not (part.type == "text" and part.ignored)
            assert not (
                isinstance(part, ToolPart) and part.state.status in ("pending", "running")
            ) or any(
                isinstance(q, ToolResultPart) and q.call_id == part.call_id
                for m in once
                for q in m.parts
            )
