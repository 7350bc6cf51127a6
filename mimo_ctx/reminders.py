"""Closing lines and reminders of the rebuild body, and the per-turn reminder.

* The closing sentence after the body's sections (SPEC R5.7), copied verbatim
  from the original in both variants.
* A reminder chosen by the shape of the last tail message (SPEC R5.8): the
  original's autonomous-loop reminder (verbatim) when the model was mid-loop;
  nothing after a user message. **Beyond**: after a turn that
  finished, the closing and the reminder follow :class:`OpenWork` — a progress
  check naming the open task's ``progress.md`` only when that file exists, a
  pointer to the next open plan item or task otherwise, and when nothing is open
  a closing that says the last request was answered instead of "resume" (the
  original told the model to resume, and it re-ran finished work). An unanswered
  user message at the end gets a closing that says so; a user message nobody
  typed that answers the command an assistant's text ended with (an agent that
  acts through text, such as SWE-agent) is mid-loop, and so is such a text
  once the tail shows the agent works so.
* The per-turn reminder (SPEC R8.3, A12, wording ours), appended in memory only
  to the last user message of every request; a fixed marker line makes it
  recognisable so it is never added twice.

Everything here is pure: functions build new values and never modify inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx._util import escape_html_headings, escape_path, one_line
from mimo_ctx.checkpoint.evidence import trailing_command
from mimo_ctx.messages import Message, TextPart, ToolPart, user_input_text

__all__ = [
    "AUTONOMOUS_LOOP_REMINDER",
    "CLOSING_ANSWER_USER",
    "CLOSING_NOTHING_OPEN",
    "CLOSING_WITHOUT_ACTIVITY",
    "CLOSING_WITH_ACTIVITY",
    "PER_TURN_MARKER",
    "TOOL_CALL_FINISH_REASONS",
    "LastMessageInfo",
    "OpenWork",
    "append_per_turn_reminder",
    "closing_line",
    "closing_text",
    "compute_last_message_info",
    "has_per_turn_reminder",
    "latest_request_note",
    "next_step_reminder",
    "per_turn_reminder",
    "per_turn_reminder_part",
    "progress_check_reminder",
    "reminder_for",
    "with_per_turn_reminder",
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

_ACTIVITY_CLAUSE: Final = " and the recent activity list"

CLOSING_NOTHING_OPEN: Final = (
    "This session is continued from a checkpoint. The blocks above cover earlier history{}. "
    "The last request was answered and no work is open: wait for the user's next message "
    "and do not redo finished work. Do not recap this dump."
)
"""Closing when the last turn finished and nothing is open (ours; ``{}`` takes the
activity clause)."""

CLOSING_ANSWER_USER: Final = (
    "This session is continued from a checkpoint. The blocks above cover earlier history{}. "
    "The user's latest message, after this summary, is not answered yet: answer it. "
    "Do not recap this dump."
)
"""Closing when the tail ends with an unanswered user message (ours)."""


@dataclass(frozen=True, slots=True)
class OpenWork:
    """What is still open when a rebuild happens after a finished turn.

    Attributes:
        next_item: The first open item of the host agent's plan, or the first open
            task of the registry (``T1: summary``); ``None`` when none is open.
        progress_file: The ``progress.md`` of that open task, when it exists on disk.
    """

    next_item: str | None = None
    progress_file: str | None = None

    @property
    def open(self) -> bool:
        """True when some work is left."""
        return self.next_item is not None or self.progress_file is not None


def progress_check_reminder(path: str) -> str:
    """The progress check of R5.8 naming the open task's ``progress.md`` (wording ours).

    Given only when that file exists (the original pointed every finished
    turn at a ``progress.md`` that most sessions do not have).
    """
    return "\n".join(
        [
            "<system-reminder>",
            "Your last turn ended without a tool call. Before you stop, open",
            f"{escape_path(path)} and check it against the task's spec. Stop only if every",
            "requirement is truly done; otherwise continue with the next unfinished step.",
            "</system-reminder>",
        ]
    )


def next_step_reminder(item: str) -> str:
    """The reminder after a finished turn while a plan item or task is open (ours)."""
    return "\n".join(
        [
            "<system-reminder>",
            "Your last turn ended without a tool call, but work is still open:",
            escape_html_headings(one_line(item)),
            "Continue with it unless the user's latest message says otherwise.",
            "</system-reminder>",
        ]
    )


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
        observation: A user message nobody typed that answers the command the
            assistant's text ended with (an agent that acts through text, such as
            SWE-agent, gets its command's output so): mid-loop, not a request.
    """

    role: str
    finish: str | None = None
    message_id: str | None = None
    has_tool_calls: bool = False
    observation: bool = False

    @property
    def mid_loop(self) -> bool:
        """True when the model is in the middle of a tool loop.

        An assistant that finished with a tool-call reason (SPEC R5.8). Ours, for
        shapes the original does not have: an assistant with tool calls and no
        finish reason (cut off while calling tools), and a ``tool`` message
        (provider-format results waiting for the model's answer).
        """
        if self.role == "tool" or self.observation:
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
        observation=_answers_a_text_command(messages),
    )


def _answers_a_text_command(messages: Sequence[Message]) -> bool:
    """The loop of an agent that acts through text is waiting on or answering a command.

    True when the last message is untyped user text right after assistant text
    that ended with a command in a code block (the command's output), or when the
    last message is such assistant text and an earlier pair of the tail shows the
    agent works so (its command has not run yet).
    """
    if len(messages) >= 2 and _observation_pair(messages[-2], messages[-1]):
        return True
    last = messages[-1]
    return (
        last.role == "assistant"
        and _text_command(last)
        and any(_observation_pair(a, b) for a, b in itertools.pairwise(messages))
    )


def _text_command(message: Message) -> bool:
    said = [p.text for p in message.parts if isinstance(p, TextPart) and not p.ignored]
    return bool(said) and trailing_command(said[-1]) is not None


def _observation_pair(before: Message, last: Message) -> bool:
    if before.role != "assistant" or last.role != "user" or user_input_text(last) is not None:
        return False
    shown = any(isinstance(p, TextPart) and not p.ignored and p.text.strip() for p in last.parts)
    return shown and _text_command(before)


def reminder_for(info: LastMessageInfo | None, work: OpenWork | None = None) -> str:
    """The R5.8 reminder for the last tail message; ``""`` after a user message.

    Mid-loop (see :attr:`LastMessageInfo.mid_loop`) gives
    :data:`AUTONOMOUS_LOOP_REMINDER`. After an assistant message that finished
    otherwise: :func:`progress_check_reminder` when ``work`` names an existing
    ``progress.md``, :func:`next_step_reminder` when it names an open item, and
    ``""`` when nothing is open (no reminder leads to a file that does not exist or
    replays finished work). A user message or no message gives ``""``.
    """
    if info is None:
        return ""
    if info.mid_loop:
        return AUTONOMOUS_LOOP_REMINDER
    if info.role != "assistant" or work is None:
        return ""
    if work.progress_file is not None:
        return progress_check_reminder(work.progress_file)
    if work.next_item is not None:
        return next_step_reminder(work.next_item)
    return ""


def closing_line(has_activity: bool) -> str:
    """The R5.7 closing sentence, with or without the recent-activity wording."""
    return CLOSING_WITH_ACTIVITY if has_activity else CLOSING_WITHOUT_ACTIVITY


def closing_text(
    has_activity: bool, info: LastMessageInfo | None, work: OpenWork | None = None
) -> str:
    """The end of the rebuild body: the closing sentence and the R5.8 reminder.

    The closing is R5.7's (resume) when the model was mid-loop, when work is open
    or when nothing is known; :data:`CLOSING_ANSWER_USER` when the tail ends with a
    user message; :data:`CLOSING_NOTHING_OPEN` when the last turn finished and
    ``work`` has nothing open (an idle or manual rebuild must not end by
    telling the model to act on a request it already answered).

    Args:
        has_activity: A "# Recent activity" section was rendered.
        info: The last tail message's shape (:func:`compute_last_message_info`).
        work: What is open after a finished turn; ``None``: not known.

    Returns:
        The closing sentence, followed by a blank line and the reminder when one
        applies. No leading or trailing newline: the renderer puts a blank line
        between the last section and this text.
    """
    clause = _ACTIVITY_CLAUSE if has_activity else ""
    if info is not None and info.role == "user" and not info.observation:
        line = CLOSING_ANSWER_USER.format(clause)
    elif (
        info is not None
        and info.role == "assistant"
        and not info.mid_loop
        and work is not None
        and not work.open
    ):
        line = CLOSING_NOTHING_OPEN.format(clause)
    else:
        line = closing_line(has_activity)
    reminder = reminder_for(info, work)
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


def per_turn_reminder_part(memory_dir: str) -> TextPart:
    """The synthetic text part that carries the per-turn reminder (SPEC R8.3).

    A value: one part may be appended to any number of copies (it is never stored).

    Args:
        memory_dir: The session memory directory named in the reminder.
    """
    return TextPart(text=per_turn_reminder(memory_dir), synthetic=True)


def with_per_turn_reminder(message: Message, part: TextPart) -> Message:
    """``message`` carrying the reminder ``part``: a copy with it appended.

    ``message`` itself (unchanged) when one of its text parts already holds the
    marker. The input is never modified, so nothing reaches the store (R8.3).
    """
    if any(isinstance(p, TextPart) and has_per_turn_reminder(p.text) for p in message.parts):
        return message
    return message.model_copy(update={"parts": [*message.parts, part]})


def append_per_turn_reminder(messages: Sequence[Message], memory_dir: str) -> list[Message]:
    """Return a new list whose last user message carries the per-turn reminder.

    SPEC R8.3: the reminder lives in memory only. The last user message is
    replaced by a copy with a synthetic text part appended
    (:func:`with_per_turn_reminder`); no input message is modified, so nothing
    reaches the store. When that message already holds the marker, or there is
    no user message, the new list has the same messages.

    Args:
        messages: The outgoing request's messages in order.
        memory_dir: The session memory directory named in the reminder.
    """
    out = list(messages)
    for index in range(len(out) - 1, -1, -1):
        if out[index].role == "user":
            out[index] = with_per_turn_reminder(out[index], per_turn_reminder_part(memory_dir))
            return out
    return out


def latest_request_note(
    users: Sequence[Message], tail: Sequence[Message]
) -> tuple[str, str] | None:
    """The newest typed user message and whether what follows it answers it.

    Answered: the last message after it is an assistant message that finished
    otherwise than with tool calls. Being worked on: something follows, the last of
    it mid-loop. Not answered yet: it is the last message. With no tail there is
    nothing to tell.
    """
    newest = next((m for m in reversed(users) if user_input_text(m) is not None), None)
    if newest is None or not tail:
        return None
    key = (newest.time_created, newest.id)
    after = [m for m in tail if (m.time_created, m.id) > key]
    if not after:
        return newest.id, "the latest request; not answered yet"
    last = after[-1]
    if last.role != "assistant" or last.finish is None or last.finish in TOOL_CALL_FINISH_REASONS:
        return newest.id, "the latest request; being worked on"
    return newest.id, "the latest request; answered"
