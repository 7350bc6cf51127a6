"""The declared dependency floors cover the APIs the package uses.

The SQLite worker hands each result back with ``anyio.lowlevel.current_token()`` and
the backend's ``run_sync_soon`` (anyio 4.16). With an older anyio the hand-back fails on
the worker thread and the caller would wait forever, so the floor in pyproject.toml
must not drop below the version that has both.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import anyio.lowlevel
from anyio.abc import AsyncBackend

_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _floor(name: str) -> tuple[int, ...]:
    project = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        match = re.fullmatch(rf"{re.escape(name)}\s*>=\s*([0-9.]+)", requirement)
        if match:
            return tuple(int(part) for part in match.group(1).split("."))
    raise AssertionError(f"no '{name}>=' requirement in {_PYPROJECT}")


def test_anyio_floor_has_event_loop_tokens_with_run_sync_soon() -> None:
    assert _floor("anyio") >= (4, 16)
    # What the worker calls exists in the installed anyio (the floor's promise).
    assert hasattr(anyio.lowlevel, "EventLoopToken")  # added in 4.11
    assert hasattr(AsyncBackend, "run_sync_soon")  # added in 4.16
