"""The rebuild body's headings and the structure its text must keep (SPEC R5.3, A6).

Private: every public name here is public from :mod:`mimo_ctx.sections`, whose
formatters build on these rules. Pure, synchronous.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

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
    "escape_breaks",
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
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _heading_pattern() -> re.Pattern[str]:
    titles = [*SECTION_HEADINGS, HEADING_REBUILD_FOCUS, "Checkpoint", "Active Actors"]
    alternatives = "|".join(r"\s+".join(map(re.escape, t.split())) for t in titles)
    # A level-1 or level-2 ATX heading whose title is one of ours, with any
    # indentation up to three spaces, any spacing, case and closing hashes.
    return re.compile(rf"^ {{0,3}}#{{1,2}}[ \t]+(?:{alternatives})[ \t]*#*[ \t]*\r?$", re.I)


_OUR_HEADING = _heading_pattern()


def _title_pattern() -> re.Pattern[str]:
    titles = [*SECTION_HEADINGS, "Checkpoint", "Active Actors"]
    alternatives = "|".join(r"\s+".join(map(re.escape, t.split())) for t in titles)
    return re.compile(rf"^ {{0,3}}(?:{alternatives})[ \t]*$", re.I)


# A paragraph line that is one of our titles (what a setext "---" underline or an
# HTML heading would make a heading of), a setext underline, an HTML heading.
_OUR_TITLE = _title_pattern()
_SETEXT_LEVEL1 = re.compile(r"^ {0,3}=+[ \t]*$")
_SETEXT_LEVEL2 = re.compile(r"^ {0,3}-+[ \t]*$")
# An ATX heading line of level 2 to 6, empty or not.
_DEEPER_HEADING = re.compile(r"^ {0,3}#{2,6}(?:[ \t]|$)")
# A thematic break (or, under a paragraph line, a setext underline: it ends that one).
_THEMATIC_BREAK = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
# The "<" of an HTML level-1 or level-2 heading's opening tag.
_HTML_HEADING = re.compile(r"<(?=h[12](?:[\s>/]|$))", re.I)
# Whole-text scans from line break to line break (a literal first character lets
# the regex engine jump): what makes a text need no line-by-line pass
# (plain_structure, strip_level1_headings); the first line is checked apart.
_LEVEL1_LINES = re.compile(r"\n# [^#]")
_HASH_START = re.compile(r" {0,3}#")
_HASH_LINES = re.compile(r"\n {0,3}#")
_UNDERLINE_LINES = re.compile(r"\n {0,3}(?:=+|-+)[ \t]*(?=\n|\Z)")
_FENCE_START = re.compile(r" {0,3}(?:```|~~~)")
_FENCE_LINES = re.compile(r"\n {0,3}(?:```|~~~)")
# Every line break but "\n": what str.splitlines(), a browser or a model may break
# a line on although the body's own rules (which split on "\n") do not.
_OTHER_BREAKS = re.compile("\r\n?|[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def escape_breaks(text: str) -> str:
    """``text`` with every line break written as its escape (``\\n``): one line, kept readable."""
    return _LINE_BREAKS.sub(lambda m: ascii(m.group(0))[1:-1], text)


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
    return _OTHER_BREAKS.sub("\n", text)


def _escape_html_headings(line: str) -> str:
    """``line`` with the ``<`` of every ``<h1>`` and ``<h2>`` tag written as ``&lt;``.

    The body's structure has two levels: an HTML heading of either level could
    fake it (its title may even sit on the next line), so none is left to be read
    as one. Code blocks included: a Markdown reader lets an HTML block run over a
    code fence where these rules would not (an HTML sample reads fine as
    ``&lt;h1>``). An entity, not a backslash: inside an HTML block Markdown passes
    a backslash through.
    """
    return _HTML_HEADING.sub("&lt;", line) if "<" in line else line


def _kept_heading(line: str) -> bool:
    """A line that ends the paragraph under it and stays so after neutralising: a
    heading of level 2 to 6 that is not ours, or a thematic break (``---``, ``***``)."""
    if _THEMATIC_BREAK.match(line) is not None:
        return True
    return _DEEPER_HEADING.match(line) is not None and _OUR_HEADING.match(line) is None


def _forged(lines: Sequence[str], index: int, in_fence: bool) -> bool:
    """True when ``lines[index]`` could fake a heading of the body (module docstring)."""
    line = lines[index]
    if _OUR_HEADING.match(line):
        return True
    if in_fence:
        return False
    if _LEVEL1_LOOSE.match(line):
        return True
    # A setext underline: "===" makes the paragraph line above a level-1 heading,
    # "---" a level-2 one (which matters when its title is ours). Only an underline
    # looks back at its paragraph: every line doing so made a long paragraph cost
    # its length squared.
    level1 = _SETEXT_LEVEL1.match(line) is not None
    if not level1 and _SETEXT_LEVEL2.match(line) is None:
        return False
    if index == 0 or not lines[index - 1].strip():
        return False  # no paragraph above: not an underline
    if level1:
        return True
    start = index
    # A heading line this function leaves alone (level 2 to 6, not ours) ends the
    # paragraph: "## \nTasks ledger\n---" is a heading of ours under an empty one.
    # Lines it neutralises become paragraph text and join the paragraph.
    while start > 0 and lines[start - 1].strip() and not _kept_heading(lines[start - 1]):
        start -= 1
    # The heading's title is the whole paragraph above, its lines joined.
    title = " ".join(" ".join(lines[start:index]).split())
    return _OUR_TITLE.match(title) is not None


def neutralise_structure(text: str) -> str:
    """Escape lines of ``text`` that could fake the rebuild body's structure.

    See the module docstring for the rules. Idempotent: neutralising twice
    changes nothing more.

    Args:
        text: A section body (after :func:`strip_level1_headings` for file-backed
            sections).

    Returns:
        The body with offending lines prefixed by a backslash and an open code
        fence closed at the end.
    """
    if not text:
        return text
    normalised = normalise_line_breaks(text)
    if plain_structure(normalised):
        return normalised  # no line to escape, no fence to close: the lines as they are
    return _neutralise_lines(normalised)


def plain_structure(text: str) -> bool:
    """True when no line of ``text`` (line breaks normalised) can need a change.

    Whole-text scans for what any rule starts from: a line starting with ``#``
    (then checked as a heading), a setext underline, a fence, an HTML heading tag,
    ``File:``. A scan may match where no rule applies (the line-by-line pass then
    decides); it never misses a line a rule would change. The scans start at a
    line break (a literal the regex engine jumps to) and the first line is checked
    apart.
    """
    if "File:" in text or _HTML_HEADING.search(text) is not None:
        return False
    first = text[: _line_end(text, 0)]
    if _SETEXT_LEVEL1.match(first) or _SETEXT_LEVEL2.match(first) or _FENCE_START.match(first):
        return False
    if _UNDERLINE_LINES.search(text) is not None or _FENCE_LINES.search(text) is not None:
        return False
    starts = [0] if _HASH_START.match(first) else []
    starts.extend(m.start() + 1 for m in _HASH_LINES.finditer(text))
    for start in starts:
        line = text[start : _line_end(text, start)]
        if _LEVEL1_LOOSE.match(line) or _OUR_HEADING.match(line):
            return False
    return True


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _neutralise_lines(text: str) -> str:
    """:func:`neutralise_structure` line by line (the general case)."""
    lines = normalise_line_breaks(text).split("\n")
    fenced, closer = scan_fences(lines)
    out: list[str] = []
    first_content = True
    for index, (line, in_fence) in enumerate(zip(lines, fenced, strict=True)):
        forged = _forged(lines, index, in_fence) or (
            first_content and line.lstrip().startswith("File:")
        )
        if line.strip():
            first_content = False
        escaped = _escape_html_headings(line)
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
    head = f"# {escape_breaks(heading)}\n"
    if file_path is not None:
        head += f"File: {escape_breaks(file_path)}\n"
        body = strip_level1_headings(body)
    body = neutralise_structure(body.strip("\n")).strip("\n")
    return f"{head}{body}\n\n" if body else f"{head}\n"


def our_heading(line: str) -> bool:
    """Whether ``line`` is a level-1 or level-2 heading with one of our titles."""
    return _OUR_HEADING.match(line) is not None
