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
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import anyio
from anyio.abc import TaskGroup

from mimo_ctx._util import now_ms
from mimo_ctx.boundary import adjust_boundary_for_api_invariants, compute_boundary
from mimo_ctx.checkpoint_writers import OfflineCheckpointWriter
from mimo_ctx.config import RebuildConfig
from mimo_ctx.digest import collapse_checkpoint_tail
from mimo_ctx.errors import ContextOverflowError, MimoCtxError, PathEscapeError, StoreError
from mimo_ctx.events import (
    AutoRebuildDisabled,
    ContextRebuilt,
    EventBus,
    EventHandler,
    StatusChanged,
    UsagePending,
    WaitingForWriter,
    WriterFinished,
)
from mimo_ctx.memory import MemoryLayout, read_text
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    Message,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    new_message_id,
)
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.rebuild import (
    RebuildOutcome,
    build_boundary_message,
    build_compaction_message,
    micro_compact,
)
from mimo_ctx.reminders import TOOL_CALL_FINISH_REASONS, append_per_turn_reminder
from mimo_ctx.render import RenderedBody, render_rebuild_context
from mimo_ctx.sections import render_active_actors_part, render_checkpoint_index
from mimo_ctx.store.base import RequestPrefix, Session, Store
from mimo_ctx.tokens import TokenCounter, estimate_message_tokens, estimate_text_tokens, js_json
from mimo_ctx.tools import SessionTools
from mimo_ctx.triggers import (
    ModelLimits,
    due_thresholds,
    usable_tokens,
    usage_tokens,
    writer_thresholds,
)
from mimo_ctx.view import apply_send_rules
from mimo_ctx.writer import (
    CheckpointDraft,
    CheckpointWriter,
    WriterCoordinator,
    WriterLease,
    WriterRequest,
)

__all__ = ["ContextMiddleware", "RebuildReport", "RequestView", "Trigger"]

_log = logging.getLogger("mimo_ctx")

Trigger = Literal["usage", "overflow", "manual"]

_SEQ_PROBE = 2**62

OPEN_ROUND_SHARE = 0.25
"""A mid-loop rebuild keeps the open tool round live only up to this share of ``usable``."""

MEMORY_RECHECK_SECONDS = 1.0
"""How stale "this session has no memory files or tasks" may be (R8.3 reminder)."""


def _key(message: Message) -> tuple[int, str]:
    return (message.time_created, message.id)


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What a rebuild did.

    Attributes:
        outcome: How it ended (see :data:`~mimo_ctx.rebuild.RebuildOutcome`).
        trigger: ``usage`` (trigger line), ``overflow`` (provider error) or ``manual``.
        boundary_id: The inserted boundary (or compaction) message, if any.
        watermark: The watermark the checkpoint covers.
        tokens_before: Estimated request tokens before the rebuild.
        tokens_after: Estimated request tokens after it.
        compacted_results: Tool results micro-compaction cleared.
        sections: Per-section figures of the rendered body.
        fallback: ``compaction`` when a plain compaction was inserted instead.
    """

    outcome: RebuildOutcome
    trigger: Trigger
    boundary_id: str | None = None
    watermark: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    compacted_results: int = 0
    sections: RenderedBody | None = None
    fallback: Literal["compaction"] | None = None


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


@dataclass(slots=True)
class _Window:
    """The live part of one agent's history, kept current from the change feed."""

    agent: str
    seq: int = 0
    boundary: Message | None = None
    start: tuple[int, str] | None = None
    messages: list[Message] = field(default_factory=list[Message])
    keys: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])
    sendable: dict[str, tuple[Message, Message]] = field(
        default_factory=dict[str, tuple[Message, Message]]
    )
    last_finished: Message | None = None
    newest_id: str | None = None
    loaded: bool = False
    # The last view, extended in O(new messages) while messages are only appended
    # at the end (the common turn); anything else rebuilds it from the window.
    view: _ViewCache | None = None
    appended: int = 0
    reshaped: bool = True
    # The last message that carried the per-turn reminder and its copy, so the
    # copy (and its token estimate) is made once, not every turn (R8.3).
    reminder: tuple[Message, Message] | None = None

    def live(self, message: Message) -> bool:
        return self.start is None or _key(message) > self.start

    def put(self, message: Message) -> None:
        key = _key(message)
        index = bisect_left(self.keys, key)
        if index < len(self.keys) and self.keys[index] == key:
            self.messages[index] = message
            self.reshaped = True
        else:
            self.keys.insert(index, key)
            self.messages.insert(index, message)
            if index == len(self.keys) - 1:
                self.appended += 1
            else:
                self.reshaped = True
        self.sendable.pop(message.id, None)


@dataclass(frozen=True, slots=True)
class _ViewCache:
    boundary: Message | None
    messages: list[Message]
    tokens: int


@dataclass(slots=True)
class _SessionState:
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    windows: dict[str, _Window] = field(default_factory=dict[str, _Window])
    prefix: RequestPrefix | None = None
    prefix_tokens: int | None = None
    # Per-turn reminder sources (R8.3): once a session has memory files or tasks
    # it keeps them (nothing deletes them), so True is sticky; False is re-checked
    # at most once a second so the hot path does not touch the disk every turn.
    has_memory: bool = False
    memory_checked: float = -1.0
    # Writer thresholds this process saw marked (a stale copy only costs one
    # extra check against the store).
    crossed: frozenset[int] = frozenset()
    overflow_recovered: set[str] = field(default_factory=set[str])


class ContextMiddleware:
    """Context rebuild and budgeted injection for one store and memory root.

    Args:
        store: Where sessions live (e.g. :class:`~mimo_ctx.store.sqlite.SQLiteStore`).
        memory_root: Root of the memory files (SPEC A13).
        model: The model's limits, or just its context window in tokens.
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

    Example:
        >>> async with ContextMiddleware(store, "memory", model=200_000) as mw:  # doctest: +SKIP
        ...     view = await mw.prepare(session.id)
    """

    def __init__(
        self,
        store: Store,
        memory_root: str | os.PathLike[str],
        *,
        model: ModelLimits | int,
        config: RebuildConfig | None = None,
        writer: CheckpointWriter | None = None,
        fallback_writer: CheckpointWriter | Literal[False] | None = None,
        on_event: EventHandler | None = None,
        counter: TokenCounter | None = None,
        memory_index: MemoryIndex | None = None,
        writer_lease: WriterLease | None = None,
    ) -> None:
        self.store = store
        self.config = config or RebuildConfig()
        self.limits = model if isinstance(model, ModelLimits) else ModelLimits(context_window=model)
        self.layout = MemoryLayout(Path(memory_root))
        self._own_index = memory_index is None
        self.memory_index = memory_index or MemoryIndex(
            Path(memory_root) / ".index" / "memory.sqlite3"
        )
        self.events = EventBus()
        self.events.handlers.append(self._index_after_writer)
        if on_event is not None:
            self.events.handlers.append(on_event)
        self.counter = counter
        offline = OfflineCheckpointWriter()
        self.writer: CheckpointWriter = writer or offline
        fallback: CheckpointWriter | None = None
        if fallback_writer is None:
            if writer is not None and writer.name != offline.name:
                fallback = offline
        elif fallback_writer is not False:
            fallback = fallback_writer
        self.coordinator = WriterCoordinator(
            store,
            self.layout,
            self.config,
            self.writer,
            self.events,
            fallback=fallback,
            lease=writer_lease,
        )
        self.usable = usable_tokens(self.limits, self.config)
        self.thresholds = writer_thresholds(self.usable, self.config)
        self._sessions: dict[str, _SessionState] = {}
        self._task_group: TaskGroup | None = None

    def _index_after_writer(self, event: object) -> None:
        # The writer just rewrote checkpoint.md (maybe spill-over files and
        # notes.md too): index them in the background now, so the rebuild's own
        # reconcile (R5.6) usually finds the index current instead of indexing
        # megabytes on the request path. The writer's completion is not delayed.
        if isinstance(event, WriterFinished) and self._task_group is not None:
            self._task_group.start_soon(self._reconcile_quietly, event.session_id)

    async def _reconcile_quietly(self, session_id: str) -> None:
        try:
            session = await self.store.get_session(session_id)
            if session is not None:
                await self.memory_index.reconcile(
                    self.layout, session_id=session_id, project_id=session.project_id
                )
        except Exception:  # the rebuild's own reconcile will try again
            _log.warning("mimo_ctx: indexing memory after the writer failed", exc_info=True)

    # -- lifecycle --------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self._task_group is not None:
            raise MimoCtxError("this ContextMiddleware is already running")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self.coordinator.attach(task_group)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group, self._task_group = self._task_group, None
        self.coordinator.attach(None)
        if task_group is None:
            return None
        # Writers still running are cancelled: a checkpoint is only persisted
        # (atomically) when a writer completes, so nothing half-written remains.
        # The body's own exception is not handed to the task group, so it
        # propagates as it is instead of wrapped in an exception group.
        task_group.cancel_scope.cancel()
        try:
            await task_group.__aexit__(None, None, None)
        finally:
            self.events.close()
            if self._own_index:
                await self.memory_index.aclose()
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
            PathEscapeError: ``session_id`` or ``project_id`` cannot name a memory
                directory (empty, ``..``, a path separator...): refused up front
                rather than at the first rebuild.
        """
        if session_id is not None:
            self.layout.session_dir(session_id)
        self.layout.project_dir(project_id)
        if session_id is not None:
            existing = await self.store.get_session(session_id)
            if existing is not None:
                return existing
        session = Session(
            project_id=project_id,
            title=title,
            time_created=now_ms(),
            prefix=RequestPrefix(system=system, tools=[dict(t) for t in tools]),
        )
        if session_id is not None:
            session = session.model_copy(update={"id": session_id})
        try:
            await self.store.create_session(session)
        except StoreError:
            # Another task or worker created it first: use theirs.
            existing = await self.store.get_session(session.id)
            if existing is None:
                raise
            return existing
        return session

    async def _session(self, session_id: str) -> Session:
        session = await self.store.get_session(session_id)
        if session is None:
            raise MimoCtxError(f"unknown session {session_id!r}: call open_session() first")
        return session

    def _state(self, session_id: str) -> _SessionState:
        state = self._sessions.get(session_id)
        if state is None:
            state = self._sessions[session_id] = _SessionState()
        return state

    def tools(self, session_id: str, project_id: str | None = None) -> SessionTools:
        """The ``history``, ``memory``, ``task`` and ``actor`` tools for a session.

        They share this middleware's store, memory layout and memory index, so every
        pointer a rebuild gives the model (elided messages, ``File:`` lines, the
        per-turn reminder) leads to a working tool.
        """
        return SessionTools(
            self.store, self.layout, session_id, project_id, index=self.memory_index
        )

    # -- writing messages -------------------------------------------------------------
    async def add_user_message(
        self, session_id: str, text: str, *, agent: str = MAIN_AGENT
    ) -> Message:
        """Append a user message typed by a person."""
        message = Message(
            session_id=session_id,
            role="user",
            agent=agent,
            time_created=now_ms(),
            parts=[TextPart(text=text)],
        )
        await self.store.append_messages([message])
        return message

    async def append(self, messages: Sequence[Message]) -> None:
        """Append messages (user turns, tool results, sub-agent output) as they are."""
        await self.store.append_messages(messages)

    async def record(self, message: Message) -> None:
        """Store an assistant response (new, or an update of a streamed one).

        When the message finished with provider usage, the writer thresholds are
        checked right away (SPEC A3), so the checkpoint writer runs while the agent
        keeps working.
        """
        existing = await self.store.get_message(message.id)
        if existing is None:
            await self.store.append_messages([message])
        else:
            await self.store.update_messages([message])
        if message.agent == MAIN_AGENT and usage_tokens(message) is not None:
            state = self._state(message.session_id)
            async with state.lock:
                window = await self._refresh(message.session_id, state, MAIN_AGENT)
                await self._maybe_start_writer(message.session_id, window)

    # -- the hot path -----------------------------------------------------------------
    async def prepare(self, session_id: str, *, agent: str = MAIN_AGENT) -> RequestView:
        """Return the request to send next, rebuilding first if the trigger line is crossed.

        Safe under concurrent calls for the same session: one rebuild per usage.
        """
        state = self._state(session_id)
        report: RebuildReport | None = None
        async with state.lock:
            window = await self._refresh(session_id, state, agent)
            usage = usage_tokens(window.last_finished)
            if usage is not None and usage >= self.usable and not self._recovered(window):
                session = await self._session(session_id)
                if session.state.auto_rebuild_disabled:
                    pass
                elif agent == MAIN_AGENT:
                    report = await self._rebuild_locked(session_id, state, trigger="usage")
                else:
                    report = await self._compact_agent_locked(session_id, state, agent)
                window = await self._refresh(session_id, state, agent)
            elif agent == MAIN_AGENT and usage is not None:
                await self._maybe_start_writer(session_id, window)
            view = await self._view(session_id, state, window)
        if report is not None:
            view = RequestView(
                session_id=view.session_id,
                agent=view.agent,
                prefix=view.prefix,
                messages=view.messages,
                tokens=view.tokens,
                boundary_id=view.boundary_id,
                rebuild=report,
            )
        return view

    async def on_error(
        self, session_id: str, error: BaseException, *, agent: str = MAIN_AGENT
    ) -> bool:
        """Handle a failed request.

        Returns:
            ``True`` when the error was a context overflow and a rebuild ran: retry
            the request once (with a fresh :meth:`prepare`). ``False`` for any other
            error: re-raise it unchanged.

        Raises:
            ContextOverflowError: The provider overflowed again for a usage that was
                already recovered (no loop, SPEC R1.4).
        """
        if not is_context_overflow(error):
            return False
        state = self._state(session_id)
        async with state.lock:
            window = await self._refresh(session_id, state, agent)
            usage_key = window.last_finished.id if window.last_finished else f"start:{agent}"
            if usage_key in state.overflow_recovered:
                raise ContextOverflowError(
                    f"session {session_id}: the provider still reports a context overflow "
                    "after a rebuild for the same usage; not retrying again"
                ) from error
            state.overflow_recovered.add(usage_key)
            if agent == MAIN_AGENT:
                report = await self._rebuild_locked(session_id, state, trigger="overflow")
            else:
                report = await self._compact_agent_locked(session_id, state, agent)
        if report.boundary_id is None and report.outcome != "already-recovered":
            raise ContextOverflowError(
                f"session {session_id}: context overflow and the rebuild could not run "
                f"(outcome {report.outcome})"
            ) from error
        return True

    async def turn(
        self,
        session_id: str,
        call: Callable[[RequestView], Awaitable[Message]],
        *,
        agent: str = MAIN_AGENT,
    ) -> Message:
        """Run one model turn: prepare, call, recover from an overflow once, record.

        Args:
            session_id: The session.
            call: Sends a request view to the model and returns the assistant
                message (with its provider usage).
            agent: The agent taking the turn.

        Returns:
            The recorded assistant message.

        Raises:
            ContextOverflowError: The provider overflowed again after the rebuild.
            Exception: Any other error of ``call``, unchanged.
        """
        view = await self.prepare(session_id, agent=agent)
        try:
            reply = await call(view)
        except Exception as exc:
            if not await self.on_error(session_id, exc, agent=agent):
                raise
            view = await self.prepare(session_id, agent=agent)
            try:
                reply = await call(view)
            except Exception as again:
                if is_context_overflow(again):
                    raise ContextOverflowError(
                        f"session {session_id}: the request still overflows after a rebuild"
                    ) from again
                raise
        await self.record(reply)
        return reply

    async def rebuild(self, session_id: str, *, manual: bool = True) -> RebuildReport:
        """Rebuild now (the ``/rebuild`` command). Starts no model turn (SPEC A3).

        A manual rebuild folds the whole tail into the activity digest (R7.4) and
        reports its outcome as a status event.
        """
        state = self._state(session_id)
        async with state.lock:
            await self._refresh(session_id, state, MAIN_AGENT)
            report = await self._rebuild_locked(
                session_id, state, trigger="manual" if manual else "usage"
            )
        if manual:
            await self.events.emit(
                StatusChanged(
                    session_id=session_id,
                    time=now_ms(),
                    status=f"Context rebuild: {report.outcome}",
                    level="info" if report.boundary_id else "warning",
                )
            )
        return report

    # -- window maintenance ------------------------------------------------------------
    async def _refresh(self, session_id: str, state: _SessionState, agent: str) -> _Window:
        window = state.windows.get(agent)
        if window is None or not window.loaded:
            window = await self._load_window(session_id, agent)
            state.windows[agent] = window
            return window
        changed, seq = await self.store.changes_since(session_id, window.seq)
        window.seq = seq
        reload = False
        for message in changed:
            if message.agent != agent:
                continue
            if window.newest_id is None or message.id > window.newest_id:
                window.newest_id = message.id
            if (
                message.role == "assistant"
                and message.finish is not None
                and (window.last_finished is None or message.id >= window.last_finished.id)
            ):
                window.last_finished = message
            if message.is_boundary and (window.boundary is None or message.id > window.boundary.id):
                reload = True
            elif window.live(message):
                window.put(message)
        if reload:
            window = await self._load_window(session_id, agent)
            state.windows[agent] = window
        return window

    async def _load_window(self, session_id: str, agent: str) -> _Window:
        window = _Window(agent=agent)
        _, window.seq = await self.store.changes_since(session_id, _SEQ_PROBE)
        if agent == MAIN_AGENT:
            boundary = await self.store.latest_boundary(session_id)
        else:
            boundary = None
            for message in await self.store.list_messages(session_id, agent=agent):
                if message.is_boundary and (boundary is None or message.id > boundary.id):
                    boundary = message
        window.boundary = boundary
        if boundary is not None:
            covered = _covered_up_to(boundary)
            watermark = await self.store.get_message(covered) if covered else None
            window.start = (
                _key(watermark)
                if watermark is not None
                else (
                    boundary.time_created - 1,
                    "\uffff",
                )
            )
        messages = await self.store.list_messages(session_id, agent=agent, since=window.start)
        for message in messages:
            if window.live(message):
                window.keys.append(_key(message))
                window.messages.append(message)
        window.last_finished = await self.store.latest_finished_assistant(session_id, agent=agent)
        window.newest_id = max((m.id for m in messages), default=None)
        window.loaded = True
        return window

    def _recovered(self, window: _Window) -> bool:
        # R1.4: decided by ids — the boundary's creation time is back-dated.
        if window.boundary is None or window.last_finished is None:
            return False
        return window.boundary.id > window.last_finished.id

    async def _view(self, session_id: str, state: _SessionState, window: _Window) -> RequestView:
        prefix = state.prefix
        if prefix is None:
            # The prefix is frozen (R8.1): read once per process.
            session = await self._session(session_id)
            prefix = state.prefix = session.prefix or RequestPrefix()
        if state.prefix_tokens is None:
            state.prefix_tokens = estimate_text_tokens(prefix.system) + estimate_text_tokens(
                js_json(prefix.tools)
            )
        boundary = window.boundary
        cache = window.view
        appended = window.messages[len(window.messages) - window.appended :]
        if (
            cache is not None
            and not window.reshaped
            and cache.boundary is boundary
            and not any(isinstance(p, ToolResultPart) for m in appended for p in m.parts)
        ):
            # Only appended at the end, and nothing that answers an earlier call:
            # the send rules of earlier messages are unchanged (SPEC A10), so the
            # turn costs O(new messages).
            fresh = apply_send_rules(_collapse_appended(boundary, appended))
            sendable = [*cache.messages, *fresh]
            tokens = cache.tokens + sum(estimate_message_tokens(m) for m in fresh)
        else:
            sendable, tokens = self._full_view(window, boundary)
        window.view = _ViewCache(boundary, sendable, tokens)
        window.appended = 0
        window.reshaped = False
        tokens += state.prefix_tokens
        # A new list: the caller may change it; the cached one stays as it is.
        sendable = list(sendable)
        if await self._needs_reminder(session_id, state):
            for index in range(len(sendable) - 1, -1, -1):
                source = sendable[index]
                if source.role != "user":
                    continue
                cached = window.reminder
                if cached is not None and cached[0] is source:
                    replaced = cached[1]
                else:
                    replaced = append_per_turn_reminder(
                        [source], str(self.layout.session_dir(session_id))
                    )[0]
                    window.reminder = (source, replaced)
                tokens += estimate_message_tokens(replaced) - estimate_message_tokens(source)
                sendable[index] = replaced
                break
        return RequestView(
            session_id=session_id,
            agent=window.agent,
            prefix=prefix,
            messages=sendable,
            tokens=tokens,
            boundary_id=boundary.id if boundary is not None else None,
        )

    def _full_view(self, window: _Window, boundary: Message | None) -> tuple[list[Message], int]:
        """The view rebuilt from the whole window: send rules over every live message."""
        # Older boundaries that still list after the watermark are not resent:
        # the newest boundary supersedes them.
        live = [m for m in window.messages if not m.is_boundary]
        ordered = [boundary, *live] if boundary is not None else live
        collapsed = collapse_checkpoint_tail(ordered)
        sources = {m.id: m for m in collapsed}
        sendable: list[Message] = []
        tokens = 0
        for fresh in apply_send_rules(collapsed):
            converted = fresh
            source = sources.get(fresh.id)
            if fresh is not source:
                # A converted copy (boundary, compacted results...) is rebuilt every
                # time; reuse the last equal copy so its token estimate stays cached.
                # Compare parts: pydantic equality also compares the cached estimate.
                cached = window.sendable.get(fresh.id)
                if cached is not None and cached[0] is source and cached[1].parts == fresh.parts:
                    converted = cached[1]
                elif source is not None:
                    window.sendable[fresh.id] = (source, fresh)
            sendable.append(converted)
            tokens += estimate_message_tokens(converted)
        return sendable, tokens

    async def _needs_reminder(self, session_id: str, state: _SessionState) -> bool:
        # R8.3 / A12: only when the session has memory files or tasks.
        if state.has_memory:
            return True
        now = time.monotonic()
        if state.memory_checked >= 0 and now - state.memory_checked < MEMORY_RECHECK_SECONDS:
            return False
        state.memory_checked = now
        directory = self.layout.session_dir(session_id)
        try:
            has_files = await anyio.to_thread.run_sync(_dir_has_entries, directory)
        except OSError:
            has_files = False
        state.has_memory = has_files or bool(await self.store.list_tasks(session_id))
        return state.has_memory

    # -- writer thresholds ---------------------------------------------------------------
    async def _maybe_start_writer(self, session_id: str, window: _Window) -> None:
        usage = usage_tokens(window.last_finished)
        if usage is None or not self.config.checkpoint_enabled or self._recovered(window):
            return
        state = self._state(session_id)
        if not due_thresholds(usage, self.thresholds, state.crossed):
            return
        session = await self._session(session_id)
        state.crossed = frozenset(session.state.crossed_thresholds)
        due = due_thresholds(usage, self.thresholds, state.crossed)
        if not due or self.coordinator.in_flight(session_id):
            # A3: while a writer runs no threshold is marked, so it fires later.
            return
        result = await self.coordinator.request(session_id, reason=f"usage {usage} >= {due[-1]}")
        if result == "skipped":
            return
        crossed = sorted({*session.state.crossed_thresholds, *due})
        state.crossed = frozenset(crossed)
        new_state = session.state.model_copy(update={"crossed_thresholds": crossed})
        await self.store.update_session(session.model_copy(update={"state": new_state}))

    # -- rebuild ---------------------------------------------------------------------
    async def _rebuild_locked(
        self, session_id: str, state: _SessionState, *, trigger: Trigger
    ) -> RebuildReport:
        manual = trigger == "manual"
        session = await self._session(session_id)
        window = state.windows[MAIN_AGENT]
        usage_key = (
            f"manual:{new_message_id()}"
            if manual
            else (window.last_finished.id if window.last_finished else f"start:{MAIN_AGENT}")
        )
        before = (await self._view(session_id, state, window)).tokens
        await self.events.emit(UsagePending(session_id=session_id, time=now_ms()))
        if not self.config.checkpoint_enabled:
            return await self._fallback_compaction(
                session_id,
                state,
                usage_key=usage_key,
                outcome="checkpoint-off",
                trigger=trigger,
                before=before,
            )

        checkpoint_path = self.layout.checkpoint_path(session_id)
        watermark_id = await self.store.get_watermark(session_id)
        if watermark_id is None or not await anyio.Path(checkpoint_path).exists():
            # The ensure-checkpoint path (A3): start a writer and wait for it.
            timeout = (
                self.config.writer.ensure_wait_manual
                if manual
                else self.config.writer.ensure_wait_auto
            )
            await self.events.emit(
                StatusChanged(session_id=session_id, time=now_ms(), status="Writing checkpoint…")
            )
            started = await self.coordinator.request(session_id, reason=f"ensure ({trigger})")
            if started != "skipped" or await self.coordinator.busy(session_id):
                await self.coordinator.wait(session_id, timeout)
            watermark_id = await self.store.get_watermark(session_id)
            if watermark_id is None or not await anyio.Path(checkpoint_path).exists():
                return await self._fallback_compaction(
                    session_id,
                    state,
                    usage_key=usage_key,
                    outcome="writer-failed",
                    trigger=trigger,
                    before=before,
                )
        else:
            if not self.coordinator.in_flight(session_id) and await self._checkpoint_is_stale(
                session_id, watermark_id
            ):
                # Beyond the original: the checkpoint has not moved since the last
                # rebuild (no threshold fired: small windows have none below 25000
                # tokens), so reusing it would let the live tail grow rebuild after
                # rebuild. Start a writer; the wait below bounds it as R3.2 does.
                await self.coordinator.request(session_id, reason=f"stale checkpoint ({trigger})")
            if await self.coordinator.busy(session_id):
                await self._wait_for_writer(session_id)
            watermark_id = await self.store.get_watermark(session_id) or watermark_id

        watermark = await self.store.get_message(watermark_id)
        if watermark is None:
            return await self._fallback_compaction(
                session_id,
                state,
                usage_key=usage_key,
                outcome="insert-failed",
                trigger=trigger,
                before=before,
                fallback=False,
            )
        return await self._insert(
            session, state, watermark, usage_key=usage_key, trigger=trigger, before=before
        )

    async def _wait_for_writer(self, session_id: str) -> None:
        """R3.2: wait for the in-flight writer; on timeout or failure use what is on disk."""
        timeout = self.config.writer.wait_with_watermark
        await self.events.emit(
            WaitingForWriter(session_id=session_id, time=now_ms(), timeout=timeout)
        )
        await self.coordinator.wait(session_id, timeout)

    async def _checkpoint_is_stale(self, session_id: str, watermark_id: str) -> bool:
        latest = await self.store.latest_boundary(session_id)
        return latest is not None and _covered_up_to(latest) == watermark_id

    async def _insert(
        self,
        session: Session,
        state: _SessionState,
        watermark: Message,
        *,
        usage_key: str,
        trigger: Trigger,
        before: int,
    ) -> RebuildReport:
        session_id = session.id
        # One listing of every agent's messages from the watermark on gives both the
        # main-agent tail and the messages micro-compaction looks at (one parse).
        since_watermark = await self.store.list_messages(
            session_id, agent=None, since=_key(watermark)
        )
        tail = [
            m
            for m in since_watermark
            if m.agent == MAIN_AGENT and m.id > watermark.id and not m.is_boundary
        ]
        # The index part needs only the Topic line: read the head of the file, inside
        # the memory root; an unreadable file shows as "no checkpoints yet".
        try:
            checkpoint_text = await read_text(
                self.layout.checkpoint_path(session_id), max_chars=16_384, root=self.layout.root
            )
        except (OSError, PathEscapeError):
            checkpoint_text = None
        now = now_ms()
        actors = await self.store.list_actors(session_id, active_only=True)
        index_text = render_checkpoint_index(
            directory=str(self.layout.session_dir(session_id)), checkpoint_text=checkpoint_text
        )
        actors_text = render_active_actors_part(actors, session_id=session_id, now_ms=now)

        # Beyond the original: a rebuild in the middle of a tool loop keeps the last
        # tool round (the call and its results) live and uncleared, so the model can
        # "respond to the tool results below" (R5.8) instead of re-running the call.
        live_round = _open_tool_round(tail)
        if sum(estimate_message_tokens(m) for m in live_round) > self.usable * OPEN_ROUND_SHARE:
            # A round this large is what overflowed: fold and clear it like the rest.
            live_round = []
        digested = tail[: len(tail) - len(live_round)]
        kept = {m.id for m in live_round}

        # Every agent's messages created after the watermark's millisecond.
        everything = [m for m in since_watermark if m.time_created > watermark.time_created]
        compacted = micro_compact(
            everything,
            after_time=watermark.time_created,
            tools=self.config.micro_compact_tools,
            now_ms=now,
            skip_ids=kept,
        )
        compacted_by_id = {m.id: m for m in compacted}
        # What stays live after the insert: user messages of the tail (collapse
        # keeps them) with compacted results as placeholders, and the open round.
        live_tail = [compacted_by_id.get(m.id, m) for m in tail if m.role == "user" or m.id in kept]
        prefix_tokens = state.prefix_tokens or 0
        live_tokens = sum(estimate_message_tokens(m) for m in apply_send_rules(live_tail))
        fixed = (
            prefix_tokens
            + live_tokens
            + estimate_text_tokens(index_text)
            + estimate_text_tokens(actors_text)
            + 64
        )
        # R5.9 beyond: the rebuilt request must fit under the trigger line, so the
        # body gets at most what is left (and at most the configured total cap).
        room = self.usable - fixed
        max_body = room if self.config.total_cap is None else min(room, self.config.total_cap)
        rendered = await render_rebuild_context(
            store=self.store,
            layout=self.layout,
            session=session,
            agent=MAIN_AGENT,
            watermark=watermark,
            tail=digested,
            reminder_tail=tail,
            config=self.config,
            max_tokens=max(max_body, 0),
            counter=self.counter,
            memory_index=self.memory_index,
        )
        if not rendered.text:
            return RebuildReport(
                outcome="insert-failed",
                trigger=trigger,
                watermark=watermark.id,
                tokens_before=before,
                sections=rendered,
            )
        digest_up_to = max(m.id for m in digested) if rendered.has_activity and digested else None
        boundary = build_boundary_message(
            watermark=watermark,
            digest_up_to=digest_up_to,
            directory=str(self.layout.session_dir(session_id)),
            number=session.state.rebuilds + 1,
            index_text=index_text,
            body=rendered.text,
            actors_text=actors_text,
            newer_than=max((m.id for m in everything), default=None),
        )
        after = fixed - 64 + estimate_message_tokens(boundary)
        report = RebuildReport(
            outcome="rebuilt",
            trigger=trigger,
            boundary_id=boundary.id,
            watermark=watermark.id,
            tokens_before=before,
            tokens_after=after,
            compacted_results=_count_compacted(compacted, now),
            sections=rendered,
        )
        return await self._commit(
            session,
            state,
            usage_key=usage_key,
            boundary=boundary,
            compacted=compacted,
            report=report,
            adopt=(watermark, since_watermark),
        )

    async def _commit(
        self,
        session: Session,
        state: _SessionState,
        *,
        usage_key: str,
        boundary: Message,
        compacted: Sequence[Message],
        report: RebuildReport,
        adopt: tuple[Message, Sequence[Message]] | None = None,
    ) -> RebuildReport:
        main = boundary.agent == MAIN_AGENT
        freed = 0.0
        if report.tokens_before and report.tokens_after is not None:
            freed = max(0.0, 1 - report.tokens_after / report.tokens_before)
        fractions = [*session.state.freed_fractions, freed][-5:]
        # The loop guard and the threshold reset concern the main agent only; a
        # sub-agent's plain compaction leaves the session's state alone.
        disable = (
            main
            and report.trigger != "manual"
            and len(fractions) >= 2
            and all(f < self.config.min_freed_fraction for f in fractions[-2:])
        )
        new_state = session.state.model_copy(
            update={
                "crossed_thresholds": [],
                "skip_overflow_once": True,
                "rebuilds": session.state.rebuilds + 1,
                "freed_fractions": fractions,
                "auto_rebuild_disabled": session.state.auto_rebuild_disabled or disable,
            }
        )
        committed = await self.store.commit_rebuild(
            session.id,
            usage_key=usage_key,
            boundary=boundary,
            updated=compacted,
            session=session.model_copy(update={"state": new_state}) if main else None,
        )
        if not committed:
            return RebuildReport(outcome="already-recovered", trigger=report.trigger)
        if main:
            state.crossed = frozenset()
        await self.events.emit(
            ContextRebuilt(
                session_id=session.id,
                time=now_ms(),
                outcome=report.outcome,
                manual=report.trigger == "manual",
                boundary_id=boundary.id,
                watermark=report.watermark,
                tokens_before=report.tokens_before,
                tokens_after=report.tokens_after,
                compacted_results=report.compacted_results,
            )
        )
        if disable and not session.state.auto_rebuild_disabled:
            await self.events.emit(
                AutoRebuildDisabled(
                    session_id=session.id,
                    time=now_ms(),
                    freed_fractions=tuple(fractions[-2:]),
                    reason=(
                        "two consecutive rebuilds each freed less than "
                        f"{self.config.min_freed_fraction:.0%} of the request; "
                        "the live tail alone is too large to fit"
                    ),
                )
            )
        if adopt is not None and main and MAIN_AGENT in state.windows:
            self._adopt_window(state, boundary, adopt[0], adopt[1], compacted)
        await self._refresh(session.id, state, boundary.agent)
        return report

    def _adopt_window(
        self,
        state: _SessionState,
        boundary: Message,
        watermark: Message,
        listed: Sequence[Message],
        compacted: Sequence[Message],
    ) -> None:
        """Build the main window after a rebuild from what the rebuild already read.

        ``listed`` holds every message from the watermark on (as read before the
        commit), ``compacted`` the micro-compacted copies. The window keeps the old
        sequence number, so the refresh that follows replays the commit's own writes
        and anything written meanwhile: the result equals a reload from the store
        without listing and parsing the tail again.
        """
        old = state.windows[MAIN_AGENT]
        window = _Window(agent=MAIN_AGENT, seq=old.seq, boundary=boundary, loaded=True)
        window.start = _key(watermark)
        replaced = {m.id: m for m in compacted}
        for message in listed:
            if message.agent == MAIN_AGENT and window.live(message):
                current = replaced.get(message.id, message)
                window.keys.append(_key(current))
                window.messages.append(current)
        window.put(boundary)
        window.last_finished = old.last_finished
        window.newest_id = max(old.newest_id or boundary.id, boundary.id)
        state.windows[MAIN_AGENT] = window

    async def _fallback_compaction(
        self,
        session_id: str,
        state: _SessionState,
        *,
        usage_key: str,
        outcome: RebuildOutcome,
        trigger: Trigger,
        before: int,
        fallback: bool = True,
    ) -> RebuildReport:
        """A3: outcomes other than rebuilt/insert-failed fall back to a plain compaction."""
        if not fallback:
            return RebuildReport(outcome=outcome, trigger=trigger, tokens_before=before)
        return await self._plain_compaction(
            session_id,
            state,
            agent=MAIN_AGENT,
            usage_key=usage_key,
            outcome=outcome,
            trigger=trigger,
            before=before,
        )

    async def _compact_agent_locked(
        self, session_id: str, state: _SessionState, agent: str
    ) -> RebuildReport:
        window = state.windows[agent]
        usage_key = window.last_finished.id if window.last_finished else f"start:{agent}"
        before = (await self._view(session_id, state, window)).tokens
        return await self._plain_compaction(
            session_id,
            state,
            agent=agent,
            usage_key=usage_key,
            outcome="compacted",
            trigger="usage",
            before=before,
        )

    async def _plain_compaction(
        self,
        session_id: str,
        state: _SessionState,
        *,
        agent: str,
        usage_key: str,
        outcome: RebuildOutcome,
        trigger: Trigger,
        before: int,
    ) -> RebuildReport:
        session = await self._session(session_id)
        history = await self.store.list_messages(session_id, agent=agent)
        history = [m for m in history if not m.is_boundary]
        boundary_id = compute_boundary(history, self.config)
        if boundary_id is None:
            return RebuildReport(outcome=outcome, trigger=trigger, tokens_before=before)
        boundary_id = adjust_boundary_for_api_invariants(history, boundary_id)
        watermark = next(m for m in history if m.id == boundary_id)
        covered = [m for m in history if m.id <= boundary_id]
        draft: CheckpointDraft = OfflineCheckpointWriter().build(
            WriterRequest(
                session_id=session_id,
                project_id=session.project_id,
                watermark=boundary_id,
                messages=covered,
                previous_checkpoint=None,
                notes=None,
                tasks=await self.store.list_tasks(session_id),
                checkpoint_path=self.layout.checkpoint_path(session_id),
                project_memory_path=self.layout.project_memory_path(session.project_id),
                notes_path=self.layout.notes_path(session_id),
                tasks_dir=self.layout.tasks_dir(session_id),
                budgets={},
            )
        )
        message = build_compaction_message(
            watermark=watermark,
            summary=draft.text,
            auto=True,
            newer_than=max((m.id for m in history), default=None),
        )
        after = estimate_message_tokens(message) + sum(
            estimate_message_tokens(m) for m in history if m.id > boundary_id
        )
        report = RebuildReport(
            outcome=outcome,
            trigger=trigger,
            boundary_id=message.id,
            watermark=boundary_id,
            tokens_before=before,
            tokens_after=after,
            fallback="compaction",
        )
        return await self._commit(
            session, state, usage_key=usage_key, boundary=message, compacted=[], report=report
        )


def _open_tool_round(tail: Sequence[Message]) -> list[Message]:
    """The tail's last tool round when the agent is mid-loop, else ``[]``.

    Mid-loop: the tail ends with an assistant message that finished with tool calls,
    possibly followed by ``tool`` messages holding its results (provider format).
    """
    end = len(tail)
    start = end
    while start > 0 and tail[start - 1].role == "tool":
        start -= 1
    if start == 0:
        return []
    last = tail[start - 1]
    if last.role != "assistant" or last.finish not in TOOL_CALL_FINISH_REASONS:
        return []
    if not any(isinstance(p, ToolPart) for p in last.parts):
        return []
    return list(tail[start - 1 : end])


def _collapse_appended(boundary: Message | None, appended: Sequence[Message]) -> list[Message]:
    """The appended messages the collapse keeps (R7.3), without older boundaries."""
    checkpoint = boundary.checkpoint_part if boundary is not None else None
    covered = checkpoint.covered_up_to if checkpoint is not None else None
    digest = checkpoint.digest_up_to if checkpoint is not None else None
    return [
        m
        for m in appended
        if not m.is_boundary
        and (
            digest is None
            or covered is None
            or m.role == "user"
            or m.id <= covered
            or m.id > digest
        )
    ]


def _covered_up_to(boundary: Message) -> str | None:
    checkpoint = boundary.checkpoint_part
    if checkpoint is not None:
        return checkpoint.covered_up_to
    for part in boundary.parts:
        if isinstance(part, CompactionPart):
            return part.covered_up_to
    return None


def _count_compacted(messages: Sequence[Message], now: int) -> int:
    count = 0
    for message in messages:
        for part in message.parts:
            if (
                isinstance(part, ToolPart)
                and isinstance(part.state, ToolStateCompleted)
                and part.state.time.compacted == now
            ) or (isinstance(part, ToolResultPart) and part.time.compacted == now):
                count += 1
    return count


def _dir_has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False
