"""The ``checkpoint.md`` layout (SPEC A14) and helpers to build and parse it.

A checkpoint starts with a ``Topic: <one line>`` line, then eleven level-2
sections, always present (``(none)`` when empty), each with an italic
instruction line under its heading. A section over its budget moves older items
to a spill-over file ``checkpoint-<topic>.md`` beside it and keeps an index line
``- See checkpoint-<topic>.md (N items) - <summary>``, which the section-aware
budgeted read always keeps (SPEC A8).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx.config import PushCaps
from mimo_ctx.errors import CheckpointRejectedError
from mimo_ctx.tokens import estimate_text_tokens

__all__ = [
    "CHECKPOINT_SECTIONS",
    "CheckpointSection",
    "check_draft",
    "checkpoint_defect",
    "fit_items",
    "is_index_line",
    "missing_sections",
    "parse_checkpoint",
    "render_checkpoint",
    "section_budgets",
    "topic_of",
]


@dataclass(frozen=True, slots=True)
class CheckpointSection:
    """One of the eleven checkpoint sections: number, title, default budget, instruction."""

    number: int
    title: str
    budget: int
    instruction: str

    @property
    def heading(self) -> str:
        """The section's level-2 heading line."""
        return f"## {self.number}. {self.title}"


# Titles and budgets are the original's (facts); the instruction lines are ours.
CHECKPOINT_SECTIONS: Final[tuple[CheckpointSection, ...]] = (
    CheckpointSection(1, "Active intent", 500, "_What the user asked for, quoted word for word._"),
    CheckpointSection(
        2, "Next concrete action", 1000, "_The very next step to take when work resumes._"
    ),
    CheckpointSection(
        3, "Directives", 800, "_Standing instructions the user gave in this session._"
    ),
    CheckpointSection(
        4, "Task tree", 1000, "_Task ids with their status icons; sub-tasks indented._"
    ),
    CheckpointSection(5, "Current work", 2000, "_What was being done and concluded last._"),
    CheckpointSection(
        6, "Files and code sections", 1500, "_Files read or changed, and why they matter._"
    ),
    CheckpointSection(
        7, "Discovered knowledge", 2000, "_Facts learned about the code, tools and environment._"
    ),
    CheckpointSection(8, "Errors and fixes", 1500, "_Failures met and how they were resolved._"),
    CheckpointSection(
        9,
        "Live resources",
        1000,
        "_Servers, ports, paths and ids still in use, copied exactly._",
    ),
    CheckpointSection(
        10,
        "Design decisions and discussion outcomes",
        3000,
        "_Choices made and why; outcomes agreed with the user._",
    ),
    CheckpointSection(11, "Open notes", 800, "_Anything else worth keeping._"),
)

_TOPIC = re.compile(r"^Topic:\s*(.+?)\s*$", re.MULTILINE)
_HEADING = re.compile(r"^##\s+(?:§?\d+[.)]?\s+)?(.+?)\s*$")
_INDEX_LINE = re.compile(r"^- See \S+\.md \(\d+")


def section_budgets(push_caps: PushCaps | None = None) -> dict[int, int]:
    """Token budget per section number, with the push caps applied (SPEC R5.10).

    ``design_decisions`` is §10's budget and ``open_notes`` §11's; ``focus_task``
    caps §1 + §2 together: when their A14 budgets add up to more, both shrink in
    proportion.
    """
    caps = push_caps or PushCaps()
    budgets = {s.number: s.budget for s in CHECKPOINT_SECTIONS}
    budgets[10] = caps.design_decisions
    budgets[11] = caps.open_notes
    focus = budgets[1] + budgets[2]
    if focus > caps.focus_task:
        budgets[1] = budgets[1] * caps.focus_task // focus
        budgets[2] = caps.focus_task - budgets[1]
    return budgets


def topic_of(text: str | None) -> str | None:
    """The topic from the first ``Topic: <text>`` line, or ``None`` (SPEC A5)."""
    if not text:
        return None
    match = _TOPIC.search(text)
    return match.group(1) if match else None


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:40] or "notes"


def parse_checkpoint(text: str) -> dict[int, list[str]]:
    """Split a checkpoint into body lines per section number.

    Headings are matched by title (numbered or not); italic instruction lines are
    dropped; ``(none)`` bodies become empty. Unknown sections are ignored.
    """
    by_title = {s.title.lower(): s.number for s in CHECKPOINT_SECTIONS}
    result: dict[int, list[str]] = {}
    current: int | None = None
    seen_italic = False
    for line in text.splitlines():
        if line.startswith("## "):
            match = _HEADING.match(line)
            title = match.group(1).lower() if match else ""
            current = by_title.get(title)
            seen_italic = False
            if current is not None:
                result.setdefault(current, [])
            continue
        if current is None:
            continue
        stripped = line.strip()
        if not seen_italic and len(stripped) > 1 and stripped[0] == stripped[-1] == "_":
            seen_italic = True
            continue
        if stripped == "(none)":
            continue
        result[current].append(line)
    for lines in result.values():
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
    return result


def missing_sections(text: str) -> list[str]:
    """Titles of the A14 sections ``text`` lacks, in section order."""
    parsed = parse_checkpoint(text)
    return [s.title for s in CHECKPOINT_SECTIONS if s.number not in parsed]


_UNREADABLE_SHARE: Final = 0.02
"""Above this share of unreadable characters a draft is taken as garbage, not text."""

# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F (a closed set);
# tab, line feed and carriage return are allowed. A regular expression finds them
# without a Python step per character: drafts and spill-over files are checked on
# the event loop after every writer run, and spill-over files grow with the session.
_CONTROL: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Every unreadable character (U+FFFD, unassigned, private-use, surrogate) is
# outside ASCII: only those are looked up in the Unicode database.
_NON_ASCII: Final = re.compile("[^\x00-\x7f]+")
_UNREADABLE_CATEGORIES: Final = frozenset(("Cn", "Co", "Cs"))


def checkpoint_defect(text: str, *, sections: bool = True) -> str | None:
    """Why ``text`` cannot replace ``checkpoint.md``, or ``None`` when it can (SPEC A14).

    A draft is refused when it is empty; when it holds control characters (NUL
    included; tabs and line ends are fine), which no Markdown checkpoint has and a
    binary or NUL-filled answer always has; when more than 2% of it is unreadable
    (U+FFFD replacement characters, unassigned, private-use or surrogate code
    points: undecoded bytes); and, with ``sections``, when it lacks one of the
    eleven sections, which a checkpoint always has (``(none)`` when empty).
    Linear in ``text``, with a Python step only per non-ASCII character.
    """
    if not text.strip():
        return "it is empty"
    first = _CONTROL.search(text)
    if first is not None:
        count = len(_CONTROL.findall(text))
        return (
            f"it holds {count} control character(s) (U+{ord(first.group()):04X} first, at "
            f"offset {first.start()}): not Markdown text"
        )
    unreadable = (
        0
        if text.isascii()
        else sum(
            1
            for run in _NON_ASCII.findall(text)
            for c in run
            if c == "\ufffd" or unicodedata.category(c) in _UNREADABLE_CATEGORIES
        )
    )
    if unreadable > len(text) * _UNREADABLE_SHARE:
        return (
            f"{unreadable} of its {len(text)} characters are unreadable (replacement, "
            "unassigned or private-use): not text"
        )
    if sections:
        missing = missing_sections(text)
        if missing:
            return "it lacks the sections " + ", ".join(missing)
    return None


def fit_items(
    number: int,
    items: Sequence[str],
    budget: int,
    *,
    limit: int | None = None,
    head: Sequence[str] = (),
    keep: Collection[int] = (),
) -> tuple[list[str], tuple[str, str] | None]:
    """Fit a section's items into ``budget`` tokens and ``limit`` items (SPEC A14).

    ``head`` lines always stay first. Items are taken newest (last) first, those
    whose index is in ``keep`` before the others; the rest move to the spill-over
    file ``checkpoint-<section>.md`` and an index line ``- See <file> (N items) -
    <summary>`` takes their place, so the kept items and that line stay within the
    budget.

    Returns:
        The section's lines and, when something moved, ``(file name, content)``.
    """
    cap = len(items) if limit is None else limit
    cost = sum(estimate_text_tokens(h) + 1 for h in head)
    if len(items) <= cap and cost + sum(estimate_text_tokens(i) + 1 for i in items) <= budget:
        return [*head, *items], None
    section = next(s for s in CHECKPOINT_SECTIONS if s.number == number)
    name = f"checkpoint-{_slug(section.title)}.md"

    def index_line(moved: Sequence[str]) -> str:
        first = " ".join(moved[0].lstrip("-*✓ ").split()) if moved else ""
        summary = first[:60] + ("…" if len(first) > 60 else "")
        return f"- See {name} ({len(moved)} items) - older {section.title.lower()}: {summary}"

    # Room for the longest index line this call can write.
    cost += estimate_text_tokens(index_line(["x" * 61] * len(items))) + 1
    wanted = set(keep)
    order = [i for i in reversed(range(len(items))) if i in wanted]
    order += [i for i in reversed(range(len(items))) if i not in wanted]
    chosen: set[int] = set()
    for index in order:
        price = estimate_text_tokens(items[index]) + 1
        if len(chosen) < cap and cost + price <= budget:
            chosen.add(index)
            cost += price
    moved = [items[i] for i in range(len(items)) if i not in chosen]
    kept = [items[i] for i in range(len(items)) if i in chosen]
    index = index_line(moved)
    content = f"# {section.title} (moved from checkpoint.md)\n\n" + "\n".join(moved) + "\n"
    return [*head, index, *kept], (name, content)


def render_checkpoint(topic: str, bodies: Mapping[int, Sequence[str]]) -> str:
    """Render a checkpoint in the A14 layout: Topic line, then the eleven sections."""
    topic_line = " ".join(topic.split()) or "(unknown)"
    out = [f"Topic: {topic_line}", ""]
    for section in CHECKPOINT_SECTIONS:
        out.append(section.heading)
        out.append(section.instruction)
        lines = [line for line in bodies.get(section.number, ()) if line.strip()]
        out.extend(lines or ["(none)"])
        out.append("")
    return "\n".join(out)


def is_index_line(line: str) -> bool:
    """True for a spill-over index line ``- See x.md (N items) ...``."""
    return bool(_INDEX_LINE.match(line))


_EXTRA_FILE = re.compile(r"^checkpoint-[A-Za-z0-9._-]+\.md$")
"""The name a spill-over file must have."""


def check_draft(text: str, extra_files: Mapping[str, str]) -> None:
    """Refuse a writer's draft that would replace a good checkpoint with garbage (SPEC A14).

    ``text`` is the checkpoint, ``extra_files`` its spill-over files by name.

    Raises:
        CheckpointRejectedError: Empty, not text (control or unreadable characters), missing
            a section, or a spill-over file with a bad name or garbage content.
    """
    if not text.strip():
        raise CheckpointRejectedError("the checkpoint writer returned an empty checkpoint")
    defect = checkpoint_defect(text)
    if defect is not None:
        raise CheckpointRejectedError(f"rejected the writer's checkpoint: {defect}")
    for name, content in extra_files.items():
        if not _EXTRA_FILE.match(name):
            raise CheckpointRejectedError(
                f"the checkpoint writer named a spill-over file {name!r}; "
                "expected checkpoint-<topic>.md"
            )
        defect = checkpoint_defect(content, sections=False)
        if defect is not None:
            raise CheckpointRejectedError(f"rejected the writer's spill-over file {name}: {defect}")
