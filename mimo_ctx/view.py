"""The send rules: what of a stored history is actually sent to a model (SPEC A10, R8.1).

:func:`apply_send_rules` is the one place that decides how stored parts read on
the wire, so that every provider converter (OpenAI, Anthropic) and every
framework integration sends the same thing:

* text marked ``ignored`` is dropped; ``synthetic`` text is sent;
* a ``checkpoint`` part reads :data:`CHECKPOINT_SUMMARY_HEADER`; a ``compaction``
  part reads :data:`COMPACTION_SUMMARY_HEADER`, a blank line and its summary;
* a completed tool result marked compacted (``time.compacted``) reads
  :data:`COMPACTED_PLACEHOLDER` (or the text stored with it, ``time.placeholder``,
  when the configured placeholder differs) and loses its attachments (SPEC R4.5);
* a pending or running tool call becomes an error, :data:`INTERRUPTED_TOOL_ERROR`,
  so that every tool call sent has a result;
* an assistant message with an error is skipped, unless it was aborted by the
  user and has real content (non-blank text or a tool call);
* :class:`~mimo_ctx.messages.OpaquePart` (a framework's own part kind) is never
  sent; a sub-task request is sent as a short text (wording ours);
* a tool result stored apart from its call (:class:`ToolResultPart`, provider
  formats) is sent only when its call is sent earlier in the view and has no
  earlier result: a result whose call is hidden or skipped cannot be sent (the
  providers reject it);
* a message left without parts is dropped.

Our choice for the split storage of provider formats: when a pending or running
call is answered by a later :class:`ToolResultPart` in the view, that result is
the call's result and the call is left as it is (it is not interrupted).
Converters take the result of a call from such a part when there is one, else
from the call's own state (:func:`tool_results_by_call`).

The function is pure: it never mutates its input and builds new message
objects for the messages it changes. Messages it leaves unchanged are returned
as they are (messages are values; sharing them keeps their cached token
estimate, the hot-path cost of SPEC R2.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    Message,
    OpaquePart,
    Part,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
)

__all__ = [
    "CHECKPOINT_SUMMARY_HEADER",
    "COMPACTED_PLACEHOLDER",
    "COMPACTION_SUMMARY_HEADER",
    "INTERRUPTED_TOOL_ERROR",
    "apply_send_rules",
    "has_real_content",
    "subtask_text",
    "tool_results_by_call",
]

COMPACTED_PLACEHOLDER: Final = "[Old tool result content cleared]"
"""What a compacted tool result reads when sent (SPEC R4.5, A10)."""

INTERRUPTED_TOOL_ERROR: Final = "[Tool execution was interrupted]"
"""The error a pending or running tool call is sent with (SPEC A10)."""

CHECKPOINT_SUMMARY_HEADER: Final = "Summary of previous conversation from checkpoint files:"
"""The text a ``checkpoint`` part is sent as (SPEC R8.1, A10)."""

COMPACTION_SUMMARY_HEADER: Final = "Summary of previous conversation:"
"""The first line a ``compaction`` part is sent with, before its summary (SPEC A10)."""


def subtask_text(part: SubtaskPart) -> str:
    """The text a sub-task request is sent as (wording ours).

    Args:
        part: The sub-task part.

    Returns:
        One line naming the agent and what it was asked to do, then the prompt
        (when there is one) after a blank line.
    """
    what = part.description or (f"/{part.command}" if part.command else "")
    head = f"Subtask for agent {part.agent}" + (f": {what}" if what else "")
    return f"{head}\n\n{part.prompt}" if part.prompt else head


def has_real_content(message: Message) -> bool:
    """True when a message has non-blank, non-ignored text or a tool call (SPEC A10).

    This decides whether an aborted assistant message is still sent.
    """
    for part in message.parts:
        if isinstance(part, ToolPart):
            return True
        if isinstance(part, TextPart) and not part.ignored and part.text.strip():
            return True
    return False


def _is_sent(message: Message) -> bool:
    # A failed assistant message is skipped unless the user aborted it after it
    # produced something worth keeping (SPEC A10).
    if message.role != "assistant" or message.error is None:
        return True
    return message.error.aborted and has_real_content(message)


def _answered_later(messages: Sequence[Message], sent: Sequence[bool]) -> set[str]:
    """Call ids of sent tool calls that a later sent :class:`ToolResultPart` answers."""
    called: set[str] = set()
    answered: set[str] = set()
    for message, is_sent in zip(messages, sent, strict=True):
        if not is_sent:
            continue
        for part in message.parts:
            if isinstance(part, ToolPart) and message.role == "assistant":
                called.add(part.call_id)
            elif isinstance(part, ToolResultPart) and part.call_id in called:
                answered.add(part.call_id)
    return answered


def _send_tool_part(part: ToolPart, answered: set[str]) -> ToolPart:
    state = part.state
    if isinstance(state, ToolStatePending | ToolStateRunning):
        if part.call_id in answered:
            return part
        time = state.time if isinstance(state, ToolStateRunning) else None
        error = ToolStateError(input=state.input, error=INTERRUPTED_TOOL_ERROR)
        if time is not None:
            error = error.model_copy(update={"time": time})
        return part.model_copy(update={"state": error})
    if isinstance(state, ToolStateCompleted) and state.time.compacted is not None:
        placeholder = state.time.placeholder or COMPACTED_PLACEHOLDER
        if state.output != placeholder or state.attachments:
            cleared = state.model_copy(update={"output": placeholder, "attachments": []})
            return part.model_copy(update={"state": cleared})
    return part


def apply_send_rules(messages: Sequence[Message]) -> list[Message]:
    """Return the messages as they are sent to a model (SPEC A10, R8.1).

    Args:
        messages: The history to send, oldest first (already cut at the newest
            boundary and collapsed, when the caller does that).

    Returns:
        A new list. Changed messages are new objects; the input is never mutated.
    """
    sent = [_is_sent(m) for m in messages]
    answered = _answered_later(messages, sent)
    called: set[str] = set()
    resolved: set[str] = set()
    out: list[Message] = []
    for message, is_sent in zip(messages, sent, strict=True):
        if not is_sent:
            continue
        parts: list[Part] = []
        changed = False
        for part in message.parts:
            new: Part | None
            if isinstance(part, TextPart):
                new = None if part.ignored else part
            elif isinstance(part, CheckpointPart):
                new = TextPart(id=part.id, text=CHECKPOINT_SUMMARY_HEADER, synthetic=True)
            elif isinstance(part, CompactionPart):
                text = COMPACTION_SUMMARY_HEADER
                if part.summary:
                    text = f"{text}\n\n{part.summary}"
                new = TextPart(id=part.id, text=text, synthetic=True)
            elif isinstance(part, ToolPart):
                new = _send_tool_part(part, answered)
                if message.role == "assistant":
                    called.add(part.call_id)
            elif isinstance(part, ToolResultPart):
                new = _send_tool_result(part, called, resolved)
            elif isinstance(part, SubtaskPart):
                new = TextPart(id=part.id, text=subtask_text(part), synthetic=True)
            elif isinstance(part, OpaquePart):
                new = None
            else:  # reasoning and file parts are sent as they are
                new = part
            changed = changed or new is not part
            if new is not None:
                parts.append(new)
        if not parts:
            continue
        out.append(message.model_copy(update={"parts": parts}) if changed else message)
    return out


def _send_tool_result(
    part: ToolResultPart, called: set[str], resolved: set[str]
) -> ToolResultPart | None:
    # Only the first result of a call sent earlier in the view is sent: an orphan
    # (its call hidden or skipped) or a second result breaks the providers' rules.
    if part.call_id not in called or part.call_id in resolved:
        return None
    resolved.add(part.call_id)
    if part.time.compacted is not None and not part.is_error:
        placeholder = part.time.placeholder or COMPACTED_PLACEHOLDER
        if part.output != placeholder or part.attachments:
            return part.model_copy(update={"output": placeholder, "attachments": None})
    return part


def tool_results_by_call(view: Sequence[Message]) -> dict[str, ToolResultPart]:
    """Map call ids to the separately stored result sent for them.

    Args:
        view: Output of :func:`apply_send_rules` (where every kept
            :class:`ToolResultPart` answers a call sent earlier, once).

    Returns:
        ``call_id`` -> the :class:`ToolResultPart` that answers it. A call absent
        from the map takes its result from its own state.
    """
    found: dict[str, ToolResultPart] = {}
    for message in view:
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                found.setdefault(part.call_id, part)
    return found
