"""What the framework integrations share (no framework import here).

Agent frameworks (pydantic-ai, LangChain) keep the conversation themselves and
resend all of it with every model request. :class:`IntegrationSync` hands that
list to the session's host-history reconciler (:mod:`mimo_ctx.reconcile`), the
one the provider wrappers use too, so the conversation rule is the same: a list
that extends the session appends, one that diverges is followed (what the
framework dropped leaves the view, storage keeps it), one that shares nothing is
refused with :class:`~mimo_ctx.errors.ConversationMismatchError`, and any worker
can serve any turn.

On top of the reconciler it keeps what an integration needs to send the
framework's own objects back:

* **Origins.** For each stored message, the framework message it was stored from
  (when that message is in the history the framework sent): updated only for the
  messages a call has not seen, so O(new messages) per call.
* **Slots.** Which framework part each stored part came from, kept in the stored
  message's ``metadata`` under :data:`META_KEY` by the integration's converter
  (:func:`new_draft`, :func:`add_part`). An integration then sends the framework's
  own objects for everything the send rules left unchanged (byte-identical,
  prompt caches keep hitting), edits only what changed (cleared tool results),
  and converts what the framework never had (the rebuild boundary, the per-turn
  reminder).
* **Carried parts.** Framework part kinds the internal model does not know are
  stored as :class:`~mimo_ctx.messages.OpaquePart` s. The send rules never send
  an opaque part, so a stored message holding nothing else disappears from the
  view; :meth:`IntegrationSync.plan` puts such messages back where they belong
  while they are live (after the watermark and not folded into the activity
  digest, the same rule the view applies to every other message), so they reach
  the model unchanged instead of being dropped.

Messages stored by other means (an importer, ``add_user_message``) are sent as
they are but are never matched against the framework's history.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import anyio

from mimo_ctx.checkpoint.protocol import SentRequest
from mimo_ctx.convert import MessageDraft, ToolOutcome, build_messages, tool_outcome
from mimo_ctx.errors import MimoCtxError
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    Message,
    OpaquePart,
    Part,
    Role,
    ToolPart,
    ToolResultPart,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.providers._payload import PayloadBuilder
from mimo_ctx.rebuild import RebuildCommand, describe_rebuild
from mimo_ctx.reconcile import HostHistory
from mimo_ctx.view import apply_send_rules, tool_results_by_call

__all__ = [
    "META_KEY",
    "IntegrationSync",
    "OutgoingItem",
    "Slot",
    "StandaloneWriterModel",
    "add_part",
    "extra_error",
    "new_draft",
    "own_outcomes",
    "stored_items",
]

META_KEY: Final = "mimo_ctx_integration"
"""Key of a stored message's ``metadata`` entry recording where its parts came from."""

T = TypeVar("T")


def extra_error(module: str, extra: str, package: str) -> ImportError:
    """The ImportError raised when an integration's framework is not installed."""
    return ImportError(
        f"mimo_ctx.integrations.{module} needs {package}, which is not installed: "
        f'pip install "mimo-ctx[{extra}]"'
    )


class StandaloneWriterModel:
    """The base of the integrations' checkpoint-writer models: they never fork.

    A framework builds its own request bytes, so a writer call through it cannot
    repeat the session's request (and hit its cache): every call is standalone.
    """

    def forks(self, sent: SentRequest) -> bool:
        """Never: see the class docs."""
        return False

    def can_fork(self) -> bool:
        """No."""
        return False


def own_outcomes(
    message: Message, results: Mapping[str, ToolResultPart]
) -> list[tuple[ToolPart, ToolOutcome]]:
    """The calls of an assistant message that no separately stored result answers
    (``results``), each with the outcome its own state gives (SPEC A10): the framework
    results sent right after the message."""
    return [
        (part, tool_outcome(part, results))
        for part in message.parts
        if isinstance(part, ToolPart) and part.call_id not in results
    ]


def new_draft(role: Role, source: str, **fields: Any) -> MessageDraft:
    """A draft of a framework message, ready to record where its parts come from."""
    return MessageDraft(role, metadata={META_KEY: {"source": source, "origins": []}}, **fields)


def add_part(draft: MessageDraft, part: Part, origin: int | None) -> None:
    """Append a part that came from framework part ``origin`` (None: from no single part)."""
    draft.parts.append(part)
    meta = cast(dict[str, Any], draft.metadata[META_KEY])
    cast(list[int | None], meta["origins"]).append(origin)


@dataclass(frozen=True, slots=True)
class Slot:
    """One part of a stored message and the framework part it came from.

    Attributes:
        part_id: The stored part's id (view copies keep it).
        origin: Index of the framework part in the origin message, if any.
        opaque: The part itself when it is an :class:`OpaquePart` (never in a view).
    """

    part_id: str
    origin: int | None
    opaque: OpaquePart | None = None


@dataclass(frozen=True, slots=True)
class OutgoingItem:
    """One message of the outgoing request, before conversion to framework types.

    Attributes:
        message: The view message (send rules applied); None for a stored message
            sent only for its carried (opaque) parts.
        role: The message's role.
        origin: The framework message it was stored from, when that message is in
            the history the framework just sent.
        slots: The stored message's parts in order (empty for messages this sync
            did not store: the boundary, messages added by other means).
        is_boundary: The message is the rebuild boundary.
    """

    message: Message | None
    role: Role
    origin: object | None
    slots: tuple[Slot, ...]
    is_boundary: bool = False


@dataclass(frozen=True, slots=True)
class _Stored:
    role: Role
    key: tuple[int, str]
    slots: tuple[Slot, ...]
    all_opaque: bool


@dataclass(slots=True)
class _Known:
    """What one integration knows of one session (kept with the session's reconciler)."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    opened: bool = False
    head: str | None = None
    origins: dict[str, object] = field(default_factory=dict[str, object])
    chains: dict[str, str] = field(default_factory=dict[str, str])
    stored: dict[str, _Stored] = field(default_factory=dict[str, _Stored])
    all_opaque: dict[str, _Stored] = field(default_factory=dict[str, _Stored])
    boundaries: dict[str, tuple[str | None, str | None]] = field(
        default_factory=dict[str, tuple[str | None, str | None]]
    )


class IntegrationSync:
    """One integration's view of one session's history (see the module docs).

    Hold :attr:`lock` around a sync and the request built from it, so concurrent
    requests of one session line up.

    Args:
        middleware: The engine.
        session_id: The session.
        source: The integration's name (``pydantic-ai``, ``langchain``).
        agent: The agent whose history this is.
    """

    def __init__(
        self,
        middleware: ContextMiddleware,
        session_id: str,
        *,
        source: str,
        agent: str = MAIN_AGENT,
    ) -> None:
        if not session_id:
            raise MimoCtxError("session_id must be a non-empty string")
        self.middleware = middleware
        self.session_id = session_id
        self.source = source
        self.agent = agent
        self.history: HostHistory = middleware.host_history(session_id, agent=agent)
        self._known = self.history.cached(f"integration:{source}", _Known, _Known)

    @property
    def lock(self) -> anyio.Lock:
        """The session's lock for this integration's steps."""
        return self._known.lock

    async def rebuild(self, command: RebuildCommand) -> str:
        """Run the user's ``/rebuild [focus]`` and say how it ended (the answer to send).

        A manual rebuild starts no model turn (SPEC A3). The view is prepared again
        so the answer's estimated usage is the rebuilt request's, not the old one's.
        """
        report = await self.middleware.rebuild(self.session_id, focus=command.focus)
        await self.middleware.prepare(self.session_id, agent=self.agent)
        return describe_rebuild(report)

    # -- session ----------------------------------------------------------------------
    async def open(
        self, *, project_id: str, system: str, tools: Sequence[dict[str, object]]
    ) -> None:
        """Create the session on first use, freezing ``system`` and ``tools`` as its prefix."""
        if self._known.opened:
            return
        await self.middleware.open_session(
            self.session_id, project_id=project_id, system=system, tools=tools
        )
        self._known.opened = True

    def _remember(self, message: Message) -> None:
        meta = message.metadata.get(META_KEY)
        info: Mapping[str, Any] = cast(Mapping[str, Any], meta) if isinstance(meta, Mapping) else {}
        origins: object = info.get("origins")
        if info.get("source") != self.source:
            return
        if not isinstance(origins, list) or len(cast(list[Any], origins)) != len(message.parts):
            origins = [None] * len(message.parts)
        slots = tuple(
            Slot(p.id, o if isinstance(o, int) else None, p if isinstance(p, OpaquePart) else None)
            for p, o in zip(message.parts, cast(list[Any], origins), strict=True)
        )
        stored = _Stored(
            role=message.role,
            key=(message.time_created, message.id),
            slots=slots,
            all_opaque=bool(slots) and all(s.opaque is not None for s in slots),
        )
        self._known.stored[message.id] = stored
        if stored.all_opaque:
            self._known.all_opaque[message.id] = stored

    # -- framework -> store -------------------------------------------------------------
    async def sync(
        self,
        history: Sequence[T],
        *,
        key: Callable[[T], str | None],
        convert: Callable[[T, bool], list[MessageDraft]],
    ) -> None:
        """Store what is new in ``history`` and learn which framework message each stored
        message came from.

        Args:
            history: Everything the framework is about to send, oldest first.
            key: A message's fingerprint (None: prefix material, not history).
            convert: Turns a new message into drafts (made with :func:`new_draft`);
                the flag is True for the first message of ``history``.
        """
        # Not copied (O(new) per call): the reconciler keeps its own copy of the list,
        # extended in place while the framework's only grows.
        host = history if isinstance(history, list) else list(history)
        first = host[0] if host else None

        def drafts(run: Sequence[T]) -> list[MessageDraft]:
            out: list[MessageDraft] = []
            for index, item in enumerate(run):
                for draft in convert(item, item is first):
                    draft.item = index
                    out.append(draft)
            return out

        done = await self.history.reconcile(host, fingerprint=key, convert=drafts)
        self._known.head = done.head
        for message in done.appended:
            self._remember(message)
        known = self._known
        for position in range(done.unchanged, len(host)):
            chain = done.chains[position]
            if chain is None:
                continue
            for message_id in self.history.message_ids(chain):
                known.origins[message_id] = host[position]
                known.chains[message_id] = chain
                if message_id not in known.stored:
                    # Stored by another worker (or before this process): read it once.
                    message = await self.middleware.store.get_message(message_id)
                    if message is not None:
                        self._remember(message)

    async def record(self, key: str, draft: MessageDraft, origin: object) -> Message:
        """Store a model response (with its usage) the moment it arrives.

        ``key`` must be what the ``key`` function of :meth:`sync` gives for the
        response once the framework puts it in its history, so the next sync
        recognises it; ``origin`` is the framework's response object.
        """
        message = build_messages(
            [draft], session_id=self.session_id, agent=self.agent, finished=True
        )
        if not message:
            raise MimoCtxError("integration bug: a response draft without parts")
        stored = await self.history.record(message[0], fingerprints=[key], after=self._known.head)
        self._remember(stored)
        self._known.origins[stored.id] = origin
        if self.history.head is not None and not stored.off_branch:
            self._known.chains[stored.id] = self.history.head
        return stored

    # -- view -> framework ---------------------------------------------------------------
    async def outgoing(
        self,
        view: RequestView,
        convert: Callable[[Sequence[OutgoingItem], Mapping[str, ToolResultPart]], list[Any]],
        *,
        merges: Callable[[Any, Any], bool] | None = None,
    ) -> list[Any]:
        """The framework messages of the view, converted in O(new messages).

        The view is planned (:meth:`plan`) and converted run by run with the
        session's builder (:class:`~mimo_ctx.providers._payload.PayloadBuilder`):
        the messages of the last view's unchanged prefix are reused, only the rest
        is planned and converted. A change in the carried messages converts all.

        Args:
            view: What :meth:`~mimo_ctx.middleware.ContextMiddleware.prepare` returned.
            convert: Planned items of a run, and the separately stored tool results
                the run holds -> the framework's messages.
            merges: True for two adjacent converted messages the converter merges.
        """
        carried = await self._carried(view)
        builder = self.history.cached(
            f"outgoing:{self.source}",
            PayloadBuilder,
            lambda: PayloadBuilder(None, _unset, merges=merges, mark=False),
        )

        def run(messages: Sequence[Message], previous: Message | None) -> list[Any]:
            items = self._plan(messages, view.boundary_id, carried, previous)
            return convert(items, tool_results_by_call(messages))

        return builder.build(
            view.messages, view.boundary_id, key=tuple(c for _, c in carried), convert=run
        )

    def _plan(
        self,
        messages: Sequence[Message],
        boundary_id: str | None,
        carried: Sequence[tuple[tuple[int, str], str]],
        previous: Message | None,
    ) -> list[OutgoingItem]:
        """The planned items of a run of view messages (see :meth:`plan`): the carried
        messages listed after ``previous`` (and not before an earlier view message)
        go into this run."""
        known = self._known
        floor = (
            None
            if previous is None or previous.id == boundary_id
            else (previous.time_created, previous.id)
        )
        pending = [c for c in carried if floor is None or c[0] > floor]
        out: list[OutgoingItem] = []
        for message in messages:
            stored = known.stored.get(message.id)
            item = OutgoingItem(
                message=message,
                role=message.role,
                origin=known.origins.get(message.id),
                slots=stored.slots if stored is not None else (),
                is_boundary=message.id == boundary_id,
            )
            if not item.is_boundary:
                position = (message.time_created, message.id)
                while pending and pending[0][0] < position:
                    out.append(self._carried_item(pending.pop(0)[1]))
            out.append(item)
        out.extend(self._carried_item(stored_id) for _, stored_id in pending)
        return out

    async def plan(self, view: RequestView) -> list[OutgoingItem]:
        """Line up the whole view with the framework messages it came from.

        Returns:
            The messages to send in order: the view's messages plus, where they
            belong, live stored messages that hold only carried parts.
        """
        carried = await self._carried(view)
        return self._plan(view.messages, view.boundary_id, carried, None)

    def _carried_item(self, stored_id: str) -> OutgoingItem:
        stored = self._known.stored[stored_id]
        return OutgoingItem(
            message=None,
            role=stored.role,
            origin=self._known.origins.get(stored_id),
            slots=stored.slots,
        )

    async def _carried(self, view: RequestView) -> list[tuple[tuple[int, str], str]]:
        known = self._known
        if not known.all_opaque:
            return []
        covered: str | None = None
        digested: str | None = None
        if view.boundary_id is not None:
            cached = known.boundaries.get(view.boundary_id)
            if cached is None:
                boundary = await self.middleware.store.get_message(view.boundary_id)
                cached = _boundary_range(boundary)
                known.boundaries[view.boundary_id] = cached
            covered, digested = cached
        live: list[tuple[tuple[int, str], str]] = []
        for stored_id, stored in known.all_opaque.items():
            chain = known.chains.get(stored_id)
            if chain is None or not self.history.on_branch(chain):
                continue  # the framework left it behind (the session follows it)
            # The rule the view applies (SPEC R8.2, R7.3): hidden up to the
            # watermark; after it, folded into the digest unless a user message.
            if covered is not None and stored_id <= covered:
                continue
            if digested is not None and stored_id <= digested and stored.role != "user":
                continue
            live.append((stored.key, stored_id))
        live.sort()
        return live


def _boundary_range(boundary: Message | None) -> tuple[str | None, str | None]:
    if boundary is None:
        return (None, None)
    checkpoint = boundary.checkpoint_part
    if checkpoint is not None:
        return (checkpoint.covered_up_to, checkpoint.digest_up_to)
    for part in boundary.parts:
        if isinstance(part, CompactionPart):
            return (part.covered_up_to, None)
    return (None, None)


def _unset(messages: Sequence[Message], previous: Message | None) -> list[Any]:
    raise MimoCtxError("integration bug: an outgoing builder without its converter")


def stored_items(messages: Sequence[Message]) -> tuple[list[OutgoingItem], list[Message]]:
    """The outgoing items of stored messages sent without a framework history, and the view.

    The send rules are applied (SPEC A10); a message that only carries parts of
    the integration (which the send rules drop) is sent as it was.
    """
    boundaries = {m.id for m in messages if m.is_boundary}
    sent = apply_send_rules(messages)
    by_id = {m.id: m for m in sent}
    items: list[OutgoingItem] = []
    for message in messages:
        slots = tuple(
            Slot(p.id, None, p if isinstance(p, OpaquePart) else None) for p in message.parts
        )
        view = by_id.get(message.id)
        if view is not None:
            items.append(
                OutgoingItem(view, view.role, None, slots, is_boundary=message.id in boundaries)
            )
        elif slots and all(s.opaque is not None for s in slots):
            # Only carried parts: the send rules drop it, it is sent as it was.
            items.append(OutgoingItem(None, message.role, None, slots))
    return items, sent
