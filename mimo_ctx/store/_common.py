"""The front the three stores share, and the SQL the two SQL stores share (private).

:class:`StoreBase` holds, once, the :class:`~mimo_ctx.store.base.Store` methods
whose arguments every store checks the same way (the listings and the two
commits): it checks them and hands one request object (:class:`MessageQuery`,
:class:`UserMessageQuery`, :class:`RebuildCommit`, :class:`HostCommit`) to the
store's hook. :class:`SQLStoreBase` builds the listings' SQL once for the SQLite
and the PostgreSQL store (:class:`Where`), each running it in its own dialect
(:class:`SQLDialect`).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, Self

from anyio.abc import AsyncResource

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message, set_insert_seq, set_part_units
from mimo_ctx.session import StateChange, Task, task_order_key
from mimo_ctx.store.base import (
    HeadMove,
    HostNode,
    check_host_commit,
    check_rebuild_arguments,
    check_user_message_window,
)

__all__ = [
    "POSTGRES",
    "SQLITE",
    "HostCommit",
    "MessageQuery",
    "MessageSelect",
    "RebuildCommit",
    "SQLDialect",
    "SQLStoreBase",
    "StoreBase",
    "UserMessageQuery",
    "Where",
    "host_node",
    "in_task_order",
    "reject_repeated_ids",
    "restore_row_caches",
]

# Both databases' integers are 64-bit: a larger LIMIT (a huge configured window,
# meaning "no limit") is sent as the largest one.
_MAX_LIMIT: Final = 2**63 - 1


def restore_row_caches(message: Message, estimate: Any, insert_seq: Any, units: Any) -> Message:
    """Put back what a message row keeps beside its payload, read back into ``message``.

    The row's token estimate and the part lengths it was summed from (``None``
    for rows written before they were kept) were computed from this very payload
    at write time; ``insert_seq`` is the message's place in the write order.
    """
    set_part_units(message, None if units is None else str(units), estimate=int(estimate))
    set_insert_seq(message, int(insert_seq))
    return message


def reject_repeated_ids(messages: Sequence[Message], what: str) -> None:
    """Refuse a batch that names one message id twice (``what`` names the call).

    Raises:
        StoreError: An id appears twice; the caller writes nothing.
    """
    seen: set[str] = set()
    for m in messages:
        if m.id in seen:
            raise StoreError(f"{what}: message id {m.id!r} appears twice; nothing written")
        seen.add(m.id)


class _Row(Protocol):
    def __getitem__(self, index: int, /) -> Any: ...


def host_node(row: _Row) -> HostNode:
    """A host node from its row: chain, parent, fingerprint, depth, message ids (JSON), seq."""
    return HostNode(
        chain=str(row[0]),
        parent=str(row[1]),
        fingerprint=str(row[2]),
        depth=int(row[3]),
        message_ids=[str(i) for i in json.loads(str(row[4]))],
        seq=int(row[5]),
    )


def in_task_order(tasks: Iterable[Task]) -> list[Task]:
    """The tasks in natural id order (SPEC A16), ties broken by the id itself."""
    return sorted(tasks, key=lambda t: (task_order_key(t.id), t.id))


# -- the requests the front hands to a store --------------------------------------
@dataclass(frozen=True, slots=True)
class MessageQuery:
    """A checked :meth:`~mimo_ctx.store.base.Store.list_messages` call."""

    session_id: str
    agent: str | None
    since: tuple[int, str] | None
    last: int | None
    exclude_agent: str | None


@dataclass(frozen=True, slots=True)
class UserMessageQuery:
    """A checked :meth:`~mimo_ctx.store.base.Store.list_user_messages` call.

    ``limit``: at most that many (``None``: all); ``newest``: the newest ``limit``
    (``last`` was given), otherwise the oldest.
    """

    session_id: str
    agent: str
    before: tuple[int, str] | None
    limit: int | None
    newest: bool


@dataclass(frozen=True, slots=True)
class RebuildCommit:
    """A checked :meth:`~mimo_ctx.store.base.Store.commit_rebuild` call."""

    session_id: str
    usage_key: str
    boundary: Message
    updated: list[Message]
    state: StateChange | None


@dataclass(frozen=True, slots=True)
class HostCommit:
    """A checked :meth:`~mimo_ctx.store.base.Store.commit_host_history` call."""

    session_id: str
    agent: str
    nodes: list[HostNode]
    messages: list[Message]
    updated: list[Message]
    move: HeadMove | None


class StoreBase(AsyncResource):
    """The methods every store checks alike; each store implements their hooks."""

    async def append_messages(self, messages: Sequence[Message]) -> None:
        """Append new messages in one transaction.

        Raises:
            StoreError: An id already exists (or repeats in the batch) or a session
                is unknown; nothing is written.
        """
        batch = list(messages)
        reject_repeated_ids(batch, "append_messages")
        await self._append(batch)

    async def update_messages(self, messages: Sequence[Message]) -> None:
        """Replace stored messages (same ids) in one transaction.

        Raises:
            StoreError: A message does not exist or would move to another session;
                nothing is written.
        """
        await self._update(list(messages))

    async def upsert_messages(self, messages: Sequence[Message]) -> None:
        """Store messages in one transaction: new ids appended, known ids replaced.

        See :meth:`mimo_ctx.store.base.Store.upsert_messages`. A replaced message
        keeps its place in the write order (``insert_seq``), as an update does.

        Raises:
            StoreError: A session is unknown, an id repeats in the batch, or a known
                id belongs to another session; nothing is written.
        """
        batch = list(messages)
        reject_repeated_ids(batch, "upsert_messages")
        await self._upsert(batch)

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

        See :meth:`mimo_ctx.store.base.Store.list_messages`.
        """
        if last is not None and last < 0:
            raise StoreError(f"list_messages: last must be >= 0, got {last}")
        return await self._list_messages(
            MessageQuery(session_id, agent, since, last, exclude_agent)
        )

    async def list_user_messages(
        self,
        session_id: str,
        *,
        agent: str = MAIN_AGENT,
        first: int | None = None,
        last: int | None = None,
        before: tuple[int, str] | None = None,
    ) -> list[Message]:
        """The agent's user messages that are not boundaries, by ``(time_created, id)``.

        See :meth:`mimo_ctx.store.base.Store.list_user_messages`.
        """
        limit = check_user_message_window(first, last)
        return await self._list_user_messages(
            UserMessageQuery(session_id, agent, before, limit, newest=last is not None)
        )

    async def commit_rebuild(
        self,
        session_id: str,
        *,
        usage_key: str,
        boundary: Message,
        updated: Sequence[Message],
        state: StateChange | None = None,
    ) -> bool:
        """Append ``boundary`` and replace ``updated`` in one transaction, once per usage key.

        See :meth:`mimo_ctx.store.base.Store.commit_rebuild`.

        Raises:
            StoreError: The session is unknown, the boundary id exists, or an
                updated message is missing or belongs to another session; nothing
                is written and the key stays unused.
        """
        batch = list(updated)
        check_rebuild_arguments(session_id, boundary, batch)
        return await self._commit_rebuild(
            RebuildCommit(session_id, usage_key, boundary, batch, state)
        )

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
        """Store host messages, their nodes and the head in one transaction.

        See :meth:`mimo_ctx.store.base.Store.commit_host_history`.
        """
        commit = HostCommit(session_id, agent, list(nodes), list(messages), list(updated), move)
        check_host_commit(session_id, commit.nodes, [*commit.messages, *commit.updated])
        reject_repeated_ids(commit.messages, "commit_host_history")
        return await self._commit_host_history(commit)

    @abstractmethod
    async def _append(self, batch: list[Message]) -> None:
        """Write a checked :meth:`append_messages` (no id twice in ``batch``)."""

    @abstractmethod
    async def _update(self, batch: list[Message]) -> None:
        """Write a :meth:`update_messages`."""

    @abstractmethod
    async def _upsert(self, batch: list[Message]) -> None:
        """Write a checked :meth:`upsert_messages` (no id twice in ``batch``)."""

    @abstractmethod
    async def _list_messages(self, query: MessageQuery) -> list[Message]:
        """Answer a checked :meth:`list_messages`."""

    @abstractmethod
    async def _list_user_messages(self, query: UserMessageQuery) -> list[Message]:
        """Answer a checked :meth:`list_user_messages`."""

    @abstractmethod
    async def _commit_rebuild(self, commit: RebuildCommit) -> bool:
        """Write a checked :meth:`commit_rebuild`."""

    @abstractmethod
    async def _commit_host_history(self, commit: HostCommit) -> bool:
        """Write a checked :meth:`commit_host_history`."""


# -- the SQL of the two SQL stores ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class SQLDialect:
    """How the SQLite and the PostgreSQL store spell what differs in their filters.

    Attributes:
        placeholder: The placeholder of the n-th parameter (from 1).
        false: The test that a flag column is false.
    """

    placeholder: Callable[[int], str]
    false: Callable[[str], str]


POSTGRES: Final = SQLDialect(placeholder=lambda n: f"${n}", false=lambda column: f"NOT {column}")
# `flag = 0`, not `NOT flag`: SQLite uses a partial index only for a query whose
# WHERE repeats the index's own terms (`is_boundary = 0`).
SQLITE: Final = SQLDialect(placeholder=lambda _n: "?", false=lambda column: f"{column} = 0")


class Where:
    """A ``WHERE`` clause and its parameters, written in one dialect."""

    def __init__(self, dialect: SQLDialect) -> None:
        self._dialect = dialect
        self._terms: list[str] = []
        self.params: list[object] = []
        """The parameters, in placeholder order."""

    def __str__(self) -> str:
        return " AND ".join(self._terms)

    def param(self, value: object) -> str:
        """Add a parameter; return its placeholder."""
        self.params.append(value)
        return self._dialect.placeholder(len(self.params))

    def add(self, term: str, *values: object) -> Self:
        """Add a term, each ``{}`` of it standing for the next of ``values``."""
        self._terms.append(term.format(*[self.param(v) for v in values]))
        return self

    def false(self, column: str) -> Self:
        """Add the term that the flag ``column`` is false."""
        self._terms.append(self._dialect.false(column))
        return self


class SQLStoreBase(StoreBase):
    """The listings of the two SQL stores, built once; each store runs the SQL."""

    _dialect: ClassVar[SQLDialect]

    @abstractmethod
    def _check_open(self) -> None:
        """Raise ``StoreError`` when the store is closed."""

    @abstractmethod
    async def _fetch_messages(self, tail: str, params: Sequence[object]) -> list[Message]:
        """The messages of ``SELECT <message columns> FROM messages <tail>``, in row order."""

    async def _list_messages(self, query: MessageQuery) -> list[Message]:
        self._check_open()
        return await self._selected(self._messages_select(query))

    async def _list_user_messages(self, query: UserMessageQuery) -> list[Message]:
        self._check_open()
        return await self._selected(self._user_messages_select(query))

    def _messages_select(self, query: MessageQuery) -> MessageSelect | None:
        """The SQL of a :meth:`list_messages` (``None``: nothing to read)."""
        if query.last == 0:
            return None
        where = Where(self._dialect).add("session_id = {}", query.session_id).false("off_branch")
        if query.agent is not None:
            where.add("agent = {}", query.agent)
        if query.exclude_agent is not None:
            where.add("agent <> {}", query.exclude_agent)
        if query.since is not None:
            # A row comparison: both databases scan the (…, time_created, id)
            # index from that key.
            where.add("(time_created, id) >= ({}, {})", *query.since)
        return _select(where, last=query.last, newest=True)

    def _user_messages_select(self, query: UserMessageQuery) -> MessageSelect | None:
        """The SQL of a :meth:`list_user_messages` (``None``: nothing to read)."""
        # Read through the `messages_user` partial index.
        if query.limit == 0:
            return None
        where = (
            Where(self._dialect)
            .add("session_id = {} AND agent = {}", query.session_id, query.agent)
            .add("role = 'user'")
            .false("is_boundary")
            .false("off_branch")
        )
        if query.before is not None:
            where.add("(time_created, id) < ({}, {})", *query.before)
        return _select(where, last=query.limit, newest=query.newest)

    async def _selected(self, select: MessageSelect | None) -> list[Message]:
        if select is None:
            return []
        messages = await self._fetch_messages(select.tail, select.params)
        if select.reverse:
            messages.reverse()
        return messages


@dataclass(frozen=True, slots=True)
class MessageSelect:
    """``SELECT <message columns> FROM messages <tail>`` with its parameters.

    ``reverse``: the rows come newest first, the listing is oldest first.
    """

    tail: str
    params: Sequence[object]
    reverse: bool


def _select(where: Where, *, last: int | None, newest: bool) -> MessageSelect:
    """Messages matching ``where`` by ``(time_created, id)``, at most ``last`` of them.

    ``newest``: the newest ``last`` (read backwards, returned oldest first);
    otherwise the oldest.
    """
    order = "DESC" if newest and last is not None else "ASC"
    tail = f"WHERE {where} ORDER BY time_created {order}, id {order}"
    if last is not None:
        tail += f" LIMIT {where.param(min(last, _MAX_LIMIT))}"
    return MessageSelect(tail, where.params, reverse=order == "DESC")
