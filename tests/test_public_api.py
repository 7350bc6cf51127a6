"""The public facade: a pinned ``__all__`` and no SDK imported by ``import mimo_ctx``."""

from __future__ import annotations

import subprocess
import sys

import mimo_ctx

EXPECTED = {
    "MAIN_AGENT", "Actor", "AutoRebuildDisabled", "BoundaryError", "CharEstimator",
    "CheckpointDraft", "CheckpointPart", "CheckpointWriter", "CompactionPart", "ConfigError",
    "ContextMiddleware", "ContextOverflowError", "ContextPart", "ContextRebuilt", "ContextUsage",
    "Event", "EventBus",
    "FilePart", "InMemoryStore", "InvalidIdError", "InvalidRequestError", "LLMCheckpointWriter",
    "LastMessageInfo", "MemoryLayout", "Message", "MessageError", "MessageFailure",
    "MimoCtxError",
    "ModelLimits", "OfflineCheckpointWriter", "OpaquePart", "Part", "PathEscapeError",
    "PushCaps", "ReasoningPart", "RebuildConfig", "RebuildReport", "RenderedBody",
    "RequestPrefix", "RequestView", "SQLiteStore", "SectionFigure", "Session",
    "StatusChanged", "Store", "StoreError", "SubtaskPart", "TailConfig", "Task", "TextPart",
    "TiktokenCounter", "TokenCounter", "TokenUsage", "ToolPart", "ToolResultPart",
    "ToolStateCompleted", "ToolStateError", "ToolStatePending", "ToolStateRunning",
    "ToolTime", "TranscriptError", "UsageEstimated", "UsagePending", "WaitingForWriter",
    "WriterConfig",
    "WriterFailed", "WriterFinished", "WriterRequest", "WriterStarted", "__version__",
    "adjust_boundary_for_api_invariants", "apply_send_rules", "build_tail_digest",
    "collapse_checkpoint_tail", "compute_boundary", "compute_last_message_info",
    "is_context_overflow", "load_config", "open_store", "read_budgeted",
    "read_budgeted_section_aware", "register_overflow_recognizer", "render_rebuild_context",
    "render_tail_digest", "usable_tokens", "writer_thresholds", "MemoryIndex",
    "SessionTools", "validate_request", "wrap_anthropic", "wrap_openai",
    "InMemoryWriterLease", "LeaseInfo", "WriterLease",
}  # fmt: skip


def test_all_is_pinned_and_importable() -> None:
    assert set(mimo_ctx.__all__) == EXPECTED
    assert len(mimo_ctx.__all__) == len(set(mimo_ctx.__all__))  # order: ruff RUF022
    for name in mimo_ctx.__all__:
        assert hasattr(mimo_ctx, name), name


def test_import_does_not_load_optional_sdks() -> None:
    code = (
        "import sys, mimo_ctx\n"
        "loaded = [m for m in ('openai', 'anthropic', 'pydantic_ai', 'langchain',"
        " 'langchain_core', 'rich') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_py_typed_is_shipped() -> None:
    from importlib.resources import files

    assert files("mimo_ctx").joinpath("py.typed").is_file()


def test_message_error_is_a_deprecated_alias_of_message_failure() -> None:
    """The model of a failed message is not an exception; the old name still works."""
    assert mimo_ctx.MessageError is mimo_ctx.MessageFailure
    assert not issubclass(mimo_ctx.MessageFailure, BaseException)


def test_the_declared_mit_license_ships_with_its_text() -> None:
    import importlib.metadata
    from pathlib import Path

    metadata = importlib.metadata.metadata("mimo-ctx")
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    text = (Path(__file__).resolve().parents[1] / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
