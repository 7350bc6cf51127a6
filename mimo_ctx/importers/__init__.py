"""Import real agent transcripts into the message model.

``load_transcript(path)`` reads a transcript, detects its format and returns an
:class:`ImportedTranscript`: a new :class:`~mimo_ctx.store.base.Session`, its
messages (ids ascending in conversation order, SPEC A1; sub-agent messages
included with their own ``agent``), the compactions the transcript recorded, and
what was left out.

Formats (``format=`` or detected):

* ``claude-code`` -- Claude Code session JSONL (lines with ``type`` / ``uuid`` /
  ``message``); sub-agent files beside it are loaded too (:mod:`.claude_code`).
* ``sweagent`` -- SWE-agent ``.traj`` (a JSON object with ``history``).
* ``openai-chat`` -- a JSON array of ``{role, content}`` messages, an object with
  ``messages``, or JSONL of messages.
* ``openai-responses`` -- Responses API items (an array of typed items, or an
  object with ``input``).

Malformed input raises :class:`~mimo_ctx.errors.TranscriptError` naming the file
and line (``strict=True``, the default). With ``strict=False`` malformed lines or
messages are skipped and listed in :attr:`ImportedTranscript.skipped`; a file
that is empty, binary or of no known format is an error in both modes, since
there is nothing to import. No other exception escapes.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread

from mimo_ctx.errors import TranscriptError
from mimo_ctx.importers._common import (
    FORMAT_CLAUDE_CODE,
    FORMAT_OPENAI_CHAT,
    FORMAT_OPENAI_RESPONSES,
    FORMAT_SWEAGENT,
    FORMATS,
    ImportedTranscript,
    SkippedLine,
    TranscriptCompaction,
    decode_line,
    file_time_ms,
    is_array,
    is_object,
    parse_json_document,
    parse_json_line,
    read_bytes,
    split_lines,
    type_name,
)
from mimo_ctx.importers._common import BadRecord as _BadRecord
from mimo_ctx.importers.claude_code import find_subagent_files, import_claude_code
from mimo_ctx.importers.openai_chat import (
    RESPONSES_ITEM_TYPES,
    import_openai_chat,
    import_openai_responses,
)
from mimo_ctx.importers.sweagent import import_sweagent

__all__ = [
    "FORMATS",
    "ImportedTranscript",
    "SkippedLine",
    "TranscriptCompaction",
    "aload_transcript",
    "detect_format",
    "find_subagent_files",
    "load_transcript",
]

_CLAUDE_CODE_KEYS = ("uuid", "message", "sessionId", "leafUuid", "messageId", "parentUuid")


def _format_of_object(obj: dict[str, Any]) -> str | None:
    """The format one JSON object (a whole document or a JSONL line) belongs to."""
    if is_array(obj.get("history")):
        return FORMAT_SWEAGENT
    if is_array(obj.get("messages")):
        return FORMAT_OPENAI_CHAT
    kind = obj.get("type")
    if isinstance(kind, str):
        if any(k in obj for k in _CLAUDE_CODE_KEYS):
            return FORMAT_CLAUDE_CODE
        if kind in RESPONSES_ITEM_TYPES:
            return FORMAT_OPENAI_RESPONSES
        return FORMAT_CLAUDE_CODE
    if is_array(obj.get("input")):
        return FORMAT_OPENAI_RESPONSES
    if isinstance(obj.get("role"), str):
        return FORMAT_OPENAI_CHAT
    return None


def _format_of_array(items: list[Any]) -> str | None:
    objects = [item for item in items if is_object(item)]
    if not objects:
        return FORMAT_OPENAI_CHAT if not items else None
    obj = objects[0]
    kind = obj.get("type")
    if isinstance(kind, str) and kind in RESPONSES_ITEM_TYPES:
        return FORMAT_OPENAI_RESPONSES
    if isinstance(obj.get("role"), str):
        return FORMAT_OPENAI_CHAT
    return None


def _first_bad_byte_line(data: bytes) -> int | None:
    at = data.find(b"\x00")
    return None if at < 0 else data[:at].count(b"\n") + 1


def _detect(path: Path, data: bytes, *, strict: bool) -> tuple[str, object | None, str | None]:
    """Detect the format; returns it with the parsed document for JSON formats."""
    rows = split_lines(data)
    if not rows:
        raise TranscriptError("empty file, not a transcript", path=str(path), line=1)
    nul_line = _first_bad_byte_line(data)
    document_error: TranscriptError | None = None
    if nul_line is None:
        try:
            document, text = parse_json_document(path, data)
        except TranscriptError as exc:
            document_error = exc
        else:
            if is_object(document):
                fmt = _format_of_object(document)
                if fmt is not None:
                    single_record = (
                        fmt == FORMAT_CLAUDE_CODE
                        or (fmt == FORMAT_OPENAI_CHAT and "messages" not in document)
                        or (fmt == FORMAT_OPENAI_RESPONSES and "input" not in document)
                    )
                    if single_record:
                        return fmt, None, None  # a one-line JSONL file
                    return fmt, document, text
                raise TranscriptError(
                    "unknown transcript format: a JSON object without 'history', "
                    "'messages' or 'input'",
                    path=str(path),
                    line=1,
                )
            if is_array(document):
                fmt = _format_of_array(document)
                if fmt is not None:
                    return fmt, document, text
                raise TranscriptError(
                    "unknown transcript format: the array's items are not chat messages "
                    "(objects with 'role') nor Responses API items",
                    path=str(path),
                    line=1,
                )
            raise TranscriptError(
                f"wrong top-level type: expected a JSON object or array, got {type_name(document)}",
                path=str(path),
                line=1,
            )
    # Not one JSON document: JSONL. The first object line decides the format.
    first_problem: tuple[int, str] | None = None
    for number, raw in rows:
        try:
            value = parse_json_line(decode_line(raw))
        except _BadRecord as exc:
            first_problem = first_problem or (number, exc.reason)
            if strict:
                break
            continue
        if is_object(value):
            fmt = _format_of_object(value)
            if fmt in (FORMAT_CLAUDE_CODE, FORMAT_OPENAI_CHAT, FORMAT_OPENAI_RESPONSES):
                return fmt, None, None
        first_problem = first_problem or (
            number,
            f"unknown transcript format: a line holding a JSON {type_name(value)} "
            "that is not a transcript record",
        )
        if strict:
            break
    if nul_line is not None:
        raise TranscriptError(
            "binary file (NUL bytes), not a transcript", path=str(path), line=nul_line
        )
    first_raw = rows[0][1].strip()
    looks_like_jsonl = first_raw.startswith(b"{") and first_raw.endswith(b"}")
    if document_error is not None and not looks_like_jsonl:
        raise document_error
    assert first_problem is not None  # rows is non-empty and nothing matched
    raise TranscriptError(first_problem[1], path=str(path), line=first_problem[0])


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return the format name of a transcript file (one of :data:`FORMATS`).

    Raises:
        TranscriptError: The file cannot be read, is empty, binary, or of no known format.
    """
    p = Path(path)
    return _detect(p, read_bytes(p), strict=True)[0]


def load_transcript(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    strict: bool = True,
    session_id: str | None = None,
    subagents: Sequence[str | os.PathLike[str]] | None = None,
    base_time_ms: int | None = None,
) -> ImportedTranscript:
    """Read a transcript file into a new session and its messages.

    Synchronous (it parses in memory); use :func:`aload_transcript` from async code.

    Args:
        path: The transcript file.
        format: One of :data:`FORMATS`; detected from the content when ``None``.
        strict: Raise on the first malformed line (default). With ``False``,
            malformed lines are skipped and listed in ``skipped``.
        session_id: Id of the new session; a new ascending id when ``None``.
        subagents: Claude Code only: sub-agent transcript files to import with
            the main file. ``None`` loads the ones found beside it
            (:func:`find_subagent_files`); ``[]`` loads none.
        base_time_ms: Formats without timestamps (OpenAI, SWE-agent): time of
            the first message; the file's modification time when ``None``.

    Returns:
        The imported transcript.

    Raises:
        TranscriptError: The file cannot be read, is empty, binary or of unknown
            format, or (strict) holds a malformed line; the message names the
            file and line.
    """
    p = Path(path)
    try:
        return _load(
            p,
            format=format,
            strict=strict,
            session_id=session_id,
            subagents=subagents,
            base_time_ms=base_time_ms,
        )
    except TranscriptError:
        raise
    except RecursionError as exc:
        raise TranscriptError("the transcript is nested too deeply", path=str(p)) from exc
    except Exception as exc:
        # The boundary promised to callers: no raw traceback, always the file.
        raise TranscriptError(
            f"cannot import the transcript: {type(exc).__name__}: {exc}", path=str(p)
        ) from exc


def _load(
    p: Path,
    *,
    format: str | None,
    strict: bool,
    session_id: str | None,
    subagents: Sequence[str | os.PathLike[str]] | None,
    base_time_ms: int | None,
) -> ImportedTranscript:
    data = read_bytes(p)
    if format is None:
        fmt, document, text = _detect(p, data, strict=strict)
    else:
        if format not in FORMATS:
            raise TranscriptError(
                f"unknown format {format!r}; expected one of {', '.join(FORMATS)}",
                path=str(p),
            )
        if not split_lines(data):
            raise TranscriptError("empty file, not a transcript", path=str(p), line=1)
        fmt, document, text = format, None, None
        if format != FORMAT_CLAUDE_CODE:
            document, text = _document_or_jsonl(p, data, format)
    if fmt == FORMAT_CLAUDE_CODE:
        return import_claude_code(
            p,
            data,
            strict=strict,
            session_id=session_id,
            subagents=None if subagents is None else [Path(s) for s in subagents],
        )
    base = file_time_ms(p) if base_time_ms is None else base_time_ms
    if base < 0:
        raise TranscriptError(f"base_time_ms must not be negative, got {base}", path=str(p))
    if fmt == FORMAT_SWEAGENT:
        if document is None or text is None:
            raise TranscriptError("a SWE-agent trajectory must be one JSON object", path=str(p))
        return import_sweagent(
            p, data, document, text, strict=strict, session_id=session_id, base_time=base
        )
    importer = import_openai_chat if fmt == FORMAT_OPENAI_CHAT else import_openai_responses
    return importer(p, data, document, text, strict=strict, session_id=session_id, base_time=base)


def _document_or_jsonl(path: Path, data: bytes, fmt: str) -> tuple[object | None, str | None]:
    """For an explicit JSON format: the whole document, or ``None`` for JSONL input."""
    try:
        return parse_json_document(path, data)
    except TranscriptError:
        rows = split_lines(data)
        if fmt != FORMAT_SWEAGENT and len(rows) > 1:
            first = rows[0][1].strip()
            if first.startswith(b"{") and first.endswith(b"}"):
                return None, None
        raise


async def aload_transcript(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    strict: bool = True,
    session_id: str | None = None,
    subagents: Sequence[str | os.PathLike[str]] | None = None,
    base_time_ms: int | None = None,
) -> ImportedTranscript:
    """:func:`load_transcript` run in a worker thread, off the event loop.

    Same arguments, result and errors as :func:`load_transcript`.
    """
    call = functools.partial(
        load_transcript,
        path,
        format=format,
        strict=strict,
        session_id=session_id,
        subagents=subagents,
        base_time_ms=base_time_ms,
    )
    return await anyio.to_thread.run_sync(call)
