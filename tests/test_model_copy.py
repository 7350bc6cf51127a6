"""The message models' shallow copy with an update, against pydantic's own ``model_copy``.

Micro-compaction copies four models for every tool result it clears, so the
models make that copy directly instead of through pydantic's ``__copy__``. It
must be the same copy: the same type, field values, set fields and private
attributes, and no state shared with the original beyond the field values.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from mimo_ctx.messages import Message, ToolTime, part_units
from mimo_ctx.tokens import estimate_message_tokens
from tests.strategies import messages, parts, tool_times


def _state(model: BaseModel) -> tuple[Any, ...]:
    return (
        type(model),
        model.__dict__,
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


def _pydantic_copy(model: BaseModel, update: dict[str, Any]) -> BaseModel:
    """What pydantic's ``model_copy`` makes (Message's own handling of its caches aside)."""
    return BaseModel.model_copy(model, update=update)


@settings(max_examples=300, deadline=None)
@given(
    model=st.one_of(parts(), tool_times(), messages(max_parts=3)),
    other=st.one_of(parts(), tool_times(), messages(max_parts=3)),
    chosen=st.sets(st.integers(min_value=0, max_value=20), max_size=4),
)
def test_a_copy_with_an_update_is_pydantics(
    model: BaseModel, other: BaseModel, chosen: set[int]
) -> None:
    # The update: some of the model's fields, with the values of another model's
    # field of the same name when it has one (else None).
    names = list(type(model).model_fields)
    update = {names[i % len(names)]: other.__dict__.get(names[i % len(names)]) for i in chosen}
    if isinstance(model, Message):
        estimate_message_tokens(model)  # a cached estimate the update must drop
    copy = model.model_copy(update=update)
    expected = _pydantic_copy(model, update)
    if isinstance(model, Message) and update:
        private = expected.__pydantic_private__
        assert private is not None
        private["_token_estimate"] = private["_part_units"] = None
        if "id" in update or "session_id" in update:
            private["_insert_seq"] = None
    assert _state(copy) == _state(expected)
    assert copy is not model
    if update:
        # Its own containers: changing the copy's leaves the original as it was.
        assert copy.__dict__ is not model.__dict__
        assert copy.__pydantic_fields_set__ is not model.__pydantic_fields_set__


def test_a_copy_keeps_the_original_unchanged_and_valid() -> None:
    time = ToolTime(start=1, end=4)
    marked = time.model_copy(update={"compacted": 9})
    assert (time.compacted, marked.compacted) == (None, 9)
    assert marked.__pydantic_fields_set__ == {"start", "end", "compacted"}
    assert ToolTime.model_validate_json(marked.model_dump_json()) == marked
    message = Message(session_id="s", role="user", time_created=1)
    estimate_message_tokens(message)
    assert part_units(message) == ()
    copy = message.model_copy(update={"time_created": 2})
    assert part_units(copy) is None
    assert part_units(message) == ()
