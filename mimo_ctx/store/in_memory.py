"""An in-process store on plain dicts: for tests, examples and short-lived agents.

Every method runs under one :class:`anyio.Lock` and validates a whole write
before applying any of it, so each call is atomic, as the :class:`Store`
contract requires. Nothing survives the process; use
:class:`~mimo_ctx.store.sqlite.SQLiteStore` for that.

Messages are values (see :mod:`mimo_ctx.messages`): the store keeps the objects
it is given and hands the same objects back, without copying them. Sessions,
tasks and actors are small mutable models, so they are copied on the way in and
out: a caller editing a returned session cannot change what is stored. Every
list returned is a new list.

Per session the store keeps small sorted indexes (messages by ``(time_created,
id)``, finished assistants and boundaries by write order, last writes), so the
queries the middleware runs on every turn cost O(log n) or O(changes), not
O(history). Write order (:attr:`~mimo_ctx.messages.Message.insert_seq`) is the
order of the calls, which the store's lock serialises.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Self, TypeVar

import anyio

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message, set_insert_seq
from mimo_ctx.session import (
    ACTIVE_ACTOR_STATUSES,
    Actor,
    Session,
    SessionState,
    StateChange,
    Task,
)
from mimo_ctx.store._common import (
    HostCommit,
    MessageQuery,
    RebuildCommit,
    StoreBase,
    UserMessageQuery,
    in_task_order,
)
from mimo_ctx.store.base import (
    HostIndex,
    HostNode,
    apply_state_change,
)

__all__ = ["InMemoryStore"]

_K = TypeVar("_K", str, tuple[int, str])
_Ordered = tuple[int, str]
"""(insert_seq, id): sorts by write order."""


def _remove_sorted(items: list[_K], item: _K) -> None:
    i = bisect.bisect_left(items, item)
    if i < len(items) and items[i] == item:
        del items[i]


class _IndexKey(NamedTuple):
    """What the indexes know of a message, captured when it was written.

    Kept apart from the message so that a caller who (against the rules) edits a
    stored message in place cannot leave the indexes pointing at wrong keys.
    """

    session_id: str
    agent: str
    time_created: int
    finished_assistant: bool
    main_boundary: bool
    user: bool
    insert_seq: int
    off_branch: bool

    @classmethod
    def of(cls, message: Message, insert_seq: int) -> _IndexKey:
        listed = not message.off_branch
        return cls(
            message.session_id,
            message.agent,
            message.time_created,
            listed and message.role == "assistant" and message.finish is not None,
            listed and message.agent == MAIN_AGENT and message.is_boundary,
            listed and message.role == "user" and not message.is_boundary,
            insert_seq,
            message.off_branch,
        )


@dataclass
class _SessionIndex:
    """The indexes of one session's messages."""

    # (time_created, id) of every message, sorted: the listing order (SPEC A1).
    by_time: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])
    # Finished assistant messages by write order, per agent.
    finished: dict[str, list[_Ordered]] = field(default_factory=dict[str, list[_Ordered]])
    # Finished assistant messages of every agent by write order.
    finished_any: list[_Ordered] = field(default_factory=list[_Ordered])
    # Main-agent boundary messages by write order.
    boundaries: list[_Ordered] = field(default_factory=list[_Ordered])
    # (time_created, id) of user messages that are not boundaries, sorted, per agent.
    users: dict[str, list[tuple[int, str]]] = field(
        default_factory=dict[str, list[tuple[int, str]]]
    )
    # id -> seq of its last write; insertion order is write order, so the
    # entries are sorted by seq and changes_since reads a suffix.
    written: OrderedDict[str, int] = field(default_factory=OrderedDict[str, int])
    # Off-branch messages: stored and counted, never listed.
    off_branch: set[str] = field(default_factory=set[str])

    def add(self, message_id: str, key: _IndexKey, seq: int) -> None:
        self.written.pop(message_id, None)
        self.written[message_id] = seq
        if key.off_branch:
            self.off_branch.add(message_id)
            return
        bisect.insort(self.by_time, (key.time_created, message_id))
        ordered = (key.insert_seq, message_id)
        if key.finished_assistant:
            bisect.insort(self.finished.setdefault(key.agent, []), ordered)
            bisect.insort(self.finished_any, ordered)
        if key.main_boundary:
            bisect.insort(self.boundaries, ordered)
        if key.user:
            bisect.insort(self.users.setdefault(key.agent, []), (key.time_created, message_id))

    def remove(self, message_id: str, key: _IndexKey) -> None:
        """Drop a message from the sorted indexes (before re-adding its new version)."""
        if key.off_branch:
            self.off_branch.discard(message_id)
            return
        _remove_sorted(self.by_time, (key.time_created, message_id))
        ordered = (key.insert_seq, message_id)
        if key.finished_assistant:
            _remove_sorted(self.finished.get(key.agent, []), ordered)
            _remove_sorted(self.finished_any, ordered)
        if key.main_boundary:
            _remove_sorted(self.boundaries, ordered)
        if key.user:
            _remove_sorted(self.users.get(key.agent, []), (key.time_created, message_id))


@dataclass
class _HostIndex:
    """The host index of one session and agent."""

    nodes: dict[str, HostNode] = field(default_factory=dict[str, HostNode])
    order: list[HostNode] = field(default_factory=list[HostNode])  # write order
    head: str | None = None


class InMemoryStore(StoreBase):
    """A :class:`~mimo_ctx.store.base.Store` kept in memory.

    Example:
        >>> store = InMemoryStore()  # doctest: +SKIP
        >>> await store.create_session(Session(time_created=0))  # doctest: +SKIP
    """

    def __init__(self) -> None:
        """Create an empty store."""
        self._lock = anyio.Lock()
        self._closed = False
        self._seq = 0
        self._sessions: dict[str, Session] = {}
        self._messages: dict[str, Message] = {}
        self._keys: dict[str, _IndexKey] = {}
        self._index: dict[str, _SessionIndex] = {}
        self._rebuild_keys: set[tuple[str, str]] = set()
        self._hosts: dict[tuple[str, str], _HostIndex] = {}
        self._tasks: dict[tuple[str, str], Task] = {}
        self._actors: dict[str, Actor] = {}

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the in-memory store is closed")

    # -- sessions -------------------------------------------------------------
    async def create_session(self, session: Session) -> None:
        """Store a new session. Raises ``StoreError`` if its id exists."""
        async with self._lock:
            self._check_open()
            if session.id in self._sessions:
                raise StoreError(f"session {session.id!r} already exists")
            self._sessions[session.id] = session.model_copy(deep=True)
            self._index[session.id] = _SessionIndex()

    async def get_session(self, session_id: str) -> Session | None:
        """Return a copy of the session, or ``None`` when there is none with that id."""
        async with self._lock:
            self._check_open()
            session = self._sessions.get(session_id)
            return None if session is None else session.model_copy(deep=True)

    async def update_session(self, session: Session) -> None:
        """Replace a stored session, keeping its watermark and state.

        Raises:
            StoreError: The session does not exist.
        """
        async with self._lock:
            self._check_open()
            stored = self._require_session(session.id)
            # The watermark is the writer's (set_watermark), the state changes only
            # field by field (update_session_state): a caller replacing the session
            # from an older copy must not roll either back.
            self._sessions[session.id] = session.model_copy(
                update={"watermark": stored.watermark, "state": stored.state}, deep=True
            )

    async def update_session_state(self, session_id: str, change: StateChange) -> SessionState:
        """Apply ``change`` to the stored state atomically; return the new state.

        See :meth:`mimo_ctx.store.base.Store.update_session_state`.
        """
        async with self._lock:
            self._check_open()
            return self._change_state(session_id, change)

    def _change_state(self, session_id: str, change: StateChange) -> SessionState:
        stored = self._require_session(session_id)
        new = apply_state_change(session_id, stored.state, change)
        self._sessions[session_id] = stored.model_copy(update={"state": new.model_copy(deep=True)})
        return new

    async def list_sessions(self) -> list[Session]:
        """Return copies of every session, oldest ``(time_created, id)`` first."""
        async with self._lock:
            self._check_open()
            ordered = sorted(self._sessions.values(), key=lambda s: (s.time_created, s.id))
            return [s.model_copy(deep=True) for s in ordered]

    async def get_watermark(self, session_id: str) -> str | None:
        """Return the session's watermark; ``None`` when unset or the session is unknown."""
        async with self._lock:
            self._check_open()
            session = self._sessions.get(session_id)
            return None if session is None else session.watermark

    async def set_watermark(self, session_id: str, message_id: str) -> None:
        """Persist the watermark. Raises ``StoreError`` if the session is unknown."""
        async with self._lock:
            self._check_open()
            session = self._require_session(session_id)
            self._sessions[session_id] = session.model_copy(update={"watermark": message_id})

    def _require_session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise StoreError(f"unknown session {session_id!r}")
        return session

    # -- messages -------------------------------------------------------------
    def _check_new(self, messages: Sequence[Message], what: str) -> None:
        seen: set[str] = set()
        for m in messages:
            if m.id in seen or m.id in self._messages:
                raise StoreError(f"{what}: message id {m.id!r} already exists; nothing written")
            seen.add(m.id)
            if m.session_id not in self._sessions:
                raise StoreError(
                    f"{what}: message {m.id!r} names unknown session {m.session_id!r}; "
                    "nothing written"
                )

    def _check_existing(
        self, messages: Sequence[Message], what: str, session_id: str | None = None
    ) -> None:
        for m in messages:
            old = self._keys.get(m.id)
            if old is None:
                raise StoreError(f"{what}: message {m.id!r} does not exist; nothing written")
            if old.session_id != m.session_id or (
                session_id is not None and m.session_id != session_id
            ):
                raise StoreError(
                    f"{what}: message {m.id!r} belongs to session {old.session_id!r}, "
                    f"not {m.session_id if session_id is None else session_id!r}; "
                    "nothing written"
                )

    def _write(self, message: Message) -> None:
        """Store ``message`` (new or replacing its old version) with the next seq."""
        self._seq += 1
        index = self._index[message.session_id]
        old = self._keys.get(message.id)
        if old is not None:
            index.remove(message.id, old)
        # An update keeps the insertion's place in the write order.
        insert_seq = self._seq if old is None else old.insert_seq
        key = _IndexKey.of(message, insert_seq)
        set_insert_seq(message, insert_seq)
        self._messages[message.id] = message
        self._keys[message.id] = key
        index.add(message.id, key, self._seq)

    async def _write_checked(self, messages: Sequence[Message], check: Callable[[], None]) -> None:
        """Under the lock: ``check`` the whole batch (it raises), then write all of it."""
        async with self._lock:
            self._check_open()
            check()
            for m in messages:
                self._write(m)

    async def _append(self, batch: list[Message]) -> None:
        await self._write_checked(batch, lambda: self._check_new(batch, "append_messages"))

    async def _update(self, batch: list[Message]) -> None:
        await self._write_checked(batch, lambda: self._check_existing(batch, "update_messages"))

    async def _upsert(self, batch: list[Message]) -> None:
        await self._write_checked(batch, lambda: self._check_upsert(batch))

    def _check_upsert(self, messages: Sequence[Message]) -> None:
        for m in messages:
            if m.session_id not in self._sessions:
                raise StoreError(
                    f"upsert_messages: unknown session {m.session_id!r}; nothing written"
                )
            old = self._keys.get(m.id)
            if old is not None and old.session_id != m.session_id:
                raise StoreError(
                    f"upsert_messages: message {m.id!r} belongs to session "
                    f"{old.session_id!r}, not {m.session_id!r}; nothing written"
                )

    async def get_message(self, message_id: str) -> Message | None:
        """Return one message by id, or ``None``."""
        async with self._lock:
            self._check_open()
            return self._messages.get(message_id)

    async def _list_messages(self, query: MessageQuery) -> list[Message]:
        last, agent, exclude_agent = query.last, query.agent, query.exclude_agent
        async with self._lock:
            self._check_open()
            index = self._index.get(query.session_id)
            if index is None or last == 0:
                return []
            keys = index.by_time
            start = 0 if query.since is None else bisect.bisect_left(keys, query.since)

            def wanted(mid: str) -> bool:
                of = self._keys[mid].agent
                return (agent is None or of == agent) and of != exclude_agent

            if last is None:
                return [self._messages[mid] for _, mid in keys[start:] if wanted(mid)]
            # Walk back from the newest so `last` costs O(last) for the common
            # "recent window" call, not O(history).
            newest: list[Message] = []
            for i in range(len(keys) - 1, start - 1, -1):
                mid = keys[i][1]
                if wanted(mid):
                    newest.append(self._messages[mid])
                    if len(newest) == last:
                        break
            newest.reverse()
            return newest

    async def _list_user_messages(self, query: UserMessageQuery) -> list[Message]:
        async with self._lock:
            self._check_open()
            index = self._index.get(query.session_id)
            keys = index.users.get(query.agent, []) if index is not None else []
            end = len(keys) if query.before is None else bisect.bisect_left(keys, query.before)
            limit = query.limit
            if limit is None:
                chosen = keys[:end]
            elif query.newest:
                chosen = keys[max(0, end - limit) : end]
            else:
                chosen = keys[: min(end, limit)]
            return [self._messages[mid] for _, mid in chosen]

    async def count_messages(self, session_id: str, *, agent: str | None = None) -> int:
        """Count a session's messages (of one agent, or of all when ``agent`` is None)."""
        async with self._lock:
            self._check_open()
            index = self._index.get(session_id)
            if index is None:
                return 0
            if agent is None:
                return len(index.by_time) + len(index.off_branch)
            return sum(1 for mid in index.written if self._keys[mid].agent == agent)

    async def latest_finished_assistant(
        self, session_id: str, *, agent: str | None = MAIN_AGENT
    ) -> Message | None:
        """The finished assistant message inserted last (write order)."""
        async with self._lock:
            self._check_open()
            index = self._index.get(session_id)
            if index is None:
                return None
            ordered = index.finished_any if agent is None else index.finished.get(agent, [])
            return self._messages[ordered[-1][1]] if ordered else None

    async def latest_boundary(self, session_id: str) -> Message | None:
        """The main-agent boundary inserted last (write order)."""
        async with self._lock:
            self._check_open()
            index = self._index.get(session_id)
            if index is None or not index.boundaries:
                return None
            return self._messages[index.boundaries[-1][1]]

    async def changes_since(self, session_id: str, seq: int) -> tuple[list[Message], int]:
        """Messages of the session written after ``seq``, in write order, and the current seq."""
        async with self._lock:
            self._check_open()
            index = self._index.get(session_id)
            if index is None:
                return [], self._seq
            changed: list[Message] = []
            for mid, written_at in reversed(index.written.items()):
                if written_at <= seq:
                    break
                changed.append(self._messages[mid])
            changed.reverse()
            return changed, self._seq

    async def _commit_rebuild(self, commit: RebuildCommit) -> bool:
        session_id, usage_key, boundary = commit.session_id, commit.usage_key, commit.boundary
        async with self._lock:
            self._check_open()
            stored = self._require_session(session_id)
            if (session_id, usage_key) in self._rebuild_keys or self._recovered(
                session_id, usage_key, boundary.agent
            ):
                return False
            self._check_new([boundary], "commit_rebuild")
            self._check_existing(commit.updated, "commit_rebuild", session_id)
            state = commit.state
            new_state = (
                None if state is None else apply_state_change(session_id, stored.state, state)
            )
            # Everything is validated: apply all of it (nothing below can fail).
            self._rebuild_keys.add((session_id, usage_key))
            self._write(boundary)
            for m in commit.updated:
                self._write(m)
            if new_state is not None:
                self._sessions[session_id] = stored.model_copy(update={"state": new_state})
            return True

    def _recovered(self, session_id: str, usage_key: str, agent: str) -> bool:
        """A boundary of ``agent`` was inserted after the usage message ``usage_key``."""
        usage = self._keys.get(usage_key)
        if usage is None or usage.session_id != session_id:
            return False  # a key that names no message of the session (manual)
        return any(
            key.session_id == session_id
            and key.agent == agent
            and key.insert_seq > usage.insert_seq
            and self._messages[mid].is_boundary
            for mid, key in self._boundary_candidates(session_id, agent)
        )

    def _boundary_candidates(self, session_id: str, agent: str) -> list[tuple[str, _IndexKey]]:
        index = self._index[session_id]
        if agent == MAIN_AGENT:
            return [(mid, self._keys[mid]) for _, mid in index.boundaries]
        # Sub-agent compactions are rare and not indexed: look at the agent's messages.
        return [
            (mid, self._keys[mid])
            for _, mid in index.by_time
            if self._keys[mid].agent == agent and self._messages[mid].is_boundary
        ]

    # -- tasks and actors ----------------------------------------------------
    # -- host index -------------------------------------------------------------
    async def host_index(self, session_id: str, *, agent: str, since: int = 0) -> HostIndex:
        """The host nodes written after ``since`` and the head (see the Store contract)."""
        async with self._lock:
            self._check_open()
            host = self._hosts.get((session_id, agent))
            if host is None:
                return HostIndex(seq=self._seq)
            fresh: list[HostNode] = []
            for node in reversed(host.order):
                if node.seq <= since:
                    break
                fresh.append(node)
            fresh.reverse()
            return HostIndex(nodes=fresh, head=host.head, seq=self._seq)

    async def _commit_host_history(self, commit: HostCommit) -> bool:
        session_id, agent, nodes, move = commit.session_id, commit.agent, commit.nodes, commit.move
        messages, updated = commit.messages, commit.updated
        async with self._lock:
            self._check_open()
            self._require_session(session_id)
            host = self._hosts.get((session_id, agent))
            if host is not None and any(n.chain in host.nodes for n in nodes):
                return False
            head = host.head if host is not None else None
            if move is not None and head != move.expected:
                return False
            self._check_new(messages, "commit_host_history")
            self._check_existing(updated, "commit_host_history", session_id)
            # Validated: apply all of it (nothing below can fail).
            if host is None:
                host = self._hosts[(session_id, agent)] = _HostIndex()
            for m in messages:
                self._write(m)
            for m in updated:
                self._write(m)
            for node in nodes:
                self._seq += 1
                stored = node.model_copy(update={"seq": self._seq})
                host.nodes[stored.chain] = stored
                host.order.append(stored)
            if move is not None:
                host.head = move.head
            return True

    async def upsert_task(self, task: Task) -> None:
        """Insert or replace a task (keyed by session id and task id)."""
        async with self._lock:
            self._check_open()
            self._tasks[(task.session_id, task.id)] = task.model_copy()

    async def get_task(self, session_id: str, task_id: str) -> Task | None:
        """Return one task of a session, or ``None``."""
        async with self._lock:
            self._check_open()
            task = self._tasks.get((session_id, task_id))
            return None if task is None else task.model_copy()

    async def list_tasks(self, session_id: str) -> list[Task]:
        """Return the session's tasks, terminal ones included, in natural id order."""
        async with self._lock:
            self._check_open()
            tasks = [t.model_copy() for (sid, _), t in self._tasks.items() if sid == session_id]
        return in_task_order(tasks)

    async def upsert_actor(self, actor: Actor) -> None:
        """Insert or replace an actor (keyed by its id).

        Raises:
            StoreError: The id belongs to an actor of another session (an actor
                never moves between sessions, SPEC R5.4).
        """
        async with self._lock:
            self._check_open()
            old = self._actors.get(actor.id)
            if old is not None and old.session_id != actor.session_id:
                raise StoreError(
                    f"actor {actor.id!r} belongs to another session; "
                    f"it cannot be written for session {actor.session_id!r}"
                )
            self._actors[actor.id] = actor.model_copy()

    async def get_actor(self, session_id: str, actor_id: str) -> Actor | None:
        """Return one actor, only if it belongs to ``session_id`` (SPEC R5.4)."""
        async with self._lock:
            self._check_open()
            actor = self._actors.get(actor_id)
            if actor is None or actor.session_id != session_id:
                return None
            return actor.model_copy()

    async def list_actors(self, session_id: str, *, active_only: bool = False) -> list[Actor]:
        """Return this session's actors, oldest first (never another session's, R5.4).

        ``active_only`` keeps background actors with status pending or running.
        """
        async with self._lock:
            self._check_open()
            actors = [
                a.model_copy()
                for a in self._actors.values()
                if a.session_id == session_id
                and (not active_only or (a.background and a.status in ACTIVE_ACTOR_STATUSES))
            ]
        actors.sort(key=lambda a: (a.time_created, a.id))
        return actors

    async def aclose(self) -> None:
        """Close the store; later calls raise ``StoreError``. Idempotent."""
        self._closed = True
