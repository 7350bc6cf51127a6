"""What the client wrappers share: history sync, one overflow retry, recording streams.

Nothing here imports a provider SDK: the OpenAI and Anthropic wrappers
(:mod:`mimo_ctx.providers.openai_client`, :mod:`mimo_ctx.providers.anthropic_client`)
and framework integrations plug their formats in.

History sync (:class:`HistorySync`). A host that calls a provider resends its
whole conversation every turn; the store must get only what is new, and must
keep recognising what it already has after a rebuild (the host still sends its
old full list, the store now starts at a boundary). Each host item (one provider
message or input item) gets a *fingerprint*, a digest of what identifies it:
the tool-call ids for calls and results, else its role and canonical content
(:func:`fingerprint`). The fingerprints of items already stored are kept per
session and agent, in the order they were stored, and mapped to the ids of the
messages stored for them. A new host list is matched against them in order
(an item takes the first unused stored occurrence at or after the previous
match, else the first unused one anywhere), so that

* a list that only grew stores only its tail;
* a message typed twice ("continue") is stored twice, since each stored
  occurrence matches one host item;
* a host that trims or edits the front of its own list stores only the edited
  items.

The fingerprints are also written into the stored messages' ``metadata``
(:data:`HOST_METADATA_KEY`), so a new process rebuilds the index from the store
instead of storing the whole history again. Runs of consecutive new items are
converted together (so a call and its result that arrive together are joined)
and appended in one store call. Tool results stored apart from their call get
the call's tool name (micro-compaction selects results by tool name, SPEC R4.5).

Our choices and limits: the index is kept in memory per
:class:`~mimo_ctx.middleware.ContextMiddleware` (shared by every wrapper on it),
so one conversation should be driven by one process at a time; content a host
changes in place (an edited old message) is stored again as a new message, at
the end (the store never rewrites history).

One overflow retry (:class:`RecoveringCall`). Prepare, build the payload, send;
on a context overflow, :meth:`~mimo_ctx.middleware.ContextMiddleware.on_error`
rebuilds and the request is built and sent once more. Any other error is
re-raised unchanged (the same exception object). An overflow on the retry, or a
second overflow for the same usage, raises
:class:`~mimo_ctx.errors.ContextOverflowError` chained to the provider's error.

Streams (:class:`RecordingStream`). Events are passed to the host one by one,
unchanged, while a :class:`StreamAdapter` accumulates the final message; when the
stream ends the message is recorded with its usage. Events that only open a
stream (``message_start``, ``response.created``...) are held back until the
first event with content, so that an overflow reported at the start of a stream
(an error event, or the SDK raising one) is retried transparently: the host then
sees only the retried stream. An overflow reported after content was passed on
cannot be taken back: the rebuild still runs (so the next turn fits) and the
provider's error reaches the host unchanged. A stream the host closes before
its end is not recorded (if the host keeps the partial answer, it sends it back
next turn and the sync stores it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import weakref
from bisect import bisect_left
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Generic, Protocol, Self, TypeVar, cast

import anyio

from mimo_ctx.errors import ContextOverflowError, InvalidRequestError, ProviderReportedOverflow
from mimo_ctx.messages import (
    MAIN_AGENT,
    CheckpointPart,
    CompactionPart,
    Message,
    Part,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.tokens import estimate_message_tokens
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER, COMPACTION_SUMMARY_HEADER

__all__ = [
    "HOST_METADATA_KEY",
    "USAGE_ESTIMATED_KEY",
    "ClientWrapper",
    "HistorySync",
    "ProviderReportedOverflow",
    "RecordingStream",
    "RecoveringCall",
    "SessionBinding",
    "StreamAdapter",
    "converter_input",
    "fingerprint",
    "plain",
]

HOST_METADATA_KEY: Final = "mimo_ctx_host"
"""``Message.metadata`` key listing the fingerprints of the host items a message stands for."""

USAGE_ESTIMATED_KEY: Final = "mimo_ctx_usage_estimated"
"""``Message.metadata`` key set to True when the provider reported no usage and the
wrapper estimated it (request estimate as input, answer estimate as output)."""

_T = TypeVar("_T")
_R = TypeVar("_R")
_P = TypeVar("_P")
_E = TypeVar("_E")
_E_contra = TypeVar("_E_contra", contravariant=True)


def plain(value: object) -> Any:
    """``value`` as plain JSON data: SDK (pydantic) objects dumped, mappings and lists copied.

    Hosts put SDK objects in their histories (``messages.append(completion.choices[0].message)``);
    the SDKs serialise them with ``model_dump(exclude_unset=True)``, and so does this.
    """
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        value = dump(mode="json", exclude_unset=True)
    if isinstance(value, Mapping):
        mapping: Mapping[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
        return {str(k): plain(v) for k, v in mapping.items()}
    if isinstance(value, list | tuple):
        items = cast(Sequence[Any], value)
        return [plain(v) for v in items]
    return value


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        mapping: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
        return {k: _drop_none(v) for k, v in mapping.items() if v is not None}
    if isinstance(value, list):
        items: list[Any] = value  # pyright: ignore[reportUnknownVariableType]
        return [_drop_none(v) for v in items]
    return value


def fingerprint(kind: str, *values: object) -> str:
    """A stable digest of a host item: ``kind`` plus the canonical JSON of ``values``.

    ``None`` members of mappings are ignored (an SDK object dumps unset fields as
    ``None``, a host's dict leaves them out), keys are sorted.
    """
    try:
        data = json.dumps(
            _drop_none(plain(list(values))),
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
            default=repr,
        )
    except ValueError as exc:  # NaN or a cycle in a host payload
        raise InvalidRequestError(f"a {kind} message cannot be serialised: {exc}") from exc
    return f"{kind}:{hashlib.sha256(data.encode('utf-8')).hexdigest()[:32]}"


# --------------------------------------------------------------------------- #
# History sync
# --------------------------------------------------------------------------- #


@dataclass(slots=True)
class _Index:
    """The host items already stored for one session and agent, in stored order."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    loaded: bool = False
    order: list[str] = field(default_factory=list[str])
    stored: list[tuple[str, ...]] = field(default_factory=list[tuple[str, ...]])
    positions: dict[str, list[int]] = field(default_factory=dict[str, list[int]])
    tool_names: dict[str, str] = field(default_factory=dict[str, str])

    def add(self, fp: str, ids: tuple[str, ...]) -> None:
        self.positions.setdefault(fp, []).append(len(self.order))
        self.order.append(fp)
        self.stored.append(ids)

    def learn_tools(self, message: Message) -> None:
        for part in message.parts:
            if isinstance(part, ToolPart):
                self.tool_names.setdefault(part.call_id, part.tool)

    def match(self, fps: Sequence[str]) -> list[int | None]:
        """For each host fingerprint, the stored entry it is (None: new)."""
        used: set[int] = set()
        cursor = 0
        out: list[int | None] = []
        for fp in fps:
            candidates = self.positions.get(fp, [])
            start = bisect_left(candidates, cursor)
            pick = next((c for c in candidates[start:] if c not in used), None)
            if pick is None:
                # Out of order (the host moved or trimmed items): any unused occurrence.
                pick = next((c for c in candidates[:start] if c not in used), None)
            if pick is None:
                out.append(None)
                continue
            used.add(pick)
            cursor = max(cursor, pick + 1)
            out.append(pick)
        return out


_INDEXES: weakref.WeakKeyDictionary[ContextMiddleware, dict[tuple[str, str], _Index]] = (
    weakref.WeakKeyDictionary()
)


def _index_for(middleware: ContextMiddleware, session_id: str, agent: str) -> _Index:
    per_middleware = _INDEXES.get(middleware)
    if per_middleware is None:
        per_middleware = _INDEXES[middleware] = {}
    key = (session_id, agent)
    index = per_middleware.get(key)
    if index is None:
        index = per_middleware[key] = _Index()
    return index


def _tag(message: Message, fps: Sequence[str]) -> Message:
    if not fps:
        return message
    known: object = message.metadata.get(HOST_METADATA_KEY)
    merged: list[Any] = list(fps)
    if isinstance(known, list):
        merged = [*cast(list[Any], known), *fps]
    metadata: dict[str, Any] = {**message.metadata, HOST_METADATA_KEY: merged}
    return message.model_copy(update={"metadata": metadata})


def _with_tool_names(message: Message, names: Mapping[str, str]) -> Message:
    parts: list[Part] = []
    changed = False
    for part in message.parts:
        if isinstance(part, ToolResultPart) and not part.tool and part.call_id in names:
            parts.append(part.model_copy(update={"tool": names[part.call_id]}))
            changed = True
        else:
            parts.append(part)
    return message.model_copy(update={"parts": parts}) if changed else message


class HistorySync:
    """Stores only the new part of a history a host resends every turn (see the module docs).

    Args:
        middleware: The middleware whose store holds the session.
        agent: The agent the host's messages belong to.
    """

    def __init__(self, middleware: ContextMiddleware, *, agent: str = MAIN_AGENT) -> None:
        self.middleware = middleware
        self.agent = agent

    async def _load(self, session_id: str, index: _Index) -> None:
        """Fill ``index`` from the store's metadata once (call with ``index.lock`` held)."""
        if not index.loaded:
            stored = await self.middleware.store.list_messages(session_id, agent=self.agent)
            for message in stored:
                index.learn_tools(message)
                fps = message.metadata.get(HOST_METADATA_KEY)
                if isinstance(fps, list):
                    for fp in fps:  # pyright: ignore[reportUnknownVariableType]
                        if isinstance(fp, str):
                            index.add(fp, (message.id,))
            index.loaded = True

    async def sync(
        self,
        session_id: str,
        items: Sequence[_T],
        *,
        fingerprints: Sequence[str],
        convert: Callable[[Sequence[_T]], Sequence[Message]],
    ) -> list[Message]:
        """Store the items not stored yet; return the messages appended.

        Args:
            session_id: The session (it must exist).
            items: The host's history items, oldest first (system prompts excluded).
            fingerprints: One per item (:func:`fingerprint`).
            convert: Turns a run of consecutive new items into messages of this
                session and agent (a provider ``from_*`` converter).

        Raises:
            InvalidRequestError: ``convert`` rejected an item; nothing was stored.
        """
        if len(items) != len(fingerprints):
            raise InvalidRequestError(
                f"{len(items)} history items but {len(fingerprints)} fingerprints"
            )
        index = _index_for(self.middleware, session_id, self.agent)
        async with index.lock:
            await self._load(session_id, index)
            matched = index.match(fingerprints)
            runs: list[list[int]] = []
            for position, entry in enumerate(matched):
                if entry is not None:
                    continue
                if runs and runs[-1][-1] == position - 1:
                    runs[-1].append(position)
                else:
                    runs.append([position])
            batches: list[tuple[list[str], list[Message]]] = []
            for run in runs:
                converted = list(convert([items[p] for p in run]))
                for message in converted:
                    index.learn_tools(message)
                batches.append(([fingerprints[p] for p in run], converted))
            appended: list[Message] = []
            for fps, converted in batches:
                messages = [_with_tool_names(m, index.tool_names) for m in converted]
                if messages:
                    messages[0] = _tag(messages[0], fps)
                appended.extend(messages)
            if appended:
                await self.middleware.append(appended)
            for fps, converted in batches:
                ids = tuple(m.id for m in converted)
                for fp in fps:
                    index.add(fp, ids)
            return appended

    async def record(self, message: Message, *, fingerprints: Sequence[str]) -> Message:
        """Record an assistant answer and remember the items the host will resend for it.

        Args:
            message: The assistant message built from the provider's response.
            fingerprints: The fingerprints of the items the host is expected to
                send back for it next turn.

        Returns:
            The message as recorded (with its fingerprints in ``metadata``).
        """
        index = _index_for(self.middleware, message.session_id, self.agent)
        tagged = _tag(message, fingerprints)
        async with index.lock:
            await self._load(message.session_id, index)
            await self.middleware.record(tagged)
            index.learn_tools(tagged)
            for fp in fingerprints:
                index.add(fp, (tagged.id,))
        return tagged

    async def stored_ids(self, session_id: str, fingerprint: str) -> list[tuple[str, ...]]:
        """The stored message ids of every stored occurrence of ``fingerprint`` (for hosts
        and tests that want to see what a host item was stored as)."""
        index = _index_for(self.middleware, session_id, self.agent)
        async with index.lock:
            await self._load(session_id, index)
            return [index.stored[p] for p in index.positions.get(fingerprint, [])]


def converter_input(view: RequestView) -> list[Message]:
    """The view's messages with the boundary recognisable again, for a ``to_*`` converter.

    The view already has the send rules applied, so its boundary's ``checkpoint``
    (or ``compaction``) part reads as a plain text; the converters send a boundary
    as one text only when they can tell it is one (SPEC R8.1). This puts the part
    back (the send rules turn it into the same text again), so the boundary is
    sent as one text whatever the provider.
    """
    if view.boundary_id is None:
        return view.messages
    out = list(view.messages)
    for position, message in enumerate(out):
        if message.id != view.boundary_id:
            continue
        if message.is_boundary or not message.parts:
            return out
        first = message.parts[0]
        marker: Part | None = None
        if isinstance(first, TextPart) and first.text == CHECKPOINT_SUMMARY_HEADER:
            marker = CheckpointPart(id=first.id, covered_up_to="")
        elif isinstance(first, TextPart) and first.text.startswith(COMPACTION_SUMMARY_HEADER):
            summary = first.text[len(COMPACTION_SUMMARY_HEADER) :].removeprefix("\n\n")
            marker = CompactionPart(id=first.id, summary=summary)
        if marker is not None:
            out[position] = message.model_copy(update={"parts": [marker, *message.parts[1:]]})
        return out
    return out


# --------------------------------------------------------------------------- #
# Sending with one overflow retry
# --------------------------------------------------------------------------- #


class RecoveringCall(Generic[_P, _R]):
    """Prepare, build, send; on a context overflow rebuild once and send again.

    Args:
        middleware: The middleware.
        session_id: The session.
        agent: The agent taking the turn.
        build: Turns a request view into the payload (and validates it).
        send: Sends a payload and returns the provider's answer.
    """

    def __init__(
        self,
        middleware: ContextMiddleware,
        session_id: str,
        *,
        agent: str,
        build: Callable[[RequestView], _P],
        send: Callable[[_P], Awaitable[_R]],
    ) -> None:
        self.middleware = middleware
        self.session_id = session_id
        self.agent = agent
        self._build = build
        self._send = send
        self.retried = False
        self.view: RequestView | None = None
        self.payloads: list[_P] = []

    async def _payload(self) -> _P:
        # Errors here (store, validator) are ours, not the provider's: they propagate
        # as they are and are never taken for an overflow.
        self.view = await self.middleware.prepare(self.session_id, agent=self.agent)
        payload = self._build(self.view)
        self.payloads.append(payload)
        return payload

    async def run(self) -> _R:
        """Send the request (retrying once after a rebuild on an overflow)."""
        payload = await self._payload()
        try:
            return await self._send(payload)
        except Exception as exc:
            return await self.recover(exc)

    async def recover(self, error: Exception) -> _R:
        """Handle an overflow the provider reported: rebuild and send once more.

        Raises:
            ContextOverflowError: This call already retried, or the usage was
                already recovered (chained to ``error``).
            Exception: ``error`` itself when it is not an overflow.
        """
        if not is_context_overflow(error):
            raise error
        if self.retried:
            raise ContextOverflowError(
                f"session {self.session_id}: the request still overflows the context "
                "window after a rebuild; not retrying again"
            ) from error
        if not await self.middleware.on_error(self.session_id, error, agent=self.agent):
            raise error
        self.retried = True
        payload = await self._payload()
        try:
            return await self._send(payload)
        except Exception as again:
            if is_context_overflow(again):
                raise ContextOverflowError(
                    f"session {self.session_id}: the request still overflows the context "
                    "window after a rebuild; not retrying again"
                ) from again
            raise


# --------------------------------------------------------------------------- #
# Session binding and recording
# --------------------------------------------------------------------------- #


class SessionBinding:
    """One wrapped client's link to its session: opening it, syncing, sending, recording.

    Args:
        middleware: The middleware.
        session_id: The session every call of the wrapper belongs to.
        agent: The agent the calls are made for.
        project_id: Project of the session when the wrapper creates it.
    """

    def __init__(
        self,
        middleware: ContextMiddleware,
        session_id: str,
        *,
        agent: str = MAIN_AGENT,
        project_id: str = "default",
    ) -> None:
        self.middleware = middleware
        self.session_id = session_id
        self.agent = agent
        self.project_id = project_id
        self.history = HistorySync(middleware, agent=agent)
        self._opened = False

    async def open(self, *, system: str, tools: Sequence[dict[str, Any]]) -> None:
        """Open (or create, with this frozen prefix) the session on first use."""
        if self._opened:
            return
        await self.middleware.open_session(
            self.session_id, project_id=self.project_id, system=system, tools=tools
        )
        self._opened = True

    def call(
        self, build: Callable[[RequestView], _P], send: Callable[[_P], Awaitable[_R]]
    ) -> RecoveringCall[_P, _R]:
        """A :class:`RecoveringCall` for this session."""
        return RecoveringCall(
            self.middleware, self.session_id, agent=self.agent, build=build, send=send
        )

    async def record(
        self, message: Message | None, *, fingerprints: Sequence[str], view: RequestView | None
    ) -> Message | None:
        """Record an answer; usage the provider did not report is estimated.

        Args:
            message: The assistant message (None: nothing to record).
            fingerprints: What the host will send back for it.
            view: The request view it answered (its token estimate stands in for
                missing input usage).
        """
        if message is None:
            return None
        if message.usage is None:
            input_tokens = view.tokens if view is not None else 0
            usage = TokenUsage(input=input_tokens, output=estimate_message_tokens(message))
            message = message.model_copy(
                update={"usage": usage, "metadata": {**message.metadata, USAGE_ESTIMATED_KEY: True}}
            )
        return await self.history.record(message, fingerprints=fingerprints)


# --------------------------------------------------------------------------- #
# Recording streams
# --------------------------------------------------------------------------- #


class StreamAdapter(Protocol[_E_contra]):
    """What a :class:`RecordingStream` needs to know about one provider's events."""

    def reset(self) -> None:
        """Forget what was accumulated (a retried stream starts over)."""
        ...

    def add(self, event: _E_contra) -> None:
        """Accumulate one event passed to the host."""
        ...

    def is_preamble(self, event: _E_contra) -> bool:
        """True for an event that only opens the stream (held back until content arrives)."""
        ...

    def overflow(self, event: _E_contra) -> str | None:
        """A description when the event reports a context overflow, else None."""
        ...

    def answer(self) -> tuple[Message | None, tuple[str, ...]]:
        """The accumulated assistant message (None when there is none to record) and
        the fingerprints of what the host will send back for it."""
        ...


async def _close_quietly(stream: object) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        with anyio.CancelScope(shield=True):
            try:
                result = close()
                if isinstance(result, Awaitable):
                    await result
            except Exception:  # closing a failed stream must not mask its error
                pass


def _signal_overflow(detail: str, event: object) -> None:
    raise ProviderReportedOverflow(detail, event)


class RecordingStream(Generic[_E]):
    """A provider stream passed through event by event, recorded when it ends.

    Iterate it like the SDK's stream (``async for``); ``close()``, ``async with``
    and ``response`` work as on the SDK's object, and other public attributes are
    read from the current underlying stream.

    Args:
        binding: The wrapper's session binding.
        call: The call that opened ``stream`` (used to retry once).
        stream: The SDK stream.
        adapter: The provider's event adapter.
    """

    def __init__(
        self,
        binding: SessionBinding,
        call: RecoveringCall[Any, Any],
        stream: Any,
        adapter: StreamAdapter[_E],
    ) -> None:
        self._binding = binding
        self._call = call
        self._stream: Any = stream
        self._adapter = adapter
        self._iterator: AsyncIterator[_E] | None = None
        self.recorded: Message | None = None
        """The assistant message recorded at the end of the stream, once it ended."""

    @property
    def response(self) -> Any:
        """The HTTP response of the current underlying stream."""
        return self._stream.response

    @property
    def wrapped(self) -> Any:
        """The current underlying SDK stream."""
        return self._stream

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> _E:
        if self._iterator is None:
            self._iterator = self._events()
        return await self._iterator.__anext__()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the underlying stream (an unfinished answer is not recorded)."""
        iterator, self._iterator = self._iterator, None
        aclose = getattr(iterator, "aclose", None)
        if callable(aclose):
            result = aclose()
            if isinstance(result, Awaitable):
                await result
        await _close_quietly(self._stream)

    async def _events(self) -> AsyncIterator[_E]:
        late_overflow: str | None = None
        while True:
            held: list[_E] = []
            passed = False
            try:
                async for event in self._stream:
                    reported = self._adapter.overflow(event)
                    if reported is not None:
                        if not passed:
                            _signal_overflow(reported, event)
                        late_overflow = reported
                    if not passed and self._adapter.is_preamble(event):
                        held.append(event)
                        continue
                    passed = True
                    for earlier in held:
                        self._adapter.add(earlier)
                        yield earlier
                    held.clear()
                    self._adapter.add(event)
                    yield event
            except Exception as exc:
                if not passed and is_context_overflow(exc):
                    # Nothing reached the host yet: retry on a rebuilt context.
                    await _close_quietly(self._stream)
                    self._adapter.reset()
                    self._stream = await self._call.recover(exc)
                    continue
                if is_context_overflow(exc):
                    # Too late to retry: rebuild so the next turn fits, then let the
                    # provider's error reach the host (whether or not it rebuilt).
                    with contextlib.suppress(ContextOverflowError):
                        await self._binding.middleware.on_error(
                            self._binding.session_id, exc, agent=self._binding.agent
                        )
                raise
            for earlier in held:
                self._adapter.add(earlier)
                yield earlier
            break
        message, fps = self._adapter.answer()
        self.recorded = await self._binding.record(message, fingerprints=fps, view=self._call.view)
        if late_overflow is not None:
            await self._binding.middleware.on_error(
                self._binding.session_id,
                ProviderReportedOverflow(late_overflow),
                agent=self._binding.agent,
            )


class ClientWrapper:
    """What every wrapped SDK client shares: anything not managed goes to the SDK.

    Subclasses set their managed attributes (``chat``, ``messages``...) after calling
    this initialiser; ``with_options()`` and ``copy()`` return a wrapper of the same
    kind for the same session.
    """

    def __init__(self, client: Any, binding: SessionBinding) -> None:
        self._client = client
        self.binding = binding

    @property
    def unwrapped(self) -> Any:
        """The wrapped SDK client."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def with_options(self, **kwargs: Any) -> Any:
        """The SDK's ``with_options``, wrapped for the same session."""
        return type(self)(self._client.with_options(**kwargs), self.binding)

    def copy(self, **kwargs: Any) -> Any:
        """The SDK's ``copy``, wrapped for the same session."""
        return type(self)(self._client.copy(**kwargs), self.binding)
