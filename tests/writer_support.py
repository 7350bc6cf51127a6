"""A checkpoint writer's request and watermark from a list of messages, for the writer tests.

The paths are placeholders: a writer's ``build`` only names them in the text, it never
opens them, so the tests that build a draft from messages share one request shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mimo_ctx.boundary import adjust_boundary_for_api_invariants, compute_boundary
from mimo_ctx.checkpoint import WriterRequest, section_budgets
from mimo_ctx.config import RebuildConfig, TailConfig
from mimo_ctx.messages import Message

WRITER_CONFIG = RebuildConfig(tail=TailConfig(min_tokens=300, max_tokens=900))
"""A tail small enough that a few turns of a random session move the watermark."""


def whole_history_watermark(messages: Sequence[Message]) -> str | None:
    """The watermark computed on every message at once, under `WRITER_CONFIG`."""
    boundary = compute_boundary(messages, WRITER_CONFIG)
    return None if boundary is None else adjust_boundary_for_api_invariants(messages, boundary)


def writer_request(
    messages: Sequence[Message], *, budgets: Mapping[int, int] | None = None, **extra: Any
) -> WriterRequest:
    """A request covering ``messages`` up to the last one, for session ``ses_x``.

    Args:
        messages: What the writer sees; the watermark is the last one's id.
        budgets: Token budget per section; the configured defaults when ``None``,
            ``{}`` for no budget at all.
        **extra: Any other `WriterRequest` field, replacing its default here.
    """
    request = WriterRequest(
        session_id="ses_x",
        project_id="default",
        watermark=messages[-1].id if messages else "",
        messages=messages,
        previous_checkpoint=None,
        notes=None,
        tasks=[],
        checkpoint_path=Path("checkpoint.md"),
        project_memory_path=Path("MEMORY.md"),
        notes_path=Path("notes.md"),
        tasks_dir=Path("tasks"),
        budgets=section_budgets() if budgets is None else budgets,
    )
    return dataclasses.replace(request, **extra)
