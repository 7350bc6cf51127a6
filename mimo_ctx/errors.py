"""Every exception mimo_ctx raises on purpose, in one tree.

A host catches the library's failures with one ``except MimoCtxError`` clause;
provider errors, which the library passes through unchanged, keep their own
types. The errors of bad input also derive from :class:`ValueError`, so code that
already catches that keeps working::

    MimoCtxError
    ├── ConfigError (ValueError)          a setting is invalid; names the key
    ├── StoreError                        the store refused an operation
    ├── PathEscapeError (ValueError)      a path would leave the memory root
    │   └── InvalidIdError                an id cannot name its memory directory
    ├── TranscriptError (ValueError)      a transcript cannot be imported; names file and line
    ├── InvalidRequestError (ValueError)  an outgoing provider payload breaks its rules
    ├── BoundaryError (ValueError)        a watermark cannot be computed from the input
    ├── ArgumentError (ValueError)        a model's tool arguments do not fit the tool
    ├── CheckpointRejectedError           a writer's checkpoint failed validation
    ├── ContextOverflowError              still overflowing after the one recovery
    ├── ConversationMismatchError         a host's conversation is not the session's
    ├── ProviderReportedOverflow          an overflow inside a successful response (internal)
    └── CliError                          a ``mimo-ctx`` user mistake (exit code 2)

Each module that raises one also re-exports it where it was defined before
(``mimo_ctx.boundary.BoundaryError``, ``mimo_ctx.tools.ArgumentError``...).
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "BoundaryError",
    "CheckpointRejectedError",
    "CliError",
    "ConfigError",
    "ContextOverflowError",
    "ConversationMismatchError",
    "InvalidIdError",
    "InvalidRequestError",
    "MimoCtxError",
    "PathEscapeError",
    "ProviderReportedOverflow",
    "StoreError",
    "TranscriptError",
]


class MimoCtxError(Exception):
    """Base class of every error raised by mimo_ctx itself."""


class ConfigError(MimoCtxError, ValueError):
    """A configuration value is invalid; the message names the key and what was expected."""


class StoreError(MimoCtxError):
    """The store refused an operation (missing session, duplicate id, corrupt file...)."""


class PathEscapeError(MimoCtxError, ValueError):
    """A path would resolve outside the memory root (``..``, absolute path or symlink out)."""


class InvalidIdError(PathEscapeError):
    """A session, project or task id cannot name its memory directory.

    Ids name directories (SPEC A13), so they are checked where they enter: not
    empty, at most :data:`~mimo_ctx.session.MAX_ID_BYTES` bytes in UTF-8, one plain
    path component, no control characters or line breaks, no lone surrogates.
    """


class TranscriptError(MimoCtxError, ValueError):
    """A transcript could not be imported; the message names the file and line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line


class InvalidRequestError(MimoCtxError, ValueError):
    """An outgoing provider payload breaks the provider's rules (orphan tool call, ...)."""


class BoundaryError(MimoCtxError, ValueError):
    """A watermark cannot be computed or adjusted from the given input.

    Raised for a boundary id that is not among the messages, or precomputed token
    counts that do not match the messages one to one.
    """


class ArgumentError(MimoCtxError, ValueError):
    """The model's arguments do not fit the tool; the message says what to send instead.

    The tool handlers turn it into an ``Error:`` tool result for the model; it
    reaches a host only from :func:`mimo_ctx.tools.check_arguments`.
    """


class CheckpointRejectedError(MimoCtxError):
    """A checkpoint writer's answer is not a checkpoint to keep: empty, missing
    sections of the layout, or over its budget. The previous checkpoint stays and
    the fallback writer (if any) writes instead."""


class ContextOverflowError(MimoCtxError):
    """The provider still reports a context overflow after the one allowed recovery.

    Raised instead of retrying again, so an agent never loops on compaction (SPEC R1.4).
    The provider's own exception is available as ``__cause__``.
    """


class ConversationMismatchError(MimoCtxError):
    """A host sent a conversation that shares nothing with the session it named.

    Raised instead of merging two conversations (:mod:`mimo_ctx.reconcile`): the
    host's first message is not on the session's stored conversation.

    Attributes:
        session_id: The session the messages were sent for.
    """

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class CliError(MimoCtxError):
    """A user mistake the ``mimo-ctx`` command reports in one line (exit code 2)."""


class ProviderReportedOverflow(MimoCtxError):
    """A context overflow a provider reported inside a successful response or stream.

    An Anthropic ``stop_reason`` of ``model_context_window_exceeded``, or an
    overflow error event in a stream. Raised only to drive the retry; a host sees
    it as the ``__cause__`` of :class:`~mimo_ctx.errors.ContextOverflowError`.

    Attributes:
        payload: The response or event that reported it.
        code: Always ``context_length_exceeded`` (what the overflow recogniser reads).
    """

    code = "context_length_exceeded"

    def __init__(self, detail: str, payload: object = None) -> None:
        super().__init__(f"the provider reported a context overflow ({detail})")
        self.payload = payload
