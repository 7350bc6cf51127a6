"""Spans around the middleware's steps, for a host's traces.

The middleware opens three kinds of span through a :class:`Tracer`:

* ``mimo_ctx.prepare`` — one :meth:`~mimo_ctx.middleware.ContextMiddleware.prepare`:
  the request's tokens and messages, the last usage, the trigger line, whether it
  rebuilt;
* ``mimo_ctx.rebuild`` — one rebuild (trigger line, provider overflow, ``/rebuild``,
  or a sub-agent's compaction): its outcome, tokens before and after, results
  cleared; inside the ``prepare`` span when the trigger line started it;
* ``mimo_ctx.writer`` — one checkpoint writer run (the fallback writer's run is a
  span of its own): the writer, why it ran, how many messages it covered, its
  outcome and the checkpoint's tokens.

The default, :data:`NO_TRACER`, records nothing. ``OpenTelemetryTracer`` in
:mod:`mimo_ctx.integrations.otel` (the ``otel`` extra) puts the spans on
OpenTelemetry's global tracer provider; any object with a ``span`` method of the
same shape works too.

Attributes carry ids, names, outcomes and token figures only, never message or
checkpoint text (the events' rule, SPEC R1.6): a span is safe to export.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Final, Literal, Protocol

__all__ = [
    "NO_TRACER",
    "SPAN_PREPARE",
    "SPAN_REBUILD",
    "SPAN_WRITER",
    "AttributeValue",
    "Attributes",
    "NoTracer",
    "Span",
    "SpanName",
    "Tracer",
]

AttributeValue = str | bool | int | float
"""What a span attribute may hold (OpenTelemetry's scalar types)."""

Attributes = Mapping[str, AttributeValue]
"""A span's attributes, all named ``mimo_ctx.<what>``."""

SpanName = Literal["mimo_ctx.prepare", "mimo_ctx.rebuild", "mimo_ctx.writer"]
"""The spans the middleware opens."""

SPAN_PREPARE: Final = "mimo_ctx.prepare"
SPAN_REBUILD: Final = "mimo_ctx.rebuild"
SPAN_WRITER: Final = "mimo_ctx.writer"


class Span(Protocol):
    """An open span: the figures known only at its end are added to it."""

    def set_attributes(self, attributes: Attributes) -> None:
        """Add (or overwrite) attributes."""
        ...

    def set_failed(self, error_type: str) -> None:
        """Mark the step as failed: ``error_type`` names the failure (an exception's
        type, ``timeout``...), never its message."""
        ...


class Tracer(Protocol):
    """Opens the middleware's spans.

    ``span`` is a context manager: the span starts on entry, is the current span
    while the step runs (a rebuild's span nests in the ``prepare`` that started it)
    and ends on exit; an exception leaving it marks the span failed (its type, not its
    message) and goes on.
    """

    def span(self, name: SpanName, attributes: Attributes) -> AbstractContextManager[Span]:
        """Open the span ``name`` with its first attributes."""
        ...


class _NoSpan:
    def set_attributes(self, attributes: Attributes) -> None:
        del attributes

    def set_failed(self, error_type: str) -> None:
        del error_type


_NO_SPAN: Final = _NoSpan()


class NoTracer:
    """Records nothing (the default): a span costs one generator and no I/O."""

    @contextmanager
    def span(self, name: SpanName, attributes: Attributes) -> Generator[Span]:
        """A span that goes nowhere."""
        del name, attributes
        yield _NO_SPAN


NO_TRACER: Final = NoTracer()
"""The tracer a middleware uses when none is given."""
