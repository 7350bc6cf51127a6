"""What the next request is made of: a ``/context``-style breakdown (pure).

:func:`break_down` splits a request view into parts — the system prompt, the
tool definitions, the rebuild boundary section by section, user and assistant
messages, tool calls, tool results (live and cleared), compaction summaries and
the per-turn reminder — with their estimated tokens, their share of the window
and the room left before the trigger line.
:meth:`~mimo_ctx.middleware.ContextMiddleware.context_usage` runs it over the
view the session's next :meth:`~mimo_ctx.middleware.ContextMiddleware.prepare`
would send without a rebuild, read-only; ``mimo-ctx context`` prints it.

The parts add up to the view's token figure exactly: every part of every
message is counted whole (its compact JSON, SPEC R2.2) in one part of the
breakdown, and a message part split further — the boundary's body into its
sections, a tool part into its call and its result — puts what its pieces do
not account for (headings' spacing, the JSON around them) in a named part of its
own (``boundary: intro and closing``, ``tool calls``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mimo_ctx.budget import scan_fences
from mimo_ctx.messages import (
    CompactionPart,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
)
from mimo_ctx.reminders import has_per_turn_reminder
from mimo_ctx.sections import ACTORS_PART_HEADING, BODY_INTRO, CHECKPOINT_INDEX_HEADING
from mimo_ctx.session import RequestPrefix
from mimo_ctx.tokens import estimate_part_tokens, estimate_text_tokens, js_json
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER, COMPACTION_SUMMARY_HEADER

__all__ = [
    "BOUNDARY_PREFIX",
    "ContextPart",
    "ContextUsage",
    "body_sections",
    "break_down",
]

BOUNDARY_PREFIX: Final = "boundary: "
"""Parts of the rebuild boundary are named ``boundary: <what>``: the body's sections by
their heading (``boundary: # Session checkpoint``), the index and actors parts by
theirs (``boundary: ## Checkpoint``, ``boundary: ## Active Actors``)."""

SYSTEM_PROMPT: Final = "system prompt"
TOOL_DEFINITIONS: Final = "tool definitions"
USER_MESSAGES: Final = "user messages"
ASSISTANT_MESSAGES: Final = "assistant messages"
TOOL_CALLS: Final = "tool calls"
TOOL_RESULTS_LIVE: Final = "tool results (live)"
TOOL_RESULTS_CLEARED: Final = "tool results (cleared)"
COMPACTION_SUMMARIES: Final = "compaction summaries"
REMINDERS: Final = "reminders"
OTHER: Final = "other (files, sub-tasks)"

_FIXED_BEFORE: Final = (SYSTEM_PROMPT, TOOL_DEFINITIONS)
_FIXED_AFTER: Final = (
    USER_MESSAGES,
    ASSISTANT_MESSAGES,
    TOOL_CALLS,
    TOOL_RESULTS_LIVE,
    TOOL_RESULTS_CLEARED,
    COMPACTION_SUMMARIES,
    REMINDERS,
    OTHER,
)
_LEVEL1 = re.compile(r"^# (?=[^#])")


@dataclass(frozen=True, slots=True)
class ContextPart:
    """One part of the next request.

    Attributes:
        name: What it is (``system prompt``, ``boundary: Session checkpoint``...).
        tokens: Estimated tokens (SPEC R2.2).
        items: How many things it counts (messages, tools, results; 1 for a section).
        share: ``tokens`` as a share of the window.
    """

    name: str
    tokens: int
    items: int
    share: float

    def to_json(self) -> dict[str, Any]:
        """``{"name", "tokens", "items", "share"}``."""
        return {
            "name": self.name,
            "tokens": self.tokens,
            "items": self.items,
            "share": round(self.share, 6),
        }


@dataclass(frozen=True, slots=True)
class ContextUsage:
    """What the next request of a session is made of.

    Attributes:
        session_id: The session.
        agent: The agent whose request it is.
        total_tokens: Estimated tokens of the whole request (the view's figure).
        window: The effective window (input limit, or context window, lowered by
            ``max_context``).
        trigger_tokens: The trigger line (SPEC R1.2).
        room_before_trigger: ``trigger_tokens - total_tokens`` (negative above it).
        boundary_id: The rebuild boundary the request starts at, if any.
        last_usage: The provider's usage of the last finished answer, if any.
        messages: Messages in the request.
        parts: The parts, in request order; their tokens add up to ``total_tokens``.
    """

    session_id: str
    agent: str
    total_tokens: int
    window: int
    trigger_tokens: int
    room_before_trigger: int
    boundary_id: str | None
    last_usage: int | None
    messages: int
    parts: list[ContextPart] = field(default_factory=list[ContextPart])

    @property
    def share(self) -> float:
        """``total_tokens`` as a share of the window."""
        return self.total_tokens / self.window if self.window else 0.0

    def to_json(self) -> dict[str, Any]:
        """The document ``mimo-ctx context --json`` prints."""
        return {
            "total_tokens": self.total_tokens,
            "parts": [p.to_json() for p in self.parts],
            "session_id": self.session_id,
            "agent": self.agent,
            "window": self.window,
            "share": round(self.share, 6),
            "trigger_tokens": self.trigger_tokens,
            "room_before_trigger": self.room_before_trigger,
            "boundary_id": self.boundary_id,
            "last_usage": self.last_usage,
            "messages": self.messages,
        }


class _Tally:
    """Tokens and item counts per part name, in first-seen order."""

    def __init__(self, names: Sequence[str]) -> None:
        self.tokens: dict[str, int] = dict.fromkeys(names, 0)
        self.items: dict[str, int] = dict.fromkeys(names, 0)

    def add(self, name: str, tokens: int, items: int = 0) -> None:
        self.tokens[name] = self.tokens.get(name, 0) + tokens
        self.items[name] = self.items.get(name, 0) + items


def body_sections(body: str) -> list[tuple[str, str]]:
    """The boundary body cut at its level-1 headings (outside code fences).

    Returns ``(heading, text)`` pairs in order; the text before the first heading
    (the fixed opening sentence) has the heading ``""``. The body's level-1 headings
    are exactly its sections: content cannot forge one (``neutralise_structure``).
    """
    lines = body.split("\n")
    fenced, _ = scan_fences(lines)
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line, in_fence in zip(lines, fenced, strict=True):
        if not in_fence and _LEVEL1.match(line):
            sections.append((line[2:].strip(), [line]))
        else:
            sections[-1][1].append(line)
    return [(heading, "\n".join(text)) for heading, text in sections]


def _boundary_part(part: Part, tally: _Tally) -> None:
    tokens = estimate_part_tokens(part)
    text = part.text if isinstance(part, TextPart) else ""
    if isinstance(part, TextPart) and has_per_turn_reminder(text):
        tally.add(REMINDERS, tokens, 1)
    elif text == CHECKPOINT_SUMMARY_HEADER:
        tally.add(BOUNDARY_PREFIX + "summary line", tokens, 1)
    elif text.startswith(CHECKPOINT_INDEX_HEADING):
        tally.add(BOUNDARY_PREFIX + CHECKPOINT_INDEX_HEADING, tokens, 1)
    elif text.startswith(ACTORS_PART_HEADING):
        tally.add(BOUNDARY_PREFIX + ACTORS_PART_HEADING, tokens, 1)
    elif text.startswith(BODY_INTRO):
        counted = 0
        for heading, section in body_sections(text):
            if heading:
                section_tokens = estimate_text_tokens(section)
                tally.add(f"{BOUNDARY_PREFIX}# {heading}", section_tokens, 1)
                counted += section_tokens
        # The opening sentence, the closing lines and the JSON around the text.
        tally.add(BOUNDARY_PREFIX + "intro and closing", tokens - counted, 1)
    else:
        tally.add(BOUNDARY_PREFIX + "other", tokens, 1)


def _tool_part(part: ToolPart, tally: _Tally) -> None:
    tokens = estimate_part_tokens(part)
    state = part.state
    if isinstance(state, ToolStateCompleted):
        call = part.model_copy(
            update={"state": state.model_copy(update={"output": "", "attachments": []})}
        )
        cleared = state.time.compacted is not None
    elif isinstance(state, ToolStateError):
        call = part.model_copy(update={"state": state.model_copy(update={"error": ""})})
        cleared = False
    else:  # pending / running calls are sent as errors (A10): nothing to split
        tally.add(TOOL_CALLS, tokens, 1)
        return
    call_tokens = min(tokens, estimate_part_tokens(call))
    tally.add(TOOL_CALLS, call_tokens, 1)
    tally.add(TOOL_RESULTS_CLEARED if cleared else TOOL_RESULTS_LIVE, tokens - call_tokens, 1)


def _message_parts(message: Message, tally: _Tally) -> None:
    counted_as: set[str] = set()
    for part in message.parts:
        tokens = estimate_part_tokens(part)
        if isinstance(part, TextPart) and part.synthetic and has_per_turn_reminder(part.text):
            tally.add(REMINDERS, tokens, 1)
        elif isinstance(part, CompactionPart) or (
            isinstance(part, TextPart)
            and part.synthetic
            and part.text.startswith(COMPACTION_SUMMARY_HEADER)
        ):
            tally.add(COMPACTION_SUMMARIES, tokens, 1)
        elif isinstance(part, ToolPart):
            _tool_part(part, tally)
        elif isinstance(part, ToolResultPart):
            cleared = part.time.compacted is not None and not part.is_error
            tally.add(TOOL_RESULTS_CLEARED if cleared else TOOL_RESULTS_LIVE, tokens, 1)
        elif isinstance(part, TextPart | ReasoningPart) and message.role in ("user", "assistant"):
            name = USER_MESSAGES if message.role == "user" else ASSISTANT_MESSAGES
            # Items count messages, not their text parts.
            tally.add(name, tokens, 0 if name in counted_as else 1)
            counted_as.add(name)
        else:
            tally.add(OTHER, tokens, 1)


def break_down(
    messages: Sequence[Message],
    prefix: RequestPrefix,
    *,
    session_id: str,
    agent: str,
    boundary_id: str | None,
    window: int,
    trigger_tokens: int,
    last_usage: int | None = None,
) -> ContextUsage:
    """Break a request view down into its parts (see the module docs).

    Args:
        messages: The messages to send, as sent (``RequestView.messages``: send rules
            applied, per-turn reminder included).
        prefix: The frozen prefix (system prompt and tools).
        session_id: The session.
        agent: The agent whose request it is.
        boundary_id: The rebuild boundary the view starts at, if any.
        window: The effective window, for the shares.
        trigger_tokens: The trigger line, for the room left.
        last_usage: The provider's usage of the last finished answer.

    Returns:
        The breakdown; ``total_tokens`` is the prefix's estimate plus every message's.
    """
    tally = _Tally(_FIXED_BEFORE)
    tally.add(SYSTEM_PROMPT, estimate_text_tokens(prefix.system), 1 if prefix.system else 0)
    tally.add(TOOL_DEFINITIONS, estimate_text_tokens(js_json(prefix.tools)), len(prefix.tools))
    boundary_parts = _Tally(())
    rest = _Tally(_FIXED_AFTER)
    for message in messages:
        if message.id == boundary_id:
            for part in message.parts:
                _boundary_part(part, boundary_parts)
        else:
            _message_parts(message, rest)
    # Reminders are listed once, after the messages, wherever they were appended.
    rest.add(
        REMINDERS,
        boundary_parts.tokens.pop(REMINDERS, 0),
        boundary_parts.items.pop(REMINDERS, 0),
    )
    total = sum(tally.tokens.values()) + sum(boundary_parts.tokens.values())
    total += sum(rest.tokens.values())
    parts = [
        ContextPart(name, tokens, counts.items[name], tokens / window if window else 0.0)
        for counts in (tally, boundary_parts, rest)
        for name, tokens in counts.tokens.items()
    ]
    return ContextUsage(
        session_id=session_id,
        agent=agent,
        total_tokens=total,
        window=window,
        trigger_tokens=trigger_tokens,
        room_before_trigger=trigger_tokens - total,
        boundary_id=boundary_id,
        last_usage=last_usage,
        messages=len(messages),
        parts=parts,
    )
