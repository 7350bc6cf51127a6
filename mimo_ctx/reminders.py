"""Closing lines and reminders of the rebuild body, and the per-turn reminder.

* The closing sentence after the body's sections (SPEC R5.7), copied verbatim
  from the original in both variants.
* A reminder chosen by the shape of the last tail message (SPEC R5.8): the
  original's autonomous-loop reminder (verbatim) when the model was mid-loop, a
  progress check (wording ours) when it had finished, nothing after a user
  message.
* The per-turn reminder (SPEC R8.3, A12, wording ours), appended in memory only
  to the last user message of every request; a fixed marker line makes it
  recognisable so it is never added twice.

Everything here is pure: functions build new values and never modify inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx.messages import Message, TextPart, ToolPart

__all__ = [
    "AUTONOMOUS_LOOP_REMINDER",
    "CLOSING_WITHOUT_ACTIVITY",
    "CLOSING_WITH_ACTIVITY",
    "PER_TURN_MARKER",
    "PROGRESS_CHECK_REMINDER",
    "TOOL_CALL_FINISH_REASONS",
    "LastMessageInfo",
    "append_per_turn_reminder",
    "closing_line",
    "closing_text",
    "compute_last_message_info",
    "has_per_turn_reminder",
    "per_turn_reminder",
    "reminder_for",
]

CLOSING_WITH_ACTIVITY: Final = (
    "This session is continued from a checkpoint. The blocks above cover earlier history "
    "and the recent activity list. Resume the last task from that list and any live "
    "messages after it. Do not recap this dump."
)
"""Closing line when a recent-activity section was rendered (SPEC R5.7, verbatim)."""

CLOSING_WITHOUT_ACTIVITY: Final = (
    "This session is continued from a checkpoint. The blocks above cover earlier history. "
    "Resume the last task from the most recent live messages. Do not recap this dump."
)
"""Closing line when no recent-activity section was rendered (SPEC R5.7, verbatim)."""

AUTONOMOUS_LOOP_REMINDER: Final = "\n".join(
    [
        "<system-reminder>",
        "You are mid-loop in an autonomous task. Continue your work loop:",
        "respond to the tool results below and proceed to the next iteration.",
        "</system-reminder>",
    ]
)
"""Reminder after a tool-calls turn (SPEC R5.8; the original's four lines, verbatim)."""

PROGRESS_CHECK_REMINDER: Final = "\n".join(
    [
        "<system-reminder>",
        "Your last turn ended without a tool call. Before you stop, open the current task's",
        "progress.md and check it against the task's spec. Stop only if every requirement is",
        "truly done; otherwise continue with the next unfinished step.",
        "</system-reminder>",
    ]
)
"""Reminder after a turn that finished otherwise (SPEC R5.8; wording ours)."""

TOOL_CALL_FINISH_REASONS: Final = frozenset({"tool-calls", "tool_calls", "tool_use"})
"""Finish reasons meaning "the model asked for tools": the original's ``tool-calls``
plus the raw OpenAI (``tool_calls``) and Anthropic (``tool_use``) spellings, so
imported data that kept the provider's value is recognised too."""

PER_TURN_MARKER: Final = '<system-reminder data-mimo-ctx="per-turn">'
"""First line of the per-turn reminder; its presence means "already added" (A12)."""


@dataclass(frozen=True, slots=True)
class LastMessageInfo:
    """The shape of the last tail message, which picks the R5.8 reminder.

    Attributes:
        role: ``user``, ``assistant`` or ``tool``.
        finish: The assistant's finish reason, if any.
        message_id: The message's id.
        has_tool_calls: The message holds at least one tool call.
    """

    role: str
    finish: str | None = None
    message_id: str | None = None
    has_tool_calls: bool = False

    @property
    def mid_loop(self) -> bool:
        """True when the model is in the middle of a tool loop.

        An assistant that finished with a tool-call reason (SPEC R5.8). Ours, for
        shapes the original does not have: an assistant with tool calls and no
        finish reason (cut off while calling tools), and a ``tool`` message
        (provider-format results waiting for the model's answer).
        """
        if self.role == "tool":
            return True
        if self.role != "assistant":
            return False
        if self.finish is None:
            return self.has_tool_calls
        return self.finish in TOOL_CALL_FINISH_REASONS


def compute_last_message_info(messages: Sequence[Message]) -> LastMessageInfo | None:
    """Describe the last message of ``messages`` (SPEC R5.8); ``None`` when empty."""
    if not messages:
        return None
    last = messages[-1]
    return LastMessageInfo(
        role=last.role,
        finish=last.finish,
        message_id=last.id,
        has_tool_calls=any(isinstance(p, ToolPart) for p in last.parts),
    )


def reminder_for(info: LastMessageInfo | None) -> str:
    """The R5.8 reminder for the last tail message; ``""`` after a user message.

    Mid-loop (see :attr:`LastMessageInfo.mid_loop`) gives
    :data:`AUTONOMOUS_LOOP_REMINDER`; any other assistant message gives
    :data:`PROGRESS_CHECK_REMINDER`; a user message or no message gives ``""``.
    """
    if info is None:
        return ""
    if info.mid_loop:
        return AUTONOMOUS_LOOP_REMINDER
    if info.role == "assistant":
        return PROGRESS_CHECK_REMINDER
    return ""


def closing_line(has_activity: bool) -> str:
    """The R5.7 closing sentence, with or without the recent-activity wording."""
    return CLOSING_WITH_ACTIVITY if has_activity else CLOSING_WITHOUT_ACTIVITY


def closing_text(has_activity: bool, info: LastMessageInfo | None) -> str:
    """The end of the rebuild body: the closing sentence and the R5.8 reminder.

    Args:
        has_activity: A "# Recent activity" section was rendered.
        info: The last tail message's shape (:func:`compute_last_message_info`).

    Returns:
        The closing sentence, followed by a blank line and the reminder when one
        applies. No leading or trailing newline: the renderer puts a blank line
        between the last section and this text.
    """
    reminder = reminder_for(info)
    line = closing_line(has_activity)
    return f"{line}\n\n{reminder}" if reminder else line


def per_turn_reminder(memory_dir: str) -> str:
    """The per-turn reminder naming the session memory directory (SPEC R8.3, A12).

    About 120 tokens. Starts with :data:`PER_TURN_MARKER`.

    Args:
        memory_dir: The session memory directory, shown as given.
    """
    return "\n".join(
        [
            PER_TURN_MARKER,
            f"Session memory directory: {memory_dir}",
            "Memory, tasks and actors outlive the context window. Look things up with tools:",
            '- search memory: memory(operation="search", query="<keywords>")',
            '- read a memory file: memory(operation="read", path="<file>.md")',
            '- list tasks: task(operation="list")',
            '- check an actor: actor(operation="status", actor_id="<id>")',
            "Do not ask the user for facts, decisions or results that memory may already hold;",
            "search it first.",
            "</system-reminder>",
        ]
    )


def has_per_turn_reminder(text: str) -> bool:
    """True when ``text`` already contains the per-turn reminder's marker line."""
    return PER_TURN_MARKER in text


def append_per_turn_reminder(messages: Sequence[Message], memory_dir: str) -> list[Message]:
    """Return a new list whose last user message carries the per-turn reminder.

    SPEC R8.3: the reminder lives in memory only. The last user message is
    replaced by a copy with a synthetic text part appended; no input message is
    modified, so nothing reaches the store. When that message already holds the
    marker, or there is no user message, the new list has the same messages.

    Args:
        messages: The outgoing request's messages in order.
        memory_dir: The session memory directory named in the reminder.
    """
    out = list(messages)
    for index in range(len(out) - 1, -1, -1):
        message = out[index]
        if message.role != "user":
            continue
        if any(isinstance(p, TextPart) and has_per_turn_reminder(p.text) for p in message.parts):
            return out
        reminder = TextPart(text=per_turn_reminder(memory_dir), synthetic=True)
        out[index] = message.model_copy(update={"parts": [*message.parts, reminder]})
        return out
    return out
