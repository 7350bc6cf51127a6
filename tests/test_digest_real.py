"""Digest lines on the real transcripts keep what identifies them (issue 14 finding 5).

Every tool call of every shared transcript's main agent is rendered as a digest
line with the default cut length. Before the fix each argument kept its first 80
characters: long paths lost their file name, and different files gave the same
line (``Read(file_path=".../live/project…")`` for a LiveView and for its test).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import main_transcripts

from mimo_ctx.digest import digest_lines
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import MAIN_AGENT, ToolPart

FILES = [p for p in main_transcripts() if p.suffix == ".jsonl"]
_PATH_KEYS = frozenset({"file_path", "notebook_path", "path"})


@pytest.mark.skipif(not FILES, reason="real transcripts not found (see tests/conftest.py)")
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_path_keeps_its_name_and_different_files_give_different_lines(
    path: Path,
) -> None:
    main = [m for m in load_transcript(path).messages if m.agent == MAIN_AGENT]
    calls = [p for m in main if m.role == "assistant" for p in m.parts if isinstance(p, ToolPart)]
    lines = [line.text for line in digest_lines(main)]
    assert len(lines) >= len(calls)
    by_line: dict[str, set[tuple[str, ...]]] = {}
    tool_lines = [t for t in lines if not t.startswith(("assistant: ", "subtask: "))]
    assert len(tool_lines) == len(calls)
    for call, line in zip(calls, tool_lines, strict=True):
        paths = tuple(
            str(v)
            for k, v in call.state.input.items()
            if k in _PATH_KEYS and isinstance(v, str) and "\n" not in v
        )
        for value in paths:
            name = value.rstrip("/").rsplit("/", 1)[-1]
            if len(name) + 2 <= 80:
                assert name in line, (value, line)
        by_line.setdefault(line, set()).add(paths)
    clashes = {line: found for line, found in by_line.items() if len(found) > 1}
    assert clashes == {}
