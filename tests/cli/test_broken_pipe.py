"""``mimo-ctx demo | head`` exits 141, as a process killed by SIGPIPE does (issue 17
item 20): rich answered the closed pipe with ``SystemExit(1)``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli.conftest import REPO_ROOT


@pytest.mark.parametrize("mode", [[], ["--plain"], ["--json"]], ids=["rich", "plain", "json"])
def test_a_reader_that_goes_away_gives_141_and_no_noise(mode: list[str]) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "mimo_ctx", "demo", *mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()  # `| head -0`: the reader is gone before anything is written
    with process.stderr:
        err = process.stderr.read()
    assert process.wait(timeout=120) == 141
    assert err == b""


def test_head_on_the_rich_output() -> None:
    done = subprocess.run(
        f"{sys.executable} -m mimo_ctx demo | head -3; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 141)  # 0 only when it all fitted the pipe first
    assert done.stderr == b""
    assert done.stdout.strip()
