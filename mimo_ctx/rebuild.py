"""The rebuild step: wait for the writer, render, insert, commit, fall back (SPEC R3–R5, A3, A4).

Private step of :class:`~mimo_ctx.middleware.ContextMiddleware`, public for its
result types; the pure builders it uses are in :mod:`mimo_ctx.compaction`.
:class:`Rebuilder` runs one rebuild of a session whose lock the middleware holds:

1. **wait** — without a watermark or ``checkpoint.md`` it starts the writer and
   waits for it (the ensure-checkpoint path, A3); with one it waits for a writer
   in flight (R3.2), after starting one when the checkpoint has not moved since
   the last rebuild;
2. **render** the body under the room left below the trigger line (R5);
3. **insert** — build the boundary (back-dated creation time, fresh newest id,
   parts in the R4.4 order) and micro-compact old tool results (R4.5);
4. **commit** both in one store transaction (:meth:`Store.commit_rebuild`), keyed
   by the assistant usage it recovers, so they land together or not at all,
   once per usage; then the loop guard and the events;
5. **fall back** to a plain compaction when no checkpoint can be had (A3), and
   for sub-agents (R3.1).

The middleware then adopts the committed boundary into its live window.
Nothing is deleted: compacted results keep their output in storage.
"""

from __future__ import annotations

import functools
import heapq
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import anyio

from mimo_ctx._rebuild_report import (
    REBUILD_COMMAND,
    REBUILD_OUTCOMES,
    OverflowAnswer,
    RebuildCommand,
    RebuildOutcome,
    RebuildReport,
    Trigger,
    cancelled_status,
    describe_rebuild,
    rebuild_command,
    rebuilt_event,
    report_attributes,
    span_start,
)
from mimo_ctx._user_pages import LiveUsers, first_user_reads, held_users
from mimo_ctx._util import now_ms
from mimo_ctx._window import LiveSession, SentOn, Windows
from mimo_ctx.boundary import adjust_boundary_for_api_invariants, compute_boundary
from mimo_ctx.checkpoint import OfflineCheckpointWriter
from mimo_ctx.checkpoint._coordinator import WriterCoordinator
from mimo_ctx.checkpoint._files import offline_checkpoint_on_disk
from mimo_ctx.checkpoint._summary import SUMMARY_MARGIN, compaction_summary
from mimo_ctx.compaction import (
    build_boundary_message,
    build_compaction_message,
    count_compacted,
    estimate_boundary_tokens,
    micro_compact,
    open_tool_round,
)
from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import (
    AutoRebuildDisabled,
    EventBus,
    StatusChanged,
    UsagePending,
    WaitingForWriter,
)
from mimo_ctx.hooks import (
    AfterRebuild,
    BeforeRebuild,
    CancelRebuild,
    HostSection,
    RebuildContext,
    run_after_rebuild,
    run_before_rebuild,
)
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import (
    MAIN_AGENT,
    Message,
    message_key,
    new_message_id,
    written_after,
)
from mimo_ctx.render import RenderedBody, assemble_body, gather_sources
from mimo_ctx.sections import render_active_actors_part, render_checkpoint_index
from mimo_ctx.session import Session
from mimo_ctx.session import SessionState as StoredState
from mimo_ctx.store._reads import RebuildReadRequest, RebuildReads, read_for_rebuild
from mimo_ctx.store.base import Store
from mimo_ctx.tokens import (
    TokenCounter,
    estimate_message_tokens,
)
from mimo_ctx.tracing import NO_TRACER, SPAN_REBUILD, Tracer
from mimo_ctx.triggers import usage_tokens
from mimo_ctx.view import apply_send_rules

__all__ = [
    "OPEN_ROUND_SHARE",
    "REBUILD_COMMAND",
    "REBUILD_OUTCOMES",
    "OverflowAnswer",
    "RebuildCommand",
    "RebuildOutcome",
    "RebuildReport",
    "Rebuilder",
    "Trigger",
    "describe_rebuild",
    "rebuild_command",
]

OPEN_ROUND_SHARE = 0.25
"""A mid-loop rebuild keeps the open tool round live only up to this share of ``usable``."""


@dataclass(frozen=True, slots=True)
class _Committed:
    """What a committed rebuild wrote, to adopt into the live window.

    Attributes:
        boundary: The inserted boundary (or plain compaction) message.
        compacted: The micro-compacted copies of earlier messages.
        listed: For a rebuild boundary: its watermark and every message listed
            from it on, as read before the commit (``None`` for a compaction).
    """

    boundary: Message
    compacted: Sequence[Message]
    listed: tuple[Message, Sequence[Message]] | None = None


@dataclass(frozen=True, slots=True)
class _Result:
    """A rebuild's report, and what it committed (``None`` when nothing was)."""

    report: RebuildReport
    committed: _Committed | None = None


class Rebuilder:
    """Runs the rebuild pipeline for the middleware (see the module docstring).

    Every method expects the caller to hold the session's lock.

    Args:
        windows: The live windows (the request size before, the adoption after).
        store: Where the history, the watermark and the boundaries live.
        layout: Where ``checkpoint.md`` and the other memory files live.
        config: Caps, writer waits, the loop guard and micro-compaction settings.
        events: Where ``UsagePending``, ``WaitingForWriter``, ``ContextRebuilt``...
            go.
        coordinator: The session writers (started, waited for).
        memory_index: The memory index the body's memory-file section reads.
        counter: Token counter of the body's section caps.
        usable: The trigger line in tokens; the rebuilt request fits under it.
        session: Reads a session, raising when it is unknown.
        before_rebuild: The host's hook before a main-agent rebuild (a section of its
            own, or the cancellation of an automatic rebuild; :mod:`mimo_ctx.hooks`).
        after_rebuild: The host's hook after it, with the report.
        tracer: Opens the ``mimo_ctx.rebuild`` span of every rebuild and compaction.
    """

    def __init__(
        self,
        *,
        windows: Windows,
        store: Store,
        layout: MemoryLayout,
        config: RebuildConfig,
        events: EventBus,
        coordinator: WriterCoordinator,
        memory_index: MemoryIndex,
        counter: TokenCounter | None,
        usable: int,
        session: Callable[[str], Awaitable[Session]],
        before_rebuild: BeforeRebuild | None = None,
        after_rebuild: AfterRebuild | None = None,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self._tracer = tracer
        self._before = before_rebuild
        self._after = after_rebuild
        self._windows = windows
        self._store = store
        self._layout = layout
        self._config = config
        self._events = events
        self._coordinator = coordinator
        self._memory_index = memory_index
        self._counter = counter
        self._usable = usable
        self._session = session

    async def rebuild(
        self, session_id: str, state: LiveSession, *, trigger: Trigger, focus: str | None = None
    ) -> RebuildReport:
        """Rebuild the main agent's context from the checkpoint, or fall back to a compaction.

        The host's hooks run around it (:mod:`mimo_ctx.hooks`); ``focus`` (a manual
        rebuild's) is kept verbatim in the body and handed to the checkpoint writer.
        """
        first = span_start(session_id, MAIN_AGENT, trigger)
        with self._tracer.span(SPAN_REBUILD, {**first, "mimo_ctx.focus": bool(focus)}) as span:
            report = await self._with_hooks(session_id, state, trigger=trigger, focus=focus)
            span.set_attributes(report_attributes(report))
        return report

    async def _with_hooks(
        self, session_id: str, state: LiveSession, *, trigger: Trigger, focus: str | None
    ) -> RebuildReport:
        window = state.windows[MAIN_AGENT]
        limit = self._config.hook_timeout
        context = RebuildContext(
            session_id, trigger, usage_tokens(window.last_finished), self._usable, focus
        )
        answer = await run_before_rebuild(self._before, context, limit=limit)
        if isinstance(answer, CancelRebuild) and trigger == "usage":
            # Automatic rebuilds only: the user asked for a manual one, and an
            # overflow is not answered by waiting (the bound on what a hook can stop).
            await self._events.emit(cancelled_status(session_id, answer.reason))
            report = RebuildReport(
                outcome="cancelled", trigger=trigger, cancel_reason=answer.reason
            )
        else:
            usage_key = f"manual:{new_message_id()}" if trigger == "manual" else window.usage_key
            before = (await self._windows.view(session_id, state, window)).tokens
            recovers = window.last_finished if trigger != "manual" else None
            result = await self._rebuild(
                session_id,
                state,
                trigger=trigger,
                usage_key=usage_key,
                recovers=recovers,
                before=before,
                prefix_tokens=state.prefix_tokens or 0,
                focus=focus,
                host=answer if isinstance(answer, HostSection) else None,
            )
            report = await self._adopt(session_id, state, result)
        await run_after_rebuild(self._after, context, report, limit=limit)
        return report

    async def recover(
        self, session_id: str, state: LiveSession, agent: str, *, trigger: Trigger
    ) -> RebuildReport:
        """Make room for ``agent``: rebuild the main agent, compact a sub-agent (R3.1)."""
        if agent == MAIN_AGENT:
            return await self.rebuild(session_id, state, trigger=trigger)
        return await self.compact_agent(session_id, state, agent)

    async def overflow(
        self, session_id: str, state: LiveSession, agent: str, *, sent: SentOn
    ) -> OverflowAnswer:
        """Answer a provider overflow of a request of ``agent`` built on ``sent``.

        * A boundary newer than the last usage exists (R1.4): when the request was
          built before it (another task or worker rebuilt meanwhile: a late caller
          of one usage), retry on it without rebuilding again. When it was built on
          it (or this process does not know), the rebuilt request itself
          overflowed: running the rebuild again would only be refused, so it is not
          run; the request is retried once per usage and boundary (the model may
          answer and report fresh usage, R1.4), then the answer is "give up".
        * Otherwise rebuild (concurrent callers of this process queue on the
          session's lock meanwhile, then find the usage recovered: they retry).
        """
        window = await self._windows.refresh(session_id, state, agent)
        current = window.boundary.id if window.boundary is not None else None
        if window.recovered:
            if sent.known and sent.boundary_id != current:
                return OverflowAnswer(retry=True)
            key = (window.usage_key, current)
            if key not in state.overflow_retried:
                state.overflow_retried.add(key)
                return OverflowAnswer(retry=True)
            return OverflowAnswer(
                retry=False,
                reason="the provider still reports a context overflow after a rebuild for "
                "the same usage; not retrying again",
            )
        report = await self.recover(session_id, state, agent, trigger="overflow")
        if report.boundary_id is None and report.outcome != "already-recovered":
            return OverflowAnswer(
                retry=False,
                reason=f"context overflow and the rebuild could not run (outcome {report.outcome})",
                report=report,
            )
        # This rebuild is the usage's one retry: an overflow of the rebuilt request
        # is refused (SPEC R1.4, no loop).
        rebuilt = state.windows[agent]
        boundary = rebuilt.boundary.id if rebuilt.boundary is not None else None
        state.overflow_retried.add((rebuilt.usage_key, boundary))
        return OverflowAnswer(retry=True, report=report)

    async def compact_agent(self, session_id: str, state: LiveSession, agent: str) -> RebuildReport:
        """Insert a plain compaction into a sub-agent's history (only the main agent is rebuilt)."""
        with self._tracer.span(SPAN_REBUILD, span_start(session_id, agent, "usage")) as span:
            window = state.windows[agent]
            before = (await self._windows.view(session_id, state, window)).tokens
            result = await self._compact(
                session_id,
                state,
                agent=agent,
                usage_key=window.usage_key,
                outcome="compacted",
                trigger="usage",
                before=before,
                prefix_tokens=state.prefix_tokens or 0,
            )
            report = await self._adopt(session_id, state, result)
            span.set_attributes(report_attributes(report))
        return report

    async def _adopt(self, session_id: str, state: LiveSession, result: _Result) -> RebuildReport:
        """Bring the live window past a committed boundary without re-reading the tail."""
        committed = result.committed
        if committed is None:
            return result.report
        boundary = committed.boundary
        if boundary.agent == MAIN_AGENT:
            self._coordinator.thresholds_cleared(session_id)
            if committed.listed is not None and MAIN_AGENT in state.windows:
                watermark, listed = committed.listed
                self._windows.adopt(state, boundary, watermark, listed, committed.compacted)
        await self._windows.refresh(session_id, state, boundary.agent)
        return result.report

    async def _rebuild(
        self,
        session_id: str,
        state: LiveSession,
        *,
        trigger: Trigger,
        usage_key: str,
        recovers: Message | None,
        before: int,
        prefix_tokens: int,
        focus: str | None = None,
        host: HostSection | None = None,
    ) -> _Result:
        """Wait, render, insert and commit; fall back where A3 says so.

        ``usage_key`` is the usage it recovers (once per usage, R1.4), ``recovers``
        the assistant message that reported it (``None`` for a manual rebuild),
        ``before`` the request's estimated tokens now; ``focus`` and ``host`` go
        into the body (and ``focus`` to the writer a rebuild with one starts).
        """
        manual = trigger == "manual"
        session = await self._session(session_id)
        await self._events.emit(UsagePending(session_id=session_id, time=now_ms()))
        # A3: the plain compaction these outcomes fall back to.
        fallback = functools.partial(
            self._compact,
            session_id,
            state,
            agent=MAIN_AGENT,
            usage_key=usage_key,
            trigger=trigger,
            before=before,
            prefix_tokens=prefix_tokens,
        )
        if not self._config.checkpoint_enabled:
            return await fallback(outcome="checkpoint-off")
        store, coordinator = self._store, self._coordinator
        checkpoint_path = self._layout.checkpoint_path(session_id)
        watermark_id = await store.get_watermark(session_id)
        if watermark_id is None or not await anyio.Path(checkpoint_path).exists():
            # The ensure-checkpoint path (A3). A writer already in flight (a usage
            # threshold started it, here or on another worker) is waited for as R3.2
            # says for a session without a watermark; otherwise the rebuild starts
            # one and waits the ensure bound of A3 (automatic or manual).
            writer = self._config.writer
            await self._events.emit(
                StatusChanged(session_id=session_id, time=now_ms(), status="Writing checkpoint…")
            )
            if await coordinator.busy(session_id):
                await self._wait_for_writer(session_id, writer.wait_without_watermark)
            else:
                timeout = writer.ensure_wait_manual if manual else writer.ensure_wait_auto
                started = await coordinator.request(
                    session_id, reason=f"ensure ({trigger})", focus=focus
                )
                if started != "skipped" or await coordinator.busy(session_id):
                    await coordinator.wait(session_id, timeout)
            watermark_id = await store.get_watermark(session_id)
            if watermark_id is None or not await anyio.Path(checkpoint_path).exists():
                return await fallback(outcome="writer-failed")
        else:
            latest = await store.latest_boundary(session_id)
            if recovers is not None and latest is not None and written_after(latest, recovers):
                # Another task or worker recovered this usage since the window was
                # read (R1.4, by the store's write order). Its boundary covers the
                # watermark, which must not read as a stale checkpoint: starting a
                # writer would only make this caller wait for it before the commit
                # answers the same.
                return _Result(RebuildReport(outcome="already-recovered", trigger=trigger))
            requested = True
            if focus:
                # The model writer gets the focus: a checkpoint written with it in view.
                await coordinator.request(session_id, reason=f"focus ({trigger})", focus=focus)
            elif (
                not coordinator.in_flight(session_id)
                and latest is not None
                and latest.covered_up_to == watermark_id
            ):
                # Beyond the original: the checkpoint has not moved since the last
                # rebuild (no threshold fired: small windows have none below 25000
                # tokens), so reusing it would let the live tail grow rebuild after
                # rebuild. Start a writer; the wait below bounds it as R3.2 does.
                await coordinator.request(session_id, reason=f"stale checkpoint ({trigger})")
            elif (
                not coordinator.in_flight(session_id)
                and isinstance(coordinator.writer, OfflineCheckpointWriter)
                and await offline_checkpoint_on_disk(self._layout, session_id)
            ):
                # Beyond the original: the offline writer's checkpoint (its state file
                # beside it) is extended in milliseconds with only what is new, so it
                # is brought up to the watermark of now first: what it says (the next
                # action, the files, the errors and their fixes) is then current, and
                # only the natural tail is left to the activity list. A checkpoint
                # another writer wrote is used as it is on disk, as in the original.
                await coordinator.request(session_id, reason=f"fresh checkpoint ({trigger})")
            else:
                requested = False
            if await coordinator.busy(session_id):
                await self._wait_for_writer(session_id, self._config.writer.wait_with_watermark)
                requested = True
            if requested:
                # A writer ran (or may have, and finished already): its watermark.
                watermark_id = await store.get_watermark(session_id) or watermark_id

        return await self._insert(
            session,
            state,
            watermark_id,
            usage_key=usage_key,
            trigger=trigger,
            before=before,
            prefix_tokens=prefix_tokens,
            focus=focus,
            host=host,
        )

    async def _compact(
        self,
        session_id: str,
        state: LiveSession,
        *,
        agent: str,
        usage_key: str,
        outcome: RebuildOutcome,
        trigger: Trigger,
        before: int,
        prefix_tokens: int,
    ) -> _Result:
        """Insert a plain compaction (SPEC R1.4a): sub-agents, and the fallback of A3.

        The summary is the offline writer's over the history up to a freshly
        computed watermark, in the room the live messages after it leave under the
        trigger line (:func:`~mimo_ctx.checkpoint._summary.compaction_summary`);
        nothing is inserted when no watermark can be found.
        """
        session = await self._session(session_id)
        store = self._store
        history = await store.list_messages(session_id, agent=agent)
        history = [m for m in history if not m.is_boundary]
        boundary_id = compute_boundary(history, self._config)
        if boundary_id is None:
            return _Result(RebuildReport(outcome=outcome, trigger=trigger, tokens_before=before))
        boundary_id = adjust_boundary_for_api_invariants(history, boundary_id)
        watermark = next(m for m in history if m.id == boundary_id)
        covered = [m for m in history if m.id <= boundary_id]
        live = [m for m in history if m.id > boundary_id]
        fixed = (
            prefix_tokens
            + sum(estimate_message_tokens(m) for m in apply_send_rules(live))
            + self._reminder_tokens(session_id, state)
        )
        summary = await compaction_summary(
            session,
            covered,
            watermark=boundary_id,
            tasks=await store.list_tasks(session_id),
            layout=self._layout,
            push_caps=self._config.push_caps,
            room=self._usable - fixed - SUMMARY_MARGIN,
        )
        message = build_compaction_message(
            watermark=watermark,
            summary=summary,
            auto=True,
            newer_than=max((m.id for m in history), default=None),
        )
        after = fixed + estimate_message_tokens(message)
        report = RebuildReport(
            outcome=outcome,
            trigger=trigger,
            boundary_id=message.id,
            watermark=boundary_id,
            tokens_before=before,
            tokens_after=after,
            fallback="compaction",
            over_line=after > self._usable,
        )
        return await self._commit(
            session, usage_key=usage_key, committed=_Committed(message, []), report=report
        )

    async def _wait_for_writer(self, session_id: str, timeout: float) -> None:  # noqa: ASYNC109
        """R3.2: wait for the in-flight writer; on timeout or failure use what is on disk."""
        await self._events.emit(
            WaitingForWriter(session_id=session_id, time=now_ms(), timeout=timeout)
        )
        await self._coordinator.wait(session_id, timeout)

    def _reminder_tokens(self, session_id: str, state: LiveSession) -> int:
        """What the per-turn reminder (R8.3) adds to every request after the insert.

        Counted whether or not the session has memory files yet (a safe upper
        bound): after a rebuild ``checkpoint.md`` is one, so it is always sent. The
        part is the one the views append (kept in ``state``), not made again.
        """
        return self._windows.reminder_part(session_id, state)[1]

    async def _insert(
        self,
        session: Session,
        state: LiveSession,
        watermark_id: str,
        *,
        usage_key: str,
        trigger: Trigger,
        before: int,
        prefix_tokens: int,
        focus: str | None = None,
        host: HostSection | None = None,
    ) -> _Result:
        session_id = session.id
        store, layout, config = self._store, self._layout, self._config
        read = await self._read(session_id, state, watermark_id)
        if read is None:
            return _Result(
                RebuildReport(outcome="insert-failed", trigger=trigger, tokens_before=before)
            )
        watermark, since_watermark, reads, live_users = read
        tail = [
            m
            for m in since_watermark
            if m.agent == MAIN_AGENT and m.id > watermark.id and not m.is_boundary
        ]
        now = now_ms()
        # Listed once: the boundary's actors part and the body's ledger show the same.
        actors = reads.actors
        actors_text = render_active_actors_part(actors, session_id=session_id, now_ms=now)

        # Beyond the original: a rebuild in the middle of a tool loop keeps the last
        # tool round (the call and its results) live and uncleared, so the model can
        # "respond to the tool results below" (R5.8) instead of re-running the call.
        # Not a manual /rebuild: it happens when idle, so the whole tail is folded
        # (R7.4), the last round included.
        live_round = [] if trigger == "manual" else open_tool_round(tail)
        if sum(estimate_message_tokens(m) for m in live_round) > self._usable * OPEN_ROUND_SHARE:
            # A round this large is what overflowed: fold and clear it like the rest.
            live_round = []
        digested = tail[: len(tail) - len(live_round)]
        kept = {m.id for m in live_round}

        # Every agent's messages created after the watermark's millisecond.
        everything = [m for m in since_watermark if m.time_created > watermark.time_created]
        compacted = micro_compact(
            everything,
            after_time=watermark.time_created,
            tools=config.micro_compact_tools,
            now_ms=now,
            skip_ids=kept,
            exclude=config.micro_compact_exclude,
            keep=config.micro_compact_keep,
            placeholder=config.micro_compact_placeholder,
        )
        compacted_by_id = {m.id: m for m in compacted}
        # What stays live after the insert: user messages of the tail (collapse
        # keeps them) with compacted results as placeholders, and the open round.
        live_tail = [compacted_by_id.get(m.id, m) for m in tail if m.role == "user" or m.id in kept]
        live_tokens = sum(estimate_message_tokens(m) for m in apply_send_rules(live_tail))
        # Everything but the boundary: prefix, live tail, per-turn reminder.
        base = prefix_tokens + live_tokens + self._reminder_tokens(session_id, state)
        sources = await gather_sources(
            store=store,
            layout=layout,
            session=session,
            tail=digested,
            reminder_tail=tail,
            config=config,
            counter=self._counter,
            memory_index=self._memory_index,
            focus=focus,
            host=host,
            actors=actors,
            live_users=live_users,
            reads=reads,
        )
        # The index part needs only the Topic line, from the head of the checkpoint
        # the body read (inside the memory root); an unreadable file shows as "no
        # checkpoints yet".
        checkpoint = sources.checkpoint
        index_text = render_checkpoint_index(
            directory=str(layout.session_dir(session_id)),
            checkpoint_text=checkpoint.text[:_INDEX_HEAD_CHARS]
            if checkpoint.problem is None
            else None,
        )

        def boundary_with(rendered: RenderedBody) -> Message:
            digest_up_to = digest_seq = None
            if rendered.has_activity and digested:
                digest_up_to = max(m.id for m in digested)
                # What was listed, by write order: a message written after this
                # listing may have an older id, and must not be taken as digested
                # (R7.3 amended).
                seqs = [m.insert_seq for m in digested]
                digest_seq = None if None in seqs else max(s for s in seqs if s is not None)
            return build_boundary_message(
                watermark=watermark,
                digest_up_to=digest_up_to,
                digest_seq=digest_seq,
                # The open round lists last, but its id (and write) can come before a
                # digested message's: named, so it is never taken as digested.
                kept_live=sorted(
                    m.id for m in live_round if digest_up_to is not None and m.id <= digest_up_to
                ),
                directory=str(layout.session_dir(session_id)),
                number=session.state.rebuilds + 1,
                index_text=index_text,
                body=rendered.text,
                actors_text=actors_text,
                newer_than=max((m.id for m in everything), default=None),
            )

        # R5.9 beyond: the rebuilt request must fit under the trigger line, so the
        # body gets at most what is left (and at most the configured total cap).
        # The room is what the boundary message adds with an empty body; the body's
        # own JSON escaping (line breaks, quotes) is known only once it is rendered,
        # so an overshoot shrinks the room by as much and the body is assembled again.
        empty = boundary_with(RenderedBody(text="", has_activity=False))
        room = self._usable - base - estimate_message_tokens(empty)
        for attempt in range(_FIT_ATTEMPTS):
            max_body = max(0, room if config.total_cap is None else min(room, config.total_cap))
            rendered = assemble_body(
                sources, config=config, max_tokens=max_body, counter=self._counter
            )
            if not rendered.text:
                return _Result(
                    RebuildReport(
                        outcome="insert-failed",
                        trigger=trigger,
                        watermark=watermark.id,
                        tokens_before=before,
                        sections=rendered,
                    )
                )
            boundary = boundary_with(rendered)
            after = base + estimate_boundary_tokens(boundary)
            if after <= self._usable or max_body == 0 or attempt == _FIT_ATTEMPTS - 1:
                break
            room -= after - self._usable
        else:  # pragma: no cover - the last attempt always breaks
            raise AssertionError("unreachable")
        report = RebuildReport(
            outcome="rebuilt",
            trigger=trigger,
            boundary_id=boundary.id,
            watermark=watermark.id,
            tokens_before=before,
            tokens_after=after,
            compacted_results=count_compacted(compacted, now),
            sections=rendered,
            over_line=after > self._usable,
        )
        return await self._commit(
            session,
            usage_key=usage_key,
            committed=_Committed(boundary, compacted, (watermark, since_watermark)),
            report=report,
        )

    async def _read(
        self, session_id: str, state: LiveSession, watermark_id: str
    ) -> tuple[Message, list[Message], RebuildReads, LiveUsers | None] | None:
        """The watermark, every agent's messages from it on (the tail, what
        micro-compaction sees), the body's store reads in one call
        (:mod:`mimo_ctx.store._reads`) and the live user messages; ``None`` without
        a watermark message.

        The main agent's messages (the watermark too) come from the live window when
        it reaches back to the watermark, so only the sub-agents' are listed.
        """
        window = state.windows.get(MAIN_AGENT)
        watermark = None
        if window is not None and window.loaded:
            # Bring the window up to date: the rebuild must see what the store holds.
            window = await self._windows.refresh(session_id, state, MAIN_AGENT)
            watermark = next((m for m in reversed(window.messages) if m.id == watermark_id), None)
        if watermark is None:
            watermark = await self._store.get_message(watermark_id)
            if watermark is None:
                return None
        since = message_key(watermark)
        covers = (
            window is not None and window.loaded and (window.start is None or window.start <= since)
        )
        live_users = held_users(window)
        request = RebuildReadRequest(
            session_id,
            since,
            exclude_agent=MAIN_AGENT if covers else None,
            users=first_user_reads(live_users, self._config),
        )
        reads = await read_for_rebuild(self._store, request)
        if window is None or not covers:
            return watermark, reads.since, reads, live_users
        main = window.messages[bisect_left(window.keys, since) :]
        others = reads.since
        merged = list(heapq.merge(main, others, key=message_key)) if others else list(main)
        return watermark, merged, reads, live_users

    async def _commit(
        self, session: Session, *, usage_key: str, committed: _Committed, report: RebuildReport
    ) -> _Result:
        """One store transaction, then the loop guard's verdict and the events.

        The session's state is changed inside that transaction, from the state as
        stored then (never from ``session``, read before the long waits): another
        worker's rebuild or threshold mark in between is kept, and the loop guard
        judges the rebuilds that really happened.
        """
        boundary = committed.boundary
        config = self._config
        main = boundary.agent == MAIN_AGENT
        freed = 0.0
        if report.tokens_before and report.tokens_after is not None:
            freed = max(0.0, 1 - report.tokens_after / report.tokens_before)
        manual = report.trigger == "manual"
        changes: list[tuple[StoredState, StoredState]] = []

        def change(stored: StoredState) -> StoredState:
            new = stored.after_rebuild(freed, manual=manual, min_freed=config.min_freed_fraction)
            changes.append((stored, new))
            return new

        # The loop guard and the threshold reset concern the main agent only; a
        # sub-agent's plain compaction leaves the session's state alone.
        stored = await self._store.commit_rebuild(
            session.id,
            usage_key=usage_key,
            boundary=boundary,
            updated=committed.compacted,
            state=change if main else None,
        )
        if not stored:
            return _Result(RebuildReport(outcome="already-recovered", trigger=report.trigger))
        await self._events.emit(rebuilt_event(session.id, report, boundary.id))
        # The state this commit changed: did it turn the loop guard on?
        disabled_now = bool(changes) and (
            changes[-1][1].auto_rebuild_disabled and not changes[-1][0].auto_rebuild_disabled
        )
        if disabled_now:
            after = changes[-1][1]
            await self._events.emit(
                AutoRebuildDisabled(
                    session_id=session.id,
                    time=now_ms(),
                    freed_fractions=tuple(after.freed_fractions[-2:]),
                    reason=(
                        "two consecutive rebuilds each freed less than "
                        f"{config.min_freed_fraction:.0%} of the request; "
                        "the live tail alone is too large to fit"
                    ),
                )
            )
        return _Result(report, committed)


_INDEX_HEAD_CHARS: Final = 16_384
"""The checkpoint index part looks for the ``Topic:`` line in this much of the file."""

_FIT_ATTEMPTS: Final = 3
"""Times the body is assembled to fit under the trigger line (its JSON escaping varies)."""
