"""The section-aware reader's parse and emit against straightforward per-line references.

:func:`mimo_ctx.budget.read_budgeted_section_aware` splits a file into its
skeleton (R6.2: headings, the first italic line of each section, index lines)
and bodies with fast paths (no fence characters, slice-wise emission); these
properties check them against the plain per-line definitions, fences included.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import _skeleton, budget
from mimo_ctx.budget import scan_fences

_LINES = st.sampled_from(
    [
        "## Rules",
        "## Active intent\r",
        "_What this holds._",
        "  _indented italic_  ",
        "- See topic-a.md (12 items) - details",
        "- See x.md (3",
        "- plain bullet",
        "```python",
        "```",
        "   ~~~~",
        "~~~",
        "````` ",
        "text with ``` inside",
        "",
        "a line of prose",
        "# Title",
    ]
)


def _is_italic(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) > 1 and stripped[0] == "_" and stripped[-1] == "_"


def _reference_parse(lines: list[str]) -> tuple[list[str], list[tuple[str, list[str], list[bool]]]]:
    fenced, _ = scan_fences(lines)
    preamble: list[str] = []
    sections: list[tuple[str, list[str], list[bool]]] = []
    seen_italic = False
    for line, in_fence in zip(lines, fenced, strict=True):
        if not in_fence and line.startswith("## "):
            sections.append((line.rstrip("\r"), [line], [True]))
            seen_italic = False
            continue
        if not sections:
            preamble.append(line)
            continue
        skeleton = False
        if not in_fence:
            if not seen_italic and _is_italic(line):
                skeleton = seen_italic = True
            elif budget._INDEX_LINE.match(line):  # pyright: ignore[reportPrivateUsage]
                skeleton = True
        sections[-1][1].append(line)
        sections[-1][2].append(skeleton)
    return preamble, sections


def _reference_emit(lines: list[str], skeleton: list[bool], kept: list[str]) -> str:
    out: list[str] = []
    index = 0
    after_body = -1
    for line, skel in zip(lines, skeleton, strict=True):
        if skel:
            out.append(line)
            continue
        if index < len(kept):
            out.append(kept[index])
            after_body = len(out)
        index += 1
    if after_body >= 0:
        _, closer = scan_fences(out[:after_body])
        if closer:
            out.insert(after_body, closer)
    return "\n".join(out)


def _mask(section: _skeleton.Section) -> list[bool]:
    """Per line of the section, whether it is a skeleton line (from its slices)."""
    mask = [False] * len(section.lines)
    for number, (before, _, _) in enumerate(section.skeleton):
        mask[before + number] = True
    return mask


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINES, max_size=40), st.data())
def test_r6_2_parse_and_emit_match_the_per_line_definition(
    lines: list[str], data: st.DataObject
) -> None:
    text = "\n".join(lines)
    preamble, sections = _skeleton.parse(text)
    want_preamble, want_sections = _reference_parse(text.split("\n"))
    if want_sections:
        assert preamble == ("\n".join(want_preamble) if want_preamble else None)
    assert [(s.heading, s.lines, _mask(s)) for s in sections] == want_sections
    for section in sections:
        body = [line for line, skel in zip(section.lines, _mask(section), strict=True) if not skel]
        assert section.body == "\n".join(body)
        assert section.body_lines == len(body)
        assert [line for _, _, line in section.skeleton] == [
            line for line, skel in zip(section.lines, _mask(section), strict=True) if skel
        ]
        # A kept prefix of the body, its last line possibly cut short (as _shrink does).
        keep = data.draw(st.integers(0, len(body)))
        kept = body[:keep]
        if kept and data.draw(st.booleans()):
            kept[-1] = kept[-1][: data.draw(st.integers(0, len(kept[-1])))]
        assert budget._emit(section, "\n".join(kept), len(kept)) == _reference_emit(  # pyright: ignore[reportPrivateUsage]
            section.lines, _mask(section), kept
        )
