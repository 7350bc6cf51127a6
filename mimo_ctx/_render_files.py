"""The rebuild body's file reads (private to :mod:`mimo_ctx.render`).

:func:`read_body_files` runs in one worker thread: the four memory files, the
offline writer's state (read and parsed once, only when needed), the
checkpoint brought up to the newest message, and the open work. Each hand-off
to a thread is a round trip through the event loop, and a parse of the state
(it grows with the session) on the loop would stall every other turn.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from mimo_ctx._budget_cache import budgeted
from mimo_ctx.budget import checkpoint_section_caps
from mimo_ctx.checkpoint.document import section_budgets
from mimo_ctx.checkpoint.evidence import PlanItem, newest_plan
from mimo_ctx.checkpoint.offline import render_state
from mimo_ctx.checkpoint.sections import names_user_messages
from mimo_ctx.checkpoint.state import CheckpointState, checkpoint_digest, fold_messages
from mimo_ctx.config import RebuildConfig
from mimo_ctx.errors import PathEscapeError
from mimo_ctx.memory import MemoryLayout, read_text_blocking
from mimo_ctx.messages import Message
from mimo_ctx.reminders import OpenWork
from mimo_ctx.sections import (
    HEADING_CHECKPOINT,
    HEADING_GLOBAL_MEMORY,
    HEADING_NOTES,
    HEADING_PROJECT_MEMORY,
)
from mimo_ctx.session import TERMINAL_TASK_STATUSES, Task
from mimo_ctx.tokens import TokenCounter

__all__ = [
    "MAX_FILE_CHARS",
    "BodyFiles",
    "MemoryFile",
    "budget_files",
    "read_body_files",
    "without_topic",
]

_log = logging.getLogger("mimo_ctx")

MAX_FILE_CHARS: Final = 8_000_000
"""Memory files are read up to this many characters (bounded memory)."""

_STATE_CHARS: Final = 4_000_000


@dataclass(frozen=True, slots=True)
class MemoryFile:
    """A memory file as read for the body.

    Attributes:
        path: Its path.
        text: Its content (``""`` when missing or unreadable).
        problem: Why it could not be read, if it could not.
    """

    path: str
    text: str = ""
    problem: str | None = None

    @property
    def blank(self) -> bool:
        """Whether the text is empty or only whitespace (``not text.strip()``).

        Without the copy ``strip`` makes: a megabyte file with a final newline is
        copied whole to learn that it is not blank, where ``isspace`` stops at its
        first character.
        """
        return not self.text or self.text.isspace()


@dataclass(frozen=True, slots=True)
class BodyFiles:
    """What the body reads from the memory directory, in one worker-thread call.

    ``checkpoint_shown`` is the checkpoint's text without its ``Topic:`` line
    (``None`` when it is blank or unreadable); ``checkpoint_quotes``: it may
    quote a user message (:func:`~mimo_ctx.checkpoint.sections.names_user_messages`).
    """

    checkpoint: MemoryFile
    project: MemoryFile
    global_memory: MemoryFile
    notes: MemoryFile
    work: OpenWork
    checkpoint_shown: str | None = None
    checkpoint_quotes: bool = True


def read_body_files(
    layout: MemoryLayout,
    session_id: str,
    project_id: str,
    *,
    tasks: Sequence[Task],
    tail: Sequence[Message],
    config: RebuildConfig,
    counter: TokenCounter | None = None,
) -> BodyFiles:
    """The memory files, the checkpoint brought up to now and the open work (blocking).

    The offline writer's state file is read and parsed once, here, for both the
    checkpoint and the open work, and only when one of them needs it. The files
    are then budgeted with ``counter`` (:func:`budget_files`).
    """
    checkpoint = _read_memory_file(layout.checkpoint_path(session_id), layout)
    project = _read_memory_file(layout.project_memory_path(project_id), layout)
    global_memory = _read_memory_file(layout.global_memory_path(), layout)
    notes = _read_memory_file(layout.notes_path(session_id), layout)
    plan = newest_plan(tail)
    state: CheckpointState | None = None
    if plan is None or _may_fold(checkpoint, tail):
        state = CheckpointState.from_json(
            _read_quietly(layout.checkpoint_state_path(session_id), layout)
        )
    if plan is None:
        plan = state.plan_items if state is not None else []
    files = BodyFiles(
        checkpoint=_current_checkpoint(checkpoint, state, tasks=tasks, tail=tail, config=config),
        project=project,
        global_memory=global_memory,
        notes=notes,
        work=_open_work(layout, session_id, tasks, plan),
    )
    return budget_files(files, config, counter)


_TOPIC_LINE = re.compile(r"^Topic:[^\n]*\n?", re.MULTILINE)


def without_topic(text: str) -> str:
    """``text`` without its first ``Topic:`` line (``_TOPIC_LINE.sub`` once).

    Spliced from two slices: the line is usually the file's first, and the one
    slice after it is the one copy of a megabyte checkpoint (a substitution copies
    it piece by piece into a new string).
    """
    topic = _TOPIC_LINE.search(text)
    return text if topic is None else text[: topic.start()] + text[topic.end() :]


def budget_files(
    files: BodyFiles, config: RebuildConfig, counter: TokenCounter | None
) -> BodyFiles:
    """``files`` with the checkpoint's text without its topic, each file budgeted for its
    section at its cap as :func:`mimo_ctx.render.assemble_body` does first (blocking).

    The results go to the budgeted reads' cache, where the body's render finds
    them (the same text, cap, path and counter): a megabyte file is parsed and
    measured in the thread that has just decoded it, while it is still in that
    core's cache, and the event loop does not stall on it. The checkpoint is
    budgeted here only when it quotes no user message: otherwise its text depends
    on what "Recent user input" holds, which is known on the loop.
    """
    caps = config.push_caps
    checkpoint = files.checkpoint
    shown = None
    quotes = True
    if checkpoint.problem is None and not checkpoint.blank:
        shown = without_topic(checkpoint.text)
        quotes = names_user_messages(shown)
        if not quotes:
            budgeted(
                shown,
                caps.checkpoint,
                checkpoint.path,
                counter,
                section_aware=True,
                section_caps=checkpoint_section_caps(caps),
            ).section(HEADING_CHECKPOINT)
    for source, heading, cap, section_aware in (
        (files.project, HEADING_PROJECT_MEMORY, caps.memory, True),
        (files.global_memory, HEADING_GLOBAL_MEMORY, caps.global_, True),
        (files.notes, HEADING_NOTES, caps.notes, False),
    ):
        if source.problem is None and not source.blank:
            budgeted(
                source.text,
                cap,
                source.path,
                counter,
                section_aware=section_aware,
                section_caps=None,
            ).section(heading)
    return replace(files, checkpoint_shown=shown, checkpoint_quotes=quotes)


def _may_fold(checkpoint: MemoryFile, tail: Sequence[Message]) -> bool:
    """Whether :func:`_current_checkpoint` can change ``checkpoint`` (it needs the state)."""
    return checkpoint.problem is None and not checkpoint.blank and bool(tail)


def _current_checkpoint(
    checkpoint: MemoryFile,
    state: CheckpointState | None,
    *,
    tasks: Sequence[Task],
    tail: Sequence[Message],
    config: RebuildConfig,
) -> MemoryFile:
    """The offline writer's checkpoint brought up to the newest message of ``tail``.

    The writer's watermark lies a tail's length before now, so its next action,
    open errors and latest words are those of that point: resuming from them
    would redo work the tail already finished. When the state saved beside
    ``checkpoint.md`` is the one that rendered it (its digest matches), the tail
    is folded into a copy of it and the checkpoint re-rendered (pure CPU work
    over at most the tail, in the worker thread of :func:`_read_files`). Nothing
    is written to disk; a checkpoint another writer wrote, or one without its
    state, is used as read.
    """
    if not _may_fold(checkpoint, tail):
        return checkpoint
    if state is None or state.checkpoint_sha256 != checkpoint_digest(checkpoint.text):
        return checkpoint
    folded = fold_messages(state, tail)
    if folded.upto == state.upto:
        return checkpoint
    budgets = section_budgets(config.push_caps)
    return MemoryFile(checkpoint.path, render_state(folded, tasks=tasks, budgets=budgets)[0])


def _open_work(
    layout: MemoryLayout, session_id: str, tasks: Sequence[Task], plan: Sequence[PlanItem]
) -> OpenWork:
    """What is open: the plan's first open item, else the first open task (blocking).

    ``plan`` is the tail's newest plan, else the one the writer's state holds.
    """
    item = next((i for i in plan if i.status == "in_progress"), None) or next(
        (i for i in plan if i.status == "pending"), None
    )
    if item is not None:
        return OpenWork(next_item=f"plan item: {item.text}")
    open_tasks = [t for t in tasks if t.status not in TERMINAL_TASK_STATUSES]
    if not open_tasks:
        return OpenWork()
    task = next((t for t in open_tasks if t.status == "in_progress"), open_tasks[0])
    progress = layout.task_progress_path(session_id, task.id)
    return OpenWork(
        next_item=f"task {task.id} ({task.status}): {' '.join(task.summary.split())}".rstrip(": "),
        progress_file=str(progress) if progress.is_file() else None,
    )


def _read_memory_file(path: Path, layout: MemoryLayout) -> MemoryFile:
    """Read a memory file for the body: bounded, inside the root, never raising (blocking).

    A file that cannot be read (permissions, I/O errors, a symlink leading out of
    the memory root) gives no text; the reason is logged with the path and kept in
    :attr:`MemoryFile.problem` so its section can say so instead of failing the
    rebuild.
    """
    try:
        text = read_text_blocking(path, max_chars=MAX_FILE_CHARS, root=layout.root) or ""
    except (OSError, PathEscapeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _log.warning("mimo_ctx: memory file %s could not be read: %s", path, reason)
        return MemoryFile(str(path), "", reason)
    return MemoryFile(str(path), text)


def _read_quietly(path: Path, layout: MemoryLayout) -> str | None:
    """A file only consulted (the writer's state): ``None`` when it cannot be read (blocking)."""
    try:
        return read_text_blocking(path, max_chars=_STATE_CHARS, root=layout.root)
    except (OSError, PathEscapeError):
        return None
