"""The asyncio middleware that keeps an agent inside its context window.

:class:`ContextMiddleware` hooks a prompt loop at three points:

* :meth:`~ContextMiddleware.prepare` before every request: keeps the session's
  live window current in O(new messages), starts the checkpoint writer when a
  usage threshold is crossed (A3), rebuilds when the last assistant usage crosses
  the trigger line (R1), and returns the request view (R8): the frozen prefix,
  the newest boundary, the collapsed tail, placeholders for compacted results and
  the per-turn reminder (in memory only).
* :meth:`~ContextMiddleware.record` after every response: stores the assistant
  message with its provider usage.
* :meth:`~ContextMiddleware.on_error` when a request fails: recognises a context
  overflow, rebuilds once for that usage and tells the caller to retry; a second
  overflow for the same usage raises :class:`~mimo_ctx.errors.ContextOverflowError`.

``/rebuild`` is :meth:`~ContextMiddleware.rebuild`. The middleware is an async
context manager owning the task group its checkpoint writers run in.

The class is a facade over private steps: the live window and the request view
(:mod:`mimo_ctx._window`), the rebuild pipeline (:class:`~mimo_ctx.rebuild.Rebuilder`)
and the checkpoint writers (``mimo_ctx.checkpoint._coordinator``). It keeps
the lifecycle, the sessions, the message writes and the per-session lock every
step runs under.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import anyio
from anyio.abc import TaskGroup

from mimo_ctx._heap import HeapRelease
from mimo_ctx._sessions import SessionRegistry, known_session
from mimo_ctx._sessions import open_session as _open_session
from mimo_ctx._util import now_ms
from mimo_ctx._window import LiveSession, LiveWindow, Windows, WindowView
from mimo_ctx.boundary import scale_tail
from mimo_ctx.checkpoint import (
    CheckpointWriter,
    OfflineCheckpointWriter,
    SentApi,
    SentRequest,
    StartResult,
    WaitResult,
    WriterLease,
)
from mimo_ctx.checkpoint._coordinator import WriterCoordinator
from mimo_ctx.config import RebuildConfig
from mimo_ctx.context_usage import ContextUsage, break_down
from mimo_ctx.errors import ContextOverflowError, MimoCtxError
from mimo_ctx.events import (
    EventBus,
    EventHandler,
    StatusChanged,
    UsageEstimated,
    WriterFinished,
)
from mimo_ctx.hooks import AfterRebuild, BeforeRebuild
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.rebuild import Rebuilder, RebuildReport, Trigger, describe_rebuild
from mimo_ctx.reconcile import HostHistory
from mimo_ctx.session import RequestPrefix, Session
from mimo_ctx.store.base import Store
from mimo_ctx.tokens import TokenCounter
from mimo_ctx.tools import SessionTools
from mimo_ctx.tracing import NO_TRACER, SPAN_PREPARE, Attributes, Tracer
from mimo_ctx.triggers import (
    ModelLimits,
    effective_window,
    estimated_usage,
    lacks_usage,
    usable_tokens,
    usage_tokens,
    writer_thresholds,
)

__all__ = ["Commit", "ContextMiddleware", "RebuildReport", "RequestView", "Trigger"]

Commit = Callable[[Message], Awaitable[Message]]
"""Writes an answer for :meth:`ContextMiddleware.record` in the caller's own transaction
and returns it as stored."""

# Retries of one turn() after provider overflows, at most: on_error already bounds
# them per usage and boundary; this bounds a session whose workers keep storing
# fresh usages while the retries are in flight.
_TURN_RETRIES: Final = 3

_NOT_RUNNING = (
    "this ContextMiddleware is not running: use it inside "
    "`async with ContextMiddleware(store, memory_root, model=...) as mw:` "
    "(or `await mw.__aenter__()` before the first call)"
)

_log = logging.getLogger("mimo_ctx")


@dataclass(frozen=True, slots=True)
class RequestView:
    """What to send next (SPEC R8.1).

    Attributes:
        session_id: The session.
        agent: The agent the view is for.
        prefix: The session's frozen prefix (system prompt and tools), byte-identical
            every turn.
        messages: The messages to send, send rules applied (A10) and the per-turn
            reminder appended to the last user message (R8.3, never stored).
        tokens: Estimated tokens of prefix + messages.
        boundary_id: The newest boundary the view starts at, if any.
        rebuild: The rebuild this ``prepare`` ran, if one ran.
    """

    session_id: str
    agent: str
    prefix: RequestPrefix
    messages: list[Message]
    tokens: int
    boundary_id: str | None
    rebuild: RebuildReport | None = None


class ContextMiddleware:
    """Context rebuild and budgeted injection for one store and memory root.

    Args:
        store: Where sessions live (e.g. :class:`~mimo_ctx.store.sqlite.SQLiteStore`).
        memory_root: Root of the memory files (SPEC A13).
        model: The model's limits, its context window in tokens, or the name of a
            common model (:meth:`~mimo_ctx.triggers.ModelLimits.for_model`).
        config: Tuning; defaults follow the SPEC.
        writer: The checkpoint writer; defaults to the offline writer.
        fallback_writer: Used when ``writer`` fails; defaults to the offline writer
            when ``writer`` is another one; ``False`` for no fallback.
        on_event: A callback for every event (also available as a stream through
            :attr:`events`).
        counter: Token counter used for the body's section caps.
        memory_index: The FTS5 index of the memory files, shared with the
            ``memory`` tool; defaults to ``<memory_root>/.index/memory.sqlite3``.
        writer_lease: Keeps one checkpoint writer per session across workers that
            share the store (e.g. :class:`~mimo_ctx.store.postgres.PostgresWriterLease`);
            ``None`` keeps that rule inside this process.
        before_rebuild: An async hook before a rebuild: may add a section of the
            host's own or cancel an automatic rebuild (:mod:`mimo_ctx.hooks`).
        after_rebuild: An async hook after every rebuild, with its report.
        tracer: Opens a span around every ``prepare``, rebuild and checkpoint writer
            run (:mod:`mimo_ctx.tracing`; OpenTelemetry:
            :class:`~mimo_ctx.integrations.otel.OpenTelemetryTracer`). Default: none.

    Example:
        >>> async with ContextMiddleware(store, "memory", model=200_000) as mw:  # doctest: +SKIP
        ...     view = await mw.prepare(session.id)
    """

    def __init__(
        self,
        store: Store,
        memory_root: str | os.PathLike[str],
        *,
        model: ModelLimits | int | str,
        config: RebuildConfig | None = None,
        writer: CheckpointWriter | None = None,
        fallback_writer: CheckpointWriter | Literal[False] | None = None,
        on_event: EventHandler | None = None,
        counter: TokenCounter | None = None,
        memory_index: MemoryIndex | None = None,
        writer_lease: WriterLease | None = None,
        before_rebuild: BeforeRebuild | None = None,
        after_rebuild: AfterRebuild | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self._store = store
        self._tracer = tracer = tracer or NO_TRACER
        self._config = config = config or RebuildConfig()
        self._limits = _limits(model)
        self._layout = layout = MemoryLayout(Path(memory_root))
        self._own_index = memory_index is None
        self._memory_index = memory_index or MemoryIndex(
            Path(memory_root) / ".index" / "memory.sqlite3"
        )
        self._events = events = EventBus()
        events.handlers.append(self._index_after_writer)
        if config.release_memory_after_rebuild:  # mimo_ctx._heap: the soak's resident size
            events.handlers.append(HeapRelease(lambda: self._task_group, config))
        if on_event is not None:
            events.handlers.append(on_event)
        self._counter = counter
        self._writer: CheckpointWriter = writer or OfflineCheckpointWriter()
        self._usable = usable_tokens(self._limits, config)
        self._thresholds = writer_thresholds(self._usable, config)
        steps = config.model_copy(update={"tail": scale_tail(config.tail, self._usable)})
        self._sessions = SessionRegistry()
        self._coordinator = WriterCoordinator(
            store,
            layout,
            steps,
            self._writer,
            events,
            fallback=_fallback_writer(writer, fallback_writer),
            lease=writer_lease,
            thresholds=self._thresholds,
            tracer=tracer,
            limits=self._limits,
            last_request=self._sessions.last_request,
        )
        self._session = functools.partial(known_session, store)
        self._windows = Windows(store, layout, self._session)
        self._rebuilder = Rebuilder(
            windows=self._windows,
            store=store,
            layout=layout,
            config=steps,
            events=events,
            coordinator=self._coordinator,
            memory_index=self._memory_index,
            counter=counter,
            usable=self._usable,
            session=self._session,
            before_rebuild=before_rebuild,
            after_rebuild=after_rebuild,
            tracer=tracer,
        )
        self._task_group: TaskGroup | None = None

    # -- what it was built with (read-only) ---------------------------------------------
    @property
    def store(self) -> Store:
        """Where sessions live."""
        return self._store

    @property
    def config(self) -> RebuildConfig:
        """The tuning this middleware runs with."""
        return self._config

    @property
    def limits(self) -> ModelLimits:
        """The model's limits."""
        return self._limits

    @property
    def layout(self) -> MemoryLayout:
        """Where the memory files (checkpoints, ``MEMORY.md``, notes) live (SPEC A13)."""
        return self._layout

    @property
    def memory_index(self) -> MemoryIndex:
        """The full-text index of the memory files, shared with the ``memory`` tool."""
        return self._memory_index

    @property
    def events(self) -> EventBus:
        """Every event of this middleware, as callbacks or a stream (``subscribe()``)."""
        return self._events

    @property
    def counter(self) -> TokenCounter | None:
        """The token counter of the body's section caps (``None``: the estimator)."""
        return self._counter

    @property
    def writer(self) -> CheckpointWriter:
        """The primary checkpoint writer."""
        return self._writer

    @property
    def usable(self) -> int:
        """The trigger line in tokens (SPEC R1.2)."""
        return self._usable

    @property
    def thresholds(self) -> list[int]:
        """The usage thresholds that start the checkpoint writer (SPEC A3), ascending."""
        return list(self._thresholds)

    def _index_after_writer(self, event: object) -> None:
        # The writer just rewrote checkpoint.md (maybe spill-over files and
        # notes.md too): index them in the background now, so the rebuild's own
        # reconcile (R5.6) usually finds the index current instead of indexing
        # megabytes on the request path. The writer's completion is not delayed.
        if isinstance(event, WriterFinished):
            # It wrote the session's memory directory: the next view re-checks (R8.3).
            self._sessions.state(event.session_id).memory_checked = None
        if isinstance(event, WriterFinished) and self._task_group is not None:
            self._task_group.start_soon(
                _reconcile_quietly, self._store, self._memory_index, self._layout, event.session_id
            )

    # -- lifecycle --------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self._task_group is not None:
            raise MimoCtxError("this ContextMiddleware is already running")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._coordinator.attach(task_group)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group, self._task_group = self._task_group, None
        self._coordinator.attach(None)
        if task_group is not None:
            owned = self._memory_index if self._own_index else None
            await _shut_down(task_group, self._events, owned)
        return None

    # -- sessions -----------------------------------------------------------------
    async def open_session(
        self,
        session_id: str | None = None,
        *,
        project_id: str = "default",
        system: str = "",
        tools: Sequence[dict[str, object]] = (),
        title: str = "",
    ) -> Session:
        """Return the session, creating it (with its frozen prefix) when it is new.

        Raises:
            InvalidIdError: ``session_id`` or ``project_id`` cannot name a memory
                directory (empty, too long, ``..``, a path separator, a control
                character...): refused up front rather than at the first writer.
        """
        self._require_running()
        return await _open_session(
            self._store,
            self._layout,
            session_id,
            project_id=project_id,
            system=system,
            tools=tools,
            title=title,
        )

    def _require_running(self) -> None:
        if self._task_group is None:
            raise MimoCtxError(_NOT_RUNNING)

    def host_history(self, session_id: str, *, agent: str = MAIN_AGENT) -> HostHistory:
        """The session's :mod:`host-history reconciler <mimo_ctx.reconcile>`, kept until closed."""
        self._require_running()
        return self._sessions.host(session_id, agent, lambda: HostHistory(self, session_id, agent))

    async def close_session(self, session_id: str) -> None:
        """Release what is kept in memory for a session (storage untouched; reloaded on use)."""
        await self._sessions.close(session_id)

    def _state(self, session_id: str) -> LiveSession:
        self._require_running()
        return self._sessions.state(session_id)

    def tools(self, session_id: str, project_id: str | None = None) -> SessionTools:
        """The ``history``, ``memory``, ``task`` and ``actor`` tools for a session.

        They share this middleware's store, memory layout and memory index, so every
        pointer a rebuild gives the model (elided messages, ``File:`` lines, the
        per-turn reminder) leads to a working tool.
        """
        return SessionTools(
            self._store, self._layout, session_id, project_id, index=self._memory_index
        )

    # -- writing messages -------------------------------------------------------------
    async def add_user_message(
        self, session_id: str, text: str, *, agent: str = MAIN_AGENT
    ) -> Message:
        """Append a user message typed by a person."""
        message = _typed_by_user(session_id, text, agent)
        await self._store.append_messages([message])
        return message

    async def append(self, messages: Sequence[Message]) -> None:
        """Append messages (user turns, tool results, sub-agent output) as they are."""
        await self._store.append_messages(messages)

    async def record(self, message: Message, *, commit: Commit | None = None) -> None:
        """Store an assistant response (new, or an update of a streamed one).

        When the message finished with provider usage, the writer thresholds are
        checked right away (SPEC A3), so the checkpoint writer runs while the agent
        keeps working. An answer without provider usage gets an estimate first.
        ``commit`` writes it instead (the host-history reconciler's transaction).
        One store round trip (an upsert), no read-back.
        """
        state = self._state(message.session_id)
        if lacks_usage(message):
            message = await _with_estimated_usage(self._windows, self._events, state, message)
        if commit is not None:
            message = await commit(message)
        else:
            await self._store.upsert_messages([message])
        if message.agent == MAIN_AGENT and usage_tokens(message) is not None:
            async with state.lock:
                window = await self._windows.recorded(message.session_id, state, message)
                await self._maybe_start_writer(message.session_id, window)

    # -- the hot path -----------------------------------------------------------------
    async def prepare(self, session_id: str, *, agent: str = MAIN_AGENT) -> RequestView:
        """Return the request to send next, rebuilding first if the trigger line is crossed.

        Safe under concurrent calls for the same session: one rebuild per usage.
        """
        state = self._state(session_id)
        report: RebuildReport | None = None
        first = {"mimo_ctx.session_id": session_id, "mimo_ctx.agent": agent}
        with self._tracer.span(SPAN_PREPARE, first) as span:
            async with state.lock:
                window = await self._windows.refresh(session_id, state, agent)
                usage = usage_tokens(window.last_finished)
                if usage is not None and usage >= self._usable and not window.recovered:
                    session = await self._session(session_id)
                    if not session.state.auto_rebuild_disabled:
                        report = await self._rebuilder.recover(
                            session_id, state, agent, trigger="usage"
                        )
                    window = await self._windows.refresh(session_id, state, agent)
                elif agent == MAIN_AGENT and usage is not None:
                    await self._maybe_start_writer(session_id, window)
                view = await _request_view(self._windows, session_id, state, window)
            span.set_attributes(_view_attributes(view, usage, self._usable, report))
        return view if report is None else dataclasses.replace(view, rebuild=report)

    async def context_usage(self, session_id: str, *, agent: str = MAIN_AGENT) -> ContextUsage:
        """What the next request is made of, part by part (:mod:`mimo_ctx.context_usage`).

        Read-only: it breaks down the view :meth:`prepare` would return now without a
        rebuild; no writer starts, nothing is stored. The parts add up to its tokens.
        """
        state = self._state(session_id)
        async with state.lock:
            window = await self._windows.refresh(session_id, state, agent)
            view = await self._windows.view(session_id, state, window)
        effective = effective_window(self._limits, self._config)
        return _usage_of(session_id, view, window, effective, self._usable)

    async def on_error(
        self,
        session_id: str,
        error: BaseException,
        *,
        agent: str = MAIN_AGENT,
        view: RequestView | None = None,
    ) -> bool:
        """Handle a failed request.

        Callers overflowing for one usage at once: the first rebuilds, the others
        wait for it and retry on its result. ``view`` is the request that failed
        (default: the last view this task was given).

        Returns:
            ``True`` when the error was a context overflow and the request should be
            sent again (with a fresh :meth:`prepare`): a rebuild ran, or one ran
            since the request was built. ``False`` for any other error: re-raise it
            unchanged.

        Raises:
            ContextOverflowError: The request was built on the rebuild of its usage
                and overflowed again after its one retry (no loop, SPEC R1.4; the
                rebuild is never run again just to be refused), or none could run.
        """
        if not is_context_overflow(error):
            return False
        state = self._state(session_id)
        sent = state.built_on(agent, view.boundary_id if view else None, known=bool(view))
        async with state.lock:
            answer = await self._rebuilder.overflow(session_id, state, agent, sent=sent)
        if not answer.retry:
            raise ContextOverflowError(f"session {session_id}: {answer.reason}") from error
        return True

    async def turn(
        self,
        session_id: str,
        call: Callable[[RequestView], Awaitable[Message]],
        *,
        agent: str = MAIN_AGENT,
    ) -> Message:
        """Run one model turn: prepare, call, recover from overflows, record.

        Each overflow goes to :meth:`on_error`, which allows a retry only on a
        rebuild, or on a usage and boundary not retried before (SPEC R1.4): a
        single worker retries at most once per usage. When turns of the session run
        at once (several workers), the retry can overflow for a usage stored
        meanwhile, not yet recovered, and is recovered again; three retries at
        most in all.

        Args:
            session_id: The session.
            call: Sends a request view to the model and returns the assistant
                message (with its provider usage).
            agent: The agent taking the turn.

        Returns:
            The recorded assistant message.

        Raises:
            ContextOverflowError: The provider overflowed again after the rebuild
                of the request's usage (no loop), or after three retries.
            Exception: Any other error of ``call``, unchanged.
        """
        reply = await _call_with_retries(
            call,
            await self.prepare(session_id, agent=agent),
            prepare=lambda: self.prepare(session_id, agent=agent),
            recover=lambda exc, sent: self.on_error(session_id, exc, agent=agent, view=sent),
        )
        await self.record(reply)
        return reply

    async def rebuild(
        self, session_id: str, *, manual: bool = True, focus: str | None = None
    ) -> RebuildReport:
        """Rebuild now (the ``/rebuild [focus]`` command). Starts no model turn (SPEC A3).

        A manual rebuild folds the whole tail into the activity digest (R7.4) and
        reports its outcome as a status event. ``focus`` is kept verbatim in the body
        (``# Rebuild focus``) and handed to the checkpoint writer, which runs for it.
        """
        state = self._state(session_id)
        async with state.lock:
            await self._windows.refresh(session_id, state, MAIN_AGENT)
            trigger: Trigger = "manual" if manual else "usage"
            report = await self._rebuilder.rebuild(session_id, state, trigger=trigger, focus=focus)
        if manual:
            await self._events.emit(_rebuild_status(session_id, report))
        return report

    # -- checkpoint writers ------------------------------------------------------------
    def writer_running(self, session_id: str) -> bool:
        """True while a writer of *this* middleware runs for the session (not another worker's)."""
        return self._coordinator.in_flight(session_id)

    async def start_writer(self, session_id: str, *, reason: str = "requested") -> StartResult:
        """Checkpoint the session's history as it is now, in the background.

        Usage thresholds start the writer on their own (SPEC A3); this is for a host
        that wants a fresh checkpoint when it chooses. ``reason`` goes into the events.

        Returns:
            ``started``; ``queued`` when a writer runs already here (this request
            takes the one pending slot); ``skipped`` when there is nothing new to
            cover or another worker holds the session's writer lease.
        """
        return await self._coordinator.request(session_id, reason=reason)

    # A timeout is an outcome (R3.2), not an error: hence a parameter, not fail_after.
    async def wait_for_writer(self, session_id: str, *, timeout: float) -> WaitResult:  # noqa: ASYNC109
        """Wait for the session's running checkpoint writer, at most ``timeout`` seconds.

        Returns:
            ``finished`` or ``failed`` (how the writer ended), ``timeout``, or ``idle``
            when none runs (here or, with a writer lease, on another worker).
            Cancelling the caller cancels only the wait, never the writer.
        """
        return await self._coordinator.wait(session_id, timeout)

    def request_sent(
        self, view: RequestView, *, api: SentApi, payload: Mapping[str, Any], origin: str | None
    ) -> None:
        """Note the payload a (wrapped) client sent for ``view``: a forked writer resends it."""
        self._sessions.sent(view.session_id, view.messages, api=api, payload=payload, origin=origin)

    async def _maybe_start_writer(self, session_id: str, window: LiveWindow) -> None:
        usage = usage_tokens(window.last_finished)
        if usage is not None and self._config.checkpoint_enabled and not window.recovered:
            await self._coordinator.at_usage(session_id, usage)


def _view_attributes(
    view: RequestView, usage: int | None, trigger: int, report: RebuildReport | None
) -> Attributes:
    """The ``mimo_ctx.prepare`` span's figures (no text)."""
    figures: dict[str, int | bool] = {
        "mimo_ctx.trigger_tokens": trigger,
        "mimo_ctx.request_tokens": view.tokens,
        "mimo_ctx.messages": len(view.messages),
        "mimo_ctx.rebuilt": report is not None,
    }
    if usage is not None:
        figures["mimo_ctx.usage"] = usage
    return figures


async def _call_with_retries(
    call: Callable[[RequestView], Awaitable[Message]],
    view: RequestView,
    *,
    prepare: Callable[[], Awaitable[RequestView]],
    recover: Callable[[Exception, RequestView], Awaitable[bool]],
) -> Message:
    """The calls of :meth:`ContextMiddleware.turn`: every failure goes to ``recover``
    (``on_error``), and the request is prepared afresh, at most ``_TURN_RETRIES`` times."""
    retries = 0
    while True:
        try:
            return await call(view)
        except Exception as exc:
            if retries == _TURN_RETRIES and is_context_overflow(exc):
                raise ContextOverflowError(
                    f"session {view.session_id}: the request still overflows after "
                    f"{_TURN_RETRIES} retries on rebuilt contexts"
                ) from exc
            if not await recover(exc, view):
                raise
        retries += 1
        view = await prepare()


def _typed_by_user(session_id: str, text: str, agent: str) -> Message:
    """The message :meth:`ContextMiddleware.add_user_message` stores, stamped now."""
    return Message(
        session_id=session_id,
        role="user",
        agent=agent,
        time_created=now_ms(),
        parts=[TextPart(text=text)],
    )


def _rebuild_status(session_id: str, report: RebuildReport) -> StatusChanged:
    """The status event announcing a manual rebuild's outcome."""
    return StatusChanged(
        session_id=session_id,
        time=now_ms(),
        status=describe_rebuild(report),
        level="info" if report.boundary_id else "warning",
    )


def _usage_of(
    session_id: str, view: WindowView, window: LiveWindow, effective: int, trigger: int
) -> ContextUsage:
    """What :meth:`ContextMiddleware.context_usage` returns for ``view`` of ``window``."""
    return break_down(
        view.messages,
        view.prefix,
        session_id=session_id,
        agent=window.agent,
        boundary_id=window.boundary.id if window.boundary is not None else None,
        window=effective,
        trigger_tokens=trigger,
        last_usage=usage_tokens(window.last_finished),
    )


async def _request_view(
    windows: Windows, session_id: str, state: LiveSession, window: LiveWindow
) -> RequestView:
    """What :meth:`ContextMiddleware.prepare` returns for ``window`` (and remembers it:
    its size, and for the main agent the request a forked checkpoint writer resends)."""
    view = await windows.view(session_id, state, window)
    prefix, messages, tokens = view.prefix, view.messages, view.tokens
    state.sent_tokens[window.agent] = tokens
    boundary_id = window.boundary.id if window.boundary is not None else None
    if window.agent == MAIN_AGENT:
        state.last_request = SentRequest(prefix, messages, tokens, boundary_id)
    return RequestView(session_id, window.agent, prefix, messages, tokens, boundary_id)


async def _with_estimated_usage(
    windows: Windows, events: EventBus, state: LiveSession, message: Message
) -> Message:
    """``message`` with the usage its provider did not report, announced by an event.

    Without one neither the writer thresholds nor the trigger line could fire.
    The input is the last request prepared for the message's agent in this
    process; when there is none (another worker sent it), the request the live
    window would give now, without this answer.
    """
    request = state.sent_tokens.get(message.agent)
    if request is None:
        async with state.lock:
            window = await windows.refresh(message.session_id, state, message.agent)
            request = (await windows.view(message.session_id, state, window)).tokens
    usage = estimated_usage(message, request)
    await events.emit(
        UsageEstimated(
            session_id=message.session_id,
            time=now_ms(),
            message_id=message.id,
            agent=message.agent,
            tokens=usage.context_tokens,
            request_tokens=request,
        )
    )
    return message.model_copy(update={"usage": usage})


def _limits(model: ModelLimits | int | str) -> ModelLimits:
    if isinstance(model, ModelLimits):
        return model
    if isinstance(model, str):
        return ModelLimits.for_model(model)
    return ModelLimits(context_window=model)


def _fallback_writer(
    writer: CheckpointWriter | None, fallback_writer: CheckpointWriter | Literal[False] | None
) -> CheckpointWriter | None:
    """The writer used when ``writer`` fails: by default the offline one, if ``writer`` is not."""
    if fallback_writer is False:
        return None
    if fallback_writer is not None:
        return fallback_writer
    offline = OfflineCheckpointWriter()
    return offline if writer is not None and writer.name != offline.name else None


async def _shut_down(task_group: TaskGroup, events: EventBus, index: MemoryIndex | None) -> None:
    """Leave the middleware's task group; close the event bus and an index it owns."""
    # Writers still running are cancelled (a model writer's call is aborted): a
    # checkpoint is only persisted, atomically, when a writer completes. The body's
    # exception is not handed to the task group: it propagates unwrapped.
    task_group.cancel_scope.cancel()
    try:
        await task_group.__aexit__(None, None, None)
    finally:
        events.close()
        if index is not None:
            await index.aclose()


async def _reconcile_quietly(
    store: Store, index: MemoryIndex, layout: MemoryLayout, session_id: str
) -> None:
    """Index the memory files a writer just wrote; a failure only costs the rebuild time."""
    try:
        session = await store.get_session(session_id)
        if session is not None:
            await index.reconcile(layout, session_id=session_id, project_id=session.project_id)
    except Exception:  # the rebuild's own reconcile will try again
        _log.warning("mimo_ctx: indexing memory after the writer failed", exc_info=True)
