"""Budgeted reads of memory files through a small LRU of earlier results (rebuild bodies).

Private to :mod:`mimo_ctx.render`: pure (no I/O), with one module-level cache,
used from the event loop and from the worker thread that reads a rebuild's files
(it budgets them there, next to the read): its bookkeeping is under a lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from mimo_ctx._structure import render_section
from mimo_ctx.budget import SectionCap, read_budgeted, read_budgeted_section_aware
from mimo_ctx.tokens import TokenCounter

__all__ = [
    "CACHE_CHARS",
    "CACHE_ENTRIES",
    "BudgetedRead",
    "budgeted",
    "cached_entries",
]


@dataclass(frozen=True, slots=True)
class BudgetedRead:
    """One budgeted read the cache holds.

    Attributes:
        text: The text it was computed from.
        path: The file it was read from.
        counter: The counter it was computed with.
        output: The budgeted text.
        sections: The section rendered from ``output``, per heading (filled by
            :meth:`section`; ``render_section`` is pure).
    """

    text: str
    path: str
    counter: TokenCounter | None
    output: str
    sections: dict[str, str] = field(default_factory=dict[str, str])

    def section(self, heading: str) -> str:
        """The file-backed section of :attr:`output`: ``render_section`` of it under
        ``heading`` with its ``File:`` line (the read's path), ``""`` when it is blank.

        Kept with the read: a file unchanged since the last rebuild (the memory
        reads hand back the same text while its size, times and inode stay) costs
        a look-up, not a budgeted read and a neutralising pass.
        """
        section = self.sections.get(heading)
        if section is None:
            body = self.output
            section = render_section(heading, body, file_path=self.path) if body.strip() else ""
            self.sections[heading] = section
        return section


CACHE_ENTRIES: Final = 32
"""Results the cache keeps at the most."""
CACHE_CHARS: Final = 24_000_000
"""Characters of source text the cache keeps alive at the most."""
_cache: OrderedDict[tuple[str, int, bool, tuple[SectionCap, ...] | None, int], BudgetedRead] = (
    OrderedDict()
)
# Look-ups and updates only; a read is computed outside it (two threads missing
# the same entry both compute it, and the later one's equal result stays).
_lock = threading.Lock()


def budgeted(
    text: str,
    cap: int,
    path: str,
    counter: TokenCounter | None,
    *,
    section_aware: bool,
    section_caps: tuple[SectionCap, ...] | None,
) -> BudgetedRead:
    """``read_budgeted[_section_aware]`` through a small LRU of earlier results.

    Budgeting a 1 MB memory file parses it line by line; project and global
    ``MEMORY.md`` rarely change between rebuilds (and are shared by every session
    of a project), so the result is reused while the text is the same. The entry
    holds the text it was computed from and is used only on an exact match (same
    counter object too), so a cache hit returns exactly what a fresh call would
    (its ``output``).
    """
    key = (path, cap, section_aware, section_caps, id(counter))
    with _lock:
        entry = _cache.get(key)
        if entry is not None and entry.counter is counter and entry.text == text:
            _cache.move_to_end(key)
            return entry
    if section_aware:
        output = read_budgeted_section_aware(
            text, cap, path=path, counter=counter, section_caps=section_caps
        )
    else:
        output = read_budgeted(text, cap, path=path, counter=counter)
    entry = BudgetedRead(text, path, counter, output)
    with _lock:
        _cache[key] = entry
        _cache.move_to_end(key)
        # Bounded memory: at most so many entries and so many characters of source
        # text (an entry keeps its text alive; entries of one rebuild usually share it).
        held = sum(len(e.text) for e in _cache.values())
        while len(_cache) > 1 and (len(_cache) > CACHE_ENTRIES or held > CACHE_CHARS):
            _, dropped = _cache.popitem(last=False)
            held -= len(dropped.text)
    return entry


def cached_entries() -> int:
    """How many results the cache holds now."""
    with _lock:
        return len(_cache)
