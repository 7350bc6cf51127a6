"""OpenAI chat and Responses transcripts (files the tests write)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx import ids
from mimo_ctx.convert import RAW_ARGUMENTS_KEY
from mimo_ctx.errors import TranscriptError
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import (
    FilePart,
    Message,
    OpaquePart,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateRunning,
)

BASE = 1_750_000_000_000


def _write(tmp_path: Path, value: Any, name: str = "chat.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(value, indent=1))
    return path


def _chat() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in the picture and the folder?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need ls.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"path": "."}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "cat", "arguments": "{not json"},
                },
            ],
            "usage": {
                "prompt_tokens": 120,
                "completion_tokens": 8,
                "total_tokens": 128,
                "prompt_tokens_details": {"cached_tokens": 100},
            },
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "call_9", "content": "stray"},
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "A cat; two files.", "finish_reason": "stop"},
    ]


def test_chat_array_converted(tmp_path: Path) -> None:
    result = load_transcript(_write(tmp_path, _chat()), base_time_ms=BASE)
    assert result.format == "openai-chat"
    assert result.session.prefix is not None
    assert result.session.prefix.system == "You are terse.\n\nUse tools."
    user, calls, stray, late_system, answer = result.messages
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "user", "assistant"]
    assert [m.time_created for m in result.messages] == [BASE + i for i in range(5)]
    text, image = user.parts
    assert isinstance(text, TextPart)
    assert isinstance(image, FilePart)
    assert (image.mime, image.url) == ("image/png", "data:image/png;base64,AAAA")
    reasoning, ls, cat = calls.parts
    assert isinstance(reasoning, ReasoningPart)
    assert reasoning.text == "Need ls."
    assert isinstance(ls, ToolPart)
    assert isinstance(ls.state, ToolStateCompleted)
    assert (ls.tool, ls.state.input, ls.state.output) == ("ls", {"path": "."}, "a.txt\nb.txt")
    assert isinstance(cat, ToolPart)
    assert isinstance(cat.state, ToolStateRunning)  # never answered: interrupted
    assert cat.state.input == {RAW_ARGUMENTS_KEY: "{not json"}  # the converter kit's rule
    assert calls.finish == "tool-calls"
    assert calls.usage is not None
    assert (calls.usage.input, calls.usage.cache_read, calls.usage.output) == (20, 100, 8)
    assert calls.usage.context_tokens == 128
    (orphan,) = stray.parts
    assert isinstance(orphan, ToolResultPart)
    assert (orphan.call_id, orphan.output) == ("call_9", "stray")
    assert late_system.metadata == {"role": "system"}
    assert all(isinstance(p, TextPart) and p.synthetic for p in late_system.parts)
    assert answer.finish == "stop"
    assert result.session.title == "What is in the picture and the folder?"
    for m in result.messages:
        assert Message.model_validate_json(m.model_dump_json()) == m
        assert ids.timestamp_of(m.id) == m.time_created


def test_chat_object_with_messages_and_tools(tmp_path: Path) -> None:
    tools: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": "ls", "parameters": {}}}
    ]
    doc = {"model": "gpt-test", "messages": _chat()[2:5], "tools": tools}
    result = load_transcript(_write(tmp_path, doc))
    assert result.session.prefix is not None
    assert result.session.prefix.tools == tools
    assert result.session.prefix.system == ""
    assert result.session.metadata["model"] == "gpt-test"
    assert result.tool_call_count() == 2


def test_chat_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in _chat()) + "\n")
    result = load_transcript(path)
    assert result.format == "openai-chat"
    assert result.role_counts() == {"user": 2, "assistant": 2, "tool": 1}


def test_legacy_function_call_paired_by_name(tmp_path: Path) -> None:
    doc = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "function_call": {"name": "wx", "arguments": "{}"}},
        {"role": "function", "name": "wx", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    result = load_transcript(_write(tmp_path, doc))
    (call,) = result.messages[1].parts
    assert isinstance(call, ToolPart)
    assert isinstance(call.state, ToolStateCompleted)
    assert call.state.output == "sunny"
    assert len(result.messages) == 3


def test_chat_bad_message_names_line(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]
    path = tmp_path / "bad.json"
    path.write_text("[\n" + ",\n".join(json.dumps(m) for m in messages) + "\n]\n")
    with pytest.raises(TranscriptError) as info:
        load_transcript(path)
    assert info.value.line == 3
    assert "messages[1].role 'wizard'" in str(info.value)
    result = load_transcript(path, strict=False)
    assert [s.line for s in result.skipped] == [3]
    assert len(result.messages) == 1


def test_responses_items(tmp_path: Path) -> None:
    doc = {
        "instructions": "Be helpful.",
        "input": [
            {"role": "user", "content": "list files"},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "call ls"}],
                "encrypted_content": "enc",
            },
            {"type": "function_call", "call_id": "fc1", "name": "ls", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "fc1", "output": "x.py"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "x.py"}],
            },
            {"type": "web_search_call", "id": "ws1", "status": "completed"},
        ],
    }
    result = load_transcript(_write(tmp_path, doc))
    assert result.format == "openai-responses"
    assert result.session.prefix is not None
    assert result.session.prefix.system == "Be helpful."
    user, calls, answer = result.messages
    assert [m.role for m in result.messages] == ["user", "assistant", "assistant"]
    reasoning, call = calls.parts
    assert isinstance(reasoning, ReasoningPart)
    assert (reasoning.text, reasoning.signature) == ("call ls", "enc")
    assert isinstance(call, ToolPart)
    assert isinstance(call.state, ToolStateCompleted)
    assert call.state.output == "x.py"
    assert calls.finish == "tool-calls"
    text, opaque = answer.parts
    assert isinstance(text, TextPart)
    assert isinstance(opaque, OpaquePart)
    assert opaque.kind == "web_search_call"
    assert answer.finish == "stop"
    assert user.parts[0].type == "text"


def test_empty_message_list_imports_nothing(tmp_path: Path) -> None:
    result = load_transcript(_write(tmp_path, []))
    assert result.messages == []
    assert result.format == "openai-chat"


def test_one_line_chat_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"role": "user", "content": "only me"}) + "\n")
    result = load_transcript(path)
    assert result.format == "openai-chat"
    assert [m.role for m in result.messages] == ["user"]


def test_issue14_framework_blocks_in_user_turns_are_not_typed(tmp_path: Path) -> None:
    """Codex-style ``<environment_context>`` / ``<user_instructions>`` blocks in user turns
    are sent, but not as the user's words; the typed text is; the original is kept."""
    env = "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": env}]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "rename foo to bar\x1b[0m " + env}],
        },
    ]
    messages = load_transcript(_write(tmp_path, items), format="openai-responses").messages
    first, second = messages
    assert [(p.text, p.synthetic, p.ignored) for p in first.parts if isinstance(p, TextPart)] == [
        (env, True, False)
    ]
    parts = [(p.text, p.synthetic, p.ignored) for p in second.parts if isinstance(p, TextPart)]
    assert parts == [
        ("rename foo to bar", False, False),
        (env, True, False),
        ("rename foo to bar\x1b[0m " + env, False, True),
    ]
    # A plain chat user message is one typed part, unchanged.
    chat = load_transcript(_write(tmp_path, [{"role": "user", "content": "hi"}], "c.json"))
    assert [(p.text, p.synthetic) for p in chat.messages[0].parts if isinstance(p, TextPart)] == [
        ("hi", False)
    ]
