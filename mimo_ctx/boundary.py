"""The watermark: where the checkpoint's coverage ends (SPEC R2, A2).

Two pure steps, run when a checkpoint writer starts:

1. :func:`compute_boundary` picks the watermark so that the live tail after it
   keeps enough recent work (>= 10000 tokens and >= 5 messages with text or
   reasoning), without pulling in more than 20000 tokens (SPEC R2.3-R2.5). It is
   a line-by-line port of the original's loop.
2. :func:`adjust_boundary_for_api_invariants` then moves the watermark so that it
   never separates a tool call from its result, nor splits one provider message
   that was stored as several messages (SPEC R2.6). In the OpenCode data model
   (call and result in one :class:`~mimo_ctx.messages.ToolPart`) it is a no-op;
   for provider-format data (results in ``role="tool"`` messages) it is not.

The watermark message itself is covered by the checkpoint (SPEC R2.7): messages
up to and including it are hidden after a rebuild, the ones after it stay live.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mimo_ctx.config import RebuildConfig, TailConfig
from mimo_ctx.errors import BoundaryError
from mimo_ctx.messages import Message, ReasoningPart, TextPart, ToolPart, ToolResultPart
from mimo_ctx.tokens import (
    UNSERIALISABLE_PART_TOKENS,
    TokenCounter,
    estimate_message_tokens,
    js_json,
)

__all__ = [
    "TAIL_MAX_SHARE",
    "TAIL_MAX_TOKENS",
    "TAIL_MIN_SHARE",
    "TAIL_MIN_TEXT_BLOCK_MESSAGES",
    "TAIL_MIN_TOKENS",
    "BoundaryError",
    "adjust_boundary_for_api_invariants",
    "compute_boundary",
    "has_text_blocks",
    "message_token_counts",
    "scale_tail",
    "watermark_of",
]

TAIL_MIN_TOKENS: Final = 10000
"""The tail grows backwards until it holds at least this many tokens (SPEC R2.3)."""
TAIL_MAX_TOKENS: Final = 20000
"""Soft ceiling: the tail stops growing once it holds this many tokens (SPEC R2.3)."""
TAIL_MIN_TEXT_BLOCK_MESSAGES: Final = 5
"""The tail grows until it holds this many text/reasoning messages (SPEC R2.3)."""


TAIL_MAX_SHARE: Final = 0.25
"""**beyond**: the tail ceiling is at most this share of the trigger line."""
TAIL_MIN_SHARE: Final = 0.125
"""**beyond**: the tail floor is at most this share of the trigger line."""


def scale_tail(tail: TailConfig, usable: int) -> TailConfig:
    """The tail constants for a trigger line of ``usable`` tokens (**beyond** R2.3).

    The SPEC's 10000 / 20000 suit large windows; under a small trigger line they
    would keep a live tail larger than the line itself (a 10000-token floor under
    a 4000-token line), so no rebuild or compaction could ever bring the request
    below it. The floor is capped at :data:`TAIL_MIN_SHARE` and the ceiling at
    :data:`TAIL_MAX_SHARE` of ``usable``: with the defaults both caps bind below
    a trigger line of 80000 tokens and never above it, so large windows keep
    the original's numbers. The text-block count is not scaled.

    Args:
        tail: The configured constants.
        usable: The trigger line in tokens (SPEC R1.2).

    Returns:
        ``tail`` itself when nothing changes, else a copy with the capped bounds.
    """
    min_tokens = min(tail.min_tokens, int(usable * TAIL_MIN_SHARE))
    max_tokens = min(tail.max_tokens, int(usable * TAIL_MAX_SHARE))
    if (min_tokens, max_tokens) == (tail.min_tokens, tail.max_tokens):
        return tail
    return tail.model_copy(update={"min_tokens": min_tokens, "max_tokens": max_tokens})


def has_text_blocks(message: Message) -> bool:
    """True when ``message`` has a text or reasoning part (a "text block" message, A2)."""
    return any(isinstance(p, TextPart | ReasoningPart) for p in message.parts)


def _counted_message_tokens(message: Message, counter: TokenCounter) -> int:
    # Same serialisation as the default estimator (R2.2), counted by `counter`.
    total = 0
    for part in message.parts:
        try:
            text = js_json(part.model_dump(mode="json", exclude_none=True))
        except (ValueError, TypeError, RecursionError):
            total += UNSERIALISABLE_PART_TOKENS
            continue
        total += counter.count(text)
    return total


def message_token_counts(
    messages: Sequence[Message], *, counter: TokenCounter | None = None
) -> list[int]:
    """Token estimate of every message, in order (SPEC R2.2).

    Args:
        messages: The messages.
        counter: Count each part's compact JSON with this counter instead of the
            default four-characters-per-token estimate. Only the default estimate
            is cached on the messages.

    Returns:
        One count per message; a part whose JSON serialisation fails counts
        :data:`~mimo_ctx.tokens.UNSERIALISABLE_PART_TOKENS` (A2).
    """
    if counter is None:
        return [estimate_message_tokens(m) for m in messages]
    return [_counted_message_tokens(m, counter) for m in messages]


def _tail_config(config: RebuildConfig | TailConfig | None) -> TailConfig:
    if config is None:
        return TailConfig()
    if isinstance(config, TailConfig):
        return config
    return config.tail


def compute_boundary(
    messages: Sequence[Message],
    config: RebuildConfig | TailConfig | None = None,
    *,
    counter: TokenCounter | None = None,
    token_counts: Sequence[int] | None = None,
) -> str | None:
    """Pick the watermark: the id of the last message the checkpoint will cover.

    A port of the original's ``computeBoundary`` (SPEC R2.3-R2.5, A2). The tail
    starts at the message *before* the last completed assistant message (the last
    assistant whose ``finish`` is set). If that tail already holds
    ``tail.max_tokens`` or more, its first message is returned unchanged (a soft
    ceiling: the boundary is never pulled forward). Otherwise the tail grows
    backwards one message at a time while there is an earlier message, the tail
    holds fewer than ``tail.max_tokens`` tokens, and it holds fewer than
    ``tail.min_tokens`` tokens or fewer than ``tail.min_text_block_messages``
    messages with text or reasoning. The id of the first tail message is returned.
    The tail may end up larger than ``tail.max_tokens`` when one message alone is
    large: messages are never split.

    Callers should pass the main agent's messages only, in session order, and then
    run :func:`adjust_boundary_for_api_invariants` on the result.

    Args:
        messages: The session's messages in order.
        config: Where the tail constants come from (``config.tail``); defaults to
            the SPEC's 10000 / 20000 / 5.
        counter: Count tokens with this counter instead of the default estimator.
        token_counts: Precomputed per-message token counts (one per message, same
            order), e.g. kept by the middleware so a turn does not re-serialise the
            history. Takes precedence over ``counter``.

    Returns:
        The watermark message id; ``None`` for an empty list. With no completed
        assistant message, or when the last one is the first message, the first
        message's id (A2).

    Raises:
        BoundaryError: ``token_counts`` does not have one entry per message.
    """
    if token_counts is not None and len(token_counts) != len(messages):
        raise BoundaryError(
            f"token_counts has {len(token_counts)} entries for {len(messages)} messages; "
            "expected one count per message"
        )
    if not messages:
        return None
    last_assistant = -1
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant" and message.finish:
            last_assistant = index
            break
    if last_assistant <= 0:
        return messages[0].id

    tail = _tail_config(config)
    tokens = (
        list(token_counts)
        if token_counts is not None
        else message_token_counts(messages, counter=counter)
    )
    start = last_assistant - 1
    tail_sum = sum(tokens[start:])
    text_blocks = sum(1 for m in messages[start:] if has_text_blocks(m))

    # Natural tail already at the ceiling: leave it alone (soft ceiling, R2.4).
    if tail_sum >= tail.max_tokens:
        return messages[start].id

    # Tail too small: include earlier history until both floors are met, but
    # stop as soon as the ceiling is reached (R2.5).
    while (
        start > 0
        and tail_sum < tail.max_tokens
        and (tail_sum < tail.min_tokens or text_blocks < tail.min_text_block_messages)
    ):
        start -= 1
        tail_sum += tokens[start]
        if has_text_blocks(messages[start]):
            text_blocks += 1
    return messages[start].id


def _spans(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """Index spans ``(first, last)`` that one watermark must not cut through.

    A cut after index ``w`` (``w`` covered, ``w + 1`` live) splits a span when
    ``first <= w < last``.
    """
    spans: list[tuple[int, int]] = []
    # Tool calls and their split-off results, matched by call id. A call and its
    # result in one ToolPart (OpenCode form) yield no span.
    calls: dict[str, int] = {}
    results: dict[str, list[int]] = {}
    # Every message sharing a provider message id, first to last occurrence. In
    # Claude Code transcripts one API response is stored as several lines that
    # are not always adjacent (tool results can sit between them), so the whole
    # stretch is kept on one side, not only the adjacent run.
    groups: dict[str, tuple[int, int]] = {}
    for index, message in enumerate(messages):
        for part in message.parts:
            if isinstance(part, ToolPart):
                calls.setdefault(part.call_id, index)
            elif isinstance(part, ToolResultPart):
                results.setdefault(part.call_id, []).append(index)
        key = message.provider_message_id
        if key is not None:
            first = groups.get(key, (index, index))[0]
            groups[key] = (first, index)
    for call_id, result_indexes in results.items():
        call_index = calls.get(call_id)
        if call_index is None:
            continue
        for result_index in result_indexes:
            low, high = sorted((call_index, result_index))
            if low < high:
                spans.append((low, high))
    spans.extend(span for span in groups.values() if span[0] < span[1])
    return spans


def adjust_boundary_for_api_invariants(messages: Sequence[Message], boundary_id: str) -> str:
    """Move the watermark so that it splits no tool pair and no provider message.

    SPEC R2.6. The watermark ``W`` is covered (hidden after a rebuild) and the
    message after it is live. ``W`` is moved **earlier** until

    * no :class:`~mimo_ctx.messages.ToolResultPart` sits on the other side of
      ``W`` from the :class:`~mimo_ctx.messages.ToolPart` it answers (matched by
      ``call_id``), and
    * no set of messages sharing one ``provider_message_id`` (one provider
      response stored as thinking / text / tool-use messages) has members on both
      sides; the set is taken from its first to its last member, because other
      messages (tool results) can sit between its members.

    Moving earlier can split another pair; the result is the fixed point, which
    is the latest position at or before ``W`` where nothing is split (every
    position skipped on the way lies inside a span that was split).

    When no such position exists (a split span starts at the first message, so
    there is nothing earlier to move to) ``W`` is moved **later** instead, to the
    earliest position after it where nothing is split: the end of the tool result
    or of the group. That covers more history than asked, which is safe; the last
    message always qualifies.

    Args:
        messages: The messages ``boundary_id`` was computed from, in order.
        boundary_id: The watermark from :func:`compute_boundary`.

    Returns:
        The adjusted watermark; ``boundary_id`` itself when nothing is split
        (always the case for OpenCode-form data).

    Raises:
        BoundaryError: ``boundary_id`` is not the id of one of ``messages``.
    """
    position = next((i for i, m in enumerate(messages) if m.id == boundary_id), None)
    if position is None:
        raise BoundaryError(
            f"boundary id {boundary_id!r} is not among the {len(messages)} messages given; "
            "pass the messages the boundary was computed from"
        )
    spans = _spans(messages)
    if not spans:
        return boundary_id
    # inside[w] > 0 when a cut after w splits some span (difference array).
    delta = [0] * (len(messages) + 1)
    for first, last in spans:
        delta[first] += 1
        delta[last] -= 1
    inside: list[int] = []
    running = 0
    for value in delta[:-1]:
        running += value
        inside.append(running)
    for candidate in range(position, -1, -1):
        if inside[candidate] == 0:
            return messages[candidate].id
    for candidate in range(position + 1, len(messages)):
        if inside[candidate] == 0:
            return messages[candidate].id
    # Unreachable: no span ends after the last message, so inside[-1] == 0.
    return messages[-1].id


def watermark_of(
    messages: Sequence[Message], config: RebuildConfig, *, margin: int
) -> tuple[str, bool] | None:
    """The watermark of ``messages`` (R2.3-R2.6), never a boundary message, and whether
    it is the one any longer history ending with these messages gives.

    Boundaries are left out: a boundary is back-dated right after the watermark it
    covers, so after one large last turn it is "the message before the last
    completed assistant" and R2.4 would return it. Covering up to a boundary would
    put every message after the old watermark on both sides of the new one: sent
    live again although digested, the activity section and the mid-loop reminder
    lost.

    Decided (``messages`` being the newest of a longer history) when (1) the tail
    stopped growing before the first message (so the R2.5 loop ends at the same
    place with more history before it), (2) the R2.6 adjustment moved it earlier or
    not at all and it lies at least ``margin`` messages in (a provider
    message's stretch is never that long, so none reaches back past the first
    message), and (3) every tool result after it answers a call among ``messages``
    (a call made earlier would pull the watermark back).
    """
    candidates = [m for m in messages if not m.is_boundary]
    computed = compute_boundary(candidates, config)
    if computed is None:
        return None
    boundary = adjust_boundary_for_api_invariants(candidates, computed)
    index = next(i for i, m in enumerate(candidates) if m.id == boundary)
    if index < margin or (
        candidates[index].id != computed
        and not any(m.id == computed for m in candidates[index + 1 :])
    ):
        # Too close to the start, or moved later (nothing earlier was free here,
        # where a longer history might have a free place earlier).
        return boundary, False
    calls = {p.call_id for m in candidates for p in m.parts if isinstance(p, ToolPart)}
    answered_here = all(
        p.call_id in calls
        for m in candidates[index + 1 :]
        for p in m.parts
        if isinstance(p, ToolResultPart)
    )
    return boundary, answered_here
