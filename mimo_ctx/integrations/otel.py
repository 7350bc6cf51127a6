"""OpenTelemetry spans for the middleware's steps (the ``otel`` extra).

``ContextMiddleware(..., tracer=OpenTelemetryTracer())`` puts a span on the global
tracer provider for every ``prepare``, rebuild and checkpoint writer run
(:mod:`mimo_ctx.tracing` lists them and their attributes). The host configures the
provider and its exporters as usual (``opentelemetry.trace.set_tracer_provider``);
until it does, OpenTelemetry's proxy tracer drops the spans at no cost.

Only ``opentelemetry-api`` is needed here; the SDK is the host's choice. Importing
this module without it raises an ImportError naming the extra:
``pip install "mimo-ctx[otel]"``.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from mimo_ctx.integrations._sync import extra_error
from mimo_ctx.tracing import Attributes, Span, SpanName

try:
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
except ImportError as _exc:  # pragma: no cover - exercised by a test with the package hidden
    raise extra_error("otel", "otel", "opentelemetry-api") from _exc

__all__ = ["ERROR_TYPE", "INSTRUMENTATION_NAME", "OpenTelemetryTracer"]

INSTRUMENTATION_NAME: Final = "mimo_ctx"
"""The instrumentation scope the spans are recorded under."""

ERROR_TYPE: Final = "mimo_ctx.error_type"
"""The attribute naming a failed step's failure; the span's status is error."""


def _version() -> str | None:
    try:
        return version("mimo-ctx")
    except PackageNotFoundError:  # a source checkout that is not installed
        return None


class _OtelSpan:
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set_attributes(self, attributes: Attributes) -> None:
        self._span.set_attributes(dict(attributes))

    def set_failed(self, error_type: str) -> None:
        self._span.set_attribute(ERROR_TYPE, error_type)
        self._span.set_status(Status(StatusCode.ERROR, error_type))


class OpenTelemetryTracer:
    """A :class:`~mimo_ctx.tracing.Tracer` on OpenTelemetry.

    Args:
        tracer_provider: Where the spans go; ``None`` (the default) is the global
            tracer provider, looked up when a span opens, so a provider the host
            sets after building the middleware is used.

    An exception leaving a span sets its status to error with the exception's
    type as the description and the ``mimo_ctx.error_type`` attribute; its message
    is not recorded (a provider SDK's message can quote request text or a key).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._provider = tracer_provider
        self._version = _version()

    def _tracer(self) -> trace.Tracer:
        return trace.get_tracer(INSTRUMENTATION_NAME, self._version, self._provider)

    @contextmanager
    def span(self, name: SpanName, attributes: Attributes) -> Generator[Span]:
        """Open ``name`` as the current span (see the class docs for errors)."""
        with self._tracer().start_as_current_span(
            name,
            attributes=dict(attributes),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            ours = _OtelSpan(span)
            try:
                yield ours
            except BaseException as exc:
                ours.set_failed(type(exc).__name__)
                raise
