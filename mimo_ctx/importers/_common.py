"""Shared pieces of the transcript importers.

The importers read a whole file, validate every record into small internal
drafts, and only then build :class:`~mimo_ctx.messages.Message` objects. Every
problem with the input is found while validating, where the file and line are
known, so the building step cannot fail halfway and no raw traceback escapes.

Ids (SPEC A1). Imported messages get ids made from their own timestamps with
:func:`mimo_ctx.ids.ascending`, in conversation order. Transcripts are not
always monotonic (Claude Code writes parallel tool results a few ms out of
order; sub-agents interleave with the main agent), so each message's time is
clamped to ``max(previous time, own time)`` and ``time_created`` is that clamped
time: ids and the store's ``(time_created, id)`` order then agree.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeGuard, TypeVar

from mimo_ctx import ids
from mimo_ctx.convert import MessageDraft, build_messages
from mimo_ctx.digest import truncate
from mimo_ctx.errors import TranscriptError
from mimo_ctx.messages import (
    MAIN_AGENT,
    FilePart,
    Message,
    ToolPart,
    ToolResultPart,
    ToolTime,
)
from mimo_ctx.store.base import RequestPrefix, Session

__all__ = [
    "FORMATS",
    "FORMAT_CLAUDE_CODE",
    "FORMAT_OPENAI_CHAT",
    "FORMAT_OPENAI_RESPONSES",
    "FORMAT_SWEAGENT",
    "ImportedTranscript",
    "SkippedLine",
    "TranscriptCompaction",
]

FORMAT_CLAUDE_CODE: Final = "claude-code"
FORMAT_OPENAI_CHAT: Final = "openai-chat"
FORMAT_OPENAI_RESPONSES: Final = "openai-responses"
FORMAT_SWEAGENT: Final = "sweagent"
FORMATS: Final = (FORMAT_CLAUDE_CODE, FORMAT_OPENAI_CHAT, FORMAT_OPENAI_RESPONSES, FORMAT_SWEAGENT)
"""Format names accepted by ``load_transcript(format=...)``."""

_UNKNOWN_TOOL: Final = "unknown"


# ---------------------------------------------------------------------------
# Public result types
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SkippedLine:
    """A record that was not imported.

    Attributes:
        path: The file it is in.
        line: Its 1-based line number, when known.
        reason: Why it was left out.
    """

    path: str
    line: int | None
    reason: str


@dataclass(frozen=True)
class TranscriptCompaction:
    """A compaction the transcript's own agent performed (Claude Code ``isCompactSummary``).

    Attributes:
        message_id: Id of the imported user message holding the summary (a
            ``compaction`` part).
        index: Position of that message in :attr:`ImportedTranscript.messages`.
        at: Its ``time_created`` (epoch ms).
        agent: The agent whose context was compacted.
        line: Line of the summary in the source file.
        trigger: ``"auto"`` or ``"manual"`` when the transcript says so.
        tokens_before: Context tokens just before the compaction: the transcript's
            own figure (``compactMetadata.preTokens``) when given, else the usage
            of the last finished assistant message of that agent before it.
    """

    message_id: str
    index: int
    at: int
    agent: str
    line: int | None
    trigger: str | None = None
    tokens_before: int | None = None


@dataclass
class ImportedTranscript:
    """A transcript converted to the internal message model.

    Attributes:
        session: A new session for the transcript (not stored anywhere yet).
        messages: All messages, sub-agents' included, in conversation order;
            ids ascend in this order (SPEC A1).
        format: The format name (one of :data:`FORMATS`).
        source: The file that was imported.
        sources: Every file read (the main file first, then sub-agent files).
        compactions: Compactions recorded in the transcript itself.
        skipped: Malformed records left out (only with ``strict=False``).
        off_branch: Well-formed records deliberately not imported, such as the
            abandoned side of a Claude Code fork (see :mod:`.claude_code`).
    """

    session: Session
    messages: list[Message]
    format: str
    source: Path
    sources: list[Path] = field(default_factory=list[Path])
    compactions: list[TranscriptCompaction] = field(default_factory=list[TranscriptCompaction])
    skipped: list[SkippedLine] = field(default_factory=list[SkippedLine])
    off_branch: list[SkippedLine] = field(default_factory=list[SkippedLine])

    @property
    def agents(self) -> list[str]:
        """Agent ids present, ``main`` first, then sub-agents by first appearance."""
        found = list(dict.fromkeys(m.agent for m in self.messages))
        return sorted(found, key=lambda agent: agent != MAIN_AGENT)

    def agent_messages(self, agent: str = MAIN_AGENT) -> list[Message]:
        """The messages of one agent, in order."""
        return [m for m in self.messages if m.agent == agent]

    def role_counts(self, agent: str | None = None) -> dict[str, int]:
        """Messages per role (``user``, ``assistant``, ``tool``); ``agent=None`` counts all."""
        counts = Counter(m.role for m in self.messages if agent is None or m.agent == agent)
        return {role: counts.get(role, 0) for role in ("user", "assistant", "tool")}

    def tool_call_count(self, agent: str | None = None) -> int:
        """Tool calls (``tool`` parts); ``agent=None`` counts all agents."""
        return sum(
            1
            for m in self.messages
            if agent is None or m.agent == agent
            for p in m.parts
            if isinstance(p, ToolPart)
        )

    def counts(self) -> dict[str, int]:
        """A summary of what was imported, for tests, logs and the CLI."""
        roles = self.role_counts()
        return {
            "messages": len(self.messages),
            "user": roles["user"],
            "assistant": roles["assistant"],
            "tool": roles["tool"],
            "tool_calls": self.tool_call_count(),
            "subagent_messages": sum(1 for m in self.messages if m.agent != MAIN_AGENT),
            "compactions": len(self.compactions),
            "skipped": len(self.skipped),
            "off_branch": len(self.off_branch),
        }


# ---------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------


class BadRecord(Exception):
    """A record is malformed; ``reason`` says how. Turned into a TranscriptError
    (strict) or a :class:`SkippedLine` (lenient) by the caller, who knows the line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def type_name(value: object) -> str:
    """JSON-ish name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if is_array(value):
        return "array"
    if is_object(value):
        return "object"
    return type(value).__name__


def is_object(value: object) -> TypeGuard[dict[str, Any]]:
    """True for a JSON object (the ``json`` module gives a ``dict`` with string keys)."""
    return isinstance(value, dict)


def is_array(value: object) -> TypeGuard[list[Any]]:
    """True for a JSON array."""
    return isinstance(value, list)


def as_object(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object, else :class:`BadRecord` naming ``what``."""
    if not is_object(value):
        raise BadRecord(f"{what} must be an object, got {type_name(value)}")
    return value


def as_list(value: object, what: str) -> list[Any]:
    """``value`` as a JSON array, else :class:`BadRecord` naming ``what``."""
    if not is_array(value):
        raise BadRecord(f"{what} must be an array, got {type_name(value)}")
    return value


_T = TypeVar("_T")


def req_str(obj: Mapping[str, Any], key: str, what: str) -> str:
    """A required string field."""
    if key not in obj:
        raise BadRecord(f"{what} has no {key!r} field")
    return _checked(obj[key], str, "a string", f"{what}.{key}")


def opt_str(obj: Mapping[str, Any], key: str, what: str) -> str | None:
    """An optional string field (absent or null gives ``None``)."""
    value = obj.get(key)
    return None if value is None else _checked(value, str, "a string", f"{what}.{key}")


def opt_bool(obj: Mapping[str, Any], key: str, what: str) -> bool:
    """An optional boolean flag (absent or null gives ``False``)."""
    value = obj.get(key)
    return False if value is None else _checked(value, bool, "a boolean", f"{what}.{key}")


def _checked(value: object, kind: type[_T], noun: str, what: str) -> _T:
    """``value`` when it is a ``kind``; else the error naming the field and the type found."""
    if not isinstance(value, kind):
        raise BadRecord(f"{what} must be {noun}, got {type_name(value)}")
    return value


def opt_int(obj: Mapping[str, Any], key: str, what: str) -> int | None:
    """An optional non-negative integer (absent or null gives ``None``)."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRecord(f"{what}.{key} must be a non-negative integer, got {value!r}")
    return value


MAX_TIME_MS: Final = 253_402_300_799_999
"""The last millisecond of year 9999, the latest time an imported record may carry."""


def parse_timestamp(value: object, what: str) -> int:
    """An ISO 8601 timestamp (or epoch milliseconds) as epoch ms.

    A time without a zone is taken as UTC.
    """
    if isinstance(value, bool):
        raise BadRecord(f"{what} must be an ISO 8601 time, got boolean")
    if isinstance(value, int | float):
        # NaN and infinities parse as JSON numbers (Python's json reads them); they
        # and times past year 9999 are a bad record, never a raw ValueError.
        if not math.isfinite(value) or value > MAX_TIME_MS:
            raise BadRecord(f"{what} must be a time in epoch milliseconds, got {value!r}")
        if value < 0:
            raise BadRecord(f"{what} must not be negative")
        return int(value)
    if not isinstance(value, str):
        raise BadRecord(f"{what} must be an ISO 8601 time, got {type_name(value)}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadRecord(f"{what} is not an ISO 8601 time: {value[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ms = int(moment.timestamp() * 1000)
    if ms < 0:
        raise BadRecord(f"{what} is before 1970: {value[:40]!r}")
    if ms > MAX_TIME_MS:
        # Year 9999 in a zone west of UTC is still later than that in UTC.
        raise BadRecord(f"{what} is after year 9999: {value[:40]!r}")
    return ms


def tool_input(value: object, what: str) -> dict[str, Any]:
    """A tool call's input object."""
    if value is None:
        return {}
    return as_object(value, what)


# ---------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------


def read_bytes(path: Path) -> bytes:
    """Read a whole file; I/O errors become a :class:`TranscriptError`."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TranscriptError(
            f"cannot read the file: {exc.strerror or exc}", path=str(path)
        ) from exc


def decode_line(raw: bytes) -> str:
    """One line of a JSONL file as text, or :class:`BadRecord`."""
    if b"\x00" in raw:
        raise BadRecord("binary data (NUL bytes), not JSON text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord("not UTF-8 text") from None


def parse_json_line(text: str) -> Any:
    """One JSONL line parsed, or :class:`BadRecord` saying where it breaks."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        snippet = text.strip()[:60]
        raise BadRecord(f"invalid JSON ({exc.msg} at column {exc.colno}): {snippet!r}") from None
    except RecursionError:
        raise BadRecord("JSON nested too deeply") from None


def split_lines(data: bytes) -> list[tuple[int, bytes]]:
    """Non-blank lines of a file with their 1-based numbers (a BOM is dropped)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    out: list[tuple[int, bytes]] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            out.append((number, raw.rstrip(b"\r")))
    return out


class Problems:
    """Collects malformed records: raises in strict mode, records them otherwise."""

    def __init__(self, *, strict: bool) -> None:
        self.strict = strict
        self.skipped: list[SkippedLine] = []

    def report(self, path: Path, line: int | None, reason: str) -> None:
        """Raise :class:`TranscriptError` (strict) or remember the skipped record."""
        if self.strict:
            raise TranscriptError(reason, path=str(path), line=line)
        self.skipped.append(SkippedLine(str(path), line, reason))


def iter_jsonl_objects(
    path: Path, data: bytes, problems: Problems
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for each well-formed JSONL line.

    Lines that are not JSON objects go to ``problems``.
    """
    for number, raw in split_lines(data):
        try:
            value = parse_json_line(decode_line(raw))
            obj = as_object(value, "a line")
        except BadRecord as exc:
            problems.report(path, number, exc.reason)
            continue
        yield number, obj


def parse_json_document(path: Path, data: bytes) -> tuple[Any, str]:
    """A whole-file JSON document and its text; errors name the line."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TranscriptError("not UTF-8 text", path=str(path), line=line) from None
    try:
        return json.loads(text), text
    except json.JSONDecodeError as exc:
        raise TranscriptError(
            f"invalid JSON ({exc.msg} at column {exc.colno})", path=str(path), line=exc.lineno
        ) from None
    except RecursionError:
        raise TranscriptError("JSON nested too deeply", path=str(path)) from None


_WS: Final = " \t\r\n"


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def locate_array_items(text: str, key: str | None) -> list[int] | None:
    """Line numbers where each item of a JSON array starts.

    ``key=None`` means the document itself is the array; otherwise the array is
    the value of ``key`` in the top-level object. Used only to name lines in
    error messages, so any surprise returns ``None`` instead of failing.
    """
    decoder = json.JSONDecoder()
    try:
        pos = _skip_ws(text, 0)
        if key is not None:
            if text[pos] != "{":
                return None
            pos = _skip_ws(text, pos + 1)
            while True:
                name, pos = decoder.raw_decode(text, pos)
                pos = _skip_ws(text, pos)
                if text[pos] != ":":
                    return None
                pos = _skip_ws(text, pos + 1)
                if name == key:
                    break
                _, pos = decoder.raw_decode(text, pos)
                pos = _skip_ws(text, pos)
                if text[pos] != ",":
                    return None
                pos = _skip_ws(text, pos + 1)
        if text[pos] != "[":
            return None
        pos = _skip_ws(text, pos + 1)
        starts: list[int] = []
        if text[pos] == "]":
            return starts
        line = 1
        counted = 0
        while True:
            line += text.count("\n", counted, pos)
            counted = pos
            starts.append(line)
            _, pos = decoder.raw_decode(text, pos)
            pos = _skip_ws(text, pos)
            if text[pos] == "]":
                return starts
            if text[pos] != ",":
                return None
            pos = _skip_ws(text, pos + 1)
    except (ValueError, IndexError, RecursionError):
        return None


# ---------------------------------------------------------------------------
# Drafts: validated content, turned into Messages at the end (mimo_ctx.convert)
# ---------------------------------------------------------------------------


def orphan_result_draft(
    call_id: str,
    output: str,
    *,
    is_error: bool = False,
    attachments: Sequence[FilePart] = (),
    end: int | None,
    agent: str,
    why: str,
) -> MessageDraft:
    """A ``tool`` message for a result whose call is not in the transcript (or was
    already answered).

    Keeping it (instead of dropping it or turning it into user text) loses no
    data and keeps tool output out of user text.
    """
    part = ToolResultPart(
        call_id=call_id,
        tool=_UNKNOWN_TOOL,
        output=output,
        is_error=is_error,
        time=ToolTime(end=end),
        attachments=list(attachments) or None,
    )
    return MessageDraft(role="tool", time=end, agent=agent, parts=[part], metadata={"orphan": why})


def build_transcript_messages(drafts: Sequence[MessageDraft], session_id: str) -> list[Message]:
    """Turn drafts (in conversation order, each with its own time) into messages.

    :func:`mimo_ctx.convert.build_messages` with the transcript's rules: every
    draft is kept (an empty turn too), and finish reasons are the ones the
    importer decided (:func:`~mimo_ctx.convert.infer_finish`).
    """
    return build_messages(drafts, session_id=session_id, keep_empty=True)


def new_session(
    *,
    session_id: str | None,
    time_created: int,
    title: str,
    fmt: str,
    source: Path,
    metadata: Mapping[str, Any] | None = None,
    system: str | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> Session:
    """The session an import creates (not stored)."""
    meta: dict[str, Any] = {"imported_from": {"format": fmt, "path": str(source)}}
    if metadata:
        meta.update(metadata)
    prefix = None
    if system is not None or tools:
        prefix = RequestPrefix(system=system or "", tools=tools or [])
    sid = session_id if session_id is not None else ids.ascending("ses", timestamp_ms=time_created)
    return Session(
        id=sid,
        title=title,
        time_created=time_created,
        prefix=prefix,
        metadata=meta,
    )


def file_time_ms(path: Path) -> int:
    """The file's modification time in epoch ms (base for formats without times)."""
    try:
        return max(0, int(path.stat().st_mtime * 1000))
    except OSError:
        return 0


def first_line(text: str, limit: int = 80) -> str:
    """The first non-blank line of ``text``, cut to ``limit`` characters (a title).

    Cut as digest text is (:func:`mimo_ctx.digest.truncate`: on a near word boundary).
    """
    for line in text.splitlines():
        if line.strip():
            return truncate(line, limit)
    return ""
