"""Importers against every real transcript in the shared folder.

The expected numbers below were computed once by a separate throw-away script
that reads the raw files with plain ``json`` (not with the importers): per
agent, consecutive assistant lines with one ``message.id`` count as one
message; user lines count when they hold anything but tool results, and so do
queued messages (``queue-operation`` enqueue lines) that no later user line
repeats (issue 14: two in 258c7280, "check again" and "new beads for the epic were
added. tackle them"); tool calls
are ``tool_use`` blocks; SWE-agent counts are the ``history`` roles. They are
facts about the fixture files: a change of importer behaviour fails here.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx import ids
from mimo_ctx.importers import ImportedTranscript, load_transcript
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    Message,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
)
from mimo_ctx.store.base import Session
from tests.json_support import is_json_array

pytestmark = pytest.mark.transcripts

# name -> expected counts (sub-agent files beside a main file are loaded with it).
EXPECTED: dict[str, dict[str, Any]] = {
    "claude_code/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl": {
        "user": 2, "assistant": 7, "tool_calls": 12, "tool_errors": 1, "reasoning": 0,
        "subagent_messages": 0, "compactions": 0, "main": 9, "agents": ["main"],
    },
    "claude_code/258c7280-ae70-4798-800f-63464d01a85d.jsonl": {
        "user": 12, "assistant": 156, "tool_calls": 188, "tool_errors": 7, "reasoning": 19,
        "subagent_messages": 8, "compactions": 1, "main": 160,
        "agents": ["main", "acompact-fffbd0", "a881341"],
    },
    "claude_code/258c7280-ae70-4798-800f-63464d01a85d_subagents_agent-a881341.jsonl": {
        "user": 1, "assistant": 3, "tool_calls": 2, "tool_errors": 0, "reasoning": 0,
        "subagent_messages": 4, "compactions": 0, "main": 0, "agents": ["a881341"],
    },
    "claude_code/258c7280-ae70-4798-800f-63464d01a85d_subagents_agent-acompact-fffbd0.jsonl": {
        "user": 3, "assistant": 1, "tool_calls": 0, "tool_errors": 0, "reasoning": 0,
        "subagent_messages": 4, "compactions": 0, "main": 0, "agents": ["acompact-fffbd0"],
    },
    "claude_code/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl": {
        "user": 4, "assistant": 20, "tool_calls": 21, "tool_errors": 3, "reasoning": 0,
        "subagent_messages": 12, "compactions": 0, "main": 12,
        "agents": ["main", "sidechain-6340ddef", "sidechain-83e2917c"],
    },
    "claude_code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl": {
        "user": 9, "assistant": 221, "tool_calls": 254, "tool_errors": 12, "reasoning": 6,
        "subagent_messages": 6, "compactions": 1, "main": 224,
        "agents": ["main", "aac57f5", "acompact-946d2b"],
    },
    "claude_code/ae4a77f8-aedd-4bc1-888f-c94edc91af04_subagents_agent-aac57f5.jsonl": {
        "user": 1, "assistant": 3, "tool_calls": 12, "tool_errors": 0, "reasoning": 0,
        "subagent_messages": 4, "compactions": 0, "main": 0, "agents": ["aac57f5"],
    },
    "claude_code/ae4a77f8-aedd-4bc1-888f-c94edc91af04_subagents_agent-acompact-946d2b.jsonl": {
        "user": 1, "assistant": 1, "tool_calls": 0, "tool_errors": 0, "reasoning": 0,
        "subagent_messages": 2, "compactions": 0, "main": 0, "agents": ["acompact-946d2b"],
    },
    "claude_code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl": {
        "user": 8, "assistant": 170, "tool_calls": 167, "tool_errors": 23, "reasoning": 0,
        "subagent_messages": 166, "compactions": 0, "main": 12,
        "agents": [
            "main", "sidechain-6690d10e", "sidechain-60dade70", "sidechain-f4546a51",
            "sidechain-0d692b0f", "sidechain-f4ab2bf6",
        ],
    },
    "claude_code/short.jsonl": {
        "user": 2, "assistant": 1, "tool_calls": 2, "tool_errors": 2, "reasoning": 1,
        "subagent_messages": 0, "compactions": 0, "main": 3, "agents": ["main"],
    },
    "claude_code/subagent.jsonl": {
        "user": 4, "assistant": 12, "tool_calls": 16, "tool_errors": 0, "reasoning": 4,
        "subagent_messages": 0, "compactions": 0, "main": 16, "agents": ["main"],
    },
    "claude_code/tool_heavy.jsonl": {
        "user": 7, "assistant": 4, "tool_calls": 6, "tool_errors": 0, "reasoning": 1,
        "subagent_messages": 0, "compactions": 0, "main": 11, "agents": ["main"],
    },
    "sweagent/6e44b9__sweagenttestrepo-1c2844.traj": {
        "user": 1, "assistant": 4, "tool_calls": 4, "tool_errors": 0, "reasoning": 0,
        "subagent_messages": 0, "compactions": 0, "main": 5, "agents": ["main"],
    },
    "sweagent/pydicom__pydicom-1458.traj": {
        "user": 13, "assistant": 12, "tool_calls": 0, "tool_errors": 0, "reasoning": 0,
        "subagent_messages": 0, "compactions": 0, "main": 25, "agents": ["main"],
    },
    "sweagent/swe-agent__test-repo-i1.traj": {
        "user": 6, "assistant": 5, "tool_calls": 0, "tool_errors": 0, "reasoning": 0,
        "subagent_messages": 0, "compactions": 0, "main": 11, "agents": ["main"],
    },
}  # fmt: skip

NAMES = sorted(EXPECTED)


@functools.cache
def _load(path: str) -> ImportedTranscript:
    return load_transcript(path, base_time_ms=1_700_000_000_000)


@pytest.fixture(params=NAMES)
def imported(
    request: pytest.FixtureRequest, transcripts_dir: Path
) -> tuple[str, ImportedTranscript]:
    name: str = request.param
    path = transcripts_dir / name
    if not path.is_file():
        pytest.fail(f"expected fixture file {path} is missing")
    return name, _load(str(path))


def _raw_tool_outputs(path: Path) -> set[str]:
    """Every tool result text in a raw file, read with plain json."""
    out: set[str] = set()
    if path.suffix == ".traj":
        for m in json.loads(path.read_text())["history"]:
            if m["role"] == "tool" and isinstance(m["content"], str):
                out.add(m["content"].strip())
        return out
    for line in path.read_text().splitlines():
        obj: dict[str, Any] = json.loads(line)
        content: Any = obj.get("message", {}).get("content")
        if not is_json_array(content):
            continue
        for block in content:
            if block.get("type") != "tool_result":
                continue
            value = block.get("content")
            if is_json_array(value):
                value = "\n".join(b.get("text", "") for b in value)
            if isinstance(value, str) and value.strip():
                out.add(value.strip())
    return out


def test_every_transcript_file_has_expected_counts(transcripts_dir: Path) -> None:
    found = sorted(
        str(p.relative_to(transcripts_dir)) for p in transcripts_dir.rglob("*") if p.is_file()
    )
    assert found == NAMES


def test_counts_match_independent_reading(imported: tuple[str, ImportedTranscript]) -> None:
    name, result = imported
    want = EXPECTED[name]
    roles = result.role_counts()
    assert roles == {"user": want["user"], "assistant": want["assistant"], "tool": 0}
    assert result.tool_call_count() == want["tool_calls"]
    errors = sum(
        1
        for m in result.messages
        for p in m.parts
        if isinstance(p, ToolPart) and isinstance(p.state, ToolStateError)
    )
    assert errors == want["tool_errors"]
    reasoning = sum(1 for m in result.messages for p in m.parts if isinstance(p, ReasoningPart))
    assert reasoning == want["reasoning"]
    counts = result.counts()
    assert counts["subagent_messages"] == want["subagent_messages"]
    assert counts["compactions"] == want["compactions"]
    assert len(result.agent_messages(MAIN_AGENT)) == want["main"]
    assert result.agents == want["agents"]
    assert result.skipped == []
    assert result.off_branch == []


def test_a1_ids_ascend_in_conversation_order(imported: tuple[str, ImportedTranscript]) -> None:
    _, result = imported
    msg_ids = [m.id for m in result.messages]
    assert msg_ids == sorted(msg_ids)
    assert len(set(msg_ids)) == len(msg_ids)
    times = [m.time_created for m in result.messages]
    assert times == sorted(times)
    for m in result.messages:
        assert ids.timestamp_of(m.id) == m.time_created
        assert m.session_id == result.session.id
        if m.time_completed is not None:
            assert m.time_completed >= m.time_created


def test_tool_parts_have_call_id_and_name(imported: tuple[str, ImportedTranscript]) -> None:
    _, result = imported
    call_ids: list[str] = []
    for m in result.messages:
        for p in m.parts:
            if isinstance(p, ToolPart):
                assert m.role == "assistant"
                assert p.call_id
                assert p.tool
                call_ids.append(p.call_id)
                if isinstance(p.state, ToolStateCompleted | ToolStateError):
                    assert p.state.time.end is not None
                    assert p.state.time.start is not None
                    assert p.state.time.end >= p.state.time.start
    assert len(call_ids) == len(set(call_ids))


def test_no_tool_result_text_in_user_messages(
    imported: tuple[str, ImportedTranscript], transcripts_dir: Path
) -> None:
    name, result = imported
    outputs = _raw_tool_outputs(transcripts_dir / name)
    for path in result.sources[1:]:
        outputs |= _raw_tool_outputs(path)
    for m in result.messages:
        if m.role != "user":
            continue
        assert not any(isinstance(p, ToolPart | ToolResultPart) for p in m.parts)
        for p in m.parts:
            if isinstance(p, TextPart):
                assert p.text.strip() not in outputs


def test_every_assistant_message_is_finished(imported: tuple[str, ImportedTranscript]) -> None:
    # No fixture ends inside a running tool, so every assistant message finished;
    # the inferred reason follows the content.
    _, result = imported
    for m in result.messages:
        if m.role == "assistant":
            has_tools = any(isinstance(p, ToolPart) for p in m.parts)
            assert m.finish == ("tool-calls" if has_tools else "stop")


def test_round_trip_through_json(imported: tuple[str, ImportedTranscript]) -> None:
    _, result = imported
    for m in result.messages:
        assert Message.model_validate_json(m.model_dump_json()) == m
    assert Session.model_validate_json(result.session.model_dump_json()) == result.session


def test_r2_6_claude_code_responses_merged(imported: tuple[str, ImportedTranscript]) -> None:
    """One API response is one message: consecutive assistant messages of one agent
    never share a provider message id, so the watermark cannot split one (R2.6)."""
    name, result = imported
    if not name.startswith("claude_code/"):
        # SWE-agent histories have no provider message ids to group by.
        assert all(m.provider_message_id is None for m in result.messages)
        return
    last: dict[str, Message] = {}
    for m in result.messages:
        if m.role == "assistant":
            assert m.provider_message_id
            prev = last.get(m.agent)
            if prev is not None and prev.role == "assistant":
                assert prev.provider_message_id != m.provider_message_id
        last[m.agent] = m


def test_claude_code_compaction_summaries(transcripts_dir: Path) -> None:
    cases = {
        "claude_code/258c7280-ae70-4798-800f-63464d01a85d.jsonl": ("auto", 167094, 1257),
        "claude_code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl": ("manual", 142431, 1482),
    }
    for name, (trigger, tokens, line) in cases.items():
        result = _load(str(transcripts_dir / name))
        (comp,) = result.compactions
        assert (comp.trigger, comp.tokens_before, comp.line, comp.agent) == (
            trigger,
            tokens,
            line,
            MAIN_AGENT,
        )
        message = result.messages[comp.index]
        assert message.id == comp.message_id
        assert message.time_created == comp.at
        assert message.is_boundary
        (part,) = message.parts
        assert isinstance(part, CompactionPart)
        assert part.auto == (trigger == "auto")
        assert part.summary.startswith("This session is being continued from a previous")
        # History before the compaction is kept (the chain is followed across it).
        assert comp.index > 100


def test_claude_code_subagent_files_optional(transcripts_dir: Path) -> None:
    path = transcripts_dir / "claude_code/258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    alone = load_transcript(path, subagents=[])
    assert alone.agents == [MAIN_AGENT]
    assert len(alone.messages) == 160  # 158 lines + 2 queued messages (issue 14)
    assert alone.sources == [path]
    one = load_transcript(
        path,
        subagents=[
            transcripts_dir
            / "claude_code/258c7280-ae70-4798-800f-63464d01a85d_subagents_agent-a881341.jsonl"
        ],
    )
    assert one.agents == [MAIN_AGENT, "a881341"]
    assert len(one.messages) == 164


def test_claude_code_short_session_details(transcripts_dir: Path) -> None:
    result = _load(str(transcripts_dir / "claude_code/short.jsonl"))
    user, assistant, interrupted = result.messages
    assert user.parts[0].type == "text"
    assert not user.parts[0].synthetic
    assert result.session.title == "mix phx.server doesnt seem to start"
    assert assistant.provider_message_id == "msg_01MKH1ccEGrZGNPvu8pYiiQa"
    assert assistant.model == "claude-opus-4-6"
    assert assistant.usage is not None
    assert (
        assistant.usage.input,
        assistant.usage.output,
        assistant.usage.cache_read,
        assistant.usage.cache_write,
    ) == (3, 13, 11515, 13835)
    kinds = [p.type for p in assistant.parts]
    assert kinds == ["text", "reasoning", "text", "tool", "tool"]
    reasoning = assistant.parts[1]
    assert isinstance(reasoning, ReasoningPart)
    assert reasoning.signature is not None
    assert reasoning.signature.startswith("EsMCCkYICxgCKkDuNR00")
    tools = [p for p in assistant.parts if isinstance(p, ToolPart)]
    assert [t.tool for t in tools] == ["Bash", "Glob"]
    assert all(isinstance(t.state, ToolStateError) for t in tools)
    assert interrupted.parts[0].type == "text"
    assert interrupted.parts[0].synthetic  # "[Request interrupted by user for tool use]"


def _typed(message: Message) -> str:
    return "\n".join(
        p.text
        for p in message.parts
        if isinstance(p, TextPart) and not p.synthetic and not p.ignored
    )


def test_a7_cli_text_is_synthetic(transcripts_dir: Path) -> None:
    """Meta lines, caveats and command output are not the user's words (R5.5, A7); the
    slash command is, as typed (issue 14: it used to be synthetic as a whole)."""
    result = _load(str(transcripts_dir / "claude_code/tool_heavy.jsonl"))
    typed = [_typed(m) for m in result.messages if m.role == "user"]
    assert typed == [
        "start phoenix in background",
        "",  # [Request interrupted by user]
        "",  # <local-command-caveat>
        "/mcp",
        "",  # <local-command-stdout>Reconnected to tidewave.</local-command-stdout>
        "scrolling back in xterm.js still does not work (maybe because outer web catches "
        "it)? websearch xterm.js tmux interactions",
        "",  # [Request interrupted by user]
    ]


# Issue 14 finding 1: what the user typed, message by message, in the shared sessions.
TYPED: dict[str, list[str]] = {
    "258c7280-ae70-4798-800f-63464d01a85d.jsonl": [
        "Implement spotter-gqc",
        "check again",  # queued while the agent waited for a test run
        "new beads for the epic were added. tackle them",  # queued
        "did you push?",
    ],
    "fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl": [
        "/orchestrator create TODO app by Next.js",
        "Thanks! Please update CLAUDE.md for current changes",
    ],
    "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl": [
        "Work on bead spotter-4te. Run bd show spotter-4te to see the issue details and bd "
        "ready to find available subtasks. Start with the first ready task.",
        "/compact and continue with the reamining tasks",
        "continue implementation",
    ],
}


@pytest.mark.parametrize("name", sorted(TYPED))
def test_issue14_every_typed_word_is_imported(transcripts_dir: Path, name: str) -> None:
    result = _load(str(transcripts_dir / "claude_code" / name))
    typed = [_typed(m) for m in result.messages if m.role == "user" and m.agent == MAIN_AGENT]
    assert [t for t in typed if t] == TYPED[name]
    # Colour codes and the CLI's blocks are never sent as, or among, the user's words.
    for m in result.messages:
        for p in m.parts:
            if isinstance(p, TextPart) and not p.ignored and m.role == "user":
                assert "\x1b" not in p.text
                if not p.synthetic:
                    assert "<local-command-stdout>" not in p.text
                    assert "<command-name>" not in p.text


def test_issue14_importer_agrees_with_the_independent_extraction(transcripts_dir: Path) -> None:
    """The importer's typed words equal those :mod:`mimo_ctx.typed_input` reads from the
    raw files (two implementations on purpose: a loss in one shows as a difference)."""
    from mimo_ctx.typed_input import typed_inputs

    for path in sorted((transcripts_dir / "claude_code").glob("*.jsonl")):
        if "_subagents_" in path.name:
            continue
        result = _load(str(path))
        typed = [_typed(m) for m in result.messages if m.role == "user" and m.agent == MAIN_AGENT]
        raw = [t.text for t in typed_inputs(path.read_bytes(), "claude-code")]
        # Whitespace where a block was cut out may differ; the words may not.
        assert [t.split() for t in typed if t] == [t.split() for t in raw], path.name


def test_sweagent_tool_calls_joined_and_prefix(transcripts_dir: Path) -> None:
    name = "sweagent/6e44b9__sweagenttestrepo-1c2844.traj"
    raw = json.loads((transcripts_dir / name).read_text())["history"]
    result = _load(str(transcripts_dir / name))
    assert result.session.prefix is not None
    assert result.session.prefix.system == raw[0]["content"]
    tools = [p for m in result.messages for p in m.parts if isinstance(p, ToolPart)]
    observations = {m["tool_call_ids"][0]: m["content"] for m in raw if m["role"] == "tool"}
    assert len(tools) == 4
    for t in tools:
        assert isinstance(t.state, ToolStateCompleted)
        assert t.state.output == observations[t.call_id]
    assert tools[0].tool == "find_file"
    assert tools[0].state.input == {"file_name": "missing_colon.py"}
    assert result.session.metadata["sweagent"]["model_stats"]["api_calls"] == 5


def test_sweagent_demo_is_synthetic_and_times_are_synthetic(transcripts_dir: Path) -> None:
    result = _load(str(transcripts_dir / "sweagent/pydicom__pydicom-1458.traj"))
    demo = result.messages[0]
    assert demo.metadata["is_demo"] is True
    assert all(isinstance(p, TextPart) and p.synthetic for p in demo.parts)
    task = result.messages[1]
    assert task.role == "user"
    assert not any(isinstance(p, TextPart) and p.synthetic for p in task.parts)
    assert _typed(task).startswith("We're currently solving the following issue")
    # Issue 14: the observations that follow (user messages in this older format) are
    # the environment's, not typed words; assistant text stays as it is.
    later = result.messages[2:]
    assert all(
        all(isinstance(p, TextPart) and p.synthetic for p in m.parts)
        and m.metadata["observation"] is True
        for m in later
        if m.role == "user"
    )
    assert any(m.role == "user" for m in later)
    assert not any(
        isinstance(p, TextPart) and p.synthetic
        for m in later
        if m.role == "assistant"
        for p in m.parts
    )
    # No timestamps in the file: base + 1 ms per message (the system prompt is
    # the prefix, so the first message is history[1]).
    assert [m.time_created for m in result.messages[:3]] == [
        1_700_000_000_000,
        1_700_000_000_001,
        1_700_000_000_002,
    ]
    assert all(m.usage is None for m in result.messages)
    assert Counter(m.agent for m in result.messages) == {MAIN_AGENT: 25}
