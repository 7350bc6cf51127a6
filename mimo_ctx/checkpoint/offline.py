"""The offline checkpoint writer: no model, deterministic, incremental (SPEC A3, A14).

:class:`OfflineCheckpointWriter` fills the A14 layout from evidence in the
messages (the user's requests verbatim, standing instructions, the host's plan,
what was done, files and why, errors with their fixes, the assistant's own
findings and decisions, the next action): the rules are in
:mod:`mimo_ctx.checkpoint.evidence`, the folding in :mod:`mimo_ctx.checkpoint.state`
and the sections in :mod:`mimo_ctx.checkpoint.sections`. Each run folds the new
messages into the state the previous run left beside ``checkpoint.md``. It is the
default when no model is configured and the fallback when the model-backed
writer (:mod:`mimo_ctx.checkpoint.llm`) fails.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from mimo_ctx._aio import run_sliced
from mimo_ctx.checkpoint.document import render_checkpoint
from mimo_ctx.checkpoint.protocol import CheckpointDraft, WriterRequest
from mimo_ctx.checkpoint.sections import render_sections, state_from_checkpoint
from mimo_ctx.checkpoint.state import (
    CheckpointState,
    checkpoint_digest,
    fold_messages,
    fold_notes,
)
from mimo_ctx.session import Task

__all__ = ["OfflineCheckpointWriter", "render_state"]


class OfflineCheckpointWriter:
    """A deterministic writer that needs no model (the default).

    It keeps a :class:`~mimo_ctx.checkpoint.state.CheckpointState` beside
    ``checkpoint.md`` (``checkpoint.state.json``), folds into it the messages the
    request holds after the state's last message (rules:
    :mod:`mimo_ctx.checkpoint.evidence`, :mod:`mimo_ctx.checkpoint.state`) and
    renders the eleven sections from it (:mod:`mimo_ctx.checkpoint.sections`).
    A run therefore needs only the previous state and the new messages. When the
    state is missing or belongs to another ``checkpoint.md`` (an LLM writer wrote
    the last one), the previous checkpoint's section lines are carried forward
    instead and the request's messages are folded after them.
    """

    def __init__(self) -> None:
        # The state each session's last run saved, as written and as parsed: the
        # next run's previous state is that very text, read back from the file,
        # and parsing it again cost more as the state filled up (the soak's writer
        # runs grew with the session). A worker thread per run: hence the lock.
        self._saved: OrderedDict[str, tuple[str, CheckpointState]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """``offline``."""
        return "offline"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        """Build the checkpoint from ``request`` in a worker thread, in slices.

        :meth:`build` is pure CPU work (no I/O) over the messages of the request;
        running it on a thread keeps the event loop free however many there are,
        and pausing between messages (:func:`~mimo_ctx._aio.run_sliced`) keeps the
        thread from holding the GIL, and so the loop, for a switch interval at a
        time.
        """
        return await run_sliced(lambda pause: self.build(request, pause=pause))

    def build(
        self, request: WriterRequest, *, pause: Callable[[], object] = lambda: None
    ) -> CheckpointDraft:
        """Synchronous core of :meth:`write`; ``pause`` is called between its steps."""
        previous_text = request.previous_checkpoint or ""
        state = self._previous_state(request.session_id, request.previous_state)
        if state is None or state.checkpoint_sha256 != checkpoint_digest(previous_text):
            state = state_from_checkpoint(previous_text)
        state = fold_notes(fold_messages(state, request.messages, pause=pause), request.notes)
        pause()
        text, extra_files = render_state(state, tasks=request.tasks, budgets=request.budgets)
        pause()
        saved = state.model_copy(update={"checkpoint_sha256": checkpoint_digest(text)})
        saved_text = saved.to_json()
        with self._lock:
            self._saved[request.session_id] = (saved_text, saved)
            self._saved.move_to_end(request.session_id)
            while len(self._saved) > _SAVED_SESSIONS:
                self._saved.popitem(last=False)
        return CheckpointDraft(
            text=text,
            extra_files=extra_files,
            notes_folded=bool((request.notes or "").strip()),
            state=saved_text,
        )

    def _previous_state(self, session_id: str, text: str | None) -> CheckpointState | None:
        """The state ``text`` holds: the one this writer saved when it is that text.

        Never changed in place (folding copies it), so it is handed out as kept.
        """
        with self._lock:
            kept = self._saved.get(session_id)
        if kept is not None and text is not None and kept[0] == text:
            return kept[1]
        return CheckpointState.from_json(text)


_SAVED_SESSIONS: Final = 64
"""Sessions whose last saved state a writer keeps parsed (the newest runs')."""


def render_state(
    state: CheckpointState, *, tasks: Sequence[Task], budgets: Mapping[int, int]
) -> tuple[str, dict[str, str]]:
    """``checkpoint.md`` and its spill-over files as the offline writer renders ``state``.

    The rebuild body uses it too, on the saved state with the messages after the
    watermark folded in (:func:`mimo_ctx.render.gather_sources`), so the two read
    the same.
    """
    rendered = render_sections(state, tasks=tasks, budgets=budgets)
    return render_checkpoint(_topic(state), rendered.bodies), rendered.extra_files


def _topic(state: CheckpointState) -> str:
    """The task-defining request's first line that is not a lead-in, else the carried topic.

    A line ending with ``:`` is a lead-in or a label and is skipped (the first line
    is used when all are); without a request, the carried topic or the plan item
    in progress.
    """
    if state.request is not None:
        lines = [line for line in state.request.text.splitlines() if line.strip()]
        # A lead-in ("Here's the issue text:") or a label ("ISSUE:") names no topic: a
        # task template's first line that says something does.
        said = next((line for line in lines if not line.rstrip().endswith(":")), None)
        return _fold(said or (lines[0] if lines else ""), 100)
    if state.carried_topic:
        return state.carried_topic
    plan = next((i.text for i in state.plan if i.status == "in_progress"), None)
    return _fold(plan, 100) if plan else "(unknown)"


def _fold(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
