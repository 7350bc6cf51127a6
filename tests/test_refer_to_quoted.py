"""The quote pointers of the checkpoint section (issue 14) cost the quoting lines only.

:func:`mimo_ctx.checkpoint.sections.refer_to_quoted` looks only at the lines
that name a user message and copies the rest in slices; on random checkpoints --
§1 quote blocks, inline quotes, quote lines without a header, ids wanted or not --
it gives exactly what the line-by-line definition gives.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.checkpoint.sections import QUOTE_HEADER, refer_to_quoted

_INLINE = re.compile(r'\(user message (?P<id>[^)\s]+)\): ".*"$')
_QUOTE = re.compile(r"^  (?:>|\[…elided )")


def _reference(text: str, quoted: Collection[str], where: str) -> str:
    """The line-by-line definition (the first implementation)."""
    if not quoted:
        return text
    wanted = set(quoted)
    out: list[str] = []
    skipping = False
    for line in text.split("\n"):
        if skipping and _QUOTE.match(line):
            continue
        skipping = False
        header = QUOTE_HEADER.match(line)
        if header is not None and header.group("id") in wanted:
            out.append(
                f"- {header.group('label')} (user message {header.group('id')}): "
                f"quoted under {where}"
            )
            skipping = True
            continue
        inline = _INLINE.search(line)
        if inline is not None and inline.group("id") in wanted:
            out.append(
                line[: inline.start()]
                + f"(user message {inline.group('id')}): quoted under {where}"
            )
        else:
            out.append(line)
    return "\n".join(out)


_LINES = st.sampled_from(
    [
        "- Request (user message msg_a):",
        "- Request (user message msg_b):",
        "- Earlier ask (user message msg_c):",
        "  > do the thing",
        '  > (user message msg_a): "nested"',
        "  […elided 12 tokens]",
        "   > three spaces",
        '- Asked (user message msg_a): "fix the bug"',
        '- Asked (user message msg_b): "x" and (user message msg_a): "y"',
        "(user message msg_c): no quote",
        "## 1. Active intent",
        "plain line",
        "",
        " ",
        "\r",
    ]
)


@settings(max_examples=500, deadline=None)
@given(
    lines=st.lists(_LINES, max_size=30),
    quoted=st.sets(st.sampled_from(["msg_a", "msg_b", "msg_c", "msg_z"]), max_size=3),
)
def test_refer_to_quoted_equals_the_line_by_line_definition(
    lines: list[str], quoted: set[str]
) -> None:
    text = "\n".join(lines)
    assert refer_to_quoted(text, quoted, "# Recent user input") == _reference(
        text, quoted, "# Recent user input"
    )
