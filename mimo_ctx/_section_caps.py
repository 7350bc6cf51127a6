"""Section caps of the budgeted reads (R5.10 **beyond**; see :mod:`mimo_ctx.budget`).

Private: :class:`SectionCap`, :data:`SectionCaps`, :func:`heading_matches` and
:func:`checkpoint_section_caps` are public from :mod:`mimo_ctx.budget`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mimo_ctx.config import PushCaps
from mimo_ctx.errors import ConfigError

__all__ = [
    "SectionCap",
    "SectionCaps",
    "cap_list",
    "check_budget",
    "checkpoint_section_caps",
    "heading_matches",
]

# "1. ", "1) ", "1 - ", "1.2 ", "§1 ", "§ 1. " in front of a heading's title.
_NUMBER_PREFIX = re.compile(r"^(?:§\s*)?\d+(?:\.\d+)*\s*[.):\-–—]?(?:\s+|$)")


def check_budget(budget: int, name: str = "budget") -> None:
    """Refuse a budget that is not a non-negative ``int`` (``bool`` is not a number here)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError(f"{name} must be a non-negative number of tokens, got {budget!r}")


def _normalise_heading(text: str) -> str:
    title = text.strip().lstrip("#").strip()
    title = _NUMBER_PREFIX.sub("", title, count=1)
    return " ".join(title.split()).casefold()


def heading_matches(heading: str, key: str) -> bool:
    """Whether a section heading is selected by a cap key.

    Both are compared without leading ``#`` marks and a leading section number
    (``1.``, ``1)``, ``1 -``, ``1.2``, ``§1``), ignoring case and runs of
    whitespace; the key must be the whole title or a prefix of it ending at a
    word boundary. ``"Active intent"`` therefore matches ``## 1. Active intent``,
    ``## §1 Active intent`` and ``## Active intent (verbatim)``, not
    ``## Active intents``.

    Args:
        heading: A heading line (``## 1. Active intent``) or its title.
        key: The cap key.
    """
    title = _normalise_heading(heading)
    wanted = _normalise_heading(key)
    if not wanted or not title.startswith(wanted):
        return False
    return len(title) == len(wanted) or not title[len(wanted)].isalnum()


@dataclass(frozen=True, slots=True)
class SectionCap:
    """A token cap on the bodies of one or more sections (R5.10 **beyond**).

    When ``headings`` names several sections the cap is shared: their bodies are
    filled in document order and each may use what the earlier ones left. The
    skeleton lines of a capped section (heading, italic line, index lines) are
    never cut and do not count against the cap.

    Attributes:
        headings: Keys selecting sections, matched by :func:`heading_matches`.
        tokens: The cap, in tokens (>= 0; 0 drops the bodies).
    """

    headings: tuple[str, ...]
    tokens: int

    def __post_init__(self) -> None:
        check_budget(self.tokens, "SectionCap.tokens")
        if isinstance(self.headings, str) or not self.headings:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigError(
                f"SectionCap.headings must be a non-empty tuple of heading names, "
                f"got {self.headings!r}"
            )
        for key in self.headings:
            if not _normalise_heading(key):
                raise ConfigError(f"SectionCap.headings holds an empty heading name: {key!r}")


SectionCaps = Mapping[str, int] | Sequence[SectionCap]
"""Caps for :func:`read_budgeted_section_aware`: ``{heading key: tokens}`` (one cap per
section) or :class:`SectionCap` objects (which may share a cap between sections).
When a section matches several caps, the first one wins."""


def checkpoint_section_caps(push_caps: PushCaps) -> tuple[SectionCap, ...]:
    """Section caps for ``checkpoint.md`` from the push caps (R5.10, A14).

    ``focus_task`` is one cap shared by §1 Active intent and §2 Next concrete
    action (§1 fills first, §2 gets the rest: the user's quoted request is the
    more valuable of the two); ``design_decisions`` caps §10; ``open_notes`` §11.
    """
    return (
        SectionCap(("Active intent", "Next concrete action"), push_caps.focus_task),
        SectionCap(("Design decisions",), push_caps.design_decisions),
        SectionCap(("Open notes",), push_caps.open_notes),
    )


def cap_list(section_caps: SectionCaps | None) -> list[SectionCap]:
    """``section_caps`` as a list of :class:`SectionCap` (a mapping gives one cap a key)."""
    if section_caps is None:
        return []
    if isinstance(section_caps, Mapping):
        return [SectionCap((key,), tokens) for key, tokens in section_caps.items()]
    caps = list(section_caps)
    for cap in caps:
        if not isinstance(cap, SectionCap):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigError(f"section_caps must hold SectionCap objects, got {cap!r}")
    return caps
