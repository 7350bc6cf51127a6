"""The rebuild body's headings and the structure its text must keep (SPEC R5.3, A6).

Private: every public name here is public from :mod:`mimo_ctx.sections`, whose
formatters build on these rules. Pure, synchronous.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Final

from mimo_ctx._util import HTML_HEADING_TAG, escape_html_headings, escape_path
from mimo_ctx.budget import scan_fences

__all__ = [
    "HEADING_ACTIVE_ACTORS",
    "HEADING_CHECKPOINT",
    "HEADING_GLOBAL_MEMORY",
    "HEADING_MEMORY_KEYS",
    "HEADING_NOTES",
    "HEADING_PROJECT_MEMORY",
    "HEADING_REBUILD_FOCUS",
    "HEADING_RECENT_ACTIVITY",
    "HEADING_RECENT_USER",
    "HEADING_TASKS",
    "SECTION_HEADINGS",
    "neutralise_structure",
    "normalise_line_breaks",
    "our_heading",
    "plain_structure",
    "render_section",
    "strip_level1_headings",
]


HEADING_TASKS: Final = "Tasks ledger"
HEADING_CHECKPOINT: Final = "Session checkpoint"
HEADING_ACTIVE_ACTORS: Final = "Active actors"
HEADING_RECENT_USER: Final = "Recent user input (verbatim)"
HEADING_PROJECT_MEMORY: Final = "Project durable knowledge"
HEADING_GLOBAL_MEMORY: Final = "Global memory"
HEADING_NOTES: Final = "Session notes"
HEADING_MEMORY_KEYS: Final = "Memory keys index"
HEADING_RECENT_ACTIVITY: Final = "Recent activity"
HEADING_REBUILD_FOCUS: Final = "Rebuild focus"
"""Ours: the focus text of a manual rebuild (``/rebuild <focus>``), first in the body."""

SECTION_HEADINGS: Final[tuple[str, ...]] = (
    HEADING_TASKS,
    HEADING_CHECKPOINT,
    HEADING_ACTIVE_ACTORS,
    HEADING_RECENT_USER,
    HEADING_PROJECT_MEMORY,
    HEADING_GLOBAL_MEMORY,
    HEADING_NOTES,
    HEADING_MEMORY_KEYS,
    HEADING_RECENT_ACTIVITY,
)
"""The body's level-1 section headings, in body order (SPEC R5.3)."""

_LEVEL1 = re.compile(r"^# [^#]")
_LEVEL1_LOOSE = re.compile(r"^ {0,3}#(?:[ \t]|$)")


# The titles of the body's own headings: its sections and the boundary's two parts.
_OUR_TITLES: Final = (*SECTION_HEADINGS, HEADING_REBUILD_FOCUS, "Checkpoint", "Active Actors")


def _heading_pattern() -> re.Pattern[str]:
    alternatives = "|".join(r"\s+".join(map(re.escape, t.split())) for t in _OUR_TITLES)
    # A level-1 or level-2 ATX heading whose title is one of ours, with any
    # indentation up to three spaces, any spacing, case and closing hashes.
    return re.compile(rf"^ {{0,3}}#{{1,2}}[ \t]+(?:{alternatives})[ \t]*#*[ \t]*\r?$", re.I)


_OUR_HEADING = _heading_pattern()


def _title_pattern() -> re.Pattern[str]:
    alternatives = "|".join(r"\s+".join(map(re.escape, t.split())) for t in _OUR_TITLES)
    return re.compile(rf"^ {{0,3}}(?:{alternatives})[ \t]*$", re.I)


# A paragraph line that is one of our titles (what a setext "---" underline or an
# HTML heading would make a heading of), a setext underline, an HTML heading.
_OUR_TITLE = _title_pattern()
_SETEXT_LEVEL1 = re.compile(r"^ {0,3}=+[ \t]*$")
_SETEXT_LEVEL2 = re.compile(r"^ {0,3}-+[ \t]*$")
# How far back an underline looks for a title of ours: no title is longer.
_TITLE_MAX_CHARS: Final = max(len(t) for t in _OUR_TITLES)
_TITLE_MAX_LINES: Final = max(len(t.split()) for t in _OUR_TITLES)
# The list item and block quote markers a line may start with: a heading after them
# is a heading inside the list item or quote. Each marker takes its own characters
# only (a quote's ">" no space, a list marker exactly one): the spaces between them
# can be read one way, so a line of many markers costs its length, not 2 ** markers.
_MARKERS = r"(?: {0,3}(?:>|(?:[-+*]|[0-9]{1,9}[.)])[ \t]))"
_MARKER_STARTS: Final = frozenset(">-+*0123456789")
_CONTAINER = re.compile(rf"^{_MARKERS}+[ \t]?")  # and the space a ">" may take
# One list item or quote marker at any indentation (inside a list item a marker or
# a heading sits as deep as the item's content column): how the content columns of
# the list items a line opens are found.
_ITEM_MARKER = re.compile(r" *(?:>|(?:[-+*]|[0-9]{1,9}[.)])(?=[ \t]|$))")
# A line that may start an HTML block (the run of lines it begins is then HTML) and
# a fence line; the start of an HTML block that runs past blank lines, up to its own
# end marker (CommonMark's kinds 1 to 5), after any list item or quote markers.
_HTML_LINE = re.compile(r"^ {0,3}<")
_FENCE_LINE = re.compile(r"^ {0,3}(?:```|~~~)")
_RAW_HTML_START = re.compile(
    rf"^({_MARKERS}*[ \t]*)"
    r"<(?=(?:pre|script|style|textarea)(?:[\s>]|$)|!--|\?|![A-Za-z]|!\[CDATA\[)",
    re.I,
)
# A line starting with "<" (an HTML block may start there), or with list item or
# quote markers before a "#", "<", "=" or "-" (a heading, HTML or an underline in
# the list item or quote): the line-by-line pass decides.
# Any indentation: an HTML block starts at most three spaces deep, but the raw-HTML
# rule defuses "<!--", "<pre"... at any depth (inside a list item the content
# column may be deeper).
_HTML_START = re.compile(r"[ \t]*<")
_HTML_LINES = re.compile(r"\n[ \t]*<")
# Looser than _MARKERS: any spaces between the markers (a quote's content may be
# indented four, a list item's deeper); each marker is one character or number, so
# the run is read one way.
_LOOSE_MARKERS = r"(?:[ \t]*(?:>|(?:[-+*]|[0-9]{1,9}[.)])[ \t]))+"
_NESTED_START = re.compile(rf"{_LOOSE_MARKERS}[ \t]*[#<=-]")
_NESTED_LINES = re.compile(rf"\n{_LOOSE_MARKERS}[ \t]*[#<=-]")
# A line any rule of the line-by-line pass may change starts with one of these (a
# superset, the rules decide): "#" or "<" at any indentation, list item or quote
# markers before "#", "<", "=" or "-", a setext underline, a fence. The other lines
# such a rule changes hold an HTML heading tag, or are the first line with content
# and start with "File:" (found apart). Tabs are read expanded too: not here.
_CANDIDATE = (
    rf"(?:[ \t]*[#<]|{_LOOSE_MARKERS}[ \t]*[#<=-]|[ \t]*(?:=+|-+)[ \t]*(?=\n|\Z)"
    r"| {0,3}(?:```|~~~))"
)
_CANDIDATE_START = re.compile(_CANDIDATE)
_CANDIDATE_LINES = re.compile(rf"\n{_CANDIDATE}")
# Whole-text scans from line break to line break (a literal first character lets
# the regex engine jump): what makes a text need no line-by-line pass
# (plain_structure, strip_level1_headings); the first line is checked apart.
_LEVEL1_LINES = re.compile(r"\n# [^#]")
# Any indentation: a list item's content column may be deeper than three spaces.
_HASH_START = re.compile(r"[ \t]*#")
_HASH_LINES = re.compile(r"\n[ \t]*#")
_UNDERLINE_LINES = re.compile(r"\n[ \t]*(?:=+|-+)[ \t]*(?=\n|\Z)")
_FENCE_START = re.compile(r" {0,3}(?:```|~~~)")
_FENCE_LINES = re.compile(r"\n {0,3}(?:```|~~~)")
# Every line break but "\n": what str.splitlines(), a browser or a model may break
# a line on although the body's own rules (which split on "\n") do not.
_OTHER_BREAK_CHARS: Final = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_OTHER_BREAKS = re.compile(f"\r\n?|[{_OTHER_BREAK_CHARS[1:]}]")


# -- structure ---------------------------------------------------------------------------


def strip_level1_headings(text: str) -> str:
    """Remove level-1 heading lines (``^# [^#]``) outside fenced code blocks (A6).

    A file-backed section drops the file's own title so the file's level-2
    headings nest under the section's level-1 heading.
    """
    normalised = normalise_line_breaks(text)
    if not _LEVEL1.match(normalised) and _LEVEL1_LINES.search(normalised) is None:
        return normalised  # no line is a level-1 heading: nothing to remove
    return _strip_level1_lines(normalised)


def _strip_level1_lines(text: str) -> str:
    """:func:`strip_level1_headings` line by line (the general case)."""
    lines = normalise_line_breaks(text).split("\n")
    fenced, _ = scan_fences(lines)
    kept = [
        line
        for line, in_fence in zip(lines, fenced, strict=True)
        if in_fence or not _LEVEL1.match(line)
    ]
    return "\n".join(kept)


def normalise_line_breaks(text: str) -> str:
    """``text`` with every line break (``\\r\\n``, ``\\r``, VT, FF, NEL, U+2028...) as ``\\n``.

    The structure rules look at the lines between ``\\n`` characters; a heading
    after any other line break would start a line for whoever splits on it
    (``str.splitlines()``, a browser, a model) and go unseen.
    """
    # Most texts hold none of them: a substring search per character (memchr speed,
    # and free for a character wider than any in the text) spares the regex, whose
    # leading alternation makes it try every position (~8 µs per KB).
    if not any(char in text for char in _OTHER_BREAK_CHARS):
        return text
    return _OTHER_BREAKS.sub("\n", text)


def _in_container(line: str) -> str:
    """``line`` without the list item and block quote markers it starts with."""
    # Most lines start with none: a look at the first character spares the regex.
    first = line.lstrip(" ")[:1]
    if not first or first not in _MARKER_STARTS:
        return line
    return _CONTAINER.sub("", line, count=1)


def _item_columns(line: str) -> tuple[str, list[int]]:
    """``line`` with its leading list item and quote markers as spaces, and the
    content columns of the list items it opens.

    CommonMark puts a list item's content at the column after its marker and the
    one to four spaces that follow (one when more follow: then they are indented
    code; one when nothing follows: the item starts with a blank line). A line
    inside the item is read from that column on, however deep it is.
    """
    columns: list[int] = []
    marker_ends: list[int] = []
    position = 0
    while (match := _ITEM_MARKER.match(line, position)) is not None:
        end = match.end()
        marker_ends.append(end)
        if line[end - 1] == ">":
            position = end + 1 if line[end : end + 1] == " " else end
            continue
        rest = line[end:]
        spaces = len(rest) - len(rest.lstrip(" "))
        if not rest.strip() or spaces > 4:
            columns.append(end + 1)
            if rest.strip():
                break  # indented code in the item: no marker after it
        else:
            columns.append(end + spaces)
        position = end
    if not marker_ends:
        return line, columns
    # The markers (and the indentation before them) end at the last one's end.
    return " " * marker_ends[-1] + line[marker_ends[-1] :], columns


class _ItemTracker:
    """Which list items are open, line after line (the state :func:`_item_views` keeps).

    :meth:`step` takes the next line and returns its views; a fresh tracker is the
    state before a text's first line, and before any line :meth:`resets`.
    """

    __slots__ = ("_after_blank", "_open")

    def __init__(self) -> None:
        # Sorted: a line reads only from the columns up to three short of its
        # content (deeper in, it is indented code), found by bisection, and closing
        # items cuts the tail, so a long run of markers costs its length once.
        self._open: list[int] = []
        self._after_blank = False

    def step(self, line: str, in_fence: bool) -> list[str]:
        """The views of ``line`` (the next line), and the state moved past it."""
        if in_fence or not line.strip():
            self._after_blank = self._after_blank or not line.strip()
            return []
        open_columns = self._open
        virtual, opened = _item_columns(line)
        if self._after_blank or opened:
            del open_columns[bisect_right(open_columns, len(line) - len(line.lstrip(" "))) :]
            open_columns.extend(opened)  # each past the line's indentation, ascending
        content = len(virtual) - len(virtual.lstrip(" "))
        low = bisect_left(open_columns, content - 3)
        high = bisect_right(open_columns, content)
        self._after_blank = False
        return [virtual[c:] for c in open_columns[low:high]]

    @staticmethod
    def resets(lines: Sequence[str], index: int, in_fence: bool) -> bool:
        """Whether every state before ``lines[index]`` leaves the same one after it.

        True for the first line, and for a line outside a fence, unindented and not
        blank, that opens a list item or follows a blank line: it closes every item
        open before it (each content column is past column 0), so a fresh tracker
        stepped from it on gives the same views as one stepped from the start.
        """
        if index == 0:
            return True
        line = lines[index]
        if in_fence or line[:1] == " " or not line.strip():
            return False
        return not lines[index - 1].strip() or bool(_item_columns(line)[1])


def _item_views(lines: Sequence[str], fenced: Sequence[bool]) -> list[list[str]]:
    """Per line, the line as read from each content column of a list item it may be in.

    Which list items are open is over-approximated, never missed: an item closes
    only when a line less indented than its content follows a blank line or is a
    list item itself (any other such line may be a lazy continuation of the item's
    paragraph). Too many views only escape a line more; too few let a heading of
    a list item through.
    """
    tracker = _ItemTracker()
    return [tracker.step(line, in_fence) for line, in_fence in zip(lines, fenced, strict=True)]


def _forged(
    lines: Sequence[str],
    index: int,
    in_fence: bool,
    *,
    under_text: bool,
    views: Sequence[str] = (),
) -> bool:
    """True when ``lines[index]`` could fake a heading of the body (module docstring).

    ``under_text``: the body starts right under a line of text (the ``File:``
    line), which an underline on its first line would make a heading. ``views``:
    the line as read from the content column of each list item it may be in
    (:func:`_item_views`).
    """
    line = lines[index]
    if _OUR_HEADING.match(line):
        return True
    if in_fence:
        return False
    inner = _in_container(line)
    if _LEVEL1_LOOSE.match(inner) or (inner is not line and _OUR_HEADING.match(inner)):
        return True
    if any(_LEVEL1_LOOSE.match(view) or _OUR_HEADING.match(view) for view in views):
        return True
    # A setext underline: "===" makes the paragraph above a level-1 heading, "---" a
    # level-2 one (which matters when its title is ours). Only an underline looks
    # back, and only as far as a title of ours can reach: every line doing so, or
    # over the whole paragraph, made a long paragraph cost its length squared.
    # ("- " is an underline too, not an empty list item, right under a paragraph.)
    if line.rstrip()[-1:] not in ("=", "-"):
        return False  # what most lines are: no underline
    candidates = (line, inner, *views)
    level1 = any(_SETEXT_LEVEL1.match(view) is not None for view in candidates)
    if not level1 and not any(_SETEXT_LEVEL2.match(view) for view in candidates):
        return False
    if index == 0 or not lines[index - 1].strip():
        return level1 and index == 0 and under_text
    if level1:
        return True
    # The title is the paragraph above, its lines joined; where the paragraph starts
    # (a heading, a list item or a quote above it ends the one before) is not worked
    # out: any run of lines just above that reads as our title counts.
    start = index
    while start > 0 and lines[start - 1].strip() and index - start < _TITLE_MAX_LINES:
        start -= 1
        title = " ".join(" ".join([_in_container(lines[start]), *lines[start + 1 : index]]).split())
        if len(title) > _TITLE_MAX_CHARS:
            break
        if _OUR_TITLE.match(title):
            return True
    return False


def neutralise_structure(text: str, *, under_text: bool = False) -> str:
    """Escape lines of ``text`` that could fake the rebuild body's structure.

    See the module docstring for the rules. Idempotent: neutralising twice
    changes nothing more.

    Args:
        text: A section body (after :func:`strip_level1_headings` for file-backed
            sections).
        under_text: The body is written right under a line of text (a file-backed
            section's ``File:`` line): a ``===`` first line would underline it.

    Returns:
        The body with offending lines prefixed by a backslash and an open code
        fence closed at the end.
    """
    if not text:
        return text
    normalised = normalise_line_breaks(text)
    if plain_structure(normalised):
        return normalised  # no line to escape, no fence to close: the lines as they are
    if "\t" in normalised:
        return _neutralise_lines(normalised, under_text=under_text)
    return _neutralise_candidates(normalised, under_text=under_text)


def plain_structure(text: str) -> bool:
    """True when no line of ``text`` (line breaks normalised) can need a change.

    Whole-text scans for what any rule starts from: a line starting with ``#``
    (then checked as a heading, at any indentation: a list item's content may be
    deeper than three spaces), a setext underline, a fence, an HTML heading tag, a tab,
    ``File:``, a line starting with ``<``, list item or quote markers before a
    ``#``, ``<``, ``=`` or ``-``. A scan may match where no rule applies (the line-by-line pass then
    decides); it never misses a line a rule would change. The scans start at a
    line break (a literal the regex engine jumps to) and the first line is checked
    apart.
    """
    if "File:" in text or HTML_HEADING_TAG.search(text) is not None:
        return False
    if "\t" in text:
        return False  # a tab among markers or indentation: read with it expanded
    first = text[: _line_end(text, 0)]
    if _SETEXT_LEVEL1.match(first) or _SETEXT_LEVEL2.match(first) or _FENCE_START.match(first):
        return False
    if _HTML_START.match(first) or _HTML_LINES.search(text) is not None:
        return False
    if _NESTED_START.match(first) or _NESTED_LINES.search(text) is not None:
        return False
    if _UNDERLINE_LINES.search(text) is not None or _FENCE_LINES.search(text) is not None:
        return False
    starts = [0] if _HASH_START.match(first) else []
    starts.extend(m.start() + 1 for m in _HASH_LINES.finditer(text))
    for start in starts:
        line = text[start : _line_end(text, start)].lstrip(" \t")
        if _LEVEL1_LOOSE.match(line) or _OUR_HEADING.match(line):
            return False
    return True


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _neutralise_lines(text: str, *, under_text: bool) -> str:
    """:func:`neutralise_structure` line by line (the general case)."""
    lines = normalise_line_breaks(text).split("\n")
    fenced, closer = scan_fences(lines)
    # A tab moves to the next multiple of four columns (CommonMark): the markers and
    # indentation it stands in are read with it expanded as well as raw.
    expanded = [line.expandtabs(4) for line in lines] if "\t" in text else lines
    item_views = _item_views(expanded, fenced)
    out: list[str] = []
    first_content = True
    html_above = False  # a line of the paragraph-like run above may start an HTML block
    for index, (line, in_fence) in enumerate(zip(lines, fenced, strict=True)):
        views = item_views[index]
        forged = (
            _forged(lines, index, in_fence, under_text=under_text, views=views)
            or (
                expanded is not lines
                and "\t" in line
                and _forged(expanded, index, in_fence, under_text=under_text, views=views)
            )
            or (first_content and line.lstrip().startswith("File:"))
        )
        if not line.strip():
            html_above = False
        else:
            first_content = False
            if html_above and _FENCE_LINE.match(line):
                # Inside an HTML block a Markdown reader sees no fence: the fences
                # would pair differently there than here, and the closer this adds
                # would open one. A blank line ends the HTML block first.
                out.append("")
            html_above = html_above or (
                not in_fence and "<" in line and _HTML_LINE.match(_in_container(line)) is not None
            )
        escaped = escape_html_headings(line)
        if not in_fence:
            # An HTML block that only its own end tag closes (a comment, <pre>,
            # <script>...) would swallow the sections after it: not one is opened.
            escaped = (
                _RAW_HTML_START.sub(r"\1&lt;", escaped, count=1) if "<" in escaped else escaped
            )
        out.append("\\" + escaped if forged else escaped)
    if closer:
        out.append(closer)
    return "\n".join(out)


def _candidate_lines(text: str, lines: Sequence[str]) -> list[int]:
    """Indexes of the lines of ``text`` (no tab) that a rule may change, ascending."""
    starts = [m.start() + 1 for m in _CANDIDATE_LINES.finditer(text)]
    if _CANDIDATE_START.match(text):
        starts.insert(0, 0)
    if "<" in text:
        starts.extend(m.start() for m in HTML_HEADING_TAG.finditer(text))
        starts.sort()
    indexes: list[int] = []
    line = 0
    at = 0
    for start in starts:
        line += text.count("\n", at, start)
        at = start
        if not indexes or indexes[-1] != line:
            indexes.append(line)
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("File:"):
        position = bisect_left(indexes, first)
        if position == len(indexes) or indexes[position] != first:
            indexes.insert(position, first)
    return indexes


class _Fences:
    """Which lines lie in fenced blocks: :func:`scan_fences`, from the fence lines only.

    Only a line starting with a fence can open or close a block, so the scan is
    fed those lines (each followed by an empty line, whose answer is whether a
    block is open after it) and any other line is looked up from the fence line
    above it.
    """

    def __init__(self, lines: Sequence[str], candidates: Sequence[int]) -> None:
        self._at = [i for i in candidates if _FENCE_LINE.match(lines[i])]
        fed: list[str] = []
        for index in self._at:
            fed += [lines[index], ""]
        mask, self.closer = scan_fences(fed)
        self._fence = mask[0::2]
        self._open_after = mask[1::2]

    def __call__(self, index: int) -> bool:
        """Whether line ``index`` belongs to a fenced block (its fences included)."""
        position = bisect_right(self._at, index) - 1
        if position < 0:
            return False
        if self._at[position] == index:
            return self._fence[position]
        return self._open_after[position]


def _neutralise_candidates(text: str, *, under_text: bool) -> str:
    """:func:`_neutralise_lines` for a text without tabs, looking only at the lines it may change.

    Every other line is copied as it is; what a rule needs from the lines around
    one (the fenced blocks, the list items open, an HTML block above, the title
    an underline makes a heading of) is worked out from them as far as it reaches.
    """
    lines = text.split("\n")
    candidates = _candidate_lines(text, lines)
    fenced = _Fences(lines, candidates)
    tracker = _ItemTracker()
    tracked = -1  # the tracker's state is the one after this line
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    html_line = -1  # the newest line above that may start an HTML block
    blank_checked = 0  # lines before this one are checked for a blank after html_line
    blank_since_html = False
    out: list[str] = []
    copied = 0
    for index in candidates:
        line = lines[index]
        in_fence = fenced(index)
        # The list items open at this line: from the newest line that resets the
        # state, or on from the state already known, whichever is nearer.
        start = index
        while start > tracked + 1 and not _ItemTracker.resets(lines, start, fenced(start)):
            start -= 1
        if start > tracked + 1:
            tracker = _ItemTracker()  # the state before a line that resets it
        for between in range(start, index):
            tracker.step(lines[between], fenced(between))
        views = tracker.step(line, in_fence)
        tracked = index
        forged = _forged(lines, index, in_fence, under_text=under_text, views=views) or (
            index == first and line.lstrip().startswith("File:")
        )
        out.extend(lines[copied:index])
        copied = index + 1
        if line.strip():
            if html_line >= 0 and not blank_since_html:
                for between in range(max(blank_checked, html_line + 1), index):
                    if not lines[between].strip():
                        blank_since_html = True
                        break
                blank_checked = index
            if html_line >= 0 and not blank_since_html and _FENCE_LINE.match(line):
                out.append("")  # inside an HTML block (see _neutralise_lines)
            if not in_fence and "<" in line and _HTML_LINE.match(_in_container(line)):
                html_line, blank_checked, blank_since_html = index, index + 1, False
        escaped = escape_html_headings(line)
        if not in_fence and "<" in escaped:
            escaped = _RAW_HTML_START.sub(r"\1&lt;", escaped, count=1)
        out.append("\\" + escaped if forged else escaped)
    out.extend(lines[copied:])
    if fenced.closer:
        out.append(fenced.closer)
    return "\n".join(out)


def render_section(heading: str, body: str, *, file_path: str | None = None) -> str:
    """Format one body section (A6).

    The result is ``# <heading>\\n``, then ``File: <path>\\n`` when ``file_path``
    is given, then the body without leading and trailing newlines followed by
    ``\\n`` (nothing for an empty body), then a blank line (``\\n``). A
    file-backed body has its level-1 headings removed
    (:func:`strip_level1_headings`); every body is passed through
    :func:`neutralise_structure`.

    Args:
        heading: The section heading without ``#`` (one of :data:`SECTION_HEADINGS`).
        body: The section's content.
        file_path: The file a file-backed section comes from.
    """
    head = f"# {escape_path(heading)}\n"
    if file_path is not None:
        head += f"File: {escape_path(file_path)}\n"
        body = strip_level1_headings(body)
    body = neutralise_structure(body.strip("\n"), under_text=file_path is not None).strip("\n")
    return f"{head}{body}\n\n" if body else f"{head}\n"


def our_heading(line: str) -> bool:
    """Whether ``line`` is a level-1 or level-2 heading with one of our titles."""
    return _OUR_HEADING.match(line) is not None
