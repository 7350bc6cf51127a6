"""benchmarks/prepare_pg_vs_sqlite.py runs end to end on tiny inputs (issue 11).

No timing is asserted: the test checks the table's shape and that both stores
serve the same window (the same messages and tokens) for the same session.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import prepare_pg_vs_sqlite as bench
from tests.pg_support import DSN_ENV, require_pg_dsn

ROOT = Path(__file__).resolve().parents[2]


def test_sqlite_only_without_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    outcome = bench.run(quick=True)
    assert outcome["name"] == "prepare_pg_vs_sqlite"
    (tab,) = outcome["tables"]
    assert [row[1] for row in tab["rows"]] == ["SQLite", "SQLite"]
    assert any("PostgreSQL not measured" in note for note in outcome["notes"])


def test_unreachable_server_is_a_note_not_a_crash() -> None:
    outcome = bench.run(quick=True, dsn="postgresql://bench:pw@127.0.0.1:1/db")
    assert any(
        "PostgreSQL not measured" in n and "pw" not in n.split("@")[0] for n in outcome["notes"]
    )


def test_both_stores_serve_the_same_window() -> None:
    dsn = require_pg_dsn()
    outcome = bench.run(quick=True, dsn=dsn)
    (tab,) = outcome["tables"]
    assert [row[1] for row in tab["rows"]] == ["SQLite", "PostgreSQL"] * 2
    stores = outcome["data"]["stores"]
    assert stores["SQLite"]["window_messages"] == stores["PostgreSQL"]["window_messages"]
    assert stores["SQLite"]["window_tokens"] == stores["PostgreSQL"]["window_tokens"]
    assert stores["PostgreSQL"]["warm_turn"]["n"] == 5


def test_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/prepare_pg_vs_sqlite.py", "--quick", "--dsn", ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "prepare() with a 60-message live window" in done.stdout
