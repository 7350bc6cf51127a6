"""The runnable examples (issue 6 item 6): each runs offline and prints what it shows.

Each example is executed as a script with the test interpreter, the way a user
runs it. (Examples of other integrations get their own test files.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # Proxies pointing nowhere: an example that tried the network would fail.
    env.update({"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"})
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )


def test_agent_loop_example_rebuilds_and_finishes() -> None:
    """The plain loop: writers start (A3), the trigger fires (R1.2), the agent finishes."""
    done = run_example("agent_loop.py")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert "checkpoint writer started" in out
    assert "checkpoint.md written" in out
    rebuilt = re.findall(r"context rebuilt \(rebuilt\), ([\d,]+) -> ([\d,]+) tokens", out)
    assert len(rebuilt) == 1, out
    before, after = (int(x.replace(",", "")) for x in rebuilt[0])
    assert before >= 36_000  # the trigger line: 90% of 40,000
    assert after < before / 10
    assert out.rstrip().endswith(
        "final answer after 31 requests: Modules 03, 11 and 27 still use the old API."
    )
