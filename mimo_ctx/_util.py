"""Small helpers several modules share: the clock, one-line text, escapes, ages, the version.

Private: nothing here is part of the public API. Each helper is pure except
:func:`now_ms` (the wall clock) and :func:`package_version` (installed metadata);
the pure modules may use them. The async helpers are in :mod:`mimo_ctx._aio`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Final, TypeVar

_T = TypeVar("_T")

__all__ = [
    "HTML_HEADING_TAG",
    "ago",
    "escape_html_headings",
    "escape_path",
    "follow_copy",
    "now_ms",
    "one_line",
    "package_version",
]

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


HTML_HEADING_TAG: Final = re.compile(r"<(?=h[12](?:[\s>/]|$))", re.I)
"""The ``<`` of an HTML level-1 or level-2 heading's opening tag."""
# Every line break str.splitlines() knows.
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def escape_html_headings(line: str) -> str:
    """``line`` with the ``<`` of every ``<h1>`` and ``<h2>`` tag written as ``&lt;``.

    The rebuild body's structure has two levels: an HTML heading of either level
    could fake it (its title may even sit on the next line), so none is left to be
    read as one. Code blocks included: a Markdown reader lets an HTML block run
    over a code fence where the body's rules would not (an HTML sample reads fine
    as ``&lt;h1>``). An entity, not a backslash: inside an HTML block Markdown
    passes a backslash through.
    """
    return HTML_HEADING_TAG.sub("&lt;", line) if "<" in line else line


def escape_path(path: str) -> str:
    """``path`` as the rebuild body writes it: line breaks as escapes, HTML headings defused.

    A path keeps every other character, so it can still be searched for; a line
    break in it (``\\n``, U+2028...) is written as its escape and the ``<`` of an
    ``<h1>`` or ``<h2>`` tag as ``&lt;`` (:func:`escape_html_headings`), so no path
    starts a line or a heading.
    """
    return escape_html_headings(_LINE_BREAKS.sub(lambda m: ascii(m.group(0))[1:-1], path))


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
