"""The section-aware budgeted read as first written: the reference of the linear one.

:func:`mimo_ctx.budget.read_budgeted_section_aware` computes every token count
from cached UTF-16 lengths and emits sections by slices of the file. This module
keeps the straightforward version it replaced -- one list of lines per section,
every decision re-counting the whole assembled text -- so property tests can
check that the fast one decides exactly the same, character for character.
"""

# pyright: reportPrivateUsage=false
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mimo_ctx._section_caps import cap_list, check_budget
from mimo_ctx.budget import (
    _INDEX_LINE,
    CUT_THRESHOLD_TOKENS,
    SectionCap,
    SectionCaps,
    _cut_at_line,
    _finish,
    _printable_path,
    _proportional,
    heading_matches,
    read_budgeted,
    scan_fences,
)
from mimo_ctx.tokens import TokenCounter, count_with

_HEADING_PREFIX = "## "


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


def reference_section_aware(
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
    check_budget(budget)
    caps = cap_list(section_caps)
    if not text:
        return ""
    count = count_with(counter)
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
