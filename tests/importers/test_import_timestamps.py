"""Bad timestamps are a bad line, with its number (issue 17 item 18).

Python's JSON reader accepts ``NaN`` and ``Infinity``; such a timestamp used to
raise a raw ``ValueError`` that failed the whole file, even in lenient mode, and
named no line. ``--lenient`` now also reads a live transcript whose last line is
still being written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo_ctx.errors import TranscriptError
from mimo_ctx.importers import load_transcript
from tests.cli.conftest import run_cli
from tests.importers.builders import assistant, user

BAD_TIMES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    1e300,
    10**20,
    -5,
    "yesterday",
    True,
    "9999-12-31T23:59:59-14:00",
]


def _lines(bad: object) -> list[str]:
    records = [
        user("u1", None, 0, "Fix the bug."),
        assistant(
            "a1",
            "u1",
            1,
            [{"type": "text", "text": "Looking."}],
            msg_id="m1",
            stop_reason="end_turn",
        ),
        user("u2", "a1", 2, "Thanks."),
        assistant(
            "a2", "u2", 3, [{"type": "text", "text": "Done."}], msg_id="m2", stop_reason="end_turn"
        ),
    ]
    records[2]["timestamp"] = bad
    return [json.dumps(r) for r in records]


@pytest.mark.parametrize("bad", BAD_TIMES, ids=repr)
def test_strict_names_the_line(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(_lines(bad)) + "\n")
    with pytest.raises(TranscriptError) as caught:
        load_transcript(path)
    assert caught.value.line == 3
    assert f"{path}:3: timestamp" in str(caught.value)


@pytest.mark.parametrize("bad", BAD_TIMES, ids=repr)
def test_lenient_skips_only_that_line(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(_lines(bad)) + "\n")
    transcript = load_transcript(path, strict=False)
    assert [s.line for s in transcript.skipped] == [3]
    assert "timestamp" in transcript.skipped[0].reason
    assert [m.role for m in transcript.messages] == ["user", "assistant", "assistant"]


def test_the_cli_reads_a_live_transcript_with_lenient(tmp_path: Path) -> None:
    lines = _lines("2026-01-01T00:00:02.000Z")
    path = tmp_path / "live.jsonl"
    # The agent is still writing its last line.
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])
    for command in ("inspect", "replay"):
        strict = run_cli(command, str(path), "--window", "200K", "--json")
        assert strict.code == 2
        assert f"{path}:4:" in strict.err
        assert "--lenient" in strict.err
        lenient = run_cli(command, str(path), "--window", "200K", "--json", "--lenient")
        assert lenient.code == 0, lenient.err
        assert lenient.json()  # stdout is still one JSON document
        assert lenient.err.startswith(f"{path}:4: skipped: ")
        assert lenient.err.count("\n") == 1
