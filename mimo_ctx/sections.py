"""Formatters of the rebuild body's sections and the boundary's index parts (SPEC R5, A5-A7, A15).

Pure, synchronous functions: the caller gathers the sources (tasks, actors,
messages, memory files) and these turn them into text.

API convention. Every ``render_*`` function that produces a *body section*
(``# <heading>`` ... , SPEC R5.3) returns the **whole section** as
:func:`render_section` formats it -- or ``""`` when the section is omitted
(nothing to show, or nothing fits its budget). Only the tasks ledger is always
emitted (A6). Budgets and caps apply to the section's body; the heading line,
the ``File:`` line and the closing blank line are fixed overhead. The two
*boundary parts* (:func:`render_checkpoint_index`, :func:`render_active_actors_part`)
are separate synthetic text parts of the boundary message and start with a
level-2 heading instead.

Section layout (A6), exactly::

    # <heading>\\n
    File: <path>\\n            (file-backed sections only)
    <body, without leading/trailing newlines>\\n
    \\n

Forged structure (security). Text that comes from files, users, tasks or actors
must not be able to fake the body's own structure. :func:`neutralise_structure`
enforces, for every section body:

* every line break is ``\\n`` first: ``\\r``, VT, FF, NEL, U+2028 and the other
  breaks :meth:`str.splitlines` knows become ``\\n``, so a heading cannot hide after
  a break the rules below would not split on;
* no line outside a fenced code block is a level-1 heading (``# Title``, or a
  paragraph line underlined with ``===``), nor one inside a list item or a block
  quote (``- # Title``, ``> # Title``), however deep the item's content column
  puts it (``- \\n    # Title``: an item opened by a blank line has its content
  at column 2, so a line indented 4 there is a heading, not code): file-backed
  bodies have ``# Title`` lines removed (A6); otherwise the line (the underline
  for setext) is escaped; a file-backed body's first line is under its
  ``File:`` line, so a ``===`` there is escaped too;
* no ``<h1>`` or ``<h2>`` tag stands anywhere, code blocks included (a Markdown
  reader lets an HTML block run over a fence): their ``<`` becomes ``&lt;``;
* no line anywhere, code blocks included, is one of *our* headings -- a level-1
  or level-2 heading whose title is a body section heading (R5.3) or a boundary
  part heading (``Checkpoint``, ``Active Actors``), as ``#``/``##``, or (outside
  code blocks) inside a list item or quote, or as a title underlined with ``---``
  (any run of lines just above the underline that reads as our title counts: a
  heading above ends the paragraph there);
* the body's first non-blank line does not start with ``File:`` (which would
  read as the section's source path);
* a fenced code block opened in the body is closed at its end, so it cannot
  swallow the sections that follow; a fence line under a line that may start an
  HTML block gets a blank line first (inside an HTML block a Markdown reader sees
  no fence, and the closer would open one); an HTML block that only its own end
  tag closes (``<!--``, ``<pre>``, ``<script>``...) is not opened (``&lt;``).

Escaping is one backslash in front of the line (``\\# Recent activity``,
``\\File: x``): minimal, visible, and Markdown reads ``\\#`` as a literal ``#``.
Single-line fields (task summaries, actor descriptions, topics) have their
whitespace runs, line breaks included, collapsed to one space; paths keep their
exact characters except line breaks, which are written as escapes (``\\n``),
and an HTML heading's ``<`` (:func:`~mimo_ctx._util.escape_path`). The texts that
are not a section body -- the boundary's two parts, the recent-activity lines and
the closing reminder -- are single lines or paths of this kind, with the same
``&lt;`` for an HTML heading.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx._structure import (
    HEADING_ACTIVE_ACTORS,
    HEADING_CHECKPOINT,
    HEADING_GLOBAL_MEMORY,
    HEADING_MEMORY_KEYS,
    HEADING_NOTES,
    HEADING_PROJECT_MEMORY,
    HEADING_REBUILD_FOCUS,
    HEADING_RECENT_ACTIVITY,
    HEADING_RECENT_USER,
    HEADING_TASKS,
    SECTION_HEADINGS,
    neutralise_structure,
    normalise_line_breaks,
    our_heading,
    render_section,
    strip_level1_headings,
)
from mimo_ctx._util import ago, escape_html_headings, escape_path, one_line
from mimo_ctx.errors import ConfigError, PathEscapeError
from mimo_ctx.messages import Message, user_input_text
from mimo_ctx.session import ACTIVE_ACTOR_STATUSES, Actor, Task
from mimo_ctx.tokens import TokenCounter, count_with, utf16_head, utf16_tail

__all__ = [
    "ACTORS_PART_HEADING",
    "BODY_INTRO",
    "CHECKPOINT_INDEX_HEADING",
    "ELISION_LINE",
    "FOCUS_INTRO",
    "HEADING_ACTIVE_ACTORS",
    "HEADING_CHECKPOINT",
    "HEADING_GLOBAL_MEMORY",
    "HEADING_MEMORY_KEYS",
    "HEADING_NOTES",
    "HEADING_PROJECT_MEMORY",
    "HEADING_REBUILD_FOCUS",
    "HEADING_RECENT_ACTIVITY",
    "HEADING_RECENT_USER",
    "HEADING_TASKS",
    "LEDGER_TRUNCATION_NOTICE",
    "SECTION_HEADINGS",
    "TASK_STATUS_ICONS",
    "RecentUserInput",
    "is_our_heading",
    "neutralise_structure",
    "normalise_line_breaks",
    "recent_user_input",
    "render_active_actors_part",
    "render_active_actors_section",
    "render_checkpoint_index",
    "render_focus",
    "render_host_section",
    "render_memory_keys_index",
    "render_recent_user_input",
    "render_section",
    "render_tasks_ledger",
    "strip_level1_headings",
]

BODY_INTRO: Final = (
    "The sections below are auto-loaded session context already in this message. "
    "File-backed sections list their path on a `File:` line — Grep that path for "
    "specific facts; do not Read the whole file again."
)
"""The fixed first sentence of the rebuild body (SPEC R5.2), verbatim."""

FOCUS_INTRO: Final = "What the user asked this rebuild to focus on, verbatim:"

CHECKPOINT_INDEX_HEADING: Final = "## Checkpoint"
"""Heading of the boundary's checkpoint index part (A5)."""

ACTORS_PART_HEADING: Final = "## Active Actors"
"""Heading of the boundary's active-actors part (A15)."""

TASK_STATUS_ICONS: Final[dict[str, str]] = {
    "open": "🔵",
    "in_progress": "🔄",
    "blocked": "🟡",
    "done": "✅",
    "abandoned": "❌",
    # Not in the original's table (A6); ours.
    "dispatched": "📤",
    "human_review": "👀",
    "failed": "⛔",
}
"""Ledger icons per task status (A6; ``dispatched``, ``human_review``, ``failed`` ours)."""

LEDGER_TRUNCATION_NOTICE: Final = "[ledger truncated; use the task tool to list all tasks]"
"""Last line of a ledger cut to its character cap (fits the 60 characters reserved)."""

ELISION_LINE: Final = (
    "[…elided {tokens} tokens; messageID={message_id}; "
    "use the history tool with operation=around to fetch full content]"
)
"""The line between head and tail of a long user message (A7); ``str.format`` fields."""

_LEDGER_RESERVE: Final = 60
_TOPIC_LINE = re.compile(r"^Topic:[ \t]*(\S.*?)\s*$")
_TOPIC_MAX_CHARS: Final = 300
# -- small helpers -----------------------------------------------------------------------


def _check_tokens(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")


def _natural_key(task_id: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key putting ``T2`` before ``T10`` and ``T1.2`` before ``T1.10``."""
    chunks = re.split(r"([0-9]+)", task_id)
    return tuple((0, int(c), "") if "0" <= c[0] <= "9" else (1, 0, c) for c in chunks if c)


def _fit_lines(lines: Iterable[str], budget: int, count: Callable[[str], int]) -> list[str]:
    """Lines in order while the joined text stays within ``budget``; stop at the first misfit.

    ``lines`` may be a generator: nothing past the first misfit is asked for.
    """
    kept: list[str] = []
    for line in lines:
        if count("\n".join([*kept, line])) > budget:
            break
        kept.append(line)
    return kept


def _active_actors(actors: Sequence[Actor], session_id: str) -> list[Actor]:
    # Defence in depth (R5.4 beyond): the store already filters by session, but a
    # caller's mistake must not leak another session's actors into this prompt.
    mine = [
        a
        for a in actors
        if a.session_id == session_id and a.background and a.status in ACTIVE_ACTOR_STATUSES
    ]
    return sorted(mine, key=lambda a: (a.time_created, a.id))


# -- 1. tasks ledger -----------------------------------------------------------------------


def _root_of(task: Task, by_id: dict[str, Task]) -> str:
    seen = {task.id}
    current = task
    while current.parent_id is not None and current.parent_id in by_id:
        if current.parent_id in seen:
            # A parent cycle (corrupt data): treat the task as top-level.
            return task.id
        seen.add(current.parent_id)
        current = by_id[current.parent_id]
    return current.id


def render_tasks_ledger(tasks: Sequence[Task], *, cap_chars: int) -> str:
    """Render section 1, ``# Tasks ledger`` (R5.3, A6); always emitted.

    The body is ``(none)`` without tasks. Otherwise, per top-level task in natural
    id order (``T2`` before ``T10``), ``- <id> <status> — <summary>`` (just
    ``- <id> <status>`` for an empty summary), and for a task with descendants one
    more line ``  Subtasks: <icon><id> / <icon><id> …`` listing *all* its
    descendants, however deep, in natural id order, with the icons of
    :data:`TASK_STATUS_ICONS`. A task whose parent is not in ``tasks`` (or whose
    parents form a cycle) counts as top-level. Finished tasks are listed too.

    A body longer than ``cap_chars`` characters is cut to ``cap_chars - 60``
    characters, back to the last whole line when there is one, and
    :data:`LEDGER_TRUNCATION_NOTICE` is added as its last line, so the body never
    exceeds ``max(cap_chars, 60)`` characters.

    Args:
        tasks: The session's tasks, terminal ones included.
        cap_chars: The ``tasks_ledger`` cap, in characters.

    Raises:
        ConfigError: ``cap_chars`` is negative.
    """
    _check_tokens(cap_chars, "cap_chars")
    by_id = {t.id: t for t in tasks}
    children: dict[str, list[Task]] = {}
    roots: list[Task] = []
    for task in by_id.values():
        root = _root_of(task, by_id)
        if root == task.id:
            roots.append(task)
        else:
            children.setdefault(root, []).append(task)

    lines: list[str] = []
    for task in sorted(roots, key=lambda t: _natural_key(t.id)):
        summary = one_line(task.summary)
        line = f"- {one_line(task.id)} {task.status}"
        lines.append(f"{line} — {summary}" if summary else line)
        descendants = sorted(children.get(task.id, []), key=lambda t: _natural_key(t.id))
        if descendants:
            items = " / ".join(
                f"{TASK_STATUS_ICONS.get(d.status, '')}{one_line(d.id)}" for d in descendants
            )
            lines.append(f"  Subtasks: {items}")
    body = "\n".join(lines) if lines else "(none)"

    if len(body) > cap_chars:
        keep = max(0, cap_chars - _LEDGER_RESERVE)
        newline = body.rfind("\n", 0, keep + 1)
        head = body[:newline] if newline > 0 else body[:keep]
        body = f"{head}\n{LEDGER_TRUNCATION_NOTICE}" if head else LEDGER_TRUNCATION_NOTICE
    return render_section(HEADING_TASKS, body)


# -- 3. active actors ------------------------------------------------------------------------


def render_active_actors_section(
    actors: Sequence[Actor],
    *,
    session_id: str,
    budget: int,
    counter: TokenCounter | None = None,
) -> str:
    """Render section 3, ``# Active actors`` (R5.3, R5.4, A6).

    Only actors of ``session_id`` (R5.4 **beyond**: filtered here as well as in
    the store) that run in the background with status pending or running, oldest
    first, one line each: ``- <actor_id> — <status>, "<description>"
    (agent=<agent>)``. Lines are added while the body stays within ``budget``
    tokens; the first line that does not fit ends the list.

    Args:
        actors: Candidate actors (normally the store's active actors of the session).
        session_id: The session being rebuilt.
        budget: The ``actor_ledger`` cap, in tokens.
        counter: Token counter; defaults to the chars/4 estimate.

    Returns:
        The section, or ``""`` when no actor qualifies or the first line does not fit.

    Raises:
        ConfigError: ``budget`` is negative.
    """
    _check_tokens(budget, "budget")
    lines = [
        f'- {one_line(a.id)} — {a.status}, "{one_line(a.description)}" (agent={one_line(a.agent)})'
        for a in _active_actors(actors, session_id)
    ]
    kept = _fit_lines(lines, budget, count_with(counter))
    return render_section(HEADING_ACTIVE_ACTORS, "\n".join(kept)) if kept else ""


def render_active_actors_part(actors: Sequence[Actor], *, session_id: str, now_ms: int) -> str:
    """Render the boundary's ``## Active Actors`` part (R4.4, A15).

    Lists this session's background actors with status pending or running (the
    same filter as section 3), oldest first::

        ## Active Actors
        This session has 2 background actors; reach them through the `actor` tool.
        - act_1 — running, last active 3m ago: "index the repo" (agent=explore)

    Without such actors the part is ``## Active Actors`` and the line
    ``No background actors are running in this session.`` (our choice: the model
    learns that nothing is running rather than guessing from a missing part).

    Args:
        actors: Candidate actors.
        session_id: The session being rebuilt.
        now_ms: The current time in epoch ms, for "last active ... ago".
    """
    mine = _active_actors(actors, session_id)
    if not mine:
        return f"{ACTORS_PART_HEADING}\nNo background actors are running in this session."
    noun = "actor" if len(mine) == 1 else "actors"
    lines = [
        ACTORS_PART_HEADING,
        f"This session has {len(mine)} background {noun}; reach them through the `actor` tool.",
    ]
    lines.extend(
        f"- {one_line(a.id)} — {a.status}, last active {ago(now_ms - a.time_last_activity)}: "
        f'"{one_line(a.description)}" (agent={one_line(a.agent)})'
        for a in mine
    )
    # Not a section (no neutralise_structure): its one-line fields still must not
    # hold an HTML heading.
    return escape_html_headings("\n".join(lines))


# -- 4. recent user input --------------------------------------------------------------------


def _elide(text: str, message_id: str, cap: int, count: Callable[[str], int]) -> str:
    """Keep the head and tail of a message over ``cap`` tokens (A7).

    Head and tail are ``floor(cap*0.6)*4`` and ``floor(cap*0.3)*4`` UTF-16 code
    units, as the original counts them, so a message full of emoji keeps its share.
    """
    head_tokens, tail_tokens = cap * 6 // 10, cap * 3 // 10
    head_units, tail_units = head_tokens * 4, tail_tokens * 4
    head = utf16_head(text, head_units)
    # With the default estimator these cuts are within the token shares; a real
    # tokenizer can count more per character, so shrink until they are.
    while head and count(head) > head_tokens:
        head_units = head_units * 9 // 10
        head = utf16_head(text, head_units)
    rest = text[len(head) :]
    tail = utf16_tail(rest, tail_units)
    while tail and count(tail) > tail_tokens:
        tail_units = tail_units * 9 // 10
        tail = utf16_tail(rest, tail_units)
    elided = max(0, count(text) - count(head) - count(tail))
    line = ELISION_LINE.format(tokens=elided, message_id=one_line(message_id))
    return "\n".join(p for p in (head, line, tail) if p)


def _user_entry(
    message_id: str,
    text: str,
    cap: int,
    count: Callable[[str], int],
    notes: Mapping[str, str] | None,
) -> str:
    """One entry of section 4: the header line and the (elided) text, neutralised."""
    if count(text) > cap:
        text = _elide(text, message_id, cap, count)
    note = (notes or {}).get(message_id)
    header = f"{one_line(message_id)} — {one_line(note)}" if note else one_line(message_id)
    return neutralise_structure(f"[user message {header}]\n{text}")


_ENTRY_CACHE_TEXT: Final = 32_768
"""Entries of user messages up to this many characters are remembered between rebuilds."""


def _counted_entry(
    message_id: str, text: str, cap: int, counter: TokenCounter | None, note: str | None
) -> tuple[str, int]:
    """:func:`_user_entry` and its tokens, remembered for the next rebuild.

    The same user messages are quoted rebuild after rebuild: each one's entry is
    elided, neutralised and counted once. Counters are pure (the protocol), so an
    entry depends on nothing else; one that cannot be a dictionary key, or a text
    too long to hold on to, is worked out every time.
    """
    if len(text) <= _ENTRY_CACHE_TEXT:
        try:
            return _remembered_entry(message_id, text, cap, counter, note)
        except TypeError:  # an unhashable counter
            pass
    return _entry_tokens(message_id, text, cap, counter, note)


def _entry_tokens(
    message_id: str, text: str, cap: int, counter: TokenCounter | None, note: str | None
) -> tuple[str, int]:
    count = count_with(counter)
    entry = _user_entry(message_id, text, cap, count, {message_id: note} if note else None)
    return entry, count(entry)


_remembered_entry: Final = functools.lru_cache(maxsize=256)(_entry_tokens)


@dataclass(frozen=True, slots=True)
class RecentUserInput:
    """Section 4 as rendered and the messages it quotes.

    Attributes:
        text: The section (``""`` when omitted).
        quoted: Ids of the user messages it quotes.
    """

    text: str
    quoted: frozenset[str]


def render_recent_user_input(
    messages: Sequence[Message],
    *,
    budget: int,
    per_message_cap: int,
    counter: TokenCounter | None = None,
    pinned: Collection[str] = (),
    notes: Mapping[str, str] | None = None,
) -> str:
    """The text of :func:`recent_user_input` (section 4)."""
    return recent_user_input(
        messages,
        budget=budget,
        per_message_cap=per_message_cap,
        counter=counter,
        pinned=pinned,
        notes=notes,
    ).text


def recent_user_input(
    messages: Sequence[Message],
    *,
    budget: int,
    per_message_cap: int,
    counter: TokenCounter | None = None,
    pinned: Collection[str] = (),
    notes: Mapping[str, str] | None = None,
) -> RecentUserInput:
    """Render section 4, ``# Recent user input (verbatim)`` (R5.5, A7).

    ``messages`` are candidates from the whole main history (the caller reads the
    newest user messages through :meth:`~mimo_ctx.store.base.Store.list_user_messages`
    and the task-defining request among the oldest). A message qualifies when
    :func:`~mimo_ctx.messages.user_input_text` finds typed words in it. A text over
    ``per_message_cap`` tokens keeps its first ``floor(cap*0.6)*4`` and last
    ``floor(cap*0.3)*4`` UTF-16 code units (characters as JavaScript counts them)
    with :data:`ELISION_LINE` between them, where ``N`` = the message's tokens minus
    the tokens of the kept head and tail.

    Each entry is ``[user message <id>]`` on its own line (``[user message <id> —
    <note>]`` when ``notes`` has one for it) followed by the text, passed through
    :func:`neutralise_structure`; entries are separated by a blank line. The
    ``pinned`` messages (the session's task-defining request) are taken first, then
    the others newest first, while the body stays within ``budget`` tokens (the
    first that does not fit ends the walk); they are shown oldest first.

    Args:
        messages: Candidate messages, oldest first.
        budget: The ``recent_user`` cap in tokens; 0 disables the section.
        per_message_cap: The ``recent_user_per_msg`` cap in tokens.
        counter: Token counter; defaults to the chars/4 estimate.
        pinned: Ids of messages taken before the newest ones.
        notes: A short note per message id for its header line.

    Returns:
        The section (``""`` when nothing qualifies or fits) and the ids it quotes.

    Raises:
        ConfigError: ``budget`` or ``per_message_cap`` is negative.
    """
    _check_tokens(budget, "budget")
    _check_tokens(per_message_cap, "per_message_cap")
    if budget == 0:
        return RecentUserInput("", frozenset())
    count = count_with(counter)
    texts = [(p, t) for p, t in enumerate(map(user_input_text, messages)) if t is not None]
    wanted = set(pinned)
    order = [e for e in texts if messages[e[0]].id in wanted]
    order += [e for e in reversed(texts) if messages[e[0]].id not in wanted]
    chosen: list[tuple[int, str]] = []
    used = 0
    for position, text in order:
        # Entries are formatted in walk order, only as far as the walk goes: the
        # candidates reach back further than the budget (the oldest are rarely
        # taken), and elision and neutralising are the costly part.
        entry, tokens = _counted_entry(
            messages[position].id,
            text,
            per_message_cap,
            counter,
            (notes or {}).get(messages[position].id),
        )
        # A running sum keeps the walk linear; the joined text is checked below.
        cost = tokens + (1 if chosen else 0)
        if used + cost > budget:
            break
        chosen.append((position, entry))
        used += cost
    chosen.sort()
    while chosen and count("\n\n".join(e for _, e in chosen)) > budget:
        chosen.pop(0)  # a tokenizer that merges across the joins: drop the oldest
    if not chosen:
        return RecentUserInput("", frozenset())
    text = render_section(HEADING_RECENT_USER, "\n\n".join(e for _, e in chosen))
    return RecentUserInput(text, frozenset(messages[p].id for p, _ in chosen))


# -- ours: the rebuild focus and the host's section -------------------------------------------


def is_our_heading(title: str) -> bool:
    """True when ``title`` is (any spacing or case) one of the headings the boundary uses."""
    return our_heading(f"# {title}")


def _cut_to(text: str, budget: int, count: Callable[[str], int]) -> str:
    """``text`` whole if it fits ``budget``, else its head and a line saying what was cut."""
    total = count(text)
    if total <= budget:
        return text
    notice = "[… {} more tokens were cut here]"
    room = max(0, budget - count(notice.format(total)))
    # Four characters a token, then back to a word boundary when one is near.
    head = text[: room * 4]
    while head and count(head) > room:
        head = head[: len(head) * 9 // 10]
    space = head.rfind(" ")
    if space > len(head) * 3 // 4:
        head = head[:space]
    head = head.rstrip()
    return f"{head}\n{notice.format(total - count(head))}" if head else notice.format(total)


def render_focus(focus: str, *, budget: int, counter: TokenCounter | None = None) -> str:
    """The ``# Rebuild focus`` section: the user's focus text, verbatim, under ``budget``.

    ``""`` for a blank focus or a zero budget. Over the budget the text keeps its
    head and says how much was cut (the checkpoint writer had it in full).
    """
    _check_tokens(budget, "rebuild_focus budget")
    count = count_with(counter)
    if not focus.strip() or budget == 0:
        return ""
    room = budget - count(f"# {HEADING_REBUILD_FOCUS}\n{FOCUS_INTRO}\n")
    if room <= 0:
        return ""
    return render_section(
        HEADING_REBUILD_FOCUS, f"{FOCUS_INTRO}\n{_cut_to(focus.strip(), room, count)}"
    )


def render_host_section(
    heading: str, text: str, *, budget: int, counter: TokenCounter | None = None
) -> str:
    """The host's own section (a ``before_rebuild`` hook's), under ``budget`` tokens.

    ``""`` for a blank text or a zero budget; over the budget the head is kept.
    """
    _check_tokens(budget, "host_section budget")
    count = count_with(counter)
    if not text.strip() or budget == 0:
        return ""
    room = budget - count(f"# {heading}\n")
    if room <= 0:
        return ""
    return render_section(heading, _cut_to(text.strip(), room, count))


# -- 8. memory keys index ----------------------------------------------------------------------


def render_memory_keys_index(
    paths: Sequence[str], *, budget: int, counter: TokenCounter | None = None
) -> str:
    """Render section 8, ``# Memory keys index`` (R5.6, A6).

    One line ``- <path>`` per path, in the given order, duplicates dropped, while
    the body stays within ``budget`` tokens; the first line that does not fit
    ends the list. The caller reconciles the index with the disk and leaves out
    the files injected elsewhere (R5.6); line breaks in a name are written as
    escapes.

    Args:
        paths: Paths relative to the memory root, ``/``-separated.
        budget: The ``memory_titles`` cap, in tokens.
        counter: Token counter; defaults to the chars/4 estimate.

    Returns:
        The section, or ``""`` when there is no path or the first does not fit.

    Raises:
        ConfigError: ``budget`` is negative.
        PathEscapeError: A path is absolute or has a ``..`` component (R5.6).
    """
    _check_tokens(budget, "budget")
    # Every path is checked; lines are made only as far as the budget reaches (a
    # project's directory can hold thousands of files, the section a few dozen).
    for path in paths:
        if not path or _ABSOLUTE_KEY.match(path):
            raise PathEscapeError(f"memory key path must be relative to the memory root: {path!r}")
        if ".." in path and _PARENT_STEP.search(path):
            raise PathEscapeError(f"memory key path escapes the memory root: {path!r}")
    kept = _fit_lines(_key_lines(paths), budget, count_with(counter))
    return render_section(HEADING_MEMORY_KEYS, "\n".join(kept)) if kept else ""


_ABSOLUTE_KEY: Final = re.compile(r"[/\\]|[A-Za-z]:")
"""The start of an absolute path (a separator or a drive letter)."""
_PARENT_STEP: Final = re.compile(r"(?:^|[/\\])\.\.(?:[/\\]|\Z)")
"""A ``..`` component, between ``/`` or ``\\`` separators."""


def _key_lines(paths: Sequence[str]) -> Iterator[str]:
    seen: set[str] = set()
    for path in paths:
        if path not in seen:
            seen.add(path)
            yield f"- {escape_path(path)}"


# -- boundary index part -----------------------------------------------------------------------


def render_checkpoint_index(*, directory: str | None, checkpoint_text: str | None) -> str:
    """Render the boundary's ``## Checkpoint`` index part (R4.4, A5).

    With a checkpoint::

        ## Checkpoint
        Directory: <directory>
        Current topic: <topic>
        The checkpoint itself is in the `# Session checkpoint` section below.

    The topic is the text of the first line of ``checkpoint_text`` matching
    ``Topic: <text>`` (collapsed to one line, at most 300 characters), else
    ``(unknown)``; a missing directory reads ``(unknown)``. Without a checkpoint
    (``checkpoint_text`` ``None`` or blank) the part is the heading plus the one
    line ``No checkpoints yet.``.

    Args:
        directory: The session's checkpoint directory.
        checkpoint_text: The content of ``checkpoint.md``.
    """
    if checkpoint_text is None or not checkpoint_text.strip():
        return f"{CHECKPOINT_INDEX_HEADING}\nNo checkpoints yet."
    topic = "(unknown)"
    for line in checkpoint_text.splitlines():
        match = _TOPIC_LINE.match(line)
        if match:
            topic = escape_html_headings(one_line(match.group(1)))
            if len(topic) > _TOPIC_MAX_CHARS:
                topic = topic[: _TOPIC_MAX_CHARS - 1] + "…"
            break
    where = escape_path(directory) if directory else "(unknown)"
    return (
        f"{CHECKPOINT_INDEX_HEADING}\n"
        f"Directory: {where}\n"
        f"Current topic: {topic}\n"
        f"The checkpoint itself is in the `# {HEADING_CHECKPOINT}` section below."
    )
