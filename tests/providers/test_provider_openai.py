"""OpenAI converters: Chat Completions and Responses, both directions (issue 5 item 3)."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from mimo_ctx import ids
from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.messages import (
    CheckpointPart,
    FilePart,
    Message,
    MessageFailure,
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
    ToolStateRunning,
    ToolTime,
)
from mimo_ctx.providers import RAW_ARGUMENTS_KEY
from mimo_ctx.providers.openai import (
    from_openai_chat,
    from_openai_responses,
    to_openai_chat,
    to_openai_responses,
)
from mimo_ctx.providers.validate import validate_request

_n = itertools.count(1)


def _msg(role: Role, parts: list[Part], **extra: Any) -> Message:
    n = next(_n)
    return Message(
        id=f"msg_{n:06d}", session_id="s", role=role, time_created=n, parts=parts, **extra
    )


def _call(call_id: str, state: Any, tool: str = "read") -> ToolPart:
    return ToolPart(call_id=call_id, tool=tool, state=state)


def _history() -> list[Message]:
    """A rebuilt session: boundary, verbatim user input, then live tool rounds."""
    return [
        _msg(
            "user",
            [
                CheckpointPart(covered_up_to="msg_000000"),
                TextPart(text="## Checkpoint\ndir: /m", synthetic=True),
                TextPart(text="# Tasks ledger\n(none)", synthetic=True),
            ],
        ),
        _msg("user", [TextPart(text="fix the bug"), TextPart(text="note", ignored=True)]),
        _msg(
            "assistant",
            [
                ReasoningPart(text="think", signature="sig"),
                TextPart(text="Looking."),
                _call(
                    "c1",
                    ToolStateCompleted(
                        input={"path": "a.py"}, output="old", time=ToolTime(compacted=3)
                    ),
                ),
                _call("c2", ToolStateRunning(input={"cmd": "make"}), tool="bash"),
            ],
            finish="tool-calls",
        ),
        _msg("assistant", [TextPart(text="Done.")], finish="stop"),
    ]


def test_r8_1_chat_golden() -> None:
    """Boundary joined into one user message, A10 rules applied, results right after calls."""
    out = to_openai_chat(_history(), system="You are terse.")
    assert out == [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": "Summary of previous conversation from checkpoint files:\n\n"
            "## Checkpoint\ndir: /m\n\n# Tasks ledger\n(none)",
        },
        {"role": "user", "content": "fix the bug"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"a.py"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd":"make"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "[Old tool result content cleared]"},
        {"role": "tool", "tool_call_id": "c2", "content": "[Tool execution was interrupted]"},
        {"role": "assistant", "content": "Done."},
    ]
    validate_request(out, format="openai-chat")


def test_chat_split_results_are_sent_right_after_their_call() -> None:
    """A result stored later (after a user message) still answers its call in place."""
    history = [
        _msg("user", [TextPart(text="go")]),
        _msg("assistant", [_call("c1", ToolStatePending(input={}))], finish="tool-calls"),
        _msg("user", [TextPart(text="(typed while the tool ran)")]),
        _msg("tool", [ToolResultPart(call_id="c1", tool="read", output="content")]),
        _msg("tool", [ToolResultPart(call_id="ghost", tool="read", output="orphan")]),
    ]
    out = to_openai_chat(history)
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "user"]
    assert out[2] == {"role": "tool", "tool_call_id": "c1", "content": "content"}
    validate_request(out, format="openai-chat")


def test_chat_errored_assistant_and_error_results() -> None:
    history = [
        _msg("user", [TextPart(text="q")]),
        _msg("assistant", [TextPart(text="half")], error=MessageFailure(name="APIError")),
        _msg("assistant", [_call("c1", ToolStateError(input={}, error="no such file"))]),
    ]
    out = to_openai_chat(history)
    assert out[1]["content"] is None
    assert out[2] == {"role": "tool", "tool_call_id": "c1", "content": "no such file"}


def test_chat_reasoning_is_not_sent() -> None:
    history = [_msg("assistant", [ReasoningPart(text="secret plan", signature="s")])]
    assert to_openai_chat(history) == []


def test_chat_user_content_forms() -> None:
    png = FilePart(mime="image/png", url="data:image/png;base64,iVBORw0=")
    pdf = FilePart(mime="application/pdf", url="data:application/pdf;base64,JVBE", filename="a.pdf")
    zipped = FilePart(mime="application/zip", url="https://x.test/a.zip", filename="a.zip")
    out = to_openai_chat(
        [
            _msg("user", [TextPart(text="one")]),
            _msg("user", [TextPart(text="see"), png, pdf, zipped]),
            _msg("user", [TextPart(text="a"), TextPart(text="b")]),
        ]
    )
    assert out[0] == {"role": "user", "content": "one"}
    assert out[1]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0="}},
        {
            "type": "file",
            "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"},
        },
        {
            "type": "text",
            "text": "[Attached file a.zip (application/zip) not sent to the model: https://x.test/a.zip]",
        },
    ]
    assert out[2]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]


def test_raw_arguments_survive_a_round_trip() -> None:
    payload = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "t", "arguments": '{"a": 1'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "error: bad JSON"},
    ]
    _, messages = from_openai_chat(payload, session_id="s")
    call = messages[1].parts[0]
    assert isinstance(call, ToolPart)
    assert call.state.input == {RAW_ARGUMENTS_KEY: '{"a": 1'}
    assert to_openai_chat(messages) == payload


def test_from_chat_roles_joining_and_orphans() -> None:
    payload: list[dict[str, Any]] = [
        {"role": "developer", "content": "rule 1"},
        {"role": "system", "content": [{"type": "text", "text": "rule 2"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "input_audio", "input_audio": {}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "refusal": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "read", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "grep", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "B"}]},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "tool", "tool_call_id": "zzz", "content": "lost"},
    ]
    system, messages = from_openai_chat(
        payload, session_id="ses_x", agent="sub-1", time_ms=1_700_000_000_000
    )
    assert system == "rule 1\n\nrule 2"
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    user, assistant, tool = messages
    assert isinstance(user.parts[1], OpaquePart)
    outputs = [p.state for p in assistant.parts if isinstance(p, ToolPart)]
    assert [s.output for s in outputs if isinstance(s, ToolStateCompleted)] == ["A", "B"]
    assert assistant.finish == "tool-calls"
    assert tool.parts == [
        ToolResultPart(id=tool.parts[0].id, call_id="zzz", tool="", output="lost")
    ]
    assert all(m.session_id == "ses_x" and m.agent == "sub-1" for m in messages)
    assert all(m.time_created == 1_700_000_000_000 for m in messages)
    assert [ids.timestamp_of(m.id) for m in messages] == [1_700_000_000_000] * 3
    assert [m.id for m in messages] == sorted(m.id for m in messages)


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (
            [{"role": "function", "name": "f", "content": "x"}],
            "messages[0]: unsupported role 'function'",
        ),
        ([{"role": "tool", "content": "x"}], "messages[0] (tool): missing tool_call_id"),
        ([{"role": "user", "content": 5}], "messages[0].content: expected a list"),
        (["hello"], "messages[0]: expected an object"),
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [{"type": "function", "function": {"name": "x"}}],
                }
            ],
            "messages[0].tool_calls[0]: tool call without an id",
        ),
    ],
)
def test_from_chat_rejects_malformed_input(payload: list[Any], fragment: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(fragment)):
        from_openai_chat(payload, session_id="s")


def test_from_chat_needs_a_session_id() -> None:
    with pytest.raises(InvalidRequestError, match="session_id"):
        from_openai_chat([{"role": "user", "content": "x"}], session_id="")


# --------------------------------------------------------------------------- Responses


def test_responses_golden() -> None:
    openai_reasoning = ReasoningPart(
        text="plan",
        provider_data={
            "openai": {
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "plan"}],
                "encrypted_content": "E",
            },
            "openai_following": {"type": "message", "id": "msg_1"},
        },
    )
    image = FilePart(mime="image/png", url="data:image/png;base64,AAAA")
    history = [
        _msg("user", [TextPart(text="hi"), image]),
        _msg(
            "assistant",
            [
                # Anthropic's thinking is not the Responses API's: omitted.
                ReasoningPart(text="anthropic thinking", signature="sig"),
                openai_reasoning,
                TextPart(text="Reading."),
                _call("c1", ToolStateCompleted(input={"p": 1}, output="data", attachments=[image])),
            ],
        ),
        _msg("assistant", [TextPart(text="ok"), openai_reasoning]),  # trailing reasoning dropped
    ]
    out = to_openai_responses(history, system="sys")
    assert out == [
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "hi"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,AAAA",
                    "detail": "auto",
                },
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "plan"}],
            "encrypted_content": "E",
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Reading.", "annotations": []}],
            "id": "msg_1",
            "status": "completed",
        },
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"p":1}'},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [
                {"type": "input_text", "text": "data"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,AAAA",
                    "detail": "auto",
                },
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        },
    ]
    validate_request(out, format="openai-responses")


def _reasoning(following: dict[str, Any] | None) -> ReasoningPart:
    data: dict[str, Any] = {"openai": {"id": "rs_9", "summary": [], "encrypted_content": "E"}}
    if following is not None:
        data["openai_following"] = following
    return ReasoningPart(text="", provider_data=data)


@pytest.mark.parametrize(
    ("parts", "sent"),
    [
        # paired with its function call: sent, and the call gets its item id back
        (
            [
                _reasoning({"type": "function_call", "id": "fc_1", "call_id": "c1"}),
                _call("c1", ToolStateCompleted(output="x")),
            ],
            True,
        ),
        # the item it led to is not next (a different call): dropped
        (
            [
                _reasoning({"type": "function_call", "id": "fc_1", "call_id": "c9"}),
                _call("c1", ToolStateCompleted(output="x")),
            ],
            False,
        ),
        # led to a message but a call follows: dropped
        (
            [
                _reasoning({"type": "message", "id": "msg_1"}),
                _call("c1", ToolStateCompleted(output="x")),
            ],
            False,
        ),
        # nothing recorded about its following item: dropped
        ([_reasoning(None), TextPart(text="t")], False),
    ],
)
def test_responses_reasoning_is_sent_only_when_paired(parts: list[Part], sent: bool) -> None:
    items = to_openai_responses([_msg("user", [TextPart(text="q")]), _msg("assistant", parts)])
    kinds = [i["type"] for i in items]
    assert ("reasoning" in kinds) is sent
    follower = items[2] if sent else items[1]
    assert ("id" in follower) is sent
    validate_request(items, format="openai-responses")


def test_from_responses_records_the_item_a_reasoning_led_to() -> None:
    """SDK-dumped items: None values are not kept; the next item's id is recorded."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": None,
            "encrypted_content": "E",
            "status": None,
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "read",
            "arguments": "{}",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
    ]
    _, messages = from_openai_responses(items, session_id="s")
    reasoning = messages[1].parts[0]
    assert isinstance(reasoning, ReasoningPart)
    assert reasoning.provider_data == {
        "openai": {"id": "rs_1", "summary": [], "encrypted_content": "E", "type": "reasoning"},
        "openai_following": {"type": "function_call", "id": "fc_1", "call_id": "c1"},
    }
    again = to_openai_responses(messages)
    assert again[1] == {"id": "rs_1", "summary": [], "encrypted_content": "E", "type": "reasoning"}
    assert again[2] == {
        "type": "function_call",
        "call_id": "c1",
        "name": "read",
        "arguments": "{}",
        "id": "fc_1",
    }


def test_from_responses_items() -> None:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "dev rule"},
        {"role": "user", "content": "plain string"},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [
                {"type": "input_text", "text": "seen"},
                {"type": "input_image", "image_url": "https://x.test/p.jpg", "detail": "auto"},
            ],
        },
        {"type": "function_call_output", "call_id": "nobody", "output": "orphan"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {
                    "type": "input_file",
                    "file_data": "data:application/pdf;base64,JVBE",
                    "filename": "f.pdf",
                }
            ],
        },
    ]
    system, messages = from_openai_responses(items, session_id="s")
    assert system == "dev rule"
    assert [m.role for m in messages] == ["user", "assistant", "tool", "user"]
    assistant = messages[1]
    assert [p.type for p in assistant.parts] == ["text", "opaque", "tool"]
    call = assistant.parts[2]
    assert isinstance(call, ToolPart)
    assert isinstance(call.state, ToolStateCompleted)
    assert call.state.output == "seen"
    assert [a.url for a in call.state.attachments] == ["https://x.test/p.jpg"]
    file = messages[3].parts[0]
    assert isinstance(file, FilePart)
    assert (file.mime, file.filename) == ("application/pdf", "f.pdf")


def test_from_responses_string_input() -> None:
    system, [message] = from_openai_responses("hello", session_id="s")
    assert system is None
    assert message.role == "user"
    assert message.parts[0] == TextPart(id=message.parts[0].id, text="hello")


def test_from_responses_rejects_malformed_items() -> None:
    with pytest.raises(InvalidRequestError, match=r"input\[0\] \(function_call\): missing call_id"):
        from_openai_responses([{"type": "function_call", "name": "x"}], session_id="s")
    with pytest.raises(InvalidRequestError, match=r"input\[0\]: unsupported message role 'robot'"):
        from_openai_responses(
            [{"type": "message", "role": "robot", "content": "x"}], session_id="s"
        )
