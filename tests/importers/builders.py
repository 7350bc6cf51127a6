"""Small builders for Claude Code JSONL written by the tests themselves."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["assistant", "iso", "system", "tool_result", "tool_use", "user", "write_jsonl"]

_BASE = "2026-01-01T00:00:00.000Z"


def iso(seconds: float) -> str:
    """An ISO time ``seconds`` after 2026-01-01T00:00:00Z."""
    ms = round(seconds * 1000)
    minutes, rest = divmod(ms, 60_000)
    secs, millis = divmod(rest, 1000)
    hours, minutes = divmod(minutes, 60)
    return f"2026-01-01T{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}Z"


def user(
    uuid: str, parent: str | None, at: float, content: str | list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """A ``user`` line."""
    return {
        "type": "user",
        "uuid": uuid,
        "parentUuid": parent,
        "timestamp": iso(at),
        "isSidechain": False,
        "sessionId": "s-1",
        "message": {"role": "user", "content": content},
        **extra,
    }


def assistant(
    uuid: str,
    parent: str | None,
    at: float,
    content: list[dict[str, Any]],
    *,
    msg_id: str,
    stop_reason: str | None = None,
    usage: dict[str, int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An ``assistant`` line (one content block of a response, as Claude Code writes)."""
    return {
        "type": "assistant",
        "uuid": uuid,
        "parentUuid": parent,
        "timestamp": iso(at),
        "isSidechain": False,
        "message": {
            "id": msg_id,
            "role": "assistant",
            "model": "claude-test",
            "content": content,
            "stop_reason": stop_reason,
            "usage": usage or {"input_tokens": 10, "output_tokens": 5},
        },
        **extra,
    }


def system(uuid: str, parent: str | None, at: float, **extra: Any) -> dict[str, Any]:
    """A ``system`` line."""
    return {"type": "system", "uuid": uuid, "parentUuid": parent, "timestamp": iso(at), **extra}


def tool_use(call_id: str, name: str = "Bash", **args: Any) -> dict[str, Any]:
    """A ``tool_use`` block."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def tool_result(call_id: str, text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A ``tool_result`` block."""
    return {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": is_error}


def write_jsonl(path: Path, lines: Sequence[Mapping[str, object] | str]) -> Path:
    """Write lines (objects as JSON, strings as they are) and return the path."""
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return path
