"""``mimo-ctx inspect`` (issue 6 item 3; SPEC R2, R4, R5, R7, R8.1).

On every shared transcript ``inspect --json`` prints one document of the
documented schema whose ``request.messages`` passes the provider validator;
on a synthetic provider-shaped transcript the watermark, the sections and
``--at`` are checked exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx.importers import load_transcript
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.replay import stable_ids
from tests.cli.conftest import every_transcript, run_cli, write_chat_transcript
from tests.json_support import is_json_array, is_json_object

SECTION_HEADINGS = [
    "Tasks ledger",
    "Session checkpoint",
    "Active actors",
    "Recent user input (verbatim)",
    "Project durable knowledge",
    "Global memory",
    "Session notes",
    "Memory keys index",
    "Recent activity",
]


def check_inspect_document(doc: Any, fmt: str) -> None:
    """The documented ``inspect --json`` schema (docs/cli.md), keys and types."""
    assert is_json_object(doc)
    for key in ("watermark", "sections", "tokens_before", "tokens_after", "request"):
        assert key in doc, key
    assert doc["watermark"] is None or isinstance(doc["watermark"], str)
    assert is_json_array(doc["sections"])
    for section in doc["sections"]:
        assert isinstance(section["heading"], str)
        assert isinstance(section["tokens"], int)
        assert isinstance(section["cap"], int)
        assert section["tokens"] >= 0
        assert section["cap"] >= 0
        assert section["unit"] in ("tokens", "characters", "lines")
    assert isinstance(doc["tokens_before"], int)
    assert isinstance(doc["tokens_after"], int)
    assert isinstance(doc["outcome"], str)
    assert doc["watermark_index"] is None or isinstance(doc["watermark_index"], int)
    assert isinstance(doc["activity_digest"], str)
    assert isinstance(doc["compacted_results"], int)
    request = doc["request"]
    assert request["format"] == fmt
    payload = request["messages"]
    if fmt == "openai":
        assert is_json_array(payload)
        validate_request(payload, format="openai-chat")
    else:
        assert is_json_object(payload)
        assert set(payload) == {"system", "messages"}
        assert payload["system"] is None or isinstance(payload["system"], str)
        validate_request(payload, format="anthropic")


@pytest.mark.transcripts
@pytest.mark.parametrize("path", every_transcript())
@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_inspect_json_on_every_shared_transcript(path: Path, fmt: str) -> None:
    """Issue 6 done-when: valid JSON of the documented schema; the payload validates."""
    run = run_cli("inspect", str(path), "--json", "--format", fmt)
    assert run.code == 0, run.err
    assert run.err == ""
    doc = run.json()
    check_inspect_document(doc, fmt)
    if doc["outcome"] == "rebuilt":
        # R5.3: the nine sections, in order; R8.1: the request starts at the boundary.
        assert [s["heading"] for s in doc["sections"]] == SECTION_HEADINGS
        assert doc["watermark"] is not None
        assert doc["tokens_after"] < doc["trigger_tokens"]
        sent = (
            doc["request"]["messages"]
            if fmt == "openai"
            else doc["request"]["messages"]["messages"]
        )
        first_user = next(m for m in sent if m["role"] != "system")
        assert "Summary of previous conversation from checkpoint files:" in json.dumps(first_user)


def test_inspect_synthetic_chat_transcript(tmp_path: Path) -> None:
    """R2.3-R2.6 / R4 / R7: watermark inside the history, tail digested, results cleared."""
    path = write_chat_transcript(tmp_path / "chat.json")
    doc = run_cli("inspect", str(path), "--json").json()
    check_inspect_document(doc, "openai")
    assert doc["outcome"] == "rebuilt"
    assert doc["watermark_index"] is not None
    assert 0 < doc["watermark_index"] < 33
    # The tail after the watermark is folded into the digest (R7.1) ...
    assert doc["activity_digest"].startswith("# Recent activity")
    assert 'read(path="m29.py")' in doc["activity_digest"]
    # ... and its read results are micro-compacted (R4.5).
    assert doc["compacted_by_tool"].get("read", 0) > 0
    assert doc["tokens_after"] < doc["tokens_before"] / 10
    # R8.1: the system prompt comes first, then the boundary.
    messages = doc["request"]["messages"]
    assert messages[0] == {"role": "system", "content": "You are a coding agent."}
    assert messages[1]["role"] == "user"
    # The user's own words are in the rebuilt request (R5 section 4).
    text = json.dumps(messages)
    assert "keep the old name as a deprecated alias" in text
    assert "Also update the changelog under Unreleased." in text


def test_inspect_is_deterministic_apart_from_the_memory_root(tmp_path: Path) -> None:
    """Stable ids: two runs print the same ids and figures."""
    path = write_chat_transcript(tmp_path / "chat.json")
    first = run_cli("inspect", str(path), "--json").json()
    second = run_cli("inspect", str(path), "--json").json()
    assert first["watermark"] == second["watermark"]
    assert first["sections"][-1] == second["sections"][-1]
    assert first["tokens_before"] == second["tokens_before"]
    assert first["tokens_after"] == second["tokens_after"]


def test_inspect_at_limits_the_history(tmp_path: Path) -> None:
    """--at: only messages up to that one are considered (by #N, by id)."""
    path = write_chat_transcript(tmp_path / "chat.json")
    transcript = stable_ids(load_transcript(path))
    full = run_cli("inspect", str(path), "--json").json()
    by_index = run_cli("inspect", str(path), "--json", "--at", "#12").json()
    by_id = run_cli("inspect", str(path), "--json", "--at", transcript.messages[12].id).json()
    assert by_index["at"] == by_id["at"] == 12
    assert by_index["watermark"] == by_id["watermark"]
    assert by_index["tokens_before"] < full["tokens_before"]
    assert by_index["watermark_index"] is not None
    assert by_index["watermark_index"] <= 12
    check_inspect_document(by_index, "openai")


def test_inspect_at_accepts_the_transcripts_own_id(tmp_path: Path) -> None:
    """--at with a Claude Code uuid picks that record's message."""
    lines: list[str] = []
    parent = None
    for i in range(6):
        uuid = f"00000000-0000-0000-0000-00000000000{i}"
        if i % 2 == 0:
            message: dict[str, Any] = {"role": "user", "content": f"question number {i}"}
            kind = "user"
        else:
            message = {
                "role": "assistant",
                "id": f"msg_{i}",
                "content": [{"type": "text", "text": f"answer number {i}"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 10 * i, "output_tokens": 5},
            }
            kind = "assistant"
        lines.append(
            json.dumps(
                {
                    "type": kind,
                    "uuid": uuid,
                    "parentUuid": parent,
                    "sessionId": "s1",
                    "timestamp": f"2026-01-01T00:00:0{i}.000Z",
                    "message": message,
                }
            )
        )
        parent = uuid
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    doc = run_cli("inspect", str(path), "--json", "--at", "00000000-0000-0000-0000-000000000003")
    assert doc.code == 0, doc.err
    assert doc.json()["at"] == 3
    payload = json.dumps(doc.json()["request"])
    assert "question number 4" not in payload
    assert "question number 2" in payload


def test_inspect_human_output_shows_every_part(tmp_path: Path) -> None:
    """Watermark, section table with caps, digest, sizes, micro-compaction."""
    path = write_chat_transcript(tmp_path / "chat.json")
    run = run_cli("inspect", str(path), "--plain")
    assert run.code == 0, run.err
    for text in (
        "Watermark:",
        "Session checkpoint",
        "11,000",
        "2,000 chars",
        "200 lines",
        "# Recent activity",
        "Before:",
        "After:",
        "tool results cleared: read",
    ):
        assert text in run.out, text
    rich_run = run_cli("inspect", str(path))
    assert rich_run.code == 0
    assert "Recent user input (verbatim)" in rich_run.out


def test_inspect_memory_root_keeps_the_checkpoint(tmp_path: Path) -> None:
    """--memory-root keeps checkpoint.md (A13 layout) for a look afterwards."""
    path = write_chat_transcript(tmp_path / "chat.json")
    root = tmp_path / "memory"
    doc = run_cli("inspect", str(path), "--json", "--memory-root", str(root)).json()
    assert doc["memory_root"] == str(root)
    checkpoints = list(root.glob("sessions/*/checkpoint.md"))
    assert len(checkpoints) == 1
    assert "## 1. Active intent" in checkpoints[0].read_text(encoding="utf-8")


def test_inspect_window_changes_the_trigger_line(tmp_path: Path) -> None:
    """R1.2: the trigger line follows --window (K/M suffixes accepted)."""
    path = write_chat_transcript(tmp_path / "chat.json")
    doc = run_cli("inspect", str(path), "--json", "--window", "100K").json()
    assert doc["window"] == 100_000
    assert doc["trigger_tokens"] == 80_000
