"""Anthropic Messages converters.

SDK-independent: these functions read and build the plain JSON payloads of the
Messages API (the ``anthropic`` SDK's ``*Param`` types are ``TypedDict`` views of
them), so they need no ``anthropic`` install.

Internal -> Messages (:func:`to_anthropic`). The send rules are applied first
(:func:`mimo_ctx.view.apply_send_rules`); then every message becomes a turn of
content blocks and the turns are made to satisfy the API's rules, always:

* assistant content: ``thinking`` blocks (with their ``signature``) and
  ``redacted_thinking`` blocks (with their ``data``) first, in their order, then
  ``text`` and ``tool_use`` (``id``, ``name``, ``input``) blocks in their order.
  Reasoning without an Anthropic signature (another provider's, or text a
  framework made up) is omitted: the API rejects thinking it did not sign;
* every ``tool_use`` is answered by a ``tool_result`` (``tool_use_id``,
  ``content``, ``is_error``) in the user turn that immediately follows, in call
  order, wherever the result is stored; result image attachments are sent as
  image blocks inside the result;
* user content: ``text``, ``image`` (``base64`` source from a ``data:`` URL, else
  ``url`` source), ``document`` for PDFs (same sources) and for ``text/plain``
  ``data:`` files (``text`` source); any other file is named in a text block
  (wording ours). A rebuild boundary (SPEC R8.1) is sent as one text block, its
  text parts joined with a blank line;
* blank text is not sent (the API rejects empty and whitespace-only text blocks);
  a turn left empty is dropped;
* adjacent turns of the same role are merged into one (the API would merge them
  anyway); in a merged user turn ``tool_result`` blocks come first, as the API
  requires;
* the first turn must be a user turn: when the history starts with an
  assistant turn, a user turn reading :data:`LEADING_USER_TEXT` is put first
  (our choice: dropping the assistant turn would lose content).

Messages -> internal (:func:`from_anthropic`): ``tool_result`` blocks are joined
into the calling tool part (``is_error`` makes it an error); a result for no
earlier call is kept as a ``tool`` message with a :class:`ToolResultPart`.
``redacted_thinking`` becomes a redacted :class:`ReasoningPart` whose
``signature`` holds the ``data`` (``text`` stays empty, so nothing renders the
encrypted payload as text). Block kinds without an internal form (server tool
blocks, search results...) are kept as :class:`OpaquePart` (never sent again);
``cache_control`` and ``citations`` are not kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from mimo_ctx.convert import (
    BOUNDARY_TEXT_SEPARATOR,
    DataUrl,
    MessageDraft,
    ToolCallJoiner,
    file_mention,
    finished_messages,
    guess_mime,
    json_entries,
    make_data_url,
    opt_object,
    parse_data_url,
    result_content,
    tool_outcome,
)
from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.messages import (
    MAIN_AGENT,
    FilePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
)
from mimo_ctx.view import apply_send_rules, tool_results_by_call

__all__ = [
    "CACHE_BREAKPOINTS",
    "EMPTY_ERROR_TEXT",
    "LEADING_USER_TEXT",
    "AnthropicSystem",
    "anthropic_turns",
    "cache_breakpoint_turn",
    "cache_markers",
    "drafts_from_anthropic",
    "from_anthropic",
    "is_anthropic_reasoning",
    "mark_conversation_cache",
    "to_anthropic",
]

LEADING_USER_TEXT: Final = "(The conversation continues.)"
"""The user turn put first when a history starts with an assistant turn (wording ours)."""

EMPTY_ERROR_TEXT: Final = "[Tool execution failed]"
"""The content of a failed tool result that has no error text (wording ours)."""

AnthropicSystem = str | list[dict[str, Any]]
"""The Messages API ``system`` parameter: a string or a list of text blocks."""

CACHE_BREAKPOINTS: Final = 4
"""The most ``cache_control`` markers the Messages API accepts in one request."""

_EPHEMERAL: Final = {"type": "ephemeral"}
# Blocks that may carry cache_control (thinking blocks may not).
_CACHEABLE: Final = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "search_result"}
)


def cache_markers(value: object) -> int:
    """How many ``cache_control`` markers ``value`` (system, tools or messages) holds."""
    if isinstance(value, Mapping):
        mapping: Mapping[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
        own = 1 if mapping.get("cache_control") is not None else 0
        return own + sum(cache_markers(v) for k, v in mapping.items() if k != "cache_control")
    if isinstance(value, list | tuple):
        items = cast("Sequence[object]", value)
        return sum(cache_markers(v) for v in items)
    return 0


def mark_conversation_cache(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``messages`` with a prompt-cache breakpoint on the last cacheable block of the last turn.

    The request then writes the whole conversation to the provider's cache, and
    the next request, which repeats it and adds a turn, reads it back (the API
    looks for earlier cached prefixes before a breakpoint). A forked checkpoint
    writer's request repeats it too, marker included, and hits the same entry.
    The input is not changed (a new list; the last turn and its marked block are
    copies, see :func:`cache_breakpoint_turn`); a list whose last turn has no
    cacheable block, or is already marked, is returned as it is (as a new list).
    """
    out = list(messages)
    marked = cache_breakpoint_turn(out[-1]) if out else None
    if marked is not None:
        out[-1] = marked
    return out


def cache_breakpoint_turn(turn: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A copy of ``turn`` with the breakpoint of :func:`mark_conversation_cache` on its
    last cacheable block; None when it has no such block or already holds a marker.

    ``turn`` is not changed (its content list and the marked block are copies).
    """
    content = turn.get("content")
    blocks: list[Any] = (
        [{"type": "text", "text": content}]
        if isinstance(content, str)
        else list(content)  # pyright: ignore[reportUnknownArgumentType]
        if isinstance(content, list)
        else []
    )
    for index in range(len(blocks) - 1, -1, -1):
        block: object = blocks[index]
        if not isinstance(block, Mapping):
            continue
        entry: Mapping[str, Any] = block  # pyright: ignore[reportUnknownVariableType]
        if entry.get("type") not in _CACHEABLE:
            continue
        if entry.get("cache_control") is not None:
            return None
        blocks[index] = {**entry, "cache_control": dict(_EPHEMERAL)}
        return {**turn, "content": blocks}
    return None


def is_anthropic_reasoning(part: ReasoningPart) -> bool:
    """True when a reasoning part can be sent back to Anthropic as it came.

    A redacted part needs its data (``signature``, or ``text`` for parts made
    elsewhere); a thinking part needs a signature and must not come from the
    OpenAI Responses API (whose reasoning lives in ``provider_data["openai"]``).
    """
    if part.provider_data and "openai" in part.provider_data:
        return False
    if part.redacted:
        return bool(part.signature or part.text)
    return bool(part.signature)


def _reasoning_block(part: ReasoningPart) -> dict[str, Any]:
    if part.redacted:
        return {"type": "redacted_thinking", "data": part.signature or part.text}
    return {"type": "thinking", "thinking": part.text, "signature": part.signature}


def _decoded(data: DataUrl) -> str | None:
    try:
        return data.data.decode("utf-8", "replace")
    except ValueError:  # malformed base64
        return None


def _file_block(part: FilePart) -> dict[str, Any]:
    data = parse_data_url(part.url)
    if part.mime.startswith("image/"):
        if data is not None:
            source: dict[str, Any] = {
                "type": "base64",
                "media_type": data.mime,
                "data": data.base64,
            }
        else:
            source = {"type": "url", "url": part.url}
        return {"type": "image", "source": source}
    if part.mime == "application/pdf":
        if data is not None:
            source = {"type": "base64", "media_type": "application/pdf", "data": data.base64}
        else:
            source = {"type": "url", "url": part.url}
    elif part.mime == "text/plain" and data is not None and (text := _decoded(data)) is not None:
        source = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        return {"type": "text", "text": file_mention(part)}
    block: dict[str, Any] = {"type": "document", "source": source}
    if part.filename:
        block["title"] = part.filename
    return block


def _user_blocks(parts: Sequence[Part], *, boundary: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in parts:
        if isinstance(part, TextPart):
            if not part.text.strip():
                continue
            if boundary:
                texts.append(part.text)
            else:
                out.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart):
            out.append(_file_block(part))
        # Reasoning and tool parts in a user message have no Messages API form.
    if texts:
        out.insert(0, {"type": "text", "text": BOUNDARY_TEXT_SEPARATOR.join(texts)})
    return out


def _assistant_blocks(parts: Sequence[Part]) -> list[dict[str, Any]]:
    thinking: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, ReasoningPart):
            if is_anthropic_reasoning(part):
                thinking.append(_reasoning_block(part))
        elif isinstance(part, TextPart):
            if part.text.strip():
                rest.append({"type": "text", "text": part.text})
        elif isinstance(part, ToolPart):
            rest.append(
                {
                    "type": "tool_use",
                    "id": part.call_id,
                    "name": part.tool,
                    "input": part.state.input,
                }
            )
        # Files in assistant content have no Messages API form.
    return [*thinking, *rest]


def _result_block(part: ToolPart, results: Mapping[str, ToolResultPart]) -> dict[str, Any]:
    outcome = tool_outcome(part, results)
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": part.call_id}
    images = [_file_block(a) for a in outcome.attachments if a.mime.startswith("image/")]
    text = outcome.output
    if outcome.is_error and not text.strip():
        text = EMPTY_ERROR_TEXT
    if images:
        block["content"] = [*([{"type": "text", "text": text}] if text.strip() else []), *images]
    elif text.strip():
        block["content"] = text
    if outcome.is_error:
        block["is_error"] = True
    return block


def _merge(turns: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for role, blocks in turns:
        if not blocks:
            continue
        if merged and merged[-1]["role"] == role:
            # A tool-results turn always directly follows its assistant turn, so in
            # a merged user turn the results are already first: only a turn made
            # from a user message (which never holds results) is appended to one.
            merged[-1]["content"] = [*merged[-1]["content"], *blocks]
        else:
            merged.append({"role": role, "content": list(blocks)})
    return merged


def _shorthand(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turns of one text block with the text as their content (the API's shorthand)."""
    for turn in turns:
        blocks = turn["content"]
        if (
            len(blocks) == 1
            and blocks[0].keys() == {"type", "text"}
            and blocks[0]["type"] == "text"
        ):
            turn["content"] = blocks[0]["text"]
    return turns


def _lead(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns with a user turn first (the API requires it; see the module docs)."""
    if turns and turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": LEADING_USER_TEXT}]})
    return turns


def to_anthropic(
    messages: Sequence[Message], *, system: AnthropicSystem | None = None
) -> tuple[AnthropicSystem | None, list[dict[str, Any]]]:
    """Internal history -> Messages API ``(system, messages)`` (see the module docs).

    Args:
        messages: The history to send, oldest first.
        system: The system prompt, returned unchanged (pass it as ``system=``).

    Returns:
        ``system`` and the ``messages`` list, valid for
        :func:`~mimo_ctx.providers.validate.validate_request` with
        ``format="anthropic"``.
    """
    return system, anthropic_turns(messages)


def anthropic_turns(
    messages: Sequence[Message], *, first: bool = True, shorthand: bool = False
) -> list[dict[str, Any]]:
    """The turns of :func:`to_anthropic` for a run of messages.

    Args:
        messages: The messages, oldest first.
        first: The run starts the request: a user turn is put first when it would
            start with an assistant turn. False for a run that continues a request
            (the wrappers build a request run by run).
        shorthand: A turn of one text block gets the text itself as its content
            (the API's shorthand; what hosts send): the same request, a third of
            the objects for the SDK to copy on every call (the wrappers).
    """
    if shorthand:
        return _shorthand(anthropic_turns(messages, first=first))
    if first:
        return _lead(anthropic_turns(messages, first=False))
    boundaries = {m.id for m in messages if m.is_boundary}
    view = apply_send_rules(messages)
    results = tool_results_by_call(view)
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for message in view:
        if message.role == "assistant":
            turns.append(("assistant", _assistant_blocks(message.parts)))
            calls = [p for p in message.parts if isinstance(p, ToolPart)]
            if calls:
                turns.append(("user", [_result_block(c, results) for c in calls]))
        elif message.role == "user":
            turns.append(("user", _user_blocks(message.parts, boundary=message.id in boundaries)))
        # role "tool": its results were sent right after their calls.
    return _merge(turns)


# --------------------------------------------------------------------------- #
# Messages -> internal
# --------------------------------------------------------------------------- #


def _blocks(content: object, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for *_, block in json_entries(content, where)]


def _text_of(content: object, where: str) -> str:
    if content is None:
        return ""
    texts = [b["text"] for b in _blocks(content, where) if isinstance(b.get("text"), str)]
    return "\n\n".join(texts)


def _file_part(block: Mapping[str, Any]) -> FilePart | None:
    source = opt_object(block.get("source"))
    if source is None:
        return None
    kind = source.get("type")
    title = block.get("title")
    filename = title if isinstance(title, str) else None
    is_image = block.get("type") == "image"
    default = "image/*" if is_image else "application/pdf"
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type")
        mime = media if isinstance(media, str) else default
        return FilePart(mime=mime, url=make_data_url(mime, source["data"]), filename=filename)
    if kind == "url" and isinstance(source.get("url"), str):
        url: str = source["url"]
        return FilePart(mime=guess_mime(url, default), url=url, filename=filename)
    if kind == "text" and isinstance(source.get("data"), str) and not is_image:
        data: str = source["data"]
        url = make_data_url("text/plain", data.encode("utf-8"))
        return FilePart(mime="text/plain", url=url, filename=filename)
    return None


def _content_part(block: Mapping[str, Any]) -> Part:
    """A user or tool result block: text, an image or document, else carried opaque."""
    kind = block.get("type")
    part: Part | None = None
    if kind == "text" and isinstance(block.get("text"), str):
        part = TextPart(text=block["text"])
    elif kind in ("image", "document"):
        part = _file_part(block)
    return (
        part
        if part is not None
        else OpaquePart(source="anthropic", kind=str(kind), data=dict(block))
    )


def _result_content(content: object, where: str) -> tuple[str, list[FilePart]]:
    return result_content(content, lambda blocks: map(_content_part, _blocks(blocks, where)))


def _assistant_part(
    block: Mapping[str, Any], draft: MessageDraft, joiner: ToolCallJoiner, where: str
) -> None:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        draft.parts.append(TextPart(text=block["text"]))
    elif kind == "thinking" and isinstance(block.get("thinking"), str):
        signature = block.get("signature")
        draft.parts.append(
            ReasoningPart(
                text=block["thinking"], signature=signature if isinstance(signature, str) else None
            )
        )
    elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
        draft.parts.append(ReasoningPart(text="", signature=block["data"], redacted=True))
    elif kind == "tool_use":
        call_id = block.get("id")
        name = block.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
            raise InvalidRequestError(f"{where} (tool_use): missing id or name")
        arguments = opt_object(block.get("input"))
        joiner.add_call(draft, call_id, name, dict(arguments) if arguments is not None else {})
    else:
        draft.parts.append(OpaquePart(source="anthropic", kind=str(kind), data=dict(block)))


def from_anthropic(
    system: AnthropicSystem | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    session_id: str,
    agent: str = MAIN_AGENT,
    time_ms: int | None = None,
) -> tuple[str | None, list[Message]]:
    """Messages API ``(system, messages)`` -> (system text, internal messages).

    Args:
        system: The ``system`` parameter (a string or text blocks, joined with a
            blank line), or None.
        messages: The ``messages`` list. ``system``-role entries (accepted by the
            2.x SDK) are added to the system text.
        session_id: Session the new messages belong to.
        agent: Agent id of the new messages.
        time_ms: Creation time of the new messages (epoch ms); now when None.

    Returns:
        The system text (None when there was none) and the messages.

    Raises:
        InvalidRequestError: A message or block is malformed; the message names
            its index.
    """
    return finished_messages(drafts_from_anthropic(system, messages), session_id, agent, time_ms)


def drafts_from_anthropic(
    system: AnthropicSystem | None, messages: Sequence[Mapping[str, Any]]
) -> tuple[str | None, list[MessageDraft]]:
    """Messages API ``(system, messages)`` -> (system text, drafts): :func:`from_anthropic`
    before the drafts become messages (a draft's ``item`` is its message's index).

    Raises:
        InvalidRequestError: A message or block is malformed.
    """
    system_texts: list[str] = []
    if system is not None:
        system_texts.append(_text_of(system, "system"))
    drafts: list[MessageDraft] = []
    joiner = ToolCallJoiner()
    for i, where, message in json_entries(messages, "messages"):
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            system_texts.append(_text_of(content, f"{where}.content"))
        elif role == "assistant":
            draft = MessageDraft("assistant", item=i)
            drafts.append(draft)
            for j, block in enumerate(_blocks(content, f"{where}.content")):
                _assistant_part(block, draft, joiner, f"{where}.content[{j}]")
        elif role == "user":
            current: MessageDraft | None = None
            for j, block in enumerate(_blocks(content, f"{where}.content")):
                current = _user_part(
                    block, joiner, drafts, current, f"{where}.content[{j}]", item=i
                )
        else:
            raise InvalidRequestError(
                f"{where}: unsupported role {role!r} (expected user, assistant or system)"
            )
    return ("\n\n".join(system_texts) if system_texts else None), drafts


def _user_part(
    block: Mapping[str, Any],
    joiner: ToolCallJoiner,
    drafts: list[MessageDraft],
    current: MessageDraft | None,
    where: str,
    *,
    item: int,
) -> MessageDraft | None:
    """Add one user block; returns the draft later non-result blocks go to."""
    kind = block.get("type")
    if kind == "tool_result":
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequestError(f"{where} (tool_result): missing tool_use_id")
        output, files = _result_content(block.get("content"), f"{where}.content")
        is_error = block.get("is_error") is True
        if joiner.join(call_id, output, is_error=is_error, attachments=files):
            return current
        result = ToolResultPart(
            call_id=call_id, tool="", output=output, is_error=is_error, attachments=files or None
        )
        if current is not None and current.role == "tool":
            current.parts.append(result)
            return current
        draft = MessageDraft("tool", [result], item=item)
        drafts.append(draft)
        return draft
    if current is None or current.role != "user":
        current = MessageDraft("user", item=item)
        drafts.append(current)
    current.parts.append(_content_part(block))
    return current
