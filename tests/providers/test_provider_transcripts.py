"""Converters and validator over real transcripts (issue 5.3 / 5.4, SPEC A10).

The transcripts are read in place (never copied into the repo) from
``$MIMO_CTX_TRANSCRIPTS``, by default ``../shared/data/transcripts`` next to the
repository; the tests skip with a clear reason when they are absent.

* Claude Code sessions store each message in Anthropic Messages form (one line per
  content block, tool results in user lines): read them with ``from_anthropic``,
  send them back to all three formats, and check the requests are valid and keep
  every tool call, in order.
* SWE-agent trajectories keep an OpenAI Chat Completions ``history``: the round
  trip through the internal model must give back the same messages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx.messages import ToolPart
from mimo_ctx.providers.anthropic import from_anthropic, to_anthropic
from mimo_ctx.providers.openai import from_openai_chat, to_openai_chat, to_openai_responses
from mimo_ctx.providers.validate import validate_request

pytestmark = pytest.mark.transcripts

_ROOT = Path(__file__).resolve().parents[2]
_TRANSCRIPTS = Path(
    os.environ.get("MIMO_CTX_TRANSCRIPTS", _ROOT.parent / "shared/data/transcripts")
)


def _files(kind: str, pattern: str) -> list[Path]:
    folder = _TRANSCRIPTS / kind
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


def _skip_if_none(files: list[Path], kind: str) -> None:
    if not files:
        pytest.skip(f"no {kind} transcripts under {_TRANSCRIPTS} (set MIMO_CTX_TRANSCRIPTS)")


def _claude_code_messages(path: Path) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            entry = json.loads(line)
            if entry.get("type") in ("user", "assistant") and isinstance(
                entry.get("message"), dict
            ):
                messages.append(entry["message"])
    return messages


def _tool_use_ids(messages: list[dict[str, Any]]) -> list[str]:
    return [
        block["id"]
        for m in messages
        if isinstance(m.get("content"), list)
        for block in m["content"]
        if block.get("type") == "tool_use"
    ]


def test_claude_code_sessions_convert_to_valid_requests() -> None:
    files = _files("claude_code", "*.jsonl")
    _skip_if_none(files, "claude_code")
    for path in files:
        raw = _claude_code_messages(path)
        _, internal = from_anthropic(None, raw, session_id="ses_cc")
        calls = [p for m in internal for p in m.parts if isinstance(p, ToolPart)]
        # Every result of the transcript found its call (no orphan tool messages).
        assert all(m.role != "tool" for m in internal), path.name
        assert all(c.state.status in ("completed", "error") for c in calls), path.name

        _, anthropic = to_anthropic(internal)
        validate_request(anthropic, format="anthropic")
        assert _tool_use_ids(anthropic) == _tool_use_ids(raw), path.name

        chat = to_openai_chat(internal, system="sys")
        validate_request(chat, format="openai-chat")
        assert [c["id"] for m in chat for c in m.get("tool_calls", [])] == _tool_use_ids(raw)

        validate_request(to_openai_responses(internal), format="openai-responses")


def _sweagent_history(path: Path) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["history"]
    out: list[dict[str, Any]] = []
    for entry in history:
        message = {k: v for k, v in entry.items() if k in ("role", "content", "tool_calls")}
        # SWE-agent writes a tool message's call id as a one-element list.
        if entry.get("role") == "tool":
            [message["tool_call_id"]] = entry["tool_call_ids"]
        out.append(message)
    return out


def test_sweagent_histories_round_trip_exactly() -> None:
    files = _files("sweagent", "*.traj")
    _skip_if_none(files, "sweagent")
    for path in files:
        payload = _sweagent_history(path)
        system, internal = from_openai_chat(payload, session_id="ses_swe")
        out = to_openai_chat(internal, system=system)
        validate_request(out, format="openai-chat")
        assert out == payload, path.name
