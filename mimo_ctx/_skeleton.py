"""The skeleton of a memory file, for the section-aware budgeted read (SPEC R6.2, A8).

Private to :mod:`mimo_ctx.budget`: :func:`parse` splits a file's text into its
preamble and its ``## `` sections by one scan of the text, and each
:class:`Section` knows where its skeleton lines (heading, italic description,
index lines) are; its text, body and lengths are worked out only when the read
asks for them. Pure, no I/O.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import cached_property

from mimo_ctx.tokens import utf16_length

__all__ = ["FENCE_CLOSE", "FENCE_OPEN", "Section", "parse"]

FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
"""A line that opens a fenced block (CommonMark, simplified): the fence and its info string."""
FENCE_CLOSE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*\r?$")
"""A line that can close a fenced block: a fence and nothing after it but spaces."""

# One whole-text scan finds every line the parse looks at: a line that starts with
# ``## `` (a heading), with a fence (indented by at most three), with an index line's
# ``- See x.md (N``, or that is an italic line (``line.strip()`` starts and ends with
# "_" and is longer than one character; ``\s`` is exactly ``str.isspace``, what
# ``strip`` removes, minus the line break). Each alternative starts with the "\n"
# that ends the line before (a literal prefix lets the regex engine jump from line
# break to line break) and none reaches past its own line, so every line is looked
# at; no line can start two of them (their first characters differ). A line at
# offset 0 is checked apart. Lines are what ``text.split("\n")`` gives.
_SCAN = re.compile(
    r"\n(?:(## )|( {0,3}(?:```|~~~))|(- See \S+\.md \(\d+)|([^\S\n]*_[^\n]*_[^\S\n]*(?=\n|\Z)))"
)
_HEADING, _FENCE, _INDEX = 1, 2, 3  # group 4: an italic line
_FENCE_START = re.compile(r" {0,3}(?:```|~~~)")


def _line_end(text: str, start: int, end: int) -> int:
    found = text.find("\n", start, end)
    return end if found < 0 else found


def _fenced_spans(text: str, starts: Sequence[int]) -> list[tuple[int, int]]:
    """``(first, last)`` offsets of each fenced block, as ``scan_fences`` finds them.

    ``first`` is where the opening fence line starts, ``last`` where the closing
    fence line ends (the end of the text for a block left open); ``starts`` are the
    lines that start with a fence (indented by at most three), the only ones that
    can open or close one.
    """
    spans: list[tuple[int, int]] = []
    open_at = -1
    open_char = ""
    open_len = 0
    for start in starts:
        line = text[start : _line_end(text, start, len(text))]
        if open_at < 0:
            opened = FENCE_OPEN.match(line)
            if opened and not (opened.group(1)[0] == "`" and "`" in opened.group(2)):
                open_at, open_char, open_len = start, opened.group(1)[0], len(opened.group(1))
            continue
        closed = FENCE_CLOSE.match(line)
        if closed and closed.group(1)[0] == open_char and len(closed.group(1)) >= open_len:
            spans.append((open_at, start + len(line)))
            open_at = -1
    if open_at >= 0:
        spans.append((open_at, len(text)))
    return spans


class _Fences:
    """Whether a line (by the offset it starts at) lies inside a fenced block.

    ``lines`` are where the lines that start with a fence start, in order: only
    they can open or close a block, and a cut line can only open one if it is
    such a line (a cut keeps a prefix).
    """

    def __init__(self, text: str, lines: list[int]) -> None:
        self._lines = lines
        self._spans = _fenced_spans(text, lines) if lines else []
        self._firsts = [first for first, _ in self._spans]

    def __bool__(self) -> bool:
        return bool(self._spans)

    def any_line_in(self, start: int, end: int) -> bool:
        """Whether a fence line starts in ``[start, end]``: only then can emitting a
        part of that range leave a block open (and need a closing fence)."""
        index = bisect_left(self._lines, start)
        return index < len(self._lines) and self._lines[index] <= end

    def holds(self, offset: int) -> bool:
        index = bisect_right(self._firsts, offset) - 1
        return index >= 0 and offset <= self._spans[index][1]


class Section:
    """One ``## `` section: offsets into the file's text, the rest worked out on demand.

    The parse gives where the section runs (``start`` begins its heading line,
    ``end`` is the "\n" before the next heading or the end of the text) and its
    skeleton lines (``spans``: heading, italic line, index lines, in order). What
    costs a pass over the section -- its text, its body, its line counts, its
    UTF-16 lengths -- is computed the first time it is asked for and kept: the
    sections a budget never reaches cost no more than the scan that found them.

    ``body`` is the section's non-skeleton lines joined by ``\n``; ``skeleton``
    holds, per skeleton line in order, how many body lines precede it, the offset
    in ``body`` where those lines end, and the line itself.
    """

    def __init__(
        self, source: str, start: int, end: int, spans: list[tuple[int, int]], fence_chars: bool
    ) -> None:
        self._source = source
        self.start = start
        self.end = end
        self.spans = spans
        self.fence_chars = fence_chars
        self.heading = source[start : spans[0][1]].rstrip("\r")
        previous = start - 1  # where the last skeleton line ended (its "\n")
        has_body = False
        for first, last in spans:
            has_body = has_body or first > previous + 1
            previous = last
        # A body line between two skeleton lines, or after the last one.
        self.has_body = has_body or previous < end
        self._text: str | None = None
        self._split: tuple[str, int, list[tuple[int, int, str]]] | None = None

    @property
    def text(self) -> str:
        """The section as in the file (the same object on every call)."""
        if self._text is None:
            self._text = self._source[self.start : self.end]
        return self._text

    def trailing_space(self) -> int:
        """How many characters ``text.rstrip()`` removes, read from the file's text."""
        end = self.end
        while end > self.start and self._source[end - 1].isspace():
            end -= 1
        return self.end - end

    def is_text(self, candidate: str) -> bool:
        """Whether ``candidate`` is :attr:`text` itself (without making it)."""
        return candidate is self._text

    @cached_property
    def skeleton_lines(self) -> list[str]:
        """The skeleton lines, in order."""
        return [self._source[first:last] for first, last in self.spans]

    def _parts(self) -> tuple[str, int, list[tuple[int, int, str]]]:
        if self._split is None:
            text = self._source
            runs: list[str] = []
            skeleton: list[tuple[int, int, str]] = []
            lines_before = 0
            body_chars = -1  # length of the joined runs so far (-1: none yet)
            previous = self.start - 1
            for first, last in self.spans:
                if first > previous + 1:  # at least one body line in between
                    run = text[previous + 1 : first - 1]
                    runs.append(run)
                    lines_before += run.count("\n") + 1
                    body_chars += len(run) + 1
                skeleton.append((lines_before, max(body_chars, 0), text[first:last]))
                previous = last
            if previous < self.end:
                run = text[previous + 1 : self.end]
                runs.append(run)
                lines_before += run.count("\n") + 1
            self._split = ("\n".join(runs), lines_before, skeleton)
        return self._split

    @property
    def body(self) -> str:
        """The non-skeleton lines joined by ``\n`` (the same object on every call)."""
        return self._parts()[0]

    @property
    def body_lines(self) -> int:
        """How many body lines the section has."""
        return self._parts()[1]

    @property
    def skeleton(self) -> list[tuple[int, int, str]]:
        """Per skeleton line: body lines before it, where they end in ``body``, the line."""
        return self._parts()[2]

    @property
    def lines(self) -> list[str]:
        """The section's lines (for tests and diagnostics; the reader never splits)."""
        return self.text.split("\n")

    @cached_property
    def utf16(self) -> int:
        """The UTF-16 length of the section (the estimator's measure)."""
        return utf16_length(self.text)

    @cached_property
    def body_utf16(self) -> int:
        """The UTF-16 length of the body (0 without one), measured on the body itself:
        a section cut to fit has its body made anyway, its text need not be."""
        return utf16_length(self.body) if self.has_body else 0


def parse(text: str) -> tuple[str | None, list[Section]]:
    """The preamble (``None`` when the first line is a heading) and the sections.

    One scan of the text (:data:`_SCAN`) finds every line that matters; each
    section then takes its italic line and index lines from what was found.
    """
    heads = [0] if text.startswith("## ") else []
    fence_lines = [0] if _FENCE_START.match(text) else []
    # Italic and index lines: (where the line starts, where it ends or 0 for an index
    # line, whose end is looked up only if it is kept).
    marks: list[tuple[int, int]] = []
    for match in _SCAN.finditer(text):
        kind = match.lastindex
        if kind == _HEADING:
            heads.append(match.start() + 1)
        elif kind == _FENCE:
            fence_lines.append(match.start() + 1)
        elif kind == _INDEX:
            marks.append((match.start() + 1, 0))
        else:
            marks.append((match.start() + 1, match.end()))
    fences = _Fences(text, fence_lines)
    if fences:
        heads = [head for head in heads if not fences.holds(head)]
    if not heads:
        return text, []
    preamble = text[: heads[0] - 1] if heads[0] else None
    ends = [head - 1 for head in heads[1:]] + [len(text)]
    sections: list[Section] = []
    mark = bisect_left(marks, (heads[0], 0))
    for start, end in zip(heads, ends, strict=True):
        head_end = _line_end(text, start, end)
        spans = [(start, head_end)]
        italic = False
        while mark < len(marks) and marks[mark][0] <= end:
            first, last = marks[mark]
            mark += 1
            if first <= head_end or fences.holds(first):
                continue
            if last == 0:
                spans.append((first, _line_end(text, first, end)))
            elif not italic:
                # Only the first italic line of a section is its description.
                italic = True
                spans.append((first, last))
        sections.append(Section(text, start, end, spans, fences.any_line_in(start, end)))
    return preamble, sections
