"""Stored messages as the ``history`` tool shows them: readable text, pages, snippets.

Tool calls show their input and their full stored output, also when a rebuild
cleared it from the context (SPEC R4.5: nothing is deleted from storage).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    FilePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolTime,
)

__all__ = [
    "content_of",
    "iso_time",
    "json_text",
    "message_body",
    "message_header",
    "page",
    "render_message",
    "render_part",
    "snippet",
]

_SNIPPET_CHARS: Final = 160
_DATA_URL_CHARS: Final = 80


def iso_time(ms: int | None) -> str:
    if ms is None:
        return "unknown time"
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def render_part(part: Part) -> str:
    if isinstance(part, TextPart):
        marks = [m for m, on in (("synthetic", part.synthetic), ("ignored", part.ignored)) if on]
        return f"[text, {', '.join(marks)}]\n{part.text}" if marks else part.text
    if isinstance(part, ReasoningPart):
        return "[reasoning redacted]" if part.redacted else f"[reasoning]\n{part.text}"
    if isinstance(part, ToolPart):
        head = (
            f"[tool call {part.tool} call_id={part.call_id}] input: {json_text(part.state.input)}"
        )
        state = part.state
        if isinstance(state, ToolStateCompleted):
            note = _cleared_note(state.time)
            return f"{head}\n[tool result {part.tool} call_id={part.call_id}{note}]\n{state.output}"
        if isinstance(state, ToolStateError):
            return f"{head}\n[tool error {part.tool} call_id={part.call_id}]\n{state.error}"
        return f"{head}\n[tool call not finished: {state.status}]"
    if isinstance(part, ToolResultPart):
        flag = ", error" if part.is_error else ""
        note = _cleared_note(part.time)
        return f"[tool result {part.tool} call_id={part.call_id}{flag}{note}]\n{part.output}"
    if isinstance(part, FilePart):
        url = part.url
        if url.startswith("data:") and len(url) > _DATA_URL_CHARS:
            url = url[:_DATA_URL_CHARS] + f"… ({len(part.url)} characters)"
        name = f" {part.filename}" if part.filename else ""
        return f"[file{name} ({part.mime}) {url}]"
    if isinstance(part, SubtaskPart):
        what = part.command or part.agent
        lines = [f"[subtask {what} agent={part.agent}] {part.description}".rstrip()]
        if part.prompt:
            lines.append(part.prompt)
        return "\n".join(lines)
    if isinstance(part, CheckpointPart):
        return f"[rebuild boundary: checkpoint covers messages up to {part.covered_up_to}]"
    if isinstance(part, CompactionPart):
        return f"[compaction summary]\n{part.summary}"
    assert isinstance(part, OpaquePart)
    return f"[{part.source} {part.kind} part]"


def _cleared_note(time: ToolTime) -> str:
    if time.compacted is None:
        return ""
    return " (cleared from the context by a rebuild; full output kept in storage)"


def message_body(message: Message) -> str:
    return "\n".join(render_part(p) for p in message.parts) or "(no content)"


def content_of(part: Part) -> str:
    """The searchable content of a part: what was said or produced, no annotations."""
    if isinstance(part, TextPart | ReasoningPart):
        return part.text
    if isinstance(part, ToolPart):
        state = part.state
        pieces = [part.tool, json_text(state.input)]
        if isinstance(state, ToolStateCompleted):
            pieces.append(state.output)
        elif isinstance(state, ToolStateError):
            pieces.append(state.error)
        return "\n".join(pieces)
    if isinstance(part, ToolResultPart):
        return part.output
    if isinstance(part, SubtaskPart):
        return "\n".join(p for p in (part.description, part.prompt, part.command or "") if p)
    if isinstance(part, CompactionPart):
        return part.summary
    if isinstance(part, FilePart):
        return part.filename or ""
    return ""


def message_header(message: Message, *, mark: str = "") -> str:
    extra = f", finish={message.finish}" if message.finish else ""
    if message.error is not None:
        extra += f", error={message.error.name}"
    return (
        f"--- {mark}message {message.id} ({message.role}, agent={message.agent}, "
        f"{iso_time(message.time_created)}{extra}) ---"
    )


def render_message(message: Message) -> str:
    """Render a stored message as readable text: header line, then every part.

    Tool calls show their input and their full stored output, also when the
    output was cleared from the context by micro-compaction (SPEC R4.5: nothing
    is deleted from storage).
    """
    return f"{message_header(message)}\n{message_body(message)}"


def page(text: str, offset: int, limit: int, message_id: str) -> str:
    """Cut ``text`` to ``limit`` characters from ``offset``, with a continue notice."""
    piece = text[offset : offset + limit]
    rest = len(text) - offset - len(piece)
    if offset > 0:
        piece = f"[… continuing at character {offset} of {len(text)}]\n{piece}"
    if rest > 0:
        piece += (
            f"\n[… {rest} more characters; call history with operation=get, "
            f"message_id={message_id}, offset={offset + limit}]"
        )
    return piece


def snippet(text: str, needle: str) -> str:
    folded = text.casefold()
    at = max(folded.find(needle) if needle else 0, 0)
    line_start = text.rfind("\n", 0, at) + 1
    line_end = text.find("\n", at)
    line = text[line_start : line_end if line_end >= 0 else len(text)]
    col = at - line_start
    if len(line) <= _SNIPPET_CHARS:
        return line.strip()
    start = max(0, min(col - _SNIPPET_CHARS // 3, len(line) - _SNIPPET_CHARS))
    prefix = "…" if start else ""
    suffix = "…" if start + _SNIPPET_CHARS < len(line) else ""
    return f"{prefix}{line[start : start + _SNIPPET_CHARS].strip()}{suffix}"
