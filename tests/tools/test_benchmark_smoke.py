"""The memory-search benchmark runs (tiny) so it cannot rot (issue 8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_search.py"


def test_memory_search_benchmark_smoke() -> None:
    """``--files 50 --mb 0.2`` builds, reconciles and searches, and prints every row."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--files", "50", "--mb", "0.2", "--queries", "8"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "files / bytes               | 50 / 0.2 MB" in out
    assert "ReconcileStats(added=50, updated=0, removed=0, unchanged=0, skipped=0)" in out
    assert "ReconcileStats(added=0, updated=0, removed=0, unchanged=50, skipped=0)" in out
    assert "ReconcileStats(added=0, updated=10, removed=0, unchanged=40, skipped=0)" in out
    for row in ("search: rare word", "search: FTS syntax", "paths() (keys index)", "index size"):
        assert row in out


def test_memory_search_benchmark_rejects_bad_sizes() -> None:
    """Nonsense sizes are refused with a usage error, not a traceback."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--files", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "need --files >= 1" in done.stderr
    assert "Traceback" not in done.stderr
