"""The rebuild boundary's estimate with its body counted once, against serialising it.

The boundary's body is tens to hundreds of KB; its part's JSON length is the
part's with an empty text plus the text's own JSON length
(:func:`mimo_ctx.tokens.json_string_units`), which must be exactly what the
estimator's serialisation (:func:`mimo_ctx.tokens.js_json`) gives for any text.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.compaction import build_boundary_message, estimate_boundary_tokens
from mimo_ctx.messages import FilePart, Message, Part, TextPart, part_units
from mimo_ctx.tokens import estimate_message_tokens, js_json, json_string_units, json_units

# Every character class the escaping treats apart: quotes, backslashes, the short
# escapes, other control characters, DEL and the line separators (kept as they
# are), non-ASCII, astral characters, lone surrogates.
_TRICKY = st.sampled_from(
    [
        *('"', "\\", "\n", "\r", "\t", "\b", "\f", "\x00", "\x01", "\x1f", "\x7f", "\u2028"),
        *("é", "中", "😀", "\U0010ffff", "\ud800", "\udfff", "a", " ", "/", "<"),
    ]
)
_TEXTS = st.one_of(
    st.text(),
    st.lists(_TRICKY, max_size=40).map("".join),
    st.text(alphabet=st.characters(codec="utf-8")),
    st.text(alphabet=st.characters(max_codepoint=0x7F)),
)


@settings(max_examples=1000, deadline=None)
@given(text=_TEXTS)
def test_json_string_units_is_the_length_inside_the_serialised_string(text: str) -> None:
    serialised = js_json(text).encode("utf-16-le", "surrogatepass")
    assert json_string_units(text) == len(serialised) // 2 - 2


@settings(max_examples=300, deadline=None)
@given(
    body=_TEXTS,
    index=st.text(max_size=50),
    actors=st.text(max_size=50),
    digest=st.none() | st.just("msg_0002"),
)
def test_the_boundary_is_estimated_as_its_serialised_parts(
    body: str, index: str, actors: str, digest: str | None
) -> None:
    watermark = Message(id="msg_0001", session_id="s", role="assistant", time_created=10)
    boundary = build_boundary_message(
        watermark=watermark,
        digest_up_to=digest,
        directory="memory/s",
        number=3,
        index_text=index,
        body=body,
        actors_text=actors,
    )
    # No cache on the copy: every part serialised (a lone surrogate cannot go
    # through pydantic's JSON, so not a round trip).
    fresh = boundary.model_copy(update={"parts": list(boundary.parts)})
    estimate = estimate_boundary_tokens(boundary)
    assert estimate == estimate_message_tokens(fresh)
    assert part_units(boundary) == tuple(json_units(p) for p in fresh.parts)
    # Cached on the boundary: the commit's row and the report read it back.
    assert estimate_message_tokens(boundary) == estimate


def test_a_boundary_of_another_shape_is_counted_part_by_part() -> None:
    """A body slot that is not text (not what the rebuild builds) is serialised."""
    body = FilePart(mime="text/plain", url="data:text/plain,a%22b")
    parts: list[Part] = [TextPart(text="a"), TextPart(text="b"), body, TextPart(text='d"\n')]
    message = Message(session_id="s", role="user", time_created=1, parts=parts)
    fresh = message.model_copy(update={"parts": list(parts)})
    assert estimate_boundary_tokens(message) == estimate_message_tokens(fresh)
