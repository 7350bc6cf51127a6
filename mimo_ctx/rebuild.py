"""Boundary insertion and micro-compaction (SPEC R4, A4).

The pure half builds the rebuild boundary message (back-dated creation time,
fresh newest id, parts in the R4.4 order) and computes which tool results a
rebuild clears. The async half hands both to the store in one transaction
(:meth:`Store.commit_rebuild`), keyed by the assistant usage it recovers, so a
boundary and its micro-compaction land together or not at all, once per usage.
Nothing is deleted: compacted results keep their output in storage.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final, Literal

from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    Message,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    new_message_id,
)

__all__ = [
    "REBUILD_OUTCOMES",
    "RebuildOutcome",
    "build_boundary_message",
    "build_compaction_message",
    "micro_compact",
]

RebuildOutcome = Literal[
    "rebuilt",
    "writer-failed",
    "insert-failed",
    "memory-write-off",
    "checkpoint-off",
    "compacted",
    "already-recovered",
    "auto-disabled",
    "not-main-agent",
]
"""How a rebuild ended.

The first five are the original's (SPEC A3). Ours: ``compacted`` (a plain
compaction was inserted instead: sub-agents, and the fallback of the outcomes
that allow it), ``already-recovered`` (R1.4: another task or worker recovered
this usage first), ``auto-disabled`` (the loop guard stopped automatic rebuilds),
``not-main-agent`` (only the main agent is rebuilt, R3.1).
"""

REBUILD_OUTCOMES: Final[tuple[str, ...]] = RebuildOutcome.__args__  # type: ignore[attr-defined]


def micro_compact(
    messages: Sequence[Message],
    *,
    after_time: int,
    tools: Collection[str],
    now_ms: int,
    skip_ids: Collection[str] = (),
) -> list[Message]:
    """Mark old tool results compacted (SPEC R4.5, A4).

    Selects messages created strictly later than ``after_time`` (the watermark's
    creation time; every agent of the session) and marks completed,
    not-yet-compacted results of ``tools``.
    ``skip_ids`` are left alone (the new boundary, and the open tool round a
    mid-loop rebuild keeps live).
    Tool names match case-insensitively: agents name the same tools ``read`` or
    ``Read`` (Claude Code), and a rename must not keep old results alive.

    Returns:
        New copies of the messages that changed (inputs are never mutated).
    """
    wanted = {tool.lower() for tool in tools}
    skip = set(skip_ids)
    changed: list[Message] = []
    for message in messages:
        if message.time_created <= after_time or message.id in skip:
            continue
        new_parts = list(message.parts)
        touched = False
        for index, part in enumerate(message.parts):
            if (
                isinstance(part, ToolPart)
                and part.tool.lower() in wanted
                and isinstance(part.state, ToolStateCompleted)
                and part.state.time.compacted is None
            ):
                time = part.state.time.model_copy(update={"compacted": now_ms})
                state = part.state.model_copy(update={"time": time})
                new_parts[index] = part.model_copy(update={"state": state})
                touched = True
            elif (
                isinstance(part, ToolResultPart)
                and part.tool.lower() in wanted
                and not part.is_error
                and part.time.compacted is None
            ):
                time = part.time.model_copy(update={"compacted": now_ms})
                new_parts[index] = part.model_copy(update={"time": time})
                touched = True
        if touched:
            changed.append(message.model_copy(update={"parts": new_parts}))
    return changed


def build_boundary_message(
    *,
    watermark: Message,
    digest_up_to: str | None,
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
    """
    return Message(
        id=new_message_id(newer_than=newer_than),
        session_id=watermark.session_id,
        role="user",
        agent=watermark.agent,
        time_created=watermark.time_created + 1,
        parts=[
            CheckpointPart(
                covered_up_to=watermark.id,
                digest_up_to=digest_up_to,
                directory=directory,
                number=number,
            ),
            TextPart(text=index_text, synthetic=True),
            TextPart(text=body, synthetic=True),
            TextPart(text=actors_text, synthetic=True),
        ],
    )


def build_compaction_message(
    *, watermark: Message, summary: str, auto: bool, newer_than: str | None = None
) -> Message:
    """Build a plain compaction (SPEC R1.4a): a summary covering up to ``watermark``.

    Back-dated like a rebuild boundary, so the messages after the watermark stay
    live after it.
    """
    return Message(
        id=new_message_id(newer_than=newer_than),
        session_id=watermark.session_id,
        role="user",
        agent=watermark.agent,
        time_created=watermark.time_created + 1,
        parts=[CompactionPart(summary=summary, auto=auto, covered_up_to=watermark.id)],
    )
