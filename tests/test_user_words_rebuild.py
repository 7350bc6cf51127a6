"""The user's words reach the rebuilt request, and the CLI's noise does not (issue 14
findings 1 and 7), on the shared Claude Code sessions.

Before the importer fix: in 258c7280 "check again" and "new beads for the epic were
added. tackle them" (typed while the agent worked) reached no rebuilt request; in
fe5e1c67 the goal, typed as ``/orchestrator create TODO app by Next.js``, was
machine text; in ae4a77f8 the ``/compact`` output, colour codes included, was sent.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import TextPart
from mimo_ctx.replay import ReplayPoint, replay_transcript, request_text, stable_ids

pytestmark = pytest.mark.transcripts

_RECENT = "# Recent user input"


async def _rebuild(transcripts_dir: Path, name: str, at: int | None = None) -> ReplayPoint:
    path = transcripts_dir / "claude_code" / name
    transcript = stable_ids(load_transcript(path))
    if at is None:
        at = len(transcript.messages)
    report = await replay_transcript(transcript, window=200_000, rebuild_at=at)
    assert report.point is not None
    assert report.point.outcome == "rebuilt"
    return report.point


def _body(point: ReplayPoint) -> str:
    assert point.boundary is not None
    return "\n".join(p.text for p in point.boundary.parts if isinstance(p, TextPart))


def _recent_user_input(body: str) -> str:
    assert _RECENT in body
    return body.split(_RECENT, 1)[1].split("\n# ", 1)[0]


async def test_queued_messages_reach_the_rebuild_at_claude_codes_compaction(
    transcripts_dir: Path,
) -> None:
    name = "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    compaction = load_transcript(transcripts_dir / "claude_code" / name).compactions[0]
    point = await _rebuild(transcripts_dir, name, compaction.index)
    recent = _recent_user_input(_body(point))
    assert "check again" in recent
    assert "new beads for the epic were added. tackle them" in recent


async def test_a_slash_command_goal_is_the_users_words(transcripts_dir: Path) -> None:
    point = await _rebuild(transcripts_dir, "fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl")
    body = _body(point)
    recent = _recent_user_input(body)
    assert "/orchestrator create TODO app by Next.js" in recent
    # The checkpoint's intent names it too: it is no longer "(none)". The words
    # themselves appear once in the body, under Recent user input, which it points to.
    intent = body.split("Active intent", 1)[1].split("\n## ", 1)[0]
    task = re.search(r"- Task \(user message (\S+)\): quoted under Recent user input", intent)
    assert task is not None, intent
    assert f"[user message {task.group(1)}" in recent
    sections = body.split("The sections below are auto-loaded", 1)[1]  # after the index part
    assert sections.count("/orchestrator create TODO app by Next.js") == 1


async def test_command_output_and_colour_codes_are_not_the_users_words(
    transcripts_dir: Path,
) -> None:
    point = await _rebuild(transcripts_dir, "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl")
    body = _body(point)
    recent = _recent_user_input(body)
    assert "/compact and continue with the reamining tasks" in recent
    assert "continue implementation" in recent
    assert "Compacted (ctrl+o" not in recent
    assert "<command-name>" not in recent
    sent = request_text(list(point.request))
    assert "\x1b" not in sent
