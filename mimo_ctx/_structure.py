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
_HTML_START = re.compile(r" {0,3}<")
_HTML_LINES = re.compile(r"\n {0,3}<")
# Looser than _MARKERS: any spaces between the markers (a quote's content may be
# indented four, a list item's deeper); each marker is one character or number, so
# the run is read one way.
_LOOSE_MARKERS = r"(?:[ \t]*(?:>|(?:[-+*]|[0-9]{1,9}[.)])[ \t]))+"
_NESTED_START = re.compile(rf"{_LOOSE_MARKERS}[ \t]*[#<=-]")
_NESTED_LINES = re.compile(rf"\n{_LOOSE_MARKERS}[ \t]*[#<=-]")
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


def _item_views(lines: Sequence[str], fenced: Sequence[bool]) -> list[list[str]]:
    """Per line, the line as read from each content column of a list item it may be in.

    Which list items are open is over-approximated, never missed: an item closes
    only when a line less indented than its content follows a blank line or is a
    list item itself (any other such line may be a lazy continuation of the item's
    paragraph). Too many views only escape a line more; too few let a heading of
    a list item through.
    """
    # Sorted: a line reads only from the columns up to three short of its content
    # (deeper in, it is indented code), found by bisection, and closing items cuts
    # the tail, so a long run of markers costs its length once, not once per line.
    open_columns: list[int] = []
    after_blank = False
    views: list[list[str]] = []
    for line, in_fence in zip(lines, fenced, strict=True):
        if in_fence or not line.strip():
            views.append([])
            after_blank = after_blank or not line.strip()
            continue
        virtual, opened = _item_columns(line)
        if after_blank or opened:
            del open_columns[bisect_right(open_columns, len(line) - len(line.lstrip(" "))) :]
            open_columns.extend(opened)  # each past the line's indentation, ascending
        content = len(virtual) - len(virtual.lstrip(" "))
        low = bisect_left(open_columns, content - 3)
        high = bisect_right(open_columns, content)
        views.append([virtual[c:] for c in open_columns[low:high]])
        after_blank = False
    return views


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
    return _neutralise_lines(normalised, under_text=under_text)


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
