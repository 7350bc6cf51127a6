"""The summary of a plain compaction (SPEC R1.4a): the offline writer's, within a room.

Private to the rebuild step (:class:`~mimo_ctx.rebuild.Rebuilder`), which inserts it
for sub-agents and as the fallback of A3.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mimo_ctx.checkpoint.document import is_index_line, render_checkpoint, section_budgets
from mimo_ctx.checkpoint.offline import OfflineCheckpointWriter
from mimo_ctx.checkpoint.protocol import WriterRequest
from mimo_ctx.config import PushCaps
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import Message
from mimo_ctx.session import Session, Task
from mimo_ctx.tokens import estimate_text_tokens

__all__ = ["SUMMARY_MARGIN", "compaction_summary"]

SUMMARY_MARGIN: Final = 64
"""Tokens kept free under the line for the summary message's own framing."""


async def compaction_summary(
    session: Session,
    covered: Sequence[Message],
    *,
    watermark: str,
    tasks: Sequence[Task],
    layout: MemoryLayout,
    push_caps: PushCaps,
    room: int,
) -> str:
    """The offline writer's summary of ``covered`` (up to ``watermark``) in ``room`` tokens.

    Like a rebuild body (R5.9 beyond) the summary gets only the room the live
    messages leave: the writer's section budgets shrink in proportion, and the
    spill-over index lines are dropped (a compaction writes no spill-over file for
    them to name).
    """
    # Off the event loop: the offline writer's build is CPU work (a thread).
    draft = await OfflineCheckpointWriter().write(
        WriterRequest(
            session_id=session.id,
            project_id=session.project_id,
            watermark=watermark,
            messages=covered,
            previous_checkpoint=None,
            notes=None,
            tasks=tasks,
            checkpoint_path=layout.checkpoint_path(session.id),
            project_memory_path=layout.project_memory_path(session.project_id),
            notes_path=layout.notes_path(session.id),
            tasks_dir=layout.tasks_dir(session.id),
            budgets=_fitted_budgets(section_budgets(push_caps), room),
        )
    )
    return "\n".join(line for line in draft.text.split("\n") if not is_index_line(line))


def _fitted_budgets(budgets: dict[int, int], room: int) -> dict[int, int]:
    """Section budgets shrunk in proportion so the bodies add up to at most ``room``.

    The skeleton (topic, headings, instruction lines) comes on top: a summary
    never fits in less than that, and ``room`` below it leaves every body empty.
    """
    total = sum(budgets.values())
    room = max(0, room - _SKELETON_TOKENS)
    if total <= room:
        return budgets
    return {number: budget * room // total for number, budget in budgets.items()}


_SKELETON_TOKENS: Final = estimate_text_tokens(render_checkpoint("", {}))
"""Tokens of an empty A14 checkpoint: the part of a summary no budget shrinks."""
