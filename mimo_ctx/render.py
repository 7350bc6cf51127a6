"""The rebuild body (SPEC R5): gather every source, then assemble it under the caps.

Two steps. :func:`gather_sources` does all the I/O: the task registry, actors and
user messages from the store, ``checkpoint.md`` (and the offline writer's state
beside it), project and global ``MEMORY.md``, ``notes.md``, the memory-file list
and whether the open task's ``progress.md`` exists; it returns a
:class:`RebuildSources`. :func:`assemble_body` is pure and synchronous: it turns
those sources into the body with the formatters of :mod:`mimo_ctx.sections`,
:mod:`mimo_ctx.budget`, :mod:`mimo_ctx.digest` and :mod:`mimo_ctx.reminders`, so
the budget properties are tested without a store. :func:`render_rebuild_context`
is the two in a row.

**Recent user input** is read over the whole main history through
:meth:`~mimo_ctx.store.base.Store.list_user_messages`: the newest user messages,
page by page, until the section's cap is covered (at most
``recent_user_window`` of them), plus the session's task-defining request — the
first substantive one (:func:`~mimo_ctx.checkpoint.evidence.is_continuation`) —
which is pinned: taken before the newest. Each user message appears once in the
body: the checkpoint's quotes of a message that section holds become pointers to
it (:func:`~mimo_ctx.checkpoint.sections.refer_to_quoted`), and the activity list
marks where each typed user message of the tail falls with a pointer too. The
newest user message is labelled as answered, being worked on or not answered yet,
and the closing line follows (:func:`~mimo_ctx.reminders.closing_text`).

**The checkpoint** is ``checkpoint.md`` as written, except that the offline
writer's own one (its saved state beside it matches it) is shown with the tail
after the watermark folded into that state and re-rendered
(:func:`~mimo_ctx.checkpoint.offline.render_state`): its next action, open errors,
files and latest words are then those of now, not of a tail's length ago.

Beyond the original (R5.9): ``max_tokens`` bounds the whole body. When the
sections add up to more, they are shrunk one at a time in this order, least
precious first, each only as far as needed: memory keys index, the host's own
section, global memory, session notes, project memory, recent activity, active
actors, session checkpoint, recent user input, tasks ledger, rebuild focus. The
user's own words and the checkpoint go last because they are what the model
cannot recover elsewhere; the focus of a manual rebuild is the user's words for
this very rebuild.

Ours, beyond the nine sections of R5.3: ``# Rebuild focus`` (the focus text of a
manual rebuild, verbatim, first; ``push_caps.rebuild_focus``) and a section of the
host's own that a ``before_rebuild`` hook returns (:mod:`mimo_ctx.hooks`), right
before ``# Recent activity`` (``push_caps.host_section``). Both appear only when
given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import anyio
import anyio.to_thread

from mimo_ctx._budget_cache import budgeted
from mimo_ctx._render_files import MemoryFile, read_body_files, without_topic
from mimo_ctx._user_pages import USER_PAGE, LiveUsers, UserPages
from mimo_ctx.budget import (
    checkpoint_section_caps,
)
from mimo_ctx.checkpoint.evidence import (
    is_continuation,
)
from mimo_ctx.checkpoint.sections import refer_to_quoted
from mimo_ctx.config import RebuildConfig
from mimo_ctx.digest import USER_QUOTED_WHERE, build_tail_digest
from mimo_ctx.hooks import HostSection
from mimo_ctx.memory import MemoryLayout, list_memory_files
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import (
    MAIN_AGENT,
    Message,
    user_input_text,
)
from mimo_ctx.reminders import (
    OpenWork,
    closing_text,
    compute_last_message_info,
    latest_request_note,
)
from mimo_ctx.sections import (
    BODY_INTRO,
    HEADING_CHECKPOINT,
    HEADING_GLOBAL_MEMORY,
    HEADING_NOTES,
    HEADING_PROJECT_MEMORY,
    HEADING_REBUILD_FOCUS,
    recent_user_input,
    render_active_actors_section,
    render_focus,
    render_host_section,
    render_memory_keys_index,
    render_section,
    render_tasks_ledger,
)
from mimo_ctx.session import Actor, Session, Task
from mimo_ctx.store._reads import RebuildReads, UserRead
from mimo_ctx.store.base import Store
from mimo_ctx.tokens import TokenCounter, estimate_text_tokens

__all__ = [
    "SHRINK_ORDER",
    "LiveUsers",
    "MemoryFile",
    "RebuildSources",
    "RenderedBody",
    "SectionFigure",
    "assemble_body",
    "gather_sources",
    "render_rebuild_context",
]

_log = logging.getLogger("mimo_ctx")

PIN_LOOKAHEAD: Final = 20
"""The task-defining request is looked for among this many oldest user messages."""

SHRINK_ORDER: Final[tuple[str, ...]] = (
    "memory_titles",
    "host_section",
    "global",
    "notes",
    "memory",
    "activity",
    "actor_ledger",
    "checkpoint",
    "recent_user",
    "tasks_ledger",
    "rebuild_focus",
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


_NO_CHECKPOINT: Final = MemoryFile("checkpoint.md")
_NO_MEMORY: Final = MemoryFile("MEMORY.md")
_NO_NOTES: Final = MemoryFile("notes.md")


@dataclass(frozen=True, slots=True)
class RebuildSources:
    """Everything the body is made of, read by :func:`gather_sources`.

    Attributes:
        session_id: The session rebuilt.
        tasks: Its task registry, finished tasks included.
        actors: Its active background actors.
        user_messages: Candidates for "Recent user input", oldest first.
        pinned: Ids among them of the task-defining request(s).
        checkpoint: ``checkpoint.md``.
        project: The project's ``MEMORY.md``.
        global_memory: The global ``MEMORY.md``.
        notes: ``notes.md``.
        memory_files: Paths for the memory keys index, relative to the root.
        tail: The messages the activity list digests, oldest first.
        reminder_tail: The whole tail (the open tool round too): the closing and the
            latest request's state are read from it.
        work: What is open if the last turn finished.
        focus: The focus text of a manual rebuild (``# Rebuild focus``, first).
        host: The section a ``before_rebuild`` hook added (before ``# Recent activity``).
        checkpoint_shown: ``checkpoint``'s text without its ``Topic:`` line, when
            :func:`gather_sources` made it (``None``: made when rendered).
        checkpoint_quotes: ``False`` when :func:`gather_sources` found that it
            quotes no user message (no pointers to look for).
    """

    session_id: str
    tasks: Sequence[Task] = ()
    actors: Sequence[Actor] = ()
    user_messages: Sequence[Message] = ()
    pinned: frozenset[str] = frozenset()
    checkpoint: MemoryFile = _NO_CHECKPOINT
    project: MemoryFile = _NO_MEMORY
    global_memory: MemoryFile = _NO_MEMORY
    notes: MemoryFile = _NO_NOTES
    memory_files: Sequence[str] = ()
    tail: Sequence[Message] = ()
    reminder_tail: Sequence[Message] = ()
    work: OpenWork = field(default_factory=OpenWork)
    focus: str | None = None
    host: HostSection | None = None
    checkpoint_shown: str | None = None
    checkpoint_quotes: bool = True


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
    focus: str | None = None,
    host: HostSection | None = None,
) -> RenderedBody:
    """Render the rebuild body of SPEC R5: :func:`gather_sources`, then :func:`assemble_body`.

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
        focus: The focus text of a manual rebuild, kept verbatim in its own section.
        host: A section of the host's own (a ``before_rebuild`` hook's).

    Returns:
        The body with per-section figures.
    """
    del watermark  # the tail starts after it; kept for the signature callers use
    if agent != MAIN_AGENT:
        return RenderedBody(text="", has_activity=False)
    config = config or RebuildConfig()
    sources = await gather_sources(
        store=store,
        layout=layout,
        session=session,
        tail=tail,
        reminder_tail=reminder_tail,
        config=config,
        counter=counter,
        memory_index=memory_index,
        focus=focus,
        host=host,
    )
    return assemble_body(sources, config=config, max_tokens=max_tokens, counter=counter)


async def gather_sources(
    *,
    store: Store,
    layout: MemoryLayout,
    session: Session,
    tail: Sequence[Message],
    reminder_tail: Sequence[Message] | None = None,
    config: RebuildConfig | None = None,
    counter: TokenCounter | None = None,
    memory_index: MemoryIndex | None = None,
    focus: str | None = None,
    host: HostSection | None = None,
    actors: Sequence[Actor] | None = None,
    live_users: LiveUsers | None = None,
    reads: RebuildReads | None = None,
) -> RebuildSources:
    """Read everything the body is made of (the I/O half of the render).

    Args:
        store: The session's store.
        layout: The memory layout.
        session: The session rebuilt.
        tail: The messages the activity list digests.
        reminder_tail: The whole tail, when it differs from ``tail``.
        config: Caps and limits.
        counter: Token counter for the user-input cap.
        memory_index: The FTS5 memory index (R5.6); without one the root is walked.
        focus: The focus text of a manual rebuild (given, not read).
        host: The section a ``before_rebuild`` hook returned (given, not read).
        actors: The session's active actors, when the caller listed them already.
        live_users: The user messages the caller holds live: the store is read only
            for the older ones "Recent user input" reaches.
        reads: What the caller read from the store already, in one call
            (:mod:`mimo_ctx.store._reads`): the tasks, the active actors and the
            user-message reads of :func:`~mimo_ctx._user_pages.first_user_reads`.
    """
    config = config or RebuildConfig()
    session_id = session.id
    if reads is not None:
        tasks, actors = reads.tasks, reads.actors
    else:
        tasks = await store.list_tasks(session_id)
        if actors is None:
            actors = await store.list_actors(session_id, active_only=True)
    known = reads.users if reads is not None else None
    users, pinned = await _user_messages(
        store, session_id, config, counter, live_users, known=known
    )
    whole_tail = tail if reminder_tail is None else reminder_tail
    # Every file in one worker-thread call: each hand-off to a thread and back is a
    # round trip through the event loop, which on a loaded machine costs more than
    # reading a small file. They are budgeted there too, right after the read.
    files = await anyio.to_thread.run_sync(
        lambda: read_body_files(
            layout,
            session_id,
            session.project_id,
            tasks=tasks,
            tail=whole_tail,
            config=config,
            counter=counter,
        )
    )
    if memory_index is not None:
        # R5.6: reconcile first, so files written outside the tools appear.
        memory_files = await memory_index.reconciled_paths(
            layout, session_id=session_id, project_id=session.project_id
        )
    else:
        memory_files = await list_memory_files(
            layout, session_id=session_id, project_id=session.project_id
        )
    return RebuildSources(
        session_id=session_id,
        tasks=tasks,
        actors=actors,
        user_messages=users,
        pinned=pinned,
        checkpoint=files.checkpoint,
        project=files.project,
        global_memory=files.global_memory,
        notes=files.notes,
        memory_files=memory_files,
        tail=tail,
        reminder_tail=whole_tail,
        work=files.work,
        focus=focus,
        host=host,
        checkpoint_shown=files.checkpoint_shown,
        checkpoint_quotes=files.checkpoint_quotes,
    )


async def _user_messages(
    store: Store,
    session_id: str,
    config: RebuildConfig,
    counter: TokenCounter | None,
    live: LiveUsers | None = None,
    *,
    known: Mapping[UserRead, list[Message]] | None = None,
) -> tuple[list[Message], frozenset[str]]:
    """The candidates of "Recent user input" and the pinned request among them.

    Newest pages first until the cap is covered, so a rebuild reads what the section
    can hold (at most ``recent_user_window`` messages), never the whole history.
    The pages are what the store lists; the messages of ``live`` are taken from it
    instead of read again, and the reads ``known`` answers are not made
    (:class:`~mimo_ctx._user_pages.UserPages`).
    """
    pages = UserPages(store, session_id, live, known or {})
    caps = config.push_caps
    if not config.recent_user_window or not caps.recent_user:
        return [], frozenset()
    count = counter.count if counter is not None else estimate_text_tokens
    per_message = min(caps.recent_user_per_msg, caps.recent_user)
    newest: list[Message] = []
    covered = 0
    before: tuple[int, str] | None = None
    left = config.recent_user_window
    while left > 0 and covered < caps.recent_user:
        page = await pages.newest(min(USER_PAGE, left), before)
        for message in reversed(page):
            text = user_input_text(message)
            if text is not None:
                covered += min(count(text), per_message) + 8
            newest.append(message)
        left -= len(page)
        if len(page) < USER_PAGE:
            break
        before = (page[0].time_created, page[0].id)
    newest.reverse()
    first = next(iter(newest), None)
    pinned: Message | None = None
    # The oldest user message is usually the task-defining one: read it alone
    # first, and the whole lookahead only when it is not.
    for first_count in (1, PIN_LOOKAHEAD):
        oldest = await pages.oldest(first_count)
        pinned = next(
            (
                m
                for m in oldest
                if (text := user_input_text(m)) is not None and not is_continuation(text)
            ),
            None,
        )
        if pinned is not None or len(oldest) < first_count:
            break
    if pinned is None:
        return newest, frozenset()
    if first is None or (pinned.time_created, pinned.id) < (first.time_created, first.id):
        newest.insert(0, pinned)
    return newest, frozenset({pinned.id})


def assemble_body(
    sources: RebuildSources,
    *,
    config: RebuildConfig | None = None,
    max_tokens: int | None = None,
    counter: TokenCounter | None = None,
) -> RenderedBody:
    """Assemble the body from gathered sources: pure, synchronous, no I/O.

    Every section is rendered under its cap; with ``max_tokens`` (R5.9 beyond)
    sections then shrink in :data:`SHRINK_ORDER` until the body fits. The
    checkpoint's quotes and the activity list point at "Recent user input" for the
    messages it holds, so each user message appears once.
    """
    config = config or RebuildConfig()
    caps = config.push_caps
    count = counter.count if counter is not None else estimate_text_tokens
    note = latest_request_note(sources.user_messages, sources.reminder_tail)
    quoted: set[str] = set()

    def file_section(
        source: MemoryFile, heading: str, *, section_aware: bool, refer: bool = False
    ) -> Callable[[int], str]:
        def render(cap: int) -> str:
            if source.problem is not None:
                # Degrade visibly: the section stays, says why it is empty.
                notice = f"[this file could not be read: {source.problem}]"
                return render_section(heading, notice, file_path=source.path)
            if source.blank:
                return ""
            text = source.text
            if refer:
                # The boundary's "## Checkpoint" part already names the topic, and the
                # user's words are quoted under "Recent user input": say each once.
                shown = sources.checkpoint_shown
                text = without_topic(text) if shown is None else shown
                if sources.checkpoint_quotes:
                    text = refer_to_quoted(text, quoted, USER_QUOTED_WHERE)
            caps_for = checkpoint_section_caps(caps) if refer else None
            return budgeted(
                text, cap, source.path, counter, section_aware=section_aware, section_caps=caps_for
            ).section(heading)

        return render

    def user_input(cap: int) -> str:
        rendered = recent_user_input(
            sources.user_messages,
            budget=cap,
            per_message_cap=min(caps.recent_user_per_msg, cap),
            counter=counter,
            pinned=sources.pinned,
            notes=dict([note]) if note is not None else None,
        )
        quoted.clear()
        quoted.update(rendered.quoted)
        return rendered.text

    def activity(lines: int) -> str:
        return build_tail_digest(
            sources.tail,
            max_lines=lines,
            text_chars=config.activity_text_chars,
            arg_chars=config.activity_arg_chars,
            quoted=quoted,
        ).text

    slots = [
        _Slot(
            "tasks_ledger",
            "Tasks ledger",
            "characters",
            caps.tasks_ledger,
            lambda cap: render_tasks_ledger(sources.tasks, cap_chars=cap),
        ),
        _Slot(
            "checkpoint",
            HEADING_CHECKPOINT,
            "tokens",
            caps.checkpoint,
            file_section(sources.checkpoint, HEADING_CHECKPOINT, section_aware=True, refer=True),
            sources.checkpoint.path,
        ),
        _Slot(
            "actor_ledger",
            "Active actors",
            "tokens",
            caps.actor_ledger,
            lambda cap: render_active_actors_section(
                sources.actors, session_id=sources.session_id, budget=cap, counter=counter
            ),
        ),
        _Slot(
            "recent_user", "Recent user input (verbatim)", "tokens", caps.recent_user, user_input
        ),
        _Slot(
            "memory",
            HEADING_PROJECT_MEMORY,
            "tokens",
            caps.memory,
            file_section(sources.project, HEADING_PROJECT_MEMORY, section_aware=True),
            sources.project.path,
        ),
        _Slot(
            "global",
            HEADING_GLOBAL_MEMORY,
            "tokens",
            caps.global_,
            file_section(sources.global_memory, HEADING_GLOBAL_MEMORY, section_aware=True),
            sources.global_memory.path,
        ),
        _Slot(
            "notes",
            HEADING_NOTES,
            "tokens",
            caps.notes,
            file_section(sources.notes, HEADING_NOTES, section_aware=False),
            sources.notes.path,
        ),
        _Slot(
            "memory_titles",
            "Memory keys index",
            "tokens",
            caps.memory_titles,
            lambda cap: render_memory_keys_index(sources.memory_files, budget=cap, counter=counter),
        ),
        _Slot("activity", "Recent activity", "lines", config.activity_max_lines, activity),
    ]
    host = sources.host
    if host is not None:
        # The host's own section goes right before the activity list, which stays
        # last, next to the live messages it leads into.
        slots.insert(
            len(slots) - 1,
            _Slot(
                "host_section",
                host.heading,
                "tokens",
                caps.host_section,
                lambda cap: render_host_section(
                    host.heading, host.text, budget=cap, counter=counter
                ),
            ),
        )
    focus = sources.focus
    if focus is not None and focus.strip():
        # First: what the user asked this rebuild to keep in view frames the rest.
        slots.insert(
            0,
            _Slot(
                "rebuild_focus",
                HEADING_REBUILD_FOCUS,
                "tokens",
                caps.rebuild_focus,
                lambda cap: render_focus(focus, budget=cap, counter=counter),
            ),
        )
    by_key = {slot.key: slot for slot in slots}
    # "Recent user input" first: what it quotes decides the pointers of the others.
    by_key["recent_user"].text = by_key["recent_user"].render(by_key["recent_user"].cap)
    for slot in slots:
        if slot.key != "recent_user":
            slot.text = slot.render(slot.cap)

    # R5.1: nothing to inject (notes alone do not count, A6).
    if not (
        sources.tasks
        or not sources.checkpoint.blank
        or not sources.project.blank
        or not sources.global_memory.blank
        or by_key["actor_ledger"].text
        or by_key["recent_user"].text
    ):
        return RenderedBody(text="", has_activity=False)

    last_info = compute_last_message_info(sources.reminder_tail)

    def assemble() -> str:
        closing = closing_text(bool(by_key["activity"].text), last_info, sources.work)
        body = "".join(
            (s.text if s.text.endswith("\n\n") else s.text.rstrip("\n") + "\n\n")
            for s in slots
            if s.text
        )
        return f"{BODY_INTRO}\n\n{body}{closing}"

    text = assemble()
    tokens = count(text)  # counted once per assembled text, not once per look
    # A second pass: when "Recent user input" shrank, the checkpoint and the activity
    # list quote again what it no longer holds, and may need to shrink further.
    for _ in range(2 if max_tokens is not None else 0):
        for key in SHRINK_ORDER:
            over = tokens - (max_tokens or 0)
            if over <= 0:
                break
            if key not in by_key:
                continue
            _shrink(by_key[key], over, count)
            if key == "recent_user":
                # Fewer messages quoted there: the pointers to them become quotes again.
                for dependent in ("checkpoint", "activity"):
                    slot = by_key[dependent]
                    slot.text = slot.render(slot.cap) if slot.text else ""
            text = assemble()
            tokens = count(text)
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
        tokens=tokens,
    )


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
    if slot.text and count(slot.text) >= current and floor == 0:
        # Cutting it only swapped the body for a longer notice (a short ledger for
        # its truncation line): drop it, as when the overshoot exceeds it.
        slot.cap = 0
        slot.text = ""
