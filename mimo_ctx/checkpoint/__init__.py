"""Checkpoints: the writer protocol, the ``checkpoint.md`` document, the writer lease.

* :mod:`~mimo_ctx.checkpoint.protocol` — what a checkpoint writer gets
  (:class:`WriterRequest`) and returns (:class:`CheckpointDraft`);
* :mod:`~mimo_ctx.checkpoint.document` — the ``checkpoint.md`` layout (SPEC A14),
  pure;
* :mod:`~mimo_ctx.checkpoint.lease` — one writer per session across workers;
* ``_coordinator`` (private) — runs the writers in the background for the
  middleware: one per session plus a one-slot queue, the usage thresholds, the
  waits, the lease.

The built-in writers (offline, LLM) are in :mod:`mimo_ctx.checkpoint_writers`.
"""

from __future__ import annotations

from mimo_ctx.checkpoint._coordinator import StartResult, WaitResult
from mimo_ctx.checkpoint.document import (
    CHECKPOINT_SECTIONS,
    CheckpointSection,
    parse_checkpoint,
    render_checkpoint,
    section_budgets,
    topic_of,
)
from mimo_ctx.checkpoint.lease import InMemoryWriterLease, LeaseHolder, LeaseInfo, WriterLease
from mimo_ctx.checkpoint.protocol import CheckpointDraft, CheckpointWriter, WriterRequest

__all__ = [
    "CHECKPOINT_SECTIONS",
    "CheckpointDraft",
    "CheckpointSection",
    "CheckpointWriter",
    "InMemoryWriterLease",
    "LeaseHolder",
    "LeaseInfo",
    "StartResult",
    "WaitResult",
    "WriterLease",
    "WriterRequest",
    "parse_checkpoint",
    "render_checkpoint",
    "section_budgets",
    "topic_of",
]
