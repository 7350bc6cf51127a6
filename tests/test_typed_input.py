"""``mimo_ctx.typed_input``: what the user typed, read from raw transcript bytes.

These rules are the yardstick of ``replay``'s user-word figure and of the quality
benchmark, so each is pinned on a small file written here; the real transcripts are
checked against the importer in ``tests/importers/test_import_real.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.typed_input import (
    RUN_WORDS,
    TypedInput,
    claude_code_typed_text,
    newest_words,
    run_share,
    typed_inputs,
    words,
)


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _user(content: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "user", "message": {"role": "user", "content": content}, **extra}


def _assistant(mid: str) -> dict[str, Any]:
    return {"type": "assistant", "message": {"id": mid, "role": "assistant", "content": []}}


def test_claude_code_rules() -> None:
    data = _jsonl(
        [
            _user("Implement the epic"),  # 1
            _assistant("m1"),  # 2
            _assistant("m1"),  # 3: the same response, one turn
            {"type": "queue-operation", "operation": "enqueue", "content": "check again"},  # 4
            {"type": "queue-operation", "operation": "remove"},  # 5
            {"type": "queue-operation", "operation": "enqueue", "content": "/mcp"},  # 6
            _user("<command-name>/mcp</command-name>\n<command-args></command-args>"),  # 7
            _user([{"type": "tool_result", "tool_use_id": "t", "content": "out"}]),  # 8
            _user("Skill body", isMeta=True),  # 9
            _user("sub-agent prompt", isSidechain=True),  # 10
            _user("summary of it all", isCompactSummary=True),  # 11
            _user("<local-command-stdout>\x1b[2mdone\x1b[22m</local-command-stdout>"),  # 12
            _user([{"type": "text", "text": "[Request interrupted by user for tool use]"}]),  # 13
            _user("<bash-input>ls -la</bash-input>"),  # 14
            _user("fix it <system-reminder>noise</system-reminder> \x1b[31mnow\x1b[0m"),  # 15
            {"type": "attachment", "attachment": {"type": "queued_command", "prompt": "go on"}},
            {"type": "queue-operation", "operation": "enqueue", "content": "go on"},  # 17
        ]
    )
    assert typed_inputs(data, "claude-code") == [
        TypedInput("Implement the epic", 1, 0),
        TypedInput("check again", 4, 1, "queued"),
        TypedInput("/mcp", 7, 1, "command"),  # the queued copy was delivered by line 7
        TypedInput("!ls -la", 14, 1, "command"),
        TypedInput("fix it  now", 15, 1),  # blocks removed in place
        TypedInput("go on", 16, 1, "queued"),  # the attachment and its enqueue are one
    ]


def test_claude_code_text_rules() -> None:
    wrapper = (
        "<command-message>orchestrator is running…</command-message>\n"
        "<command-name>/orchestrator</command-name>\n"
        "<command-args>create TODO app by Next.js</command-args>"
    )
    assert claude_code_typed_text(wrapper) == (
        "/orchestrator create TODO app by Next.js",
        "command",
    )
    assert claude_code_typed_text("<command-name>init</command-name>") == ("/init", "command")
    note = "<task-notification><id>b1</id></task-notification>\nRead the output file: /tmp/x"
    assert claude_code_typed_text(note) == ("", "message")
    hook = "<user-prompt-submit-hook>lint ok</user-prompt-submit-hook>"
    assert claude_code_typed_text(hook) == ("", "message")


def test_chat_and_responses_and_sweagent() -> None:
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "rename foo"},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<environment_context>cwd</environment_context>"},
                {"type": "text", "text": "and bar"},
            ],
        },
    ]
    assert typed_inputs(json.dumps(chat).encode(), "openai-chat") == [
        TypedInput("rename foo", None, 0),
        TypedInput("and bar", None, 1),
    ]
    assert typed_inputs(_jsonl(chat), "openai-chat") == [
        TypedInput("rename foo", 2, 0),
        TypedInput("and bar", 4, 1),
    ]
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c", "name": "x", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "y"},
        {"type": "message", "role": "assistant", "content": []},
        {"role": "user", "content": "more"},
    ]
    # Output runs: reasoning + call, then the assistant message: two turns before "more".
    assert typed_inputs(json.dumps({"input": items}).encode(), "openai-responses") == [
        TypedInput("hi", None, 0),
        TypedInput("more", None, 2),
    ]
    history = {
        "history": [
            {"role": "system", "content": "setting"},
            {"role": "user", "content": "demo", "is_demo": True},
            {"role": "user", "content": "We're solving ISSUE: x"},
            {"role": "assistant", "content": "look"},
            {"role": "user", "content": "observation"},
        ]
    }
    assert typed_inputs(json.dumps(history).encode(), "sweagent") == [
        TypedInput("We're solving ISSUE: x", None, 0)
    ]
    with pytest.raises(ValueError, match="unknown transcript format 'nope'"):
        typed_inputs(b"", "nope")
    # Malformed records hold no typed text; they do not fail.
    assert typed_inputs(b"{not json\n[1]\n", "claude-code") == []


def test_words_and_runs() -> None:
    assert words('> "quoted" - `code` words') == ["quoted", "code", "words"]
    text = "one two three four five six seven eight nine"
    assert run_share([words(text)], f"x {text} y") == 1.0
    assert run_share([words(text)], "one two three four five six seven eight") == pytest.approx(0.5)
    assert run_share([["short", "one"]], "a short one here") == 1.0
    assert run_share([["short", "one"]], "a short onehere") == 0.0
    assert run_share([["Short"]], "short", casefold=True) == 1.0
    assert run_share([], "anything") is None
    with pytest.raises(ValueError, match="at least 1"):
        run_share([["a"]], "a", run=0)
    assert newest_words(["old words", "new words here"], 4) == [["new", "words", "here"]]
    assert newest_words(["a b c d e f"], 1) == [["e", "f"]]


@settings(max_examples=200)
@given(
    texts=st.lists(st.text(alphabet="abc de\n", max_size=40), max_size=6),
    keep=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_property_run_share_is_a_fraction_and_whole_copies_score_one(
    texts: list[str], keep: list[bool]
) -> None:
    pieces = newest_words(texts, 10_000)
    full = run_share(pieces, "\n".join(texts))
    assert full is None or full == 1.0
    partial = run_share(pieces, "\n".join(t for t, k in zip(texts, keep, strict=False) if k))
    assert partial is None or 0.0 <= partial <= 1.0
    assert RUN_WORDS == 8
