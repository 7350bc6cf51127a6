"""The forged-structure check costs each line once, not its paragraph (module sections).

:func:`mimo_ctx.sections.neutralise_structure` used to look back over the whole
paragraph above every line (a body of one long paragraph cost its length
squared: a budgeted 1 MB notes file took seconds). Only a setext underline looks
back now; on random bodies -- paragraphs, ``===`` / ``---`` underlines under our
titles and others, fences, level-1 headings -- the output is the first
definition's, character for character.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import _structure
from mimo_ctx.budget import scan_fences


def _forged_reference(lines: Sequence[str], index: int, in_fence: bool) -> bool:
    """The first definition: every line joins the paragraph above it."""
    line = lines[index]
    if _structure._OUR_HEADING.match(line):  # pyright: ignore[reportPrivateUsage]
        return True
    if in_fence:
        return False
    if _structure._LEVEL1_LOOSE.match(line):  # pyright: ignore[reportPrivateUsage]
        return True
    if index == 0 or not lines[index - 1].strip():
        return False
    if _structure._SETEXT_LEVEL1.match(line) is not None:  # pyright: ignore[reportPrivateUsage]
        return True
    # The paragraph: the lines above up to a blank line or a heading line that
    # neutralising keeps (level 2 to 6, not one of ours).
    start = index
    while start > 0 and lines[start - 1].strip() and not _stays_a_heading(lines[start - 1]):
        start -= 1
    title = " ".join(" ".join(lines[start:index]).split())
    return (
        _structure._SETEXT_LEVEL2.match(line) is not None  # pyright: ignore[reportPrivateUsage]
        and _structure._OUR_TITLE.match(title) is not None  # pyright: ignore[reportPrivateUsage]
    )


def _stays_a_heading(line: str) -> bool:
    marks = line.strip(" \t")
    if (
        len(line) - len(line.lstrip(" ")) <= 3
        and len(marks.replace(" ", "").replace("\t", "")) >= 3
    ):
        chars = set(marks.replace(" ", "").replace("\t", ""))
        if len(chars) == 1 and chars <= {"-", "*", "_"}:
            return True  # a thematic break
    stripped = (
        line[len(line) - len(line.lstrip(" ")) :] if len(line) - len(line.lstrip(" ")) <= 3 else ""
    )
    hashes = len(stripped) - len(stripped.lstrip("#"))
    after = stripped[hashes : hashes + 1]
    return (
        2 <= hashes <= 6
        and after in ("", " ", "\t")
        and _structure._OUR_HEADING.match(line) is None  # pyright: ignore[reportPrivateUsage]
    )


_LINES = st.sampled_from(
    [
        "Recent activity",
        "Session",
        "checkpoint",
        "Tasks ledger",
        "plain words",
        "===",
        "  ===  ",
        "---",
        "- - -",
        "----------",
        "",
        "   ",
        "```",
        "~~~",
        "# Title",
        "#Title",
        "## Checkpoint",
        "## ",
        "***",
        "_ _ _",
        "### Notes",
        "# Recent activity",
        "File: x",
        "<h1>x</h1>",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_LINES, max_size=40))
def test_forged_lines_equal_the_paragraph_definition(lines: list[str]) -> None:
    fenced, _ = scan_fences(lines)
    for index, in_fence in enumerate(fenced):
        assert _structure._forged(lines, index, in_fence) == _forged_reference(  # pyright: ignore[reportPrivateUsage]
            lines, index, in_fence
        ), (lines, index)
