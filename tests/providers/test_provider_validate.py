"""The outgoing-request validator: each violation is caught with a clear message (issue 5.4)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mimo_ctx.errors import InvalidRequestError, MimoCtxError
from mimo_ctx.providers.validate import validate_request


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "read", "arguments": "{}"}}


def _asst(*call_ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [_call(c) for c in call_ids]}


def _tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "x"}


USER = {"role": "user", "content": "hi"}


def _fails(payload: Any, fmt: Any, fragment: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(fragment)) as info:
        validate_request(payload, format=fmt)
    assert isinstance(info.value, MimoCtxError)


# --------------------------------------------------------------------------- openai-chat


def test_chat_valid_payloads_pass() -> None:
    validate_request([USER, _asst("a", "b"), _tool("b"), _tool("a"), USER], format="openai-chat")
    validate_request(
        {"model": "m", "messages": [{"role": "system", "content": "s"}, USER]}, format="openai-chat"
    )
    validate_request([], format="openai-chat")


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        (
            [USER, _asst("a", "b"), _tool("a"), USER],
            "tool call 'b' of message 1 (assistant) has no tool message before message 3 (user)",
        ),
        (
            [USER, _asst("a"), USER, _tool("a")],
            "tool call 'a' of message 1 (assistant) has no tool message before message 2 (user)",
        ),
        (
            [USER, _tool("ghost")],
            "message 1 (tool) answers call 'ghost', which no earlier assistant message made",
        ),
        (
            [USER, _asst("a"), _tool("a"), _tool("a")],
            "message 3 (tool) answers call 'a' a second time",
        ),
        (
            [USER, _asst("a"), _tool("a"), _asst("a")],
            "message 3 (assistant) reuses tool call id 'a'",
        ),
        ([USER, _asst("a")], "tool call 'a' of message 1 (assistant) has no tool message"),
        (
            [USER, _asst("a"), _asst("b")],
            "tool call 'a' of message 1 (assistant) has no tool message before message 2 "
            "(assistant)",
        ),
        ([{"content": "x"}], "message 0 has no role"),
        (["x"], "message 0 is not an object"),
        (
            [{"role": "assistant", "tool_calls": [{"type": "function"}]}],
            "message 0 (assistant) tool call 0 has no id",
        ),
        (
            [{"role": "assistant", "tool_calls": "nope"}],
            "message 0 (assistant) tool_calls must be a list",
        ),
    ],
)
def test_chat_violations(messages: list[Any], fragment: str) -> None:
    _fails(messages, "openai-chat", "invalid openai-chat request: " + fragment)


def test_chat_payload_shape_errors() -> None:
    _fails({"model": "m"}, "openai-chat", "the payload mapping has no 'messages' list")
    _fails("hello", "openai-chat", "messages must be a list, got a string")
    _fails(42, "openai-chat", "messages must be a list, got int")


# --------------------------------------------------------------------------- openai-responses


def _fc(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "read", "arguments": "{}"}


def _out(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "x"}


MSG = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


def test_responses_valid_payloads_pass() -> None:
    validate_request(
        [MSG, _fc("a"), _fc("b"), _out("b"), MSG, _out("a")], format="openai-responses"
    )
    validate_request({"input": "just text"}, format="openai-responses")
    validate_request("just text", format="openai-responses")


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        ([MSG, _fc("a")], "item 1 (function_call) call_id 'a' has no later function_call_output"),
        (
            [MSG, _out("a")],
            "item 1 (function_call_output) answers call_id 'a', which no earlier "
            "function_call made",
        ),
        (
            [MSG, _out("a"), _fc("a")],
            "item 1 (function_call_output) answers call_id 'a', which no earlier",
        ),
        (
            [_fc("a"), _out("a"), _out("a")],
            "item 2 (function_call_output) answers call_id 'a' twice",
        ),
        ([_fc("a"), _fc("a"), _out("a")], "item 1 (function_call) reuses call_id 'a'"),
        ([{"type": "function_call", "name": "x"}], "item 0 (function_call) has no call_id"),
    ],
)
def test_responses_violations(items: list[Any], fragment: str) -> None:
    _fails(items, "openai-responses", "invalid openai-responses request: " + fragment)


def test_responses_payload_without_input() -> None:
    _fails({"model": "m"}, "openai-responses", "the payload mapping has no 'input' list")


# --------------------------------------------------------------------------- anthropic


def _u(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def _a(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _text(t: str = "hi") -> dict[str, Any]:
    return {"type": "text", "text": t}


def _use(call_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "read", "input": {}}


def _res(call_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "x"}


def test_anthropic_valid_payloads_pass() -> None:
    validate_request(
        {
            "system": "s",
            "messages": [
                _u(_text()),
                _a(_use("a"), _use("b")),
                _u(_res("b"), _res("a"), _text()),
                _a(_text()),
            ],
        },
        format="anthropic",
    )
    final_empty: list[dict[str, Any]] = [
        {"role": "user", "content": "plain"},
        {"role": "assistant", "content": []},
    ]
    validate_request(final_empty, format="anthropic")
    # system-role entries (SDK 2.x) do not take part in alternation
    validate_request(
        [{"role": "system", "content": "s"}, _u(_text()), _a(_text())], format="anthropic"
    )


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([_a(_text())], "the first message (message 0) is assistant, not user"),
        ([_u(_text()), _u(_text())], "message 1 (user) follows message 0 of the same role"),
        (
            [_u(_text()), _a(_text()), _a(_text())],
            "message 2 (assistant) follows message 1 of the same role",
        ),
        (
            [_u(_text()), _a(_use("a"), _use("b")), _u(_res("a"), _text())],
            "tool_use 'b' of message 1 (assistant) has no tool_result in the next message "
            "(message 2, user)",
        ),
        (
            [_u(_text()), _a(_use("a")), _u(_text(), _res("a"))],
            "message 2 (user) block 1: tool_result 'a' comes after a non-tool_result block",
        ),
        (
            [_u(_res("x"))],
            "message 0 (user) block 0: tool_result 'x' answers no tool_use of the message before",
        ),
        (
            [_u(_text()), _a(_use("a")), _u(_res("a")), _a(_text()), _u(_res("a"))],
            "message 4 (user) block 0: tool_result 'a' answers no tool_use of the message "
            "before (message 3)",
        ),
        (
            [_u(_text()), _a(_use("a"))],
            "tool_use 'a' of message 1 (assistant) has no tool_result (no user message follows)",
        ),
        ([_u(), _a(_text())], "message 0 (user) has empty content"),
        (
            [_u(_text("  \n")), _a(_text())],
            "message 0 (user) block 0 is an empty or blank text block",
        ),
        (
            [_u(_text()), _a(_text(""))],
            "message 1 (assistant) block 0 is an empty or blank text block",
        ),
        (
            [{"role": "tool", "content": "x"}],
            "message 0 has role 'tool' (expected user or assistant)",
        ),
        (
            [_u(_text()), _a(_use("a")), _u(_res("a")), _a(_use("a"))],
            "message 3 (assistant) reuses tool_use id 'a'",
        ),
        ([_u(_text()), _a(_res("a"))], "message 1 (assistant) block 0 is a tool_result"),
        (
            [_u(_text()), _a({"type": "tool_use", "name": "x", "input": {}})],
            "message 1 (assistant) block 0 tool_use has no id",
        ),
        (
            [{"role": "user", "content": 5}],
            "message 0 (user) content must be a string or a list of blocks",
        ),
    ],
)
def test_anthropic_violations(messages: list[Any], fragment: str) -> None:
    _fails(messages, "anthropic", "invalid anthropic request: " + fragment)


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="unknown request format 'gemini'"):
        # A format outside RequestFormat on purpose: the runtime check names it.
        validate_request([], format="gemini")  # pyright: ignore[reportArgumentType]
