"""The storage contract every store implements.

A store is the single source of truth for sessions, messages, tasks and actors
(the models live in :mod:`mimo_ctx.session`; they are re-exported here).
It never deletes a message (SPEC: nothing is ever deleted from storage); rebuilds
only append a boundary message and mark tool results compacted.

Ordering. Messages are listed by ``(time_created, id)``, the original's paging
key (SPEC A1): a rebuild boundary is back-dated to the watermark's time + 1 ms,
so it lists right after the watermark although its id is the newest.

Change feed. Every write of a message gives it the store's next sequence number
(``seq``). :meth:`Store.changes_since` returns what changed after a sequence
number, so the middleware can keep its window current in O(new messages) per turn
instead of re-reading the history.

Once per usage. :meth:`Store.commit_rebuild` writes a boundary and its
micro-compaction in one transaction, keyed by the assistant usage it recovers; a
second commit for the same key writes nothing and returns ``False``. The key is
enforced by the store (a uniqueness constraint), not by check-then-insert, so
concurrent tasks or processes cannot insert two boundaries for one usage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message
from mimo_ctx.session import (
    ACTIVE_ACTOR_STATUSES,
    TERMINAL_TASK_STATUSES,
    Actor,
    ActorStatus,
    RequestPrefix,
    Session,
    SessionState,
    Task,
    TaskStatus,
)

__all__ = [
    "ACTIVE_ACTOR_STATUSES",
    "TERMINAL_TASK_STATUSES",
    "Actor",
    "ActorStatus",
    "RequestPrefix",
    "Session",
    "SessionState",
    "Store",
    "Task",
    "TaskStatus",
    "check_rebuild_arguments",
    "check_user_message_window",
]


@runtime_checkable
class Store(Protocol):
    """Async storage of sessions, messages, tasks and actors.

    Implementations must never block the event loop and must make each method
    atomic. ``agent=None`` means "all agents of the session".
    """

    # -- sessions -------------------------------------------------------------
    async def create_session(self, session: Session) -> None:
        """Store a new session. Raises ``StoreError`` if its id exists."""
        ...

    async def get_session(self, session_id: str) -> Session | None:
        """Return the session, or ``None`` when there is none with that id."""
        ...

    async def update_session(self, session: Session) -> None:
        """Replace a stored session. Raises ``StoreError`` if it does not exist.

        The stored watermark is kept: only :meth:`set_watermark` changes it, so a
        caller replacing the session from an older copy cannot roll it back.
        """
        ...

    async def list_sessions(self) -> list[Session]:
        """Return every session, oldest first."""
        ...

    async def get_watermark(self, session_id: str) -> str | None:
        """Return the session's watermark (SPEC R2.1), or ``None`` when none is set."""
        ...

    async def set_watermark(self, session_id: str, message_id: str) -> None:
        """Persist the watermark (only after the writer succeeded, SPEC A2)."""
        ...

    # -- messages -------------------------------------------------------------
    async def append_messages(self, messages: Sequence[Message]) -> None:
        """Append new messages in one transaction.

        Raises ``StoreError`` (and writes nothing) if an id already exists or a
        session is unknown.
        """
        ...

    async def update_messages(self, messages: Sequence[Message]) -> None:
        """Replace stored messages (same ids) in one transaction.

        Raises ``StoreError`` (and writes nothing) if one does not exist.
        """
        ...

    async def get_message(self, message_id: str) -> Message | None:
        """Return one message by id."""
        ...

    async def list_messages(
        self,
        session_id: str,
        *,
        agent: str | None = MAIN_AGENT,
        since: tuple[int, str] | None = None,
        last: int | None = None,
    ) -> list[Message]:
        """List a session's messages ordered by ``(time_created, id)``.

        Args:
            session_id: The session.
            agent: Only this agent's messages; ``None`` for all agents.
            since: Only messages whose ``(time_created, id)`` is >= this key.
            last: Only the newest ``last`` of the selected messages (still returned
                oldest first).
        """
        ...

    async def list_user_messages(
        self,
        session_id: str,
        *,
        agent: str = MAIN_AGENT,
        first: int | None = None,
        last: int | None = None,
        before: tuple[int, str] | None = None,
    ) -> list[Message]:
        """List an agent's user messages that are not boundaries, by ``(time_created, id)``.

        Indexed, so a call costs what it returns, not the history: the rebuild reads
        "Recent user input" over the whole history this way (newest pages first).

        Args:
            session_id: The session.
            agent: Whose user messages.
            first: Only the oldest ``first`` of them.
            last: Only the newest ``last`` of them (still returned oldest first).
            before: Only those whose ``(time_created, id)`` is < this key (paging).

        Raises:
            StoreError: Both ``first`` and ``last`` are given, or one is negative.
        """
        ...

    async def count_messages(self, session_id: str, *, agent: str | None = None) -> int:
        """Count a session's messages."""
        ...

    async def latest_finished_assistant(
        self, session_id: str, *, agent: str | None = MAIN_AGENT
    ) -> Message | None:
        """The newest (by id) assistant message whose ``finish`` is set."""
        ...

    async def latest_boundary(self, session_id: str) -> Message | None:
        """The newest (by id) main-agent user message with a checkpoint or compaction part."""
        ...

    async def changes_since(self, session_id: str, seq: int) -> tuple[list[Message], int]:
        """Messages of the session written (appended or updated) after ``seq``.

        Returns:
            The changed messages (each once, in write order) and the store's
            current sequence number, to pass as ``seq`` next time.
        """
        ...

    async def commit_rebuild(
        self,
        session_id: str,
        *,
        usage_key: str,
        boundary: Message,
        updated: Sequence[Message],
        session: Session | None = None,
    ) -> bool:
        """Append ``boundary`` and replace ``updated`` in one transaction (SPEC R4).

        Args:
            session_id: The session rebuilt.
            usage_key: What the rebuild recovers (the id of the assistant message
                whose usage triggered it). At most one commit per key succeeds.
            boundary: The new rebuild boundary message.
            updated: Messages changed by micro-compaction.
            session: When given, the session row is replaced in the same transaction
                (state such as ``rebuilds`` and ``freed_fractions``).

        Returns:
            ``True`` when committed; ``False`` (nothing written) when a rebuild for
            ``usage_key`` was already committed.
        """
        ...

    # -- tasks and actors ----------------------------------------------------
    async def upsert_task(self, task: Task) -> None:
        """Insert or replace a task (keyed by session id and task id)."""
        ...

    async def get_task(self, session_id: str, task_id: str) -> Task | None:
        """Return one task of a session."""
        ...

    async def list_tasks(self, session_id: str) -> list[Task]:
        """Return the session's tasks, terminal ones included, ordered by id."""
        ...

    async def upsert_actor(self, actor: Actor) -> None:
        """Insert or replace an actor (keyed by its id)."""
        ...

    async def get_actor(self, session_id: str, actor_id: str) -> Actor | None:
        """Return one actor, only if it belongs to ``session_id`` (isolation, R5.4)."""
        ...

    async def list_actors(self, session_id: str, *, active_only: bool = False) -> list[Actor]:
        """Return this session's actors (never another session's, SPEC R5.4).

        ``active_only`` keeps background actors with status pending or running.
        """
        ...

    async def aclose(self) -> None:
        """Release resources (connections, threads). Idempotent."""
        ...


def check_rebuild_arguments(
    session_id: str, boundary: Message, updated: Sequence[Message], session: Session | None
) -> None:
    """The checks every store makes before :meth:`Store.commit_rebuild` writes anything.

    Raises:
        StoreError: The boundary or ``session`` belongs to another session, or the
            boundary is also listed in ``updated``.
    """
    if boundary.session_id != session_id:
        raise StoreError(
            f"commit_rebuild: boundary {boundary.id!r} belongs to session "
            f"{boundary.session_id!r}, not {session_id!r}"
        )
    if session is not None and session.id != session_id:
        raise StoreError(
            f"commit_rebuild: session {session.id!r} given for rebuild of {session_id!r}"
        )
    if any(m.id == boundary.id for m in updated):
        raise StoreError(f"commit_rebuild: the boundary {boundary.id!r} is also in `updated`")


def check_user_message_window(first: int | None, last: int | None) -> int | None:
    """Check the ``first`` / ``last`` arguments of :meth:`Store.list_user_messages`.

    Returns:
        The limit they set (``None``: no limit).

    Raises:
        StoreError: Both are given, or one is negative.
    """
    if first is not None and last is not None:
        raise StoreError("list_user_messages: give first or last, not both")
    limit = first if first is not None else last
    if limit is not None and limit < 0:
        raise StoreError(f"list_user_messages: first/last must be >= 0, got {limit}")
    return limit
