"""The draft check looks characters up in the Unicode database only outside ASCII.

:func:`mimo_ctx.checkpoint.document.checkpoint_defect` runs on the event loop
after every writer run, over the draft and every spill-over file, and spill-over
files grow with the session: it used to call ``unicodedata.category`` twice per
character (5 ms per run at 26k characters in the soak, most of a p95 turn). It
finds control characters with one regular expression now and consults the
database for non-ASCII characters only; on random text -- ASCII, controls,
replacement, private-use, unassigned and surrogate code points, CJK, emoji --
its answer is the first definition's, word for word.
"""

from __future__ import annotations

import unicodedata
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.checkpoint import document
from mimo_ctx.checkpoint.document import checkpoint_defect, missing_sections

_ALLOWED = frozenset("\t\n\r")


def _defect_reference(text: str, *, sections: bool = True) -> str | None:
    """The first definition: two Unicode-database lookups per character."""
    if not text.strip():
        return "it is empty"
    for offset, char in enumerate(text):
        if char not in _ALLOWED and unicodedata.category(char) == "Cc":
            count = sum(1 for c in text if c not in _ALLOWED and unicodedata.category(c) == "Cc")
            return (
                f"it holds {count} control character(s) (U+{ord(char):04X} first, at "
                f"offset {offset}): not Markdown text"
            )
    unreadable = sum(
        1 for c in text if c == "\ufffd" or unicodedata.category(c) in ("Cn", "Co", "Cs")
    )
    if unreadable > len(text) * 0.02:
        return (
            f"{unreadable} of its {len(text)} characters are unreadable (replacement, "
            "unassigned or private-use): not text"
        )
    if sections:
        missing = missing_sections(text)
        if missing:
            return "it lacks the sections " + ", ".join(missing)
    return None


_CHARS = st.one_of(
    st.sampled_from(["a", " ", "\n", "\t", "\r", "#", "-", "é", "日", "🙂"]),
    st.sampled_from(["\x00", "\x07", "\x0b", "\x1f", "\x7f", "\x85", "\x9f", "\xa0"]),
    st.sampled_from(["\ufffd", "\ue000", "\U000f0000", "\u0378", "\U000e0080", "\ud800"]),
    st.characters(),
)


def test_control_characters_are_exactly_category_cc() -> None:
    """The expression matches the Unicode database's Cc set, tab and line ends aside."""
    expected = {chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"} - _ALLOWED
    matched = {chr(c) for c in range(0x110000) if document._CONTROL.match(chr(c))}  # pyright: ignore[reportPrivateUsage]
    assert matched == expected


@settings(max_examples=400, deadline=None)
@given(st.lists(_CHARS, max_size=80).map("".join), st.booleans())
def test_same_answer_as_the_first_definition(text: str, sections: bool) -> None:
    assert checkpoint_defect(text, sections=sections) == _defect_reference(text, sections=sections)


@settings(max_examples=100, deadline=None)
@given(st.lists(_CHARS, max_size=40).map("".join))
def test_same_answer_on_a_real_checkpoint_with_noise(noise: str) -> None:
    draft = _real_checkpoint()
    assert missing_sections(draft) == []
    for text in (draft + noise, noise + draft):
        assert checkpoint_defect(text) == _defect_reference(text)


def _real_checkpoint() -> str:
    sections = [s.title for s in document.CHECKPOINT_SECTIONS]
    numbers = [s.number for s in document.CHECKPOINT_SECTIONS]
    return "Topic: t\n\n" + "\n\n".join(
        f"## {n}. {title}\n_instruction_\n(none)"
        for n, title in zip(numbers, sections, strict=True)
    )


def test_ascii_text_is_not_looked_up_character_by_character(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def category(char: str) -> str:
        calls.append(char)
        return unicodedata.category(char)

    monkeypatch.setattr(document, "unicodedata", SimpleNamespace(category=category))
    spill = "- an error and its fix, item after item\n" * 2_000
    assert checkpoint_defect(spill, sections=False) is None
    assert calls == []
    assert checkpoint_defect(spill + "日本語 é", sections=False) is None
    assert len(calls) == 4  # the non-ASCII characters only
