"""A test's worker in an OS process of its own, spoken to in JSON lines.

The multi-worker tests run each worker as ``python <script> <args...>``: the
script prints ``{"ready": true}`` once set up, then answers each JSON request
line on its stdin with one JSON line, ``{"error": "..."}`` when it failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["WorkerProcess"]

REPO = Path(__file__).resolve().parents[1]


class WorkerProcess:
    """One worker process (see the module docs).

    Args:
        script: The worker script.
        args: Its arguments.
    """

    def __init__(self, script: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert json.loads(self._read()) == {"ready": True}

    def _read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the worker process died"
        return line

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its answer (the test fails on an error answer)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._read())
        assert "error" not in answer, answer
        return answer

    def close(self) -> None:
        """End the worker (its stdin closed) and wait for it."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.process.stdout.close()
