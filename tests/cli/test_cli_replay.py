"""``mimo-ctx replay`` and :func:`mimo_ctx.replay.replay_transcript` (issue 6 item 4).

SPEC R1.2 (trigger line), R1.4 (once per usage), R3 (writer waits), A3 (writer
thresholds), R5.9 (a rebuilt request fits under the trigger line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import MAIN_AGENT
from mimo_ctx.replay import replay_transcript, replayable_messages, stable_ids
from tests.cli.conftest import every_transcript, run_cli, transcripts_root, write_chat_transcript
from tests.json_support import is_json_array, is_json_object


def check_replay_document(doc: Any) -> None:
    """The documented ``replay --json`` schema (docs/cli.md), keys and types."""
    assert is_json_object(doc)
    for key in ("window", "trigger_tokens", "turns", "writer_runs", "peak_request_tokens"):
        assert isinstance(doc[key], int), key
        assert doc[key] >= 0
    assert isinstance(doc["total_tokens_sent"], int)
    assert is_json_array(doc["rebuilds"])
    for rebuild in doc["rebuilds"]:
        assert isinstance(rebuild["at"], int)
        assert isinstance(rebuild["outcome"], str)
        assert rebuild["tokens_before"] is None or isinstance(rebuild["tokens_before"], int)
        assert isinstance(rebuild["tokens_after"], int)
        kept = rebuild["user_words_retained"]
        assert kept is None or (isinstance(kept, float | int) and 0 <= kept <= 1)
    assert is_json_array(doc["transcript_compactions"])
    for compaction in doc["transcript_compactions"]:
        assert isinstance(compaction["at"], int)
    assert is_json_array(doc["writers"])
    assert len(doc["writers"]) == doc["writer_runs"]
    for writer in doc["writers"]:
        assert isinstance(writer["at"], int)
        assert writer["result"] in ("finished", "failed", "running")
        assert writer["failure"] in (None, "error", "timeout", "invalid")
        for key in ("calls", "tokens_sent", "tokens_cached", "tokens_output"):
            assert isinstance(writer[key], int), key
        assert isinstance(writer["forked"], bool)
    costs = doc["writer_tokens"]
    assert set(costs) == {"calls", "sent", "cached", "output"}
    assert costs["sent"] == sum(w["tokens_sent"] for w in doc["writers"])
    assert costs["cached"] == sum(w["tokens_cached"] for w in doc["writers"])
    assert costs["output"] == sum(w["tokens_output"] for w in doc["writers"])
    assert costs["calls"] == sum(w["calls"] for w in doc["writers"])
    assert doc["peak_request_tokens"] <= doc["total_tokens_sent"] or doc["turns"] == 0


@pytest.mark.transcripts
@pytest.mark.parametrize("path", every_transcript())
def test_replay_json_on_every_shared_transcript(path: Path) -> None:
    """Issue 6 done-when: valid JSON of the documented schema on every transcript."""
    run = run_cli("replay", str(path), "--window", "100K", "--json")
    assert run.code == 0, run.err
    assert run.err == ""
    doc = run.json()
    check_replay_document(doc)
    assert doc["window"] == 100_000
    assert doc["trigger_tokens"] == 80_000  # R1.2: min(90%, window - 20,000)
    transcript = load_transcript(path)
    main_turns = sum(
        1
        for _, m in replayable_messages(transcript)
        if m.role == "assistant" and m.agent == MAIN_AGENT
    )
    assert doc["turns"] == main_turns
    assert [c["at"] for c in doc["transcript_compactions"]] == [
        c.index for c in transcript.compactions
    ]
    for rebuild in doc["rebuilds"]:
        if rebuild["outcome"] == "rebuilt":
            # R5.9 beyond: the rebuilt request fits under the trigger line.
            assert rebuild["tokens_after"] < doc["trigger_tokens"]


@pytest.mark.transcripts
def test_replay_big_claude_code_transcript_rebuilds_and_keeps_user_words() -> None:
    """A long real session at a 100K window: writers run, the trigger fires, words kept."""
    path = transcripts_root() / "claude_code" / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found (set MIMO_CTX_TRANSCRIPTS)")
    doc = run_cli("replay", str(path), "--window", "100000", "--json").json()
    assert doc["writer_runs"] >= 2
    assert doc["rebuilds"]
    assert all(r["outcome"] == "rebuilt" for r in doc["rebuilds"])
    # The transcript's usage is trusted only until the first compaction on either side.
    first = min(doc["rebuilds"][0]["at"], *(c["at"] for c in doc["transcript_compactions"]))
    assert doc["usage"]["transcript_turns"] <= first
    assert doc["usage"]["estimated_turns"] > 0
    for rebuild in doc["rebuilds"]:
        assert rebuild["user_words_retained"] == 1.0
    # Claude Code compacted at #109 on its own: shown side by side.
    assert doc["transcript_compactions"][0]["tokens_before"] > 100_000


def test_replay_small_window_rebuilds_repeatedly(tmp_path: Path) -> None:
    """R1.2 / R1.4: every crossing of the line rebuilds once; the request shrinks."""
    path = write_chat_transcript(tmp_path / "chat.json", rounds=40)
    doc = run_cli("replay", str(path), "--window", "30000", "--json").json()
    check_replay_document(doc)
    assert doc["trigger_tokens"] == 15_000
    assert len(doc["rebuilds"]) >= 2
    ats = [r["at"] for r in doc["rebuilds"]]
    assert ats == sorted(set(ats))  # at most one rebuild per turn (R1.4)
    for rebuild in doc["rebuilds"]:
        assert rebuild["tokens_before"] >= doc["trigger_tokens"] - 2000
        assert rebuild["tokens_after"] < rebuild["tokens_before"]
        assert rebuild["user_words_retained"] == 1.0
    assert doc["peak_request_tokens"] < doc["trigger_tokens"] + 2000


def test_replay_without_rebuild_at_a_large_window(tmp_path: Path) -> None:
    """Below the trigger line nothing is rebuilt; writers start at the A3 thresholds."""
    path = write_chat_transcript(tmp_path / "chat.json", rounds=30)
    doc = run_cli("replay", str(path), "--window", "100000", "--json").json()
    assert doc["rebuilds"] == []
    # usable 80,000: thresholds 16,000 / 32,000 (the request reaches ~32,000).
    assert doc["writer_runs"] >= 1
    assert all(w["result"] == "finished" for w in doc["writers"])
    assert doc["peak_request_tokens"] < doc["trigger_tokens"]


def test_replay_is_deterministic(tmp_path: Path) -> None:
    """Writers finish before the next turn and ids are stable: same report twice."""
    path = write_chat_transcript(tmp_path / "chat.json", rounds=40)
    first = run_cli("replay", str(path), "--window", "30K", "--json").json()
    second = run_cli("replay", str(path), "--window", "30K", "--json").json()
    assert first == second


async def test_replay_transcript_library_function(tmp_path: Path) -> None:
    """The driver is usable from code (benchmarks): report ids are the imported ones."""
    transcript = stable_ids(
        load_transcript(write_chat_transcript(tmp_path / "chat.json", rounds=40))
    )
    report = await replay_transcript(transcript, window=30_000, memory_root=tmp_path / "mem")
    ids = {m.id for m in transcript.messages}
    assert report.rebuilds
    for rebuild in report.rebuilds:
        assert rebuild.message_id in ids
        assert rebuild.message_id == transcript.messages[rebuild.at].id
        assert rebuild.watermark in ids
    for run in report.writer_runs:
        assert run.watermark in ids
    assert report.to_json()["writer_runs"] == len(report.writer_runs)
    assert list((tmp_path / "mem").glob("sessions/*/checkpoint.md"))


async def test_replay_estimate_usage_ignores_transcript_usage(tmp_path: Path) -> None:
    """use_transcript_usage=False estimates every turn."""
    transcript = load_transcript(write_chat_transcript(tmp_path / "chat.json", rounds=10))
    report = await replay_transcript(transcript, window=100_000, use_transcript_usage=False)
    assert report.transcript_usage_turns == 0
    assert report.estimated_usage_turns == report.turns


def test_replay_human_output(tmp_path: Path) -> None:
    """Writer runs, rebuilds side by side with compactions, summary."""
    path = write_chat_transcript(tmp_path / "chat.json", rounds=40)
    run = run_cli("replay", str(path), "--window", "30K", "--plain")
    assert run.code == 0, run.err
    for text in ("Checkpoint writer runs", "mimo_ctx", "rebuilt", "User words kept", "100%"):
        assert text in run.out, text
    assert "Peak request:" in run.out
