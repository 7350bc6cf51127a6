"""Helpers for the ``mimo-ctx`` command tests: running it in-process, the real transcripts.

The real transcripts live outside the repository (``MIMO_CTX_TRANSCRIPTS``, by
default ``../shared/data/transcripts`` next to the repository); the tests that
need them are parametrised over every file there and skip with a clear reason
when the folder is absent.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def transcripts_root() -> Path:
    """Where the real transcripts are expected (they may be absent)."""
    env = os.environ.get("MIMO_CTX_TRANSCRIPTS")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "transcripts"


def every_transcript() -> list[Any]:
    """Every transcript file (sub-agent side files included), as pytest params."""
    root = transcripts_root()
    files = (
        sorted(
            p for p in root.rglob("*") if p.is_file() and p.suffix in {".jsonl", ".traj", ".json"}
        )
        if root.is_dir()
        else []
    )
    if not files:
        return [
            pytest.param(
                None,
                marks=pytest.mark.skip(
                    reason=f"real transcripts not found at {root}; set MIMO_CTX_TRANSCRIPTS "
                    "to the shared/data/transcripts folder to run these tests"
                ),
                id="no-transcripts",
            )
        ]
    return [pytest.param(p, id=p.name) for p in files]


@dataclass(frozen=True)
class Run:
    """What one in-process run of ``mimo-ctx`` produced."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """stdout parsed as exactly one JSON document."""
        return json.loads(self.out)


def run_cli(*argv: str) -> Run:
    """Run ``mimo-ctx argv...`` in-process, capturing stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return Run(code, out.getvalue(), err.getvalue())


def write_chat_transcript(path: Path, *, rounds: int = 30, output_tokens: int = 1000) -> Path:
    """An OpenAI chat transcript: a user request, ``rounds`` tool rounds, a final answer.

    Tool calls and results are separate messages (the provider shape), so a
    watermark that split a pair would break the payload (SPEC R2.6).
    """
    filler = " ".join(f"line{i} value={i * 7 % 13}" for i in range(output_tokens // 4))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {
            "role": "user",
            "content": "Please rename the function frobnicate to tidy across the repo "
            "and keep the old name as a deprecated alias for one release.",
        },
    ]
    for i in range(rounds):
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {i}: reading module {i}.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read", "arguments": json.dumps({"path": f"m{i}.py"})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"{i}: {filler}"})
        if i == rounds // 2:
            messages.append(
                {"role": "user", "content": "Also update the changelog under Unreleased."}
            )
    messages.append({"role": "assistant", "content": "Renamed; alias kept; changelog updated."})
    path.write_text(json.dumps(messages), encoding="utf-8")
    return path
