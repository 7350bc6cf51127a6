"""mimo_ctx: context rebuild and budgeted injection for long-running asyncio LLM agents.

The public facade. Everything a host needs is importable from here; submodules
hold the details (``mimo_ctx.store``, ``mimo_ctx.providers``,
``mimo_ctx.integrations``, ``mimo_ctx.importers``, ``mimo_ctx.tools``).
"""

from __future__ import annotations

import logging

from mimo_ctx._util import package_version
from mimo_ctx.boundary import BoundaryError, adjust_boundary_for_api_invariants, compute_boundary
from mimo_ctx.budget import read_budgeted, read_budgeted_section_aware
from mimo_ctx.checkpoint import (
    CheckpointDraft,
    CheckpointWriter,
    InMemoryWriterLease,
    LeaseInfo,
    LLMCheckpointWriter,
    OfflineCheckpointWriter,
    WriterLease,
    WriterRequest,
)
from mimo_ctx.config import PushCaps, RebuildConfig, TailConfig, WriterConfig, load_config
from mimo_ctx.context_usage import ContextPart, ContextUsage
from mimo_ctx.digest import build_tail_digest, collapse_checkpoint_tail, render_tail_digest
from mimo_ctx.errors import (
    ConfigError,
    ContextOverflowError,
    InvalidIdError,
    InvalidRequestError,
    MimoCtxError,
    PathEscapeError,
    StoreError,
    TranscriptError,
)
from mimo_ctx.events import (
    AutoRebuildDisabled,
    ContextRebuilt,
    Event,
    EventBus,
    StatusChanged,
    UsageEstimated,
    UsagePending,
    WaitingForWriter,
    WriterFailed,
    WriterFinished,
    WriterStarted,
)
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import (
    MAIN_AGENT,
    CheckpointPart,
    CompactionPart,
    FilePart,
    Message,
    MessageError,
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
from mimo_ctx.middleware import ContextMiddleware, RebuildReport, RequestView
from mimo_ctx.overflow import is_context_overflow, register_overflow_recognizer
from mimo_ctx.providers.anthropic_client import wrap_anthropic
from mimo_ctx.providers.openai_client import wrap_openai
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.reminders import LastMessageInfo, compute_last_message_info
from mimo_ctx.render import RenderedBody, SectionFigure, render_rebuild_context
from mimo_ctx.session import Actor, RequestPrefix, Session, Task
from mimo_ctx.store import InMemoryStore, SQLiteStore, Store, open_store
from mimo_ctx.tokens import CharEstimator, TiktokenCounter, TokenCounter
from mimo_ctx.tools import SessionTools
from mimo_ctx.triggers import ModelLimits, usable_tokens, writer_thresholds
from mimo_ctx.view import apply_send_rules

# A library logs; the application decides where to. Without a handler of its own
# here, records would reach logging's last-resort handler and print on stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__: str = package_version()
"""The installed version (from the package metadata, whose one source is ``pyproject.toml``)."""

__all__ = [
    "MAIN_AGENT",
    "Actor",
    "AutoRebuildDisabled",
    "BoundaryError",
    "CharEstimator",
    "CheckpointDraft",
    "CheckpointPart",
    "CheckpointWriter",
    "CompactionPart",
    "ConfigError",
    "ContextMiddleware",
    "ContextOverflowError",
    "ContextPart",
    "ContextRebuilt",
    "ContextUsage",
    "Event",
    "EventBus",
    "FilePart",
    "InMemoryStore",
    "InMemoryWriterLease",
    "InvalidIdError",
    "InvalidRequestError",
    "LLMCheckpointWriter",
    "LastMessageInfo",
    "LeaseInfo",
    "MemoryIndex",
    "MemoryLayout",
    "Message",
    "MessageError",
    "MessageFailure",
    "MimoCtxError",
    "ModelLimits",
    "OfflineCheckpointWriter",
    "OpaquePart",
    "Part",
    "PathEscapeError",
    "PushCaps",
    "ReasoningPart",
    "RebuildConfig",
    "RebuildReport",
    "RenderedBody",
    "RequestPrefix",
    "RequestView",
    "SQLiteStore",
    "SectionFigure",
    "Session",
    "SessionTools",
    "StatusChanged",
    "Store",
    "StoreError",
    "SubtaskPart",
    "TailConfig",
    "Task",
    "TextPart",
    "TiktokenCounter",
    "TokenCounter",
    "TokenUsage",
    "ToolPart",
    "ToolResultPart",
    "ToolStateCompleted",
    "ToolStateError",
    "ToolStatePending",
    "ToolStateRunning",
    "ToolTime",
    "TranscriptError",
    "UsageEstimated",
    "UsagePending",
    "WaitingForWriter",
    "WriterConfig",
    "WriterFailed",
    "WriterFinished",
    "WriterLease",
    "WriterRequest",
    "WriterStarted",
    "__version__",
    "adjust_boundary_for_api_invariants",
    "apply_send_rules",
    "build_tail_digest",
    "collapse_checkpoint_tail",
    "compute_boundary",
    "compute_last_message_info",
    "is_context_overflow",
    "load_config",
    "open_store",
    "read_budgeted",
    "read_budgeted_section_aware",
    "register_overflow_recognizer",
    "render_rebuild_context",
    "render_tail_digest",
    "usable_tokens",
    "validate_request",
    "wrap_anthropic",
    "wrap_openai",
    "writer_thresholds",
]
