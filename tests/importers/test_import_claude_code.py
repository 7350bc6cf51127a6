"""Claude Code importer on small transcripts the tests write (decisions documented
in ``mimo_ctx.importers.claude_code``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import ids
from mimo_ctx.convert import MessageDraft
from mimo_ctx.importers import find_subagent_files, load_transcript
from mimo_ctx.importers._common import build_transcript_messages
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    FilePart,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStateRunning,
)

from .builders import assistant, system, tool_result, tool_use, user, write_jsonl


def _texts(parts: Sequence[object]) -> list[str]:
    return [p.text for p in parts if isinstance(p, TextPart)]


def test_fork_keeps_active_branch_and_reports_abandoned(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "fork.jsonl",
        [
            user("u1", None, 0, "first question"),
            assistant("a1", "u1", 1, [{"type": "text", "text": "answer 1"}], msg_id="m1"),
            user("u2", "a1", 2, "abandoned follow-up"),
            assistant("a2", "u2", 3, [{"type": "text", "text": "abandoned answer"}], msg_id="m2"),
            # The user rewound to a1 and asked something else.
            user("u3", "a1", 4, "edited follow-up"),
            assistant("a3", "u3", 5, [{"type": "text", "text": "answer 3"}], msg_id="m3"),
        ],
    )
    result = load_transcript(path)
    assert [_texts(m.parts) for m in result.messages] == [
        ["first question"],
        ["answer 1"],
        ["edited follow-up"],
        ["answer 3"],
    ]
    assert [(s.line, s.reason) for s in result.off_branch] == [
        (3, "not on the active branch (abandoned fork)"),
        (4, "not on the active branch (abandoned fork)"),
    ]
    assert result.counts()["off_branch"] == 2


def test_parallel_tool_calls_split_by_progress_lines_are_one_message(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "parallel.jsonl",
        [
            user("u1", None, 0, "look around"),
            assistant("a1", "u1", 1, [tool_use("t1", command="ls")], msg_id="m1"),
            {"type": "progress", "uuid": "p1", "parentUuid": "a1", "timestamp": "x"},
            assistant("a2", "p1", 2, [tool_use("t2", "Glob", pattern="*")], msg_id="m1"),
            user("r1", "a1", 3, [tool_result("t1", "file.txt")]),
            user("r2", "a2", 4, [tool_result("t2", "oops", is_error=True)]),
            assistant("a3", "r2", 5, [{"type": "text", "text": "done"}], msg_id="m2"),
        ],
    )
    result = load_transcript(path)
    assert result.off_branch == []
    assert [m.role for m in result.messages] == ["user", "assistant", "assistant"]
    calls = result.messages[1]
    assert calls.provider_message_id == "m1"
    assert calls.finish == "tool-calls"
    t1, t2 = calls.parts
    assert isinstance(t1, ToolPart)
    assert isinstance(t2, ToolPart)
    assert isinstance(t1.state, ToolStateCompleted)
    assert t1.state.output == "file.txt"
    assert t1.state.input == {"command": "ls"}
    assert isinstance(t2.state, ToolStateError)
    assert t2.state.error == "oops"
    assert result.messages[2].finish == "stop"


def test_r1_2_compaction_followed_across_boundary(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "compact.jsonl",
        [
            user("u1", None, 0, "build it"),
            assistant(
                "a1",
                "u1",
                1,
                [{"type": "text", "text": "built"}],
                msg_id="m1",
                usage={
                    "input_tokens": 100,
                    "output_tokens": 20,
                    "cache_read_input_tokens": 1000,
                    "cache_creation_input_tokens": 5,
                },
            ),
            system(
                "b1",
                None,
                2,
                subtype="compact_boundary",
                logicalParentUuid="a1",
                compactMetadata={"trigger": "manual"},
            ),
            user("s1", "b1", 3, "Summary: we built it.", isCompactSummary=True),
            user("u2", "s1", 4, "next"),
            assistant("a2", "u2", 5, [{"type": "text", "text": "ok"}], msg_id="m2"),
        ],
    )
    result = load_transcript(path)
    assert [m.role for m in result.messages] == ["user", "assistant", "user", "user", "assistant"]
    (comp,) = result.compactions
    assert comp.index == 2
    assert comp.trigger == "manual"
    assert comp.line == 4
    # No preTokens in the file: the last finished assistant usage before it.
    assert comp.tokens_before == 1125
    summary = result.messages[2]
    assert summary.is_boundary
    (part,) = summary.parts
    assert isinstance(part, CompactionPart)
    assert part.summary == "Summary: we built it."
    assert part.auto is False


def test_unanswered_tool_call_is_running_and_last_message_unfinished(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "running.jsonl",
        [
            user("u1", None, 0, "run it"),
            assistant("a1", "u1", 1, [tool_use("t1", command="sleep 100")], msg_id="m1"),
        ],
    )
    (_, message) = load_transcript(path).messages
    (part,) = message.parts
    assert isinstance(part, ToolPart)
    assert isinstance(part.state, ToolStateRunning)
    assert part.state.time.start is not None
    assert message.finish is None


def test_unanswered_tool_call_followed_by_more_is_finished(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "interrupted.jsonl",
        [
            user("u1", None, 0, "run it"),
            assistant("a1", "u1", 1, [tool_use("t1", command="sleep 100")], msg_id="m1"),
            user("u2", "a1", 2, "never mind"),
        ],
    )
    message = load_transcript(path).messages[1]
    assert message.finish == "tool-calls"
    (part,) = message.parts
    assert isinstance(part, ToolPart)
    assert isinstance(part.state, ToolStateRunning)


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool-calls"),
        ("max_tokens", "length"),
        ("refusal", "content-filter"),
        ("pause_turn", "pause_turn"),
    ],
)
def test_stop_reason_maps_to_finish(tmp_path: Path, stop_reason: str, finish: str) -> None:
    path = write_jsonl(
        tmp_path / "stop.jsonl",
        [
            user("u1", None, 0, "hi"),
            assistant("a1", "u1", 1, [{"type": "text", "text": "he"}], msg_id="m1"),
            assistant(
                "a2",
                "a1",
                2,
                [{"type": "text", "text": "llo"}],
                msg_id="m1",
                stop_reason=stop_reason,
            ),
        ],
    )
    (_, message) = load_transcript(path).messages
    assert _texts(message.parts) == ["he", "llo"]
    assert message.finish == finish
    assert message.metadata["claude_code"]["uuids"] == ["a1", "a2"]


def test_a1_ids_ascend_when_timestamps_go_backwards(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "backwards.jsonl",
        [
            user("u1", None, 10, "one"),
            assistant("a1", "u1", 5, [{"type": "text", "text": "two"}], msg_id="m1"),
            user("u2", "a1", 7, "three"),
            assistant("a2", "u2", 20, [{"type": "text", "text": "four"}], msg_id="m2"),
        ],
    )
    messages = load_transcript(path).messages
    assert [m.id for m in messages] == sorted(m.id for m in messages)
    base = messages[0].time_created
    assert [m.time_created - base for m in messages] == [0, 0, 0, 10_000]
    assert all(ids.timestamp_of(m.id) == m.time_created for m in messages)


def test_blocks_reasoning_redacted_image_opaque(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "blocks.jsonl",
        [
            user(
                "u1",
                None,
                0,
                [
                    {"type": "text", "text": "what is this?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"},
                    },
                ],
            ),
            assistant(
                "a1",
                "u1",
                1,
                [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque-bytes"},
                    {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
                    {"type": "text", "text": "a cat"},
                ],
                msg_id="m1",
            ),
        ],
    )
    first, second = load_transcript(path).messages
    image = first.parts[1]
    assert isinstance(image, FilePart)
    assert image.mime == "image/jpeg"
    assert image.url == "data:image/jpeg;base64,QUJD"
    thinking, redacted, opaque, text = second.parts
    assert isinstance(thinking, ReasoningPart)
    assert (thinking.text, thinking.signature, thinking.redacted) == ("hmm", "sig", False)
    assert isinstance(redacted, ReasoningPart)
    assert (redacted.text, redacted.signature, redacted.redacted) == ("", "opaque-bytes", True)
    assert opaque.type == "opaque"
    assert opaque.kind == "server_tool_use"
    assert isinstance(text, TextPart)


def test_orphan_result_becomes_tool_message_and_mixed_user_line(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "orphan.jsonl",
        [
            user("u1", None, 0, "go"),
            assistant("a1", "u1", 1, [tool_use("t1")], msg_id="m1"),
            user(
                "r1",
                "a1",
                2,
                [
                    tool_result("t1", "fine"),
                    tool_result("nope", "from nowhere"),
                    {"type": "text", "text": "and also this"},
                ],
            ),
        ],
    )
    messages = load_transcript(path).messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "user"]
    orphan = messages[2].parts[0]
    assert isinstance(orphan, ToolResultPart)
    assert (orphan.call_id, orphan.tool, orphan.output) == ("nope", "unknown", "from nowhere")
    assert _texts(messages[3].parts) == ["and also this"]


def test_api_error_line_sets_error_not_finish(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "apierror.jsonl",
        [
            user("u1", None, 0, "hi"),
            assistant(
                "a1",
                "u1",
                1,
                [{"type": "text", "text": "API Error: 529 overloaded"}],
                msg_id="m1",
                isApiErrorMessage=True,
            ),
        ],
    )
    message = load_transcript(path).messages[1]
    assert message.error is not None
    assert message.error.message == "API Error: 529 overloaded"
    assert message.finish is None


def test_meta_text_is_synthetic_commands_are_typed(tmp_path: Path) -> None:
    """isMeta lines are the CLI's; a slash command or bash input is what the user typed.

    (Before issue 14 a slash command was synthetic as a whole, losing its arguments;
    ``tests/importers/test_claude_code_user_words.py`` covers the new rules.)
    """
    path = write_jsonl(
        tmp_path / "meta.jsonl",
        [
            user("u1", None, 0, "<command-name>/init</command-name>"),
            user("u2", "u1", 1, [{"type": "text", "text": "Analyse the code"}], isMeta=True),
            user("u3", "u2", 2, "<bash-input>ls</bash-input>"),
            user("u4", "u3", 3, "real words"),
        ],
    )
    messages = load_transcript(path).messages
    sent = [
        (p.text, p.synthetic)
        for m in messages
        for p in m.parts
        if isinstance(p, TextPart) and not p.ignored
    ]
    assert sent == [
        ("/init", False),
        ("Analyse the code", True),
        ("!ls", False),
        ("real words", False),
    ]
    assert messages[1].metadata["claude_code"]["is_meta"] is True


def _subagent_session(tmp_path: Path) -> Path:
    main = write_jsonl(
        tmp_path / "sess.jsonl",
        [
            user("u1", None, 0, "delegate"),
            assistant("a1", "u1", 1, [tool_use("t1", "Task", prompt="dig")], msg_id="m1"),
            user("r1", "a1", 10, [tool_result("t1", "dug")]),
            assistant("a2", "r1", 11, [{"type": "text", "text": "done"}], msg_id="m2"),
        ],
    )
    side = [
        user("s1", None, 2, "dig", isSidechain=True, agentId="x1"),
        assistant("s2", "s1", 3, [{"type": "text", "text": "dug"}], msg_id="sm1", isSidechain=True),
    ]
    write_jsonl(tmp_path / "sess_subagents_agent-x1.jsonl", side)
    nested = tmp_path / "sess" / "subagents"
    nested.mkdir(parents=True)
    write_jsonl(
        nested / "agent-x2.jsonl",
        [user("n1", None, 4, "peek", isSidechain=True, agentId="x2")],
    )
    return main


def test_subagent_files_found_and_interleaved_by_time(tmp_path: Path) -> None:
    main = _subagent_session(tmp_path)
    assert [p.name for p in find_subagent_files(main)] == [
        "sess_subagents_agent-x1.jsonl",
        "agent-x2.jsonl",
    ]
    result = load_transcript(main)
    assert [(m.agent, m.role) for m in result.messages] == [
        (MAIN_AGENT, "user"),
        (MAIN_AGENT, "assistant"),
        ("x1", "user"),
        ("x1", "assistant"),
        ("x2", "user"),
        (MAIN_AGENT, "assistant"),
    ]
    assert result.agents == [MAIN_AGENT, "x1", "x2"]
    assert result.counts()["subagent_messages"] == 3
    assert len(result.sources) == 3
    assert load_transcript(main, subagents=[]).agents == [MAIN_AGENT]


def test_inline_sidechains_named_by_root(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "inline.jsonl",
        [
            user("u1", None, 0, "go"),
            user("abcdef0123", None, 1, "side task", isSidechain=True),
            assistant(
                "s2",
                "abcdef0123",
                2,
                [{"type": "text", "text": "ok"}],
                msg_id="x",
                isSidechain=True,
            ),
            assistant("a1", "u1", 3, [{"type": "text", "text": "main"}], msg_id="m1"),
        ],
    )
    result = load_transcript(path)
    assert [m.agent for m in result.messages] == [
        MAIN_AGENT,
        "sidechain-abcdef01",
        "sidechain-abcdef01",
        MAIN_AGENT,
    ]


def test_lenient_gap_is_bridged(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "gap.jsonl",
        [
            user("u1", None, 0, "one"),
            assistant("a1", "u1", 1, [{"type": "text", "text": "two"}], msg_id="m1"),
            '{"type": "user", "uuid": "u2", "parentUuid": "a1", "message": {"role": "us',
            assistant("a2", "u2", 3, [{"type": "text", "text": "four"}], msg_id="m2"),
        ],
    )
    result = load_transcript(path, strict=False)
    assert [_texts(m.parts) for m in result.messages] == [["one"], ["two"], ["four"]]
    assert [s.line for s in result.skipped] == [3]
    assert result.off_branch == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=60))
def test_a1_build_messages_ids_always_ascend(times: list[int]) -> None:
    drafts = [
        MessageDraft(role="user", time=1_800_000_000_000 + t, parts=[TextPart(text="x")])
        for t in times
    ]
    messages = build_transcript_messages(drafts, "ses_test")
    assert [m.id for m in messages] == sorted(m.id for m in messages)
    assert len({m.id for m in messages}) == len(messages)
    created = [m.time_created for m in messages]
    assert created == sorted(created)
    for m, t in zip(messages, times, strict=True):
        assert m.time_created >= 1_800_000_000_000 + t
        assert ids.timestamp_of(m.id) == m.time_created


def test_parent_cycle_does_not_hang(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "cycle.jsonl",
        [
            user("u1", "a1", 0, "one"),
            assistant("a1", "u1", 1, [{"type": "text", "text": "two"}], msg_id="m1"),
        ],
    )
    assert [_texts(m.parts) for m in load_transcript(path).messages] == [["one"], ["two"]]
