"""OpenTelemetry spans (the ``otel`` extra): ``mimo_ctx.prepare``, ``.rebuild``, ``.writer``.

Recorded with the SDK's in-memory exporter on the global tracer provider; each
span's attributes are checked against what the step reported, and no attribute
carries message text.
"""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel tests record with the SDK")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from mimo_ctx import (
    CheckpointDraft,
    ContextMiddleware,
    Event,
    InMemoryStore,
    Message,
    ModelLimits,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
    WriterFinished,
    WriterRequest,
)
from mimo_ctx.integrations.otel import INSTRUMENTATION_NAME, OpenTelemetryTracer
from mimo_ctx.testing import filler_text
from mimo_ctx.tracing import NO_TRACER, SPAN_PREPARE, SPAN_REBUILD, SPAN_WRITER

T0 = 1_700_000_000_000
LIMITS = ModelLimits(100_000, input_limit=100_000)  # trigger line 90,000
SECRET = "XYZZY-the-users-words"
"""Text of the session that must never reach a span."""

_EXPORTER = InMemorySpanExporter()
_ATTACHED: list[TracerProvider] = []
"""The global providers :data:`_EXPORTER` is attached to (at most one per process)."""


def _global_provider() -> TracerProvider:
    """The process's global SDK provider, with the in-memory exporter attached once."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        current = trace.get_tracer_provider()
    assert isinstance(current, TracerProvider), "another test set a non-SDK global provider"
    if current not in _ATTACHED:
        current.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        _ATTACHED.append(current)
    return current


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _global_provider()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _round(session_id: str, i: int, *, usage: int) -> Message:
    at = T0 + 10 + i
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=at,
        time_completed=at,
        finish="tool-calls",
        usage=TokenUsage(input=usage),
        parts=[
            TextPart(text=f"step {i} {SECRET}"),
            ToolPart(
                call_id=f"c{i}",
                tool="read",
                state=ToolStateCompleted(
                    input={"path": f"{SECRET}{i}.py"},
                    output=f"{SECRET} " + filler_text(1500, seed=i),
                    time=ToolTime(start=at, end=at),
                ),
            ),
        ],
    )


async def _fill(mw: ContextMiddleware, *, rounds: int = 24, last: int = 95_000) -> str:
    session = await mw.open_session(system=f"agent {SECRET}", project_id="p")
    await mw.add_user_message(session.id, f"Fix the login test. {SECRET}")
    await mw.append(
        [_round(session.id, i, usage=last if i == rounds - 1 else 1_000 + i) for i in range(rounds)]
    )
    return session.id


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _no_text(exporter: InMemorySpanExporter) -> None:
    for span in exporter.get_finished_spans():
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == INSTRUMENTATION_NAME
        for key, value in _attributes(span).items():
            assert key.startswith("mimo_ctx."), key
            assert SECRET not in str(value), (span.name, key)
        assert not span.events  # no exception events with their messages


async def test_prepare_rebuild_and_writer_spans(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    finished: list[WriterFinished] = []

    def on_event(event: Event) -> None:
        if isinstance(event, WriterFinished):
            finished.append(event)

    async with ContextMiddleware(
        InMemoryStore(), tmp_path, model=LIMITS, tracer=OpenTelemetryTracer(), on_event=on_event
    ) as mw:
        sid = await _fill(mw)
        view = await mw.prepare(sid)  # usage 95,000 >= 90,000: rebuilds
        assert view.rebuild is not None
        report = view.rebuild
        quiet = await mw.prepare(sid)  # nothing to do this time
    (first, second) = _named(spans, SPAN_PREPARE)
    assert _attributes(first) == {
        "mimo_ctx.session_id": sid,
        "mimo_ctx.agent": "main",
        "mimo_ctx.trigger_tokens": 90_000,
        "mimo_ctx.usage": 95_000,
        "mimo_ctx.request_tokens": view.tokens,
        "mimo_ctx.messages": len(view.messages),
        "mimo_ctx.rebuilt": True,
    }
    assert _attributes(second)["mimo_ctx.rebuilt"] is False
    assert _attributes(second)["mimo_ctx.request_tokens"] == quiet.tokens

    (rebuild,) = _named(spans, SPAN_REBUILD)
    assert rebuild.parent is not None
    assert first.context is not None
    assert rebuild.parent.span_id == first.context.span_id  # nested in its prepare
    attributes = _attributes(rebuild)
    assert report.tokens_before is not None
    assert report.tokens_after is not None
    assert report.boundary_id is not None
    assert attributes == {
        "mimo_ctx.session_id": sid,
        "mimo_ctx.agent": "main",
        "mimo_ctx.trigger": "usage",
        "mimo_ctx.focus": False,
        "mimo_ctx.outcome": report.outcome,
        "mimo_ctx.boundary_id": report.boundary_id,
        "mimo_ctx.tokens_before": report.tokens_before,
        "mimo_ctx.tokens_after": report.tokens_after,
        "mimo_ctx.compacted_results": report.compacted_results,
        "mimo_ctx.over_line": report.over_line,
        "mimo_ctx.cancelled": False,
    }
    assert report.compacted_results > 0
    assert rebuild.status.status_code is StatusCode.UNSET

    writers = _named(spans, SPAN_WRITER)
    assert len(writers) == len(finished) >= 1
    for span, event in zip(writers, finished, strict=True):
        attributes = _attributes(span)
        assert attributes["mimo_ctx.session_id"] == sid
        assert attributes["mimo_ctx.writer"] == event.writer == "offline"
        assert attributes["mimo_ctx.watermark"] == event.watermark
        assert attributes["mimo_ctx.outcome"] == "finished"
        assert attributes["mimo_ctx.checkpoint_tokens"] == event.checkpoint_tokens
        assert attributes["mimo_ctx.covered_messages"] > 0
        assert isinstance(attributes["mimo_ctx.reason"], str)
    _no_text(spans)


async def test_manual_rebuild_with_focus(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    async with ContextMiddleware(
        InMemoryStore(), tmp_path, model=LIMITS, tracer=OpenTelemetryTracer()
    ) as mw:
        sid = await _fill(mw, last=5_000)
        report = await mw.rebuild(sid, focus=f"keep {SECRET} in view")
    (rebuild,) = _named(spans, SPAN_REBUILD)
    attributes = _attributes(rebuild)
    assert attributes["mimo_ctx.trigger"] == "manual"
    assert attributes["mimo_ctx.focus"] is True
    assert attributes["mimo_ctx.outcome"] == report.outcome
    assert rebuild.parent is None  # no prepare around a /rebuild
    (writer,) = _named(spans, SPAN_WRITER)
    assert writer.parent is not None
    assert rebuild.context is not None
    assert writer.parent.span_id == rebuild.context.span_id  # the rebuild started it
    assert _attributes(writer)["mimo_ctx.focus"] is True
    _no_text(spans)


class _Failing:
    name = "failing"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        raise RuntimeError(f"the model said {SECRET}")


async def test_a_failed_writer_and_its_fallback_are_two_spans(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    async with ContextMiddleware(
        InMemoryStore(), tmp_path, model=LIMITS, writer=_Failing(), tracer=OpenTelemetryTracer()
    ) as mw:
        sid = await _fill(mw)
        await mw.start_writer(sid, reason="idle")
        await mw.wait_for_writer(sid, timeout=10)
    failed, fallback = _named(spans, SPAN_WRITER)
    assert _attributes(failed)["mimo_ctx.writer"] == "failing"
    assert _attributes(failed)["mimo_ctx.outcome"] == "failed"
    assert _attributes(failed)["mimo_ctx.error_type"] == "RuntimeError"
    assert _attributes(failed)["mimo_ctx.reason"] == "idle"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "RuntimeError"
    assert _attributes(fallback)["mimo_ctx.writer"] == "offline"
    assert _attributes(fallback)["mimo_ctx.outcome"] == "finished"
    assert fallback.status.status_code is StatusCode.UNSET
    _no_text(spans)


def test_an_exception_marks_the_span_without_its_message(spans: InMemorySpanExporter) -> None:
    tracer = OpenTelemetryTracer()
    with (
        pytest.raises(ValueError, match=SECRET),
        tracer.span(SPAN_PREPARE, {"mimo_ctx.agent": "main"}),
    ):
        raise ValueError(SECRET)
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError"
    assert _attributes(span) == {"mimo_ctx.agent": "main", "mimo_ctx.error_type": "ValueError"}
    _no_text(spans)


def test_an_explicit_provider_instead_of_the_global_one(spans: InMemorySpanExporter) -> None:
    own = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(own))
    with OpenTelemetryTracer(provider).span(SPAN_WRITER, {"mimo_ctx.writer": "x"}) as span:
        span.set_attributes({"mimo_ctx.outcome": "finished"})
    (recorded,) = own.get_finished_spans()
    assert _attributes(recorded) == {"mimo_ctx.writer": "x", "mimo_ctx.outcome": "finished"}
    assert spans.get_finished_spans() == ()


async def test_no_tracer_no_spans(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path, model=LIMITS) as mw:
        sid = await _fill(mw)
        assert (await mw.prepare(sid)).rebuild is not None
    assert spans.get_finished_spans() == ()
    with NO_TRACER.span(SPAN_PREPARE, {}) as span:
        span.set_attributes({"mimo_ctx.agent": "main"})


def test_without_opentelemetry_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def hide(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", hide)
    monkeypatch.delitem(sys.modules, "mimo_ctx.integrations.otel")
    with pytest.raises(ImportError, match=r'pip install "mimo-ctx\[otel\]"'):
        importlib.import_module("mimo_ctx.integrations.otel")
