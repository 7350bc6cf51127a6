"""Import OpenAI-style chat transcripts.

Accepted shapes (``openai-chat``):

* a JSON array of Chat Completions messages (``{"role", "content", ...}``);
* a JSON object with ``messages`` (a request body or a saved conversation);
  its ``tools`` become the session's frozen tool list;
* JSONL with one message per line.

and (``openai-responses``) a JSON array of Responses API items, or an object
with ``input``: ``message`` items (or role-only ``EasyInputMessage`` objects),
``function_call``, ``function_call_output`` and ``reasoning`` items.

Decisions (our choices):

* ``system``/``developer`` messages that come before the conversation are the
  session's frozen prefix (``Session.prefix.system``, joined by blank lines),
  which is where the library keeps the system prompt (SPEC R8.1). One that comes
  later is kept in place as a user message with synthetic text, metadata
  ``{"role": "system"}``, so its position is not lost.
* An assistant ``tool_calls`` entry and the later ``tool`` message with the same
  ``tool_call_id`` are joined into one ``ToolPart`` (``completed``; the chat
  format has no error flag). A call never answered stays ``running`` (reads as
  interrupted). A ``tool`` message whose call is unknown becomes a ``tool``
  message with a ``ToolResultPart``. Legacy ``function_call`` / ``function``
  messages are paired by name.
* ``arguments`` that are not a JSON object (models do emit broken JSON) are kept
  as ``{"__raw_arguments__": "<raw>"}`` instead of failing the import (the
  converter kit's rule, :func:`mimo_ctx.convert.decode_arguments`).
* The content of a ``tool`` message or function call output follows the kit's
  rule for tool results (:func:`mimo_ctx.convert.tool_result_content`): text
  parts are the output, images and files its attachments, any other part one
  line of JSON.
* User text is what a person typed, except the blocks agent frameworks put into
  user turns (``<environment_context>``, ``<user_instructions>``,
  ``<system-reminder>``) and terminal escape sequences: those are split out into
  a ``synthetic`` part, with the original kept as an ``ignored`` part
  (:mod:`._machine_text`).
* ``reasoning_content`` / ``reasoning`` strings on assistant messages become
  ``ReasoningPart``; ``image_url`` content parts become ``FilePart``; content part
  types we do not know become ``OpaquePart(source="openai")``.
* There are no timestamps: message *k* gets ``base + k`` ms, ``base`` being the
  file's modification time unless ``base_time_ms`` is given.
* ``finish_reason`` is used when present (``tool_calls`` -> ``tool-calls``,
  ``content_filter`` -> ``content-filter``); otherwise it is inferred like for
  the other importers (``tool-calls`` when the message made calls, else
  ``stop``). A ``usage`` object on an assistant message becomes its usage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from mimo_ctx.convert import (
    MessageDraft,
    ToolCallJoiner,
    decode_arguments,
    guess_mime,
    infer_finish,
    tool_result_content,
)
from mimo_ctx.errors import TranscriptError
from mimo_ctx.importers._common import (
    FORMAT_OPENAI_CHAT,
    FORMAT_OPENAI_RESPONSES,
    BadRecord,
    ImportedTranscript,
    Problems,
    as_list,
    as_object,
    build_transcript_messages,
    first_line,
    is_object,
    iter_jsonl_objects,
    locate_array_items,
    new_session,
    opt_int,
    opt_str,
    orphan_result_draft,
    req_str,
)
from mimo_ctx.importers._machine_text import split_machine_text, user_text_parts
from mimo_ctx.messages import (
    MAIN_AGENT,
    FilePart,
    OpaquePart,
    Part,
    ReasoningPart,
    TextPart,
    TokenUsage,
)
from mimo_ctx.typed_input import CHAT_MACHINE_TAGS

__all__ = [
    "ChatConverter",
    "ParsedMessage",
    "chat_items",
    "convert_items",
    "finish_import",
    "import_openai_chat",
    "import_openai_responses",
]

_FINISH: Final = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "length",
    "content_filter": "content-filter",
}

RESPONSES_ITEM_TYPES: Final = frozenset(
    {"message", "function_call", "function_call_output", "reasoning"}
)


def _text_of(content: object, what: str) -> str:
    """Text of a system message's content (text parts, one per line)."""
    return _result_of(content, what)[0]


def _result_of(content: object, what: str) -> tuple[str, list[FilePart]]:
    """A tool or function result's content: output text and attachments (the kit's rule)."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    parts: list[Part] = []
    for i, raw in enumerate(as_list(content, what)):
        item = as_object(raw, f"{what}[{i}]")
        if "type" not in item and isinstance(item.get("text"), str):
            item = {**item, "type": "text"}
        parts.extend(_content_parts([item], what))
    return tool_result_content(parts)


def _content_parts(content: object, what: str) -> list[Part]:
    """User or assistant content (a string or a list of content parts) as parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(text=content)] if content else []
    parts: list[Part] = []
    for i, raw in enumerate(as_list(content, what)):
        where = f"{what}[{i}]"
        item = as_object(raw, where)
        kind = req_str(item, "type", where)
        if kind in ("text", "input_text", "output_text"):
            parts.append(TextPart(text=req_str(item, "text", where)))
        elif kind == "refusal":
            parts.append(TextPart(text=req_str(item, "refusal", where)))
        elif kind in ("image_url", "input_image"):
            ref = item.get("image_url")
            if is_object(ref):
                url = req_str(as_object(ref, f"{where}.image_url"), "url", f"{where}.image_url")
            elif isinstance(ref, str):
                url = ref
            else:
                raise BadRecord(f"{where}.image_url must be an object or a string")
            parts.append(FilePart(mime=guess_mime(url, "image/*"), url=url))
        else:
            parts.append(OpaquePart(source="openai", kind=kind, data=item))
    return parts


def _user_parts(parts: list[Part]) -> list[Part]:
    """User content with machine blocks split out of the typed text (:mod:`._machine_text`)."""
    out: list[Part] = []
    for part in parts:
        if isinstance(part, TextPart):
            typed, machine = split_machine_text(part.text, CHAT_MACHINE_TAGS)
            if not machine and typed == part.text.strip():
                out.append(part)
            else:
                out.extend(user_text_parts(part.text, typed, machine))
        else:
            out.append(part)
    return out


def _arguments(raw: object, what: str) -> dict[str, Any]:
    """Tool call ``arguments`` (JSON text, or an object) as the call's input."""
    if raw is None or isinstance(raw, str) or is_object(raw):
        return decode_arguments(raw)
    raise BadRecord(f"{what}.arguments must be a string, got {type(raw).__name__}")


def _usage(value: object, what: str) -> TokenUsage | None:
    if value is None:
        return None
    usage = as_object(value, what)
    prompt = opt_int(usage, "prompt_tokens", what)
    if prompt is None:
        prompt = opt_int(usage, "input_tokens", what) or 0
    completion = opt_int(usage, "completion_tokens", what)
    if completion is None:
        completion = opt_int(usage, "output_tokens", what) or 0
    cached = 0
    for key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(key)
        if is_object(details):
            cached = opt_int(as_object(details, key), "cached_tokens", key) or 0
    # OpenAI's prompt count includes cached tokens; ours keeps them apart.
    return TokenUsage(
        input=max(0, prompt - cached),
        output=completion,
        cache_read=cached,
        total=opt_int(usage, "total_tokens", what),
    )


@dataclass(frozen=True)
class ParsedCall:
    """A validated tool call: its id, tool name and input."""

    call_id: str
    tool: str
    input: dict[str, Any]


@dataclass
class ParsedMessage:
    """One validated message, applied to the conversation only when it is whole."""

    kind: str  # "system", "user", "assistant", "tool", "function"
    parts: list[Part] = field(default_factory=list["Part"])
    calls: list[ParsedCall] = field(default_factory=list[ParsedCall])
    call_ids: list[str] = field(default_factory=list[str])
    name: str | None = None
    output: str = ""
    attachments: list[FilePart] = field(default_factory=list[FilePart])
    finish: str | None = None
    usage: TokenUsage | None = None
    model: str | None = None
    agent: str = MAIN_AGENT
    synthetic: bool = False
    metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    merge: bool = False  # Responses: continue the current assistant message


class ChatConverter:
    """Builds drafts from chat messages in order; shared with the SWE-agent importer."""

    def __init__(self, base_time: int) -> None:
        self.base_time = base_time
        self.drafts: list[MessageDraft] = []
        self.system: list[str] = []
        self._joiner = ToolCallJoiner()
        self._called: set[str] = set()
        self._started = False
        self._open_assistant: MessageDraft | None = None

    def _time(self) -> int:
        return self.base_time + len(self.drafts)

    def parse_chat(
        self, raw: object, what: str, *, agent_of: Callable[[dict[str, Any]], str] | None = None
    ) -> ParsedMessage:
        """Validate one Chat Completions message (no state is changed)."""
        msg = as_object(raw, what)
        role = req_str(msg, "role", what)
        content = msg.get("content")
        agent = agent_of(msg) if agent_of is not None else MAIN_AGENT
        if role in ("system", "developer"):
            return ParsedMessage("system", output=_text_of(content, f"{what}.content"), agent=agent)
        if role == "user":
            return ParsedMessage(
                "user", parts=_user_parts(_content_parts(content, f"{what}.content")), agent=agent
            )
        if role == "assistant":
            return self._parse_assistant(msg, what, agent)
        if role == "tool":
            ids: list[str] = []
            if "tool_call_id" in msg:
                ids.append(req_str(msg, "tool_call_id", what))
            elif "tool_call_ids" in msg:
                for i, raw_id in enumerate(as_list(msg["tool_call_ids"], f"{what}.tool_call_ids")):
                    if not isinstance(raw_id, str):
                        raise BadRecord(f"{what}.tool_call_ids[{i}] must be a string")
                    ids.append(raw_id)
            else:
                raise BadRecord(f"{what} (role tool) has no 'tool_call_id'")
            output, files = _result_of(content, f"{what}.content")
            return ParsedMessage(
                "tool", call_ids=ids, output=output, attachments=files, agent=agent
            )
        if role == "function":
            output, files = _result_of(content, f"{what}.content")
            return ParsedMessage(
                "function",
                name=req_str(msg, "name", what),
                output=output,
                attachments=files,
                agent=agent,
            )
        raise BadRecord(f"{what}.role {role!r} is not system, developer, user, assistant or tool")

    def _parse_assistant(self, msg: dict[str, Any], what: str, agent: str) -> ParsedMessage:
        parts: list[Part] = []
        for key in ("reasoning_content", "reasoning"):
            # Some servers put an object under "reasoning"; only text is reasoning text.
            reasoning = msg.get(key)
            if isinstance(reasoning, str) and reasoning:
                parts.append(ReasoningPart(text=reasoning))
                break
        parts.extend(_content_parts(msg.get("content"), f"{what}.content"))
        calls: list[ParsedCall] = []
        raw_calls = msg.get("tool_calls")
        if raw_calls is not None:
            for i, raw in enumerate(as_list(raw_calls, f"{what}.tool_calls")):
                where = f"{what}.tool_calls[{i}]"
                call = as_object(raw, where)
                fn = as_object(call.get("function"), f"{where}.function")
                calls.append(
                    ParsedCall(
                        call_id=req_str(call, "id", where),
                        tool=req_str(fn, "name", f"{where}.function"),
                        input=_arguments(fn.get("arguments"), f"{where}.function"),
                    )
                )
        legacy = msg.get("function_call")
        if legacy is not None:
            fn = as_object(legacy, f"{what}.function_call")
            calls.append(
                ParsedCall(
                    call_id=f"call_{what}",
                    tool=req_str(fn, "name", f"{what}.function_call"),
                    input=_arguments(fn.get("arguments"), f"{what}.function_call"),
                )
            )
        reason = opt_str(msg, "finish_reason", what)
        return ParsedMessage(
            "assistant",
            parts=parts,
            calls=calls,
            finish=_FINISH.get(reason, reason) if reason else None,
            usage=_usage(msg.get("usage"), f"{what}.usage"),
            model=opt_str(msg, "model", what),
            agent=agent,
        )

    def parse_responses_item(self, raw: object, what: str) -> ParsedMessage:
        """Validate one Responses API input/output item (no state is changed)."""
        item = as_object(raw, what)
        kind = opt_str(item, "type", what)
        if kind is None or kind == "message":
            role = req_str(item, "role", what)
            if role == "assistant":
                parts = _content_parts(item.get("content"), f"{what}.content")
                return ParsedMessage("assistant", parts=parts, merge=True)
            return self.parse_chat({"role": role, "content": item.get("content")}, what)
        if kind == "function_call":
            call = ParsedCall(
                call_id=req_str(item, "call_id", what),
                tool=req_str(item, "name", what),
                input=_arguments(item.get("arguments"), what),
            )
            return ParsedMessage("assistant", calls=[call], merge=True)
        if kind == "function_call_output":
            output, files = _result_of(item.get("output"), f"{what}.output")
            return ParsedMessage(
                "tool",
                call_ids=[req_str(item, "call_id", what)],
                output=output,
                attachments=files,
            )
        if kind == "reasoning":
            texts: list[str] = []
            summary = item.get("summary")
            if summary is not None:
                for i, raw_s in enumerate(as_list(summary, f"{what}.summary")):
                    entry = as_object(raw_s, f"{what}.summary[{i}]")
                    texts.append(req_str(entry, "text", f"{what}.summary[{i}]"))
            part = ReasoningPart(
                text="\n".join(texts), signature=opt_str(item, "encrypted_content", what)
            )
            return ParsedMessage("assistant", parts=[part], merge=True)
        part = OpaquePart(source="openai", kind=kind, data=item)
        return ParsedMessage("assistant", parts=[part], merge=True)

    def apply(self, parsed: ParsedMessage) -> None:
        """Add one validated message to the conversation."""
        at = self._time()
        if parsed.kind == "system":
            if not self._started:
                self.system.append(parsed.output)
                return
            text = TextPart(text=parsed.output, synthetic=True)
            self._push(MessageDraft(role="user", time=at, agent=parsed.agent, parts=[text]))
            self.drafts[-1].metadata["role"] = "system"
            return
        self._started = True
        if parsed.kind == "user":
            parts = parsed.parts
            if parsed.synthetic:
                parts = [
                    p.model_copy(update={"synthetic": True}) if isinstance(p, TextPart) else p
                    for p in parts
                ]
            draft = MessageDraft(
                role="user", time=at, agent=parsed.agent, parts=parts, metadata=parsed.metadata
            )
            self._push(draft)
            return
        if parsed.kind == "assistant":
            self._assistant(parsed, at)
            return
        if parsed.kind == "function":
            name = parsed.name or ""
            targets = [self._joiner.latest_open(name) or f"function:{name}"]
        else:
            targets = parsed.call_ids
        for call_id in targets:
            joined = self._joiner.join(
                call_id, parsed.output, attachments=parsed.attachments, end=at
            )
            if not joined:
                why = "duplicate result" if call_id in self._called else "no such tool call"
                orphan = orphan_result_draft(
                    call_id,
                    parsed.output,
                    attachments=parsed.attachments,
                    end=at,
                    agent=parsed.agent,
                    why=why,
                )
                self._push(orphan)
        # A result closes the assistant turn (Responses items merge until then).
        self._open_assistant = None

    def _assistant(self, parsed: ParsedMessage, at: int) -> None:
        draft = self._open_assistant if parsed.merge else None
        if draft is None or not self.drafts or self.drafts[-1] is not draft:
            draft = MessageDraft(role="assistant", time=at, agent=parsed.agent)
            self._push(draft)
        if parsed.merge:
            self._open_assistant = draft
        draft.parts.extend(parsed.parts)
        for call in parsed.calls:
            self._joiner.add_call(draft, call.call_id, call.tool, call.input, start=draft.time)
            self._called.add(call.call_id)
        draft.time_completed = at
        draft.finish = parsed.finish or draft.finish
        draft.usage = parsed.usage or draft.usage
        draft.model = parsed.model or draft.model
        draft.metadata.update(parsed.metadata)

    def _push(self, draft: MessageDraft) -> None:
        self.drafts.append(draft)
        if draft.role != "assistant":
            self._open_assistant = None

    def finish(self) -> list[MessageDraft]:
        """Infer missing finish reasons and return the drafts."""
        last_of: dict[str | None, int] = {}
        for i, d in enumerate(self.drafts):
            last_of[d.agent] = i
        for i, d in enumerate(self.drafts):
            if d.role == "assistant" and d.finish is None:
                d.finish = infer_finish(d, followed=i < last_of[d.agent])
        return self.drafts


def chat_items(
    path: Path,
    data: bytes,
    document: object | None,
    text: str | None,
    *,
    key: str | None,
    problems: Problems,
) -> tuple[list[Any], list[int | None]]:
    """The items of a chat transcript and the line each starts on.

    ``document`` is the parsed JSON document (``None`` for JSONL, read from
    ``data``); ``key`` names the array inside a top-level object.
    """
    if document is None:
        rows = list(iter_jsonl_objects(path, data, problems))
        return [obj for _, obj in rows], [n for n, _ in rows]
    items = document if key is None else as_object(document, "the document").get(key)
    values = as_list(items, "the document" if key is None else repr(key))
    located = locate_array_items(text, key) if text is not None else None
    if located is None or len(located) != len(values):
        return values, [None] * len(values)
    return values, list[int | None](located)


def convert_items(
    path: Path,
    data: bytes,
    document: object | None,
    text: str | None,
    *,
    key: str | None,
    problems: Problems,
    base_time: int,
    label: str,
    parse: Callable[[ChatConverter, object, str], ParsedMessage],
) -> ChatConverter:
    """Read the items (see :func:`chat_items`), then validate and apply each in order.

    A document without the array fails whole (:class:`TranscriptError` on line 1);
    malformed items go to ``problems``. ``parse`` validates one item without
    changing state, so a malformed item is skipped whole (lenient mode) rather
    than half applied.
    """
    try:
        items, lines = chat_items(path, data, document, text, key=key, problems=problems)
    except BadRecord as exc:
        raise TranscriptError(exc.reason, path=str(path), line=1) from None
    conv = ChatConverter(base_time)
    for i, raw in enumerate(items):
        what = f"{label}[{i}]"
        try:
            parsed = parse(conv, raw, what)
        except BadRecord as exc:
            problems.report(path, lines[i], exc.reason)
            continue
        conv.apply(parsed)
    return conv


def finish_import(
    path: Path,
    conv: ChatConverter,
    problems: Problems,
    *,
    fmt: str,
    session_id: str | None,
    base_time: int,
    title: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> ImportedTranscript:
    """Build the session and messages from a filled converter.

    The title defaults to the first line of the first user text.
    """
    drafts = conv.finish()
    if title is None:
        title = ""
        for d in drafts:
            text = next(
                (p.text for p in d.parts if isinstance(p, TextPart) and d.role == "user"), ""
            )
            if text.strip():
                title = first_line(text)
                break
    session = new_session(
        session_id=session_id,
        time_created=base_time,
        title=title,
        fmt=fmt,
        source=path,
        metadata=metadata,
        system="\n\n".join(conv.system) if conv.system else None,
        tools=tools,
    )
    return ImportedTranscript(
        session=session,
        messages=build_transcript_messages(drafts, session.id),
        format=fmt,
        source=path,
        sources=[path],
        skipped=problems.skipped,
    )


def _head(
    path: Path, document: object | None
) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
    """The ``tools`` of a ``{...}`` document and the document itself (none for JSONL or an
    array); malformed tools fail the file (:class:`TranscriptError` on line 1)."""
    if not is_object(document):
        return None, {}
    try:
        value = document.get("tools")
        if value is None:
            return None, document
        tools = [as_object(t, f"tools[{i}]") for i, t in enumerate(as_list(value, "tools"))]
    except BadRecord as exc:
        raise TranscriptError(exc.reason, path=str(path), line=1) from None
    return tools, document


def import_openai_chat(
    path: Path,
    data: bytes,
    document: object | None,
    text: str | None,
    *,
    strict: bool,
    session_id: str | None,
    base_time: int,
) -> ImportedTranscript:
    """Import Chat Completions messages (array, ``{"messages": [...]}`` or JSONL).

    Args:
        path: The file.
        data: Its bytes.
        document: The parsed JSON document, or ``None`` for JSONL.
        text: The document's text (used to name lines in errors).
        strict: Raise on the first malformed message instead of skipping it.
        session_id: Id for the new session (default: a new ascending id).
        base_time: Time of the first message in epoch ms.
    """
    problems = Problems(strict=strict)
    tools, head = _head(path, document)
    model = head.get("model")
    metadata: dict[str, Any] = {"model": model} if isinstance(model, str) else {}
    conv = convert_items(
        path,
        data,
        document,
        text,
        key="messages" if is_object(document) else None,
        problems=problems,
        base_time=base_time,
        label="messages",
        parse=lambda c, raw, what: c.parse_chat(raw, what),
    )
    return finish_import(
        path,
        conv,
        problems,
        fmt=FORMAT_OPENAI_CHAT,
        session_id=session_id,
        base_time=base_time,
        tools=tools,
        metadata=metadata,
    )


def import_openai_responses(
    path: Path,
    data: bytes,
    document: object | None,
    text: str | None,
    *,
    strict: bool,
    session_id: str | None,
    base_time: int,
) -> ImportedTranscript:
    """Import Responses API items (array, ``{"input": [...]}`` or JSONL).

    Consecutive output items (reasoning, assistant message, function calls)
    form one assistant message; a user message or a function call output ends it.
    """
    problems = Problems(strict=strict)
    tools, head = _head(path, document)
    instructions = head.get("instructions")
    conv = convert_items(
        path,
        data,
        document,
        text,
        key="input" if is_object(document) else None,
        problems=problems,
        base_time=base_time,
        label="input" if is_object(document) else "items",
        parse=lambda c, raw, what: c.parse_responses_item(raw, what),
    )
    if isinstance(instructions, str) and instructions:
        conv.system.insert(0, instructions)
    return finish_import(
        path,
        conv,
        problems,
        fmt=FORMAT_OPENAI_RESPONSES,
        session_id=session_id,
        base_time=base_time,
        tools=tools,
    )
