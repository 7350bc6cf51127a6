"""What the client wrappers share: the session of a call, one overflow retry, recording streams.

Nothing here imports a provider SDK: the OpenAI and Anthropic wrappers
(:mod:`mimo_ctx.providers.openai_client`, :mod:`mimo_ctx.providers.anthropic_client`)
plug their formats in.

The session of a call (:class:`SessionBinding`). A host resends its whole
conversation every call. The binding hands the list to the session's
host-history reconciler (:mod:`mimo_ctx.reconcile`), which stores only what is
new and follows the host's branch: a list that extends the session appends; one
that diverges from it (a regenerated answer, an edited message) is followed,
the dropped messages leaving the view (storage keeps them, nothing is invented
for them); one that shares nothing with the session is refused with a
:class:`~mimo_ctx.errors.ConversationMismatchError` naming the session. With
``conversations="per-first-message"`` such a list gets a session of its own
instead, ``<session_id>-<digest of its first message>``, the same on every
worker, so one wrapped client can serve many conversations without merging any
two. The first call of a session opens it with the host's system prompt and
tools as its frozen prefix.

Native context management. A managed call that asks the provider to manage the
same history (:func:`native_context_parameter`: Responses
``previous_response_id``, ``conversation``, ``truncation="auto"``,
``context_management``; Anthropic ``context_management`` and the
context-management / compaction betas) is refused with a
:class:`~mimo_ctx.errors.ConfigError` that says how to choose: drop the
parameter (mimo_ctx manages the context) or make that call through
``client.unwrapped`` (the provider does, and mimo_ctx steps aside). Two
compactors that do not know each other would each cut what the other relies on.

One overflow retry (:class:`RecoveringCall`, in ``_recovering``). Prepare, build, send;
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
is retried transparently. An overflow reported after content was passed on
cannot be taken back: the rebuild still runs (so the next turn fits) and the
provider's error reaches the host unchanged.

A stream that ends honestly is recorded as the provider finished it. One that
ends before its finish reason (the connection dropped, the server stopped, an
error mid-stream) or that the host closes or cancels before its end is recorded
as **incomplete**: an unfinished assistant message (no ``finish``) with an
aborted :class:`~mimo_ctx.messages.MessageFailure` named :data:`INCOMPLETE_STREAM`,
the text received so far, and tool calls whose arguments were not complete kept
as calls that never ran (their arguments as received). The next request sends it
the way an interrupted call is sent (SPEC A10: its calls answered
``[Tool execution was interrupted]``), or, when the host leaves it out of its
next list, the session follows the host and it leaves the view.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, Protocol, Self, TypeVar, cast

import anyio
from anyio.abc import AsyncResource

from mimo_ctx._sqlite_worker import CheckpointHold, hold_checkpoints
from mimo_ctx.checkpoint.protocol import SentApi
from mimo_ctx.convert import MessageDraft
from mimo_ctx.errors import (
    ConfigError,
    ContextOverflowError,
    ConversationMismatchError,
    InvalidRequestError,
    ProviderReportedOverflow,
)
from mimo_ctx.messages import MAIN_AGENT, Message, MessageFailure
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.providers._payload import Convert, PayloadBuilder
from mimo_ctx.providers._recovering import RecoveringCall
from mimo_ctx.providers.validate import RequestFormat
from mimo_ctx.reconcile import HostHistory

__all__ = [
    "INCOMPLETE_STREAM",
    "ClientWrapper",
    "Conversations",
    "ProviderReportedOverflow",
    "RecordingStream",
    "RecoveringCall",
    "SessionBinding",
    "StreamAdapter",
    "Turn",
    "client_origin",
    "fingerprint",
    "has_async_method",
    "incomplete",
    "native_context_parameter",
    "plain",
    "refuse_native_context",
    "refuse_wrapped",
    "sdk_client",
]

INCOMPLETE_STREAM: Final = "IncompleteStream"
"""``MessageFailure.name`` of an answer whose stream ended (or was closed) before its end."""

Conversations = Literal["refuse", "per-first-message"]
"""What a wrapper does with a list that shares nothing with its session (see the module docs)."""

_T = TypeVar("_T")
_R = TypeVar("_R")
_P = TypeVar("_P")
_E = TypeVar("_E")
_E_contra = TypeVar("_E_contra", contravariant=True)


def plain(value: object) -> Any:
    """``value`` as plain JSON data: SDK (pydantic) objects dumped, mappings and lists copied.

    Hosts put SDK objects in their histories (``messages.append(completion.choices[0].message)``);
    the SDKs serialise them with ``model_dump(exclude_unset=True)``, and so does this.
    Called only for host items a call has not seen before.
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

    ``values`` are what identifies the item (already plain data: call ids, texts,
    content parts). ``None`` members of mappings are ignored (an SDK object dumps
    unset fields as ``None``, a host's dict leaves them out), keys are sorted.
    """
    try:
        data = json.dumps(
            _drop_none(list(values)),
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
            default=repr,
        )
    except ValueError as exc:  # NaN or a cycle in a host payload
        raise InvalidRequestError(f"a {kind} message cannot be serialised: {exc}") from exc
    return f"{kind}:{hashlib.sha256(data.encode('utf-8')).hexdigest()[:32]}"


def incomplete(message: Message, why: str) -> Message:
    """``message`` as an answer whose stream did not end: unfinished, aborted (SPEC A10)."""
    return message.model_copy(
        update={
            "finish": None,
            "time_completed": None,
            "error": MessageFailure(name=INCOMPLETE_STREAM, message=why, aborted=True),
        }
    )


# --------------------------------------------------------------------------- #
# Native context management
# --------------------------------------------------------------------------- #

_NATIVE_BETAS: Final = ("context-management", "compact")


def native_context_parameter(kwargs: Mapping[str, Any], *, api: str) -> str | None:
    """The parameter of a call that asks the provider to manage the context, if any.

    Args:
        kwargs: The call's keyword arguments.
        api: ``responses`` or ``messages`` (Chat Completions has none).

    Returns:
        ``name=value`` of the first such parameter, or None.
    """
    extra = kwargs.get("extra_body")
    body: Mapping[str, Any] = cast(Mapping[str, Any], extra) if isinstance(extra, Mapping) else {}
    if kwargs.get("context_management") is not None or body.get("context_management") is not None:
        return "context_management=..."
    if api == "responses":
        for name in ("previous_response_id", "conversation"):
            if kwargs.get(name) or body.get(name):
                return f"{name}={kwargs.get(name) or body.get(name)!r}"
        truncation = kwargs.get("truncation", body.get("truncation"))
        if truncation == "auto":
            return "truncation='auto'"
    if api == "messages":
        headers = kwargs.get("extra_headers")
        betas: list[str] = []
        if isinstance(headers, Mapping):
            for key, value in cast(Mapping[str, Any], headers).items():
                if str(key).lower() == "anthropic-beta" and isinstance(value, str):
                    betas.extend(v.strip() for v in value.split(","))
        raw_betas = kwargs.get("betas")
        if isinstance(raw_betas, list | tuple):
            betas.extend(str(b) for b in cast(Sequence[Any], raw_betas))
        for beta in betas:
            if any(marker in beta for marker in _NATIVE_BETAS):
                return f"anthropic-beta: {beta}"
    return None


def refuse_native_context(kwargs: Mapping[str, Any], *, api: str, call: str) -> None:
    """Raise when a managed call asks the provider to manage the context (the policy).

    Raises:
        ConfigError: It does; the message says how to choose.
    """
    found = native_context_parameter(kwargs, api=api)
    if found is not None:
        raise ConfigError(
            f"{call}({found}): this asks the provider to manage the conversation's context, "
            "and mimo_ctx manages the same history; two compactors that do not know each "
            "other cut what the other relies on. Choose one: leave the parameter out "
            "(mimo_ctx manages the context), or make this call with client.unwrapped "
            "(the provider manages it and mimo_ctx steps aside)"
        )


# --------------------------------------------------------------------------- #
# The session of a call
# --------------------------------------------------------------------------- #


@dataclass(slots=True)
class Turn:
    """One managed call: its session, the host's system items, where its answer goes.

    Attributes:
        session_id: The session the call belongs to.
        agent: The agent taking the turn.
        head: The host's items that are not history (system prompts), as sent.
        after: The chain the answer follows (:attr:`mimo_ctx.reconcile.Reconciled.head`).
        history: The session's reconciler.
        items: The host's whole list, as the host passed it (not copied).
        offset: Where the host's history starts in ``items`` when every item that is
            not history comes before it (the usual list: system prompts first), else
            None. With it, :meth:`host_item` finds the host's item an entry stands for.
        hold: The store's checkpoint hold for the call (``_sqlite_worker``), taken by
            :meth:`SessionBinding.sync`, let go by :meth:`release` when the call ends.
    """

    session_id: str
    agent: str
    head: list[Any]
    after: str | None
    history: HostHistory
    items: Sequence[Any] = ()
    offset: int | None = None
    hold: CheckpointHold | None = None

    def release(self) -> None:
        """The call ended: let its checkpoint hold go (a hold releases once)."""
        if self.hold is not None:
            self.hold.release()

    def host_item(self, index: int, entry: Any) -> Any:
        """The host's own item for the payload entry at ``index`` of the history's
        entries when it is a plain ``dict`` equal to ``entry``, else ``entry``.

        A request then holds the host's objects for every message the view sends as
        the host sent it: the SDK reads the very objects it would read without
        mimo_ctx (not a second, equal copy of the conversation kept beside the
        host's), and the bytes sent are the same. Only entries converted by this
        call are looked up (O(new)); an entry whose position is not the host's (a
        rebuilt view, merged turns) simply finds no equal item.
        """
        offset = self.offset
        if offset is None:
            return entry
        position = offset + index
        if position >= len(self.items):
            return entry
        item = self.items[position]
        # Exactly a dict: an SDK object or a mapping type of the host's own is sent
        # as our plain data, as before.
        return item if item.__class__ is dict and item == entry else entry

    def builder(
        self,
        format: RequestFormat,
        convert: Convert,
        *,
        merges: Callable[[Any, Any], bool] | None = None,
    ) -> PayloadBuilder:
        """The session's payload builder for ``format`` (kept with the session)."""
        return self.history.cached(
            f"payload:{format}",
            PayloadBuilder,
            lambda: PayloadBuilder(format, convert, merges=merges),
        )


def client_origin(client: object) -> str | None:
    """The base URL an SDK client sends to (``None`` when it has none)."""
    url = getattr(client, "base_url", None)
    return str(url).rstrip("/") if url is not None else None


def has_async_method(client: object, *path: str) -> bool:
    """True when ``client.<path>`` is a coroutine function (an async SDK client's call).

    The SDKs' sync and async clients look alike from outside; this is how a
    wrapper or a writer model tells them apart (decorators unwrapped first).
    """
    target: object = client
    for name in path:
        target = getattr(target, name, None)
    return target is not None and inspect.iscoroutinefunction(inspect.unwrap(target))  # pyright: ignore[reportArgumentType]


class SessionBinding:
    """One wrapped client's link to its sessions: syncing, sending, recording.

    Args:
        middleware: The middleware.
        session_id: The session every call of the wrapper belongs to.
        agent: The agent the calls are made for.
        project_id: Project of a session the wrapper creates.
        conversations: ``refuse`` (a list that shares nothing with the session
            raises :class:`~mimo_ctx.errors.ConversationMismatchError`) or
            ``per-first-message`` (it gets a session of its own).
        origin: The base URL of the wrapped client (tells a forked checkpoint
            writer whether it talks to the same endpoint).
    """

    def __init__(
        self,
        middleware: ContextMiddleware,
        session_id: str,
        *,
        agent: str = MAIN_AGENT,
        project_id: str = "default",
        conversations: Conversations = "refuse",
        origin: str | None = None,
    ) -> None:
        if conversations not in ("refuse", "per-first-message"):
            raise ConfigError(
                f"conversations: expected 'refuse' or 'per-first-message', got {conversations!r}"
            )
        self.middleware = middleware
        self.session_id = session_id
        self.agent = agent
        self.project_id = project_id
        self.conversations: Conversations = conversations
        self.origin = origin
        self._opened: set[str] = set()
        self._by_first: dict[str, str] = {}

    async def sync(
        self,
        items: Sequence[_T],
        *,
        fingerprint: Callable[[_T], str | None],
        convert: Callable[[Sequence[_T]], Sequence[MessageDraft]],
        prefix: Callable[[Sequence[_T]], tuple[str, Sequence[dict[str, Any]]]],
    ) -> Turn:
        """Store what is new of the host's list and follow its branch (see the module docs).

        Args:
            items: The host's whole list.
            fingerprint: A host item's fingerprint (None: a system item).
            convert: New history items -> drafts.
            prefix: The system items -> (system prompt, tools) of a session this
                call creates.
        """
        hold = hold_checkpoints(self.middleware.store)
        try:
            turn = await self._sync_session(items, fingerprint, convert, prefix)
        except BaseException:
            hold.release()
            raise
        turn.hold = hold
        return turn

    async def _sync_session(
        self,
        items: Sequence[_T],
        fingerprint: Callable[[_T], str | None],
        convert: Callable[[Sequence[_T]], Sequence[MessageDraft]],
        prefix: Callable[[Sequence[_T]], tuple[str, Sequence[dict[str, Any]]]],
    ) -> Turn:
        # Not copied (O(new) per call): the reconciler takes its own copy of what it keeps.
        host = items
        session_id = self.session_id
        first: str | None = None
        if self.conversations == "per-first-message":
            first = next((fp for fp in map(fingerprint, host) if fp is not None), None)
            if first is not None:
                session_id = self._by_first.get(first, session_id)
        try:
            return await self._sync(session_id, host, fingerprint, convert, prefix)
        except ConversationMismatchError:
            if first is None or session_id != self.session_id:
                raise
        # A conversation of its own, named after its first message: every worker
        # picks the same session for it.
        own = f"{self.session_id}-{hashlib.sha256(first.encode()).hexdigest()[:12]}"
        self._by_first[first] = own
        return await self._sync(own, host, fingerprint, convert, prefix)

    async def _sync(
        self,
        session_id: str,
        host: Sequence[_T],
        fingerprint: Callable[[_T], str | None],
        convert: Callable[[Sequence[_T]], Sequence[MessageDraft]],
        prefix: Callable[[Sequence[_T]], tuple[str, Sequence[dict[str, Any]]]],
    ) -> Turn:
        middleware = self.middleware
        history = middleware.host_history(session_id, agent=self.agent)
        if session_id not in self._opened:
            heads = [
                item for item, fp in zip(host, map(fingerprint, host), strict=True) if fp is None
            ]
            system, tools = prefix(heads)
            await middleware.open_session(
                session_id, project_id=self.project_id, system=system, tools=tools
            )
            self._opened.add(session_id)
        done = await history.reconcile(host, fingerprint=fingerprint, convert=convert)
        skipped = done.skipped
        front = not skipped or skipped[-1] == len(skipped) - 1  # positions, ascending
        return Turn(
            session_id,
            self.agent,
            [host[i] for i in skipped],
            done.head,
            history,
            items=host,
            offset=len(skipped) if front else None,
        )

    def sent(self, view: RequestView, api: SentApi, payload: Mapping[str, Any]) -> None:
        """Tell the middleware which payload goes out for ``view`` (a forked writer resends it)."""
        self.middleware.request_sent(view, api=api, payload=payload, origin=self.origin)

    def call(
        self,
        turn: Turn,
        build: Callable[[RequestView], _P],
        send: Callable[[_P], Awaitable[_R]],
        check: Callable[[_R], None] | None = None,
    ) -> RecoveringCall[_P, _R]:
        """A :class:`RecoveringCall` for the turn's session (``check``: see there).

        The turn does not refer to it (its ``build`` refers to the turn): a call and
        its payloads are freed the moment the call is done, never left as a
        reference cycle holding an O(history) payload and view until a collection.
        """
        return RecoveringCall(
            self.middleware, turn.session_id, agent=self.agent, build=build, send=send, check=check
        )

    async def record(
        self, turn: Turn, message: Message | None, *, fingerprints: Sequence[str]
    ) -> Message | None:
        """Record an answer of the turn (the middleware estimates usage the provider omitted).

        Args:
            turn: The call it answers.
            message: The assistant message (None: nothing to record).
            fingerprints: What the host will send back for it.
        """
        if message is None:
            return None
        return await turn.history.record(message, fingerprints=fingerprints, after=turn.after)


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

    def complete(self) -> bool:
        """True once the provider said how the answer ended (its finish reason)."""
        ...

    def answer(self) -> tuple[Message | None, tuple[str, ...]]:
        """The accumulated assistant message (None when there is none to record) and
        the fingerprints of what the host will send back for it. Before
        :meth:`complete`, tool calls whose arguments did not finish are open calls
        with the arguments received."""
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


class RecordingStream(AsyncResource, Generic[_E]):
    """A provider stream passed through event by event, recorded when it ends.

    Iterate it like the SDK's stream (``async for``); ``close()``, ``async with``
    and ``response`` work as on the SDK's object, and other public attributes are
    read from the current underlying stream.

    Args:
        binding: The wrapper's session binding.
        turn: The turn whose answer the stream is.
        call: The call that opened ``stream`` (it retries once).
        stream: The SDK stream.
        adapter: The provider's event adapter.
    """

    def __init__(
        self,
        binding: SessionBinding,
        turn: Turn,
        call: RecoveringCall[Any, Any],
        stream: Any,
        adapter: StreamAdapter[_E],
    ) -> None:
        self._binding = binding
        self._turn = turn
        self._call = call
        self._stream: Any = stream
        self._adapter = adapter
        self._iterator: AsyncIterator[_E] | None = None
        self._done = False
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

    async def aclose(self) -> None:
        """Close the underlying stream; an answer not finished yet is recorded incomplete."""
        iterator, self._iterator = self._iterator, None
        aclose = getattr(iterator, "aclose", None)
        if callable(aclose):
            result = aclose()
            if isinstance(result, Awaitable):
                await result
        await _close_quietly(self._stream)
        await self._record("the host closed the stream before its end")

    close = aclose
    """The SDK streams' name of :meth:`aclose`."""

    async def _record(self, why: str | None) -> None:
        """Record the answer once: as the provider finished it, or incomplete (``why``)."""
        if self._done:
            return
        self._done = True
        self._turn.release()  # the answer's write below starts the idle time over
        message, fps = self._adapter.answer()
        if message is None:
            return
        if why is None and not self._adapter.complete():
            why = "the stream ended before its finish reason"
        if why is not None:
            message = incomplete(message, why)
        with anyio.CancelScope(shield=True):
            self.recorded = await self._binding.record(self._turn, message, fingerprints=fps)

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
                            self._turn.session_id, exc, agent=self._turn.agent
                        )
                else:
                    await self._record(f"the stream failed: {type(exc).__name__}")
                raise
            except GeneratorExit:
                # The host closed the stream while it still ran: what arrived is
                # kept, as an answer that did not end.
                await self._record("the host closed the stream before its end")
                raise
            except BaseException:
                await self._record("the stream was cancelled before its end")
                raise
            for earlier in held:
                self._adapter.add(earlier)
                yield earlier
            break
        await self._record(None)
        if late_overflow is not None:
            await self._binding.middleware.on_error(
                self._turn.session_id,
                ProviderReportedOverflow(late_overflow),
                agent=self._turn.agent,
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


def sdk_client(client: object) -> Any:
    """The SDK client behind ``client``: a wrapped client's own, any other as it is.

    Calls made through it (a writer model's, a token count) never enter a session.
    """
    return client.unwrapped if isinstance(client, ClientWrapper) else client


def refuse_wrapped(client: object, who: str) -> None:
    """Refuse a client that mimo_ctx already wraps, with the fix in the message.

    A wrapped client's managed methods are plain functions that return the call's
    coroutine (see :func:`mimo_ctx.providers._wrapper.managed_call`), so the async
    check that comes next would call it a sync client; and wrapping it twice would
    manage one conversation in two bindings.

    Raises:
        ConfigError: ``client`` is a mimo_ctx wrapper.
    """
    if isinstance(client, ClientWrapper):
        raise ConfigError(
            f"{who} got a client that mimo_ctx already wraps ({type(client).__name__}): "
            "wrap the SDK client once and use that wrapper, or pass client.unwrapped"
        )
