"""Anthropic Messages converters, both directions, and the API's turn rules (issue 5 item 3)."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.messages import (
    CompactionPart,
    FilePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
)
from mimo_ctx.providers.anthropic import (
    EMPTY_ERROR_TEXT,
    LEADING_USER_TEXT,
    from_anthropic,
    is_anthropic_reasoning,
    to_anthropic,
)
from mimo_ctx.providers.validate import validate_request

_n = itertools.count(1)


def _msg(role: Role, parts: list[Part], **extra: Any) -> Message:
    n = next(_n)
    return Message(
        id=f"msg_{n:06d}", session_id="s", role=role, time_created=n, parts=parts, **extra
    )


def _done(call_id: str, output: str = "ok", **extra: Any) -> ToolPart:
    return ToolPart(
        call_id=call_id,
        tool="read",
        state=ToolStateCompleted(input={"p": call_id}, output=output, **extra),
    )


def test_r8_1_anthropic_golden_merges_and_orders() -> None:
    """Boundary + next user merge; split assistant merges; tool_result first in the merged turn."""
    history = [
        _msg("user", [CompactionPart(summary="Earlier: set up the repo.")]),
        _msg("user", [TextPart(text="now add tests")]),
        # One provider message stored as two (split form), sharing provider_message_id.
        _msg(
            "assistant",
            [ReasoningPart(text="plan", signature="sig1"), TextPart(text="Sure.")],
            provider_message_id="m1",
        ),
        _msg(
            "assistant",
            [ToolPart(call_id="t1", tool="read", state=ToolStatePending(input={"p": 1}))],
            provider_message_id="m1",
        ),
        _msg("user", [TextPart(text="also lint")]),
        _msg("tool", [ToolResultPart(call_id="t1", tool="read", output="file body")]),
        _msg("assistant", [TextPart(text="  ")]),  # blank: nothing to send
        _msg("assistant", [TextPart(text="Both done.")]),
    ]
    system, out = to_anthropic(history, system=[{"type": "text", "text": "sys"}])
    assert system == [{"type": "text", "text": "sys"}]
    assert out == [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Summary of previous conversation:\n\nEarlier: set up the repo.",
                },
                {"type": "text", "text": "now add tests"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig1"},
                {"type": "text", "text": "Sure."},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "file body"},
                {"type": "text", "text": "also lint"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Both done."}]},
    ]
    validate_request({"system": system, "messages": out}, format="anthropic")


def test_first_turn_must_be_user() -> None:
    _, out = to_anthropic(
        [_msg("assistant", [TextPart(text="Hello!")]), _msg("user", [TextPart(text="hi")])]
    )
    assert out[0] == {"role": "user", "content": [{"type": "text", "text": LEADING_USER_TEXT}]}
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    validate_request(out, format="anthropic")


def test_thinking_blocks_go_first_and_foreign_reasoning_is_omitted() -> None:
    parts: list[Part] = [
        TextPart(text="answer"),
        ReasoningPart(text="signed", signature="s"),
        ReasoningPart(text="unsigned"),
        ReasoningPart(text="x", signature="s2", provider_data={"openai": {"id": "rs_1"}}),
        ReasoningPart(text="", signature="opaque-data", redacted=True),
    ]
    _, out = to_anthropic([_msg("user", [TextPart(text="q")]), _msg("assistant", parts)])
    assert out[1]["content"] == [
        {"type": "thinking", "thinking": "signed", "signature": "s"},
        {"type": "redacted_thinking", "data": "opaque-data"},
        {"type": "text", "text": "answer"},
    ]
    assert not is_anthropic_reasoning(ReasoningPart(text="unsigned"))


def test_file_blocks() -> None:
    parts: list[Part] = [
        FilePart(mime="image/png", url="data:image/png;base64,iVBORw0="),
        FilePart(mime="image/jpeg", url="https://x.test/cat.jpg"),
        FilePart(
            mime="application/pdf", url="data:application/pdf;base64,JVBE", filename="spec.pdf"
        ),
        FilePart(mime="application/pdf", url="https://x.test/spec.pdf"),
        FilePart(mime="text/plain", url="data:text/plain,hello%20world"),
        FilePart(mime="application/zip", url="data:application/zip;base64,UEsD", filename="a.zip"),
    ]
    _, [user] = to_anthropic([_msg("user", parts)])
    assert user["content"] == [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.jpg"}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
            "title": "spec.pdf",
        },
        {"type": "document", "source": {"type": "url", "url": "https://x.test/spec.pdf"}},
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "hello world"},
        },
        {"type": "text", "text": "[Attached file a.zip (application/zip) not sent to the model]"},
    ]


def test_tool_results_attachments_errors_and_interruptions() -> None:
    image = FilePart(mime="image/png", url="data:image/png;base64,AAAA")
    history = [
        _msg("user", [TextPart(text="q")]),
        _msg(
            "assistant",
            [
                _done("a", "screenshot", attachments=[image]),
                ToolPart(call_id="b", tool="bash", state=ToolStateError(input={}, error="")),
                ToolPart(call_id="c", tool="bash", state=ToolStatePending(input={})),
                _done("d", ""),
            ],
        ),
    ]
    _, out = to_anthropic(history)
    assert out[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "a",
            "content": [
                {"type": "text", "text": "screenshot"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                },
            ],
        },
        {"type": "tool_result", "tool_use_id": "b", "content": EMPTY_ERROR_TEXT, "is_error": True},
        {
            "type": "tool_result",
            "tool_use_id": "c",
            "content": "[Tool execution was interrupted]",
            "is_error": True,
        },
        {"type": "tool_result", "tool_use_id": "d"},
    ]
    validate_request(out, format="anthropic")


def test_from_anthropic_shapes() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "late system"},
        {"role": "user", "content": "hello"},
        {
            "role": "assistant",
            "content": [
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "zz", "content": "orphan"},
                {"type": "text", "text": "between"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "body"}],
                    "is_error": True,
                },
                {"type": "search_result", "source": "x", "title": "t", "content": []},
            ],
        },
    ]
    system, out = from_anthropic(
        [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], messages, session_id="s"
    )
    assert system == "a\n\nb\n\nlate system"
    assert [m.role for m in out] == ["user", "assistant", "tool", "user"]
    assert isinstance(out[1].parts[0], OpaquePart)
    call = out[1].parts[1]
    assert isinstance(call, ToolPart)
    assert isinstance(call.state, ToolStateError)
    assert call.state.error == "body"
    assert [p.type for p in out[3].parts] == ["text", "opaque"]
    orphan = out[2].parts[0]
    assert isinstance(orphan, ToolResultPart)
    assert orphan.call_id == "zz"


def test_from_anthropic_redacted_thinking_keeps_data_out_of_text() -> None:
    _, [msg] = from_anthropic(
        None,
        [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "ENC"}]}],
        session_id="s",
    )
    [part] = msg.parts
    assert isinstance(part, ReasoningPart)
    assert (part.text, part.signature, part.redacted) == ("", "ENC", True)


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([{"role": "robot", "content": "x"}], "messages[0]: unsupported role 'robot'"),
        (
            [{"role": "user", "content": [{"type": "tool_result"}]}],
            "messages[0].content[0] (tool_result): missing tool_use_id",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_use", "name": "x"}]}],
            "messages[0].content[0] (tool_use): missing id or name",
        ),
        ([{"role": "user", "content": [3]}], "messages[0].content[0]: expected an object"),
    ],
)
def test_from_anthropic_rejects_malformed_input(messages: list[Any], fragment: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(fragment)):
        from_anthropic(None, messages, session_id="s")
