"""What the pydantic-ai integration sends: stored messages as pydantic-ai's own objects.

Private to :mod:`mimo_ctx.integrations.pydantic_ai` (see its docs for the rules),
which re-exports :func:`to_model_messages`. Here also the names both directions
share: the integration's ``SOURCE`` and pydantic's type adapters of the parts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from mimo_ctx.convert import (
    BOUNDARY_TEXT_SEPARATOR,
    ToolOutcome,
    file_mention,
    parse_data_url,
)
from mimo_ctx.integrations._sync import (
    OutgoingItem,
    extra_error,
    own_outcomes,
    stored_items,
)
from mimo_ctx.messages import (
    FilePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
)
from mimo_ctx.view import tool_results_by_call

try:
    import pydantic
    from pydantic_ai.messages import (
        AudioUrl,
        BinaryContent,
        DocumentUrl,
        ImageUrl,
        ModelMessage,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        ModelResponsePart,
        RetryPromptPart,  # pyright: ignore[reportDeprecated]
        SystemPromptPart,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserContent,
        UserPromptPart,
        VideoUrl,
    )
    from pydantic_ai.messages import TextPart as AITextPart
except ImportError as _exc:  # pragma: no cover - exercised by a test with the package hidden
    raise extra_error("pydantic_ai", "pydantic-ai", "pydantic-ai-slim") from _exc

__all__ = [
    "REQUEST_PART",
    "RESPONSE_PART",
    "SOURCE",
    "USER_CONTENT",
    "USER_CONTENT_KIND",
    "ToolResultLike",
    "both_requests",
    "convert_items",
    "finish",
    "outgoing",
    "to_model_messages",
]

_log = logging.getLogger("mimo_ctx")

SOURCE: Final = "pydantic-ai"
"""``OpaquePart.source`` and the sync source name of this integration."""

REQUEST_PART: pydantic.TypeAdapter[ModelRequestPart] = pydantic.TypeAdapter(ModelRequestPart)
RESPONSE_PART: pydantic.TypeAdapter[ModelResponsePart] = pydantic.TypeAdapter(ModelResponsePart)
USER_CONTENT: pydantic.TypeAdapter[UserContent] = pydantic.TypeAdapter(UserContent)
USER_CONTENT_KIND: Final = "user-content"
ToolResultLike = ToolReturnPart | RetryPromptPart  # pyright: ignore[reportDeprecated]


def _restore(part: OpaquePart, *, response: bool) -> list[Any]:
    """The framework part an opaque part was made from, or nothing when it cannot be."""
    if part.source != SOURCE:
        return []
    try:
        if part.kind == USER_CONTENT_KIND:
            item = USER_CONTENT.validate_python(part.data.get("item"))
            return [UserPromptPart(content=[item])]
        adapter = RESPONSE_PART if response else REQUEST_PART
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


def _tool_return(part: ToolPart | ToolResultPart, outcome: ToolOutcome) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=part.tool,
        content=outcome.output,
        tool_call_id=part.call_id,
        outcome="failed" if outcome.is_error else "success",
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
    return isinstance(part, ToolResultLike)


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
            out.append(_tool_return(part, ToolOutcome(part.output, part.is_error)))
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
    items, sent = stored_items(messages)
    return outgoing(items, sent, ())


def outgoing(
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
    return finish(convert_items(items, tool_results_by_call(view_messages)), history)


def both_requests(a: object, b: object) -> bool:
    return isinstance(a, ModelRequest) and isinstance(b, ModelRequest)


def convert_items(
    items: Sequence[OutgoingItem], results: Mapping[str, ToolResultPart]
) -> list[ModelMessage]:
    """The messages of a run of planned items (``results``: the separately stored results
    the run holds); :func:`finish` adds what depends on the whole history."""
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
            answers = [_tool_return(p, o) for p, o in own_outcomes(item.message, results)]
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


def finish(messages: Sequence[ModelMessage], history: Sequence[ModelMessage]) -> list[ModelMessage]:
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
