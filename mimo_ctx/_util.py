"""Small helpers several modules share: the clock, one-line text, relative ages, the version.

Private: nothing here is part of the public API. Each helper is pure except
:func:`now_ms` (the wall clock) and :func:`package_version` (installed metadata);
the pure modules may use them. The async helpers are in :mod:`mimo_ctx._aio`.
"""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError, version

__all__ = ["ago", "now_ms", "one_line", "package_version"]

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
