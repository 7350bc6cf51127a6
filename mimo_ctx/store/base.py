"""The storage contract every store implements.

A store is the single source of truth for sessions, messages, tasks and actors
(the models live in :mod:`mimo_ctx.session`; they are re-exported here).
It never deletes a message (SPEC: nothing is ever deleted from storage); rebuilds
only append a boundary message and mark tool results compacted.

Ordering. Messages are listed by ``(time_created, id)``, the original's paging
key (SPEC A1): a rebuild boundary is back-dated to the watermark's time + 1 ms,
so it lists right after the watermark although it was written last.

Write order. Every write of a message takes the store's next number from one
store-wide sequence. A store applies the writes of one session one at a time
(a write lock per session, or per file), so within a session those numbers grow
in the order the writes committed, whatever the clocks of the workers that made
them. Each message keeps two of them:

* ``insert_seq`` (:attr:`~mimo_ctx.messages.Message.insert_seq`): the number of
  its insertion, never changed by an update. **"Newer than" between stored
  messages is decided by it** (:func:`~mimo_ctx.messages.written_after`), not by
  ids: ids are made from the writing worker's clock, and a worker whose clock
  lags would make a message it writes after a boundary look older than that
  boundary. So the newest boundary and the newest finished assistant message
  are the ones inserted last; a usage is recovered (SPEC R1.4, amended) when a
  boundary of its agent was inserted after its assistant message; and a rebuild
  digests exactly the messages it listed, which all have an ``insert_seq`` at
  most its checkpoint part's ``digest_seq`` (R7.3, amended).
* ``seq``: the number of its latest write (insert or update), for the change
  feed: :meth:`Store.changes_since` returns what was written after a number, so
  the middleware keeps its window current in O(new messages) per turn instead of
  re-reading the history.

Off-branch messages. A message marked ``off_branch`` (the host regenerated an
answer or edited an earlier message, :mod:`mimo_ctx.reconcile`) stays in
storage: :meth:`Store.get_message`, the change feed and
:meth:`Store.count_messages` see it; :meth:`Store.list_messages` and
:meth:`Store.latest_finished_assistant` leave it out, so everything built from
the conversation (views, rebuilds, checkpoints) follows the host.

Host index. :meth:`Store.host_index` and :meth:`Store.commit_host_history` keep,
per session and agent, which host messages are stored (:class:`HostNode`, one
per host message and the conversation before it) and the tip of the
conversation the session follows. A node's key is unique: two workers storing
the same host message can never both succeed, so any worker can serve any turn
without storing a message twice.

Once per usage. :meth:`Store.commit_rebuild` writes a boundary and its
micro-compaction in one transaction, keyed by the assistant usage it recovers; a
second commit for the same key writes nothing and returns ``False``, and so does
a commit whose usage message is older (by write order) than a boundary of the
same agent already stored: that usage was recovered by it. The key is enforced
by the store (a uniqueness constraint), not by check-then-insert, and the
newer-boundary check runs inside the same transaction, so concurrent tasks or
processes cannot insert two boundaries for one usage.

Session state. :class:`SessionState` (thresholds, loop guard, rebuild count) is
changed only by :meth:`Store.update_session_state` and :meth:`Store.commit_rebuild`,
which apply a change function to the state *as stored*, inside the write
transaction: several workers changing it never lose each other's updates.
:meth:`Store.update_session` keeps the stored state and watermark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

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
    StateChange,
    Task,
    TaskStatus,
)

__all__ = [
    "ACTIVE_ACTOR_STATUSES",
    "TERMINAL_TASK_STATUSES",
    "Actor",
    "ActorStatus",
    "HeadMove",
    "HostIndex",
    "HostNode",
    "RequestPrefix",
    "Session",
    "SessionState",
    "StateChange",
    "Store",
    "Task",
    "TaskStatus",
    "apply_state_change",
    "check_host_commit",
    "check_rebuild_arguments",
    "check_user_message_window",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HostNode(_Model):
    """One host message of a session's conversation, as the host index keeps it.

    Attributes:
        chain: Digest of this host message and every one before it on its branch
            (of ``parent`` and ``fingerprint``): unique per session and agent.
        parent: The chain of the host message before it (``""`` for the first).
        fingerprint: The digest of this host message alone.
        depth: Its position on its branch (0 for the first).
        message_ids: The stored messages it stands for; empty when its content
            lives in another one (a tool result joined into its call).
        seq: When the store wrote it (set by the store, for :meth:`Store.host_index`).
    """

    chain: str
    parent: str
    fingerprint: str
    depth: int = Field(ge=0)
    message_ids: list[str] = Field(default_factory=list[str])
    seq: int = 0


class HostIndex(_Model):
    """What :meth:`Store.host_index` returns.

    Attributes:
        nodes: The nodes written after the ``since`` asked for, in write order.
        head: The chain of the conversation's tip (None: nothing indexed yet).
        seq: Pass it as ``since`` next time.
    """

    nodes: list[HostNode] = Field(default_factory=list[HostNode])
    head: str | None = None
    seq: int = 0


class HeadMove(_Model):
    """Move a session's conversation tip, if it is still where the caller saw it.

    Attributes:
        expected: The head the caller read (None: no head yet).
        head: The new head.
    """

    expected: str | None
    head: str


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

        The stored watermark and state are kept: only :meth:`set_watermark`,
        :meth:`update_session_state` and :meth:`commit_rebuild` change them, so a
        caller replacing the session from an older copy cannot roll them back.
        """
        ...

    async def update_session_state(self, session_id: str, change: StateChange) -> SessionState:
        """Apply ``change`` to the session's stored state in one write transaction.

        ``change`` gets the state as stored when the transaction holds the
        session's write lock, so concurrent changes (of other tasks or workers)
        are never lost.

        Returns:
            The new state.

        Raises:
            StoreError: The session is unknown (nothing is called or written).
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

    async def upsert_messages(self, messages: Sequence[Message]) -> None:
        """Store messages in one transaction: new ids appended, known ids replaced.

        What recording a response needs when it may be stored already (a streamed
        answer stored as it started): one round trip instead of a read to choose
        between :meth:`append_messages` and :meth:`update_messages`. Each message
        written takes the next sequence number of the change feed.

        Raises ``StoreError`` (and writes nothing) if a session is unknown, an id
        repeats in the batch, or a known id belongs to another session.
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
        exclude_agent: str | None = None,
    ) -> list[Message]:
        """List a session's messages ordered by ``(time_created, id)``.

        Args:
            session_id: The session.
            agent: Only this agent's messages; ``None`` for all agents.
            since: Only messages whose ``(time_created, id)`` is >= this key.
            exclude_agent: Leave this agent's messages out (with ``agent=None``: the
                sub-agents' messages, when the caller holds the main agent's).
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
        """The assistant message whose ``finish`` is set that was inserted last (write order)."""
        ...

    async def latest_boundary(self, session_id: str) -> Message | None:
        """The main-agent boundary (checkpoint or compaction part) inserted last (write order)."""
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
        state: StateChange | None = None,
    ) -> bool:
        """Append ``boundary`` and replace ``updated`` in one transaction (SPEC R4).

        Args:
            session_id: The session rebuilt.
            usage_key: What the rebuild recovers: the id of the assistant message
                whose usage triggered it, or a key of the caller's (a manual
                rebuild's) that names no message. At most one commit per key
                succeeds.
            boundary: The new rebuild boundary message.
            updated: Messages changed by micro-compaction.
            state: When given, applied to the session's stored state in the same
                transaction (see :meth:`update_session_state`).

        Returns:
            ``True`` when committed; ``False`` (nothing written, ``state`` not
            called) when a rebuild for ``usage_key`` was already committed, or when
            ``usage_key`` names a message of the session and a boundary of
            ``boundary``'s agent was inserted after it (that usage is recovered).
        """
        ...

    # -- host index -----------------------------------------------------------
    async def host_index(self, session_id: str, *, agent: str, since: int = 0) -> HostIndex:
        """The host nodes of a session and agent written after ``since``, and its head."""
        ...

    async def commit_host_history(
        self,
        session_id: str,
        *,
        agent: str,
        nodes: Sequence[HostNode] = (),
        messages: Sequence[Message] = (),
        updated: Sequence[Message] = (),
        move: HeadMove | None = None,
    ) -> bool:
        """Store host messages and their nodes in one transaction.

        Args:
            session_id: The session.
            agent: The agent whose conversation it is.
            nodes: New nodes (their ``seq`` is set by the store).
            messages: New messages (as :meth:`append_messages`).
            updated: Messages replaced (as :meth:`update_messages`: off-branch marks).
            move: Move the head; None leaves it.

        Returns:
            ``True`` when written; ``False`` (nothing written) when a node's chain is
            already stored or the head is not ``move.expected``: another caller got
            there first, so read the index again and decide anew.

        Raises:
            StoreError: The session is unknown, or a message is invalid (as for
                :meth:`append_messages` / :meth:`update_messages`); nothing written.
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


def check_rebuild_arguments(session_id: str, boundary: Message, updated: Sequence[Message]) -> None:
    """The checks every store makes before :meth:`Store.commit_rebuild` writes anything.

    Raises:
        StoreError: The boundary belongs to another session, or is also listed in
            ``updated``.
    """
    if boundary.session_id != session_id:
        raise StoreError(
            f"commit_rebuild: boundary {boundary.id!r} belongs to session "
            f"{boundary.session_id!r}, not {session_id!r}"
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


def apply_state_change(session_id: str, stored: SessionState, change: StateChange) -> SessionState:
    """Run a :data:`~mimo_ctx.session.StateChange` on the stored state and check its result.

    Raises:
        StoreError: ``change`` did not return a :class:`SessionState`.
    """
    new = change(stored.model_copy(deep=True))
    if not isinstance(new, SessionState):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise StoreError(
            f"session {session_id!r}: a state change returned {type(new).__name__}, "
            "not a SessionState; nothing written"
        )
    return new


def check_host_commit(
    session_id: str, nodes: Sequence[HostNode], messages: Sequence[Message]
) -> None:
    """The checks every store makes before :meth:`Store.commit_host_history` writes.

    Raises:
        StoreError: A node repeats a chain, or a message belongs to another session.
    """
    chains = [n.chain for n in nodes]
    if len(set(chains)) != len(chains):
        raise StoreError("commit_host_history: a host node chain appears twice; nothing written")
    for message in messages:
        if message.session_id != session_id:
            raise StoreError(
                f"commit_host_history: message {message.id!r} belongs to session "
                f"{message.session_id!r}, not {session_id!r}; nothing written"
            )
