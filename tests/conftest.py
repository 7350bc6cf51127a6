"""Shared fixtures: the real transcripts of ``../shared/data/transcripts``.

They live outside the repository (``MIMO_CTX_TRANSCRIPTS`` overrides the path);
tests that need them skip with a clear reason when the folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Machines here are shared and noisy: no per-example deadline (timing is measured by the
# benchmarks, never asserted by tests). In CI the examples are derived from each test's
# name, so a run is reproducible; locally they stay random and explore more.
settings.register_profile("mimo", deadline=None, print_blob=True)
settings.register_profile("ci", parent=settings.get_profile("mimo"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "mimo")

REPO_ROOT = Path(__file__).resolve().parents[1]


def transcripts_path() -> Path:
    """Where the real transcripts are expected (they may be absent)."""
    env = os.environ.get("MIMO_CTX_TRANSCRIPTS")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "data" / "transcripts"


def main_transcripts() -> list[Path]:
    """Every transcript file except sub-agent side files (loaded with their main file)."""
    root = transcripts_path()
    if not root.is_dir():
        return []
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in {".jsonl", ".traj"})
    return [p for p in files if "_subagents_" not in p.name]


@pytest.fixture(scope="session")
def transcripts_dir() -> Path:
    """The real transcripts folder; skips the test when it is not there."""
    path = transcripts_path()
    if not path.is_dir():
        pytest.skip(
            f"real transcripts not found at {path}; set MIMO_CTX_TRANSCRIPTS to the "
            "shared/data/transcripts folder to run these tests"
        )
    return path
