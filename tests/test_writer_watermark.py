"""The writer's watermark is computed on the newest messages, equal to the full history's
(SPEC R2.1–R2.6): a writer run need not read the whole session to place it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo_ctx.boundary import adjust_boundary_for_api_invariants, compute_boundary
from mimo_ctx.checkpoint import OfflineCheckpointWriter
from mimo_ctx.checkpoint._coordinator import WATERMARK_PAGE, WriterCoordinator
from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import EventBus
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import Message, TextPart, TokenUsage, ToolPart, ToolStateCompleted
from mimo_ctx.store import InMemoryStore, Session


def _session_messages(sid: str, count: int, *, finished_tail: bool) -> list[Message]:
    messages: list[Message] = []
    for i in range(count):
        if i % 2 == 0:
            messages.append(
                Message(
                    session_id=sid, role="user", time_created=i + 1, parts=[TextPart(text=f"u{i}")]
                )
            )
        else:
            finished = finished_tail or i < count - 2 * WATERMARK_PAGE
            messages.append(
                Message(
                    session_id=sid,
                    role="assistant",
                    time_created=i + 1,
                    finish="tool-calls" if finished else None,
                    usage=TokenUsage(input=10),
                    parts=[
                        ToolPart(
                            call_id=f"c{i}",
                            tool="read",
                            state=ToolStateCompleted(input={"i": i}, output="x" * (40 + i % 90)),
                        )
                    ],
                )
            )
    return messages


@pytest.mark.parametrize("finished_tail", [True, False])
async def test_r2_watermark_on_the_newest_messages_equals_the_full_history(
    tmp_path: Path, finished_tail: bool
) -> None:
    store = InMemoryStore()
    session = Session(time_created=1)
    await store.create_session(session)
    messages = _session_messages(session.id, 2 * WATERMARK_PAGE + 500, finished_tail=finished_tail)
    await store.append_messages(messages)
    config = RebuildConfig()
    coordinator = WriterCoordinator(
        store,
        MemoryLayout(tmp_path),
        config,
        OfflineCheckpointWriter(),
        EventBus(),
    )
    expected = compute_boundary(messages, config)
    assert expected is not None
    expected = adjust_boundary_for_api_invariants(messages, expected)
    got = await coordinator._next_watermark(session.id)  # pyright: ignore[reportPrivateUsage]
    assert got == expected
