"""The writer coordinator: checkpoint writers in the background (SPEC R2.1, R3, A3).

Private to the middleware and its steps.
The coordinator runs at most one writer per session, plus a one-slot pending
queue: a newer request evicts an older pending one. A request answers
``started``, ``queued`` or ``skipped``. The watermark is computed when a writer
*starts* (``compute_boundary`` then ``adjust_boundary_for_api_invariants``, on
the newest messages: see ``_next_watermark``), the writer sees what the model
sees up to and including it (SPEC A3 as amended: the messages after the later of
the previous watermark and the newest boundary's, uncollapsed, plus the previous
checkpoint), and the watermark is persisted only when the writer succeeded and
``checkpoint.md`` was written atomically. A run thus costs O(new messages).

Waiting (R3.2, R3.3) is a bounded wait on an ``anyio.Event``: cancelling a waiter
cancels only the waiter; the writer goes on, holds no lock the waiter needs, and
a writer that fails is reported like a timeout (the caller uses what is on disk).

**Several workers**. With a :class:`WriterLease` the "one writer per
session" rule holds across processes and machines that share a store:

* A writer starts only once its worker holds the session's lease (a unique
  owner per run); the watermark is computed *after* taking it, so it can never
  be older than the one the previous holder persisted. When another worker
  holds the lease the request answers ``skipped`` and no threshold is marked, so
  it fires again later (A3).
* While the writer runs, the lease is renewed every ``lease_ttl / 3`` seconds.
  A renewal that answers "not yours" (the lease lapsed and another worker took
  it) cancels the writer. Before the spill-over files and before
  ``checkpoint.md`` are renamed into place the lease is renewed once more, and
  the watermark is written with :meth:`WriterLease.set_watermark_if_held`: a
  writer that lost its lease persists nothing more.
* The lease is released (shielded from cancellation) when the run ends. A
  worker that crashes never releases it: it lapses ``lease_ttl`` seconds after
  the last renewal, well inside the 180 s / 300 s ensure-checkpoint waits.
* :meth:`WriterCoordinator.wait` also waits for a writer running on another
  worker; if that run ends without moving the watermark (its writer failed, or
  its worker died and the lease lapsed), the waiting worker takes over and runs
  the writer itself, within the same bound. :meth:`WriterCoordinator.busy` says
  whether a writer runs anywhere.

Without a lease, everything stays in-process, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import anyio
from anyio.abc import TaskGroup

from mimo_ctx._util import now_ms
from mimo_ctx.boundary import watermark_of
from mimo_ctx.checkpoint._files import empty_folded_notes, read_previous_checkpoint
from mimo_ctx.checkpoint._page import KeptPages
from mimo_ctx.checkpoint.document import check_draft, section_budgets
from mimo_ctx.checkpoint.lease import WriterLease
from mimo_ctx.checkpoint.protocol import (
    CheckpointDraft,
    CheckpointWriter,
    SentRequest,
    WriterMeter,
    WriterRequest,
)
from mimo_ctx.config import RebuildConfig
from mimo_ctx.errors import CheckpointRejectedError, MimoCtxError
from mimo_ctx.events import EventBus, WriterFailed, WriterFailure, WriterFinished, WriterStarted
from mimo_ctx.memory import MemoryLayout, read_text, write_text_atomic
from mimo_ctx.messages import MAIN_AGENT, Message, message_key
from mimo_ctx.store.base import Store
from mimo_ctx.tokens import estimate_text_tokens
from mimo_ctx.tracing import NO_TRACER, SPAN_WRITER, Tracer
from mimo_ctx.triggers import ModelLimits, due_thresholds

__all__ = [
    "WATERMARK_MARGIN",
    "WATERMARK_PAGE",
    "WRITER_MAX_CHARS",
    "StartResult",
    "WaitResult",
    "WriterCoordinator",
]

_log = logging.getLogger("mimo_ctx")

StartResult = Literal["started", "queued", "skipped"]
WaitResult = Literal["idle", "finished", "failed", "timeout"]

WATERMARK_PAGE = 128
"""Newest main-agent messages the watermark is first computed on (see ``_next_watermark``)."""

WATERMARK_MARGIN = 16
"""A watermark closer than this to the start of the messages read is computed on more."""

WRITER_MAX_CHARS = 8_000_000
"""The writer reads at most this many characters of ``checkpoint.md`` and ``notes.md``."""


class _LeaseLost(MimoCtxError):
    """Internal: this worker no longer holds the session's writer lease; persist nothing."""


_Claim = tuple[str, str | None]
"""(watermark, lease owner) of a writer run about to start."""

_RELEASE_TIMEOUT = 10.0


@dataclass(slots=True)
class _Job:
    reason: str
    focus: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    result: WaitResult = "failed"
    writer: str | None = None
    owner: str | None = None


@dataclass(slots=True)
class _Slot:
    running: _Job | None = None
    pending: _Job | None = None
    # Writer thresholds this process saw marked (a stale copy only costs one
    # extra check against the store).
    crossed: frozenset[int] = frozenset()


class WriterCoordinator:
    """Runs checkpoint writers in the background, one per session.

    Args:
        store: Where the history and the watermark live.
        layout: Where ``checkpoint.md`` and the other memory files live.
        config: Budgets, the watermark constants and ``writer.lease_ttl``.
        writer: The primary writer.
        events: Where writer events go.
        fallback: Used when the primary writer fails, so a rebuild still has a
            fresh checkpoint (the event names which writer produced it).
        lease: Keeps "one writer per session" across workers sharing the store
            (see the module docstring); ``None`` keeps it in this process only.
        thresholds: The usage thresholds of :meth:`at_usage` (SPEC A3), ascending.
        tracer: Opens a ``mimo_ctx.writer`` span around every writer run.
        limits: The session model's window, handed to writers (a model writer on
            the same model uses it).
        last_request: The request a session's main agent last sent in this
            process, if any (a forked model writer resends it).
    """

    def __init__(
        self,
        store: Store,
        layout: MemoryLayout,
        config: RebuildConfig,
        writer: CheckpointWriter,
        events: EventBus,
        *,
        fallback: CheckpointWriter | None = None,
        lease: WriterLease | None = None,
        thresholds: Sequence[int] = (),
        tracer: Tracer = NO_TRACER,
        limits: ModelLimits | None = None,
        last_request: Callable[[str], SentRequest | None] | None = None,
    ) -> None:
        self._tracer = tracer
        self._store = store
        self._limits = limits
        self._last_request = last_request
        self._thresholds = tuple(thresholds)
        self._layout = layout
        self._config = config
        self._writer = writer
        self._fallback = fallback
        self._events = events
        self._lease = lease
        self._ttl = config.writer.lease_ttl
        # Unique per process; each run adds a UUID, so no two runs share an owner.
        self._worker = f"{socket.gethostname()}:{os.getpid()}"
        self._slots: dict[str, _Slot] = {}
        # Each session's newest main-agent messages as the last run read them
        # (mimo_ctx.checkpoint._page): the next run reads only what changed since.
        self._pages = KeptPages(store)
        self._task_group: TaskGroup | None = None

    @property
    def writer(self) -> CheckpointWriter:
        """The primary writer."""
        return self._writer

    @property
    def lease(self) -> WriterLease | None:
        """The cross-worker writer lease, if one is configured."""
        return self._lease

    def attach(self, task_group: TaskGroup | None) -> None:
        """Give the coordinator the task group its writers run in (``None`` detaches)."""
        self._task_group = task_group

    def in_flight(self, session_id: str) -> bool:
        """True while a writer of *this* coordinator runs for the session.

        A writer on another worker is not seen here; :meth:`busy` sees both.
        """
        slot = self._slots.get(session_id)
        return slot is not None and slot.running is not None

    async def busy(self, session_id: str) -> bool:
        """True while a writer runs for the session here or, with a lease, on any worker."""
        if self.in_flight(session_id):
            return True
        if self._lease is None:
            return False
        return await self._lease.holder(session_id) is not None

    async def request(
        self, session_id: str, *, reason: str, focus: str | None = None
    ) -> StartResult:
        """Ask for a checkpoint of the session's history as it is now.

        ``focus`` (a manual rebuild's) is handed to the writer
        (:attr:`~mimo_ctx.checkpoint.protocol.WriterRequest.focus`).

        Returns:
            ``started`` when a writer started, ``queued`` when one runs already here
            (this request takes the pending slot, evicting an older pending one),
            and ``skipped`` when there is nothing new to cover or another worker
            holds the session's writer lease.
        """
        started = await self._start(session_id, reason=reason, focus=focus)
        return "skipped" if started in ("nothing", "busy") else started

    async def _start(
        self, session_id: str, *, reason: str, focus: str | None = None
    ) -> Literal["started", "queued", "nothing", "busy"]:
        """:meth:`request`, telling "nothing new to cover" from "another worker writes"."""
        if self._task_group is None:
            raise MimoCtxError(
                "the checkpoint writer needs a running middleware: "
                "use `async with ContextMiddleware(...) as middleware:`"
            )
        slot = self._slots.setdefault(session_id, _Slot())
        if slot.running is not None:
            return self._queue(slot, reason, focus)
        claim = await self._claim(session_id)
        if slot.running is not None:
            # Another task of this process started a writer while we looked: queue
            # behind it (the lease, if we got it, goes back).
            if not isinstance(claim, str) and claim[1] is not None:
                await self._release(session_id, claim[1])
            return self._queue(slot, reason, focus)
        if isinstance(claim, str):
            return claim
        job = _Job(reason, focus)
        slot.running = job
        self._task_group.start_soon(self._run, session_id, job, claim)
        return "started"

    async def at_usage(self, session_id: str, usage: int) -> None:
        """Start a writer when ``usage`` crossed thresholds not marked yet (SPEC A3).

        The due thresholds are marked in the session's state once a writer started
        or queued, and also when the writer had nothing new to cover (the
        watermark cannot move yet): re-checking such a threshold would read the
        history again on every turn until it can. While a writer runs here, or
        another worker holds the lease, none is marked, so they fire again later.
        """
        slot = self._slots.setdefault(session_id, _Slot())
        if not due_thresholds(usage, self._thresholds, slot.crossed) or self.in_flight(session_id):
            # While a writer runs here nothing starts or is marked: reading the
            # session would cost a store round trip on every turn of its run.
            return
        session = await self._store.get_session(session_id)
        if session is None:
            return
        slot.crossed = frozenset(session.state.crossed_thresholds)
        due = due_thresholds(usage, self._thresholds, slot.crossed)
        if not due or self.in_flight(session_id):
            return
        if await self._start(session_id, reason=f"usage {usage} >= {due[-1]}") == "busy":
            return
        # Marked in the state as stored now, not in the copy read above: a rebuild
        # or another worker's mark since then is kept (no lost update).
        marked = await self._store.update_session_state(
            session_id,
            lambda stored: stored.model_copy(
                update={"crossed_thresholds": sorted({*stored.crossed_thresholds, *due})}
            ),
        )
        slot.crossed = frozenset(marked.crossed_thresholds)

    def thresholds_cleared(self, session_id: str) -> None:
        """A rebuild cleared the session's marked thresholds: they may fire again."""
        slot = self._slots.get(session_id)
        if slot is not None:
            slot.crossed = frozenset()

    async def wait(self, session_id: str, within: float) -> WaitResult:
        """Wait for the session's running writer, at most ``within`` seconds.

        Returns ``idle`` when none runs (here or, with a lease, on another worker).
        With a lease, a run on another worker that ends without moving the
        watermark is taken over here (see the module docstring). Cancelling the
        caller cancels only the wait.
        """
        slot = self._slots.get(session_id)
        job = slot.running if slot is not None else None
        if job is not None:
            with anyio.move_on_after(within):
                await job.done.wait()
                return job.result
            return "timeout"
        if self._lease is None:
            return "idle"
        with anyio.move_on_after(within):
            return await self._wait_elsewhere(session_id, self._lease, within)
        return "timeout"

    # -- internals ----------------------------------------------------------------
    @staticmethod
    def _queue(slot: _Slot, reason: str, focus: str | None) -> Literal["queued"]:
        if slot.pending is not None:
            # The evicted request's waiters are released: the newer one covers more
            # (and keeps the older one's focus when it has none of its own).
            focus = focus or slot.pending.focus
            slot.pending.result = "failed"
            slot.pending.done.set()
        slot.pending = _Job(reason, focus)
        return "queued"

    async def _claim(self, session_id: str) -> _Claim | Literal["nothing", "busy"]:
        """Take the lease (if any), then fix the watermark of a new run.

        ``nothing`` when there is nothing new to cover; ``busy`` when another
        worker holds the lease.
        """
        lease = self._lease
        if lease is None:
            watermark = await self._next_watermark(session_id)
            return "nothing" if watermark is None else (watermark, None)
        owner = f"{self._worker}:{uuid.uuid4().hex}"
        # Shielded: a lease taken by a call whose caller was cancelled would block
        # every worker until it lapses.
        acquired = False
        with anyio.CancelScope(shield=True):
            acquired = await lease.acquire(session_id, owner, self._ttl)
        if not acquired:
            return "busy"
        try:
            # Computed under the lease: the stored watermark cannot move meanwhile,
            # so this run never persists one older than the previous holder's.
            watermark = await self._next_watermark(session_id)
        except BaseException:
            await self._release(session_id, owner)
            raise
        if watermark is None:
            await self._release(session_id, owner)
            return "nothing"
        return watermark, owner

    async def _release(self, session_id: str, owner: str) -> None:
        """Release the lease, shielded; a failure only leaves it to lapse."""
        lease = self._lease
        if lease is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(_RELEASE_TIMEOUT):
            try:
                await lease.release(session_id, owner)
            except Exception as exc:
                _log.warning(
                    "mimo_ctx could not release the writer lease of session %s (it lapses "
                    "in %s s): %r",
                    session_id,
                    self._ttl,
                    exc,
                )

    async def _wait_elsewhere(
        self, session_id: str, lease: WriterLease, within: float
    ) -> WaitResult:
        deadline = anyio.current_time() + within
        before = await self._store.get_watermark(session_id)
        holder = await lease.holder(session_id)
        if holder is None:
            return "idle"
        took_over = False
        while True:
            left = max(0.0, deadline - anyio.current_time())
            if not await lease.wait_released(session_id, left, generation=holder.generation):
                return "timeout"
            if await self._store.get_watermark(session_id) != before:
                return "finished"
            # The run ended without a checkpoint: its writer failed, or its worker
            # died and the lease lapsed.
            successor = await lease.holder(session_id)
            if successor is None and not took_over and self._task_group is not None:
                took_over = True
                await self.request(session_id, reason="take over an abandoned writer run")
                slot = self._slots.get(session_id)
                job = slot.running if slot is not None else None
                if job is not None:
                    await job.done.wait()
                    return job.result
                successor = await lease.holder(session_id)
            if successor is None:
                return "failed"
            holder = successor  # another worker runs the writer now: wait for it

    async def _next_watermark(self, session_id: str) -> str | None:
        # The watermark lies in the tail: at most about tail.max_tokens before the
        # last finished answer (R2.5), so it is computed on the newest messages, a
        # page that grows (x4) only while the whole history could decide otherwise
        # (see _watermark_of): a writer run never reads the history to place it.
        # The page is kept from run to run and brought up to date from the change
        # feed (mimo_ctx.checkpoint._page): a run parses only what was written since.
        size = WATERMARK_PAGE
        while True:
            page = await self._pages.newest(session_id, size)
            found = watermark_of(page.messages, self._config, margin=WATERMARK_MARGIN)
            if page.start is None or found is None or found[1]:
                break
            size = page.size * 4
        if found is None:
            return None
        boundary = found[0]
        current = await self._store.get_watermark(session_id)
        if current is not None and boundary <= current:
            return None
        return boundary

    async def _run(self, session_id: str, job: _Job, claim: _Claim | None) -> None:
        try:
            if claim is None:  # a pending request's turn: claim it now
                got = await self._claim(session_id)
                if isinstance(got, str):
                    # Nothing new: what ran before covers it. Busy: another worker writes.
                    job.result = "finished" if got == "nothing" else "failed"
                    return
                claim = got
            watermark, job.owner = claim
            if job.owner is None:
                job.result, job.writer = await self._write(session_id, job, watermark, None)
            else:
                job.result, job.writer = await self._write_leased(
                    session_id, job, watermark, job.owner
                )
        except _LeaseLost as exc:
            _log.warning("mimo_ctx checkpoint writer stopped for session %s: %s", session_id, exc)
            job.result = "failed"
            await self._events.emit(
                WriterFailed(
                    session_id=session_id, time=now_ms(), writer="coordinator", error=str(exc)
                )
            )
        except anyio.get_cancelled_exc_class():
            if self._task_group is None or self._task_group.cancel_scope.cancel_called:
                raise  # the middleware is shutting down: a real cancellation
            # A cancellation nobody requested, raised inside the writer's own code
            # (say, by an inner task of its model client): a writer failure, never
            # a cancellation of the middleware's task group and so of the host.
            _log.warning("mimo_ctx checkpoint writer of session %s was cancelled", session_id)
            job.result = "failed"
            await self._events.emit(
                WriterFailed(
                    session_id=session_id,
                    time=now_ms(),
                    writer="coordinator",
                    error="the writer was cancelled by its own code",
                )
            )
        except Exception as exc:  # the writer's failure must never take the host down
            _log.exception("mimo_ctx checkpoint writer crashed for session %s", session_id)
            job.result = "failed"
            await self._events.emit(
                WriterFailed(
                    session_id=session_id, time=now_ms(), writer="coordinator", error=repr(exc)
                )
            )
        finally:
            if job.owner is not None:
                await self._release(session_id, job.owner)
            job.done.set()
            slot = self._slots[session_id]
            pending, slot.pending = slot.pending, None
            if pending is not None and self._task_group is not None:
                # Handed over at once: a request arriving meanwhile queues behind it.
                slot.running = pending
                self._task_group.start_soon(self._run, session_id, pending, None)
            else:
                slot.running = None

    async def _write_leased(
        self, session_id: str, job: _Job, watermark: str, owner: str
    ) -> tuple[WaitResult, str | None]:
        """Run the writer while a sibling task keeps the lease alive."""
        lost: list[str] = []
        outcome: tuple[WaitResult, str | None] = ("failed", None)
        async with anyio.create_task_group() as group:
            group.start_soon(self._keep_lease, session_id, owner, group.cancel_scope, lost)
            outcome = await self._write(session_id, job, watermark, owner)
            group.cancel_scope.cancel()
        if lost:
            raise _LeaseLost(lost[0])
        return outcome

    async def _keep_lease(
        self, session_id: str, owner: str, scope: anyio.CancelScope, lost: list[str]
    ) -> None:
        lease = self._lease
        assert lease is not None
        interval = self._ttl / 3
        last_renewed = anyio.current_time()
        while True:
            await anyio.sleep(interval)
            renewed: bool | None = None
            with anyio.move_on_after(interval):
                try:
                    renewed = await lease.renew(session_id, owner, self._ttl)
                except Exception as exc:  # a database hiccup: try again next interval
                    _log.warning(
                        "mimo_ctx could not renew the writer lease of session %s: %r",
                        session_id,
                        exc,
                    )
            if renewed:
                last_renewed = anyio.current_time()
                continue
            # Not ours any more, or unconfirmed for two intervals: by the time a
            # third would come the lease may have lapsed and another worker may
            # be writing. Stop before that.
            if renewed is False or anyio.current_time() - last_renewed >= 2 * interval:
                lost.append(
                    f"the writer lease of session {session_id} was lost (it lapsed or another "
                    "worker took it over); nothing more is persisted by this run"
                )
                scope.cancel()
                return

    async def _fence(self, session_id: str, owner: str | None) -> None:
        """Renew the lease right before a file goes into place; stop if it is gone."""
        lease = self._lease
        if owner is None or lease is None:
            return
        try:
            renewed = await lease.renew(session_id, owner, self._ttl)
        except Exception as exc:
            raise _LeaseLost(
                f"the writer lease of session {session_id} could not be confirmed ({exc!r}); "
                "nothing more is persisted by this run"
            ) from exc
        if not renewed:
            raise _LeaseLost(
                f"the writer lease of session {session_id} was lost before the checkpoint was "
                "written; nothing more is persisted by this run"
            )

    async def _write(
        self, session_id: str, job: _Job, watermark: str, owner: str | None
    ) -> tuple[WaitResult, str | None]:
        session = await self._store.get_session(session_id)
        if session is None:
            raise MimoCtxError(f"unknown session {session_id!r}")
        covered = await self._covered(session_id, watermark)
        layout = self._layout
        last_request = self._last_request(session_id) if self._last_request else None
        checkpoint_path = layout.checkpoint_path(session_id)
        request = WriterRequest(
            session_id=session_id,
            project_id=session.project_id,
            watermark=watermark,
            messages=covered,
            # Bounded reads inside the memory root: a huge or symlinked-out file
            # must neither exhaust memory nor leak outside content.
            previous_checkpoint=await read_previous_checkpoint(
                checkpoint_path, layout.root, max_chars=WRITER_MAX_CHARS
            ),
            notes=await read_text(
                layout.notes_path(session_id), max_chars=WRITER_MAX_CHARS, root=layout.root
            ),
            tasks=await self._store.list_tasks(session_id),
            checkpoint_path=checkpoint_path,
            project_memory_path=layout.project_memory_path(session.project_id),
            notes_path=layout.notes_path(session_id),
            tasks_dir=layout.tasks_dir(session_id),
            budgets=section_budgets(self._config.push_caps),
            previous_state=await read_previous_checkpoint(
                layout.checkpoint_state_path(session_id), layout.root, max_chars=WRITER_MAX_CHARS
            ),
            focus=job.focus,
            previous_watermark=await self._store.get_watermark(session_id),
            last_request=last_request,
            model_limits=self._limits,
        )
        writers = [self._writer] + ([self._fallback] if self._fallback is not None else [])
        for writer in writers:
            # Each writer notes its own costs.
            request = dataclasses.replace(request, meter=WriterMeter())
            first = {
                "mimo_ctx.session_id": session_id,
                "mimo_ctx.writer": writer.name,
                "mimo_ctx.reason": job.reason,
                "mimo_ctx.watermark": watermark,
                "mimo_ctx.covered_messages": len(covered),
                "mimo_ctx.focus": bool(job.focus),
            }
            with self._tracer.span(SPAN_WRITER, first) as span:
                await self._events.emit(
                    WriterStarted(
                        session_id=session_id,
                        time=now_ms(),
                        watermark=watermark,
                        reason=job.reason,
                        writer=writer.name,
                    )
                )
                try:
                    draft = await self._run_writer(writer, request)
                    # A draft that is not a checkpoint is never written: the previous
                    # checkpoint and the watermark stay; the fallback, if any, writes.
                    check_draft(draft.text, draft.extra_files)
                    await self._persist(session_id, request, draft, owner)
                except _LeaseLost:
                    raise
                except Exception as exc:
                    # Ours (a rejected draft, the time limit) read best as they are; a
                    # writer's own failure with its type.
                    ours = isinstance(exc, CheckpointRejectedError | _RunTimedOut)
                    error = str(exc) if ours else repr(exc)
                    _log.warning("mimo_ctx %s checkpoint writer failed: %s", writer.name, error)
                    reason: WriterFailure = (
                        "timeout"
                        if isinstance(exc, _RunTimedOut)
                        else "invalid"
                        if isinstance(exc, CheckpointRejectedError)
                        else "error"
                    )
                    span.set_attributes({"mimo_ctx.outcome": "failed"})
                    span.set_failed(
                        "timeout"
                        if reason == "timeout"
                        else "rejected"
                        if reason == "invalid"
                        else type(exc).__name__
                    )
                    await self._events.emit(
                        WriterFailed(
                            session_id=session_id,
                            time=now_ms(),
                            writer=writer.name,
                            error=error,
                            reason=reason,
                            **_costs(request.meter),
                        )
                    )
                    continue
                tokens = estimate_text_tokens(draft.text)
                span.set_attributes(
                    {"mimo_ctx.outcome": "finished", "mimo_ctx.checkpoint_tokens": tokens}
                )
                await self._events.emit(
                    WriterFinished(
                        session_id=session_id,
                        time=now_ms(),
                        watermark=watermark,
                        writer=writer.name,
                        checkpoint_path=str(checkpoint_path),
                        checkpoint_tokens=tokens,
                        **_costs(request.meter),
                    )
                )
                return "finished", writer.name
        return "failed", None

    async def _run_writer(
        self, writer: CheckpointWriter, request: WriterRequest
    ) -> CheckpointDraft:
        """One writer run, cancelled past ``checkpoint.writer.run_timeout``.

        A hung writer would otherwise hold the session's writer slot (and lease)
        for good: no later writer starts, the fallback never runs and every rebuild
        waits its full bound. A run past the limit counts as failed, whatever it
        returns after the cancellation.

        Raises:
            _RunTimedOut: The run took longer than the limit.
        """
        limit = self._config.writer.run_timeout
        draft: CheckpointDraft | None = None
        with anyio.move_on_after(limit) as scope:
            draft = await writer.write(request)
        if scope.cancel_called or draft is None:
            raise _RunTimedOut(
                f"the {writer.name} checkpoint writer ran past checkpoint.writer.run_timeout "
                f"({limit:g} s) and was cancelled"
            )
        return draft

    async def _covered(self, session_id: str, watermark: str) -> list[Message]:
        """What the writer gets to read: what the model sees, up to the new watermark.

        SPEC A3 (amended): the original forks the session, so its writer reads the
        session's view -- the newest boundary and the live messages after it -- not
        the history. The messages start after the later of the previous watermark
        (the previous checkpoint covers up to it, and is handed over too) and the
        newest boundary's watermark (the boundary itself included); before any of
        them, the history. A run thus reads O(new messages), not O(history).
        """
        store = self._store
        since: tuple[int, str] | None = None
        previous = await store.get_watermark(session_id)
        starts = [previous] if previous is not None else []
        boundary = await store.latest_boundary(session_id)
        if boundary is not None and boundary.covered_up_to is not None:
            starts.append(boundary.covered_up_to)
        # The newest page (brought up to date) holds them when they are recent.
        page = await self._pages.newest(session_id, WATERMARK_PAGE)
        held = {m.id: m for m in page.messages}
        for message_id in starts:
            start = held.get(message_id) or await store.get_message(message_id)
            if start is not None and (since is None or message_key(start) > since):
                since = message_key(start)
        if page.start is None or (since is not None and page.start <= since):
            listed = page.messages  # every message after `since` is in the page
        else:
            listed = await store.list_messages(session_id, agent=MAIN_AGENT, since=since)
        # Uncollapsed (R7.4: the writer sees the whole tail), up to the watermark.
        return [
            m for m in listed if m.id <= watermark and (since is None or message_key(m) > since)
        ]

    async def _persist(
        self,
        session_id: str,
        request: WriterRequest,
        draft: CheckpointDraft,
        owner: str | None,
    ) -> None:
        directory = request.checkpoint_path.parent
        if draft.extra_files:
            await self._fence(session_id, owner)
        root = self._layout.root
        for name, content in draft.extra_files.items():
            await write_text_atomic(directory / name, content, root=root)
        if draft.state is not None:
            # Before checkpoint.md: a state newer than its checkpoint is recognised
            # (by the digest it holds) and ignored; the reverse could not be.
            path = self._layout.checkpoint_state_path(session_id)
            await write_text_atomic(path, draft.state, root=root)
        # checkpoint.md last: it is what a rebuild reads, so it must never point
        # at a spill-over file that is not on disk yet.
        await self._fence(session_id, owner)
        await write_text_atomic(request.checkpoint_path, draft.text, root=root)
        if draft.notes_folded and request.notes:
            await empty_folded_notes(request.notes_path, request.notes, root=root)
        if owner is None or self._lease is None:
            await self._store.set_watermark(session_id, request.watermark)
        elif not await self._lease.set_watermark_if_held(session_id, owner, request.watermark):
            raise _LeaseLost(
                f"the writer lease of session {session_id} was lost before the watermark was "
                "persisted; the checkpoint on disk is newer than the stored watermark"
            )


class _RunTimedOut(MimoCtxError):
    """Internal: a writer ran past ``checkpoint.writer.run_timeout`` and was cancelled."""


class _Costs(TypedDict):
    calls: int
    tokens_sent: int
    tokens_cached: int
    tokens_output: int
    forked: bool


def _costs(meter: WriterMeter) -> _Costs:
    """A writer run's model figures, as the writer events carry them."""
    return {
        "calls": meter.calls,
        "tokens_sent": meter.sent,
        "tokens_cached": meter.cached,
        "tokens_output": meter.output,
        "forked": meter.forked,
    }
