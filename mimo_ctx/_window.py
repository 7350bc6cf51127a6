"""The live window of a session and the request view built from it (SPEC R8.1, R2.2).

Private step of :class:`~mimo_ctx.middleware.ContextMiddleware`. A *live window*
holds one agent's messages from the newest boundary's watermark on, kept
current from the store's change feed, so a turn costs O(new messages) instead
of O(history). The *view* is what of that window is sent: the newest boundary,
the collapsed tail (R7.3), the send rules (A10) and the per-turn reminder on the
last user message (R8.3, in memory only). The last view is extended in place
while messages are only appended at the end (the common turn).

:class:`LiveSession` is the per-session, per-process state the middleware
keeps (one lock, the windows of each agent, the frozen prefix); :class:`Windows`
loads, refreshes and adopts windows and builds views over one store.
"""

from __future__ import annotations

import asyncio
import os
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread

from mimo_ctx.checkpoint.protocol import SentRequest
from mimo_ctx.digest import collapse_checkpoint_tail
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart, message_key, written_after
from mimo_ctx.reminders import per_turn_reminder_part, with_per_turn_reminder
from mimo_ctx.session import RequestPrefix, Session
from mimo_ctx.store.base import Store
from mimo_ctx.tokens import (
    estimate_message_tokens,
    estimate_part_tokens,
    estimate_text_tokens,
    js_json,
)
from mimo_ctx.triggers import is_recovered
from mimo_ctx.view import IncrementalView, apply_send_rules

__all__ = [
    "MEMORY_RECHECK_SECONDS",
    "PREPARED_KEPT",
    "SEQ_PROBE",
    "LiveSession",
    "LiveWindow",
    "SentOn",
    "WindowView",
    "Windows",
    "message_key",
    "session_time",
]

MEMORY_RECHECK_SECONDS = 1.0
"""How stale "this session has no memory files or tasks" may be (R8.3 reminder).

Measured on the session's own clock (:func:`session_time`), never the wall
clock, so a replay of a transcript gives the same requests on any machine.
"""

PREPARED_KEPT = 4096
"""Tasks whose last view's boundary a session remembers (for overflow handling)."""

SEQ_PROBE = 2**62
"""A change-feed position past any real one: ``changes_since`` then returns only the head."""


def session_time(window: LiveWindow) -> int:
    """The session's own clock for a window: the creation time of its newest message (ms).

    Live, messages are stamped with the wall clock as they are made; in a replay
    they carry the transcript's times. ``0`` for an empty window.
    """
    if window.messages:
        return window.messages[-1].time_created
    return window.boundary.time_created if window.boundary is not None else 0


@dataclass(slots=True)
class LiveWindow:
    """The live part of one agent's history, kept current from the change feed."""

    agent: str
    seq: int = 0
    boundary: Message | None = None
    start: tuple[int, str] | None = None
    messages: list[Message] = field(default_factory=list[Message])
    keys: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])
    last_finished: Message | None = None
    newest_id: str | None = None
    loaded: bool = False
    # The view, kept current in O(changes): `changed` is the first index of
    # `messages` written since the last view (appends, updates and insertions all
    # leave the view valid up to there); `placed` holds, per message the view took
    # in (after the boundary), its index in `messages`.
    engine: IncrementalView | None = None
    placed: list[int] = field(default_factory=list[int])
    changed: int = 0
    # The last message that carried the per-turn reminder and its copy, so the
    # copy (and its token estimate) is made once, not every turn (R8.3).
    reminder: tuple[Message, Message] | None = None

    @property
    def usage_key(self) -> str:
        """The key of the usage a rebuild of this window recovers (once per usage, R1.4)."""
        return self.last_finished.id if self.last_finished else f"start:{self.agent}"

    @property
    def recovered(self) -> bool:
        """True when the newest boundary already recovered the last usage (R1.4).

        Decided by the store's write order (see :func:`~mimo_ctx.triggers.is_recovered`).
        """
        return is_recovered(self.last_finished, self.boundary)

    def note_finished(self, message: Message) -> None:
        """Take ``message`` as the last finished assistant message when it is newer.

        "Newest" by the store's write order, never by ids (R1.4 as amended).
        """
        if (
            not message.off_branch
            and message.role == "assistant"
            and message.finish is not None
            and (self.last_finished is None or not written_after(self.last_finished, message))
        ):
            self.last_finished = message

    def live(self, message: Message) -> bool:
        """True when ``message`` lists after the watermark (it belongs to the window)."""
        return self.start is None or message_key(message) > self.start

    def put(self, message: Message) -> None:
        """Insert or replace ``message`` in listing order (an off-branch one leaves)."""
        key = message_key(message)
        index = bisect_left(self.keys, key)
        if message.off_branch:
            if index < len(self.keys) and self.keys[index] == key:
                del self.keys[index]
                del self.messages[index]
                self.changed = min(self.changed, index)
            return
        if index < len(self.keys) and self.keys[index] == key:
            self.messages[index] = message
        else:
            self.keys.insert(index, key)
            self.messages.insert(index, message)
        self.changed = min(self.changed, index)


@dataclass(slots=True)
class LiveSession:
    """What one process keeps per session: the lock every step runs under, windows, prefix."""

    # fast_acquire: taken without contention (every turn) the lock does not yield to
    # the loop; each step under it still checkpoints (a store call, a feed read).
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))
    windows: dict[str, LiveWindow] = field(default_factory=dict[str, LiveWindow])
    prefix: RequestPrefix | None = None
    prefix_tokens: int | None = None
    # Per-turn reminder sources (R8.3): once a session has memory files or tasks
    # it keeps them (nothing deletes them), so True is sticky; False is re-checked
    # at most once a second of the session's time (`session_time`) so the hot path
    # does not touch the disk every turn.
    has_memory: bool = False
    memory_checked: int | None = None
    # The boundary of the last view each task was given, per agent: which rebuild a
    # request that then overflowed was built on (R1.4; the newest entries kept).
    prepared: OrderedDict[tuple[int, str], str | None] = field(
        default_factory=OrderedDict[tuple[int, str], str | None]
    )
    # Overflows of a request built on (or not known to predate) the rebuild of its
    # usage answered "retry": once per (usage, boundary), so no caller can loop.
    overflow_retried: set[tuple[str, str | None]] = field(
        default_factory=set[tuple[str, str | None]]
    )
    # Estimated tokens of the last request prepared per agent: the input of an
    # answer's usage when the provider reports none.
    sent_tokens: dict[str, int] = field(default_factory=dict[str, int])
    # The main agent's last request (what a forked checkpoint writer resends).
    last_request: SentRequest | None = None
    # The per-turn reminder part and its estimate, made once: its text only names
    # the session's memory directory, and every turn with a new user message
    # appends it to a copy of that message (R8.3).
    reminder_part: tuple[TextPart, int] | None = None

    def note_view(self, window: LiveWindow) -> None:
        """Remember the boundary the calling task's view of ``window`` starts at."""
        key = (_task_id(), window.agent)
        self.prepared[key] = window.boundary.id if window.boundary is not None else None
        self.prepared.move_to_end(key)
        while len(self.prepared) > PREPARED_KEPT:
            self.prepared.popitem(last=False)

    def built_on(self, agent: str, boundary_id: str | None = None, *, known: bool) -> SentOn:
        """What a failed request of ``agent`` was built on: the caller's view when
        ``known``, else the last view this task was given, else unknown."""
        if known:
            return SentOn(boundary_id, known=True)
        key = (_task_id(), agent)
        if key in self.prepared:
            return SentOn(self.prepared[key], known=True)
        return SentOn(None, known=False)


@dataclass(frozen=True, slots=True)
class SentOn:
    """The boundary a request was built on (``known=False``: not known here)."""

    boundary_id: str | None
    known: bool


@dataclass(frozen=True, slots=True)
class WindowView:
    """What to send for a window: the frozen prefix, the messages, their estimated tokens.

    ``tokens`` counts the prefix too.
    """

    prefix: RequestPrefix
    messages: list[Message]
    tokens: int


class Windows:
    """Loads, refreshes and adopts live windows, and builds request views, over one store.

    Args:
        store: Where the history lives.
        layout: The memory layout (the per-turn reminder names the session's directory).
        session: Reads a session (for its frozen prefix), raising when it is unknown.
    """

    def __init__(
        self,
        store: Store,
        layout: MemoryLayout,
        session: Callable[[str], Awaitable[Session]],
    ) -> None:
        self._store = store
        self._layout = layout
        self._session = session

    async def refresh(self, session_id: str, state: LiveSession, agent: str) -> LiveWindow:
        """The agent's window, brought up to date with what was written since the last call."""
        window = state.windows.get(agent)
        if window is None or not window.loaded:
            window = await self.load(session_id, agent)
            state.windows[agent] = window
            return window
        changed, seq = await self._store.changes_since(session_id, window.seq)
        reload = False
        for message in changed:
            if message.agent != agent:
                continue
            if window.newest_id is None or message.id > window.newest_id:
                window.newest_id = message.id
            newest = {m.id for m in (window.last_finished, window.boundary) if m is not None}
            if message.off_branch and message.id in newest:
                # The host left the newest answer behind: the one before it counts.
                reload = True
                continue
            window.note_finished(message)
            if message.is_boundary and (
                window.boundary is None or written_after(message, window.boundary)
            ):
                reload = True
            elif window.live(message):
                window.put(message)
        if reload:
            # Until the reload has completed the window keeps its old change-feed
            # position: a cancellation during it (a host's turn timeout right after
            # another worker's rebuild) leaves the change to be seen again by the
            # next refresh, not skipped for good with the old boundary kept.
            window = await self.load(session_id, agent)
            state.windows[agent] = window
            return window
        window.seq = seq
        return window

    async def recorded(self, session_id: str, state: LiveSession, message: Message) -> LiveWindow:
        """The window of ``message``'s agent after the middleware stored it.

        A loaded window takes the usage from the message itself instead of reading
        back what was just written; the next refresh brings the message in from the
        change feed. A window not loaded yet is loaded.
        """
        window = state.windows.get(message.agent)
        if window is None or not window.loaded:
            return await self.refresh(session_id, state, message.agent)
        window.note_finished(message)
        return window

    async def load(self, session_id: str, agent: str) -> LiveWindow:
        """The agent's window read from the store: the newest boundary and what follows it."""
        store = self._store
        window = LiveWindow(agent=agent)
        _, window.seq = await store.changes_since(session_id, SEQ_PROBE)
        if agent == MAIN_AGENT:
            boundary = await store.latest_boundary(session_id)
        else:
            boundary = None
            for message in await store.list_messages(session_id, agent=agent):
                if message.is_boundary and (boundary is None or written_after(message, boundary)):
                    boundary = message
        window.boundary = boundary
        if boundary is not None:
            covered = boundary.covered_up_to
            watermark = await store.get_message(covered) if covered else None
            window.start = (
                message_key(watermark)
                if watermark is not None
                else (boundary.time_created - 1, "\uffff")
            )
        messages = await store.list_messages(session_id, agent=agent, since=window.start)
        for message in messages:
            if window.live(message):
                window.keys.append(message_key(message))
                window.messages.append(message)
        window.last_finished = await store.latest_finished_assistant(session_id, agent=agent)
        window.newest_id = max((m.id for m in messages), default=None)
        window.loaded = True
        return window

    @staticmethod
    def adopt(
        state: LiveSession,
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
        window = LiveWindow(agent=MAIN_AGENT, seq=old.seq, boundary=boundary, loaded=True)
        window.start = message_key(watermark)
        replaced = {m.id: m for m in compacted}
        for message in listed:
            if message.agent == MAIN_AGENT and window.live(message):
                current = replaced.get(message.id, message)
                window.keys.append(message_key(current))
                window.messages.append(current)
        window.put(boundary)
        window.last_finished = old.last_finished
        window.newest_id = max(old.newest_id or boundary.id, boundary.id)
        state.windows[MAIN_AGENT] = window

    def reminder_part(self, session_id: str, state: LiveSession) -> tuple[TextPart, int]:
        """The per-turn reminder part (R8.3) and its estimate, made once per session.

        Its text only names the session's memory directory: every view that appends
        it and every rebuild that counts it (the request after the insert carries
        it) share the one part kept in ``state``.
        """
        if state.reminder_part is None:
            part = per_turn_reminder_part(str(self._layout.session_dir(session_id)))
            state.reminder_part = (part, estimate_part_tokens(part))
        return state.reminder_part

    async def view(self, session_id: str, state: LiveSession, window: LiveWindow) -> WindowView:
        """What to send for ``window``: send rules applied and the per-turn reminder added."""
        prefix = state.prefix
        if prefix is None:
            # The prefix is frozen (R8.1): read once per process.
            session = await self._session(session_id)
            prefix = state.prefix = session.prefix or RequestPrefix()
        if state.prefix_tokens is None:
            state.prefix_tokens = estimate_text_tokens(prefix.system) + estimate_text_tokens(
                js_json(prefix.tools)
            )
        sendable, tokens, user = self._current(window)
        state.note_view(window)
        tokens += state.prefix_tokens
        # A new list: the caller may change it; the engine's stays as it is.
        sendable = list(sendable)
        if user >= 0 and await self._needs_reminder(session_id, state, window):
            source = sendable[user]
            cached = window.reminder
            if cached is not None and cached[0] is source:
                replaced = cached[1]
            else:
                part, part_tokens = self.reminder_part(session_id, state)
                replaced = with_per_turn_reminder(source, part)
                if replaced is not source:
                    # The estimate is a sum over parts: the copy's is the source's
                    # plus its reminder part's, not a new pass over the user's text.
                    replaced._token_estimate = (  # pyright: ignore[reportPrivateUsage]
                        estimate_message_tokens(source) + part_tokens
                    )
                window.reminder = (source, replaced)
            tokens += estimate_message_tokens(replaced) - estimate_message_tokens(source)
            sendable[user] = replaced
        return WindowView(prefix, sendable, tokens)

    @staticmethod
    def _current(window: LiveWindow) -> tuple[list[Message], int, int]:
        """The window's view, its tokens and the position of its last user message.

        The engine keeps the view of what it took in; only the messages from the
        first one written since (appended, updated or inserted) are taken back and
        taken in again: a turn costs O(new messages) whatever its shape. A new
        boundary, or a digested message with tool calls coming or going, builds it
        anew (SPEC R7.3's orphan rule looks at the whole tail).
        """
        boundary = window.boundary
        engine = window.engine
        changed = window.changed
        messages = window.messages
        if engine is not None and engine.boundary is boundary:
            keep = bisect_left(window.placed, changed)
            fresh = [(i, m) for i, m in enumerate(messages[changed:], changed) if not m.is_boundary]
            if engine.truncate(keep + (boundary is not None)) and engine.extend(
                [m for _, m in fresh]
            ):
                del window.placed[keep:]
                window.placed.extend(i for i, _ in fresh)
            else:
                engine = None
        if engine is None:
            live = [(i, m) for i, m in enumerate(messages) if not m.is_boundary]
            engine = window.engine = IncrementalView(
                boundary, [m for _, m in live], estimate_message_tokens
            )
            window.placed = [i for i, _ in live]
        window.changed = len(messages)
        return engine.messages, engine.tokens, engine.users[-1] if engine.users else -1

    @staticmethod
    def full_view(window: LiveWindow, boundary: Message | None) -> tuple[list[Message], int]:
        """The view computed from the whole window (what the engine keeps, for tests)."""
        # Older boundaries that still list after the watermark are not resent:
        # the newest boundary supersedes them.
        live = [m for m in window.messages if not m.is_boundary]
        ordered = [boundary, *live] if boundary is not None else live
        sendable = apply_send_rules(collapse_checkpoint_tail(ordered))
        return sendable, sum(estimate_message_tokens(m) for m in sendable)

    async def _needs_reminder(
        self, session_id: str, state: LiveSession, window: LiveWindow
    ) -> bool:
        # R8.3 / A12: only when the session has memory files or tasks.
        if state.has_memory:
            return True
        # The session's own clock, not the wall clock: a replay (which runs on the
        # transcript's times) then decides exactly as the live agent did, however
        # fast or loaded the machine is.
        now = session_time(window)
        checked = state.memory_checked
        if checked is not None and now - checked < MEMORY_RECHECK_SECONDS * 1000:
            return False
        state.memory_checked = now
        directory = self._layout.session_dir(session_id)
        try:
            has_files = await anyio.to_thread.run_sync(_dir_has_entries, directory)
        except OSError:
            has_files = False
        state.has_memory = has_files or bool(await self._store.list_tasks(session_id))
        return state.has_memory


def _task_id() -> int:
    """``anyio.get_current_task().id`` without the task description it builds (every
    ``prepare()`` asks): on asyncio that id is the task object's own."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop running here
        task = None
    return id(task) if task is not None else anyio.get_current_task().id


def _dir_has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False
