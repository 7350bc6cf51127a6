"""Deprecated alias: the checkpoint-writer protocol and lease moved to :mod:`mimo_ctx.checkpoint`.

Kept while the built-in writers (:mod:`mimo_ctx.checkpoint_writers`) still import
from here; import from :mod:`mimo_ctx.checkpoint` instead.
"""

from __future__ import annotations

from mimo_ctx.checkpoint import (
    CheckpointDraft,
    CheckpointWriter,
    InMemoryWriterLease,
    LeaseInfo,
    StartResult,
    WaitResult,
    WriterLease,
    WriterRequest,
)

__all__ = [
    "CheckpointDraft",
    "CheckpointWriter",
    "InMemoryWriterLease",
    "LeaseInfo",
    "StartResult",
    "WaitResult",
    "WriterLease",
    "WriterRequest",
]
