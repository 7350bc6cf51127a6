"""The converter kit (issue 15, step 5): one host message reads the same however it arrives.

The live provider converters and the transcript importers share one
:class:`~mimo_ctx.convert.MessageDraft`, one joiner and one rule for the non-text
content of tool results; these tests feed the same messages through both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.convert import (
    RAW_ARGUMENTS_KEY,
    MessageDraft,
    ToolCallJoiner,
    build_messages,
    decode_arguments,
    tool_result_content,
)
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import (
    FilePart,
    Message,
    OpaquePart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStatePending,
    ToolStateRunning,
)
from mimo_ctx.providers.anthropic import from_anthropic
from mimo_ctx.providers.openai import from_openai_chat, from_openai_responses

SID = "ses_convert"
IMAGE = "data:image/png;base64,iVBORw0KGgo="
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    ],
}
RESULT_CONTENT: list[dict[str, Any]] = [
    {"type": "text", "text": "a.txt"},
    {"type": "image_url", "image_url": {"url": IMAGE}},
    {"type": "audio", "audio": {"id": "aud_1"}},
]


def _outcome(messages: list[Message]) -> tuple[str, list[str]]:
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolPart) and isinstance(part.state, ToolStateCompleted):
                return part.state.output, [a.url for a in part.state.attachments]
            if isinstance(part, ToolResultPart):
                return part.output, [a.url for a in part.attachments or []]
    raise AssertionError("no tool result")


def _imported(tmp_path: Path, messages: list[dict[str, Any]]) -> list[Message]:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(messages), encoding="utf-8")
    return load_transcript(path, format="openai-chat").messages


def test_a_tool_message_with_text_and_image_reads_the_same_live_and_imported(
    tmp_path: Path,
) -> None:
    """The issue's case: live it was 'a.txt', imported 'a.txt' plus the image as JSON."""
    host = [
        {"role": "user", "content": "look"},
        CALL,
        {"role": "tool", "tool_call_id": "call_1", "content": RESULT_CONTENT},
    ]
    _, live = from_openai_chat(host, session_id=SID)
    imported = _imported(tmp_path, host)
    audio = json.dumps(RESULT_CONTENT[2], separators=(",", ":"))
    assert _outcome(live) == _outcome(imported) == (f"a.txt\n{audio}", [IMAGE])


def test_a_result_without_its_call_keeps_its_attachments(tmp_path: Path) -> None:
    host = [
        {"role": "user", "content": "look"},
        {"role": "tool", "tool_call_id": "call_9", "content": RESULT_CONTENT[:2]},
    ]
    _, live = from_openai_chat(host, session_id=SID)
    assert _outcome(live) == ("a.txt", [IMAGE])
    assert _outcome(_imported(tmp_path, host)) == ("a.txt", [IMAGE])


def test_responses_and_anthropic_results_follow_the_same_rule() -> None:
    _, responses = from_openai_responses(
        [
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "a.txt"},
                    {"type": "input_image", "image_url": IMAGE},
                    {"type": "mystery", "x": 1},
                ],
            },
        ],
        session_id=SID,
    )
    assert _outcome(responses) == ('a.txt\n{"type":"mystery","x":1}', [IMAGE])
    _, anthropic = from_anthropic(
        None,
        [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read"}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "a.txt"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "iVBORw0KGgo=",
                                },
                            },
                            {"type": "search_result", "title": "t"},
                        ],
                    }
                ],
            },
        ],
        session_id=SID,
    )
    assert _outcome(anthropic) == ('a.txt\n{"type":"search_result","title":"t"}', [IMAGE])


def test_broken_arguments_read_the_same_live_and_imported(tmp_path: Path) -> None:
    broken = {
        **CALL,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "l'}}
        ],
    }
    host = [{"role": "user", "content": "go"}, broken]
    _, live = from_openai_chat(host, session_id=SID)
    imported = _imported(tmp_path, host)
    inputs = [p.state.input for m in (*live, *imported) for p in m.parts if isinstance(p, ToolPart)]
    assert inputs == [{RAW_ARGUMENTS_KEY: '{"cmd": "l'}] * 2


@given(st.one_of(st.text(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=3)))
def test_decoded_arguments_are_always_an_object(raw: str | dict[str, int]) -> None:
    decoded = decode_arguments(raw)
    assert isinstance(decoded, dict)
    if isinstance(raw, str) and raw.strip() and set(decoded) == {RAW_ARGUMENTS_KEY}:
        assert decoded[RAW_ARGUMENTS_KEY] == raw


def test_tool_result_content_keeps_everything() -> None:
    image = FilePart(mime="image/png", url=IMAGE)
    output, files = tool_result_content(
        [
            TextPart(text="one"),
            image,
            OpaquePart(source="x", kind="k", data={"a": 1}),
            TextPart(text="two"),
        ]
    )
    assert output == 'one\n{"a":1}\ntwo'
    assert files == [image]


def test_the_joiner_answers_open_calls_once_with_their_times() -> None:
    joiner = ToolCallJoiner()
    draft = MessageDraft("assistant")
    joiner.add_call(draft, "a", "read", {"p": 1})
    joiner.add_call(draft, "b", "bash", {}, start=10)
    assert [type(p.state) for p in draft.open_calls] == [ToolStatePending, ToolStateRunning]
    assert joiner.latest_open("bash") == "b"
    assert joiner.join("b", "done", end=12)
    assert not joiner.join("b", "again")  # a second result is not joined
    assert not joiner.is_open("b")
    assert joiner.is_open("a")
    call = draft.parts[1]
    assert isinstance(call, ToolPart)
    assert isinstance(call.state, ToolStateCompleted)
    assert (call.state.time.start, call.state.time.end) == (10, 12)


def test_build_messages_finishes_provider_turns_and_keeps_transcript_times() -> None:
    live = MessageDraft("assistant", [TextPart(text="hi")])
    built = build_messages([live, MessageDraft("user")], session_id=SID, time_ms=5, finished=True)
    assert [(m.finish, m.time_created, m.time_completed) for m in built] == [("stop", 5, 5)]
    own = MessageDraft("user", time=9)
    late = MessageDraft("assistant", time=3, time_completed=1)
    imported = build_messages([own, late], session_id=SID, keep_empty=True)
    assert [(m.time_created, m.time_completed, m.finish) for m in imported] == [
        (9, None, None),
        (9, 9, None),
    ]
