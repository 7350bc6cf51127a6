"""A7 head and tail are counted in UTF-16 code units, as the original does
(issue 17 item 20).

Counted in code points, a long user message full of emoji (two UTF-16 units
each, so twice the estimated tokens per character) overshot its head share and
was then cut back by tenths, keeping about 10% less than its share.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import Message, TextPart
from mimo_ctx.sections import recent_user_input
from mimo_ctx.tokens import utf16_length

CAP = 2000


def _kept(text: str) -> tuple[str, str]:
    message = Message(session_id="s", role="user", time_created=1, parts=[TextPart(text=text)])
    rendered = recent_user_input([message], budget=16_000, per_message_cap=CAP).text
    before, _, after = rendered.partition("[…elided ")
    head = before.split("\n", 2)[-1].rstrip("\n")
    tail = after.split("\n", 1)[1].split("\n\n", 1)[0] if "\n" in after else ""
    return head, tail


@pytest.mark.parametrize("unit", ["a", "é", "🙂", "𝒜b"])
def test_head_and_tail_keep_their_share_in_utf16_units(unit: str) -> None:
    head, tail = _kept(unit * 20_000)
    # floor(2000 * 0.6) * 4 and floor(2000 * 0.3) * 4 units, give or take one character.
    assert 4800 - 2 <= utf16_length(head) <= 4800
    assert 2400 - 2 <= utf16_length(tail) <= 2400


@settings(max_examples=30)
@given(st.text(st.characters(categories=("L", "So", "Nd")), min_size=1, max_size=12))
def test_no_code_point_is_split(filler: str) -> None:
    # Letters, symbols (emoji) and digits: no line break or markup to neutralise.
    text = ("🙂x" + filler) * (12_000 // len(filler) + 1)
    head, tail = _kept(text)
    assert text.startswith(head)
    assert text.endswith(tail)
    assert utf16_length(head) <= 4800
    assert utf16_length(tail) <= 2400
