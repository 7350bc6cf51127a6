"""The host-history reconciler: which host messages a session stores, and which it follows.

A *host* (a wrapped provider client, a framework integration) resends its whole
conversation with every call. :class:`HostHistory` compares that list with what
the session stores and writes only what is new, for one session and agent. Every
wrapper and integration uses it; its per-process state is owned by the
:class:`~mimo_ctx.middleware.ContextMiddleware` (:meth:`~mimo_ctx.middleware.
ContextMiddleware.host_history`) and released by
:meth:`~mimo_ctx.middleware.ContextMiddleware.close_session`.

Identity. Each host message gets a *fingerprint* from its host (what identifies
it: the tool-call ids of a call or a result, else its role and content) and a
*chain*: the digest of its fingerprint and the chain of the message before it.
The chain names a message *in its conversation*, so a message typed twice
("continue") is two messages, and a conversation is a path of chains. The store
keeps one :class:`~mimo_ctx.store.base.HostNode` per chain, under a uniqueness
constraint, and the *head*: the chain the session's conversation ends at.

The conversation rule. The host's list is matched against the session's stored
conversation:

* **It extends it** (the common turn): the new messages are appended.
* **It diverges from it** (the host regenerated its last answer, or edited an
  earlier message and resent from there): a *branch*. The session follows the
  host: the stored messages after the point where the lists part are marked
  ``off_branch`` (they stay in storage, they leave the view, rebuilds and
  checkpoints), the host's new messages are appended, and nothing is invented
  for what was dropped (no interrupted tool results). Returning to an earlier
  branch brings its messages back.
* **Its front was trimmed** (the host keeps a window of its own): its first
  message is found on the stored conversation and matching continues from there;
  nothing is stored again.
* **It shares nothing with the session** (its first message is not on the
  session's conversation): :class:`~mimo_ctx.errors.ConversationMismatchError`
  naming the session. Two conversations are never merged; a host that serves
  several conversations through one wrapper asks for a session per conversation
  (the wrappers' ``conversations="per-first-message"`` option).

Workers. Which host messages are stored is read from the store's host index (only
the nodes written since the last call), so any worker can serve any turn; the
write of new messages, their nodes, the off-branch marks and the head is one
transaction that fails as a whole when another worker stored the same node or
moved the head first, and the reconciler then reads again and decides anew. So
concurrent calls of one conversation never store a message twice.

Cost. The last host list is remembered (its items, not copies): items that are
the same objects as last time (or equal to them) are not fingerprinted again, so
a call hashes only the messages it has not seen, and the store is asked only
about those. A host item changed *in place* (a dict edited after it was sent)
is not noticed: replace the item to edit it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeVar

import anyio

from mimo_ctx._util import follow_copy
from mimo_ctx.convert import MessageDraft, build_messages
from mimo_ctx.errors import ConversationMismatchError, StoreError
from mimo_ctx.messages import Message, Part, ToolPart, ToolResultPart
from mimo_ctx.store.base import HeadMove, HostNode, Store

if TYPE_CHECKING:
    from mimo_ctx.middleware import ContextMiddleware

__all__ = ["ROOT", "HostHistory", "Reconciled", "chain_of"]

ROOT: Final = ""
"""The parent chain of a conversation's first host message."""

_RETRIES: Final = 8
"""Commits lost to other workers before a call gives up (each loser re-reads and decides)."""

_TOOL_LOOKBACK: Final = 32
"""Stored host messages read back to find the call a separately stored result answers."""

_T = TypeVar("_T")
_C = TypeVar("_C")


def chain_of(parent: str, fingerprint: str) -> str:
    """The chain of a host message: a digest of the chain before it and its fingerprint."""
    digest = hashlib.sha256(f"{parent}\x1f{fingerprint}".encode()).hexdigest()
    return digest[:32]


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What one :meth:`HostHistory.reconcile` did.

    Attributes:
        head: The chain of the host's last history item (pass it to
            :meth:`HostHistory.record` for the answer); None for an empty list.
        chains: For each host item, its chain (None for items that are not history:
            system prompts).
        skipped: The positions of the items that are not history, in order (kept
            from the last call for the items it saw, so O(new) to get).
        unchanged: How many leading items are the ones the last call saw: only the
            items from here on were fingerprinted.
        appended: The messages stored by this call, oldest first.
        dropped: Ids of stored messages this call marked off-branch.
        restored: Ids of off-branch messages this call brought back.
    """

    head: str | None
    chains: list[str | None]
    skipped: list[int] = field(default_factory=list[int])
    unchanged: int = 0
    appended: list[Message] = field(default_factory=list[Message])
    dropped: list[str] = field(default_factory=list[str])
    restored: list[str] = field(default_factory=list[str])


@dataclass(slots=True)
class _Seen:
    """The last host list: its items (kept as they are), fingerprints, chains and seed.

    ``items`` is the reconciler's own list, extended in place by the next call
    (:meth:`HostHistory._snapshot`); its first ``size`` entries are the last list.
    """

    items: list[object]
    fingerprints: list[str | None]
    chains: list[str | None]
    seed: str
    skipped: list[int]
    size: int


class HostHistory:
    """The reconciler of one session and agent (see the module docs).

    Get it from :meth:`ContextMiddleware.host_history
    <mimo_ctx.middleware.ContextMiddleware.host_history>`; one instance is shared
    by every wrapper and integration of the middleware.

    Args:
        middleware: The middleware whose store holds the session.
        session_id: The session.
        agent: The agent whose conversation it is.
    """

    def __init__(self, middleware: ContextMiddleware, session_id: str, agent: str) -> None:
        self._middleware = middleware
        self.session_id = session_id
        self.agent = agent
        self.lock = anyio.Lock()
        """Held by every reconcile and record; hosts may hold it around their own steps."""
        self.caches: dict[str, object] = {}
        """Per-session caches of the hosts (payload builders), released with the session;
        use :meth:`cached`."""
        self._nodes: dict[str, HostNode] = {}
        # Set once the store's index was read: from then on an attempt may first try
        # on what this process knows (see _trusting).
        self._read = False
        self._seq = 0
        self._head: str | None = None
        self._branch: list[str] = []
        self._branch_at: dict[str, int] = {}
        self._seen: _Seen | None = None
        self._tools: dict[str, str] = {}

    def cached(self, key: str, kind: type[_C], make: Callable[[], _C]) -> _C:
        """The host cache ``key`` of this session (made on first use)."""
        found = self.caches.get(key)
        if not isinstance(found, kind):
            found = self.caches[key] = make()
        return found

    @property
    def head(self) -> str | None:
        """The chain the session's conversation ends at, as last read or written here."""
        return self._head

    @property
    def _store(self) -> Store:
        return self._middleware.store

    # -- the store's index ------------------------------------------------------------
    async def _refresh(self) -> None:
        """Read the nodes other callers wrote since the last read, and the head."""
        index = await self._store.host_index(self.session_id, agent=self.agent, since=self._seq)
        for node in index.nodes:
            self._nodes[node.chain] = node
        self._seq = max(self._seq, index.seq)
        self._set_head(index.head)
        self._read = True

    def _trusting(self) -> list[bool]:
        """Per attempt of a call: whether it decides on what this process knows, without
        reading the store's index first (one store round trip fewer per call).

        Only the first attempt, once the index was read, and it may only commit a head
        move: the store then writes nothing unless its head is still the one this
        process knows and none of the new nodes is stored already, so a decision on
        stale knowledge (another worker wrote meanwhile) is never written; the next
        attempt reads the index and decides anew. Every other outcome is decided on a
        fresh read, as before. The attempts after it are the :data:`_RETRIES`.
        """
        return [True, *[False] * _RETRIES] if self._read else [False] * _RETRIES

    def _set_head(self, head: str | None) -> None:
        if head == self._head:
            return
        self._head = head
        # O(new) when the head only moved forward.
        path, keep = self._up_to_branch(head)
        for dropped in self._branch[keep:]:
            del self._branch_at[dropped]
        del self._branch[keep:]
        for chain in reversed(path):
            self._branch_at[chain] = len(self._branch)
            self._branch.append(chain)

    def on_branch(self, chain: str) -> bool:
        """True when the host message ``chain`` is on the session's conversation."""
        return chain in self._branch_at

    def message_ids(self, chain: str) -> list[str]:
        """The stored messages a host message (by its chain) stands for."""
        node = self._nodes.get(chain)
        return list(node.message_ids) if node is not None else []

    # -- reconcile ----------------------------------------------------------------------
    async def reconcile(
        self,
        items: Sequence[_T],
        *,
        fingerprint: Callable[[_T], str | None],
        convert: Callable[[Sequence[_T]], Sequence[MessageDraft]],
    ) -> Reconciled:
        """Store what the session lacks of the host's list and follow its branch.

        Args:
            items: The host's whole list, oldest first.
            fingerprint: A host item's fingerprint; None for an item that is not
                part of the stored history (a system prompt, which the session's
                frozen prefix holds).
            convert: Turns the new history items (consecutive, oldest first) into
                drafts; a draft's ``item`` is the index of the item it came from.

        Returns:
            What was stored and dropped, and the chain the answer follows.

        Raises:
            ConversationMismatchError: The list shares nothing with the session's
                stored conversation.
            InvalidRequestError: ``convert`` rejected an item; nothing was stored.
            StoreError: The store failed, or other workers kept winning the race.
        """
        async with self.lock:
            host, same = self._snapshot(items)
            fingerprints = _prefix(self._seen.fingerprints if self._seen is not None else [], same)
            fingerprints.extend(fingerprint(item) for item in items[same:])
            typed_convert: Callable[[Sequence[object]], Sequence[MessageDraft]] = convert  # type: ignore[assignment]
            for trusted in self._trusting():
                if not trusted:
                    await self._refresh()
                outcome = await self._try(host, same, fingerprints, typed_convert, trusted=trusted)
                if outcome is not None:
                    return outcome
        raise StoreError(
            f"session {self.session_id}: other workers kept writing this conversation; "
            f"gave up after {_RETRIES} attempts"
        )

    def _snapshot(self, items: Sequence[object]) -> tuple[list[object], int]:
        """This call's own copy of the host's list, and how many leading items are the
        ones (or equal to the ones) the last call saw: O(new items) for a host list
        that only grew (:func:`~mimo_ctx._util.follow_copy`)."""
        seen = self._seen
        if seen is None:
            return list(items), 0
        same, current = follow_copy(seen.items, seen.size, items)
        return (seen.items if current else list(items)), same

    def _chains(self, same: int, fingerprints: list[str | None]) -> tuple[list[str | None], str]:
        """The chain of every host item, and the parent of the first history item."""
        seen = self._seen
        chains: list[str | None] = []
        seed = ROOT
        previous: str | None = None
        if seen is not None and same:
            chains = _prefix(seen.chains, same)
            previous = next((c for c in reversed(chains) if c is not None), None)
            if previous is not None:
                seed = seen.seed  # the first history item is in the reused prefix
        for position in range(len(chains), len(fingerprints)):
            fp = fingerprints[position]
            if fp is None:
                chains.append(None)
                continue
            if previous is None:
                seed = self._seed(fingerprints, position)
                previous = seed
            previous = chain_of(previous, fp)
            chains.append(previous)
        return chains, seed

    def _seed(self, fingerprints: list[str | None], first: int) -> str:
        """The parent chain of the host's first history item.

        The root when that item starts a stored conversation (or nothing is stored
        yet); else, when the host trimmed its front, the parent of the position on
        the session's conversation that matches the most of what follows.

        Raises:
            ConversationMismatchError: The item is nowhere on the conversation.
        """
        fp = fingerprints[first]
        assert fp is not None
        if not self._nodes or chain_of(ROOT, fp) in self._nodes:
            return ROOT
        rest = [f for f in fingerprints[first:] if f is not None]
        best: tuple[int, int] | None = None  # (matched, -position): most, then earliest
        for position, chain in enumerate(self._branch):
            if self._nodes[chain].fingerprint != fp:
                continue
            matched = 0
            while (
                matched < len(rest)
                and position + matched < len(self._branch)
                and self._nodes[self._branch[position + matched]].fingerprint == rest[matched]
            ):
                matched += 1
            if best is None or (matched, -position) > best:
                best = (matched, -position)
        if best is None:
            raise ConversationMismatchError(
                f"session {self.session_id}: the messages sent share nothing with this "
                "session's conversation (their first message is not in it). Use one "
                "session per conversation (another session_id), or let the wrapper pick "
                'one per conversation (conversations="per-first-message")',
                session_id=self.session_id,
            )
        return self._nodes[self._branch[-best[1]]].parent

    async def _try(
        self,
        host: list[object],
        same: int,
        fingerprints: list[str | None],
        convert: Callable[[Sequence[object]], Sequence[MessageDraft]],
        *,
        trusted: bool = False,
    ) -> Reconciled | None:
        """One attempt: decide from what is known, commit; None when another caller won
        (or, ``trusted``, when the outcome moves no head: see :meth:`_trusting`)."""
        chains, seed = self._chains(same, fingerprints)
        kept = self._seen.skipped if self._seen is not None else []
        skipped = [i for i in kept if i < same]
        skipped.extend(i for i in range(same, len(chains)) if chains[i] is None)
        end = len(chains)
        while end and chains[end - 1] is None:
            end -= 1
        if not end:
            self._seen = _Seen(host, fingerprints, chains, seed, skipped, len(host))
            return Reconciled(head=None, chains=chains, skipped=skipped, unchanged=same)
        head = chains[end - 1]
        assert head is not None
        if trusted and head == self._head:
            return None  # no head move to check what is known against: read first
        # Everything the last call saw was stored then (nodes are never removed), and
        # chains are prefix-closed: what follows the first unknown chain is new.
        first_new = next(
            (i for i in range(same, end) if chains[i] is not None and chains[i] not in self._nodes),
            None,
        )
        stop = end if first_new is None else first_new
        last_stored = next(
            (chains[i] for i in range(stop - 1, -1, -1) if chains[i] is not None), None
        )
        new_positions = (
            [] if first_new is None else [i for i in range(first_new, end) if chains[i] is not None]
        )
        dropped, restored = self._branch_change(last_stored)
        parent = last_stored if last_stored is not None else seed
        messages, nodes = await self._new_messages(
            host,
            new_positions,
            chains=chains,
            fingerprints=fingerprints,
            parent=parent,
            convert=convert,
        )
        updated = await self._marks(dropped, restored)
        move = None if head == self._head else HeadMove(expected=self._head, head=head)
        if nodes or updated or move is not None:
            committed = await self._store.commit_host_history(
                self.session_id,
                agent=self.agent,
                nodes=nodes,
                messages=messages,
                updated=updated,
                move=move,
            )
            if not committed:
                return None
            for node in nodes:
                self._nodes[node.chain] = node
            self._set_head(head)
        self._seen = _Seen(host, fingerprints, chains, seed, skipped, len(host))
        return Reconciled(
            head=head,
            chains=chains,
            skipped=skipped,
            unchanged=same,
            appended=messages,
            dropped=[m.id for m in updated if m.off_branch],
            restored=[m.id for m in updated if not m.off_branch],
        )

    def _branch_change(self, last_stored: str | None) -> tuple[list[str], list[str]]:
        """The chains leaving the conversation and the chains coming back onto it.

        ``last_stored`` is the chain of the host's last stored message: the
        conversation now runs through it, so the current branch is cut where it
        parts from it, and the path from there to it comes back.
        """
        if last_stored == self._head:
            return [], []
        path, cut = self._up_to_branch(last_stored)
        return list(self._branch[cut:]), list(reversed(path))

    def _up_to_branch(self, chain: str | None) -> tuple[list[str], int]:
        """Walk up from ``chain`` to the current branch.

        Returns the chains passed on the way (``chain`` first, none on the branch)
        and how many chains of the branch stay below them (where the branch and the
        path from ``chain`` part).
        """
        path: list[str] = []
        at = chain if chain is not None else ROOT
        while at != ROOT and at not in self._branch_at:
            path.append(at)
            at = self._nodes[at].parent
        return path, self._branch_at[at] + 1 if at != ROOT else 0

    async def _marks(self, dropped: list[str], restored: list[str]) -> list[Message]:
        """The stored messages to mark off-branch (``dropped``) or back on (``restored``)."""
        keep = {mid for chain in restored for mid in self._nodes[chain].message_ids}
        wanted: dict[str, bool] = {}
        for chain in dropped:
            for mid in self._nodes[chain].message_ids:
                if mid not in keep:
                    wanted[mid] = True
        for mid in keep:
            wanted[mid] = False
        out: list[Message] = []
        for mid, off in wanted.items():
            message = await self._store.get_message(mid)
            if message is not None and message.off_branch != off:
                out.append(message.model_copy(update={"off_branch": off}))
        return out

    async def _new_messages(
        self,
        host: list[object],
        positions: list[int],
        *,
        chains: list[str | None],
        fingerprints: list[str | None],
        parent: str,
        convert: Callable[[Sequence[object]], Sequence[MessageDraft]],
    ) -> tuple[list[Message], list[HostNode]]:
        """Convert the new host items (one run, so a call and its result are joined)."""
        if not positions:
            return [], []
        drafts = [d for d in convert([host[p] for p in positions]) if d.parts]
        messages = build_messages(
            drafts, session_id=self.session_id, agent=self.agent, finished=True
        )
        by_item: dict[int, list[str]] = {}
        for draft, message in zip(drafts, messages, strict=True):
            by_item.setdefault(draft.item, []).append(message.id)
        messages = await self._with_tool_names(messages, parent)
        links: list[tuple[str, str, list[str]]] = []
        for index, position in enumerate(positions):
            chain, fp = chains[position], fingerprints[position]
            assert chain is not None
            assert fp is not None
            links.append((chain, fp, by_item.get(index, [])))
        return messages, _linked(parent, self._depth(parent) + 1, links)

    def _depth(self, chain: str | None) -> int:
        node = self._nodes.get(chain) if chain is not None else None
        return node.depth if node is not None else -1

    async def _with_tool_names(self, messages: list[Message], parent: str) -> list[Message]:
        """Results stored apart from their call get the call's tool name (micro-compaction
        selects results by tool name, SPEC R4.5), read back from the stored conversation."""
        for message in messages:
            self._learn_tools(message)
        missing = {
            p.call_id
            for m in messages
            for p in m.parts
            if isinstance(p, ToolResultPart) and not p.tool and p.call_id not in self._tools
        }
        chain = parent
        looked = 0
        while missing and chain != ROOT and looked < _TOOL_LOOKBACK:
            node = self._nodes.get(chain)
            if node is None:
                break
            for mid in node.message_ids:
                stored = await self._store.get_message(mid)
                if stored is not None:
                    self._learn_tools(stored)
            missing -= self._tools.keys()
            chain = node.parent
            looked += 1
        out: list[Message] = []
        for message in messages:
            parts: list[Part] = []
            changed = False
            for part in message.parts:
                if (
                    isinstance(part, ToolResultPart)
                    and not part.tool
                    and part.call_id in self._tools
                ):
                    parts.append(part.model_copy(update={"tool": self._tools[part.call_id]}))
                    changed = True
                else:
                    parts.append(part)
            out.append(message.model_copy(update={"parts": parts}) if changed else message)
        return out

    def _learn_tools(self, message: Message) -> None:
        for part in message.parts:
            if isinstance(part, ToolPart):
                self._tools.setdefault(part.call_id, part.tool)

    # -- answers ------------------------------------------------------------------------
    async def record(
        self, message: Message, *, fingerprints: Sequence[str], after: str | None
    ) -> Message:
        """Store a model's answer and the host messages it will come back as.

        Goes through :meth:`ContextMiddleware.record
        <mimo_ctx.middleware.ContextMiddleware.record>` (usage estimated when the
        provider gave none, writer thresholds checked), which lets this write it.

        Args:
            message: The assistant message (with its usage).
            fingerprints: The fingerprints of the items the host will send back for
                it (several for a Responses answer: one per output item).
            after: The chain the request ended at (:attr:`Reconciled.head`).

        Returns:
            The message as stored: on the conversation when it still ends at
            ``after``; else (another call of the conversation answered first) kept
            off-branch, until the host sends it back.
        """
        stored: list[Message] = []

        async def commit(prepared: Message) -> Message:
            stored.append(await self._commit_answer(prepared, fingerprints, after))
            return stored[0]

        await self._middleware.record(message, commit=commit)
        return stored[0]

    async def _commit_answer(
        self, message: Message, fingerprints: Sequence[str], after: str | None
    ) -> Message:
        async with self.lock:
            for trusted in self._trusting():
                if not trusted:
                    await self._refresh()
                stored = await self._try_record(message, fingerprints, after, trusted=trusted)
                if stored is not None:
                    self._learn_tools(stored)
                    return stored
        raise StoreError(
            f"session {self.session_id}: other workers kept writing this conversation; "
            f"gave up recording an answer after {_RETRIES} attempts"
        )

    async def _try_record(
        self,
        message: Message,
        fingerprints: Sequence[str],
        after: str | None,
        *,
        trusted: bool = False,
    ) -> Message | None:
        parent = chain = after if after is not None else ROOT
        links: list[tuple[str, str, list[str]]] = []
        for index, fp in enumerate(fingerprints):
            chain = chain_of(chain, fp)
            links.append((chain, fp, [message.id] if index == 0 else []))
        nodes = _linked(parent, self._depth(after) + 1, links)
        if any(n.chain in self._nodes for n in nodes):
            # The same answer is stored already (an identical concurrent answer):
            # keep this one too, off the conversation, so nothing is lost.
            nodes = []
        on_branch = bool(nodes) and after == self._head
        if trusted and not on_branch:
            return None  # stored without a head move: decide on a fresh read
        stored = message if on_branch else message.model_copy(update={"off_branch": True})
        move = HeadMove(expected=after, head=nodes[-1].chain) if on_branch else None
        committed = await self._store.commit_host_history(
            self.session_id, agent=self.agent, nodes=nodes, messages=[stored], move=move
        )
        if not committed:
            return None
        for node in nodes:
            self._nodes[node.chain] = node
        if move is not None:
            self._set_head(move.head)
        return stored


def _prefix(values: list[_T], count: int) -> list[_T]:
    """The first ``count`` values: the list itself when that is all of it (the list of a
    host that only grew is extended in place, not copied: O(new) per call)."""
    if count == len(values):
        return values
    return values[:count]


def _linked(parent: str, depth: int, links: Sequence[tuple[str, str, list[str]]]) -> list[HostNode]:
    """The index nodes of consecutive host messages, each the parent of the next.

    ``links`` are ``(chain, fingerprint, message ids)`` in order; the first hangs
    below ``parent`` at ``depth``.
    """
    nodes: list[HostNode] = []
    for index, (chain, fingerprint, message_ids) in enumerate(links):
        nodes.append(
            HostNode(
                chain=chain,
                parent=parent,
                fingerprint=fingerprint,
                depth=depth + index,
                message_ids=message_ids,
            )
        )
        parent = chain
    return nodes
