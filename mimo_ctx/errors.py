"""Exception hierarchy.

Every error the library raises on purpose derives from :class:`MimoCtxError`, so a
host can catch the library's failures with one ``except`` clause while provider
errors (which we pass through unchanged) keep their own types.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ContextOverflowError",
    "ConversationMismatchError",
    "InvalidRequestError",
    "MimoCtxError",
    "PathEscapeError",
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
