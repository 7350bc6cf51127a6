"""History sync shared by the framework integrations (no framework import here).

Agent frameworks (pydantic-ai, LangChain) keep the conversation themselves and
resend all of it with every model request. :class:`SessionSync` turns that list
into the session's stored history without a second copy of anything:

* **Recognition.** Every framework message has a *key*: a stable identity the
  integration computes (LangChain's message id, or a digest of a pydantic-ai
  message's content), numbered by occurrence (``<key>#0``, ``<key>#1``...) so
  two identical messages stay two messages. A key seen before maps to the
  messages already stored for it, so they are never stored again — also after a
  rebuild hid them from the request, and after a restart: the key and the layout
  of every stored message are kept in its ``metadata`` under :data:`META_KEY`
  and read back the first time a process syncs the session.
* **New messages** are converted by the integration into :class:`Draft` s and
  appended in one store call, oldest first, so they sort after everything stored.
  Model responses are stored by :meth:`SessionSync.record` as they arrive (with
  their usage, which drives the trigger line).
* **The way back.** :meth:`SessionSync.plan` lines up a
  :class:`~mimo_ctx.middleware.RequestView` with what the framework sent: for each
  message to send, the framework message it came from (the *origin*, when it is in
  the current history) and the *slots* that say which framework part each stored
  part came from. An integration then sends the framework's own objects for
  everything the send rules left unchanged (byte-identical, prompt caches keep
  hitting), edits only what changed (cleared tool results), and converts what the
  framework never had (the rebuild boundary, the per-turn reminder).
* **Carried parts.** Framework part kinds the internal model does not know are
  stored as :class:`~mimo_ctx.messages.OpaquePart` s. The send rules never send
  an opaque part, so a stored message holding nothing else disappears from the
  view; :meth:`SessionSync.plan` puts such messages back where they belong while
  they are live (after the watermark and not folded into the activity digest,
  the same rule the view applies to every other message), so they reach the
  model unchanged instead of being dropped.

A session is synced by the integration that stored it: messages stored by other
means (an importer, ``add_user_message``) are sent as they are but are never
matched against the framework's history.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import anyio

from mimo_ctx.errors import MimoCtxError
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    Message,
    OpaquePart,
    Part,
    Role,
    TokenUsage,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView

__all__ = [
    "META_KEY",
    "Draft",
    "OutgoingItem",
    "SessionSync",
    "Slot",
    "extra_error",
    "session_sync",
]

META_KEY: Final = "mimo_ctx_integration"
"""Key of a stored message's ``metadata`` entry recording where it came from."""

T = TypeVar("T")


def extra_error(module: str, extra: str, package: str) -> ImportError:
    """The ImportError raised when an integration's framework is not installed."""
    return ImportError(
        f"mimo_ctx.integrations.{module} needs {package}, which is not installed: "
        f'pip install "mimo-ctx[{extra}]"'
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Draft:
    """One message to store, as an integration converted it from a framework message.

    Attributes:
        role: ``user``, ``assistant`` or ``tool``.
        parts: The internal parts, in order.
        origins: For each part, the index of the framework part it came from
            (several internal parts may share one, e.g. the items of one
            multimodal prompt), or None when it stands for no single part.
        finish: Finish reason of an assistant message (set: the message is complete).
        usage: Provider usage of an assistant message.
        model: The model that answered.
        provider_message_id: The provider's id of the response.
    """

    role: Role
    parts: list[Part] = field(default_factory=list["Part"])
    origins: list[int | None] = field(default_factory=list[int | None])
    finish: str | None = None
    usage: TokenUsage | None = None
    model: str | None = None
    provider_message_id: str | None = None

    def add(self, part: Part, origin: int | None) -> None:
        """Append a part that came from framework part ``origin``."""
        self.parts.append(part)
        self.origins.append(origin)


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


class SessionSync(Generic[T]):
    """What one integration has stored of one session's history (see the module docs).

    Get the shared instance with :func:`session_sync`; hold :attr:`lock` around a
    sync and the request built from it, so concurrent requests of one session do
    not store a message twice.

    Args:
        middleware: The engine.
        session_id: The session.
        source: The integration's name (``pydantic-ai``, ``langchain``).
        agent: The agent whose history this is.
    """

    def __init__(
        self, middleware: ContextMiddleware, session_id: str, *, source: str, agent: str
    ) -> None:
        self.middleware = middleware
        self.session_id = session_id
        self.source = source
        self.agent = agent
        self.lock = anyio.Lock()
        self._opened = False
        self._loaded = False
        self._by_key: dict[str, list[str]] = {}
        self._occurrences: dict[str, int] = {}
        self._stored: dict[str, _Stored] = {}
        self._all_opaque: dict[str, _Stored] = {}
        self._boundaries: dict[str, tuple[str | None, str | None]] = {}

    # -- session ----------------------------------------------------------------------
    async def open(
        self, *, project_id: str, system: str, tools: Sequence[dict[str, object]]
    ) -> None:
        """Create the session on first use, freezing ``system`` and ``tools`` as its prefix."""
        if self._opened:
            return
        await self.middleware.open_session(
            self.session_id, project_id=project_id, system=system, tools=tools
        )
        self._opened = True

    async def _load(self) -> None:
        if self._loaded:
            return
        stored = await self.middleware.store.list_messages(self.session_id, agent=self.agent)
        for message in stored:
            meta = message.metadata.get(META_KEY)
            if not isinstance(meta, Mapping):
                continue
            info: Mapping[str, Any] = meta  # pyright: ignore[reportUnknownVariableType]
            key = info.get("key")
            origins = info.get("origins")
            if info.get("source") != self.source or not isinstance(key, str):
                continue
            if not isinstance(origins, list) or len(origins) != len(message.parts):  # pyright: ignore[reportUnknownArgumentType]
                origins = [None] * len(message.parts)
            self._remember(key, message, [o if isinstance(o, int) else None for o in origins])  # pyright: ignore[reportUnknownVariableType]
        self._loaded = True

    def _remember(self, key: str, message: Message, origins: Sequence[int | None]) -> None:
        self._by_key.setdefault(key, []).append(message.id)
        base, _, number = key.rpartition("#")
        if number.isdigit():
            self._occurrences[base] = max(self._occurrences.get(base, 0), int(number) + 1)
        slots = tuple(
            Slot(p.id, origin, p if isinstance(p, OpaquePart) else None)
            for p, origin in zip(message.parts, origins, strict=True)
        )
        stored = _Stored(
            role=message.role,
            key=(message.time_created, message.id),
            slots=slots,
            all_opaque=bool(slots) and all(s.opaque is not None for s in slots),
        )
        self._stored[message.id] = stored
        if stored.all_opaque:
            self._all_opaque[message.id] = stored

    def _build(self, draft: Draft, key: str, now: int) -> Message:
        return Message(
            session_id=self.session_id,
            role=draft.role,
            agent=self.agent,
            time_created=now,
            time_completed=now if draft.role == "assistant" else None,
            finish=draft.finish,
            usage=draft.usage,
            model=draft.model,
            provider_message_id=draft.provider_message_id,
            parts=list(draft.parts),
            metadata={
                META_KEY: {"source": self.source, "key": key, "origins": list(draft.origins)}
            },
        )

    # -- framework -> store -------------------------------------------------------------
    async def sync(
        self,
        history: Sequence[T],
        *,
        key: Callable[[T], str],
        convert: Callable[[T, int], list[Draft]],
    ) -> dict[str, object]:
        """Store what is new in ``history``; map stored ids to their framework message.

        Args:
            history: Everything the framework is about to send, oldest first.
            key: A message's stable identity (occurrences are numbered here).
            convert: Turns a new message (and its index in ``history``) into drafts.

        Returns:
            Stored message id -> the message of ``history`` it came from, for every
            stored message of this history (new or recognised).
        """
        await self._load()
        counts: dict[str, int] = {}
        origins: dict[str, object] = {}
        new: list[tuple[str, Message, list[int | None]]] = []
        now = _now_ms()
        for index, item in enumerate(history):
            base = key(item)
            number = counts.get(base, 0)
            counts[base] = number + 1
            full = f"{base}#{number}"
            known = self._by_key.get(full)
            if known is None:
                for draft in convert(item, index):
                    if not draft.parts:
                        continue
                    if len(draft.origins) != len(draft.parts):
                        raise MimoCtxError("integration bug: a draft needs one origin per part")
                    message = self._build(draft, full, now)
                    new.append((full, message, list(draft.origins)))
                    origins[message.id] = item
            else:
                for stored_id in known:
                    origins[stored_id] = item
        if new:
            await self.middleware.append([m for _, m, _ in new])
            for full, message, message_origins in new:
                self._remember(full, message, message_origins)
        return origins

    async def record(self, base_key: str, draft: Draft) -> Message:
        """Store a model response (with its usage) the moment it arrives.

        ``base_key`` must be what the ``key`` function of :meth:`sync` gives for the
        response once the framework puts it in its history, so the next sync
        recognises it.
        """
        await self._load()
        number = self._occurrences.get(base_key, 0)
        full = f"{base_key}#{number}"
        message = self._build(draft, full, _now_ms())
        await self.middleware.record(message)
        self._remember(full, message, draft.origins)
        return message

    # -- view -> framework ---------------------------------------------------------------
    async def plan(self, view: RequestView, origins: Mapping[str, object]) -> list[OutgoingItem]:
        """Line up the view with the framework messages it came from.

        Args:
            view: What :meth:`~mimo_ctx.middleware.ContextMiddleware.prepare` returned.
            origins: The result of the :meth:`sync` that preceded it.

        Returns:
            The messages to send in order: the view's messages plus, where they
            belong, live stored messages that hold only carried parts.
        """
        items: list[OutgoingItem] = []
        for message in view.messages:
            stored = self._stored.get(message.id)
            items.append(
                OutgoingItem(
                    message=message,
                    role=message.role,
                    origin=origins.get(message.id),
                    slots=stored.slots if stored is not None else (),
                    is_boundary=message.id == view.boundary_id,
                )
            )
        carried = await self._carried(view)
        if not carried:
            return items
        out: list[OutgoingItem] = []
        pending = list(carried)
        for item in items:
            if item.message is not None and not item.is_boundary:
                position = (item.message.time_created, item.message.id)
                while pending and pending[0][0] < position:
                    out.append(self._carried_item(pending.pop(0)[1], origins))
            out.append(item)
        out.extend(self._carried_item(stored_id, origins) for _, stored_id in pending)
        return out

    def _carried_item(self, stored_id: str, origins: Mapping[str, object]) -> OutgoingItem:
        stored = self._stored[stored_id]
        return OutgoingItem(
            message=None, role=stored.role, origin=origins.get(stored_id), slots=stored.slots
        )

    async def _carried(self, view: RequestView) -> list[tuple[tuple[int, str], str]]:
        if not self._all_opaque:
            return []
        covered: str | None = None
        digested: str | None = None
        if view.boundary_id is not None:
            cached = self._boundaries.get(view.boundary_id)
            if cached is None:
                boundary = await self.middleware.store.get_message(view.boundary_id)
                cached = _boundary_range(boundary)
                self._boundaries[view.boundary_id] = cached
            covered, digested = cached
        live: list[tuple[tuple[int, str], str]] = []
        for stored_id, stored in self._all_opaque.items():
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


_SyncKey = tuple[str, str, str]
_registry: weakref.WeakKeyDictionary[ContextMiddleware, dict[_SyncKey, SessionSync[Any]]]
_registry = weakref.WeakKeyDictionary()


def session_sync(
    middleware: ContextMiddleware, session_id: str, *, source: str, agent: str = MAIN_AGENT
) -> SessionSync[Any]:
    """The one :class:`SessionSync` of this middleware, session, integration and agent.

    Shared by every integration object built on the same middleware, so two
    agents (or two runs) of one session never store a message twice.
    """
    if not session_id:
        raise MimoCtxError("session_id must be a non-empty string")
    syncs = _registry.get(middleware)
    if syncs is None:
        syncs = _registry[middleware] = {}
    key = (source, session_id, agent)
    found = syncs.get(key)
    if found is None:
        found = syncs[key] = SessionSync(middleware, session_id, source=source, agent=agent)
    return found
