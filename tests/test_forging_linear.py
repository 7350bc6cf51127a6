"""The forged-structure check costs each line once, not its paragraph (module sections).

:func:`mimo_ctx.sections.neutralise_structure` used to look back over the whole
paragraph above every line (a body of one long paragraph cost its length
squared: a budgeted 1 MB notes file took seconds). Only a setext underline looks
back now, and only as far as the longest of our titles reaches; on random bodies
-- paragraphs, ``===`` / ``---`` underlines under our titles and others, fences,
level-1 headings, list items and quotes -- the answer is that of the rules
without a bound, line for line.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import _structure as sections
from mimo_ctx.budget import scan_fences


def _forged_reference(lines: Sequence[str], index: int, in_fence: bool, under_text: bool) -> bool:
    """The rules with no bound: an underline joins every run of lines above it."""
    line = lines[index]
    if sections._OUR_HEADING.match(line):  # pyright: ignore[reportPrivateUsage]
        return True
    if in_fence:
        return False
    inner = sections._in_container(line)  # pyright: ignore[reportPrivateUsage]
    if sections._LEVEL1_LOOSE.match(inner) or sections._OUR_HEADING.match(inner):  # pyright: ignore[reportPrivateUsage]
        return True
    level1 = any(sections._SETEXT_LEVEL1.match(t) for t in (line, inner))  # pyright: ignore[reportPrivateUsage]
    level2 = any(sections._SETEXT_LEVEL2.match(t) for t in (line, inner))  # pyright: ignore[reportPrivateUsage]
    if not (level1 or level2):
        return False
    start = index
    while start > 0 and lines[start - 1].strip():
        start -= 1
    if start == index:
        return level1 and index == 0 and under_text
    if level1:
        return True
    return any(
        sections._OUR_TITLE.match(  # pyright: ignore[reportPrivateUsage]
            " ".join(" ".join([sections._in_container(lines[k]), *lines[k + 1 : index]]).split())  # pyright: ignore[reportPrivateUsage]
        )
        for k in range(start, index)
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
        "Recent",
        "activity",
        "- Recent activity",
        "> Active actors",
        "> ---",
        "- ",
        "1. # x",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_LINES, max_size=40), st.booleans())
def test_forged_lines_equal_the_paragraph_definition(lines: list[str], under_text: bool) -> None:
    fenced, _ = scan_fences(lines)
    for index, in_fence in enumerate(fenced):
        got = sections._forged(lines, index, in_fence, under_text=under_text)  # pyright: ignore[reportPrivateUsage]
        assert got == _forged_reference(lines, index, in_fence, under_text), (lines, index)
