"""A transparent wrapper of an ``anthropic.AsyncAnthropic`` client.

:func:`wrap_anthropic` returns an object with the client's call surface::

    client = wrap_anthropic(AsyncAnthropic(), middleware, session_id="ses_1")
    async with client.messages.stream(model=..., max_tokens=1024, messages=history) as stream:
        async for text in stream.text_stream:
            print(text, end="")
        final = await stream.get_final_message()

Managed calls: ``messages.create`` (``stream=False`` and ``stream=True``) and
``messages.stream`` (the context manager: ``text_stream``, ``get_final_message``,
``get_final_text``, events; it is the SDK's own ``AsyncMessageStream``, fed by a
recording stream). Each call syncs the host's history into the store, prepares,
sends the host's own keyword arguments with ``messages`` replaced by the
converted view (:func:`~mimo_ctx.providers.anthropic.to_anthropic`, checked by
the rules of :func:`~mimo_ctx.providers.validate.validate_request`; both in
O(new messages) while the view only grows), records the answer with
its usage (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
``cache_creation_input_tokens``) and finish (``tool_use`` -> ``tool-calls``,
``end_turn`` / ``stop_sequence`` -> ``stop``, ``max_tokens`` -> ``length``), and
rebuilds and retries once on a context overflow: a 400 "prompt is too long", a
413, an ``error`` event at the start of a stream, or ``stop_reason ==
"model_context_window_exceeded"``. A second overflow raises
:class:`~mimo_ctx.errors.ContextOverflowError` chained to the SDK's error; any
other error propagates unchanged.

Our choices, documented:

* ``system`` is sent exactly as the host passed it (string or blocks, with its
  ``cache_control``), and so are ``tools``: prompt-cache friendly. The first call
  stores them (as text) as the session's frozen prefix.
* ``cache_control`` markers inside the host's message blocks are not carried
  over (the rewritten history is not the host's list). Instead the wrapper puts
  one breakpoint on the last block of the last turn
  (:func:`~mimo_ctx.providers.anthropic.mark_conversation_cache`), so each
  request reads the conversation the previous one cached, and a forked
  checkpoint writer's request reads it too. Not when the host asks for automatic
  caching (the top-level ``cache_control`` parameter, which does the same), when
  ``system`` and ``tools`` already hold the API's four breakpoints, or with
  ``wrap_anthropic(..., cache_conversation=False)``.
* A ``model_context_window_exceeded`` stop after streamed content cannot be taken
  back: the message is recorded (finish ``length``), the rebuild runs so the next
  turn fits, and the host sees the stop reason the API sent.
* ``messages.stream`` reads the SDK stream through the ``AsyncMessageStream``'s
  ``_raw_stream`` attribute (the SDK offers no public hook to feed its helper a
  stream of our own); a wrapper test pins the installed SDK.
* Not managed, delegated unchanged: ``messages.count_tokens``,
  ``messages.batches``, ``messages.parse``, ``beta``, ``with_raw_response`` and
  every other resource. ``with_options()`` and ``copy()`` return a wrapped client.
* A call with ``context_management``, or the context-management / compaction
  betas in ``extra_headers`` (the provider manages the context), raises
  :class:`~mimo_ctx.errors.ConfigError` saying how to choose (leave it out, or
  call ``client.unwrapped``); the beta client ``client.beta`` is not managed.
* A stream that ends before its ``stop_reason``, or that the host closes or
  cancels before its end, is recorded as incomplete; a ``tool_use`` block whose
  JSON did not finish stays a call that never ran (see
  :mod:`mimo_ctx.providers._sync`).
* Async clients only (``AsyncAnthropic`` and its Bedrock / Vertex variants).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, TypeVar, cast

from anyio.abc import AsyncResource

from mimo_ctx.convert import MessageDraft, decode_arguments
from mimo_ctx.errors import ConfigError, MimoCtxError
from mimo_ctx.messages import MAIN_AGENT, Message, TokenUsage
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.overflow import OVERFLOW_ERROR_CODES
from mimo_ctx.providers._sync import (
    ClientWrapper,
    Conversations,
    RecordingStream,
    SessionBinding,
    Turn,
    fingerprint,
    has_async_method,
    plain,
    refuse_native_context,
    refuse_wrapped,
)
from mimo_ctx.providers._wrapper import (
    Accumulator,
    Answer,
    ManagedApi,
    Resource,
    as_dict,
    assistant_answer,
    bind,
    dicts,
    finish_of,
    positive_int,
    recovering_call,
    require_sdk,
)
from mimo_ctx.providers.anthropic import (
    CACHE_BREAKPOINTS,
    anthropic_turns,
    cache_breakpoint_turn,
    cache_markers,
    drafts_from_anthropic,
    from_anthropic,
)

__all__ = [
    "ANTHROPIC_EXTRA",
    "AnthropicWrapper",
    "anthropic_fingerprint",
    "anthropic_usage",
    "wrap_anthropic",
]

ANTHROPIC_EXTRA: Final = 'pip install "mimo-ctx[anthropic]"'
"""How to install the Anthropic SDK extra (named by the ImportError of :func:`wrap_anthropic`)."""

_C = TypeVar("_C")


def _blocks(content: object) -> list[dict[str, Any]]:
    """Message content as a list of block mappings (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return dicts(content)


_IGNORED_KEYS: Final = frozenset({"cache_control", "citations"})


def anthropic_fingerprint(message: Mapping[str, Any]) -> str:
    """The fingerprint of a Messages API turn (see :mod:`mimo_ctx.providers._sync`).

    An assistant turn that calls tools is known by its ``tool_use`` ids, a user
    turn by the results it carries and its other blocks; text turns by role and
    text. ``cache_control`` and ``citations`` are ignored (hosts move cache
    markers every turn); so are thinking blocks of an assistant turn (hosts may
    drop them when resending).
    """
    role = message.get("role")
    blocks = _blocks(message.get("content"))
    if role == "assistant":
        calls = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
        if calls:
            return fingerprint("assistant-calls", calls)
        texts = [b.get("text") for b in blocks if b.get("type") == "text"]
        return fingerprint("assistant", texts)
    results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
    others = [
        {k: v for k, v in b.items() if k not in _IGNORED_KEYS}
        for b in blocks
        if b.get("type") != "tool_result"
    ]
    if results and not others:
        return fingerprint("tool-results", results)
    return fingerprint(str(role), results, others)


def anthropic_usage(usage: object) -> TokenUsage | None:
    """Messages API ``usage`` -> :class:`TokenUsage` (None when absent)."""
    data = as_dict(usage)
    if not data:
        return None
    return TokenUsage(
        input=positive_int(data.get("input_tokens")),
        output=positive_int(data.get("output_tokens")),
        cache_read=positive_int(data.get("cache_read_input_tokens")),
        cache_write=positive_int(data.get("cache_creation_input_tokens")),
    )


_STOP: Final = {
    "tool_use": "tool-calls",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content-filter",
    "pause_turn": "other",
}


def _answer(response: Mapping[str, Any], turn: Turn) -> Answer:
    """The recorded message of a Messages API response (a ``Message`` as JSON)."""
    content = _blocks(response.get("content"))
    host = {"role": "assistant", "content": content}
    _, converted = from_anthropic(None, [host], session_id=turn.session_id, agent=turn.agent)
    calls = any(b.get("type") == "tool_use" for b in content)
    recorded = assistant_answer(
        converted,
        turn=turn,
        finish=finish_of(response.get("stop_reason"), _STOP, calls=calls),
        usage=anthropic_usage(response.get("usage")),
        model=response.get("model"),
        response_id=response.get("id"),
    )
    return recorded, (anthropic_fingerprint(host),)


def _stop_overflow(answer: object) -> str | None:
    """The overflow a response (or a ``message_delta``'s delta) reports in its stop reason."""
    reason = getattr(answer, "stop_reason", None)
    if isinstance(reason, str) and reason in OVERFLOW_ERROR_CODES:
        return f"stop_reason {reason}"
    return None


class _AnthropicStream(Accumulator):
    """Accumulates raw Messages stream events into the final message."""

    def reset(self) -> None:
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self._stopped = False

    def is_preamble(self, event: Any) -> bool:
        return getattr(event, "type", None) == "message_start"

    def overflow(self, event: Any) -> str | None:
        if getattr(event, "type", None) != "message_delta":
            return None
        return _stop_overflow(getattr(event, "delta", None))

    def complete(self) -> bool:
        return self._stopped

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        index = getattr(event, "index", None)
        if kind == "message_start":
            self._message = as_dict(getattr(event, "message", None))
            self._blocks = dict(enumerate(_blocks(self._message.get("content"))))
        elif kind == "content_block_start" and isinstance(index, int):
            self._blocks[index] = as_dict(getattr(event, "content_block", None))
        elif kind == "content_block_delta" and isinstance(index, int):
            self._delta(index, getattr(event, "delta", None))
        elif kind == "content_block_stop" and isinstance(index, int):
            if index in self._json and index in self._blocks:
                self._blocks[index]["input"] = decode_arguments(self._json.pop(index))
        elif kind == "message_delta" and self._message is not None:
            delta = as_dict(getattr(event, "delta", None))
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    self._message[key] = delta[key]
            self._stopped = self._stopped or delta.get("stop_reason") is not None
            reported = as_dict(getattr(event, "usage", None))
            usage = {k: v for k, v in reported.items() if v is not None}
            self._message["usage"] = {**as_dict(self._message.get("usage")), **usage}

    def _delta(self, index: int, delta: Any) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            block["text"] = str(block.get("text") or "") + str(getattr(delta, "text", ""))
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + str(getattr(delta, "partial_json", ""))
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking") or "") + str(
                getattr(delta, "thinking", "")
            )
        elif kind == "signature_delta":
            block["signature"] = getattr(delta, "signature", None)

    def answer(self) -> Answer:
        if self._message is None:
            return None, ()
        blocks = dict(self._blocks)
        for index, partial in self._json.items():
            # A tool_use cut before its content_block_stop: its input as received
            # (broken JSON is kept as the raw text), and the answer is incomplete.
            if index in blocks:
                blocks[index] = {**blocks[index], "input": decode_arguments(partial)}
        response = {**self._message, "content": [blocks[i] for i in sorted(blocks)]}
        return _answer(response, self._turn)


def _is_system(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "system"


def _system_text(system: object) -> str:
    if isinstance(system, str):
        return system
    return "\n\n".join(
        str(b.get("text")) for b in _blocks(system) if isinstance(b.get("text"), str)
    )


def _item_fingerprint(item: object) -> str | None:
    data = as_dict(item)
    return None if _is_system(data) else anthropic_fingerprint(data)


def _drafts(run: Sequence[object]) -> list[MessageDraft]:
    return drafts_from_anthropic(None, [as_dict(i) for i in run])[1]


def _turns(run: Sequence[Message], previous: Message | None) -> list[dict[str, Any]]:
    return anthropic_turns(run, first=previous is None, shorthand=True)


def _same_role(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("role") == b.get("role")


def _cached(kwargs: Mapping[str, Any], messages: list[Any]) -> list[Any]:
    """The call's own list of messages with the conversation breakpoint
    (:func:`~mimo_ctx.providers.anthropic.mark_conversation_cache`), when there is
    room for one: its last turn is replaced in place by a marked copy (no second
    copy of the list)."""
    if kwargs.get("cache_control") is not None or not messages:  # automatic caching
        return messages
    used = cache_markers(plain(kwargs.get("system"))) + cache_markers(plain(kwargs.get("tools")))
    if used < CACHE_BREAKPOINTS:
        marked = cache_breakpoint_turn(messages[-1])
        if marked is not None:
            messages[-1] = marked
    return messages


_API: Final = ManagedApi(
    key="messages",
    format="anthropic",
    convert=_turns,
    adapter=_AnthropicStream,
    answer=_answer,
    overflow=_stop_overflow,
    merges=_same_role,
)


class _Messages(Resource):
    """``messages`` with managed ``create`` and ``stream``; everything else delegated."""

    def __init__(self, inner: Any, binding: SessionBinding, *, cache: bool = True) -> None:
        super().__init__(inner, binding)
        self._cache = cache

    async def _sync(self, kwargs: dict[str, Any], *, call: str) -> Turn:
        refuse_native_context(kwargs, api="messages", call=call)
        return await self._binding.sync(
            cast(Sequence[object], kwargs["messages"]),
            fingerprint=_item_fingerprint,
            convert=_drafts,
            prefix=lambda heads: (_system_text(kwargs.get("system")), dicts(kwargs.get("tools"))),
        )

    def _finish(self, kwargs: Mapping[str, Any]) -> Callable[[list[Any]], list[Any]] | None:
        """The conversation breakpoint put on each request, when the wrapper caches."""
        return (lambda messages: _cached(kwargs, messages)) if self._cache else None

    def _managed(self, kwargs: Mapping[str, Any]) -> bool:
        raw = kwargs.get("messages")
        return raw is not None and not isinstance(raw, str | bytes | Mapping)

    def create(self, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """``messages.create`` on the managed history (see the module docs).

        Returns the call's coroutine, as the SDK's method does: the host awaits
        :func:`~mimo_ctx.providers._wrapper.managed_call`'s coroutine itself, which runs
        the SDK's coroutine with none of ours around it (see there why)."""
        if not self._managed(kwargs):
            return self._inner.create(**kwargs)  # let the SDK report the error
        return self._managed_create(
            kwargs,
            _API,
            functools.partial(self._sync, kwargs, call="messages.create"),
            finish=self._finish(kwargs),
        )

    def stream(self, **kwargs: Any) -> Any:
        """``messages.stream`` on the managed history: an async context manager giving the
        SDK's ``AsyncMessageStream`` (see the module docs)."""
        if not self._managed(kwargs):
            return self._inner.stream(**kwargs)
        return _MessageStreamManager(self, kwargs)


class _MessageStreamManager(AsyncResource):
    """``async with client.messages.stream(...) as stream`` for the wrapped client."""

    def __init__(self, messages: _Messages, kwargs: dict[str, Any]) -> None:
        self._messages = messages
        self._kwargs = kwargs
        self._stream: Any = None
        self._recording: RecordingStream[Any] | None = None

    async def __aenter__(self) -> Any:
        from anthropic.lib.streaming import AsyncMessageStream

        messages = self._messages
        inner = messages._inner  # pyright: ignore[reportPrivateUsage]
        binding = messages._binding  # pyright: ignore[reportPrivateUsage]

        async def opener(payload: dict[str, Any]) -> Any:
            sdk_stream = await inner.stream(**payload).__aenter__()
            raw = getattr(sdk_stream, "_raw_stream", None)
            if raw is None:
                await sdk_stream.close()
                raise MimoCtxError(
                    "this anthropic SDK's AsyncMessageStream has no _raw_stream: "
                    "wrap_anthropic cannot record messages.stream(); use "
                    "messages.create(stream=True)"
                )
            return raw

        turn = await messages._sync(self._kwargs, call="messages.stream")  # pyright: ignore[reportPrivateUsage]
        try:
            finish = messages._finish(self._kwargs)  # pyright: ignore[reportPrivateUsage]
            call = recovering_call(
                binding, turn, self._kwargs, _API, send=opener, streaming=True, finish=finish
            )
            raw = await call.run()
        except BaseException:
            turn.release()
            raise
        # The recording releases the turn's checkpoint hold when the stream ends.
        self._recording = RecordingStream(binding, turn, call, raw, _AnthropicStream(turn))
        output_format = self._kwargs.get("output_format")
        if output_format is None:
            import anthropic

            output_format = anthropic.not_given
        self._stream = AsyncMessageStream(cast(Any, self._recording), output_format=output_format)
        return self._stream

    async def aclose(self) -> None:
        """Close the SDK's stream and the recording under it (the block's end)."""
        if self._stream is not None:
            await self._stream.close()
        if self._recording is not None:
            # The SDK's close does not reach the stream it reads: an answer cut here
            # (the host left the block early) is recorded as incomplete.
            await self._recording.close()


class AnthropicWrapper(ClientWrapper):
    """The object :func:`wrap_anthropic` returns: the client's surface, ``messages`` managed.

    Attributes:
        messages: ``messages`` with managed ``create`` and ``stream``.
        binding: The session this wrapper's calls belong to.
    """

    def __init__(
        self, client: Any, binding: SessionBinding, *, cache_conversation: bool = True
    ) -> None:
        super().__init__(client, binding)
        self._cache_conversation = cache_conversation
        self.messages = _Messages(client.messages, binding, cache=cache_conversation)

    def with_options(self, **kwargs: Any) -> Any:
        """The SDK's ``with_options``, wrapped for the same session."""
        return AnthropicWrapper(
            self._client.with_options(**kwargs),
            self.binding,
            cache_conversation=self._cache_conversation,
        )

    def copy(self, **kwargs: Any) -> Any:
        """The SDK's ``copy``, wrapped for the same session."""
        return AnthropicWrapper(
            self._client.copy(**kwargs), self.binding, cache_conversation=self._cache_conversation
        )


def wrap_anthropic(
    client: _C,
    middleware: ContextMiddleware,
    *,
    session_id: str,
    cache_conversation: bool = True,
    agent: str = MAIN_AGENT,
    project_id: str = "default",
    conversations: Conversations = "refuse",
) -> _C:
    """Wrap an ``anthropic.AsyncAnthropic`` client so its calls run through ``middleware``.

    The result has the client's call surface (and is typed as the client, so host
    code type-checks unchanged); see the module docs for what is managed.

    Args:
        client: An ``anthropic.AsyncAnthropic`` client (or an async Bedrock /
            Vertex variant).
        middleware: A running :class:`~mimo_ctx.middleware.ContextMiddleware`.
        session_id: The session every call belongs to (created on first use).
        cache_conversation: Put the conversation's prompt-cache breakpoint on each
            request (see the module docs); False sends the history without it.
        agent: The agent the calls are made for.
        project_id: Project of the session when it is created.
        conversations: What a call whose messages share nothing with the session
            does: ``refuse`` (:class:`~mimo_ctx.errors.ConversationMismatchError`)
            or ``per-first-message`` (a session of its own; see
            :mod:`mimo_ctx.providers._sync`).

    Raises:
        ImportError: The ``anthropic`` SDK is not installed (names the extra).
        ConfigError: ``client`` is a sync client or already wrapped, or ``session_id``
            is empty.
    """
    require_sdk("anthropic", "wrap_anthropic", ANTHROPIC_EXTRA)
    refuse_wrapped(client, "wrap_anthropic")
    if not has_async_method(client, "messages", "create"):
        raise ConfigError(
            "wrap_anthropic needs an async client (anthropic.AsyncAnthropic; "
            f"messages.create must be async), got {type(client).__name__}"
        )
    binding = bind(client, middleware, session_id, agent, project_id, conversations=conversations)
    return cast(_C, AnthropicWrapper(client, binding, cache_conversation=cache_conversation))
