"""pydantic-ai integration: context rebuild as one capability.

Adding mimo_ctx to a pydantic-ai (2.x) agent is one line::

    agent = Agent(model, capabilities=[MimoCtxCapability(middleware)])

The capability hooks the model request lifecycle of pydantic-ai's capabilities API:

* ``prepare_model_request`` (every attempt, once the serving model is known):
  stores what is new in the history pydantic-ai is about to send, runs
  :meth:`~mimo_ctx.middleware.ContextMiddleware.prepare` (which rebuilds when the
  last usage crossed the trigger line) and sends the request view instead of the
  full history. Only the request changes: the run's message history is left as it
  is, so nothing is lost and ``result.all_messages()`` stays complete.
* ``wrap_model_request``: stores the response the request settles on with its
  ``ModelResponse.usage``, which drives the writer thresholds and the trigger line.
* ``on_model_request_error``: on a context overflow the middleware rebuilds and
  the capability raises :class:`~pydantic_ai.exceptions.RetryModelRequest`, so
  pydantic-ai attempts the request once more with a freshly prepared history; a
  second overflow for the same usage raises
  :class:`~mimo_ctx.errors.ContextOverflowError`. Any other error propagates.

Session. ``session_id`` names the session; leave it ``None`` to use the run's
``conversation_id`` (pydantic-ai keeps one conversation id across runs that share
``message_history``), or pass a callable that picks one from the
:class:`~pydantic_ai.RunContext`. The stored session is the conversation: with a
fixed ``session_id``, a run started without ``message_history`` still continues
what the session holds (the default, one session per conversation id, does not
have this effect).

Limits (ours). The history synced is the one the request is built from, after
the ``before_model_request`` hooks of every capability: a message another
capability adds to one request only is stored like the rest. Give this
capability its own ``session_id`` per conversation rather than sharing one
session between agents that keep different histories.

Conversion (see :mod:`mimo_ctx.integrations._sync` for the recognition of stored
messages). System prompt parts at the head of the conversation and the agent's
instructions become the session's frozen prefix and are always sent as
pydantic-ai has them. User prompts become user text and files; tool returns
become :class:`~mimo_ctx.messages.ToolResultPart` s in ``tool`` messages (failed
and retried outcomes, and the deprecated ``RetryPromptPart`` with a tool, as
errors); a retry prompt without a tool and ``RetryFeedbackPart`` become synthetic
user text. Responses keep text, thinking (signature and provider fields) and tool
calls. Every other part kind (pydantic-ai's own compaction part, native tool
parts, instruction and tool-availability deltas, system prompts later in the
conversation...) is carried as an :class:`~mimo_ctx.messages.OpaquePart` and sent
back unchanged while its message is live. On the way back pydantic-ai's own
objects are sent for everything the send rules left unchanged; cleared tool
results are copies of the original return with the placeholder as content; the
boundary is one user prompt whose text starts with "Summary of previous
conversation from checkpoint files:".

Requires the ``pydantic-ai`` extra: ``pip install "mimo-ctx[pydantic-ai]"``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from mimo_ctx._sqlite_worker import hold_checkpoints
from mimo_ctx.checkpoint.llm import ModelAnswer, WriterPrompt
from mimo_ctx.convert import (
    MessageDraft,
    build_messages,
    decode_arguments,
)
from mimo_ctx.errors import MimoCtxError
from mimo_ctx.integrations._pydantic_ai_send import (
    REQUEST_PART,
    RESPONSE_PART,
    SOURCE,
    USER_CONTENT,
    USER_CONTENT_KIND,
    both_requests,
    convert_items,
    finish,
    to_model_messages,
)
from mimo_ctx.integrations._sync import (
    IntegrationSync,
    StandaloneWriterModel,
    add_part,
    extra_error,
    new_draft,
)
from mimo_ctx.messages import (
    MAIN_AGENT,
    FilePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStatePending,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.rebuild import RebuildCommand, rebuild_command

try:
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import AbstractCapability, WrapModelRequestHandler
    from pydantic_ai.direct import model_request
    from pydantic_ai.exceptions import RetryModelRequest
    from pydantic_ai.messages import (
        ERROR_OUTCOMES,
        AudioUrl,
        BinaryContent,
        CachePoint,
        DocumentUrl,
        ImageUrl,
        InstructionPart,
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        RetryFeedbackPart,
        RetryPromptPart,  # pyright: ignore[reportDeprecated]
        SystemPromptPart,
        TextContent,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
        VideoUrl,
    )
    from pydantic_ai.messages import TextPart as AITextPart
    from pydantic_ai.models import Model, ModelRequestContext
    from pydantic_ai.usage import RequestUsage
    from pydantic_core import PydanticSerializationError
except ImportError as _exc:  # pragma: no cover - exercised by a test with the package hidden
    raise extra_error("pydantic_ai", "pydantic-ai", "pydantic-ai-slim") from _exc

__all__ = [
    "SOURCE",
    "MimoCtxCapability",
    "PydanticAIWriterModel",
    "SessionIdFunc",
    "from_model_messages",
    "message_key",
    "to_model_messages",
    "usage_from_pydantic_ai",
]

_log = logging.getLogger("mimo_ctx")


SessionIdFunc = Callable[[RunContext[Any]], str]
"""Picks the session id for a run from its context."""


# --------------------------------------------------------------------------- keys


def _is_carried(part: object) -> bool:
    """True for the part kinds this integration stores as opaque parts."""
    return not isinstance(
        part,
        SystemPromptPart
        | UserPromptPart
        | ToolReturnPart
        | RetryPromptPart  # pyright: ignore[reportDeprecated]
        | RetryFeedbackPart
        | AITextPart
        | ThinkingPart
        | ToolCallPart,
    )


def message_key(message: ModelMessage) -> str:
    """A stable identity of a pydantic-ai message (before occurrence numbering).

    A digest of the message kind, the content of its parts (their creation
    timestamps included, application-only ``metadata`` left out) and, for a
    response, its timestamp. Fields pydantic-ai fills in after a message was
    created (run ids, instructions, the model id) are left out, and so are carried
    part kinds when the message has others: pydantic-ai may append such parts
    (capability loads) to a request it already sent.
    """
    dumped = cast("dict[str, Any]", ModelMessagesTypeAdapter.dump_python([message], mode="json")[0])
    raw_parts = cast("list[dict[str, Any]]", dumped.get("parts", []))
    parts: list[dict[str, Any]] = [
        {k: v for k, v in p.items() if k != "metadata"} for p in raw_parts
    ]
    known = [p for p, obj in zip(parts, message.parts, strict=True) if not _is_carried(obj)]
    payload: dict[str, Any] = {"kind": message.kind, "parts": known or parts}
    if isinstance(message, ModelResponse):
        payload["timestamp"] = dumped.get("timestamp")
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


# --------------------------------------------------------------------------- to internal


def _opaque(part: object, *, response: bool) -> OpaquePart:
    adapter = RESPONSE_PART if response else REQUEST_PART
    try:
        data = cast("dict[str, Any]", adapter.dump_python(cast("Any", part), mode="json"))
    except (PydanticSerializationError, TypeError, ValueError):
        data = {}
    kind = str(getattr(part, "part_kind", type(part).__name__))
    return OpaquePart(source=SOURCE, kind=kind, data=data)


def _user_items(part: UserPromptPart) -> list[Part]:
    if isinstance(part.content, str):
        return [TextPart(text=part.content)]
    out: list[Part] = []
    for item in part.content:
        if isinstance(item, str):
            out.append(TextPart(text=item))
        elif isinstance(item, TextContent):
            out.append(TextPart(text=item.content))
        elif isinstance(item, BinaryContent):
            out.append(FilePart(mime=item.media_type, url=item.data_uri))
        elif isinstance(item, ImageUrl | DocumentUrl | AudioUrl | VideoUrl):
            out.append(FilePart(mime=item.media_type, url=item.url))
        elif isinstance(item, CachePoint):
            continue  # a marker, not content: the original part carries it
        else:
            try:
                data = cast("dict[str, Any]", USER_CONTENT.dump_python(item, mode="json"))
            except (PydanticSerializationError, TypeError, ValueError):
                data = {}
            out.append(OpaquePart(source=SOURCE, kind=USER_CONTENT_KIND, data={"item": data}))
    return out


def _request_drafts(message: ModelRequest, *, first: bool) -> list[MessageDraft]:
    """A request -> a ``tool`` message (tool results) and a ``user`` message (the rest).

    System prompt parts that open the conversation belong to the frozen prefix
    and are not stored. Carried parts go with the user content; without user
    content, with the tool results; without either, they make a user message of
    their own.
    """
    classified: list[tuple[int, str, Part]] = []
    leading = first
    for index, part in enumerate(message.parts):
        if leading and isinstance(part, SystemPromptPart):
            continue
        leading = False
        if isinstance(part, ToolReturnPart):
            result = ToolResultPart(
                call_id=part.tool_call_id,
                tool=part.tool_name,
                output=part.model_response_str(),
                is_error=part.outcome in ERROR_OUTCOMES,
            )
            classified.append((index, "tool", result))
        elif isinstance(part, RetryPromptPart):  # pyright: ignore[reportDeprecated]
            text = part.model_response()
            if part.tool_name is not None:
                result = ToolResultPart(
                    call_id=part.tool_call_id, tool=part.tool_name, output=text, is_error=True
                )
                classified.append((index, "tool", result))
            else:
                classified.append((index, "user", TextPart(text=text, synthetic=True)))
        elif isinstance(part, RetryFeedbackPart):
            classified.append((index, "user", TextPart(text=part.model_response(), synthetic=True)))
        elif isinstance(part, UserPromptPart):
            classified.extend((index, "user", p) for p in _user_items(part))
        else:
            classified.append((index, "carried", _opaque(part, response=False)))
    has_user = any(kind == "user" for _, kind, _ in classified)
    has_tool = any(kind == "tool" for _, kind, _ in classified)
    carried_to = "user" if has_user or not has_tool else "tool"
    tool = new_draft("tool", SOURCE)
    user = new_draft("user", SOURCE)
    for index, kind, part in classified:
        target = carried_to if kind == "carried" else kind
        add_part(tool if target == "tool" else user, part, index)
    return [d for d in (tool, user) if d.parts]


def usage_from_pydantic_ai(usage: RequestUsage) -> TokenUsage | None:
    """``ModelResponse.usage`` -> :class:`~mimo_ctx.messages.TokenUsage` (None when empty).

    pydantic-ai counts cache reads and writes inside ``input_tokens``; the
    internal model keeps them apart and sets ``total`` to input + output.
    """
    if not usage.has_values():
        return None
    cached = usage.cache_read_tokens + usage.cache_write_tokens
    return TokenUsage(
        input=max(usage.input_tokens - cached, 0),
        output=usage.output_tokens,
        reasoning=usage.output_reasoning_tokens,
        cache_read=usage.cache_read_tokens,
        cache_write=usage.cache_write_tokens,
        total=usage.input_tokens + usage.output_tokens,
    )


def _response_draft(message: ModelResponse) -> MessageDraft:
    draft = new_draft(
        "assistant",
        SOURCE,
        usage=usage_from_pydantic_ai(message.usage),
        model=message.model_name,
        provider_message_id=message.provider_response_id,
    )
    for index, part in enumerate(message.parts):
        if isinstance(part, AITextPart):
            add_part(draft, TextPart(text=part.content), index)
        elif isinstance(part, ThinkingPart):
            extra = {
                k: v
                for k, v in (
                    ("id", part.id),
                    ("provider_name", part.provider_name),
                    ("provider_details", part.provider_details),
                )
                if v is not None
            }
            add_part(
                draft,
                ReasoningPart(
                    text=part.content,
                    signature=part.signature,
                    provider_data={SOURCE: extra} if extra else None,
                ),
                index,
            )
        elif isinstance(part, ToolCallPart):
            call = ToolPart(
                call_id=part.tool_call_id,
                tool=part.tool_name,
                state=ToolStatePending(input=decode_arguments(part.args)),
            )
            add_part(draft, call, index)
        else:
            add_part(draft, _opaque(part, response=True), index)
    calls = any(isinstance(p, ToolPart) for p in draft.parts)
    draft.finish = "tool-calls" if calls else (message.finish_reason or "stop")
    return draft


def _drafts(message: ModelMessage, first: bool) -> list[MessageDraft]:
    if isinstance(message, ModelRequest):
        return _request_drafts(message, first=first)
    return [_response_draft(message)]


def from_model_messages(
    messages: Sequence[ModelMessage], *, session_id: str, agent: str = MAIN_AGENT
) -> list[Message]:
    """Convert a pydantic-ai history to internal messages (fresh ascending ids, in order).

    The conversion the capability stores with; useful to import a saved
    ``result.all_messages()``. System prompt parts opening the conversation are
    prefix material and are left out.

    Args:
        messages: The history, oldest first.
        session_id: Session of the new messages.
        agent: Agent id of the new messages.
    """
    drafts = [d for index, m in enumerate(messages) for d in _drafts(m, index == 0)]
    for draft in drafts:
        draft.metadata = {}
    return build_messages(drafts, session_id=session_id, agent=agent, finished=True)


# --------------------------------------------------------------------------- capability


def _prefix_of(
    history: Sequence[ModelMessage], request_context: ModelRequestContext
) -> tuple[str, list[dict[str, object]]]:
    texts: list[str] = []
    first = history[0] if history else None
    if isinstance(first, ModelRequest):
        for part in first.parts:
            if not isinstance(part, SystemPromptPart):
                break
            texts.append(part.content)
    params = request_context.model_request_parameters
    instructions = InstructionPart.join(params.instruction_parts or [])
    if instructions:
        texts.append(instructions)
    tools: list[dict[str, object]] = [
        {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.parameters_json_schema,
        }
        for tool in params.function_tools
    ]
    return "\n\n".join(texts), tools


def _command_of(messages: Sequence[ModelMessage]) -> RebuildCommand | None:
    """The ``/rebuild [focus]`` the user's newest prompt is, if it is one."""
    last = messages[-1] if messages else None
    if not isinstance(last, ModelRequest) or any(isinstance(p, ToolReturnPart) for p in last.parts):
        return None
    for part in last.parts:
        if isinstance(part, UserPromptPart) and isinstance(part.content, str):
            command = rebuild_command(part.content)
            if command is not None:
                return command
    return None


@dataclass
class MimoCtxCapability(AbstractCapability[Any]):
    """A pydantic-ai capability that keeps the agent inside its context window.

    Args:
        middleware: The engine (entered as an async context manager while the agent
            runs, so checkpoint writers can run in the background).
        session_id: The session: a fixed id, a function of the run context, or
            ``None`` for the run's ``conversation_id``.
        project_id: Project of a session this capability creates (memory layout).
        agent: The agent id the history belongs to (``main`` is rebuilt; a
            sub-agent gets a plain compaction, SPEC R1.4a).

    Example:
        >>> agent = Agent(model, capabilities=[MimoCtxCapability(mw)])  # doctest: +SKIP
    """

    middleware: ContextMiddleware
    session_id: str | SessionIdFunc | None = None
    project_id: str = "default"
    agent: str = MAIN_AGENT

    @classmethod
    def get_serialization_name(cls) -> str | None:
        """Not spec-serialisable: it holds a live middleware."""
        return None

    def _sync(self, ctx: RunContext[Any]) -> IntegrationSync:
        chosen = self.session_id
        session_id = chosen(ctx) if callable(chosen) else chosen
        if session_id is None:
            session_id = ctx.conversation_id
        if not session_id:
            raise MimoCtxError(
                "MimoCtxCapability: no session id: pass session_id= or run with a conversation_id"
            )
        return IntegrationSync(self.middleware, session_id, source=SOURCE, agent=self.agent)

    async def prepare_model_request(
        self,
        ctx: RunContext[Any],
        request_context: ModelRequestContext,
    ) -> ModelRequestContext:
        """Store what is new, rebuild if due, and send the request view instead."""
        # The request's own list (pydantic-ai gives each request one), read and then
        # replaced, never changed: no copy of the history per request.
        history = request_context.messages
        sync = self._sync(ctx)
        async with sync.lock:
            system, tools = _prefix_of(history, request_context)
            await sync.open(project_id=self.project_id, system=system, tools=tools)
            await sync.sync(history, key=message_key, convert=_drafts)
            view = await self.middleware.prepare(sync.session_id, agent=self.agent)
            sent = await sync.outgoing(view, convert_items, merges=both_requests)
        request_context.messages = finish(sent, history)
        return request_context

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        """Store the response the step settles on, with its usage (it drives the trigger line).

        Recorded here rather than in ``after_model_request``: an attempt another
        capability rejects (a fallback moving on) never reaches the run's history,
        so it must not reach the store either. When the user's newest prompt is
        ``/rebuild [focus]`` the model is not called: the middleware rebuilds and the
        response is one text part with the outcome.
        """
        sync = self._sync(ctx)
        command = _command_of(request_context.messages)
        if command is not None:
            response = ModelResponse(parts=[AITextPart(await sync.rebuild(command))])
            async with sync.lock:
                await sync.record(message_key(response), _response_draft(response), response)
            return response
        # The store's idle checkpoint waits for the call's end (see hold_checkpoints).
        with hold_checkpoints(self.middleware.store):
            response = await handler(request_context)
            async with sync.lock:
                await sync.record(message_key(response), _response_draft(response), response)
        return response

    async def on_model_request_error(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        error: Exception,
    ) -> ModelResponse:
        """On a context overflow rebuild and attempt once more; raise anything else."""
        sync = self._sync(ctx)
        if await self.middleware.on_error(sync.session_id, error, agent=self.agent):
            raise RetryModelRequest() from error
        raise error


# --------------------------------------------------------------------------- checkpoint writer


class PydanticAIWriterModel(StandaloneWriterModel):
    """A checkpoint-writer model on a pydantic-ai model (``LLMCheckpointWriter.from_pydantic_ai``).

    Each call is one direct model request (``pydantic_ai.direct.model_request``)
    with the writer's instructions as the system prompt and its user message: a
    standalone call (the writer does not fork through a framework, whose request
    bytes it does not control). Usage as pydantic-ai reports it.

    Args:
        model: A pydantic-ai ``Model`` or a model name (``"openai:gpt-5"``).
    """

    def __init__(self, model: Model | str) -> None:
        self._model = model

    @property
    def name(self) -> str:
        """``pydantic-ai:<model name>``."""
        model = self._model
        return f"pydantic-ai:{model if isinstance(model, str) else model.model_name}"

    async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
        """Send one request and return its text and usage."""
        request = ModelRequest(
            parts=[SystemPromptPart(content=prompt.system), UserPromptPart(content=prompt.user)]
        )
        response = await model_request(
            self._model, [request], model_settings={"max_tokens": prompt.max_output_tokens}
        )
        text = "".join(p.content for p in response.parts if isinstance(p, AITextPart))
        usage = response.usage
        measured = usage.has_values()
        return ModelAnswer(
            text=text,
            input_tokens=usage.input_tokens if measured else None,
            cached_tokens=usage.cache_read_tokens,
            output_tokens=usage.output_tokens if measured else None,
        )
