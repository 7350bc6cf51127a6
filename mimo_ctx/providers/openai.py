"""OpenAI converters: Chat Completions messages and Responses API input items.

SDK-independent: these functions read and build the plain JSON payloads the
OpenAI API accepts (the ``openai`` SDK's ``*Param`` types are ``TypedDict`` views
of them), so they need no ``openai`` install.

Internal -> Chat Completions (:func:`to_openai_chat`). The send rules are
applied first (:func:`mimo_ctx.view.apply_send_rules`). Then:

* the ``system`` argument, when given, is the first message;
* a user message's content is a string when it is a single text, else a list of
  content parts: ``text``, ``image_url`` for images, ``file`` (``file_data``) for
  other ``data:`` files; a file Chat Completions cannot take by URL is named in a
  text part instead (wording ours);
* a rebuild boundary message (SPEC R8.1) is sent as one user message whose text
  parts are joined with a blank line;
* an assistant message becomes ``content`` (string for one text, list of
  ``text`` parts for several, ``null`` when it only calls tools) plus
  ``tool_calls`` (``id`` = call id, ``arguments`` = compact JSON of the input),
  followed by one ``tool`` message per call, in the same order, holding its
  output or error text; tool result attachments are not sent (Chat Completions
  ``tool`` messages take text only);
* reasoning is **not** sent: Chat Completions has no field for earlier
  reasoning, and reasoning text sent as content would read as the answer;
* tool results stored apart from their call (``tool`` messages) are sent right
  after the call, never where they are stored.

Chat Completions -> internal (:func:`from_openai_chat`): ``system`` and
``developer`` messages become the returned system text (joined with a blank
line, wherever they stood); ``tool`` messages are joined into the calling tool
part, else kept as ``tool`` messages with a :class:`ToolResultPart`; content
parts the model cannot hold (audio, files by id) are kept as
:class:`OpaquePart` (never sent again).

Responses API (:func:`to_openai_responses`, :func:`from_openai_responses`):
items ``message`` (``input_text`` for user and system text, ``output_text`` for
assistant text), ``function_call`` / ``function_call_output`` (every output
after all the calls of its assistant message, in call order) and ``reasoning``.
The API pairs a reasoning item with the item right after it, by that item's
``id``. So a reasoning item is sent only when it came from the Responses API
(the part's ``provider_data["openai"]`` holds the item: ``id``, ``summary``,
``encrypted_content``...) and the item it led to follows it again: that item is
sent with the id :func:`from_openai_responses` recorded for it
(``provider_data["openai_following"]``). Any other reasoning is omitted, since
the API rejects reasoning it did not issue or cannot pair. Item ids are kept
only there; assistant ``phase`` is not kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from mimo_ctx.convert import (
    BOUNDARY_TEXT_SEPARATOR,
    MessageDraft,
    ToolCallJoiner,
    decode_arguments,
    encode_arguments,
    file_data_part,
    file_mention,
    finished_messages,
    guess_mime,
    json_entries,
    json_list,
    json_object,
    opt_object,
    result_content,
    tool_outcome,
    tool_result_content,
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
    "drafts_from_openai_chat",
    "drafts_from_openai_responses",
    "from_openai_chat",
    "from_openai_responses",
    "to_openai_chat",
    "to_openai_responses",
]


_SYSTEM_ROLES: Final = frozenset({"system", "developer"})

_FOLLOWING_KEY: Final = "openai_following"
"""``ReasoningPart.provider_data`` key of the item a Responses reasoning item led to."""


# --------------------------------------------------------------------------- #
# Chat Completions: internal -> payload
# --------------------------------------------------------------------------- #


def _chat_user_parts(parts: Sequence[Part], *, boundary: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in parts:
        if isinstance(part, TextPart):
            if boundary:
                texts.append(part.text)
            else:
                out.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart):
            if part.mime.startswith("image/"):
                out.append({"type": "image_url", "image_url": {"url": part.url}})
            elif part.url.startswith("data:"):
                filename = part.filename or "file"
                out.append({"type": "file", "file": {"file_data": part.url, "filename": filename}})
            else:
                out.append({"type": "text", "text": file_mention(part)})
        # Reasoning and tool parts in a user message have no Chat Completions form.
    if texts:
        out.insert(0, {"type": "text", "text": BOUNDARY_TEXT_SEPARATOR.join(texts)})
    return out


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


def _chat_assistant(
    message: Message, results: Mapping[str, ToolResultPart]
) -> list[dict[str, Any]]:
    texts = [p.text for p in message.parts if isinstance(p, TextPart)]
    calls = [p for p in message.parts if isinstance(p, ToolPart)]
    if not texts and not calls:
        return []
    content: str | list[dict[str, Any]] | None
    if not texts:
        content = None
    elif len(texts) == 1:
        content = texts[0]
    else:
        content = [{"type": "text", "text": t} for t in texts]
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if not calls:
        return [out]
    out["tool_calls"] = [
        {
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.tool, "arguments": encode_arguments(call.state.input)},
        }
        for call in calls
    ]
    answers = [
        {
            "role": "tool",
            "tool_call_id": call.call_id,
            "content": tool_outcome(call, results).output,
        }
        for call in calls
    ]
    return [out, *answers]


def to_openai_chat(
    messages: Sequence[Message], *, system: str | None = None
) -> list[dict[str, Any]]:
    """Internal history -> Chat Completions ``messages`` (see the module docs).

    Args:
        messages: The history to send, oldest first.
        system: System prompt, sent first when not empty.

    Returns:
        The ``messages`` list, valid for :func:`~mimo_ctx.providers.validate.validate_request`
        with ``format="openai-chat"``.
    """
    head = [{"role": "system", "content": system}] if system else []
    return _converted(messages, head, _chat_assistant, _chat_user)


def _chat_user(parts: Sequence[Part], *, boundary: bool) -> dict[str, Any] | None:
    content = _chat_user_parts(parts, boundary=boundary)
    return {"role": "user", "content": _chat_content(content)} if content else None


_Assistant = Callable[[Message, Mapping[str, ToolResultPart]], list[dict[str, Any]]]


class _User(Protocol):
    def __call__(self, parts: Sequence[Part], *, boundary: bool) -> dict[str, Any] | None: ...


def _converted(
    messages: Sequence[Message], head: list[dict[str, Any]], assistant: _Assistant, user: _User
) -> list[dict[str, Any]]:
    """The send view of ``messages`` after ``head``: an assistant message as the entries
    of ``assistant`` (its calls' results right after it), a user message as the entry
    of ``user`` (None: nothing to send); ``tool`` messages add nothing of their own."""
    boundaries = {m.id for m in messages if m.is_boundary}
    view = apply_send_rules(messages)
    results = tool_results_by_call(view)
    out = head
    for message in view:
        if message.role == "assistant":
            out.extend(assistant(message, results))
        elif message.role == "user":
            entry = user(message.parts, boundary=message.id in boundaries)
            if entry is not None:
                out.append(entry)
    return out


# --------------------------------------------------------------------------- #
# Chat Completions: payload -> internal
# --------------------------------------------------------------------------- #


def _text_of(content: object, where: str) -> str:
    """Text of a string content or of the text parts of a content list (joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = [
        p["text"] for _, _, p in json_entries(content, where) if isinstance(p.get("text"), str)
    ]
    return "\n".join(texts)


def _chat_user_part(raw: object, where: str) -> Part:
    part = json_object(raw, where)
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return TextPart(text=part["text"])
    if kind == "image_url":
        image = part.get("image_url")
        image_map = opt_object(image)
        url = image_map.get("url") if image_map is not None else image
        if isinstance(url, str):
            return FilePart(mime=guess_mime(url, "image/*"), url=url)
    if kind == "file":
        file = opt_object(part.get("file"))
        if file is not None:
            data = file.get("file_data")
            name = file.get("filename")
            if isinstance(data, str) and data:
                return file_data_part(data, name if isinstance(name, str) else None)
    return OpaquePart(source="openai", kind=str(kind), data=dict(part))


def _chat_parts(content: object, where: str) -> list[Part]:
    """User (or tool) content: a string is one text, a list is read part by part."""
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(text=content)]
    return [_chat_user_part(p, f"{where}[{j}]") for j, p in enumerate(json_list(content, where))]


def from_openai_chat(
    payload_messages: Sequence[Mapping[str, Any]],
    *,
    session_id: str,
    agent: str = MAIN_AGENT,
    time_ms: int | None = None,
) -> tuple[str | None, list[Message]]:
    """Chat Completions ``messages`` -> (system text, internal messages).

    Args:
        payload_messages: The ``messages`` list of a request (dicts).
        session_id: Session the new messages belong to.
        agent: Agent id of the new messages.
        time_ms: Creation time of the new messages (epoch ms); now when None.

    Returns:
        The system / developer text (None when there was none) and the messages.

    Raises:
        InvalidRequestError: A message is malformed; the message names its index.
    """
    return finished_messages(drafts_from_openai_chat(payload_messages), session_id, agent, time_ms)


def drafts_from_openai_chat(
    payload_messages: Sequence[Mapping[str, Any]],
) -> tuple[str | None, list[MessageDraft]]:
    """Chat Completions ``messages`` -> (system text, drafts): :func:`from_openai_chat`
    before the drafts become messages (a draft's ``item`` is its message's index).

    Raises:
        InvalidRequestError: A message is malformed; the message names its index.
    """
    system: list[str] = []
    drafts: list[MessageDraft] = []
    joiner = ToolCallJoiner()
    for i, where, message in json_entries(payload_messages, "messages"):
        role = message.get("role")
        content = message.get("content")
        if role in _SYSTEM_ROLES:
            system.append(_text_of(content, f"{where}.content"))
        elif role == "user":
            drafts.append(MessageDraft("user", _chat_parts(content, f"{where}.content"), item=i))
        elif role == "assistant":
            draft = MessageDraft("assistant", item=i)
            drafts.append(draft)
            if isinstance(content, str):
                draft.parts.append(TextPart(text=content))
            elif content is not None:
                for _, _, part in json_entries(content, f"{where}.content"):
                    text = part.get("text", part.get("refusal"))
                    if isinstance(text, str):
                        draft.parts.append(TextPart(text=text))
            refusal = message.get("refusal")
            if isinstance(refusal, str) and refusal:
                draft.parts.append(TextPart(text=refusal))
            for j, raw_call in enumerate(
                json_list(message.get("tool_calls") or [], f"{where}.tool_calls")
            ):
                _chat_call(joiner, draft, raw_call, f"{where}.tool_calls[{j}]")
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequestError(f"{where} (tool): missing tool_call_id")
            output, files = tool_result_content(_chat_parts(content, f"{where}.content"))
            if not joiner.join(call_id, output, attachments=files):
                result = ToolResultPart(
                    call_id=call_id, tool="", output=output, attachments=files or None
                )
                drafts.append(MessageDraft("tool", [result], item=i))
        else:
            raise InvalidRequestError(
                f"{where}: unsupported role {role!r} (expected system, developer, user, "
                "assistant or tool)"
            )
    return ("\n\n".join(system) if system else None), drafts


def _chat_call(joiner: ToolCallJoiner, draft: MessageDraft, raw: object, where: str) -> None:
    call = json_object(raw, where)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequestError(f"{where}: tool call without an id")
    function = opt_object(call.get("function"))
    custom = opt_object(call.get("custom"))
    if function is not None:
        name = function.get("name")
        arguments = function.get("arguments")
    elif custom is not None:
        # Custom (free-form) tool calls are read as function calls with raw input.
        name = custom.get("name")
        arguments = custom.get("input")
    else:
        raise InvalidRequestError(f"{where} ({call_id}): tool call without a function")
    if not isinstance(name, str):
        raise InvalidRequestError(f"{where} ({call_id}): tool call without a function name")
    joiner.add_call(draft, call_id, name, decode_arguments(arguments))


# --------------------------------------------------------------------------- #
# Responses API: internal -> input items
# --------------------------------------------------------------------------- #


def _responses_user_content(parts: Sequence[Part], *, boundary: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in _chat_user_parts(parts, boundary=boundary):
        kind = part["type"]
        if kind == "text":
            out.append({"type": "input_text", "text": part["text"]})
        elif kind == "image_url":
            out.append(
                {"type": "input_image", "image_url": part["image_url"]["url"], "detail": "auto"}
            )
        else:  # file
            file: dict[str, Any] = part["file"]
            out.append(
                {"type": "input_file", "file_data": file["file_data"], "filename": file["filename"]}
            )
    return out


def _reasoning_item(part: ReasoningPart) -> tuple[dict[str, Any], Mapping[str, Any]] | None:
    """The Responses reasoning item of a part and the item that must follow it, if known."""
    data = opt_object((part.provider_data or {}).get("openai"))
    following = opt_object((part.provider_data or {}).get(_FOLLOWING_KEY))
    if data is None or following is None or not isinstance(data.get("id"), str):
        return None
    item: dict[str, Any] = {**data, "type": "reasoning"}
    item.setdefault("summary", [])
    return item, following


def _pair_reasoning(items: list[dict[str, Any]], following: dict[int, Mapping[str, Any]]) -> None:
    """Keep a reasoning item only when the item it led to comes right after it.

    The API pairs a reasoning item with the next item by that item's id, so the
    id recorded by :func:`from_openai_responses` is put back on it; a reasoning
    item whose following item is gone (or differs) is dropped, as the API would
    reject it.
    """
    keep: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if item["type"] != "reasoning":
            keep.append(item)
            continue
        expected = following[index]
        after = items[index + 1] if index + 1 < len(items) else None
        if after is None or after["type"] != expected.get("type"):
            continue
        if after["type"] == "function_call" and after["call_id"] != expected.get("call_id"):
            continue
        after["id"] = expected["id"]
        if after["type"] == "message":
            after["status"] = "completed"
        keep.append(item)
    items[:] = keep


def _output_items(
    outcome_output: str, attachments: Sequence[FilePart]
) -> str | list[dict[str, Any]]:
    images = [a for a in attachments if a.mime.startswith("image/")]
    if not images:
        return outcome_output
    return [
        {"type": "input_text", "text": outcome_output},
        *({"type": "input_image", "image_url": a.url, "detail": "auto"} for a in images),
    ]


def _responses_assistant(
    message: Message, results: Mapping[str, ToolResultPart]
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    following: dict[int, Mapping[str, Any]] = {}  # reasoning item index -> its next item
    calls: list[ToolPart] = []
    text_item: dict[str, Any] | None = None
    for part in message.parts:
        if isinstance(part, TextPart):
            if text_item is None:
                text_item = {"type": "message", "role": "assistant", "content": []}
                items.append(text_item)
            text_item["content"].append(
                {"type": "output_text", "text": part.text, "annotations": []}
            )
            continue
        text_item = None
        if isinstance(part, ReasoningPart):
            found = _reasoning_item(part)
            if found is not None:
                following[len(items)] = found[1]
                items.append(found[0])
        elif isinstance(part, ToolPart):
            calls.append(part)
            items.append(
                {
                    "type": "function_call",
                    "call_id": part.call_id,
                    "name": part.tool,
                    "arguments": encode_arguments(part.state.input),
                }
            )
    _pair_reasoning(items, following)
    for call in calls:
        outcome = tool_outcome(call, results)
        items.append(
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": _output_items(outcome.output, outcome.attachments),
            }
        )
    return items


def _responses_shorthand(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Message items of one plain text with the text as their content (the API's
    shorthand, what hosts send): the same request, far less for the SDK to walk."""
    for index, item in enumerate(items):
        if item.get("type") != "message" or len(item["content"]) != 1:
            continue
        part = item["content"][0]
        role = item["role"]
        if role == "user" and part.keys() == {"type", "text"} and part["type"] == "input_text":
            items[index] = {"role": "user", "content": part["text"]}
        elif (
            role == "assistant"
            and part.keys() == {"type", "text", "annotations"}
            and part["type"] == "output_text"
            and not part["annotations"]
        ):
            items[index] = {"role": "assistant", "content": part["text"]}
    return items


def to_openai_responses(
    messages: Sequence[Message], *, system: str | None = None, shorthand: bool = False
) -> list[dict[str, Any]]:
    """Internal history -> Responses API ``input`` items (see the module docs).

    Args:
        messages: The history to send, oldest first.
        system: System prompt, sent first as a ``system`` message item when not
            empty (or pass it as ``instructions=`` and leave this None).
        shorthand: A user or assistant message of one plain text is sent as
            ``{"role": ..., "content": "<text>"}`` (the API's shorthand; what hosts
            send): the same request, with far less for the OpenAI SDK's request
            building to walk.

    Returns:
        The ``input`` list, valid for :func:`~mimo_ctx.providers.validate.validate_request`
        with ``format="openai-responses"``.
    """
    head = (
        [{"type": "message", "role": "system", "content": [{"type": "input_text", "text": system}]}]
        if system
        else []
    )
    out = _converted(messages, head, _responses_assistant, _responses_user)
    return _responses_shorthand(out) if shorthand else out


def _responses_user(parts: Sequence[Part], *, boundary: bool) -> dict[str, Any] | None:
    content = _responses_user_content(parts, boundary=boundary)
    return {"type": "message", "role": "user", "content": content} if content else None


# --------------------------------------------------------------------------- #
# Responses API: input items -> internal
# --------------------------------------------------------------------------- #


def _responses_content_part(raw: object, where: str) -> Part:
    part = json_object(raw, where)
    kind = part.get("type")
    text = part.get("text")
    if kind in ("input_text", "output_text", "text") and isinstance(text, str):
        return TextPart(text=text)
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return TextPart(text=part["refusal"])
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        url: str = part["image_url"]
        return FilePart(mime=guess_mime(url, "image/*"), url=url)
    if kind == "input_file":
        name = part.get("filename")
        filename = name if isinstance(name, str) else None
        data = part.get("file_data")
        file_url = part.get("file_url")
        if isinstance(data, str) and data:
            return file_data_part(data, filename)
        if isinstance(file_url, str) and file_url:
            return FilePart(
                mime=guess_mime(file_url, "application/octet-stream"),
                url=file_url,
                filename=filename,
            )
    return OpaquePart(source="openai-responses", kind=str(kind), data=dict(part))


def _responses_output(output: object, where: str) -> tuple[str, list[FilePart]]:
    return result_content(output, lambda items: _responses_parts(items, where))


def _responses_parts(content: object, where: str) -> list[Part]:
    return [
        _responses_content_part(p, f"{where}[{j}]") for j, p in enumerate(json_list(content, where))
    ]


def _reasoning_text(item: Mapping[str, Any]) -> str:
    texts: list[str] = []
    for key in ("summary", "content"):
        value = item.get(key)
        if isinstance(value, list):
            entries: list[Any] = value  # pyright: ignore[reportUnknownVariableType]
            for entry in entries:
                entry_map = opt_object(entry)
                if entry_map is not None and isinstance(entry_map.get("text"), str):
                    texts.append(entry_map["text"])
        if texts:
            break
    return "\n\n".join(texts)


def _record_following(reasoning: ReasoningPart, kind: object, item: Mapping[str, Any]) -> None:
    """Remember the id of the item a reasoning item led to (the API pairs them by it)."""
    item_id = item.get("id")
    if not isinstance(item_id, str) or reasoning.provider_data is None:
        return
    if kind == "function_call":
        following = {"type": "function_call", "id": item_id, "call_id": item.get("call_id")}
    elif kind == "message" and item.get("role") == "assistant":
        following = {"type": "message", "id": item_id}
    else:
        return
    # The part is still being built here, so setting its data in place is safe.
    reasoning.provider_data[_FOLLOWING_KEY] = following


def from_openai_responses(
    items: str | Sequence[Mapping[str, Any]],
    *,
    session_id: str,
    agent: str = MAIN_AGENT,
    time_ms: int | None = None,
) -> tuple[str | None, list[Message]]:
    """Responses API ``input`` -> (system text, internal messages).

    Consecutive assistant-side items (reasoning, assistant messages, function
    calls) form one assistant message, up to the next user message or function
    call output. Outputs are joined into their calls; an output for no earlier
    call is kept as a ``tool`` message. Item types without an internal form are
    kept as :class:`OpaquePart` of the assistant message (never sent again).

    Args:
        items: The ``input`` (a string is one user message).
        session_id: Session the new messages belong to.
        agent: Agent id of the new messages.
        time_ms: Creation time of the new messages (epoch ms); now when None.

    Returns:
        The system / developer text (None when there was none) and the messages.

    Raises:
        InvalidRequestError: An item is malformed; the message names its index.
    """
    return finished_messages(drafts_from_openai_responses(items), session_id, agent, time_ms)


def drafts_from_openai_responses(
    items: str | Sequence[Mapping[str, Any]],
) -> tuple[str | None, list[MessageDraft]]:
    """Responses API ``input`` -> (system text, drafts): :func:`from_openai_responses`
    before the drafts become messages (a draft's ``item`` is its first item's index).

    Raises:
        InvalidRequestError: An item is malformed; the message names its index.
    """
    if isinstance(items, str):
        return None, [MessageDraft("user", [TextPart(text=items)])]
    system: list[str] = []
    drafts: list[MessageDraft] = []
    joiner = ToolCallJoiner()
    current: MessageDraft | None = None

    position = 0

    def assistant() -> MessageDraft:
        nonlocal current
        if current is None:
            current = MessageDraft("assistant", item=position)
            drafts.append(current)
        return current

    awaiting: ReasoningPart | None = None  # the reasoning item just read
    for i, where, item in json_entries(items, "input"):
        position = i
        kind = item.get("type") or ("message" if "role" in item else None)
        if awaiting is not None:
            _record_following(awaiting, kind, item)
            awaiting = None
        if kind == "message":
            role = item.get("role")
            content = item.get("content")
            if role in _SYSTEM_ROLES:
                system.append(_text_of(content, f"{where}.content"))
                current = None
                continue
            if role == "assistant":
                draft = assistant()
            elif role == "user":
                current = None
                draft = MessageDraft("user", item=i)
                drafts.append(draft)
            else:
                raise InvalidRequestError(f"{where}: unsupported message role {role!r}")
            if isinstance(content, str):
                draft.parts.append(TextPart(text=content))
            else:
                draft.parts.extend(_responses_parts(content, f"{where}.content"))
        elif kind == "reasoning":
            # None values (``content: null`` of a dumped SDK object) are not sent back.
            stored = {k: v for k, v in item.items() if v is not None}
            reasoning = ReasoningPart(text=_reasoning_text(item), provider_data={"openai": stored})
            assistant().parts.append(reasoning)
            awaiting = reasoning
            continue
        elif kind == "function_call":
            call_id = item.get("call_id")
            name = item.get("name")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
                raise InvalidRequestError(f"{where} (function_call): missing call_id or name")
            joiner.add_call(assistant(), call_id, name, decode_arguments(item.get("arguments")))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequestError(f"{where} (function_call_output): missing call_id")
            current = None
            output, files = _responses_output(item.get("output"), f"{where}.output")
            if not joiner.join(call_id, output, attachments=files):
                result = ToolResultPart(
                    call_id=call_id, tool="", output=output, attachments=files or None
                )
                drafts.append(MessageDraft("tool", [result], item=i))
        else:
            assistant().parts.append(
                OpaquePart(source="openai-responses", kind=str(kind), data=dict(item))
            )
    return ("\n\n".join(system) if system else None), drafts
