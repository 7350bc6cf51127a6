"""Message and session builders shared by the store tests."""

from __future__ import annotations

from typing import Any

from mimo_ctx.messages import (
    MAIN_AGENT,
    CheckpointPart,
    CompactionPart,
    FilePart,
    Message,
    MessageFailure,
    OpaquePart,
    Part,
    ReasoningPart,
    SubtaskPart,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    ToolTime,
)
from mimo_ctx.store import Actor, RequestPrefix, Session, Task

__all__ = [
    "T0",
    "actor",
    "assistant",
    "boundary",
    "every_part_message",
    "ids_of",
    "make_session",
    "task",
    "user",
]

T0 = 1_750_000_000_000
"""A fixed epoch-ms origin for test timestamps."""


def make_session(t: int = T0, **fields: Any) -> Session:
    """A session created at ``t`` with a frozen prefix (exercises nested JSON)."""
    return Session(
        time_created=t,
        title="test session",
        prefix=RequestPrefix(
            system="You are a test agent. 你好",
            tools=[{"name": "read", "parameters": {"type": "object", "properties": {}}}],
        ),
        **fields,
    )


def user(session_id: str, text: str, *, t: int, agent: str = MAIN_AGENT) -> Message:
    """A user message with one text part."""
    return Message(
        session_id=session_id, role="user", agent=agent, time_created=t, parts=[TextPart(text=text)]
    )


def assistant(
    session_id: str,
    text: str,
    *,
    t: int,
    agent: str = MAIN_AGENT,
    finish: str | None = "stop",
    parts: list[Part] | None = None,
) -> Message:
    """An assistant message; finished (``finish`` set, with usage) unless ``finish=None``."""
    return Message(
        session_id=session_id,
        role="assistant",
        agent=agent,
        time_created=t,
        time_completed=None if finish is None else t + 1,
        finish=finish,
        usage=None if finish is None else TokenUsage(input=100, output=20),
        parts=[TextPart(text=text), *(parts or [])],
    )


def boundary(
    session_id: str,
    covered_up_to: str,
    *,
    t: int,
    agent: str = MAIN_AGENT,
    kind: str = "checkpoint",
) -> Message:
    """A rebuild boundary (``checkpoint``) or plain compaction (``compaction``) user message."""
    special: Part = (
        CheckpointPart(covered_up_to=covered_up_to, number=1)
        if kind == "checkpoint"
        else CompactionPart(summary="summary of earlier work")
    )
    return Message(
        session_id=session_id,
        role="user",
        agent=agent,
        time_created=t,
        parts=[special, TextPart(text="## Checkpoint\nbody", synthetic=True)],
    )


def every_part_message(session_id: str, *, t: int = T0) -> Message:
    """An assistant message holding every part kind and every tool state."""
    attachment = FilePart(
        mime="image/png", url="data:image/png;base64,iVBORw0KGgo=", filename="a.png"
    )
    parts: list[Part] = [
        TextPart(text="plain ✓ 🎉 \u0000 control"),
        TextPart(text="synthetic", synthetic=True, ignored=True),
        ReasoningPart(text="thinking…", signature="sig==", redacted=False),
        ReasoningPart(
            text="", redacted=True, provider_data={"encrypted_content": "gAAA", "n": [1, 2.5, None]}
        ),
        ToolPart(call_id="c1", tool="read", state=ToolStatePending(input={"path": "a.py"})),
        ToolPart(
            call_id="c2",
            tool="bash",
            state=ToolStateRunning(input={"cmd": "ls"}, title="ls", time=ToolTime(start=t)),
        ),
        ToolPart(
            call_id="c3",
            tool="read",
            state=ToolStateCompleted(
                input={"path": "b.py", "nested": {"deep": [1, {"x": "y"}]}},
                output="file contents\n" * 3,
                title="b.py",
                metadata={"lines": 3, "truncated": False},
                attachments=[attachment],
                time=ToolTime(start=t, end=t + 5, compacted=t + 10),
            ),
        ),
        ToolPart(
            call_id="c4",
            tool="grep",
            state=ToolStateError(input={"q": "x"}, error="boom", time=ToolTime(start=t, end=t)),
        ),
        ToolResultPart(call_id="c5", tool="bash", output="ok", is_error=True, time=ToolTime(end=t)),
        attachment.model_copy(update={"id": "prt_attachment_2"}),
        SubtaskPart(agent="explorer", description="look around", prompt="find x", command="/x"),
        CheckpointPart(covered_up_to="msg_x", digest_up_to="msg_y", directory="/m", number=3),
        CompactionPart(summary="compacted", auto=False),
        OpaquePart(source="pydantic-ai", kind="builtin-tool-call", data={"k": [True, None, 1e-3]}),
    ]
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=t,
        time_completed=t + 99,
        finish="tool-calls",
        error=MessageFailure(name="APIError", message="partial", aborted=True),
        usage=TokenUsage(input=1, output=2, reasoning=3, cache_read=4, cache_write=5, total=15),
        summary=True,
        provider_message_id="resp_123",
        model="gpt-5",
        parts=parts,
        metadata={"host": {"trace": ["a", 1, None, 2.5]}, "ünïcode": "値"},
    )


def task(session_id: str, task_id: str, *, status: str = "open", summary: str = "") -> Task:
    """A task of ``session_id``."""
    return Task.model_validate(
        {
            "id": task_id,
            "session_id": session_id,
            "parent_id": task_id.rpartition(".")[0] or None,
            "status": status,
            "summary": summary or f"task {task_id}",
            "time_created": T0,
            "time_updated": T0,
        }
    )


def actor(
    session_id: str,
    actor_id: str,
    *,
    status: str = "running",
    background: bool = True,
    t: int = T0,
) -> Actor:
    """An actor of ``session_id``."""
    return Actor.model_validate(
        {
            "id": actor_id,
            "session_id": session_id,
            "agent": "explorer",
            "description": f"actor {actor_id}",
            "status": status,
            "background": background,
            "time_created": t,
            "time_last_activity": t,
        }
    )


def ids_of(messages: list[Message]) -> list[str]:
    """The ids of ``messages``, in order."""
    return [m.id for m in messages]
