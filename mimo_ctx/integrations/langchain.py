"""LangChain integration: context rebuild as one agent middleware.

Adding mimo_ctx to a LangChain (1.x) agent is one line::

    agent = create_agent(model, tools, middleware=[MimoCtxMiddleware(middleware)])

:class:`MimoCtxMiddleware` implements ``awrap_model_call``. For every model call
it stores what is new in the agent's messages, runs
:meth:`~mimo_ctx.middleware.ContextMiddleware.prepare` (which rebuilds when the
last usage crossed the trigger line) and hands the request view to the model
through ``request.override(messages=...)``: the graph state is left as it is, so
nothing is lost. The returned ``AIMessage`` is stored with its
``usage_metadata`` (which drives the writer thresholds and the trigger line). On
a context overflow it rebuilds and calls the model once more with a freshly
prepared request; a second overflow raises
:class:`~mimo_ctx.errors.ContextOverflowError`; any other error propagates
unchanged.

The engine is asynchronous, so run the agent with ``ainvoke`` / ``astream``; the
synchronous ``invoke`` raises a clear error.

Session. ``session_id`` names the session; leave it ``None`` to use the
LangGraph ``thread_id`` of the run (``config={"configurable": {"thread_id": ...}}``),
or pass a callable that picks one from the model request. The stored session is
the conversation: with a fixed ``session_id``, an invocation that starts a fresh
message list (no checkpointer) still continues what the session holds.

Conversion (see :mod:`mimo_ctx.integrations._sync` for the recognition of stored
messages, by LangChain message id). The agent's system message and system
messages that open the conversation become the session's frozen prefix and are
always sent as they are. ``HumanMessage`` -> user text and files, ``AIMessage``
-> assistant text, reasoning and tool calls (with usage), ``ToolMessage`` -> a
tool result (``status="error"`` as an error). Other messages (a system message
later in the conversation, legacy message types) and content blocks of unknown
types are carried as :class:`~mimo_ctx.messages.OpaquePart` s and sent back
unchanged while their message is live. LangChain's own message objects are sent
for everything the send rules left unchanged; a cleared tool result is a copy of
its ``ToolMessage`` with the placeholder as content; the boundary is one
``HumanMessage`` starting with "Summary of previous conversation from
checkpoint files:".

Requires the ``langchain`` extra: ``pip install "mimo-ctx[langchain]"``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeGuard, cast

from mimo_ctx._sqlite_worker import hold_checkpoints
from mimo_ctx.checkpoint.llm import ModelAnswer, WriterPrompt
from mimo_ctx.convert import (
    BOUNDARY_TEXT_SEPARATOR,
    MessageDraft,
    ToolOutcome,
    build_messages,
    decode_arguments,
    file_mention,
    make_data_url,
)
from mimo_ctx.errors import ContextOverflowError, MimoCtxError
from mimo_ctx.integrations._sync import (
    IntegrationSync,
    OutgoingItem,
    StandaloneWriterModel,
    add_part,
    extra_error,
    new_draft,
    own_outcomes,
    stored_items,
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
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.rebuild import RebuildCommand, rebuild_command
from mimo_ctx.view import tool_results_by_call

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.messages.tool import ToolCall
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as _exc:  # pragma: no cover - exercised by a test with the package hidden
    raise extra_error("langchain", "langchain", "langchain") from _exc

__all__ = [
    "SOURCE",
    "LangChainWriterModel",
    "MimoCtxMiddleware",
    "SessionIdFunc",
    "from_langchain_messages",
    "message_key",
    "to_langchain_messages",
    "usage_from_langchain",
]

_log = logging.getLogger("mimo_ctx")

SOURCE: Final = "langchain"
"""``OpaquePart.source`` and the sync source name of this integration."""

SessionIdFunc = Callable[[ModelRequest[Any]], str]
"""Picks the session id for a model call from its request."""

_BLOCK_KIND: Final = "block"
_Blocks = list[str | dict[str, Any]]


# --------------------------------------------------------------------------- keys


def message_key(message: BaseMessage) -> str:
    """A stable identity of a LangChain message (before occurrence numbering).

    The message id when it has one (LangGraph gives every message in the state
    one), else a digest of its type and content.
    """
    if message.id:
        return f"{message.type}:{message.id}"
    payload: dict[str, Any] = {"type": message.type, "content": message.content}
    if isinstance(message, AIMessage):
        payload["tool_calls"] = message.tool_calls
    if isinstance(message, ToolMessage):
        payload["tool_call_id"] = message.tool_call_id
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return "digest:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


# --------------------------------------------------------------------------- to internal


def _dump(message: BaseMessage) -> dict[str, Any]:
    try:
        return {"type": message.type, "data": message.model_dump(mode="json")}
    except (TypeError, ValueError):
        return message_to_dict(message)


def _blocks(content: str | list[str | dict[Any, Any]]) -> _Blocks:
    if isinstance(content, str):
        return [content] if content else []
    return cast("_Blocks", list(content))


def _text_of(content: str | list[str | dict[Any, Any]]) -> str:
    texts: list[str] = []
    for block in _blocks(content):
        if isinstance(block, str):
            texts.append(block)
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(cast("str", block["text"]))
    return "\n".join(texts)


def _file_block(block: Mapping[str, Any]) -> FilePart | None:
    kind = block.get("type")
    if kind == "image_url":
        raw: object = block.get("image_url")
        url = cast("Mapping[str, object]", raw).get("url") if isinstance(raw, Mapping) else raw
        if isinstance(url, str):
            mime = "image/*"
            if url.startswith("data:"):
                mime = url[5:].split(";", 1)[0].split(",", 1)[0] or mime
            return FilePart(mime=mime, url=url)
        return None
    if kind in ("image", "file", "audio", "video"):
        mime = str(block.get("mime_type") or f"{kind}/*")
        if isinstance(block.get("url"), str):
            return FilePart(mime=mime, url=block["url"], filename=block.get("filename"))
        data = block.get("base64") or block.get("data")
        if isinstance(data, str):
            return FilePart(
                mime=mime, url=make_data_url(mime, data), filename=block.get("filename")
            )
    return None


def _content_parts(content: str | list[str | dict[Any, Any]], *, assistant: bool) -> list[Part]:
    parts: list[Part] = []
    for block in _blocks(content):
        if isinstance(block, str):
            if block:
                parts.append(TextPart(text=block))
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            if block["text"]:
                parts.append(TextPart(text=block["text"]))
            continue
        if assistant and kind in ("reasoning", "thinking"):
            text = block.get("reasoning") or block.get("thinking") or ""
            signature = block.get("signature")
            parts.append(
                ReasoningPart(
                    text=str(text),
                    signature=signature if isinstance(signature, str) else None,
                    provider_data={SOURCE: dict(block)},
                )
            )
            continue
        found = None if assistant else _file_block(block)
        if found is not None:
            parts.append(found)
        else:
            # Provider blocks (tool_use copies of tool calls, citations, documents...)
            # are carried: the original message is sent back with them.
            parts.append(OpaquePart(source=SOURCE, kind=f"{_BLOCK_KIND}:{kind}", data=dict(block)))
    return parts


def usage_from_langchain(message: AIMessage) -> TokenUsage | None:
    """``AIMessage.usage_metadata`` -> :class:`~mimo_ctx.messages.TokenUsage` (None if absent).

    LangChain counts cache reads and writes inside ``input_tokens``; the internal
    model keeps them apart and takes ``total_tokens`` as the total.
    """
    usage = message.usage_metadata
    if not usage:
        return None
    details = cast("Mapping[str, Any]", usage.get("input_token_details") or {})
    out_details = cast("Mapping[str, Any]", usage.get("output_token_details") or {})
    read = int(details.get("cache_read") or 0)
    write = int(details.get("cache_creation") or 0)
    total = int(usage.get("total_tokens") or 0)
    return TokenUsage(
        input=max(int(usage.get("input_tokens") or 0) - read - write, 0),
        output=int(usage.get("output_tokens") or 0),
        reasoning=int(out_details.get("reasoning") or 0),
        cache_read=read,
        cache_write=write,
        total=total or None,
    )


def _assistant_draft(message: AIMessage) -> MessageDraft:
    draft = new_draft("assistant", SOURCE, usage=usage_from_langchain(message))
    for part in _content_parts(message.content, assistant=True):
        add_part(draft, part, 0)
    for call in message.tool_calls:
        add_part(
            draft,
            ToolPart(
                call_id=call.get("id") or "",
                tool=call["name"],
                state=ToolStatePending(input=decode_arguments(call.get("args"))),
            ),
            0,
        )
    metadata = cast("Mapping[str, Any]", message.response_metadata or {})
    model = metadata.get("model_name") or metadata.get("model")
    draft.model = model if isinstance(model, str) else None
    finish = metadata.get("finish_reason") or metadata.get("stop_reason")
    calls = bool(message.tool_calls)
    draft.finish = "tool-calls" if calls else (finish if isinstance(finish, str) else "stop")
    draft.provider_message_id = message.id
    return draft


def _drafts(
    message: BaseMessage, *, names: Mapping[str, str], missing_tool: str = ""
) -> list[MessageDraft]:
    """A message -> drafts; a tool result's tool name is the message's, else the call's in
    ``names``, else ``missing_tool`` (empty: the host-history reconciler fills it in from
    the stored call)."""
    if isinstance(message, HumanMessage):
        draft = new_draft("user", SOURCE)
        for part in _content_parts(message.content, assistant=False):
            add_part(draft, part, 0)
        return [draft]
    if isinstance(message, AIMessage):
        return [_assistant_draft(message)]
    if isinstance(message, ToolMessage):
        draft = new_draft("tool", SOURCE)
        tool = message.name or names.get(message.tool_call_id) or missing_tool
        result = ToolResultPart(
            call_id=message.tool_call_id,
            tool=tool,
            output=_text_of(message.content),
            is_error=message.status == "error",
        )
        add_part(draft, result, 0)
        return [draft]
    # A system message later in the conversation, legacy message types: carried.
    draft = new_draft("user", SOURCE)
    add_part(draft, OpaquePart(source=SOURCE, kind=message.type, data=_dump(message)), None)
    return [draft]


def _leading_system(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for message in messages:
        if not isinstance(message, SystemMessage):
            break
        out.append(message)
    return out


def _tool_names(messages: Sequence[BaseMessage]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                if call.get("id"):
                    names[cast("str", call["id"])] = call["name"]
    return names


def from_langchain_messages(
    messages: Sequence[BaseMessage], *, session_id: str, agent: str = MAIN_AGENT
) -> list[Message]:
    """Convert LangChain messages to internal messages (fresh ascending ids, in order).

    The conversion the middleware stores with. System messages that open the
    list are prefix material and are left out.

    Args:
        messages: The conversation, oldest first.
        session_id: Session of the new messages.
        agent: Agent id of the new messages.
    """
    names = _tool_names(messages)
    skip = len(_leading_system(messages))
    drafts = [
        d
        for message in messages[skip:]
        for d in _drafts(message, names=names, missing_tool="unknown")
    ]
    for draft in drafts:
        draft.metadata = {}
    return build_messages(drafts, session_id=session_id, agent=agent, finished=True)


# --------------------------------------------------------------------------- to LangChain


def _restore(part: OpaquePart) -> BaseMessage | None:
    if part.source != SOURCE or part.kind.startswith(f"{_BLOCK_KIND}:"):
        return None
    try:
        return messages_from_dict([part.data])[0]
    except (KeyError, TypeError, ValueError):
        _log.debug("cannot restore a carried %s message of type %r", SOURCE, part.kind)
        return None


def _user_content(parts: Sequence[Part]) -> str | list[str | dict[Any, Any]]:
    blocks: list[str | dict[Any, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart):
            if part.mime.startswith("image/"):
                blocks.append({"type": "image_url", "image_url": {"url": part.url}})
            else:
                blocks.append({"type": "text", "text": file_mention(part)})
        elif (
            isinstance(part, OpaquePart)
            and part.source == SOURCE
            and part.kind.startswith(f"{_BLOCK_KIND}:")
        ):
            blocks.append(dict(part.data))
    if len(blocks) == 1 and isinstance(blocks[0], dict) and blocks[0].get("type") == "text":
        return cast("str", blocks[0]["text"])
    return blocks


def _tool_message(part: ToolPart | ToolResultPart, outcome: ToolOutcome) -> ToolMessage:
    return ToolMessage(
        content=outcome.output,
        tool_call_id=part.call_id,
        name=part.tool,
        status="error" if outcome.is_error else "success",
    )


def _convert(message: Message, parts: Sequence[Part]) -> list[BaseMessage]:
    """A message the framework never had (or parts it never had) as LangChain's."""
    if message.role == "user":
        content = _user_content(parts)
        return [HumanMessage(content=content)] if content else []
    if message.role == "tool":
        return [
            _tool_message(p, ToolOutcome(p.output, p.is_error))
            for p in parts
            if isinstance(p, ToolResultPart)
        ]
    text = "\n\n".join(p.text for p in parts if isinstance(p, TextPart))
    calls: list[ToolCall] = [
        ToolCall(name=p.tool, args=dict(p.state.input), id=p.call_id, type="tool_call")
        for p in parts
        if isinstance(p, ToolPart)
    ]
    return [AIMessage(content=text, tool_calls=calls)]


def _is_cleared(part: Part) -> TypeGuard[ToolResultPart]:
    """A tool result the send rules replaced by its placeholder (SPEC R4.5)."""
    return (
        isinstance(part, ToolResultPart) and part.time.compacted is not None and not part.is_error
    )


def _from_origin(item: OutgoingItem, origin: BaseMessage) -> BaseMessage:
    """The framework's message, edited where the send rules changed it."""
    assert item.message is not None  # callers pass view messages only
    stored = {slot.part_id for slot in item.slots}
    sent = item.message.parts
    message = origin
    cleared = next((p.output for p in sent if _is_cleared(p)), None)
    if (
        cleared is not None
        and isinstance(origin, ToolMessage)
        and _text_of(origin.content) != cleared
    ):
        # A copy: the graph state keeps the full result.
        message = origin.model_copy(update={"content": cleared})
    extra = [p for p in sent if p.id not in stored]
    if extra:
        # Parts LangChain never had (the per-turn reminder) are appended.
        added = _user_content(extra)
        blocks: _Blocks = _blocks(message.content)
        new: _Blocks = [b if isinstance(b, dict) else {"type": "text", "text": b} for b in blocks]
        new.extend(_blocks(added) if isinstance(added, list) else [{"type": "text", "text": added}])
        message = message.model_copy(update={"content": new})
    return message


def _outgoing(
    items: Sequence[OutgoingItem],
    view_messages: Sequence[Message],
    leading: Sequence[BaseMessage],
) -> list[BaseMessage]:
    return [*leading, *_convert_items(items, tool_results_by_call(view_messages))]


def _convert_items(
    items: Sequence[OutgoingItem], results: Mapping[str, ToolResultPart]
) -> list[BaseMessage]:
    """The LangChain messages of a run of planned items (``results``: the separately
    stored results the run holds)."""
    out: list[BaseMessage] = []
    for item in items:
        origin = item.origin if isinstance(item.origin, BaseMessage) else None
        converted: list[BaseMessage]
        if item.message is None:
            # A live message sent only for its carried content.
            if origin is not None:
                converted = [origin]
            else:
                restored = (_restore(s.opaque) for s in item.slots if s.opaque is not None)
                converted = [m for m in restored if m is not None][:1]
        elif item.is_boundary:
            texts = [p.text for p in item.message.parts if isinstance(p, TextPart)]
            converted = [HumanMessage(content=BOUNDARY_TEXT_SEPARATOR.join(texts))]
        elif origin is not None:
            converted = [_from_origin(item, origin)]
        else:
            parts = list(item.message.parts)
            opaque = {s.part_id: s.opaque for s in item.slots if s.opaque is not None}
            if opaque:
                # Carried blocks go back in their place.
                order = [s.part_id for s in item.slots]
                by_id = {p.id: p for p in parts}
                parts = [
                    p for pid in order if (p := by_id.get(pid) or opaque.get(pid)) is not None
                ] + [p for p in item.message.parts if p.id not in set(order)]
            converted = _convert(item.message, parts)
        out.extend(converted)
        if item.role == "assistant" and item.message is not None:
            out.extend(_tool_message(p, o) for p, o in own_outcomes(item.message, results))
    return out


def to_langchain_messages(messages: Sequence[Message]) -> list[BaseMessage]:
    """Convert internal messages to the LangChain messages a model is sent.

    The send rules are applied first (SPEC A10): a rebuild boundary becomes one
    ``HumanMessage`` starting with "Summary of previous conversation from
    checkpoint files:", compacted tool results read as the placeholder, and every
    tool call is answered (interrupted calls as error ``ToolMessage`` s). Carried
    messages of this integration are restored from their data.

    Args:
        messages: Stored messages, oldest first (e.g. ``RequestView.messages``).
    """
    items, sent = stored_items(messages)
    return _outgoing(items, sent, ())


# --------------------------------------------------------------------------- middleware


def _ai_messages(response: object) -> list[AIMessage]:
    if isinstance(response, AIMessage):
        return [response]
    inner = getattr(response, "model_response", None)
    result = getattr(inner if inner is not None else response, "result", None)
    if isinstance(result, list):
        return [m for m in cast("list[object]", result) if isinstance(m, AIMessage)]
    return []


class MimoCtxMiddleware(AgentMiddleware):
    """A LangChain agent middleware that keeps the agent inside its context window.

    Args:
        middleware: The engine (entered as an async context manager while the agent
            runs, so checkpoint writers can run in the background).
        session_id: The session: a fixed id, a function of the model request, or
            ``None`` for the run's LangGraph ``thread_id``.
        project_id: Project of a session this middleware creates (memory layout).
        agent: The agent id the history belongs to (``main`` is rebuilt; a
            sub-agent gets a plain compaction, SPEC R1.4a).

    Example:
        >>> ctx = MimoCtxMiddleware(mw, session_id="s1")  # doctest: +SKIP
        >>> agent = create_agent(model, tools, middleware=[ctx])  # doctest: +SKIP
    """

    def __init__(
        self,
        middleware: ContextMiddleware,
        session_id: str | SessionIdFunc | None = None,
        *,
        project_id: str = "default",
        agent: str = MAIN_AGENT,
    ) -> None:
        super().__init__()
        self.middleware = middleware
        self.session_id = session_id
        self.project_id = project_id
        self.agent = agent

    def _sync(self, request: ModelRequest[Any]) -> IntegrationSync:
        chosen = self.session_id
        session_id = chosen(request) if callable(chosen) else chosen
        if session_id is None:
            info = getattr(request.runtime, "execution_info", None)
            session_id = getattr(info, "thread_id", None)
        if not session_id:
            raise MimoCtxError(
                "MimoCtxMiddleware: no session id: pass session_id= or run the agent with "
                'config={"configurable": {"thread_id": ...}}'
            )
        return IntegrationSync(self.middleware, session_id, source=SOURCE, agent=self.agent)

    async def _prepared(
        self, sync: IntegrationSync, request: ModelRequest[Any]
    ) -> ModelRequest[Any]:
        # Read, never changed (the request is overridden with a new list): not copied.
        history = request.messages
        leading = _leading_system(history)
        async with sync.lock:
            texts = [request.system_message.text] if request.system_message else []
            texts.extend(m.text for m in leading)
            tools = [cast("dict[str, object]", convert_to_openai_tool(t)) for t in request.tools]
            await sync.open(
                project_id=self.project_id, system="\n\n".join(t for t in texts if t), tools=tools
            )
            prefix = {id(m) for m in leading}

            def key(message: BaseMessage) -> str | None:
                return None if id(message) in prefix else message_key(message)

            def convert(message: BaseMessage, first: bool) -> list[MessageDraft]:
                return _drafts(message, names={})

            await sync.sync(history, key=key, convert=convert)
            view = await self.middleware.prepare(sync.session_id, agent=self.agent)
            sent = await sync.outgoing(view, _convert_items)
        messages = cast("list[AnyMessage]", [*leading, *sent])
        return request.override(messages=messages)

    async def _record(self, sync: IntegrationSync, response: object) -> None:
        for message in _ai_messages(response):
            if not message.id:
                # The graph would give it a fresh id; give it one now so the next
                # sync recognises the stored copy.
                message.id = f"lc_mimo-{uuid.uuid4()}"
            async with sync.lock:
                await sync.record(message_key(message), _assistant_draft(message), message)

    async def _command(
        self, sync: IntegrationSync, request: ModelRequest[Any], command: RebuildCommand
    ) -> ModelResponse[Any]:
        """``/rebuild [focus]``: rebuild, and answer with the outcome instead of the model."""
        await self._prepared(sync, request)  # stores the history, the command included
        reply = AIMessage(content=await sync.rebuild(command))
        await self._record(sync, reply)
        return ModelResponse(result=[reply])

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """Send the request view; record the response; recover from one overflow.

        When the newest message is the user's ``/rebuild [focus]`` the model is not
        called: the middleware rebuilds (SPEC A3: a manual rebuild starts no model
        turn) and the answer is one ``AIMessage`` with the outcome.
        """
        sync = self._sync(request)
        last = request.messages[-1] if request.messages else None
        if isinstance(last, HumanMessage):
            command = rebuild_command(_text_of(last.content))
            if command is not None:
                return await self._command(sync, request, command)
        # The store's idle checkpoint waits for the call's end (see hold_checkpoints).
        with hold_checkpoints(self.middleware.store):
            try:
                response = await handler(await self._prepared(sync, request))
            except Exception as exc:
                if not await self.middleware.on_error(sync.session_id, exc, agent=self.agent):
                    raise
                try:
                    response = await handler(await self._prepared(sync, request))
                except Exception as again:
                    if is_context_overflow(again):
                        raise ContextOverflowError(
                            f"session {sync.session_id}: the request still overflows after a "
                            "rebuild"
                        ) from again
                    raise
            await self._record(sync, response)
        return response

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        """Not supported: the engine is asynchronous (use ``ainvoke`` / ``astream``)."""
        raise MimoCtxError(
            "MimoCtxMiddleware works with asynchronous agent runs only: "
            "call ainvoke()/astream() instead of invoke()/stream()"
        )


# --------------------------------------------------------------------------- checkpoint writer


class LangChainWriterModel(StandaloneWriterModel):
    """A checkpoint-writer model on a LangChain chat model (``LLMCheckpointWriter.from_langchain``).

    Each call is one ``ainvoke`` with a system message (the writer's instructions)
    and a human message: a standalone call (the writer does not fork through a
    framework, whose request bytes it does not control). Usage from the answer's
    ``usage_metadata``, when the model reports it.

    Args:
        chat_model: A ``BaseChatModel``.
    """

    def __init__(self, chat_model: BaseChatModel) -> None:
        self._chat_model = chat_model

    @property
    def name(self) -> str:
        """``langchain:<model type>``."""
        return f"langchain:{self._chat_model.get_name()}"

    async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
        """Send one call and return its text and usage."""
        answer = await self._chat_model.ainvoke(
            [SystemMessage(content=prompt.system), HumanMessage(content=prompt.user)],
            max_tokens=prompt.max_output_tokens,
        )
        usage = usage_from_langchain(answer)
        if usage is None:
            return ModelAnswer(text=answer.text)
        return ModelAnswer(
            text=answer.text,
            input_tokens=usage.input + usage.cache_read + usage.cache_write,
            cached_tokens=usage.cache_read,
            output_tokens=usage.output,
        )
