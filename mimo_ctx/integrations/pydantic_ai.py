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

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from mimo_ctx.checkpoint.llm import ModelAnswer, WriterPrompt
from mimo_ctx.checkpoint.protocol import SentRequest
from mimo_ctx.convert import (
    BOUNDARY_TEXT_SEPARATOR,
    MessageDraft,
    build_messages,
    decode_arguments,
    file_mention,
    parse_data_url,
    tool_outcome,
)
from mimo_ctx.errors import MimoCtxError
from mimo_ctx.integrations._sync import (
    IntegrationSync,
    OutgoingItem,
    Slot,
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
from mimo_ctx.rebuild import RebuildCommand, describe_rebuild, rebuild_command
from mimo_ctx.view import apply_send_rules, tool_results_by_call

try:
    import pydantic
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
        ModelRequestPart,
        ModelResponse,
        ModelResponsePart,
        RetryFeedbackPart,
        RetryPromptPart,  # pyright: ignore[reportDeprecated]
        SystemPromptPart,
        TextContent,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserContent,
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

SOURCE: Final = "pydantic-ai"
"""``OpaquePart.source`` and the sync source name of this integration."""

SessionIdFunc = Callable[[RunContext[Any]], str]
"""Picks the session id for a run from its context."""

_REQUEST_PART: pydantic.TypeAdapter[ModelRequestPart] = pydantic.TypeAdapter(ModelRequestPart)
_RESPONSE_PART: pydantic.TypeAdapter[ModelResponsePart] = pydantic.TypeAdapter(ModelResponsePart)
_USER_CONTENT: pydantic.TypeAdapter[UserContent] = pydantic.TypeAdapter(UserContent)
_USER_CONTENT_KIND: Final = "user-content"
_ToolResultLike = ToolReturnPart | RetryPromptPart  # pyright: ignore[reportDeprecated]


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
    adapter = _RESPONSE_PART if response else _REQUEST_PART
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
                data = cast("dict[str, Any]", _USER_CONTENT.dump_python(item, mode="json"))
            except (PydanticSerializationError, TypeError, ValueError):
                data = {}
            out.append(OpaquePart(source=SOURCE, kind=_USER_CONTENT_KIND, data={"item": data}))
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


# --------------------------------------------------------------------------- to pydantic-ai


def _restore(part: OpaquePart, *, response: bool) -> list[Any]:
    """The framework part an opaque part was made from, or nothing when it cannot be."""
    if part.source != SOURCE:
        return []
    try:
        if part.kind == _USER_CONTENT_KIND:
            item = _USER_CONTENT.validate_python(part.data.get("item"))
            return [UserPromptPart(content=[item])]
        adapter = _RESPONSE_PART if response else _REQUEST_PART
        return [adapter.validate_python(part.data)]
    except (pydantic.ValidationError, TypeError, ValueError):
        _log.debug("cannot restore a carried %s part of kind %r", SOURCE, part.kind)
        return []


def _file_content(part: FilePart) -> UserContent:
    data = parse_data_url(part.url)
    if data is not None:
        return BinaryContent(data=data.data, media_type=data.mime)
    if part.mime.startswith("image/"):
        return ImageUrl(url=part.url, media_type=part.mime)
    if part.mime.startswith("audio/"):
        return AudioUrl(url=part.url, media_type=part.mime)
    if part.mime.startswith("video/"):
        return VideoUrl(url=part.url, media_type=part.mime)
    return DocumentUrl(url=part.url, media_type=part.mime)


def _user_prompt(parts: Sequence[Part]) -> list[Any]:
    items: list[UserContent] = []
    for part in parts:
        if isinstance(part, TextPart):
            items.append(part.text)
        elif isinstance(part, FilePart):
            items.append(_file_content(part))
    if not items:
        return []
    if len(items) == 1 and isinstance(items[0], str):
        return [UserPromptPart(content=items[0])]
    return [UserPromptPart(content=items)]


def _tool_return(part: ToolResultPart) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=part.tool,
        content=part.output,
        tool_call_id=part.call_id,
        outcome="failed" if part.is_error else "success",
    )


def _response_part(part: Part) -> list[Any]:
    if isinstance(part, TextPart):
        return [AITextPart(content=part.text)]
    if isinstance(part, ReasoningPart):
        found: object = (part.provider_data or {}).get(SOURCE)
        extra: dict[str, Any] = cast("dict[str, Any]", found) if isinstance(found, dict) else {}
        provider_name = cast("str | None", extra.get("provider_name"))
        # pydantic-ai sends signatures back only to the provider that made them.
        return [
            ThinkingPart(
                content=part.text,
                id=extra.get("id") if provider_name else None,
                signature=part.signature if provider_name else None,
                provider_name=provider_name,
                provider_details=extra.get("provider_details") if provider_name else None,
            )
        ]
    if isinstance(part, ToolPart):
        args = dict(part.state.input)
        return [ToolCallPart(tool_name=part.tool, args=args, tool_call_id=part.call_id)]
    if isinstance(part, FilePart):
        return [AITextPart(content=file_mention(part))]
    return []


def _edited(original: object, sent: Part) -> object:
    """The original framework part, edited where the send rules changed its stored part."""
    if not (
        isinstance(sent, ToolResultPart) and sent.time.compacted is not None and not sent.is_error
    ):
        return original
    if _is_tool_result(original) and _content(original) != sent.output:
        # A copy: the original stays in the run's history with its full content.
        return _with_content(original, sent.output)
    return original


def _is_tool_result(part: object) -> bool:
    return isinstance(part, _ToolResultLike)


def _content(part: Any) -> object:
    return part.content


def _with_content(part: Any, content: str) -> object:
    return dataclasses.replace(part, content=content)


def _item_parts(item: OutgoingItem) -> list[Any]:
    response = item.role == "assistant"
    if item.is_boundary and item.message is not None:
        texts = [p.text for p in item.message.parts if isinstance(p, TextPart)]
        return [UserPromptPart(content=BOUNDARY_TEXT_SEPARATOR.join(texts))]
    origin = item.origin
    original_parts: Sequence[Any] = (
        origin.parts if isinstance(origin, ModelRequest | ModelResponse) else ()
    )
    sent: dict[str, Part] = (
        {p.id: p for p in item.message.parts} if item.message is not None else {}
    )
    out: list[Any] = []
    emitted: set[int] = set()
    # Parts without a framework original are converted in runs, so the items of
    # one user message stay one prompt.
    pending: list[Part] = []

    def flush() -> None:
        if pending:
            out.extend(_convert_all(pending, item.role))
            pending.clear()

    for slot in item.slots:
        index = slot.origin
        in_range = index is not None and 0 <= index < len(original_parts)
        original = original_parts[index] if in_range and index is not None else None
        if slot.opaque is not None:
            flush()
            if original is None:
                out.extend(_restore(slot.opaque, response=response))
            elif index not in emitted:
                emitted.add(cast("int", index))
                out.append(original)
            continue
        part = sent.pop(slot.part_id, None)
        if part is None:
            continue  # the send rules dropped it
        if original is None:
            pending.append(part)
        elif index not in emitted:
            flush()
            emitted.add(cast("int", index))
            out.append(_edited(original, part))
    # Then the parts the framework never had: the per-turn reminder, and every
    # part of a message stored by other means.
    pending.extend(sent.values())
    flush()
    return out


def _convert_all(parts: Sequence[Part], role: str) -> list[Any]:
    if role == "user":
        return _user_prompt(parts)
    out: list[Any] = []
    for part in parts:
        if role == "assistant":
            out.extend(_response_part(part))
        elif isinstance(part, ToolResultPart):
            out.append(_tool_return(part))
    return out


@dataclass(slots=True)
class _Group:
    response: bool
    parts: list[Any]
    origins: list[object]


def _same(parts: Sequence[Any], origin: object) -> bool:
    if not isinstance(origin, ModelRequest | ModelResponse):
        return False
    theirs = origin.parts
    return len(theirs) == len(parts) and all(a is b for a, b in zip(theirs, parts, strict=True))


def to_model_messages(messages: Sequence[Message]) -> list[ModelMessage]:
    """Convert internal messages to the pydantic-ai messages a model is sent.

    The send rules are applied first (SPEC A10): a rebuild boundary becomes one
    user prompt starting with "Summary of previous conversation from checkpoint
    files:", compacted tool results read as the placeholder, and every tool call
    is answered (interrupted calls as errors). Consecutive requests are merged.
    Carried parts of this integration are restored from their data.

    Args:
        messages: Stored messages, oldest first (e.g. ``RequestView.messages``).
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
    return _outgoing(items, sent, ())


def _outgoing(
    items: Sequence[OutgoingItem],
    view_messages: Sequence[Message],
    history: Sequence[ModelMessage],
) -> list[ModelMessage]:
    """Build the pydantic-ai messages to send from a planned view.

    Consecutive requests are merged (pydantic-ai would merge them anyway); a
    request or response left exactly as the framework had it is its original
    object. The system prompt parts that open ``history`` are put at the head.
    Every tool call is answered: a call whose result the view does not hold gets
    one (interrupted calls read as errors).
    """
    return _finish(_convert_items(items, tool_results_by_call(view_messages)), history)


def _both_requests(a: object, b: object) -> bool:
    return isinstance(a, ModelRequest) and isinstance(b, ModelRequest)


def _convert_items(
    items: Sequence[OutgoingItem], results: Mapping[str, ToolResultPart]
) -> list[ModelMessage]:
    """The messages of a run of planned items (``results``: the separately stored results
    the run holds); :func:`_finish` adds what depends on the whole history."""
    groups: list[_Group] = []

    def add(response: bool, parts: list[Any], origin: object | None) -> None:
        if not parts:
            return
        if groups and not response and not groups[-1].response:
            groups[-1].parts.extend(parts)
        else:
            groups.append(_Group(response, [], []))
            groups[-1].parts.extend(parts)
        if origin is not None:
            groups[-1].origins.append(origin)

    for item in items:
        response = item.role == "assistant"
        add(response, _item_parts(item), item.origin)
        if response and item.message is not None:
            answers: list[Any] = []
            for part in item.message.parts:
                if isinstance(part, ToolPart) and part.call_id not in results:
                    outcome = tool_outcome(part, results)
                    answers.append(
                        ToolReturnPart(
                            tool_name=part.tool,
                            content=outcome.output,
                            tool_call_id=part.call_id,
                            outcome="failed" if outcome.is_error else "success",
                        )
                    )
            add(False, answers, None)
    out: list[ModelMessage] = []
    for group in groups:
        same = next((o for o in group.origins if _same(group.parts, o)), None)
        if same is not None:
            out.append(cast("ModelMessage", same))
            continue
        template = next(
            (
                o
                for o in group.origins
                if isinstance(o, ModelResponse if group.response else ModelRequest)
            ),
            None,
        )
        if group.response:
            if isinstance(template, ModelResponse):
                out.append(dataclasses.replace(template, parts=group.parts))
            else:
                out.append(ModelResponse(parts=group.parts))
        elif isinstance(template, ModelRequest):
            out.append(dataclasses.replace(template, parts=group.parts))
        else:
            out.append(ModelRequest(parts=group.parts))
    return out


def _finish(
    messages: Sequence[ModelMessage], history: Sequence[ModelMessage]
) -> list[ModelMessage]:
    """The converted messages with the history's head and tail put back (O(1)): the system
    prompt parts that open ``history`` first, and the instructions of its last request."""
    out = list(messages)
    first = history[0] if history else None
    if isinstance(first, ModelRequest):
        leading: list[Any] = []
        for part in first.parts:
            if not isinstance(part, SystemPromptPart):
                break
            leading.append(part)
        if leading:
            head = out[0] if out else None
            if isinstance(head, ModelRequest):
                parts = [*leading, *head.parts]
                out[0] = first if _same(parts, first) else dataclasses.replace(head, parts=parts)
            else:
                out.insert(0, first if _same(leading, first) else ModelRequest(parts=leading))
    last_request = next((m for m in reversed(history) if isinstance(m, ModelRequest)), None)
    if out and isinstance(out[-1], ModelRequest) and last_request is not None:
        tail = out[-1]
        if tail is not last_request and tail.instructions is None:
            # Models that read instructions from the history find them on the
            # last request, as pydantic-ai put them there.
            out[-1] = dataclasses.replace(tail, instructions=last_request.instructions)
    return out


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
        history = list(request_context.messages)
        sync = self._sync(ctx)
        async with sync.lock:
            system, tools = _prefix_of(history, request_context)
            await sync.open(project_id=self.project_id, system=system, tools=tools)
            await sync.sync(history, key=message_key, convert=_drafts)
            view = await self.middleware.prepare(sync.session_id, agent=self.agent)
            sent = await sync.outgoing(view, _convert_items, merges=_both_requests)
        request_context.messages = _finish(sent, history)
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
            # ``/rebuild [focus]``: a manual rebuild starts no model turn (SPEC A3); the
            # answer is the outcome. Prepared again so the answer's estimated usage is
            # the rebuilt request's.
            report = await self.middleware.rebuild(sync.session_id, focus=command.focus)
            await self.middleware.prepare(sync.session_id, agent=self.agent)
            response = ModelResponse(parts=[AITextPart(describe_rebuild(report))])
        else:
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


class PydanticAIWriterModel:
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

    def forks(self, sent: SentRequest) -> bool:
        """Never: see the class docs."""
        return False

    def can_fork(self) -> bool:
        """No."""
        return False

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
