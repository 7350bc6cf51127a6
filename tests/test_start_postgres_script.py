"""scripts/start_postgres.sh: the loopback test server CI starts (issue 11).

The install path cannot run here (it would need a machine without PostgreSQL),
so its building blocks are checked: the script parses, and ``find_bin`` picks
the newest major version that has the *server* programs (a newer version with
only the client tools installed is passed over).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "start_postgres.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _bash(command: str, *, lib: Path) -> str:
    done = subprocess.run(
        ["bash", "-c", f'source "{SCRIPT}"; {command}'],
        env={"PATH": "/usr/bin:/bin", "MIMO_CTX_PG_LIB": str(lib)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


def _version(lib: Path, major: str, programs: list[str]) -> Path:
    bin_dir = lib / major / "bin"
    bin_dir.mkdir(parents=True)
    for name in programs:
        path = bin_dir / name
        path.write_text("#!/bin/sh\n", encoding="utf-8")
        path.chmod(0o755)
    return bin_dir


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=60)


def test_find_bin_picks_the_newest_version_with_the_server(tmp_path: Path) -> None:
    server = ["initdb", "pg_ctl", "postgres", "psql", "pg_isready"]
    _version(tmp_path, "9.6", server)
    expected = _version(tmp_path, "15", server)
    _version(tmp_path, "16", ["psql", "pg_isready"])  # client tools only
    assert _bash("find_bin", lib=tmp_path) == str(expected)
    assert _bash(f'major_of "{expected}"', lib=tmp_path) == "15"


def test_find_bin_is_empty_without_a_server(tmp_path: Path) -> None:
    _version(tmp_path, "16", ["psql", "pg_isready"])
    (tmp_path / "17" / "bin").mkdir(parents=True)
    (tmp_path / "17" / "bin" / "initdb").write_text("not executable", encoding="utf-8")
    assert _bash("find_bin", lib=tmp_path) == ""
    assert _bash("find_bin", lib=tmp_path / "absent") == ""


def test_sourcing_starts_nothing(tmp_path: Path) -> None:
    """Sourcing only defines functions: no install, no server, nothing printed."""
    assert _bash("true", lib=tmp_path) == ""
