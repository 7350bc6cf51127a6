"""The quality benchmark (issue 14 build 7): its probes are exact, and it runs quickly.

The probe definitions are checked on a made-up Claude Code session whose every
probe is known; the smoke run scores one shared transcript (or, without the
shared transcripts, the made-up one). No figure is asserted as a target: the
benchmark reports, it does not gate.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchmarks import run_all as bench
from mimo_ctx.typed_input import typed_inputs


@pytest.fixture(scope="module")
def quality() -> ModuleType:
    return bench.load_benchmark("quality")


def test_probes_of_the_synthetic_session_are_exact(quality: ModuleType, tmp_path: Path) -> None:
    path = quality.synthetic_claude_code(tmp_path / "s.jsonl")
    data = path.read_bytes()
    [point] = quality.compaction_points(data)
    assert point.summary.startswith("This session is being continued")
    probes = quality.extract_probes(data, point.line, typed_inputs(data, "claude-code"))
    # The slash command as typed, the queued message (typed while the agent worked).
    assert probes.first_request == (
        "/plan build a small todo app with a sqlite backend and a web page"
    )
    assert probes.latest_instruction == "also add a dark mode toggle to the page please"
    assert probes.files_changed == [
        "/repo/app/schema.sql",
        "/repo/app/web/page_with_a_long_name.html",
    ]
    assert probes.plan_items == ["Create the sqlite schema", "Write the web page"]
    # "Exit code 1" is passed over; the line naming the failure is the key.
    assert probes.unresolved_error == ["Error:", "cannot", "find", "module", "sqlite3"]


def test_scores_follow_the_definitions(quality: ModuleType, tmp_path: Path) -> None:
    path = quality.synthetic_claude_code(tmp_path / "s.jsonl")
    data = path.read_bytes()
    [point] = quality.compaction_points(data)
    probes = quality.extract_probes(data, point.line, typed_inputs(data, "claude-code"))
    perfect = (
        "> /plan build a small todo app with a sqlite backend and a web page\n"
        '"also add a dark mode toggle to the page please"\n'
        "Files: schema.sql, page_with_a_long_name.html\n"
        "Plan: create the SQLITE schema; write the web page.\n"
        "Last error: error: Cannot find module 'sqlite3'\\nat line 1\n"
    )
    assert all(v == 1.0 for v in quality.score(probes, perfect).values())
    nothing = quality.score(probes, "the user wants a todo app")
    assert set(nothing.values()) == {0.0}
    # The file name counts, not its folder; a half-quoted request counts by its runs.
    partial = quality.score(
        probes, "page_with_a_long_name.html; build a small todo app with a sqlite backend"
    )
    assert partial["(d) files changed"] == 0.5
    assert partial["(b) first request"] == pytest.approx(2 / 7)  # 14 words: 7 runs of 8


def test_a_resolved_error_is_not_probed(quality: ModuleType, tmp_path: Path) -> None:
    path = quality.synthetic_claude_code(tmp_path / "s.jsonl")
    text = path.read_text(encoding="utf-8").splitlines()
    # A later successful run of the same command (same first two words) resolves it.
    call = text[-3].replace('"t4"', '"t5"').replace('"m4"', '"m5"')
    passed = (
        text[-2]
        .replace('"t4"', '"t5"')
        .replace('"is_error": true', '"is_error": false')
        .replace("Exit code 1", "ok")
    )
    fixed = [*text[:-1], call, passed, text[-1]]
    path.write_text("\n".join(fixed) + "\n", encoding="utf-8")
    data = path.read_bytes()
    [point] = quality.compaction_points(data)
    probes = quality.extract_probes(data, point.line, typed_inputs(data, "claude-code"))
    assert probes.unresolved_error is None
    assert quality.score(probes, "anything")["(f) unresolved error"] is None


def _check(result: dict[str, Any]) -> None:
    assert result["name"] == "quality"
    points = result["data"]["points"]
    assert points
    for p in points:
        assert p["outcome"] == "rebuilt"
        assert p["body_tokens"] > 0
        assert p["summary_tokens"] > 0
        assert p["invalid"] is None
        assert p["request_estimate"] < p["trigger_tokens"]
        for side in ("body", "request", "claude_code"):
            assert list(p["scores"][side]) == list(bench.load_benchmark("quality").PROBES)
            for value in p["scores"][side].values():
                assert value is None or 0.0 <= value <= 1.0
    names = [t["name"] for t in result["targets"]]
    assert "body tokens vs Claude Code's summary" in names
    assert any("(a) user words" in n for n in names)


def test_quick_run_scores_one_transcript() -> None:
    result = bench.run_benchmarks(["quality"], quick=True)["results"]["quality"]
    _check(result)
    assert len({p["transcript"] for p in result["data"]["points"]}) == 1


def test_without_shared_transcripts_the_synthetic_session_is_scored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MIMO_CTX_TRANSCRIPTS", str(tmp_path))
    result = bench.run_benchmarks(["quality"], quick=True)["results"]["quality"]
    _check(result)
    [point] = result["data"]["points"]
    assert point["transcript"] == "synthetic.jsonl"
    assert any("synthetic" in note for note in result["notes"])
    # Every probe applies to the made-up session.
    assert all(v is not None for v in point["scores"]["claude_code"].values())
