"""A transparent wrapper of an ``openai.AsyncOpenAI`` client.

:func:`wrap_openai` returns an object with the client's call surface, so existing
code keeps running unchanged::

    client = wrap_openai(AsyncOpenAI(), middleware, session_id="ses_1")
    reply = await client.chat.completions.create(model="gpt-5", messages=history)

Managed calls: ``chat.completions.create`` (``stream=False`` and ``stream=True``)
and ``responses.create`` (both). Each call

1. syncs the host's history into the store (only what is new, following the
   host's branch; see :mod:`mimo_ctx.providers._sync` for the conversation
   rule); the first call opens the session with the host's system prompt and
   tools as its frozen prefix;
2. prepares the request (:meth:`~mimo_ctx.middleware.ContextMiddleware.prepare`,
   which rebuilds when the last usage crossed the trigger line);
3. sends the host's own keyword arguments with ``messages`` / ``input`` replaced
   by the converted view (:func:`~mimo_ctx.providers.openai.to_openai_chat`,
   :func:`~mimo_ctx.providers.openai.to_openai_responses`), after checking it with
   the rules of :func:`~mimo_ctx.providers.validate.validate_request` (an invalid
   request raises :class:`~mimo_ctx.errors.InvalidRequestError` and is not sent);
   converted and checked in O(new messages) while the view only grows;
4. records the answer with its usage (``prompt_tokens`` / ``completion_tokens``
   / ``total_tokens`` and cached tokens; Responses ``input_tokens`` /
   ``output_tokens``) and its finish reason (``tool_calls`` -> ``tool-calls``,
   ``stop`` -> ``stop``, ``length`` / ``max_output_tokens`` -> ``length``);
5. on a context overflow (``BadRequestError`` with code
   ``context_length_exceeded``, HTTP 413, an overflow error in a stream)
   rebuilds and retries once; a second overflow raises
   :class:`~mimo_ctx.errors.ContextOverflowError` chained to the SDK's error. Any
   other error propagates unchanged.

Our choices, documented:

* The host's ``system`` / ``developer`` messages are sent first, unchanged and in
  their order, before the converted history (prompt-cache friendly: the same
  bytes every turn); one sent later in the list moves to the front. Responses
  ``instructions`` is left as the host set it.
* Streams (``stream=True``) are passed through chunk by chunk, unchanged; the
  request is not changed either: ``stream_options={"include_usage": True}`` is
  **not** added (it would add a usage-only chunk the host did not ask for). Without
  it the chunks carry no usage, and the middleware records an *estimate*
  (``TokenUsage.estimated``). Pass ``stream_options`` yourself for exact usage.
* A stream that ends before its finish reason, or that the host closes or
  cancels before its end, is recorded as incomplete (see
  :mod:`mimo_ctx.providers._sync`).
* Tool-call arguments are sent back in compact JSON (the stored form), which may
  differ in spacing from what the model produced.
* With ``n > 1`` only the first choice is recorded.
* ``responses.create`` with ``previous_response_id``, ``conversation``,
  ``truncation="auto"`` or ``context_management`` (the provider manages the
  context) raises :class:`~mimo_ctx.errors.ConfigError` saying how to choose:
  leave the parameter out, or call ``client.unwrapped``.
* Not managed, delegated unchanged: ``chat.completions.parse`` / ``stream``,
  ``responses.parse`` / ``stream``, ``with_raw_response``,
  ``with_streaming_response`` and every other resource. ``with_options()`` and
  ``copy()`` return a wrapped client.
* Async clients only (``AsyncOpenAI``, ``AsyncAzureOpenAI``): the middleware is
  async, and running it from a sync client would need an event loop per call.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar, cast

from mimo_ctx.convert import MessageDraft
from mimo_ctx.errors import ConfigError
from mimo_ctx.messages import MAIN_AGENT, TokenUsage
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.overflow import OVERFLOW_ERROR_CODES, is_overflow_stream_event
from mimo_ctx.providers._sync import (
    ClientWrapper,
    Conversations,
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
    require_sdk,
)
from mimo_ctx.providers.openai import (
    drafts_from_openai_chat,
    drafts_from_openai_responses,
    from_openai_chat,
    from_openai_responses,
    to_openai_chat,
    to_openai_responses,
)

__all__ = [
    "OPENAI_EXTRA",
    "OpenAIWrapper",
    "chat_fingerprint",
    "chat_usage",
    "responses_fingerprint",
    "responses_usage",
    "wrap_openai",
]

OPENAI_EXTRA: Final = 'pip install "mimo-ctx[openai]"'
"""How to install the OpenAI SDK extra (named by the ImportError of :func:`wrap_openai`)."""

_C = TypeVar("_C")
_SYSTEM_ROLES: Final = frozenset({"system", "developer"})


def _list(value: object) -> list[Any]:
    data = plain(value)
    if isinstance(data, list):
        return cast(list[Any], data)
    return []


def _items(obj: object, name: str) -> list[Any]:
    """Attribute ``name`` of an SDK object as a list (empty when absent)."""
    value = getattr(obj, name, None)
    if isinstance(value, list | tuple):
        return list(cast(Sequence[Any], value))
    return []


def _text_parts(content: object) -> list[str]:
    """The texts of a string content or of the text-like parts of a content list."""
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    for part in _list(content):
        if isinstance(part, dict):
            entry = cast(dict[str, Any], part)
            text = entry.get("text", entry.get("refusal"))
            if isinstance(text, str):
                texts.append(text)
    return texts


def _canonical_content(content: object) -> list[Any]:
    """User content as a list of parts: a string is one text part."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return _list(content)


def _system_text(head: Sequence[Mapping[str, Any]], key: str = "content") -> str:
    return "\n\n".join("\n".join(_text_parts(m.get(key))) for m in head)


# --------------------------------------------------------------------------- #
# Fingerprints (what identifies a host message across turns)
# --------------------------------------------------------------------------- #


def chat_fingerprint(message: Mapping[str, Any]) -> str:
    """The fingerprint of a Chat Completions message (see :mod:`mimo_ctx.providers._sync`).

    Assistant messages that call tools are known by their call ids, ``tool``
    messages by the call they answer; other messages by role and content.
    """
    role = message.get("role")
    if role == "assistant":
        calls = [c.get("id") for c in dicts(message.get("tool_calls"))]
        if calls:
            return fingerprint("assistant-calls", calls)
        texts = _text_parts(message.get("content"))
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal:
            texts.append(refusal)
        return fingerprint("assistant", texts)
    if role == "tool":
        return fingerprint("tool-result", message.get("tool_call_id"))
    return fingerprint(str(role), _canonical_content(message.get("content")))


def responses_fingerprint(item: Mapping[str, Any]) -> str:
    """The fingerprint of a Responses API input (or output) item."""
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role == "assistant":
            return fingerprint("assistant", ["".join(_text_parts(item.get("content")))])
        return fingerprint(str(role), _responses_content(item.get("content")))
    if kind == "function_call":
        return fingerprint("call", item.get("call_id"))
    if kind == "function_call_output":
        return fingerprint("call-result", item.get("call_id"))
    if kind == "reasoning" and isinstance(item.get("id"), str):
        return fingerprint("reasoning", item["id"])
    rest = {k: v for k, v in item.items() if k != "status"}
    return fingerprint(str(kind), rest)


def _responses_content(content: object) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    return _list(content)


def _is_system(item: Mapping[str, Any]) -> bool:
    return item.get("role") in _SYSTEM_ROLES and item.get("type", "message") == "message"


# --------------------------------------------------------------------------- #
# Answers -> recorded messages
# --------------------------------------------------------------------------- #


def _usage(usage: object, *, sent: str, received: str) -> TokenUsage | None:
    """An OpenAI ``usage`` whose counts are ``<sent>_tokens`` / ``<received>_tokens``."""
    data = as_dict(usage)
    if not data:
        return None
    cached = positive_int(as_dict(data.get(f"{sent}_tokens_details")).get("cached_tokens"))
    details = as_dict(data.get(f"{received}_tokens_details"))
    total = positive_int(data.get("total_tokens"))
    return TokenUsage(
        input=max(positive_int(data.get(f"{sent}_tokens")) - cached, 0),
        output=positive_int(data.get(f"{received}_tokens")),
        reasoning=positive_int(details.get("reasoning_tokens")),
        cache_read=cached,
        total=total or None,
    )


def chat_usage(usage: object) -> TokenUsage | None:
    """Chat Completions ``usage`` -> :class:`TokenUsage` (None when absent)."""
    return _usage(usage, sent="prompt", received="completion")


def responses_usage(usage: object) -> TokenUsage | None:
    """Responses API ``usage`` -> :class:`TokenUsage` (None when absent)."""
    return _usage(usage, sent="input", received="output")


_CHAT_FINISH: Final = {
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "stop": "stop",
    "length": "length",
    "content_filter": "content-filter",
}


def _chat_overflow(answer: object) -> str | None:
    """The overflow a completion (or a chunk) reports in a choice's finish reason."""
    for choice in _items(answer, "choices"):
        reason = getattr(choice, "finish_reason", None)
        if isinstance(reason, str) and reason.lower() in OVERFLOW_ERROR_CODES:
            return f"finish_reason {reason}"
    return None


def _chat_answer(
    message: Mapping[str, Any],
    turn: Turn,
    *,
    finish_reason: object,
    usage: object,
    model: object,
    response_id: object,
) -> Answer:
    calls = dicts(message.get("tool_calls"))
    host: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if calls:
        host["tool_calls"] = calls
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        host["refusal"] = refusal
    _, converted = from_openai_chat([host], session_id=turn.session_id, agent=turn.agent)
    recorded = assistant_answer(
        converted,
        turn=turn,
        finish=finish_of(finish_reason, _CHAT_FINISH, calls=bool(calls)),
        usage=chat_usage(usage),
        model=model,
        response_id=response_id,
    )
    return recorded, (chat_fingerprint(host),)


def _completion_answer(completion: Mapping[str, Any], turn: Turn) -> Answer:
    choices = dicts(completion.get("choices"))
    choice = next((c for c in choices if c.get("index") == 0), choices[0] if choices else {})
    return _chat_answer(
        as_dict(choice.get("message")),
        turn,
        finish_reason=choice.get("finish_reason"),
        usage=completion.get("usage"),
        model=completion.get("model"),
        response_id=completion.get("id"),
    )


def _response_answer(response: Mapping[str, Any], turn: Turn) -> Answer:
    status = response.get("status")
    if status == "failed":
        return None, ()
    output = dicts(response.get("output"))
    _, converted = from_openai_responses(output, session_id=turn.session_id, agent=turn.agent)
    calls = any(o.get("type") == "function_call" for o in output)
    finish = "tool-calls" if calls else "stop"
    if status == "incomplete":
        reason = as_dict(response.get("incomplete_details")).get("reason")
        finish = {"max_output_tokens": "length", "content_filter": "content-filter"}.get(
            str(reason), "other"
        )
    recorded = assistant_answer(
        converted,
        turn=turn,
        finish=finish,
        usage=responses_usage(response.get("usage")),
        model=response.get("model"),
        response_id=response.get("id"),
    )
    return recorded, tuple(responses_fingerprint(o) for o in output)


def _response_overflow(response: object) -> str | None:
    """The overflow a failed (not streamed) response reports in its error."""
    if getattr(response, "status", None) != "failed":
        return None
    error = as_dict(getattr(response, "error", None))
    if error and is_overflow_stream_event({"type": "error", **error}):
        return "response failed"
    return None


# --------------------------------------------------------------------------- #
# Stream adapters
# --------------------------------------------------------------------------- #


class _ChatStream(Accumulator):
    """Accumulates Chat Completions chunks (choice 0) into the final message."""

    def reset(self) -> None:
        self._id: object = None
        self._model: object = None
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: object = None
        self._usage: object = None
        self._seen = False

    def is_preamble(self, event: Any) -> bool:
        if getattr(event, "usage", None) is not None:
            return False
        for choice in _items(event, "choices"):
            delta = getattr(choice, "delta", None)
            if getattr(choice, "finish_reason", None) is not None:
                return False
            if delta is not None and (
                getattr(delta, "content", None)
                or getattr(delta, "tool_calls", None)
                or getattr(delta, "refusal", None)
            ):
                return False
        return True

    def overflow(self, event: Any) -> str | None:
        return _chat_overflow(event)

    def complete(self) -> bool:
        return self._finish is not None

    def add(self, event: Any) -> None:
        self._seen = True
        self._id = self._id or getattr(event, "id", None)
        self._model = self._model or getattr(event, "model", None)
        usage = getattr(event, "usage", None)
        if usage is not None:
            self._usage = usage
        for choice in _items(event, "choices"):
            if getattr(choice, "index", 0) != 0:
                continue
            reason = getattr(choice, "finish_reason", None)
            if reason is not None:
                self._finish = reason
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            content = getattr(delta, "content", None)
            if isinstance(content, str):
                self._content.append(content)
            refusal = getattr(delta, "refusal", None)
            if isinstance(refusal, str):
                self._refusal.append(refusal)
            for call in _items(delta, "tool_calls"):
                self._add_call(call)

    def _add_call(self, call: Any) -> None:
        index = getattr(call, "index", 0)
        entry = self._calls.setdefault(
            index if isinstance(index, int) else 0,
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        call_id = getattr(call, "id", None)
        if isinstance(call_id, str) and call_id:
            entry["id"] = call_id
        function = getattr(call, "function", None)
        if function is not None:
            name = getattr(function, "name", None)
            if isinstance(name, str):
                entry["function"]["name"] += name
            arguments = getattr(function, "arguments", None)
            if isinstance(arguments, str):
                entry["function"]["arguments"] += arguments

    def answer(self) -> Answer:
        if not self._seen:
            return None, ()
        # A call cut before its id arrived cannot be sent back: it is left out.
        calls = [self._calls[i] for i in sorted(self._calls) if self._calls[i]["id"]]
        message: dict[str, Any] = {
            "content": "".join(self._content) if self._content else None,
            "tool_calls": calls,
        }
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        return _chat_answer(
            message,
            self._turn,
            finish_reason=self._finish,
            usage=self._usage,
            model=self._model,
            response_id=self._id,
        )


_RESPONSES_PREAMBLE: Final = frozenset(
    {"response.created", "response.in_progress", "response.queued"}
)
_RESPONSES_FINAL: Final = frozenset(
    {"response.completed", "response.incomplete", "response.failed"}
)


class _ResponsesStream(Accumulator):
    """Accumulates Responses API stream events into the final message."""

    def reset(self) -> None:
        self._final: dict[str, Any] | None = None
        self._start: dict[str, Any] = {}
        self._items: dict[int, dict[str, Any]] = {}
        self._failed = False

    def is_preamble(self, event: Any) -> bool:
        return getattr(event, "type", None) in _RESPONSES_PREAMBLE

    def overflow(self, event: Any) -> str | None:
        kind = getattr(event, "type", None)
        if kind in ("error", "response.failed") and is_overflow_stream_event(event):
            return f"{kind} event"
        return None

    def complete(self) -> bool:
        return self._final is not None

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        index = getattr(event, "output_index", None)
        if kind == "response.created":
            self._start = as_dict(getattr(event, "response", None))
        elif kind in ("response.output_item.added", "response.output_item.done"):
            if isinstance(index, int):
                self._items[index] = as_dict(getattr(event, "item", None))
        elif kind == "response.output_text.delta" and isinstance(index, int):
            item = self._items.get(index)
            if item is not None:
                content: list[Any] = item.setdefault("content", [])
                if not content:
                    content.append({"type": "output_text", "text": "", "annotations": []})
                part = cast(dict[str, Any], content[-1])
                part["text"] = str(part.get("text") or "") + str(getattr(event, "delta", ""))
        elif kind == "response.function_call_arguments.delta" and isinstance(index, int):
            item = self._items.get(index)
            if item is not None:
                item["arguments"] = str(item.get("arguments") or "") + str(
                    getattr(event, "delta", "")
                )
        elif kind in _RESPONSES_FINAL:
            self._final = as_dict(getattr(event, "response", None))
        if kind in ("error", "response.failed"):
            self._failed = True

    def answer(self) -> Answer:
        if self._failed:
            return None, ()
        response = self._final
        if response is None:
            if not self._items:
                return None, ()
            # The stream ended without its final event: what had arrived.
            output = [self._items[i] for i in sorted(self._items)]
            response = {**self._start, "output": output, "status": "completed", "usage": None}
        return _response_answer(response, self._turn)


# --------------------------------------------------------------------------- #
# The wrapper
# --------------------------------------------------------------------------- #


def _chat_item_fingerprint(item: object) -> str | None:
    data = as_dict(item)
    return None if _is_system(data) else chat_fingerprint(data)


def _chat_drafts(run: Sequence[object]) -> list[MessageDraft]:
    return drafts_from_openai_chat([as_dict(i) for i in run])[1]


def _chat_prefix(heads: Sequence[object], tools: object) -> tuple[str, list[dict[str, Any]]]:
    return _system_text([as_dict(h) for h in heads]), dicts(tools)


def _responses_item_fingerprint(item: object) -> str | None:
    data = as_dict(item)
    return None if _is_system(data) else responses_fingerprint(data)


def _responses_drafts(run: Sequence[object]) -> list[MessageDraft]:
    return drafts_from_openai_responses([as_dict(i) for i in run])[1]


_CHAT_API: Final = ManagedApi(
    key="messages",
    format="openai-chat",
    convert=lambda run, previous: to_openai_chat(run),
    adapter=_ChatStream,
    answer=_completion_answer,
    overflow=_chat_overflow,
)

_RESPONSES_API: Final = ManagedApi(
    key="input",
    format="openai-responses",
    convert=lambda run, previous: to_openai_responses(run, shorthand=True),
    adapter=_ResponsesStream,
    answer=_response_answer,
    overflow=_response_overflow,
)


class _ChatCompletions(Resource):
    """``chat.completions`` with a managed ``create``; everything else delegated."""

    def create(self, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """``chat.completions.create`` on the managed history (see the module docs).

        Returns the call's coroutine, as the SDK's method does: the host awaits
        :func:`~mimo_ctx.providers._wrapper.managed_call`'s coroutine itself, which runs
        the SDK's coroutine with none of ours around it (see there why)."""
        raw = kwargs.get("messages")
        if raw is None or isinstance(raw, str | bytes | Mapping):
            return self._inner.create(**kwargs)  # let the SDK report the error
        return self._managed_create(kwargs, _CHAT_API, partial(self._sync, raw, kwargs))

    async def _sync(self, raw: object, kwargs: Mapping[str, Any]) -> Turn:
        refuse_native_context(kwargs, api="chat", call="chat.completions.create")
        return await self._binding.sync(
            cast(Sequence[object], raw),
            fingerprint=_chat_item_fingerprint,
            convert=_chat_drafts,
            prefix=lambda heads: _chat_prefix(heads, kwargs.get("tools")),
        )


class _Chat:
    def __init__(self, inner: Any, binding: SessionBinding) -> None:
        self._inner = inner
        self.completions = _ChatCompletions(inner.completions, binding)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Responses(Resource):
    """``responses`` with a managed ``create``; everything else delegated."""

    def create(self, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """``responses.create`` on the managed history (see the module docs).

        Returns the call's coroutine, as the SDK's method does (see
        :meth:`_ChatCompletions.create`)."""
        raw = kwargs.get("input")
        if raw is None or isinstance(raw, bytes | Mapping) or not isinstance(raw, str | Sequence):
            return self._inner.create(**kwargs)  # let the SDK report the error
        return self._managed_create(kwargs, _RESPONSES_API, partial(self._sync, raw, kwargs))

    async def _sync(self, raw: object, kwargs: Mapping[str, Any]) -> Turn:
        refuse_native_context(kwargs, api="responses", call="responses.create")
        items: Sequence[object] = (
            [{"role": "user", "content": raw}]
            if isinstance(raw, str)
            else cast(Sequence[object], raw)
        )
        instructions = kwargs.get("instructions")

        def prefix(heads: Sequence[object]) -> tuple[str, list[dict[str, Any]]]:
            head_text = _system_text([as_dict(h) for h in heads])
            first = instructions if isinstance(instructions, str) else ""
            return "\n\n".join(t for t in (first, head_text) if t), dicts(kwargs.get("tools"))

        return await self._binding.sync(
            items, fingerprint=_responses_item_fingerprint, convert=_responses_drafts, prefix=prefix
        )


class OpenAIWrapper(ClientWrapper):
    """The object :func:`wrap_openai` returns: the client's surface, managed calls rewritten.

    Attributes:
        chat: ``chat`` with a managed ``completions.create``.
        responses: ``responses`` with a managed ``create``.
        binding: The session this wrapper's calls belong to.
    """

    def __init__(self, client: Any, binding: SessionBinding) -> None:
        super().__init__(client, binding)
        self.chat = _Chat(client.chat, binding)
        self.responses = _Responses(client.responses, binding)


def wrap_openai(
    client: _C,
    middleware: ContextMiddleware,
    *,
    session_id: str,
    agent: str = MAIN_AGENT,
    project_id: str = "default",
    conversations: Conversations = "refuse",
) -> _C:
    """Wrap an ``openai.AsyncOpenAI`` client so its calls run through ``middleware``.

    The result has the client's call surface (and is typed as the client, so host
    code type-checks unchanged); see the module docs for what is managed.

    Args:
        client: An ``openai.AsyncOpenAI`` (or ``AsyncAzureOpenAI``) client.
        middleware: A running :class:`~mimo_ctx.middleware.ContextMiddleware`.
        session_id: The session every call belongs to (created on first use).
        agent: The agent the calls are made for.
        project_id: Project of the session when it is created.
        conversations: What a call whose messages share nothing with the session
            does: ``refuse`` (:class:`~mimo_ctx.errors.ConversationMismatchError`)
            or ``per-first-message`` (a session of its own; see
            :mod:`mimo_ctx.providers._sync`).

    Raises:
        ImportError: The ``openai`` SDK is not installed (names the extra).
        ConfigError: ``client`` is a sync client or already wrapped, or ``session_id``
            is empty.
    """
    openai = require_sdk("openai", "wrap_openai", OPENAI_EXTRA)
    refuse_wrapped(client, "wrap_openai")
    if isinstance(client, openai.OpenAI):
        raise ConfigError(
            f"wrap_openai needs an async client (openai.AsyncOpenAI), got {type(client).__name__}: "
            "the middleware is async"
        )
    if not has_async_method(client, "chat", "completions", "create"):
        raise ConfigError(
            "wrap_openai needs an openai.AsyncOpenAI client "
            f"(chat.completions.create must be async), got {type(client).__name__}"
        )
    binding = bind(client, middleware, session_id, agent, project_id, conversations=conversations)
    return cast(_C, OpenAIWrapper(client, binding))
