"""The rebuild body (SPEC R5): gather every source under its cap and assemble it.

:func:`render_rebuild_context` reads the sources (task registry, actors, recent
user messages from the store; ``checkpoint.md``, project and global
``MEMORY.md``, ``notes.md`` and the memory-file list from disk) and hands them
to the pure formatters of :mod:`mimo_ctx.sections`, :mod:`mimo_ctx.budget` and
:mod:`mimo_ctx.digest`.

Beyond the original (R5.9): ``max_tokens`` bounds the whole body. When the
sections add up to more, they are shrunk one at a time in this order, least
precious first, each only as far as needed: memory keys index, global memory,
session notes, project memory, recent activity, active actors, session
checkpoint, recent user input, tasks ledger. The user's own words and the
checkpoint go last because they are what the model cannot recover elsewhere.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from mimo_ctx.budget import (
    SectionCap,
    checkpoint_section_caps,
    read_budgeted,
    read_budgeted_section_aware,
)
from mimo_ctx.config import RebuildConfig
from mimo_ctx.digest import build_tail_digest
from mimo_ctx.errors import PathEscapeError
from mimo_ctx.memory import MemoryLayout, list_memory_files, read_text
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import MAIN_AGENT, Message
from mimo_ctx.reminders import closing_text, compute_last_message_info
from mimo_ctx.sections import (
    BODY_INTRO,
    HEADING_CHECKPOINT,
    HEADING_GLOBAL_MEMORY,
    HEADING_NOTES,
    HEADING_PROJECT_MEMORY,
    render_active_actors_section,
    render_memory_keys_index,
    render_recent_user_input,
    render_section,
    render_tasks_ledger,
)
from mimo_ctx.store.base import Session, Store
from mimo_ctx.tokens import TokenCounter, estimate_text_tokens

__all__ = ["SHRINK_ORDER", "RenderedBody", "SectionFigure", "render_rebuild_context"]

_log = logging.getLogger("mimo_ctx")

MAX_FILE_CHARS: Final = 8_000_000
"""Memory files are read up to this many characters (bounded memory)."""

SHRINK_ORDER: Final[tuple[str, ...]] = (
    "memory_titles",
    "global",
    "notes",
    "memory",
    "activity",
    "actor_ledger",
    "checkpoint",
    "recent_user",
    "tasks_ledger",
)
"""Order in which sections shrink when the body exceeds ``max_tokens`` (R5.9 beyond)."""

Unit = Literal["tokens", "characters", "lines"]


@dataclass(frozen=True, slots=True)
class SectionFigure:
    """Size of one rendered section against its cap.

    Attributes:
        key: The config key (``checkpoint``, ``recent_user``...; ``activity`` for §9).
        heading: The section heading.
        tokens: Estimated tokens of the rendered section (0 when omitted).
        cap: The cap that applied, in ``unit``.
        unit: ``tokens``, ``characters`` (tasks ledger) or ``lines`` (activity).
        file: The file a file-backed section came from.
    """

    key: str
    heading: str
    tokens: int
    cap: int
    unit: Unit
    file: str | None = None


@dataclass(frozen=True, slots=True)
class RenderedBody:
    """The rebuild body and what went into it.

    Attributes:
        text: The body; ``""`` when there is nothing to inject (R5.1).
        has_activity: A recent-activity section was rendered (sets ``digest_up_to``).
        sections: One figure per section, in body order.
        tokens: Estimated tokens of ``text``.
    """

    text: str
    has_activity: bool
    sections: list[SectionFigure] = field(default_factory=list[SectionFigure])
    tokens: int = 0


@dataclass(slots=True)
class _Slot:
    key: str
    heading: str
    unit: Unit
    cap: int
    render: Callable[[int], str]
    file: str | None = None
    text: str = ""


async def render_rebuild_context(
    *,
    store: Store,
    layout: MemoryLayout,
    session: Session,
    agent: str,
    watermark: Message,
    tail: Sequence[Message],
    reminder_tail: Sequence[Message] | None = None,
    config: RebuildConfig | None = None,
    max_tokens: int | None = None,
    counter: TokenCounter | None = None,
    memory_index: MemoryIndex | None = None,
) -> RenderedBody:
    """Render the rebuild body of SPEC R5.

    Args:
        store: The session's store.
        layout: The memory layout.
        session: The session rebuilt.
        agent: The agent asking; any agent other than ``main`` gets ``""`` (R3.1).
        watermark: The watermark message (covered by the checkpoint).
        tail: Main-agent messages after the watermark up to now, oldest first: the
            recent-activity digest and the last-message reminder come from them.
        reminder_tail: When given, the R5.8 reminder is chosen from these messages
            instead (the whole tail, when an open tool round stays out of the digest).
        config: Caps and limits.
        max_tokens: **beyond** (R5.9): bound on the whole body.
        counter: Token counter for caps; defaults to the chars/4 estimate.
        memory_index: The FTS5 memory index; section 8 reconciles it with the disk
            and lists its paths (R5.6). Without one the memory root is walked.

    Returns:
        The body with per-section figures.
    """
    if agent != MAIN_AGENT:
        return RenderedBody(text="", has_activity=False)
    config = config or RebuildConfig()
    caps = config.push_caps
    count = counter.count if counter is not None else estimate_text_tokens
    session_id = session.id

    tasks = await store.list_tasks(session_id)
    actors = await store.list_actors(session_id, active_only=True)
    recent = (
        await store.list_messages(session_id, agent=MAIN_AGENT, last=config.recent_user_window)
        if config.recent_user_window
        else []
    )
    checkpoint_path = layout.checkpoint_path(session_id)
    project_path = layout.project_memory_path(session.project_id)
    global_path = layout.global_memory_path()
    notes_path = layout.notes_path(session_id)
    problems: dict[str, str] = {}
    checkpoint = await _read_memory_file(checkpoint_path, layout, problems)
    project = await _read_memory_file(project_path, layout, problems)
    global_memory = await _read_memory_file(global_path, layout, problems)
    notes = await _read_memory_file(notes_path, layout, problems)
    if memory_index is not None:
        # R5.6: reconcile first, so files written outside the tools appear.
        await memory_index.reconcile(layout, session_id=session_id, project_id=session.project_id)
        memory_files = await memory_index.paths(session_id, session.project_id)
    else:
        memory_files = await list_memory_files(
            layout, session_id=session_id, project_id=session.project_id
        )
    digest = build_tail_digest(
        tail,
        max_lines=config.activity_max_lines,
        text_chars=config.activity_text_chars,
        arg_chars=config.activity_arg_chars,
    )

    def file_section(
        heading: str, text: str, path: str, *, section_aware: bool
    ) -> Callable[[int], str]:
        def render(cap: int) -> str:
            if path in problems:
                # Degrade visibly: the section stays, says why it is empty.
                notice = f"[this file could not be read: {problems[path]}]"
                return render_section(heading, notice, file_path=path)
            if not text.strip():
                return ""
            caps_for = (
                checkpoint_section_caps(caps)
                if section_aware and heading == HEADING_CHECKPOINT
                else None
            )
            body = _budgeted(
                text, cap, path, counter, section_aware=section_aware, section_caps=caps_for
            )
            return render_section(heading, body, file_path=path) if body.strip() else ""

        return render

    def activity(lines: int) -> str:
        if lines == config.activity_max_lines:
            return digest.text
        return build_tail_digest(
            tail,
            max_lines=lines,
            text_chars=config.activity_text_chars,
            arg_chars=config.activity_arg_chars,
        ).text

    slots = [
        _Slot(
            "tasks_ledger",
            "Tasks ledger",
            "characters",
            caps.tasks_ledger,
            lambda cap: render_tasks_ledger(tasks, cap_chars=cap),
        ),
        _Slot(
            "checkpoint",
            HEADING_CHECKPOINT,
            "tokens",
            caps.checkpoint,
            file_section(HEADING_CHECKPOINT, checkpoint, str(checkpoint_path), section_aware=True),
            str(checkpoint_path),
        ),
        _Slot(
            "actor_ledger",
            "Active actors",
            "tokens",
            caps.actor_ledger,
            lambda cap: render_active_actors_section(
                actors, session_id=session_id, budget=cap, counter=counter
            ),
        ),
        _Slot(
            "recent_user",
            "Recent user input (verbatim)",
            "tokens",
            caps.recent_user,
            lambda cap: render_recent_user_input(
                recent,
                budget=cap,
                per_message_cap=min(caps.recent_user_per_msg, cap),
                counter=counter,
            ),
        ),
        _Slot(
            "memory",
            HEADING_PROJECT_MEMORY,
            "tokens",
            caps.memory,
            file_section(HEADING_PROJECT_MEMORY, project, str(project_path), section_aware=True),
            str(project_path),
        ),
        _Slot(
            "global",
            HEADING_GLOBAL_MEMORY,
            "tokens",
            caps.global_,
            file_section(
                HEADING_GLOBAL_MEMORY, global_memory, str(global_path), section_aware=True
            ),
            str(global_path),
        ),
        _Slot(
            "notes",
            HEADING_NOTES,
            "tokens",
            caps.notes,
            file_section(HEADING_NOTES, notes, str(notes_path), section_aware=False),
            str(notes_path),
        ),
        _Slot(
            "memory_titles",
            "Memory keys index",
            "tokens",
            caps.memory_titles,
            lambda cap: render_memory_keys_index(memory_files, budget=cap, counter=counter),
        ),
        _Slot("activity", "Recent activity", "lines", config.activity_max_lines, activity),
    ]
    for slot in slots:
        slot.text = slot.render(slot.cap)
    by_key = {slot.key: slot for slot in slots}

    # R5.1: nothing to inject (notes alone do not count, A6).
    if not (
        tasks
        or checkpoint.strip()
        or project.strip()
        or global_memory.strip()
        or by_key["actor_ledger"].text
        or by_key["recent_user"].text
    ):
        return RenderedBody(text="", has_activity=False)

    last_info = compute_last_message_info(reminder_tail if reminder_tail is not None else tail)
    closing = closing_text(bool(by_key["activity"].text), last_info)

    def assemble() -> str:
        body = "".join(
            (s.text if s.text.endswith("\n\n") else s.text.rstrip("\n") + "\n\n")
            for s in slots
            if s.text
        )
        return f"{BODY_INTRO}\n\n{body}{closing}"

    text = assemble()
    if max_tokens is not None:
        for key in SHRINK_ORDER:
            over = count(text) - max_tokens
            if over <= 0:
                break
            _shrink(by_key[key], over, count)
            # Re-render the closing: dropping the activity changes its wording.
            closing = closing_text(bool(by_key["activity"].text), last_info)
            text = assemble()
    figures = [
        SectionFigure(
            key=s.key,
            heading=s.heading,
            tokens=count(s.text) if s.text else 0,
            cap=s.cap,
            unit=s.unit,
            file=s.file,
        )
        for s in slots
    ]
    return RenderedBody(
        text=text,
        has_activity=bool(by_key["activity"].text),
        sections=figures,
        tokens=count(text),
    )


@dataclass(frozen=True, slots=True)
class _BudgetedEntry:
    text: str
    counter: TokenCounter | None
    output: str


_BUDGET_CACHE_ENTRIES: Final = 32
_BUDGET_CACHE_CHARS: Final = 24_000_000
_budget_cache: OrderedDict[
    tuple[str, int, bool, tuple[SectionCap, ...] | None, int], _BudgetedEntry
] = OrderedDict()


def _budgeted(
    text: str,
    cap: int,
    path: str,
    counter: TokenCounter | None,
    *,
    section_aware: bool,
    section_caps: tuple[SectionCap, ...] | None,
) -> str:
    """``read_budgeted[_section_aware]`` through a small LRU of earlier results.

    Budgeting a 1 MB memory file parses it line by line; project and global
    ``MEMORY.md`` rarely change between rebuilds (and are shared by every session
    of a project), so the result is reused while the text is the same. The entry
    holds the text it was computed from and is used only on an exact match (same
    counter object too), so a cache hit returns exactly what a fresh call would.
    """
    key = (path, cap, section_aware, section_caps, id(counter))
    entry = _budget_cache.get(key)
    if entry is not None and entry.counter is counter and entry.text == text:
        _budget_cache.move_to_end(key)
        return entry.output
    if section_aware:
        output = read_budgeted_section_aware(
            text, cap, path=path, counter=counter, section_caps=section_caps
        )
    else:
        output = read_budgeted(text, cap, path=path, counter=counter)
    _budget_cache[key] = _BudgetedEntry(text, counter, output)
    _budget_cache.move_to_end(key)
    # Bounded memory: at most so many entries and so many characters of source text
    # (an entry keeps its text alive; entries of one rebuild usually share it).
    held = sum(len(e.text) for e in _budget_cache.values())
    while len(_budget_cache) > 1 and (
        len(_budget_cache) > _BUDGET_CACHE_ENTRIES or held > _BUDGET_CACHE_CHARS
    ):
        _, dropped = _budget_cache.popitem(last=False)
        held -= len(dropped.text)
    return output


async def _read_memory_file(path: Path, layout: MemoryLayout, problems: dict[str, str]) -> str:
    """Read a memory file for the body: bounded, inside the root, never raising.

    A file that cannot be read (permissions, I/O errors, a symlink leading out of
    the memory root) gives ``""``; the reason is logged with the path and recorded
    in ``problems`` so its section can say so instead of failing the rebuild.
    """
    try:
        return await read_text(path, max_chars=MAX_FILE_CHARS, root=layout.root) or ""
    except (OSError, PathEscapeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _log.warning("mimo_ctx: memory file %s could not be read: %s", path, reason)
        problems[str(path)] = reason
        return ""


def _shrink(slot: _Slot, over: int, count: Callable[[str], int]) -> None:
    """Shrink one section by about ``over`` tokens (to nothing if need be)."""
    if not slot.text:
        return
    current = count(slot.text)
    # The activity digest keeps at least its newest line: without a digest nothing
    # is folded (R4.4), and the whole tail would stay in the request.
    floor = min(2, slot.cap) if slot.key == "activity" else 0
    if over >= current and floor == 0:
        slot.cap = 0
        slot.text = ""
        return
    if slot.unit == "tokens":
        cap = max(0, min(slot.cap, current) - over)
    elif slot.unit == "characters":
        cap = max(0, min(slot.cap, len(slot.text)) - over * 4)
    else:  # lines: drop the share of lines that matches the overshoot
        lines = max(1, slot.text.count("\n"))
        cap = max(floor, min(slot.cap, lines) - (over * lines + current - 1) // current)
    slot.cap = cap
    slot.text = slot.render(cap)
    while slot.text and count(slot.text) > current - over and slot.cap > floor:
        # Section caps bound bodies, not headings and notices: step down until
        # the section really shrank by what was asked.
        slot.cap = slot.cap * 3 // 4
        slot.text = slot.render(slot.cap)
    if slot.cap == 0:
        slot.text = "" if slot.key != "tasks_ledger" else slot.text
