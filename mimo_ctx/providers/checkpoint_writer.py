"""Checkpoint-writer models on the OpenAI and Anthropic SDKs.

:class:`OpenAIWriterModel` (Chat Completions or Responses) and
:class:`AnthropicWriterModel` (Messages) are the :class:`~mimo_ctx.checkpoint.llm.WriterModel`
s behind :meth:`LLMCheckpointWriter.from_openai
<mimo_ctx.checkpoint.llm.LLMCheckpointWriter.from_openai>` and
:meth:`~mimo_ctx.checkpoint.llm.LLMCheckpointWriter.from_anthropic`. They call the
SDK client they were given; a wrapped client (:func:`~mimo_ctx.providers.wrap_openai`,
:func:`~mimo_ctx.providers.wrap_anthropic`) is unwrapped first, so the writer's
calls never enter the session they summarise.

Forked calls (the writer's model is the session's own: same API, same ``model``,
same base URL). The request a wrapped client last sent for the session is sent
again with every keyword argument as it was — ``system``, ``tools``,
``tool_choice``, ``thinking``, ``prompt_cache_key``... — and ``messages`` /
``input`` extended by one user message, so the bytes before that message are the
ones the provider cached. Changed, because a checkpoint needs them changed (our
choices): streaming is off; the output limit is the writer's (Anthropic: at least
the session's, so a thinking budget still fits); a ``tool_choice`` that forces a
tool call becomes ``none``; a structured-output format is dropped. With
``fork=True`` and no wrapped client's payload, the request is built from the
session's frozen prefix and its last view with the provider's own converter
(:func:`~mimo_ctx.providers.openai.to_openai_chat`,
:func:`~mimo_ctx.providers.openai.to_openai_responses`,
:func:`~mimo_ctx.providers.anthropic.to_anthropic`), the Anthropic conversation
breakpoint put where the wrapped client puts it.

Usage: the provider's input tokens (cached included), cached tokens (OpenAI
``cached_tokens``, Anthropic ``cache_read_input_tokens``) and output tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, cast

from mimo_ctx.checkpoint.llm import LLMCheckpointWriter, ModelAnswer, WriterPrompt
from mimo_ctx.checkpoint.protocol import SentApi, SentRequest
from mimo_ctx.errors import ConfigError
from mimo_ctx.messages import Message, TokenUsage
from mimo_ctx.providers._payload import marked_view
from mimo_ctx.providers._sync import (
    client_origin,
    has_async_method,
    plain,
    sdk_client,
)
from mimo_ctx.providers._wrapper import as_dict, require_sdk
from mimo_ctx.providers.anthropic import mark_conversation_cache, to_anthropic
from mimo_ctx.providers.anthropic_client import ANTHROPIC_EXTRA, anthropic_usage
from mimo_ctx.providers.openai import to_openai_chat, to_openai_responses
from mimo_ctx.providers.openai_client import OPENAI_EXTRA, chat_usage, responses_usage
from mimo_ctx.triggers import ModelLimits

__all__ = [
    "WRITER_SPECS",
    "AnthropicWriterModel",
    "OpenAIApi",
    "OpenAIWriterModel",
    "writer_from_spec",
]

WRITER_SPECS: Final = ("openai:<model>", "openai-responses:<model>", "anthropic:<model>")
"""The model writers :func:`writer_from_spec` builds, as a command line names them."""

OpenAIApi = Literal["chat", "responses"]
"""Which OpenAI API a writer model calls."""

_REQUEST_TIMEOUT: Final = 600.0
_CHAT_DROP: Final = frozenset(
    {"stream", "stream_options", "n", "logprobs", "top_logprobs", "prediction", "audio"}
)
_RESPONSES_DROP: Final = frozenset({"stream", "stream_options", "background"})
_ANTHROPIC_DROP: Final = frozenset({"stream"})


def _same_origin(sent: str | None, ours: str | None) -> bool:
    return sent is None or ours is None or sent == ours


def _sent_tokens(usage: TokenUsage | None) -> tuple[int | None, int, int | None]:
    """(input cached included, cached, output) of a provider usage."""
    if usage is None:
        return None, 0, None
    return usage.input + usage.cache_read + usage.cache_write, usage.cache_read, usage.output


def _view(sent: SentRequest) -> list[Message]:
    """The view's messages as a wrapped client converts them (its boundary recognisable)."""
    return marked_view(sent.messages, sent.boundary_id)


def _forced(choice: object) -> bool:
    """True for a ``tool_choice`` that makes the model call a tool."""
    if choice == "required":
        return True
    if isinstance(choice, Mapping):
        kind = cast("Mapping[str, Any]", choice).get("type")
        return kind in {"function", "any", "tool", "allowed_tools", "custom"}
    return False


def _structured(value: object, key: str) -> bool:
    """True when a response format (``response_format`` / ``text.format``) is not plain text."""
    data = plain(value)
    if isinstance(data, Mapping) and key:
        data = cast("Mapping[str, Any]", data).get(key)
    return isinstance(data, Mapping) and cast("Mapping[str, Any]", data).get("type") != "text"


def _resent(
    fork: SentRequest, api: SentApi, key: str, drop: frozenset[str], user: object
) -> dict[str, Any] | None:
    """The session's request as a wrapped client sent it, ``user`` appended to ``key``.

    Every keyword argument is kept but those in ``drop``; ``None`` when ``fork``
    holds no payload of ``api`` (the request is then built from the view).
    """
    payload = fork.payload
    if fork.api != api or payload is None:
        return None
    body: dict[str, Any] = {k: v for k, v in payload.items() if k not in drop}
    body[key] = [*cast("Sequence[Any]", payload[key]), user]
    return body


class _SdkWriterModel:
    """What the SDK writer models share: the client, the model, its endpoint, forking.

    A subclass checks its client first (each SDK has its own async client).
    """

    def __init__(
        self, client: Any, *, model: str, sent_api: SentApi, timeout: float, owns_client: bool
    ) -> None:
        if not model:
            raise ConfigError("model: expected a model name")
        self._client = client
        self._model = model
        self._sent_api: SentApi = sent_api
        self._origin = client_origin(client)
        self._timeout = timeout
        self._owns_client = owns_client

    async def aclose(self) -> None:
        """Close the SDK client when this model made it (:func:`writer_from_spec`)."""
        if self._owns_client:
            await self._client.close()

    @property
    def sent_api(self) -> SentApi:
        """The API name a wrapped client records for requests of this kind."""
        return self._sent_api

    def forks(self, sent: SentRequest) -> bool:
        """True when ``sent`` went through the same API to the same model and endpoint."""
        return (
            sent.api == self._sent_api
            and sent.payload is not None
            and sent.payload.get("model") == self._model
            and _same_origin(sent.origin, self._origin)
        )

    def can_fork(self) -> bool:
        """Always: it can resend a session's request."""
        return True


class OpenAIWriterModel(_SdkWriterModel):
    """A checkpoint-writer model on an ``openai.AsyncOpenAI`` client.

    Args:
        client: The SDK client (a wrapped one is unwrapped).
        model: The model name.
        api: ``"chat"`` (Chat Completions) or ``"responses"``.
        timeout: Seconds one call may take at the HTTP level (the writer's run
            timeout bounds the whole run).

    Raises:
        ImportError: The ``openai`` SDK is not installed (names the extra).
        ConfigError: ``client`` is not an async OpenAI client, or ``api`` is unknown.
    """

    def __init__(
        self,
        client: Any,
        *,
        model: str,
        api: OpenAIApi = "chat",
        timeout: float = _REQUEST_TIMEOUT,
        owns_client: bool = False,
    ) -> None:
        openai = require_sdk("openai", "the OpenAI checkpoint writer", OPENAI_EXTRA)
        client = sdk_client(client)
        if isinstance(client, openai.OpenAI) or not has_async_method(
            client, "chat", "completions", "create"
        ):
            raise ConfigError(
                f"the OpenAI checkpoint writer needs an openai.AsyncOpenAI client, got "
                f"{type(client).__name__}"
            )
        if api not in ("chat", "responses"):
            raise ConfigError(f"api: expected 'chat' or 'responses', got {api!r}")
        super().__init__(
            client,
            model=model,
            sent_api="openai-chat" if api == "chat" else "openai-responses",
            timeout=timeout,
            owns_client=owns_client,
        )
        self._api: OpenAIApi = api

    @property
    def name(self) -> str:
        """``openai-chat:<model>`` or ``openai-responses:<model>``."""
        return f"openai-{self._api}:{self._model}"

    def body(self, prompt: WriterPrompt) -> dict[str, Any]:
        """The keyword arguments of the SDK call for ``prompt``."""
        if self._api == "chat":
            return self._chat_body(prompt)
        return self._responses_body(prompt)

    async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
        """Send one call and return its text and usage."""
        body = self.body(prompt)
        if self._api == "chat":
            data = as_dict(
                await self._client.chat.completions.create(**body, timeout=self._timeout)
            )
            choices = cast("list[Any]", data.get("choices") or [])
            first = cast("dict[str, Any]", choices[0]) if choices else {}
            message = cast("dict[str, Any]", first.get("message") or {})
            content = message.get("content")
            text = content if isinstance(content, str) else ""
            sent, cached, output = _sent_tokens(chat_usage(data.get("usage")))
        else:
            data = as_dict(await self._client.responses.create(**body, timeout=self._timeout))
            text = "".join(
                str(part.get("text") or "")
                for item in cast("list[dict[str, Any]]", data.get("output") or [])
                if item.get("type") == "message"
                for part in cast("list[dict[str, Any]]", item.get("content") or [])
                if part.get("type") == "output_text"
            )
            sent, cached, output = _sent_tokens(responses_usage(data.get("usage")))
        return ModelAnswer(text=text, input_tokens=sent, cached_tokens=cached, output_tokens=output)

    def _chat_body(self, prompt: WriterPrompt) -> dict[str, Any]:
        user = {"role": "user", "content": prompt.user}
        fork = prompt.fork
        if fork is None:
            return {
                "model": self._model,
                "messages": [{"role": "system", "content": prompt.system}, user],
                "max_completion_tokens": prompt.max_output_tokens,
            }
        body: dict[str, Any] | None = _resent(fork, "openai-chat", "messages", _CHAT_DROP, user)
        if body is None:
            system = (
                [{"role": "system", "content": fork.prefix.system}] if fork.prefix.system else []
            )
            body = {
                "model": self._model,
                "messages": [*system, *to_openai_chat(_view(fork)), user],
            }
            if fork.prefix.tools:
                body["tools"] = fork.prefix.tools
        body["model"] = self._model  # fork=True may resend a request of another model
        if _structured(body.get("response_format"), ""):
            body.pop("response_format")
        if _forced(body.get("tool_choice")):
            body["tool_choice"] = "none"
        limit = "max_tokens" if "max_tokens" in body else "max_completion_tokens"
        body[limit] = prompt.max_output_tokens
        return body

    def _responses_body(self, prompt: WriterPrompt) -> dict[str, Any]:
        user = {"role": "user", "content": prompt.user}
        fork = prompt.fork
        if fork is None:
            return {
                "model": self._model,
                "instructions": prompt.system,
                "input": [user],
                "max_output_tokens": prompt.max_output_tokens,
            }
        body: dict[str, Any] | None = _resent(
            fork, "openai-responses", "input", _RESPONSES_DROP, user
        )
        if body is None:
            body = {
                "model": self._model,
                "input": [*to_openai_responses(_view(fork)), user],
            }
            if fork.prefix.system:
                body["instructions"] = fork.prefix.system
            if fork.prefix.tools:
                body["tools"] = fork.prefix.tools
        body["model"] = self._model
        if _structured(body.get("text"), "format"):
            body.pop("text")
        if _forced(body.get("tool_choice")):
            body["tool_choice"] = "none"
        body["max_output_tokens"] = prompt.max_output_tokens
        return body


class AnthropicWriterModel(_SdkWriterModel):
    """A checkpoint-writer model on an ``anthropic.AsyncAnthropic`` client.

    Args:
        client: The SDK client (a wrapped one is unwrapped).
        model: The model name.
        timeout: Seconds one call may take at the HTTP level. Passed explicitly,
            which also lets a long answer be asked for without streaming.

    Raises:
        ImportError: The ``anthropic`` SDK is not installed (names the extra).
        ConfigError: ``client`` is not an async Anthropic client.
    """

    def __init__(
        self,
        client: Any,
        *,
        model: str,
        timeout: float = _REQUEST_TIMEOUT,
        owns_client: bool = False,
    ) -> None:
        require_sdk("anthropic", "the Anthropic checkpoint writer", ANTHROPIC_EXTRA)
        client = sdk_client(client)
        if not has_async_method(client, "messages", "create"):
            raise ConfigError(
                "the Anthropic checkpoint writer needs an anthropic.AsyncAnthropic client, got "
                f"{type(client).__name__}"
            )
        super().__init__(
            client, model=model, sent_api="anthropic", timeout=timeout, owns_client=owns_client
        )

    @property
    def name(self) -> str:
        """``anthropic:<model>``."""
        return f"anthropic:{self._model}"

    def body(self, prompt: WriterPrompt) -> dict[str, Any]:
        """The keyword arguments of the SDK call for ``prompt``."""
        user = {"role": "user", "content": [{"type": "text", "text": prompt.user}]}
        fork = prompt.fork
        if fork is None:
            return {
                "model": self._model,
                "system": prompt.system,
                "messages": [user],
                "max_tokens": prompt.max_output_tokens,
            }
        # As sent, the conversation breakpoint included: the cache entry the
        # session's request wrote is the one this request reads.
        body: dict[str, Any] | None = _resent(fork, "anthropic", "messages", _ANTHROPIC_DROP, user)
        if body is not None:
            session_limit = body.get("max_tokens")
            floor = session_limit if isinstance(session_limit, int) else 0
            body["max_tokens"] = max(floor, prompt.max_output_tokens)
        else:
            _, converted = to_anthropic(_view(fork))
            body = {
                "model": self._model,
                "messages": [*mark_conversation_cache(converted), user],
            }
            if fork.prefix.system:
                body["system"] = fork.prefix.system
            if fork.prefix.tools:
                body["tools"] = fork.prefix.tools
            body["max_tokens"] = prompt.max_output_tokens
        body["model"] = self._model
        if _forced(body.get("tool_choice")):
            body["tool_choice"] = {"type": "none"}
        return body

    async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
        """Send one call and return its text and usage."""
        data = as_dict(
            await self._client.messages.create(**self.body(prompt), timeout=self._timeout)
        )
        text = "".join(
            str(block.get("text") or "")
            for block in cast("list[dict[str, Any]]", data.get("content") or [])
            if block.get("type") == "text"
        )
        sent, cached, output = _sent_tokens(anthropic_usage(data.get("usage")))
        return ModelAnswer(text=text, input_tokens=sent, cached_tokens=cached, output_tokens=output)


def writer_from_spec(spec: str, *, limits: ModelLimits | int | None = None) -> LLMCheckpointWriter:
    """A model checkpoint writer named like ``openai:gpt-5`` (see :data:`WRITER_SPECS`).

    The SDK client is made the SDK's default way, so its key and base URL come
    from the SDK's own environment variables (``OPENAI_API_KEY`` /
    ``OPENAI_BASE_URL``, ``ANTHROPIC_API_KEY`` / ``ANTHROPIC_BASE_URL``); the
    writer owns it: :meth:`LLMCheckpointWriter.aclose
    <mimo_ctx.checkpoint.llm.LLMCheckpointWriter.aclose>` closes it.

    Raises:
        ConfigError: ``spec`` names no known provider or no model.
        ImportError: The provider's SDK is not installed (names the extra).
    """
    provider, _, model = spec.partition(":")
    if not model.strip() or provider not in {"openai", "openai-responses", "anthropic"}:
        raise ConfigError(
            f"writer {spec!r}: expected one of {', '.join(WRITER_SPECS)} (or offline)"
        )
    model = model.strip()
    if provider == "anthropic":
        anthropic = require_sdk("anthropic", "the anthropic writer", ANTHROPIC_EXTRA)
        made = AnthropicWriterModel(anthropic.AsyncAnthropic(), model=model, owns_client=True)
        return LLMCheckpointWriter(made, limits=limits)
    openai = require_sdk("openai", "the openai writer", OPENAI_EXTRA)
    api: OpenAIApi = "responses" if provider == "openai-responses" else "chat"
    made = OpenAIWriterModel(openai.AsyncOpenAI(), model=model, api=api, owns_client=True)
    return LLMCheckpointWriter(made, limits=limits)
