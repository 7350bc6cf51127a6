"""Fixtures for the importer tests.

The real transcripts live outside the repository (``../shared/data/transcripts``
relative to the repo root, or wherever ``MIMO_CTX_TRANSCRIPTS`` points); tests
that need them are skipped with a clear reason when the folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["REPO_ROOT", "transcripts_path"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def transcripts_path() -> Path:
    """Where the real transcripts are expected (they may be absent)."""
    env = os.environ.get("MIMO_CTX_TRANSCRIPTS")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "data" / "transcripts"


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
