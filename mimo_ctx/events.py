"""Typed events for UIs and logs (SPEC R1.6).

Events carry ids, outcomes and token figures only — never request bodies, API
keys or headers — so they are safe to log.

Secrets. The only free text an event carries is an error message (a failed
writer's exception) and status lines; a provider SDK's exception can quote the
API key or a request header. Every text field of an event, and every record the
``mimo_ctx`` logger emits (traceback included), goes through
:func:`redact_secrets` first.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import re
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Literal

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = [
    "REDACTED",
    "AutoRebuildDisabled",
    "ContextRebuilt",
    "Event",
    "EventBus",
    "EventHandler",
    "StatusChanged",
    "UsageEstimated",
    "UsagePending",
    "WaitingForWriter",
    "WriterFailed",
    "WriterFailure",
    "WriterFinished",
    "WriterStarted",
    "redact_secrets",
]

_log = logging.getLogger("mimo_ctx")

REDACTED: Final = "[REDACTED]"
"""What :func:`redact_secrets` puts in place of a secret."""

# API keys and credentials as providers, SDKs and HTTP clients print them:
# OpenAI / Anthropic (sk-...), Google (AIza...), GitHub (ghp_, gho_, ghu_, ghs_, ghr_,
# github_pat_), Groq (gsk_), Hugging Face (hf_), Slack (xoxb-..., xapp-..., webhook
# URLs), AWS access key ids (AKIA..., ASIA...), bearer/basic credentials, and any
# header, setting, JSON key or query parameter named like a credential
# (``password``, ``client_secret``, ``aws_secret_access_key``, ``?token=``...).
# A name must end at a word boundary, so ``max_tokens=4000`` is not one.
_CREDENTIAL_NAME = (
    r"\b(?:proxy-)?authorization\b|\bx-api-key\b|\bx-goog-api-key\b"
    r"|\bsecret[-_]?access[-_]?key\b"
    r"|\b(?:[\w-]*[-_])?(?:secret|password|passwd|token|api[-_]?key|apikey|access[-_]?key"
    r"|private[-_]?key|session[-_]?key|credentials?)\b"
)
_SECRETS = re.compile(
    r"\b(?:sk|rk|pk)-[A-Za-z0-9_\-]{12,}"
    r"|\bAIza[0-9A-Za-z_\-]{30,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bgsk_[A-Za-z0-9]{20,}"
    r"|\bhf_[A-Za-z0-9]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}|\bxapp-[A-Za-z0-9-]{10,}"
    r"|https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|(?i:\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=\-]{8,}"
    rf"|(?P<name>(?i:{_CREDENTIAL_NAME}))"
    r"(?P<sep>[\"']?\s*[:=]\s*[\"']?)(?i:(?:bearer|basic)\s+)?[^\s\"',;}\]&]+"
)
# The password of a URL's user info (``postgresql://user:PASSWORD@host/db``).
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)[^\s@/]+(?=@)")


def _mask(match: re.Match[str]) -> str:
    name = match.group("name")
    return f"{name}{match.group('sep')}{REDACTED}" if name else REDACTED


def redact_secrets(text: str) -> str:
    """Replace API keys, tokens, bearer credentials, URL passwords and credential-named
    values with ``[REDACTED]`` (the shapes are listed in the module's source)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    return _SECRETS.sub(_mask, text)


class _RedactSecrets(logging.Filter):
    """Redacts the message and traceback of every record of the ``mimo_ctx`` logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave the record to logging itself
            return True
        record.msg, record.args = redact_secrets(message), ()
        if record.exc_info and record.exc_info[1] is not None:
            # The traceback is formatted here, redacted, and kept as the record's
            # exception text; exc_info is dropped so no handler formats it again.
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_text = redact_secrets(text)
            record.exc_info = None
        return True


_log.addFilter(_RedactSecrets())


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event: which session, and when (epoch ms)."""

    session_id: str
    time: int

    def __post_init__(self) -> None:
        # Subclasses inherit this: every text field is redacted once, at creation.
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, str):
                object.__setattr__(self, item.name, redact_secrets(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterStarted(Event):
    """A checkpoint writer started for history up to ``watermark``."""

    watermark: str
    reason: str
    writer: str


WriterFailure = Literal["error", "timeout", "invalid"]
"""Why a writer failed: it raised, it ran past its time limit, or its checkpoint
was rejected (empty, sections missing, over budget)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterFinished(Event):
    """A writer finished: ``checkpoint.md`` now covers up to ``watermark``.

    The model figures are those of a model-backed writer's run (all zero for the
    offline writer): ``calls`` model calls; ``tokens_sent`` input tokens (as the
    provider reported them, cached ones included; the writer's estimate where it
    reported none); ``tokens_cached`` of them served from the provider's prompt
    cache; ``tokens_output`` output tokens; ``forked`` when the run resent the
    session's own last request plus one message.
    """

    watermark: str
    writer: str
    checkpoint_path: str
    checkpoint_tokens: int
    calls: int = 0
    tokens_sent: int = 0
    tokens_cached: int = 0
    tokens_output: int = 0
    forked: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterFailed(Event):
    """A writer failed; the checkpoint on disk (if any) is unchanged.

    ``reason`` says how (:data:`WriterFailure`); the model figures are what the run
    spent before it failed (see :class:`WriterFinished`).
    """

    writer: str
    error: str
    reason: WriterFailure = "error"
    calls: int = 0
    tokens_sent: int = 0
    tokens_cached: int = 0
    tokens_output: int = 0
    forked: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitingForWriter(Event):
    """A rebuild waits for an in-flight writer (status text of SPEC R3.2)."""

    timeout: float
    status: str = "Preparing conversation context…"


@dataclass(frozen=True, slots=True, kw_only=True)
class UsagePending(Event):
    """Usage figures are stale until the model answers on the rebuilt context."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageEstimated(Event):
    """The provider reported no usage for an answer: the middleware estimated it.

    Without a usage neither the writer thresholds nor the trigger line could fire
    (SPEC R1.2, A3), and every cycle would run into the provider's overflow error.
    ``tokens`` (what the triggers read) is ``request_tokens``, the estimate of the
    request that was sent, plus the answer's own estimate.
    """

    message_id: str
    agent: str
    tokens: int
    request_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextRebuilt(Event):
    """A rebuild finished with ``outcome``; ``boundary_id`` is the marker's position.

    ``over_line`` says the rebuilt request is still estimated above the trigger
    line (what stays live after the watermark leaves no room for the body).
    """

    outcome: str
    manual: bool
    boundary_id: str | None = None
    watermark: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    compacted_results: int = 0
    writer: str | None = None
    over_line: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoRebuildDisabled(Event):
    """The loop guard stopped automatic rebuilds for the session (R5.9 beyond)."""

    freed_fractions: tuple[float, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusChanged(Event):
    """A human-readable status line (``Writing checkpoint…``, a manual rebuild's result)."""

    status: str
    level: Literal["info", "warning"] = "info"


EventHandler = Callable[[Event], Awaitable[None] | None]


@dataclass(slots=True)
class EventBus:
    """Fans events out to handlers and to subscribed streams.

    Delivery never blocks or fails the agent: a handler that raises is logged and
    skipped, and a subscriber whose buffer is full loses the event (counted in
    ``dropped``) rather than stalling the request path.
    """

    handlers: list[EventHandler] = field(default_factory=list[EventHandler])
    dropped: int = 0
    _streams: list[MemoryObjectSendStream[Event]] = field(
        default_factory=list[MemoryObjectSendStream[Event]]
    )

    async def emit(self, event: Event) -> None:
        """Deliver ``event`` to every handler and subscriber."""
        for handler in list(self.handlers):
            try:
                result = handler(event)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                _log.exception("mimo_ctx event handler failed on %s", type(event).__name__)
        for stream in list(self._streams):
            try:
                stream.send_nowait(event)
            except anyio.WouldBlock:
                self.dropped += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._streams.remove(stream)

    def subscribe(self, buffer: int = 1000) -> MemoryObjectReceiveStream[Event]:
        """Return a stream receiving every later event (``buffer`` events at most queued)."""
        send, receive = anyio.create_memory_object_stream[Event](
            max_buffer_size=buffer if buffer > 0 else math.inf
        )
        self._streams.append(send)
        return receive

    async def stream(self, buffer: int = 1000) -> AsyncIterator[Event]:
        """Iterate over later events until the bus is closed."""
        receive = self.subscribe(buffer)
        async with receive:
            async for event in receive:
                yield event

    def close(self) -> None:
        """End every subscribed stream."""
        for stream in self._streams:
            stream.close()
        self._streams.clear()
