"""Checkpoint-writer protocol and coordination (SPEC R2.1, R3, A3).

The coordinator runs at most one writer per session, plus a one-slot pending
queue: a newer request evicts an older pending one. A request answers
``started``, ``queued`` or ``skipped``. The watermark is computed when a writer
*starts* (``compute_boundary`` then ``adjust_boundary_for_api_invariants``), the
writer sees the full, uncollapsed main-agent history up to and including it, and
the watermark is persisted only when the writer succeeded and ``checkpoint.md``
was written atomically.

Waiting (R3.2, R3.3) is a bounded wait on an ``anyio.Event``: cancelling a waiter
cancels only the waiter; the writer goes on, holds no lock the waiter needs, and
a writer that fails is reported like a timeout (the caller uses what is on disk).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import anyio
from anyio.abc import TaskGroup

from mimo_ctx.boundary import adjust_boundary_for_api_invariants, compute_boundary
from mimo_ctx.checkpoint_doc import section_budgets
from mimo_ctx.config import RebuildConfig
from mimo_ctx.errors import MimoCtxError
from mimo_ctx.events import EventBus, WriterFailed, WriterFinished, WriterStarted
from mimo_ctx.memory import MemoryLayout, read_text, write_text_atomic
from mimo_ctx.messages import MAIN_AGENT, Message
from mimo_ctx.store.base import Store, Task
from mimo_ctx.tokens import estimate_text_tokens

__all__ = [
    "CheckpointDraft",
    "CheckpointWriter",
    "StartResult",
    "WaitResult",
    "WriterCoordinator",
    "WriterRequest",
]

_log = logging.getLogger("mimo_ctx")

StartResult = Literal["started", "queued", "skipped"]
WaitResult = Literal["idle", "finished", "failed", "timeout"]

_EXTRA_FILE = re.compile(r"^checkpoint-[A-Za-z0-9._-]+\.md$")


@dataclass(frozen=True, slots=True)
class WriterRequest:
    """Everything a checkpoint writer gets (SPEC A3).

    Attributes:
        session_id: The session.
        project_id: The session's project.
        watermark: Id of the last message the checkpoint must cover.
        messages: The main agent's full history up to and including the watermark,
            uncollapsed (R7.4: the writer sees the whole tail).
        previous_checkpoint: The checkpoint on disk, to carry forward what is alive.
        notes: ``notes.md``, to fold in.
        tasks: The session's task registry.
        checkpoint_path: Where ``checkpoint.md`` goes.
        project_memory_path: The project's ``MEMORY.md``.
        notes_path: The session's ``notes.md``.
        tasks_dir: The session's task directory.
        budgets: Token budget per checkpoint section number (A14, R5.10).
    """

    session_id: str
    project_id: str
    watermark: str
    messages: Sequence[Message]
    previous_checkpoint: str | None
    notes: str | None
    tasks: Sequence[Task]
    checkpoint_path: Path
    project_memory_path: Path
    notes_path: Path
    tasks_dir: Path
    budgets: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class CheckpointDraft:
    """A writer's output.

    Attributes:
        text: The new ``checkpoint.md``.
        extra_files: Spill-over files (``checkpoint-<topic>.md`` -> content) written
            beside it.
        notes_folded: The writer folded ``notes.md`` in; it is emptied after success.
    """

    text: str
    extra_files: Mapping[str, str] = field(default_factory=dict[str, str])
    notes_folded: bool = False


@runtime_checkable
class CheckpointWriter(Protocol):
    """Writes ``checkpoint.md`` from a session's history."""

    @property
    def name(self) -> str:
        """A short name for events and logs (``llm``, ``offline``)."""
        ...

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        """Return the new checkpoint. Raising means the writer failed."""
        ...


@dataclass(slots=True)
class _Job:
    reason: str
    done: anyio.Event = field(default_factory=anyio.Event)
    result: WaitResult = "failed"
    writer: str | None = None


@dataclass(slots=True)
class _Slot:
    running: _Job | None = None
    pending: _Job | None = None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class WriterCoordinator:
    """Runs checkpoint writers in the background, one per session.

    Args:
        store: Where the history and the watermark live.
        layout: Where ``checkpoint.md`` and the other memory files live.
        config: Budgets and the watermark constants.
        writer: The primary writer.
        events: Where writer events go.
        fallback: Used when the primary writer fails, so a rebuild still has a
            fresh checkpoint (the event names which writer produced it).
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
    ) -> None:
        self._store = store
        self._layout = layout
        self._config = config
        self._writer = writer
        self._fallback = fallback
        self._events = events
        self._slots: dict[str, _Slot] = {}
        self._task_group: TaskGroup | None = None

    def attach(self, task_group: TaskGroup | None) -> None:
        """Give the coordinator the task group its writers run in (``None`` detaches)."""
        self._task_group = task_group

    def in_flight(self, session_id: str) -> bool:
        """True while a writer runs for the session."""
        slot = self._slots.get(session_id)
        return slot is not None and slot.running is not None

    async def request(self, session_id: str, *, reason: str) -> StartResult:
        """Ask for a checkpoint of the session's history as it is now.

        Returns:
            ``started`` when a writer started, ``queued`` when one runs already (this
            request takes the pending slot, evicting an older pending one), and
            ``skipped`` when there is nothing new to cover.
        """
        if self._task_group is None:
            raise MimoCtxError(
                "the checkpoint writer needs a running middleware: "
                "use `async with ContextMiddleware(...) as middleware:`"
            )
        slot = self._slots.setdefault(session_id, _Slot())
        if slot.running is not None:
            if slot.pending is not None:
                # The evicted request's waiters are released: the newer one covers more.
                slot.pending.result = "failed"
                slot.pending.done.set()
            slot.pending = _Job(reason)
            return "queued"
        watermark = await self._next_watermark(session_id)
        if watermark is None:
            return "skipped"
        job = _Job(reason)
        slot.running = job
        self._task_group.start_soon(self._run, session_id, job, watermark)
        return "started"

    async def wait(self, session_id: str, within: float) -> WaitResult:
        """Wait for the session's running writer, at most ``within`` seconds.

        Returns ``idle`` when none runs. Cancelling the caller cancels only the wait.
        """
        slot = self._slots.get(session_id)
        job = slot.running if slot is not None else None
        if job is None:
            return "idle"
        with anyio.move_on_after(within):
            await job.done.wait()
            return job.result
        return "timeout"

    async def _next_watermark(self, session_id: str) -> str | None:
        messages = await self._store.list_messages(session_id, agent=MAIN_AGENT)
        boundary = compute_boundary(messages, self._config)
        if boundary is None:
            return None
        boundary = adjust_boundary_for_api_invariants(messages, boundary)
        current = await self._store.get_watermark(session_id)
        if current is not None and boundary <= current:
            return None
        return boundary

    async def _run(self, session_id: str, job: _Job, watermark: str) -> None:
        try:
            job.result, job.writer = await self._write(session_id, job, watermark)
        except Exception as exc:  # the writer's failure must never take the host down
            _log.exception("mimo_ctx checkpoint writer crashed for session %s", session_id)
            job.result = "failed"
            await self._events.emit(
                WriterFailed(
                    session_id=session_id, time=_now_ms(), writer="coordinator", error=repr(exc)
                )
            )
        finally:
            job.done.set()
            slot = self._slots[session_id]
            slot.running = None
            pending, slot.pending = slot.pending, None
            if pending is not None and self._task_group is not None:
                next_watermark = await self._next_watermark(session_id)
                if next_watermark is None:
                    pending.result = "finished"
                    pending.done.set()
                else:
                    slot.running = pending
                    self._task_group.start_soon(self._run, session_id, pending, next_watermark)

    async def _write(
        self, session_id: str, job: _Job, watermark: str
    ) -> tuple[WaitResult, str | None]:
        session = await self._store.get_session(session_id)
        if session is None:
            raise MimoCtxError(f"unknown session {session_id!r}")
        history = await self._store.list_messages(session_id, agent=MAIN_AGENT)
        covered = [m for m in history if m.id <= watermark]
        layout = self._layout
        checkpoint_path = layout.checkpoint_path(session_id)
        request = WriterRequest(
            session_id=session_id,
            project_id=session.project_id,
            watermark=watermark,
            messages=covered,
            previous_checkpoint=await read_text(checkpoint_path),
            notes=await read_text(layout.notes_path(session_id)),
            tasks=await self._store.list_tasks(session_id),
            checkpoint_path=checkpoint_path,
            project_memory_path=layout.project_memory_path(session.project_id),
            notes_path=layout.notes_path(session_id),
            tasks_dir=layout.tasks_dir(session_id),
            budgets=section_budgets(self._config.push_caps),
        )
        writers = [self._writer] + ([self._fallback] if self._fallback is not None else [])
        for writer in writers:
            await self._events.emit(
                WriterStarted(
                    session_id=session_id,
                    time=_now_ms(),
                    watermark=watermark,
                    reason=job.reason,
                    writer=writer.name,
                )
            )
            try:
                draft = await writer.write(request)
                _check_draft(draft)
                await self._persist(session_id, request, draft)
            except Exception as exc:
                _log.warning("mimo_ctx %s checkpoint writer failed: %r", writer.name, exc)
                await self._events.emit(
                    WriterFailed(
                        session_id=session_id, time=_now_ms(), writer=writer.name, error=repr(exc)
                    )
                )
                continue
            await self._events.emit(
                WriterFinished(
                    session_id=session_id,
                    time=_now_ms(),
                    watermark=watermark,
                    writer=writer.name,
                    checkpoint_path=str(checkpoint_path),
                    checkpoint_tokens=estimate_text_tokens(draft.text),
                )
            )
            return "finished", writer.name
        return "failed", None

    async def _persist(
        self, session_id: str, request: WriterRequest, draft: CheckpointDraft
    ) -> None:
        directory = request.checkpoint_path.parent
        for name, content in draft.extra_files.items():
            await write_text_atomic(directory / name, content)
        # checkpoint.md last: it is what a rebuild reads, so it must never point
        # at a spill-over file that is not on disk yet.
        await write_text_atomic(request.checkpoint_path, draft.text)
        if draft.notes_folded and request.notes:
            await write_text_atomic(request.notes_path, "")
        await self._store.set_watermark(session_id, request.watermark)


def _check_draft(draft: CheckpointDraft) -> None:
    if not draft.text.strip():
        raise MimoCtxError("the checkpoint writer returned an empty checkpoint")
    for name in draft.extra_files:
        if not _EXTRA_FILE.match(name):
            raise MimoCtxError(
                f"the checkpoint writer named a spill-over file {name!r}; "
                "expected checkpoint-<topic>.md"
            )
