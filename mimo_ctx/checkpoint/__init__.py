"""Checkpoints: the writer protocol, the ``checkpoint.md`` document, the writer lease.

* :mod:`~mimo_ctx.checkpoint.protocol` — what a checkpoint writer gets
  (:class:`WriterRequest`) and returns (:class:`CheckpointDraft`);
* :mod:`~mimo_ctx.checkpoint.document` — the ``checkpoint.md`` layout (SPEC A14),
  pure;
* :mod:`~mimo_ctx.checkpoint.lease` — one writer per session across workers;
* ``_coordinator`` (private) — runs the writers in the background for the
  middleware: one per session plus a one-slot queue, the usage thresholds, the
  waits, the lease.

* the built-in writers: :mod:`~mimo_ctx.checkpoint.offline` (no model; its rules in
  :mod:`~mimo_ctx.checkpoint.evidence`, its state in :mod:`~mimo_ctx.checkpoint.state`,
  its sections in :mod:`~mimo_ctx.checkpoint.sections`, all pure) and
  :mod:`~mimo_ctx.checkpoint.llm` (a model: forked from the session's own request
  when it is the session's model, else standalone, bounded by the model's window).
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
from mimo_ctx.checkpoint.llm import (
    CompletionFn,
    LLMCheckpointWriter,
    ModelAnswer,
    WriterModel,
    WriterPrompt,
    parse_llm_answer,
)
from mimo_ctx.checkpoint.offline import OfflineCheckpointWriter
from mimo_ctx.checkpoint.protocol import (
    CheckpointDraft,
    CheckpointWriter,
    SentApi,
    SentRequest,
    WriterMeter,
    WriterRequest,
)

__all__ = [
    "CHECKPOINT_SECTIONS",
    "CheckpointDraft",
    "CheckpointSection",
    "CheckpointWriter",
    "CompletionFn",
    "InMemoryWriterLease",
    "LLMCheckpointWriter",
    "LeaseHolder",
    "LeaseInfo",
    "ModelAnswer",
    "OfflineCheckpointWriter",
    "SentApi",
    "SentRequest",
    "StartResult",
    "WaitResult",
    "WriterLease",
    "WriterMeter",
    "WriterModel",
    "WriterPrompt",
    "WriterRequest",
    "parse_checkpoint",
    "parse_llm_answer",
    "render_checkpoint",
    "section_budgets",
    "topic_of",
]
