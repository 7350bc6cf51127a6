"""Small helpers several modules share: the clock, one-line text, ages, shielding, the version.

Private: nothing here is part of the public API. Each helper is pure except
:func:`now_ms` (the wall clock), :func:`shielded` (an await) and
:func:`package_version` (installed metadata).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from importlib.metadata import PackageNotFoundError, version
from typing import TypeVar

import anyio

__all__ = ["ago", "now_ms", "one_line", "package_version", "shielded"]

_T = TypeVar("_T")

_DISTRIBUTION = "mimo-ctx"


def now_ms() -> int:
    """The wall clock in Unix milliseconds (the unit of every stored time)."""
    return time.time_ns() // 1_000_000


def one_line(text: str) -> str:
    """``text`` with every run of whitespace, line breaks included, as one space, stripped."""
    # str.split() splits on every Unicode line break too, so the result is one line.
    return " ".join(text.split())


def ago(delta_ms: int) -> str:
    """An age in its largest whole unit: ``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``.

    A negative ``delta_ms`` (a clock that stepped back) reads ``0s ago``.
    """
    seconds = max(0, delta_ms) // 1000
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def package_version() -> str:
    """The installed distribution's version (``pyproject.toml`` is the one source).

    ``0+unknown`` when the package runs from a tree that was never installed.
    """
    try:
        return version(_DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"


async def shielded(work: Awaitable[_T]) -> _T:
    """Await ``work`` shielded from cancellation; a cancelled caller is cancelled afterwards.

    For steps that must not be cut in half: a transaction's commit, opening a file
    whose handle would otherwise be dropped unclosed.
    """
    done: list[_T] = []
    with anyio.CancelScope(shield=True):
        done.append(await work)
    return done[0]
