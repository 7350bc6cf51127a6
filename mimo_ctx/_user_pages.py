"""The user messages of "Recent user input", page by page (private to :mod:`mimo_ctx.render`).

The pages are what :meth:`~mimo_ctx.store.base.Store.list_user_messages` lists;
the messages the caller holds live answer most of them, and the first reads are
made beforehand with the rebuild's other store reads (:mod:`mimo_ctx.store._reads`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx._window import LiveWindow
from mimo_ctx.config import RebuildConfig
from mimo_ctx.messages import Message, message_key
from mimo_ctx.store._reads import UserRead
from mimo_ctx.store.base import Store

__all__ = ["USER_PAGE", "LiveUsers", "UserPages", "first_user_reads", "held_users"]

USER_PAGE: Final = 50
"""User messages read per store call while filling "Recent user input"."""


@dataclass(frozen=True, slots=True)
class LiveUsers:
    """The main agent's user messages a caller holds live, for "Recent user input".

    Attributes:
        after: Every user message the store lists after this ``(time_created, id)``
            key is in ``messages`` (``None``: every one of the session).
        messages: Those messages, boundaries left out, oldest first, as the store
            lists them (:meth:`~mimo_ctx.store.base.Store.list_user_messages`).
    """

    after: tuple[int, str] | None
    messages: Sequence[Message]


def held_users(window: LiveWindow | None) -> LiveUsers | None:
    """The user messages a live window holds (every one after its start); ``None``
    for a window not loaded."""
    if window is None or not window.loaded:
        return None
    users = [m for m in window.messages if m.role == "user" and not m.is_boundary]
    return LiveUsers(after=window.start, messages=users)


class _HeldUsers:
    """Which part of a user-message read the caller's live messages answer."""

    def __init__(self, live: LiveUsers | None) -> None:
        self.live = live
        self._keys = [message_key(m) for m in live.messages] if live is not None else []

    def older_read(
        self, last: int, before: tuple[int, str] | None
    ) -> tuple[list[Message], UserRead | None]:
        """The held part of the newest ``last`` before ``before``, and the store read
        of the rest (``None``: the held messages are the whole answer)."""
        live = self.live
        if live is None:
            return [], UserRead(last=last, before=before)
        end = len(self._keys) if before is None else bisect_left(self._keys, before)
        held = list(live.messages[max(0, end - last) : end])
        if len(held) == last or live.after is None:
            return held, None
        rest = UserRead(last=last - len(held), before=message_key(held[0]) if held else before)
        return held, rest

    def oldest_read(self, first: int) -> UserRead | None:
        """The store read of the oldest ``first`` (``None``: the held messages answer it)."""
        live = self.live
        return None if live is not None and live.after is None else UserRead(first=first)


class UserPages:
    """:meth:`~mimo_ctx.store.base.Store.list_user_messages` answered from held messages.

    Whatever of a page lies after ``live.after`` is taken from ``live.messages``
    (every one the store lists there, so the page is the same); the store is read
    only for the older part, in one call, unless ``known`` holds its answer (read
    beforehand with the rebuild's other reads).
    """

    def __init__(
        self,
        store: Store,
        session_id: str,
        live: LiveUsers | None,
        known: Mapping[UserRead, list[Message]],
    ) -> None:
        self._store = store
        self._session_id = session_id
        self._held = _HeldUsers(live)
        self._known = known

    async def _read(self, read: UserRead) -> list[Message]:
        known = self._known.get(read)
        if known is not None:
            return known
        return await self._store.list_user_messages(
            self._session_id, first=read.first, last=read.last, before=read.before
        )

    async def newest(self, last: int, before: tuple[int, str] | None) -> list[Message]:
        """The newest ``last`` user messages listed before ``before`` (all when ``None``)."""
        held, read = self._held.older_read(last, before)
        return held if read is None else [*await self._read(read), *held]

    async def oldest(self, first: int) -> list[Message]:
        """The oldest ``first`` user messages of the session."""
        read = self._held.oldest_read(first)
        if read is not None:
            return await self._read(read)
        live = self._held.live
        return list(live.messages[:first]) if live is not None else []


def first_user_reads(live: LiveUsers | None, config: RebuildConfig) -> tuple[UserRead, ...]:
    """The store reads "Recent user input" starts with: its newest page's part that
    ``live`` does not hold, and the first look for the pinned request (when ``live``
    does not hold the session's first user message)."""
    if not config.recent_user_window or not config.push_caps.recent_user:
        return ()
    held = _HeldUsers(live)
    page = min(USER_PAGE, config.recent_user_window)
    reads = (held.older_read(page, None)[1], held.oldest_read(1))
    return tuple(r for r in reads if r is not None)
