"""Small helpers several modules share: the clock, one-line text, relative ages, the version.

Private: nothing here is part of the public API. Each helper is pure except
:func:`now_ms` (the wall clock) and :func:`package_version` (installed metadata);
the pure modules may use them. The async helpers are in :mod:`mimo_ctx._aio`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TypeVar

_T = TypeVar("_T")

__all__ = ["ago", "follow_copy", "now_ms", "one_line", "package_version"]

_DISTRIBUTION = "mimo-ctx"


def now_ms() -> int:
    """The wall clock in Unix milliseconds (the unit of every stored time)."""
    return time.time_ns() // 1_000_000


def follow_copy(mine: list[_T], known: int, new: Sequence[_T]) -> tuple[int, bool]:
    """Compare a list a caller sends again and again (append-mostly) with one's own copy.

    ``mine[:known]`` is the copy of the last list (entries after ``known`` are left by a
    call that failed, and dropped). Returns how many leading items of ``new`` are those
    (the same objects, or equal), and whether ``mine`` now is a copy of all of ``new``.
    A list that only grew costs O(new items): the copy is extended in place and compared
    with ``new`` as lists of one length, identities first, touching no item; no copy of
    the whole list is made. Otherwise ``mine`` is left as the old copy.
    """
    del mine[known:]
    if isinstance(new, list) and known <= len(new):
        mine.extend(new[known:])
        if mine == new:
            return known, True
        del mine[known:]
    count = 0
    for a, b in zip(new, mine, strict=False):
        if a is not b and a != b:
            break
        count += 1
    return count, False


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
