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
from collections.abc import Callable, Sequence
from typing import Final

from mimo_ctx._section_caps import (
    SectionCap,
    SectionCaps,
    cap_list,
    check_budget,
    checkpoint_section_caps,
    heading_matches,
)
from mimo_ctx._skeleton import FENCE_CLOSE, FENCE_OPEN, Section, parse
from mimo_ctx.tokens import (
    CharEstimator,
    TokenCounter,
    count_with,
    utf16_length,
)

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

_INDEX_LINE = re.compile(r"^- See \S+\.md \(\d+")
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
            match = FENCE_OPEN.match(line)
            if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
                open_char, open_len = match.group(1)[0], len(match.group(1))
                mask.append(True)
            else:
                mask.append(False)
            continue
        mask.append(True)
        match = FENCE_CLOSE.match(line)
        if match and match.group(1)[0] == open_char and len(match.group(1)) >= open_len:
            open_char = ""
    return mask, (open_char * open_len if open_char else None)


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
    if not _has_fence_chars(text):
        return text
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
    check_budget(budget)
    count = count_with(counter)
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


# -- read_budgeted_section_aware ------------------------------------------------------


def _has_fence_chars(text: str) -> bool:
    # A fence (open or close) is a run of three backticks or tildes; a text without
    # either has no fenced line, whatever its indentation. The one-character tests
    # first: they are a memchr, the three-character ones a slower substring search.
    return ("`" in text and "```" in text) or ("~" in text and "~~~" in text)


def _kept_lines(kept: str) -> int:
    """Lines of a cut head: ``kept.split("\\n")`` without making the list."""
    return kept.count("\n") + 1 if kept else 0


def _shrink(body: str, target: int, fits: Callable[[str], bool]) -> str:
    """Cut ``body`` to ``target`` characters back to a line end, then further until ``fits``."""
    kept, _ = _cut_at_line(body, target)
    while kept and not fits(kept):
        kept, _ = _cut_at_line(kept, len(kept) * 9 // 10)
    return kept


def _emit(section: Section, kept: str, kept_lines: int) -> str:
    """A section's text: its skeleton lines plus the kept prefix of its body, in order.

    ``kept`` is a prefix of ``section.body`` holding ``kept_lines`` lines, the last
    of which may be cut short (what :func:`_shrink` returns); body lines past it
    are left out, and every skeleton line stays in its place. The kept lines are
    copied as slices, between the skeleton lines, never line by line.
    """
    if not section.has_body:
        return section.text  # every line is a skeleton line
    if kept_lines <= 0:
        return "\n".join(section.skeleton_lines)  # no body line shown: nothing to close
    shown = min(kept_lines, section.body_lines)
    if shown == section.body_lines and kept == section.body and not section.fence_chars:
        return section.text  # the whole section, exactly as in the file
    out: list[str] = []
    taken = 0
    taken_at = 0
    after_body = -1
    for before, at, line in section.skeleton:
        if before > taken and taken < shown:
            if before < shown:
                out.append(kept[taken_at:at])
                taken, taken_at = before, at + 1
            else:
                out.append(kept[taken_at:])
                taken = shown
            after_body = len(out)
        out.append(line)
    if taken < shown:
        out.append(kept[taken_at:])
        after_body = len(out)
    if after_body >= 0 and section.fence_chars:
        # The body was cut (or the file ends) inside a fence: close it right after
        # the kept body so later skeleton lines and the notice stay outside it.
        _, closer = scan_fences("\n".join(out[:after_body]).split("\n"))
        if closer:
            out.insert(after_body, closer)
    return "\n".join(out)


def _trailing_space(text: str) -> int:
    """How many characters ``text.rstrip()`` removes (without copying the text)."""
    end = len(text)
    while end and text[end - 1].isspace():
        end -= 1
    return len(text) - end


class _Assembly:
    """The output being built: the preamble plus one emitted text per section.

    Token counts of the output (with the notice appended as :func:`_finish` does)
    come from one of two measures. The default estimator's count is a function of
    the UTF-16 length, which is additive over the pieces, so the lengths of the
    pieces are kept and every count is arithmetic: each section is measured once,
    however many candidates are tried. Any other counter counts the assembled text.
    """

    def __init__(
        self,
        preamble: str | None,
        sections: list[Section],
        count: Callable[[str], int],
        *,
        additive: bool,
    ) -> None:
        self.sections = sections
        self.additive = additive
        self._count = count
        self._prefix = [preamble] if preamble is not None else []
        self.texts = [_emit(s, "", 0) for s in sections]
        self._notice = ""
        self._notice_utf16 = 0
        self._notice_tokens = 0
        if additive:
            self._lengths = [self.length_of(i, t) for i, t in enumerate(self.texts)]
            pieces = len(self._prefix) + len(self.texts)
            self._total = (
                sum(self._lengths) + sum(utf16_length(p) for p in self._prefix) + max(0, pieces - 1)
            )

    def length_of(self, index: int, text: str) -> int:
        """The UTF-16 length of ``text``, a candidate text of section ``index``."""
        section = self.sections[index]
        return section.utf16 if section.is_text(text) else utf16_length(text)

    def set(self, index: int, text: str, length: int = 0) -> None:
        """Make ``text`` section ``index``'s output (``length``: its UTF-16 length)."""
        if self.additive:
            self._total += length - self._lengths[index]
            self._lengths[index] = length
        self.texts[index] = text

    def text(self) -> str:
        return "\n".join(self._prefix + self.texts)

    def tokens(self) -> int:
        """Tokens of the assembled text as it is."""
        if self.additive:
            return _length_tokens(self._total)
        return self._count(self.text())

    def use_notice(self, notice: str) -> None:
        self._notice = notice
        self._notice_tokens = self._count(notice)
        self._notice_utf16 = utf16_length(notice)

    def used(self, index: int | None = None, text: str = "", length: int = 0) -> int:
        """Tokens of the output plus the notice, minus the notice's own tokens.

        With ``index``, section ``index`` reads ``text`` (UTF-16 length ``length``)
        instead of its current output.
        """
        if not self.additive:
            content = self.text()
            if index is not None:
                texts = list(self.texts)
                texts[index] = text
                content = "\n".join(self._prefix + texts)
            return self._count(_finish(content, self._notice)) - self._notice_tokens
        total = self._total
        last = len(self.texts) - 1
        tail = self.texts[last]
        if index is not None:
            total += length - self._lengths[index]
            if index == last:
                tail = text
        # _finish: the content right-stripped (the last section starts with its
        # heading, so it is never all blank), a blank line, the notice.
        total = total - _trailing_space(tail) + 2 + self._notice_utf16
        return _length_tokens(total) - self._notice_tokens

    def may_fit_whole(self, index: int, budget: int) -> bool:
        """Whether section ``index`` as in the file may fit within ``budget`` (additive).

        Its characters are a lower bound of its UTF-16 length (each is one unit or
        two), so a section that does not fit even so -- every section past a spent
        budget -- is rejected without being copied or measured.
        """
        section = self.sections[index]
        total = self._total + (section.end - section.start) - self._lengths[index]
        if index == len(self.texts) - 1:
            total -= section.trailing_space()
        return _length_tokens(total + 2 + self._notice_utf16) - self._notice_tokens <= budget


def _length_tokens(utf16: int) -> int:
    # estimate_text_tokens from a UTF-16 length.
    return (utf16 + 2) // 4


def _apply_caps(
    sections: list[Section],
    caps: list[SectionCap],
    count: Callable[[str], int],
    additive: bool,
) -> tuple[list[tuple[str, int] | None], bool]:
    """Each section's body within its cap, and whether any body was cut.

    Per section, ``None`` when its whole body stands (a section no cap names is not
    looked at), else the kept text and its number of lines.
    """
    left = [cap.tokens for cap in caps]
    bodies: list[tuple[str, int] | None] = []
    cut = False
    for section in sections:
        group = (
            next(
                (
                    i
                    for i, cap in enumerate(caps)
                    if any(heading_matches(section.heading, k) for k in cap.headings)
                ),
                None,
            )
            if caps
            else None
        )
        if group is None or not section.has_body:
            bodies.append(None)
            continue
        allowance = left[group]
        body = section.body
        tokens = _length_tokens(section.body_utf16) if additive else count(body)
        if tokens <= allowance:
            left[group] = allowance - tokens
            bodies.append(None)
            continue
        cut = True
        if allowance > 0:
            target = _proportional(len(body), allowance, tokens)
            body = _shrink(body, target, lambda k, a=allowance: count(k) <= a)
        else:
            body = ""
        tokens = count(body) if body else 0
        left[group] = max(0, allowance - tokens)
        bodies.append((body, _kept_lines(body)))
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

    Cost: with the default estimator, about one pass over the file -- one scan
    finds the skeleton, the file's UTF-16 length is taken once, and every later
    count is arithmetic on lengths (the estimate is a function of the length). A
    section is copied and measured only when the budget reaches it: once the
    budget is spent, a section's characters (a lower bound of its length) show it
    cannot fit, and it costs nothing more. Another counter counts each candidate
    output whole.

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
    # The estimator (the default, or a plain CharEstimator) is additive in UTF-16
    # length; a subclass may count differently, so only the exact type qualifies.
    additive = counter is None or type(counter) is CharEstimator
    preamble, sections = parse(text)
    if not sections:
        return read_budgeted(text, budget, path=path, counter=counter)

    # With the estimator: the whole text's UTF-16 length, once (it is the sum of its
    # sections' and the preamble's, joined by "\n", which are measured only when needed).
    total = _length_tokens(utf16_length(text)) if additive else count(text)
    bodies, capped = _apply_caps(sections, caps, count, additive)
    if not capped and total <= budget:
        return text

    shown_path = _printable_path(path)
    build = _Assembly(preamble, sections, count, additive=additive)
    if build.tokens() >= budget:
        notice = (
            f"[Only the structure of {shown_path} is shown: its headings, descriptions and "
            f"index lines fill the {budget}-token budget (the whole file is about {total} "
            f"tokens). Grep the file for section bodies.]"
        )
        return _finish(build.text(), notice)

    build.use_notice(
        f"[Parts of {shown_path} are not shown (budget {budget} tokens; the whole file is "
        f"about {total} tokens, {len(text)} characters). Grep the file for anything missing.]"
    )

    def candidate(index: int, kept: str, lines: int) -> tuple[str, int]:
        emitted = _emit(sections[index], kept, lines)
        return emitted, build.length_of(index, emitted) if additive else 0

    truncated = capped
    for index, kept_body in enumerate(bodies):
        section = sections[index]
        if kept_body is None:  # the whole body
            if not section.has_body:
                continue
            if section.fence_chars:
                emitted = _emit(section, section.body, section.body_lines)
            elif not additive or build.may_fit_whole(index, budget):
                emitted = section.text
            else:
                emitted = None
        else:
            body, lines = kept_body
            if not lines:
                continue
            emitted = _emit(section, body, lines)
        if emitted is not None:
            length = build.length_of(index, emitted) if additive else 0
            if build.used(index, emitted, length) <= budget:
                build.set(index, emitted, length)
                continue
        truncated = True
        remaining = budget - build.used()
        if remaining <= CUT_THRESHOLD_TOKENS:
            continue
        if kept_body is None:
            body = section.body
            body_tokens = _length_tokens(section.body_utf16) if additive else count(body)
        else:
            body, _ = kept_body
            body_tokens = count(body)
        target = _proportional(len(body), remaining, body_tokens)

        def fits(kept: str, i: int = index) -> bool:
            return build.used(i, *candidate(i, kept, _kept_lines(kept))) <= budget

        kept = _shrink(body, target, fits)
        build.set(index, *candidate(index, kept, _kept_lines(kept)))

    if not truncated and build.tokens() <= budget:
        # Every body fitted after all (token rounding of the whole vs. the parts);
        # the text, with a fence left open at its end closed.
        return build.text()
    return _finish(build.text(), build._notice)  # pyright: ignore[reportPrivateUsage]
