"""Budgeted reads of memory files (SPEC R6, A8).

Two pure functions cut a file's text to a token budget before it is injected
into the rebuild body:

* :func:`read_budgeted` (``notes.md``) keeps a proportional head of the file, cut
  back to a line boundary, and appends a notice giving the budget, the file's
  size and the character offset to continue reading from.
* :func:`read_budgeted_section_aware` (``checkpoint.md`` and both ``MEMORY.md``)
  first keeps the file's *skeleton* -- its preamble, every level-2 heading, each
  section's italic description line and its ``- See x.md (N ...`` index lines --
  and then fills section bodies, in document order, from what is left.

Exact rules (our choices where the SPEC is silent):

* Offsets and lengths are Python ``str`` indices (code points), so a cut never
  splits a character; token counts come from the given
  :class:`~mimo_ctx.tokens.TokenCounter` (default: the chars/4 estimate).
* Proportional cuts use exact integer arithmetic:
  ``floor(length * allowance * 95 / (tokens * 100))``.
* "Back to a line boundary" keeps the longest prefix of at most that many
  characters that ends at the end of a line; when there is no such prefix (no
  newline after the first character) the cut is made at the point itself.
* Fenced code blocks (three or more backticks or tildes, CommonMark rules) are
  respected: a ``## `` line inside a fence is not a heading, and a cut that ends
  inside a fence closes it, so the notice and whatever follows in the rebuild
  body are never swallowed by an open code block.
* The notice is separated from the kept text by one blank line. The guarantee
  (Hypothesis-tested) is ``tokens(output) <= budget + tokens(notice line)``:
  the blank line is charged to the budget. For a counter that is not linear in
  the text (a real tokenizer), the proportional cut is re-applied until the
  guarantee holds.
* **beyond** (A8): the whole skeleton is reserved before any body is filled,
  so sections after a cut cannot push the output over the budget.
* A text without any level-2 heading has no structure to keep and is read with
  :func:`read_budgeted` (treating it all as "preamble" would let a heading-less
  file bypass its budget).
* ``section_caps`` (R5.10 **beyond**) cap individual section bodies, see
  :class:`SectionCap` and :func:`checkpoint_section_caps`. Caps apply even when
  the whole file fits the budget: a capped-out body is cut within its cap the
  same way a body is cut within the budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from mimo_ctx.config import PushCaps
from mimo_ctx.errors import ConfigError
from mimo_ctx.tokens import TokenCounter, estimate_text_tokens

__all__ = [
    "CUT_THRESHOLD_TOKENS",
    "SectionCap",
    "SectionCaps",
    "checkpoint_section_caps",
    "heading_matches",
    "read_budgeted",
    "read_budgeted_section_aware",
    "scan_fences",
]

CUT_THRESHOLD_TOKENS: Final = 50
"""A body that does not fit is cut only when more than this many tokens remain (R6.2)."""

_HEADING_PREFIX: Final = "## "
_INDEX_LINE = re.compile(r"^- See \S+\.md \(\d+")
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_FENCE_CLOSE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*\r?$")
# "1. ", "1) ", "1 - ", "1.2 ", "§1 ", "§ 1. " in front of a heading's title.
_NUMBER_PREFIX = re.compile(r"^(?:§\s*)?\d+(?:\.\d+)*\s*[.):\-–—]?(?:\s+|$)")
# Characters str.splitlines() breaks on: a path containing one must not start a line.
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


# -- shared helpers ------------------------------------------------------------


def scan_fences(lines: Sequence[str]) -> tuple[list[bool], str | None]:
    """Find the lines of fenced code blocks (CommonMark rules, simplified).

    A fence opens on a line of three or more backticks or tildes indented by at
    most three spaces (a backtick fence's info string may not contain a backtick)
    and closes on a line of the same character, at least as long, with nothing
    after it but spaces.

    Args:
        lines: The lines of a text, without their ``\\n``.

    Returns:
        Per line, whether it belongs to a fenced block (the fence lines
        included), and the closing fence a still-open block needs at the end
        (``None`` when every block is closed).
    """
    mask: list[bool] = []
    open_char = ""
    open_len = 0
    for line in lines:
        if not open_char:
            match = _FENCE_OPEN.match(line)
            if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
                open_char, open_len = match.group(1)[0], len(match.group(1))
                mask.append(True)
            else:
                mask.append(False)
            continue
        mask.append(True)
        match = _FENCE_CLOSE.match(line)
        if match and match.group(1)[0] == open_char and len(match.group(1)) >= open_len:
            open_char = ""
    return mask, (open_char * open_len if open_char else None)


def _counter_fn(counter: TokenCounter | None) -> Callable[[str], int]:
    return estimate_text_tokens if counter is None else counter.count


def _check_budget(budget: int, name: str = "budget") -> None:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError(f"{name} must be a non-negative number of tokens, got {budget!r}")


def _printable_path(path: str) -> str:
    # A path is shown inside a notice line; a line break in it must not start a
    # new line of the rebuild body.
    return _LINE_BREAKS.sub(lambda m: ascii(m.group(0))[1:-1], path)


def _proportional(length: int, allowance: int, tokens: int) -> int:
    """``floor(length * allowance / tokens * 0.95)`` without float rounding."""
    if tokens <= 0:
        return length
    return (length * allowance * 95) // (tokens * 100)


def _finish(content: str, notice: str) -> str:
    kept = content.rstrip()
    return f"{kept}\n\n{notice}" if kept else notice


def _close_fence(text: str) -> str:
    _, closer = scan_fences(text.split("\n"))
    return f"{text}\n{closer}" if closer else text


# -- read_budgeted ---------------------------------------------------------------


def _cut_at_line(text: str, target: int) -> tuple[str, int]:
    """Cut ``text`` to at most ``target`` characters, back to a line end.

    Returns:
        The kept head and the offset of the first character not shown (the start
        of the next line when the cut is at a newline).
    """
    target = max(0, min(target, len(text)))
    if target == 0:
        return "", 0
    newline = text.rfind("\n", 0, target + 1)
    if newline > 0:
        return text[:newline], newline + 1
    return text[:target], target


def read_budgeted(text: str, budget: int, *, path: str, counter: TokenCounter | None = None) -> str:
    """Return ``text`` cut to ``budget`` tokens, with a notice saying where to resume (R6.1).

    A text whose tokens are at most ``budget`` is returned unchanged (an empty
    text gives ``""``). Otherwise the head of ``floor(len * budget/total * 0.95)``
    characters is kept, back to the last line end (or at the point itself when the
    head holds no newline), a fence left open by the cut is closed, and a blank
    line and a notice follow, giving the budget, the file's total token estimate,
    the character offset to continue reading from and the path. With a budget
    of 0 the output is the notice alone.

    Args:
        text: The file's content.
        budget: The section's token budget (>= 0).
        path: The file's path, named in the notice.
        counter: Token counter; defaults to the chars/4 estimate.

    Returns:
        The text, or its head plus the notice; ``tokens(output) <= budget +
        tokens(notice)``.

    Raises:
        ConfigError: ``budget`` is negative or not an integer.
    """
    _check_budget(budget)
    count = _counter_fn(counter)
    total = count(text)
    if total <= budget:
        return text
    target = _proportional(len(text), budget, total)
    while True:
        head, offset = _cut_at_line(text, target)
        notice = (
            f"[{_printable_path(path)} was cut to fit its {budget}-token budget: the whole "
            f"file is about {total} tokens. Continue reading at character offset {offset}.]"
        )
        output = _finish(_close_fence(head), notice)
        if not head.strip() or count(output) - count(notice) <= budget:
            return output
        # A non-linear counter (a real tokenizer) can still be over: shrink again.
        target = len(head) * 9 // 10


# -- section caps ---------------------------------------------------------------------


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
        _check_budget(self.tokens, "SectionCap.tokens")
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


def _cap_list(section_caps: SectionCaps | None) -> list[SectionCap]:
    if section_caps is None:
        return []
    if isinstance(section_caps, Mapping):
        return [SectionCap((key,), tokens) for key, tokens in section_caps.items()]
    caps = list(section_caps)
    for cap in caps:
        if not isinstance(cap, SectionCap):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigError(f"section_caps must hold SectionCap objects, got {cap!r}")
    return caps


# -- read_budgeted_section_aware ------------------------------------------------------


@dataclass(slots=True)
class _Section:
    heading: str
    lines: list[str]
    skeleton: list[bool]
    body: list[str] = field(default_factory=list[str])
    # The skeleton lines with, for each, how many body lines precede it.
    skeleton_at: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])
    # Whether any line could open a fence: if not, no emitted text needs closing.
    fence_chars: bool = True


def _is_italic(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) > 1 and stripped[0] == "_" and stripped[-1] == "_"


def _has_fence_chars(text: str) -> bool:
    # A fence (open or close) is a run of three backticks or tildes; a text without
    # either has no fenced line, whatever its indentation.
    return "```" in text or "~~~" in text


def _make_section(lines: list[str], fenced: list[bool] | None, start: int) -> _Section:
    """The section whose heading is ``lines[0]`` (``fenced`` indexed from ``start``)."""
    skeleton = [False] * len(lines)
    skeleton[0] = True
    for j in range(1, len(lines)):
        if (fenced is None or not fenced[start + j]) and _is_italic(lines[j]):
            skeleton[j] = True
            break
    for j, line in enumerate(lines):
        # ``startswith`` is a cheap exact pre-filter for the anchored pattern.
        if (
            j
            and line.startswith("- See ")
            and (fenced is None or not fenced[start + j])
            and _INDEX_LINE.match(line)
        ):
            skeleton[j] = True
    body: list[str] = []
    skeleton_at: list[tuple[int, str]] = []
    for line, skel in zip(lines, skeleton, strict=True):
        if skel:
            skeleton_at.append((len(body), line))
        else:
            body.append(line)
    return _Section(
        lines[0].rstrip("\r"),
        lines,
        skeleton,
        body,
        skeleton_at,
        fenced is not None and _has_fence_chars("\n".join(lines)),
    )


def _parse(text: str) -> tuple[list[str], list[_Section]]:
    lines = text.split("\n")
    fenced: list[bool] | None = None
    if _has_fence_chars(text):
        fenced, _ = scan_fences(lines)
    if fenced is None:
        heads = [i for i, line in enumerate(lines) if line.startswith(_HEADING_PREFIX)]
    else:
        heads = [
            i for i, line in enumerate(lines) if not fenced[i] and line.startswith(_HEADING_PREFIX)
        ]
    if not heads:
        return lines, []
    preamble = lines[: heads[0]]
    ends = [*heads[1:], len(lines)]
    sections = [
        _make_section(lines[start:end], fenced, start)
        for start, end in zip(heads, ends, strict=True)
    ]
    return preamble, sections


def _cut_lines(lines: list[str], target: int) -> list[str]:
    """The longest line-aligned prefix of ``lines`` within ``target`` characters."""
    head, _ = _cut_at_line("\n".join(lines), target)
    return head.split("\n") if head else []


def _shrink(lines: list[str], target: int, fits: Callable[[list[str]], bool]) -> list[str]:
    """Cut ``lines`` to ``target`` characters, then further until ``fits`` holds."""
    kept = _cut_lines(lines, target)
    while kept and not fits(kept):
        kept = _cut_lines(kept, len("\n".join(kept)) * 9 // 10)
    return kept


def _emit(section: _Section, kept: list[str]) -> str:
    """A section's text: skeleton lines plus the kept prefix of its body, in order.

    Body line ``i`` (in document order) is replaced by ``kept[i]``; body lines past
    the end of ``kept`` are left out; every skeleton line stays in its place.
    ``kept`` is a prefix of ``section.body`` whose last line may be cut short (what
    :func:`_shrink` returns), so it holds fence characters only if the section does.
    """
    shown = min(len(kept), len(section.body))
    out: list[str] = []
    taken = 0
    after_body = -1
    for before, line in section.skeleton_at:
        if before > taken and taken < shown:
            upto = min(before, shown)
            out.extend(kept[taken:upto])
            taken = upto
            after_body = len(out)
        out.append(line)
    if taken < shown:
        out.extend(kept[taken:shown])
        after_body = len(out)
    if after_body >= 0 and section.fence_chars:
        # The body was cut (or the file ends) inside a fence: close it right after
        # the kept body so later skeleton lines and the notice stay outside it.
        _, closer = scan_fences(out[:after_body])
        if closer:
            out.insert(after_body, closer)
    return "\n".join(out)


class _Assembly:
    """The output being built: the preamble plus one emitted text per section."""

    def __init__(self, preamble: list[str], sections: list[_Section]) -> None:
        self.sections = sections
        self.prefix = ["\n".join(preamble)] if preamble else []
        self.kept: list[list[str]] = [[] for _ in sections]
        self.texts = [_emit(s, []) for s in sections]

    def set(self, index: int, kept: list[str]) -> None:
        self.kept[index] = kept
        self.texts[index] = _emit(self.sections[index], kept)

    def text(self) -> str:
        return "\n".join(self.prefix + self.texts)

    def text_with(self, index: int, kept: list[str]) -> str:
        texts = list(self.texts)
        texts[index] = _emit(self.sections[index], kept)
        return "\n".join(self.prefix + texts)


def _apply_caps(
    sections: list[_Section], caps: list[SectionCap], count: Callable[[str], int]
) -> tuple[list[list[str]], bool]:
    """Each section's body within its cap, and whether any body was cut."""
    left = [cap.tokens for cap in caps]
    bodies: list[list[str]] = []
    cut = False
    for section in sections:
        body = section.body
        group = next(
            (
                i
                for i, cap in enumerate(caps)
                if any(heading_matches(section.heading, k) for k in cap.headings)
            ),
            None,
        )
        if group is None or not body:
            bodies.append(body)
            continue
        allowance = left[group]
        tokens = count("\n".join(body))
        if tokens > allowance:
            cut = True
            if allowance > 0:
                target = _proportional(len("\n".join(body)), allowance, tokens)
                body = _shrink(body, target, lambda k, a=allowance: count("\n".join(k)) <= a)
            else:
                body = []
        left[group] = max(0, allowance - (count("\n".join(body)) if body else 0))
        bodies.append(body)
    return bodies, cut


def read_budgeted_section_aware(
    text: str,
    budget: int,
    *,
    path: str,
    counter: TokenCounter | None = None,
    section_caps: SectionCaps | None = None,
) -> str:
    """Return ``text`` within ``budget`` tokens, keeping its skeleton (R6.2, A8).

    Sections start at lines beginning ``## `` outside fenced code blocks; lines
    before the first are the preamble. Within a section the first line that
    starts and ends with ``_`` is its italic description, and lines matching
    ``^- See \\S+\\.md \\(\\d+`` are index lines. The skeleton is the preamble plus,
    per section, its heading, italic line and index lines; a section's body is
    the rest of its lines, in their original order.

    * Empty text gives ``""``. A text that fits (and whose sections are within
      their caps) is returned unchanged.
    * A text without level-2 headings is read with :func:`read_budgeted`.
    * Skeleton tokens >= ``budget`` (always so for a budget of 0): the skeleton
      plus a notice that only the structure is shown.
    * Otherwise (**beyond**: the whole skeleton is reserved first) sections are
      emitted in document order, each with its skeleton lines and then as much of
      its body as fits: all of it; or, when it does not fit and more than
      :data:`CUT_THRESHOLD_TOKENS` tokens remain, a line-aligned head of
      ``len * remaining/body_tokens * 0.95`` characters; or nothing. Later
      sections still get their skeleton lines and may fill their bodies from
      what is left. A notice naming the file and its size follows.

    Args:
        text: The file's content.
        budget: Token budget (>= 0).
        path: The file's path, named in the notices.
        counter: Token counter; defaults to the chars/4 estimate.
        section_caps: Optional per-section body caps (R5.10 **beyond**): a mapping
            ``{heading key: tokens}`` or :class:`SectionCap` objects; see
            :func:`checkpoint_section_caps`.

    Returns:
        The budgeted text. When the skeleton fits, ``tokens(output) <= budget +
        tokens(notice line)``.

    Raises:
        ConfigError: ``budget`` or a cap is negative, or ``section_caps`` is malformed.
    """
    _check_budget(budget)
    caps = _cap_list(section_caps)
    if not text:
        return ""
    count = _counter_fn(counter)
    preamble, sections = _parse(text)
    if not sections:
        return read_budgeted(text, budget, path=path, counter=counter)

    total = count(text)
    bodies, capped = _apply_caps(sections, caps, count)
    if not capped and total <= budget:
        return text

    shown_path = _printable_path(path)
    build = _Assembly(preamble, sections)
    skeleton = build.text()
    if count(skeleton) >= budget:
        notice = (
            f"[Only the structure of {shown_path} is shown: its headings, descriptions and "
            f"index lines fill the {budget}-token budget (the whole file is about {total} "
            f"tokens). Grep the file for section bodies.]"
        )
        return _finish(skeleton, notice)

    notice = (
        f"[Parts of {shown_path} are not shown (budget {budget} tokens; the whole file is "
        f"about {total} tokens, {len(text)} characters). Grep the file for anything missing.]"
    )
    notice_tokens = count(notice)

    def used(content: str) -> int:
        return count(_finish(content, notice)) - notice_tokens

    truncated = capped
    for index, body in enumerate(bodies):
        if not body:
            continue
        if used(build.text_with(index, body)) <= budget:
            build.set(index, body)
            continue
        truncated = True
        remaining = budget - used(build.text())
        if remaining <= CUT_THRESHOLD_TOKENS:
            continue
        body_text = "\n".join(body)
        target = _proportional(len(body_text), remaining, count(body_text))
        build.set(
            index,
            _shrink(body, target, lambda k, i=index: used(build.text_with(i, k)) <= budget),
        )

    content = build.text()
    if not truncated and count(content) <= budget:
        # Every body fitted after all (token rounding of the whole vs. the parts);
        # ``content`` is the text, with a fence left open at its end closed.
        return content
    return _finish(content, notice)
