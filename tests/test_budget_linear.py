"""The linear section-aware read decides exactly as the straightforward one (R6.2, A8).

:func:`mimo_ctx.budget.read_budgeted_section_aware` measures each section once
and counts with arithmetic on UTF-16 lengths (the default estimator), or counts
whole candidates (any other counter). :mod:`tests.budget_reference` keeps the
version that re-counted the assembled text for every decision; on random
documents -- headings, italic lines, index lines, fences, CRLF, non-ASCII and
astral characters, lone surrogates -- and random budgets and caps, both give the
same output, character for character.
"""

from __future__ import annotations

import re

from budget_reference import reference_section_aware
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.budget import SectionCap, SectionCaps, read_budgeted_section_aware
from mimo_ctx.tokens import CharEstimator

_LINE = st.one_of(
    st.sampled_from(
        [
            "## Alpha",
            "## 2. Beta",
            "## Active intent\r",
            "_italic description_",
            "  _indented italic_  \r",
            "_",
            "__",
            "- See checkpoint-x.md (4 items) - four",
            "- See y.md (1",
            "```",
            "```py`thon",
            "````",
            "   ~~~",
            "~~~",
            "# Title",
            "",
            " ",
            "Topic: t",
        ]
    ),
    st.text(
        alphabet=st.sampled_from(list("abc xyz_-`~#é中😀\t\r\u3000\ud83d")), min_size=0, max_size=90
    ),
)
_DOCS = st.lists(_LINE, min_size=0, max_size=70).map("\n".join)


class _WordCounter:
    """A non-linear counter: one token per word, two per digit run."""

    def count(self, text: str) -> int:
        return len(re.findall(r"[A-Za-z]+|\S", text)) + len(re.findall(r"[0-9]+", text))


class _DoubleEstimator(CharEstimator):
    """A subclass of the estimator that counts differently: not additive."""

    def count(self, text: str) -> int:
        return 2 * super().count(text) + (1 if "é" in text else 0)


def _shared_and_own(shared: int, own: int) -> SectionCaps:
    return [SectionCap(("Alpha", "Beta"), shared), SectionCap(("Active intent",), own)]


def _one_key(tokens: int) -> SectionCaps:
    return {"Alpha": tokens}


_CAPS: st.SearchStrategy[SectionCaps | None] = st.one_of(
    st.none(),
    st.builds(_shared_and_own, st.integers(0, 80), st.integers(0, 80)),
    st.builds(_one_key, st.integers(0, 80)),
)


@settings(max_examples=600, deadline=None)
@given(text=_DOCS, budget=st.integers(0, 500), caps=_CAPS)
def test_r6_2_linear_read_equals_the_reference_with_the_estimator(
    text: str, budget: int, caps: SectionCaps | None
) -> None:
    got = read_budgeted_section_aware(text, budget, path="cp.md", section_caps=caps)
    want = reference_section_aware(text, budget, path="cp.md", section_caps=caps)
    assert got == want
    explicit = read_budgeted_section_aware(
        text,
        budget,
        path="cp.md",
        counter=CharEstimator(),
        section_caps=caps,
    )
    assert explicit == want


@settings(max_examples=300, deadline=None)
@given(text=_DOCS, budget=st.integers(0, 500), caps=_CAPS)
def test_r6_2_linear_read_equals_the_reference_with_other_counters(
    text: str, budget: int, caps: SectionCaps | None
) -> None:
    for counter in (_WordCounter(), _DoubleEstimator()):
        got = read_budgeted_section_aware(
            text,
            budget,
            path="cp.md",
            counter=counter,
            section_caps=caps,
        )
        want = reference_section_aware(
            text,
            budget,
            path="cp.md",
            counter=counter,
            section_caps=caps,
        )
        assert got == want


def test_r6_2_linear_read_equals_the_reference_at_every_budget() -> None:
    """Every budget over documents whose last section ends in blank lines and spaces
    (what the notice's right-strip removes) and whose sections hold astral text."""
    body = "\n".join(f"- line {i} 😀 é {'x' * (i % 7)}" for i in range(12))
    documents = [
        f"Topic: t\n\n## Alpha\n_d_\n{body}\n## 2. Beta\n{body}\n\n   \n\t\n" + " " * 40,
        f"## Alpha\n{body}\n- See a.md (3 items)\n{body}\n```\ncode\n" + "\n" * 30,
        f"pre\n## Alpha\n_a_\n{body}\n## Beta\n_b_\n" + " \u3000" * 25,
    ]
    caps = [SectionCap(("Beta",), 30)]
    for text in documents:
        for budget in range(260):
            for section_caps in (None, caps):
                got = read_budgeted_section_aware(
                    text, budget, path="cp.md", section_caps=section_caps
                )
                want = reference_section_aware(
                    text, budget, path="cp.md", section_caps=section_caps
                )
                assert got == want, (text[:20], budget)


_WORDS = st.text(alphabet=st.sampled_from(list("ab cé中😀_`~-#\r\u3000")), min_size=0, max_size=40)


@st.composite
def _memory_files(draw: st.DrawFn) -> str:
    """Files shaped like real memory files: a preamble, then sections of many body
    lines with an italic line and index lines, fences here and there, and blank
    lines (or only spaces) at the end -- so most budgets are spent sections before
    the last one, and the sections past that point are never measured."""
    lines: list[str] = draw(st.lists(_WORDS, max_size=3))
    for number in range(draw(st.integers(1, 8))):
        lines.append(
            draw(st.sampled_from([f"## Section {number}", "## Active intent", "## Alpha"]))
        )
        if draw(st.booleans()):
            lines.append(f"_What section {number} holds._")
        for _ in range(draw(st.integers(0, 60))):
            lines.append(
                draw(
                    st.one_of(
                        _WORDS.map(lambda w: f"- {w}"),
                        _WORDS,
                        st.sampled_from(["- See topic-a.md (3 items) - more", "", "_x_"]),
                        # Rarely a fence or another odd line: a section with a fence
                        # line in it is emitted line by line.
                        st.integers(0, 9).flatmap(lambda n: _LINE if n == 0 else _WORDS),
                    )
                )
            )
    lines.extend(draw(st.lists(st.sampled_from(["", " " * 30, "\t", "  \u3000"]), max_size=8)))
    return "\n".join(lines)


@settings(max_examples=300, deadline=None)
@given(text=_memory_files(), data=st.data(), caps=_CAPS)
def test_r6_2_linear_read_equals_the_reference_on_file_shaped_documents(
    text: str, data: st.DataObject, caps: SectionCaps | None
) -> None:
    # Budgets up to half the file (in tokens): most are spent inside a section.
    budget = data.draw(st.integers(0, len(text) // 8 + 60))
    want = reference_section_aware(text, budget, path="cp.md", section_caps=caps)
    assert read_budgeted_section_aware(text, budget, path="cp.md", section_caps=caps) == want
    assert read_budgeted_section_aware(
        text, budget, path="cp.md", counter=_WordCounter(), section_caps=caps
    ) == reference_section_aware(
        text, budget, path="cp.md", counter=_WordCounter(), section_caps=caps
    )
