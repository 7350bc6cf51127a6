"""What a rebuild writes: the boundary message, a plain compaction, cleared tool results.

Pure functions (SPEC R4.3–R4.5, R1.4a, A4): the rebuild step
(:class:`~mimo_ctx.rebuild.Rebuilder`) builds the boundary and the
micro-compacted copies here and commits them in one store transaction. Nothing
is deleted: a compacted result keeps its output in storage and only reads as a
placeholder when sent.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from fnmatch import fnmatchcase
from typing import Final, TypeGuard, TypeVar

from pydantic import BaseModel

from mimo_ctx._marks import set_marked_from
from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    Message,
    Part,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolTime,
    new_message_id,
    part_units,
    set_part_units,
)
from mimo_ctx.reminders import TOOL_CALL_FINISH_REASONS
from mimo_ctx.tokens import json_string_units, json_units, units_tokens
from mimo_ctx.view import COMPACTED_PLACEHOLDER

__all__ = [
    "build_boundary_message",
    "build_compaction_message",
    "clearable_tool",
    "count_compacted",
    "estimate_boundary_tokens",
    "micro_compact",
    "open_tool_round",
]


def clearable_tool(name: str, *, tools: Collection[str], exclude: Collection[str] = ()) -> bool:
    """True when results of the tool ``name`` may be cleared (SPEC R4.5).

    ``tools`` and ``exclude`` hold names and glob patterns (``"run_*"``,
    ``"mcp__*"``); matching is case-insensitive, since agents name the same tool
    ``read`` or ``Read`` (Claude Code) and a rename must not keep old results
    alive. ``exclude`` wins over ``tools``.
    """
    lowered = name.lower()
    if any(fnmatchcase(lowered, pattern.lower()) for pattern in exclude):
        return False
    return any(fnmatchcase(lowered, pattern.lower()) for pattern in tools)


def _uncleared_result(part: Part) -> TypeGuard[ToolPart | ToolResultPart]:
    """A completed, successful tool result not compacted yet."""
    if isinstance(part, ToolPart):
        return isinstance(part.state, ToolStateCompleted) and part.state.time.compacted is None
    return isinstance(part, ToolResultPart) and not part.is_error and part.time.compacted is None


def micro_compact(
    messages: Sequence[Message],
    *,
    after_time: int,
    tools: Collection[str],
    now_ms: int,
    skip_ids: Collection[str] = (),
    exclude: Collection[str] = (),
    keep: int = 0,
    placeholder: str | None = None,
) -> list[Message]:
    """Mark old tool results compacted (SPEC R4.5, A4).

    Selects messages created strictly later than ``after_time`` (the watermark's
    creation time; every agent of the session) and marks completed,
    not-yet-compacted results of the tools :func:`clearable_tool` accepts.
    ``skip_ids`` are left alone (the new boundary, and the open tool round a
    mid-loop rebuild keeps live). The newest ``keep`` such results of each agent
    stay uncleared. A ``placeholder`` other than the default
    (:data:`~mimo_ctx.view.COMPACTED_PLACEHOLDER`) is stored with each result it
    clears (``time.placeholder``), which is what the result then reads when sent.

    Returns:
        New copies of the messages that changed (inputs are never mutated). Each
        copy's token estimate is derived from its source's part lengths, when
        known (:func:`~mimo_ctx.messages.part_units`): a mark changes only the
        result's ``time`` object, so the part's JSON grows by what that object's
        does, and the output is never serialised again.
    """
    skip = set(skip_ids)
    stored = None if placeholder in (None, COMPACTED_PLACEHOLDER) else placeholder
    chosen: dict[str, list[tuple[int, int]]] = {}
    # Each tool name matched against the patterns once (a tail has a few names).
    clearable: dict[str, bool] = {}
    for position, message in enumerate(messages):
        if message.time_created <= after_time or message.id in skip:
            continue
        for index, part in enumerate(message.parts):
            if not _uncleared_result(part):
                continue
            verdict = clearable.get(part.tool)
            if verdict is None:
                verdict = clearable[part.tool] = clearable_tool(
                    part.tool, tools=tools, exclude=exclude
                )
            if verdict:
                chosen.setdefault(message.agent, []).append((position, index))
    marked: dict[int, set[int]] = {}
    for spots in chosen.values():
        for position, index in spots[: max(0, len(spots) - keep)]:
            marked.setdefault(position, set()).add(index)
    changed: list[Message] = []
    growth: dict[tuple[bool, str | None], int] = {}
    for position in sorted(marked):
        message = messages[position]
        new_parts = list(message.parts)
        units = part_units(message)
        new_units = list(units) if units is not None and len(units) == len(new_parts) else None
        for index in marked[position]:
            part = message.parts[index]
            if isinstance(part, ToolPart) and isinstance(part.state, ToolStateCompleted):
                old = part.state.time
                time = _marked_time(old, now_ms, stored)
                new_parts[index] = _replaced(part, "state", _replaced(part.state, "time", time))
            elif isinstance(part, ToolResultPart):
                old = part.time
                time = _marked_time(old, now_ms, stored)
                new_parts[index] = _replaced(part, "time", time)
            else:  # pragma: no cover - only uncleared results are marked
                continue
            if new_units is not None:
                length = new_units[index]
                # A part that cannot be serialised stays so (a mark adds a number
                # and a string); it still counts as one.
                if length is not None:
                    grown = _time_growth(growth, old, time)
                    if grown is None:
                        new_units = None
                    else:
                        new_units[index] = length + grown
        copy = message.model_copy(update={"parts": new_parts})
        if new_units is not None:
            derived = tuple(new_units)
            set_part_units(copy, derived, estimate=sum(map(units_tokens, derived)))
        # What changed, for a store to write it as an edit of the stored row.
        set_marked_from(copy, message, marked[position])
        changed.append(copy)
    return changed


_M = TypeVar("_M", bound=BaseModel)
_set_slot: Final = object.__setattr__


def _replaced(model: _M, name: str, value: object) -> _M:
    """``model.model_copy(update={name: value})`` for a part model (no private attributes).

    Made in one step, the fields dict copied once: a rebuild copies three nested
    models for every result it clears, and the generic copy (its update merged,
    its private attributes copied) cost about as much again.
    """
    cls = type(model)
    copy = cls.__new__(cls)
    values = model.__dict__.copy()
    values[name] = value
    _set_slot(copy, "__dict__", values)
    fields = model.__pydantic_fields_set__
    _set_slot(copy, "__pydantic_fields_set__", fields if name in fields else fields | {name})
    _set_slot(copy, "__pydantic_extra__", None)
    _set_slot(copy, "__pydantic_private__", None)
    return copy


def _marked_time(old: ToolTime, now_ms: int, placeholder: str | None) -> ToolTime:
    """``old`` marked compacted at ``now_ms`` with ``placeholder`` (see :func:`_replaced`)."""
    copy = ToolTime.__new__(ToolTime)
    values = old.__dict__.copy()
    values["compacted"] = now_ms
    values["placeholder"] = placeholder
    _set_slot(copy, "__dict__", values)
    _set_slot(copy, "__pydantic_fields_set__", old.__pydantic_fields_set__ | _MARK_FIELDS)
    _set_slot(copy, "__pydantic_extra__", None)
    _set_slot(copy, "__pydantic_private__", None)
    return copy


_MARK_FIELDS: Final = frozenset({"compacted", "placeholder"})


def _time_growth(
    cache: dict[tuple[bool, str | None], int], old: ToolTime, new: ToolTime
) -> int | None:
    """How much longer ``new``'s JSON is than ``old``'s (the mark of one result).

    A mark sets ``compacted`` (unset before) and ``placeholder``, so the
    difference depends only on whether ``old`` has another field set (a
    separator more) and on its placeholder: computed once per such shape and
    rebuild. ``None`` when either cannot be serialised (never for numbers and
    strings).
    """
    key = (old.start is not None or old.end is not None, old.placeholder)
    grown = cache.get(key)
    if grown is None:
        before, after = json_units(old), json_units(new)
        if before is None or after is None:  # pragma: no cover - numbers and strings
            return None
        grown = cache[key] = after - before
    return grown


def build_boundary_message(
    *,
    watermark: Message,
    digest_up_to: str | None,
    digest_seq: int | None = None,
    kept_live: Sequence[str] = (),
    directory: str,
    number: int,
    index_text: str,
    body: str,
    actors_text: str,
    newer_than: str | None = None,
) -> Message:
    """Build the rebuild boundary (SPEC R4.3, R4.4).

    Created at the watermark's time + 1 ms so it lists right after the watermark,
    with a fresh id newer than every existing message. Parts, in order: the
    checkpoint part, the checkpoint index, the body, the active-actors list (the
    last three synthetic text). ``newer_than`` is the newest stored message id: the
    boundary's id sorts after it even when this worker's clock lags another's.
    ``kept_live`` names the open tool round's messages that the digested range
    would otherwise take in (see :class:`~mimo_ctx.messages.CheckpointPart`).
    """
    return _after_watermark(
        watermark,
        newer_than,
        [
            CheckpointPart(
                covered_up_to=watermark.id,
                digest_up_to=digest_up_to,
                digest_seq=digest_seq,
                kept_live=list(kept_live),
                directory=directory,
                number=number,
            ),
            TextPart(text=index_text, synthetic=True),
            TextPart(text=body, synthetic=True),
            TextPart(text=actors_text, synthetic=True),
        ],
    )


def estimate_boundary_tokens(boundary: Message) -> int:
    """Estimate a :func:`build_boundary_message` boundary's tokens, cached on it.

    The same figure as :func:`~mimo_ctx.tokens.estimate_message_tokens`, but the
    body (tens to hundreds of KB) is not serialised again to be counted: its
    part's JSON is the part's with an empty text plus the text's own JSON length
    (:func:`~mimo_ctx.tokens.json_string_units`), one pass over its bytes.
    """
    units: list[int | None] = []
    for index, part in enumerate(boundary.parts):
        if index == _BODY_PART and isinstance(part, TextPart):
            empty = json_units(part.model_copy(update={"text": ""}))
            units.append(None if empty is None else empty + json_string_units(part.text))
        else:
            units.append(json_units(part))
    estimate = sum(map(units_tokens, units))
    set_part_units(boundary, tuple(units), estimate=estimate)
    return estimate


_BODY_PART: Final = 2
"""Where :func:`build_boundary_message` puts the body (R4.4)."""


def _after_watermark(watermark: Message, newer_than: str | None, parts: list[Part]) -> Message:
    """A user message listed right after ``watermark`` (its time + 1 ms) with a fresh
    id newer than ``newer_than`` (the newest stored id, so that it sorts after it even
    when this worker's clock lags another's)."""
    return Message(
        id=new_message_id(newer_than=newer_than),
        session_id=watermark.session_id,
        role="user",
        agent=watermark.agent,
        time_created=watermark.time_created + 1,
        parts=parts,
    )


def build_compaction_message(
    *, watermark: Message, summary: str, auto: bool, newer_than: str | None = None
) -> Message:
    """Build a plain compaction (SPEC R1.4a): a summary covering up to ``watermark``.

    Back-dated like a rebuild boundary, so the messages after the watermark stay
    live after it.
    """
    return _after_watermark(
        watermark,
        newer_than,
        [CompactionPart(summary=summary, auto=auto, covered_up_to=watermark.id)],
    )


def open_tool_round(tail: Sequence[Message]) -> list[Message]:
    """The tail's last tool round when the agent is mid-loop, else ``[]``.

    Mid-loop: the tail ends with an assistant message that finished with tool calls,
    possibly followed by ``tool`` messages holding its results (provider format).
    """
    end = len(tail)
    start = end
    while start > 0 and tail[start - 1].role == "tool":
        start -= 1
    if start == 0:
        return []
    last = tail[start - 1]
    if last.role != "assistant" or last.finish not in TOOL_CALL_FINISH_REASONS:
        return []
    if not any(isinstance(p, ToolPart) for p in last.parts):
        return []
    return list(tail[start - 1 : end])


def count_compacted(messages: Sequence[Message], now: int) -> int:
    """How many tool results of ``messages`` micro-compaction marked at ``now``."""
    count = 0
    for message in messages:
        for part in message.parts:
            if (
                isinstance(part, ToolPart)
                and isinstance(part.state, ToolStateCompleted)
                and part.state.time.compacted == now
            ) or (isinstance(part, ToolResultPart) and part.time.compacted == now):
                count += 1
    return count
