"""Claude Code JSONL lines parsed and validated (see :mod:`mimo_ctx.importers.claude_code`).

Private to the Claude Code importer: one :class:`Line` per valid line, its content
blocks converted to parts; a bad line is reported to :class:`Problems` and skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from mimo_ctx.convert import make_data_url, tool_result_content
from mimo_ctx.importers._common import (
    BadRecord,
    Problems,
    as_list,
    as_object,
    is_array,
    is_object,
    iter_jsonl_objects,
    opt_bool,
    opt_int,
    opt_str,
    parse_timestamp,
    req_str,
    tool_input,
)
from mimo_ctx.messages import (
    MAIN_AGENT,
    FilePart,
    OpaquePart,
    Part,
    ReasoningPart,
    TextPart,
    TokenUsage,
)

__all__ = ["Line", "ToolResult", "ToolUse", "read_lines"]

_CONVERSATION: Final = frozenset({"user", "assistant"})


@dataclass
class ToolUse:
    id: str
    name: str
    input: dict[str, Any]


@dataclass
class ToolResult:
    tool_use_id: str
    output: str
    is_error: bool
    attachments: list[FilePart]


_Block = Part | ToolUse | ToolResult


@dataclass
class Line:
    """One validated line of a transcript."""

    path: Path
    number: int
    type: str
    uuid: str | None = None
    parent: str | None = None
    logical_parent: str | None = None
    sidechain: bool = False
    agent_id: str | None = None
    # Conversation lines only.
    ts: int = 0
    blocks: list[_Block] = field(default_factory=list["_Block"])
    message_id: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: TokenUsage | None = None
    is_meta: bool = False
    is_compact_summary: bool = False
    is_api_error: bool = False
    # system/compact_boundary lines.
    subtype: str | None = None
    compact_trigger: str | None = None
    compact_pre_tokens: int | None = None
    # summary lines.
    summary: str | None = None
    leaf_uuid: str | None = None
    # Queued messages (queue-operation enqueue, queued_command attachment).
    queued: object = None
    # Session facts (first conversation line that has them).
    session_id: str | None = None
    cwd: str | None = None
    git_branch: str | None = None
    version: str | None = None
    # Set while grouping.
    agent: str = MAIN_AGENT

    @property
    def is_conversation(self) -> bool:
        return self.type in _CONVERSATION


# ---------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------


def _file_part(source: object, what: str, default_mime: str) -> FilePart | None:
    src = as_object(source, what)
    kind = opt_str(src, "type", what)
    if kind == "base64":
        mime = opt_str(src, "media_type", what) or default_mime
        return FilePart(mime=mime, url=make_data_url(mime, req_str(src, "data", what)))
    if kind == "url":
        return FilePart(mime=default_mime, url=req_str(src, "url", what))
    return None


def _media_block(block: dict[str, Any], btype: str, what: str) -> Part:
    default = "image/png" if btype == "image" else "application/octet-stream"
    part = _file_part(block.get("source"), f"{what}.source", default)
    if part is None:
        return OpaquePart(source="claude-code", kind=btype, data=block)
    return part


def _tool_result(block: dict[str, Any], what: str) -> ToolResult:
    tool_use_id = req_str(block, "tool_use_id", what)
    is_error = opt_bool(block, "is_error", what)
    content = block.get("content")
    parts: list[Part] = []
    if isinstance(content, str):
        parts.append(TextPart(text=content))
    elif content is not None:
        for j, raw in enumerate(as_list(content, f"{what}.content")):
            item = as_object(raw, f"{what}.content[{j}]")
            itype = req_str(item, "type", f"{what}.content[{j}]")
            found: Part | None = None
            if itype == "text":
                found = TextPart(text=req_str(item, "text", f"{what}.content[{j}]"))
            elif itype == "image":
                found = _file_part(item.get("source"), f"{what}.content[{j}].source", "image/png")
            parts.append(found or OpaquePart(source="claude-code", kind=itype, data=item))
    # The converter kit's rule: texts, attachments, anything else as a line of JSON.
    output, attachments = tool_result_content(parts)
    return ToolResult(tool_use_id, output, is_error, attachments)


def _blocks(content: object, role: str) -> list[_Block]:
    if isinstance(content, str):
        return [TextPart(text=content)] if content else []
    out: list[_Block] = []
    for i, raw in enumerate(as_list(content, "message.content")):
        what = f"message.content[{i}]"
        block = as_object(raw, what)
        btype = req_str(block, "type", what)
        if btype == "text":
            out.append(TextPart(text=req_str(block, "text", what)))
        elif btype == "thinking" and role == "assistant":
            out.append(
                ReasoningPart(
                    text=req_str(block, "thinking", what),
                    signature=opt_str(block, "signature", what),
                )
            )
        elif btype == "redacted_thinking" and role == "assistant":
            out.append(
                ReasoningPart(text="", signature=opt_str(block, "data", what), redacted=True)
            )
        elif btype == "tool_use" and role == "assistant":
            out.append(
                ToolUse(
                    id=req_str(block, "id", what),
                    name=req_str(block, "name", what),
                    input=tool_input(block.get("input"), f"{what}.input"),
                )
            )
        elif btype == "tool_result" and role == "user":
            out.append(_tool_result(block, what))
        elif btype in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise BadRecord(f"{what}: a {btype!r} block cannot be in a {role} message")
        elif btype in ("image", "document"):
            out.append(_media_block(block, btype, what))
        else:
            out.append(OpaquePart(source="claude-code", kind=btype, data=block))
    return out


def _usage(value: object) -> TokenUsage | None:
    if value is None:
        return None
    usage = as_object(value, "message.usage")
    return TokenUsage(
        input=opt_int(usage, "input_tokens", "message.usage") or 0,
        output=opt_int(usage, "output_tokens", "message.usage") or 0,
        cache_read=opt_int(usage, "cache_read_input_tokens", "message.usage") or 0,
        cache_write=opt_int(usage, "cache_creation_input_tokens", "message.usage") or 0,
    )


def _parse_line(obj: dict[str, Any], path: Path, number: int) -> Line:
    what = "the line"
    line = Line(
        path=path,
        number=number,
        type=req_str(obj, "type", what),
        uuid=opt_str(obj, "uuid", what),
        parent=opt_str(obj, "parentUuid", what),
        logical_parent=opt_str(obj, "logicalParentUuid", what),
        sidechain=opt_bool(obj, "isSidechain", what),
        agent_id=opt_str(obj, "agentId", what),
    )
    if line.type == "system":
        line.subtype = opt_str(obj, "subtype", what)
        meta = obj.get("compactMetadata")
        if line.subtype == "compact_boundary" and meta is not None:
            meta_obj = as_object(meta, "compactMetadata")
            line.compact_trigger = opt_str(meta_obj, "trigger", "compactMetadata")
            line.compact_pre_tokens = opt_int(meta_obj, "preTokens", "compactMetadata")
        return line
    if line.type == "summary":
        line.summary = opt_str(obj, "summary", what)
        line.leaf_uuid = opt_str(obj, "leafUuid", what)
        return line
    if line.type in ("queue-operation", "attachment"):
        return _parse_queued(obj, line)
    if not line.is_conversation:
        return line
    if line.uuid is None:
        raise BadRecord(f"a {line.type} line has no 'uuid'")
    if "timestamp" not in obj:
        raise BadRecord(f"a {line.type} line has no 'timestamp'")
    line.ts = parse_timestamp(obj["timestamp"], "timestamp")
    if "message" not in obj:
        raise BadRecord(f"a {line.type} line has no 'message'")
    message = as_object(obj["message"], "message")
    role = opt_str(message, "role", "message")
    if role is not None and role != line.type:
        raise BadRecord(f"message.role is {role!r} in a {line.type} line")
    if "content" not in message:
        raise BadRecord("message has no 'content'")
    content = message["content"]
    if not (isinstance(content, str) or is_array(content)):
        raise BadRecord("message.content must be a string or an array")
    line.blocks = _blocks(content, line.type)
    line.message_id = opt_str(message, "id", "message")
    line.model = opt_str(message, "model", "message")
    line.stop_reason = opt_str(message, "stop_reason", "message")
    line.usage = _usage(message.get("usage"))
    line.is_meta = opt_bool(obj, "isMeta", what)
    line.is_compact_summary = opt_bool(obj, "isCompactSummary", what)
    line.is_api_error = opt_bool(obj, "isApiErrorMessage", what)
    line.session_id = opt_str(obj, "sessionId", what)
    line.cwd = opt_str(obj, "cwd", what)
    line.git_branch = opt_str(obj, "gitBranch", what)
    line.version = opt_str(obj, "version", what)
    return line


def _parse_queued(obj: dict[str, Any], line: Line) -> Line:
    """A queued message: its content in ``line.queued`` (``None`` for other operations)."""
    if line.type == "queue-operation":
        if opt_str(obj, "operation", "the line") != "enqueue":
            return line
        content = obj.get("content")
    else:
        attachment = obj.get("attachment")
        if not is_object(attachment) or attachment.get("type") != "queued_command":
            return line
        content = attachment.get("prompt")
    if content is None or content == "":
        return line
    if not (isinstance(content, str) or is_array(content)):
        raise BadRecord(f"the queued message of a {line.type} line must be a string or an array")
    if "timestamp" not in obj:
        raise BadRecord(f"a queued message ({line.type} line) has no 'timestamp'")
    line.ts = parse_timestamp(obj["timestamp"], "timestamp")
    line.blocks = _blocks(content, "user")
    line.queued = content
    return line


def read_lines(path: Path, data: bytes, problems: Problems) -> list[Line]:
    lines: list[Line] = []
    for number, obj in iter_jsonl_objects(path, data, problems):
        try:
            lines.append(_parse_line(obj, path, number))
        except BadRecord as exc:
            problems.report(path, number, exc.reason)
    return lines
