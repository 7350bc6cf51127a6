"""Typed events for UIs and logs (SPEC R1.6).

Events carry ids, outcomes and token figures only — never request bodies, API
keys or headers — so they are safe to log.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = [
    "AutoRebuildDisabled",
    "ContextRebuilt",
    "Event",
    "EventBus",
    "EventHandler",
    "StatusChanged",
    "UsagePending",
    "WaitingForWriter",
    "WriterFailed",
    "WriterFinished",
    "WriterStarted",
]

_log = logging.getLogger("mimo_ctx")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event: which session, and when (epoch ms)."""

    session_id: str
    time: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterStarted(Event):
    """A checkpoint writer started for history up to ``watermark``."""

    watermark: str
    reason: str
    writer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterFinished(Event):
    """A writer finished: ``checkpoint.md`` now covers up to ``watermark``."""

    watermark: str
    writer: str
    checkpoint_path: str
    checkpoint_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterFailed(Event):
    """A writer failed; the checkpoint on disk (if any) is unchanged."""

    writer: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitingForWriter(Event):
    """A rebuild waits for an in-flight writer (status text of SPEC R3.2)."""

    timeout: float
    status: str = "Preparing conversation context…"


@dataclass(frozen=True, slots=True, kw_only=True)
class UsagePending(Event):
    """Usage figures are stale until the model answers on the rebuilt context."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextRebuilt(Event):
    """A rebuild finished with ``outcome``; ``boundary_id`` is the marker's position."""

    outcome: str
    manual: bool
    boundary_id: str | None = None
    watermark: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    compacted_results: int = 0
    writer: str | None = None


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
