"""Tests of the budgeted reads (SPEC R6.1, R6.2, A8, R5.10)."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mimo_ctx.budget import (
    CUT_THRESHOLD_TOKENS,
    SectionCap,
    checkpoint_section_caps,
    heading_matches,
    read_budgeted,
    read_budgeted_section_aware,
    scan_fences,
)
from mimo_ctx.checkpoint import CHECKPOINT_SECTIONS
from mimo_ctx.config import PushCaps
from mimo_ctx.errors import ConfigError
from mimo_ctx.tokens import estimate_text_tokens as tok


class _WordCounter:
    """A non-linear counter (roughly a tokenizer): one token per word, two per digit run."""

    def count(self, text: str) -> int:
        return len(re.findall(r"[A-Za-z]+|\S", text)) + len(re.findall(r"[0-9]+", text))


def _lines(n: int, width: int = 16) -> str:
    return "".join(f"line {i:02d} ".ljust(width, "x") + "\n" for i in range(n))


# -- read_budgeted (R6.1, A8) ---------------------------------------------------------


def test_r6_1_text_that_fits_is_unchanged() -> None:
    text = _lines(3)
    assert read_budgeted(text, tok(text), path="notes.md") == text
    assert read_budgeted("", 0, path="notes.md") == ""


def test_r6_1_golden_cut_at_last_newline_with_resume_offset() -> None:
    text = _lines(20)  # 20 lines of 17 characters: 340 characters, 85 tokens
    assert tok(text) == 85
    # floor(340 * 20/85 * 0.95) = 76; the last newline at or before 76 is at 67.
    expected = (
        "line 00 xxxxxxxx\nline 01 xxxxxxxx\nline 02 xxxxxxxx\nline 03 xxxxxxxx\n\n"
        "[notes.md was cut to fit its 20-token budget: the whole file is about 85 tokens. "
        "Continue reading at character offset 68.]"
    )
    assert read_budgeted(text, 20, path="notes.md") == expected
    assert text[68:].startswith("line 04")


def test_r6_1_without_newline_cuts_at_the_point() -> None:
    text = "a" * 400  # 100 tokens
    out = read_budgeted(text, 10, path="n.md")
    # floor(400 * 10/100 * 0.95) = 38
    assert out == (
        "a" * 38 + "\n\n[n.md was cut to fit its 10-token budget: the whole file is about "
        "100 tokens. Continue reading at character offset 38.]"
    )


def test_r6_1_budget_zero_gives_the_notice_alone() -> None:
    out = read_budgeted(_lines(5), 0, path="n.md")
    assert out.startswith("[n.md was cut")
    assert "offset 0." in out
    assert "\n" not in out


def test_r6_1_cut_inside_a_fence_closes_it() -> None:
    text = "intro\n```python\n" + "x = 1\n" * 60 + "```\nafter\n"
    out = read_budgeted(text, 20, path="n.md")
    head = out.split("\n\n[")[0]
    assert head.endswith("\n```")
    _, closer = scan_fences(head.split("\n"))
    assert closer is None


def test_r6_1_path_line_breaks_cannot_start_a_line() -> None:
    out = read_budgeted(_lines(20), 5, path="evil\n# Recent activity")
    assert "\n# Recent activity" not in out
    assert "evil\\n# Recent activity" in out


def test_r6_1_negative_budget_is_rejected() -> None:
    with pytest.raises(ConfigError, match="budget must be a non-negative"):
        read_budgeted("x", -1, path="n.md")
    with pytest.raises(ConfigError, match="budget"):
        read_budgeted_section_aware("x", -5, path="n.md")


_TEXT = st.text(alphabet=st.sampled_from(list("ab cd\n\n`~#_-é😀")), min_size=0, max_size=600)


@given(text=_TEXT, budget=st.integers(0, 200))
def test_r6_1_property_budget_and_resume_offset(text: str, budget: int) -> None:
    out = read_budgeted(text, budget, path="n.md")
    if tok(text) <= budget:
        assert out == text
        return
    notice = out.rsplit("\n", 1)[-1]
    assert notice.startswith("[n.md was cut")
    assert tok(out) <= budget + tok(notice)
    found = re.search(r"offset (\d+)\.\]$", notice)
    assert found is not None
    offset = int(found.group(1))
    head = out[: -len(notice)].removesuffix("\n\n")
    _, closer = scan_fences(head.split("\n"))
    assert closer is None
    # The head is the text up to the offset (minus the newline the cut stood on and
    # trailing blanks), possibly followed by one closing fence line.
    shown = text[:offset].removesuffix("\n")
    assert head == shown.rstrip() or head.startswith(shown + "\n") or not shown.strip()


@settings(max_examples=50)
@given(text=_TEXT, budget=st.integers(0, 100))
def test_r6_1_property_nonlinear_counter(text: str, budget: int) -> None:
    counter = _WordCounter()
    out = read_budgeted(text, budget, path="n.md", counter=counter)
    if counter.count(text) <= budget:
        assert out == text
    else:
        notice = out.rsplit("\n", 1)[-1]
        assert counter.count(out) <= budget + counter.count(notice)


# -- read_budgeted_section_aware (R6.2, A8) ------------------------------------------------

_DOC = """\
Topic: budgets
# Checkpoint
## 1. Active intent
_The user's words._
alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha
bravo bravo bravo bravo bravo bravo bravo bravo bravo bravo
## 2. Next concrete action
_What to do next._
delta delta delta delta delta delta delta delta delta delta
- See checkpoint-ports.md (3 items) - ports in use
echo 1 echo echo echo echo echo echo echo echo echo echo echo
echo 2 echo echo echo echo echo echo echo echo echo echo echo
echo 3 echo echo echo echo echo echo echo echo echo echo echo
echo 4 echo echo echo echo echo echo echo echo echo echo echo
echo 5 echo echo echo echo echo echo echo echo echo echo echo
## 3. Open notes
_Loose ends._
foxtrot foxtrot foxtrot foxtrot foxtrot foxtrot foxtrot foxtrot
"""
_SKELETON = (
    "Topic: budgets\n"
    "# Checkpoint\n"
    "## 1. Active intent\n"
    "_The user's words._\n"
    "## 2. Next concrete action\n"
    "_What to do next._\n"
    "- See checkpoint-ports.md (3 items) - ports in use\n"
    "## 3. Open notes\n"
    "_Loose ends._"
)


def test_r6_2_text_that_fits_is_unchanged() -> None:
    assert read_budgeted_section_aware(_DOC, tok(_DOC), path="cp.md") == _DOC
    assert read_budgeted_section_aware("", 0, path="cp.md") == ""


def test_r6_2_golden_fill_in_document_order() -> None:
    # Skeleton 49 tokens; section 1's body (30) fits; section 2's (92) does not
    # and about 70 tokens remain, so it is cut to floor(369 * 70/92 * 0.95)
    # characters back to a line end -- its index line stays, in its place;
    # section 3's body no longer fits and is dropped (< 50 tokens remain).
    assert (tok(_DOC), len(_DOC), tok(_SKELETON)) == (188, 750, 49)
    out = read_budgeted_section_aware(_DOC, 150, path="cp.md")
    assert out == (
        "Topic: budgets\n"
        "# Checkpoint\n"
        "## 1. Active intent\n"
        "_The user's words._\n"
        "alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha\n"
        "bravo bravo bravo bravo bravo bravo bravo bravo bravo bravo\n"
        "## 2. Next concrete action\n"
        "_What to do next._\n"
        "delta delta delta delta delta delta delta delta delta delta\n"
        "- See checkpoint-ports.md (3 items) - ports in use\n"
        "echo 1 echo echo echo echo echo echo echo echo echo echo echo\n"
        "echo 2 echo echo echo echo echo echo echo echo echo echo echo\n"
        "echo 3 echo echo echo echo echo echo echo echo echo echo echo\n"
        "## 3. Open notes\n"
        "_Loose ends._\n"
        "\n"
        "[Parts of cp.md are not shown (budget 150 tokens; the whole file is about 188 "
        "tokens, 750 characters). Grep the file for anything missing.]"
    )


def test_r6_2_a_later_small_body_fills_what_is_left() -> None:
    # Section 2's body does not fit and < 50 tokens remain: dropped; section 3's
    # small body still fits after it.
    out = read_budgeted_section_aware(_DOC, 100, path="cp.md")
    assert "echo" not in out
    assert "delta" not in out
    assert "## 3. Open notes\n_Loose ends._\nfoxtrot foxtrot" in out


def test_r6_2_golden_skeleton_only_when_it_fills_the_budget() -> None:
    out = read_budgeted_section_aware(_DOC, 49, path="cp.md")
    assert out == (
        _SKELETON + "\n\n"
        "[Only the structure of cp.md is shown: its headings, descriptions and index lines "
        "fill the 49-token budget (the whole file is about 188 tokens). Grep the file for "
        "section bodies.]"
    )
    assert read_budgeted_section_aware(_DOC, 50, path="cp.md").startswith(
        _SKELETON + "\n\n[Parts of cp.md"
    )


def test_r6_2_budget_zero_gives_the_skeleton() -> None:
    out = read_budgeted_section_aware(_DOC, 0, path="cp.md")
    assert out.startswith("Topic: budgets\n# Checkpoint\n## 1. Active intent\n")
    assert "[Only the structure of cp.md" in out
    assert "alpha" not in out


def test_r6_2_body_is_cut_only_when_more_than_50_tokens_remain() -> None:
    body = "word " * 400  # one long line per section: 500 tokens
    doc = f"## A\n{body}\n## B\n{body}\n"
    skeleton_tokens = tok("## A\n## B")
    # Exactly 50 tokens remain after the skeleton (charging the notice separator):
    # the body is dropped, not cut.
    out = read_budgeted_section_aware(doc, skeleton_tokens + 1 + CUT_THRESHOLD_TOKENS, path="d")
    assert "word" not in out
    # 60 tokens remain: section A's body is cut (at the point, it has no newline).
    out = read_budgeted_section_aware(doc, skeleton_tokens + 1 + 60, path="d")
    kept = out.split("\n")[1]
    assert kept.startswith("word word")
    assert len(kept) < len(body)
    assert out.split("\n")[2] == "## B"


def test_r6_2_later_sections_keep_skeleton_and_may_fill_small_bodies() -> None:
    doc = "## Big\n_big one_\n" + "long line of text here\n" * 100 + "## Small\n_small one_\ntiny\n"
    out = read_budgeted_section_aware(doc, 200, path="d.md")
    assert "## Small\n_small one_\n" in out
    # Section Big was cut to ~95% of what remained; the 5% left fits "tiny".
    assert "## Small\n_small one_\ntiny\n" in out


def test_r6_2_heading_inside_fence_is_not_a_section() -> None:
    doc = "## Real\n_desc_\n```md\n## Fake\n_not italic_\n- See x.md (1 item)\n```\n" + (
        "filler words here\n" * 50
    )
    out = read_budgeted_section_aware(doc, 20, path="d.md")
    # Only the real heading and its italic line form the skeleton.
    assert out.startswith("## Real\n_desc_\n")
    assert "## Fake" not in out
    assert "- See x.md" not in out


def test_r6_2_cut_inside_fence_is_closed_before_later_sections() -> None:
    doc = "## A\n```\n" + "code code code code\n" * 80 + "```\n## B\n_b_\nbee\n"
    out = read_budgeted_section_aware(doc, 200, path="d.md")
    before_b = out.split("## B")[0]
    _, closer = scan_fences(before_b.rstrip("\n").split("\n"))
    assert closer is None
    assert "\n```\n## B\n_b_\n" in out


def test_r6_2_only_first_italic_line_is_skeleton() -> None:
    doc = "## A\n_first_\n_second_\n" + "text text text text\n" * 40
    out = read_budgeted_section_aware(doc, 3, path="d.md")
    assert out.startswith("## A\n_first_\n\n[Only the structure")


def test_r6_2_text_without_headings_reads_proportionally() -> None:
    text = _lines(20)
    assert read_budgeted_section_aware(text, 20, path="n.md") == read_budgeted(
        text, 20, path="n.md"
    )


def test_a8_beyond_whole_skeleton_reserved_before_bodies() -> None:
    # The original counted `remaining` incrementally: after cutting section 1 it
    # still emitted every later skeleton and overshot. Many index lines later on
    # make that overshoot large; ours stays within the budget plus the notice.
    index = "".join(f"- See checkpoint-topic{i}.md ({i} items) - summary {i}\n" for i in range(30))
    doc = "## 1. First\n" + "body words here\n" * 200 + "## 2. Second\n" + index
    budget = tok(index) + 150
    out = read_budgeted_section_aware(doc, budget, path="cp.md")
    notice = out.rsplit("\n", 1)[-1]
    assert tok(out) <= budget + tok(notice)
    assert index.rstrip("\n") in out


# -- section caps (R5.10 beyond) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "heading",
    [
        "## Active intent",
        "## 1. Active intent",
        "## §1 Active intent",
        "## § 1. ACTIVE   intent",
        "## 1) Active intent (quoted)",
        "## 1 - Active intent",
        "Active intent",
    ],
)
def test_r5_10_heading_matches_tolerates_numbers_and_case(heading: str) -> None:
    assert heading_matches(heading, "Active intent")
    assert heading_matches(heading, "## 1. active intent")


def test_r5_10_heading_matches_needs_a_word_boundary() -> None:
    assert not heading_matches("## Active intents", "Active intent")
    assert not heading_matches("## Next concrete action", "Active intent")
    assert heading_matches("## 10. Design decisions and discussion outcomes", "Design decisions")


def test_r5_10_checkpoint_section_caps_select_the_a14_sections() -> None:
    caps = checkpoint_section_caps(PushCaps(focus_task=11, design_decisions=22, open_notes=33))
    assert caps == (
        SectionCap(("Active intent", "Next concrete action"), 11),
        SectionCap(("Design decisions",), 22),
        SectionCap(("Open notes",), 33),
    )
    capped = {
        s.number
        for s in CHECKPOINT_SECTIONS
        if any(heading_matches(s.heading, k) for cap in caps for k in cap.headings)
    }
    assert capped == {1, 2, 10, 11}


def test_r5_10_mapping_cap_cuts_a_section_even_when_the_file_fits() -> None:
    out = read_budgeted_section_aware(_DOC, 10_000, path="cp.md", section_caps={"Open notes": 5})
    # Body "foxtrot ...\n" is 64 characters, 16 tokens: floor(64 * 5/16 * 0.95) = 19
    # characters, cut at the point (no newline before it).
    assert "## 3. Open notes\n_Loose ends._\nfoxtrot foxtrot fox\n\n[Parts of cp.md" in out
    assert "alpha alpha" in out
    assert "echo 5 echo" in out
    assert out.endswith("Grep the file for anything missing.]")
    # Without caps (or with roomy caps) the same budget returns the file unchanged.
    assert (
        read_budgeted_section_aware(_DOC, 10_000, path="cp.md", section_caps={"Directives": 5})
        == _DOC
    )


def test_r5_10_cap_zero_drops_the_body_but_keeps_the_skeleton() -> None:
    out = read_budgeted_section_aware(
        _DOC, 10_000, path="cp.md", section_caps=[SectionCap(("Next concrete action",), 0)]
    )
    assert "delta" not in out
    assert "echo" not in out
    assert "## 2. Next concrete action\n_What to do next._\n- See checkpoint-ports.md" in out


def test_r5_10_shared_cap_fills_section_1_first_then_section_2() -> None:
    doc = (
        "## 1. Active intent\n_i_\n" + "one one one one one one\n" * 10 + "## 2. Next concrete "
        "action\n_n_\n" + "two two two two two two\n" * 10 + "## 3. Directives\n_d_\nthree\n"
    )
    body_tokens = tok("one one one one one one\n" * 9 + "one one one one one one")
    # The shared cap holds section 1 whole; section 2 gets what is left (cut).
    caps = checkpoint_section_caps(PushCaps(focus_task=body_tokens + 30))
    out = read_budgeted_section_aware(doc, 10_000, path="cp.md", section_caps=caps)
    assert out.count("one one one one one one") == 10
    twos = out.count("two two two two two two")
    assert 0 < twos < 10
    assert tok("\n".join(["two two two two two two"] * twos)) <= 30
    assert "## 3. Directives\n_d_\nthree" in out


def test_r5_10_invalid_caps_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"SectionCap\.tokens"):
        SectionCap(("A",), -1)
    with pytest.raises(ConfigError, match="non-empty tuple"):
        SectionCap((), 1)
    with pytest.raises(ConfigError, match="non-empty tuple"):
        # A bare string instead of a tuple on purpose: the runtime check names it.
        SectionCap("Active intent", 1)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ConfigError, match="empty heading"):
        SectionCap(("## 1. ",), 1)
    with pytest.raises(ConfigError, match="SectionCap objects"):
        # Plain tuples instead of SectionCap objects on purpose: refused by name.
        read_budgeted_section_aware(_DOC, 1, path="x", section_caps=[("A", 1)])  # pyright: ignore[reportArgumentType]


# -- properties -----------------------------------------------------------------------------

_LINE = st.one_of(
    st.sampled_from(
        [
            "## Alpha",
            "## 2. Beta",
            "_italic description_",
            "- See checkpoint-x.md (4 items) - four",
            "```",
            "# Title",
            "",
            "Topic: t",
        ]
    ),
    st.text(alphabet=st.sampled_from(list("abc xyz_-é😀")), min_size=0, max_size=80),
)
_DOCS = st.lists(_LINE, min_size=0, max_size=60).map("\n".join)


def _reference_skeleton(text: str) -> list[str] | None:
    """An independent reading of the skeleton rule (the generator only uses ``` fences)."""
    skeleton: list[str] = []
    in_fence = False
    in_section = False
    seen_italic = False
    for line in text.split("\n"):
        if line.startswith("```"):
            in_fence = not in_fence
            if in_section:
                continue
        if not in_fence and line.startswith("## "):
            in_section, seen_italic = True, False
            skeleton.append(line)
        elif not in_section:
            skeleton.append(line)
        elif in_fence:
            continue
        elif (
            not seen_italic and len(line.strip()) > 1 and line.strip()[0] == line.strip()[-1] == "_"
        ):
            seen_italic = True
            skeleton.append(line)
        elif re.match(r"^- See \S+\.md \(\d+", line):
            skeleton.append(line)
    return skeleton if in_section else None


def _is_subsequence(needles: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


def _kept(skeleton: list[str]) -> list[str]:
    """The skeleton lines as the output keeps them: the read ends the kept text with its
    trailing whitespace dropped (the last line's trailing spaces included) before the
    notice."""
    return "\n".join(skeleton).rstrip().split("\n")


@settings(max_examples=300)
@given(text=_DOCS, budget=st.integers(0, 400))
def test_r6_2_property_skeleton_kept_and_budget_respected(text: str, budget: int) -> None:
    out = read_budgeted_section_aware(text, budget, path="cp.md")
    skeleton = _reference_skeleton(text)
    if tok(text) <= budget:
        assert out == text
        return
    if skeleton is None:  # no sections: proportional read
        assert out == read_budgeted(text, budget, path="cp.md")
        return
    assert _is_subsequence(_kept(skeleton), out.split("\n"))
    notice = out.rsplit("\n", 1)[-1]
    assert notice.startswith(("[Parts of cp.md", "[Only the structure of cp.md"))
    if tok("\n".join(skeleton)) < budget:
        assert tok(out) <= budget + tok(notice)
    else:
        kept = "\n".join(skeleton).rstrip()
        assert out == (f"{kept}\n\n{notice}" if kept else notice)


@settings(max_examples=200)
@given(text=_DOCS, budget=st.integers(0, 400), cap=st.integers(0, 60))
# Found by Hypothesis: an italic line with a trailing space ends the file; the kept
# text drops that space before the notice.
@example(text="## Alpha\n__ ", budget=0, cap=0)
def test_r5_10_property_caps_hold_and_budget_respected(text: str, budget: int, cap: int) -> None:
    caps = [SectionCap(("Alpha", "Beta"), cap)]
    out = read_budgeted_section_aware(text, budget, path="cp.md", section_caps=caps)
    skeleton = _reference_skeleton(text)
    if skeleton is None:
        return
    kept = _kept(skeleton)
    assert _is_subsequence(kept, out.split("\n"))
    notice = out.rsplit("\n", 1)[-1]
    if tok("\n".join(skeleton)) < budget:
        assert tok(out) <= budget + tok(notice)
    # The bodies of the capped sections together stay within the shared cap. Per
    # section, allow one token for a closing fence line the cut may add and one
    # for the blank line before the notice.
    used = 0
    capped_sections = 0
    body: list[str] | None = None
    fence = False
    for line in [*out.split("\n"), "## end"]:
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("## "):
            if body:
                used += tok("\n".join(body))
            capped = line in ("## Alpha", "## 2. Beta")
            capped_sections += capped
            body = [] if capped else None
            continue
        if body is not None and line not in kept and line != notice:
            body.append(line)
    assert used <= cap + 2 * capped_sections


@settings(max_examples=100)
@given(text=_DOCS, budget=st.integers(51, 400))
def test_r6_2_property_nonlinear_counter_budget(text: str, budget: int) -> None:
    counter = _WordCounter()
    out = read_budgeted_section_aware(text, budget, path="cp.md", counter=counter)
    skeleton = _reference_skeleton(text)
    if skeleton is None or counter.count("\n".join(skeleton)) >= budget:
        return
    if counter.count(text) <= budget:
        assert out == text
        return
    notice = out.rsplit("\n", 1)[-1]
    assert counter.count(out) <= budget + counter.count(notice)
