"""The store reads a rebuild makes before it renders, in one call where the store can.

Private to the rebuild (:mod:`mimo_ctx.rebuild`, :mod:`mimo_ctx.render`): the
task registry, the active actors, the messages since the watermark that the
live window does not hold, and the user messages of "Recent user input" that it
does not hold either. Each call to a store's worker thread is a hand-off and a
wake-up of the event loop; a store that offers :meth:`read_for_rebuild` answers
them all in one (the SQLite store, on one snapshot), any other store is asked
one method at a time (:func:`read_one_by_one`), with the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from mimo_ctx.messages import Message
from mimo_ctx.session import Actor, Task
from mimo_ctx.store.base import Store

__all__ = [
    "RebuildReadRequest",
    "RebuildReads",
    "UserRead",
    "read_for_rebuild",
    "read_one_by_one",
]


@dataclass(frozen=True, slots=True)
class UserRead:
    """One :meth:`~mimo_ctx.store.base.Store.list_user_messages` call of the main agent."""

    first: int | None = None
    last: int | None = None
    before: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class RebuildReadRequest:
    """What a rebuild reads from the store before it renders.

    Attributes:
        session_id: The session rebuilt.
        since: Messages are listed from this ``(time_created, id)`` key on (every agent).
        exclude_agent: Leave this agent's messages out of that listing (the main
            agent's, which the live window holds); ``None``: list them too.
        users: The user-message reads "Recent user input" starts with.
    """

    session_id: str
    since: tuple[int, str]
    exclude_agent: str | None = None
    users: tuple[UserRead, ...] = ()


@dataclass(frozen=True, slots=True)
class RebuildReads:
    """The answers to a :class:`RebuildReadRequest`.

    Attributes:
        tasks: The session's tasks, as :meth:`~mimo_ctx.store.base.Store.list_tasks` lists them.
        actors: Its active actors (``list_actors(active_only=True)``).
        since: The messages listed from ``since`` on.
        users: The answer to each of the request's user-message reads.
    """

    tasks: list[Task]
    actors: list[Actor]
    since: list[Message]
    users: Mapping[UserRead, list[Message]] = field(default_factory=dict[UserRead, list[Message]])


@runtime_checkable
class _ReadsInOneCall(Protocol):
    async def read_for_rebuild(self, request: RebuildReadRequest) -> RebuildReads: ...


async def read_for_rebuild(store: Store, request: RebuildReadRequest) -> RebuildReads:
    """The answers to ``request``: in one call where ``store`` offers it, else one by one."""
    if isinstance(store, _ReadsInOneCall):
        return await store.read_for_rebuild(request)
    return await read_one_by_one(store, request)


async def read_one_by_one(store: Store, request: RebuildReadRequest) -> RebuildReads:
    """The answers to ``request`` from the store's own methods, one call each."""
    session_id = request.session_id
    since = await store.list_messages(
        session_id, agent=None, since=request.since, exclude_agent=request.exclude_agent
    )
    actors = await store.list_actors(session_id, active_only=True)
    tasks = await store.list_tasks(session_id)
    users = {
        read: await store.list_user_messages(
            session_id, first=read.first, last=read.last, before=read.before
        )
        for read in request.users
    }
    return RebuildReads(tasks=tasks, actors=actors, since=since, users=users)
