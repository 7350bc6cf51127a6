"""The converter kit: what every converter of host messages into stored ones shares.

Three kinds of converters read messages that were not made by mimo_ctx: the
provider converters (:mod:`mimo_ctx.providers.openai`,
:mod:`mimo_ctx.providers.anthropic`), the framework integrations
(:mod:`mimo_ctx.integrations`) and the transcript importers
(:mod:`mimo_ctx.importers`). They all build :class:`MessageDraft` s, join tool
results into the calls they answer with a :class:`ToolCallJoiner`, and turn the
drafts into messages with :func:`build_messages`, so one host message reads the
same whichever way it arrives. Pure and synchronous; no SDK is imported.

The rules every converter follows:

* **Tool call arguments.** Internally a call's input is a JSON object.
  Arguments that are not one (a model sometimes emits broken JSON) are kept as
  ``{RAW_ARGUMENTS_KEY: "<the text>"}`` and sent back as the same text
  (:func:`decode_arguments`, :func:`encode_arguments`).
* **Non-text content of a tool result** (:func:`tool_result_content`): text parts
  are the result's output, one per line; images and files are its attachments
  (:class:`~mimo_ctx.messages.FilePart`), sent back where the provider's tool
  results take them; any other part is kept as one line of compact JSON in the
  output, so nothing is lost and the model sees what it was sent before.
* **Times and ids.** Messages get fresh ascending ids (SPEC A1) made for their
  time, in list order: a draft's own time (importers know it) or one time for the
  whole batch (now, for live messages); times never go backwards along the list.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mimo_ctx import ids
from mimo_ctx._util import now_ms
from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.messages import (
    MAIN_AGENT,
    FilePart,
    Message,
    MessageFailure,
    OpaquePart,
    Part,
    Role,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    ToolTime,
)
from mimo_ctx.tokens import js_json
from mimo_ctx.view import INTERRUPTED_TOOL_ERROR

__all__ = [
    "BOUNDARY_TEXT_SEPARATOR",
    "RAW_ARGUMENTS_KEY",
    "DataUrl",
    "MessageDraft",
    "ToolCallJoiner",
    "ToolOutcome",
    "build_messages",
    "decode_arguments",
    "encode_arguments",
    "file_data_part",
    "file_mention",
    "finished_messages",
    "guess_mime",
    "infer_finish",
    "json_entries",
    "json_list",
    "json_object",
    "make_data_url",
    "opt_object",
    "parse_data_url",
    "result_content",
    "tool_outcome",
    "tool_result_content",
]

RAW_ARGUMENTS_KEY: Final = "__raw_arguments__"
"""Key under which arguments that are not a JSON object are kept verbatim."""

BOUNDARY_TEXT_SEPARATOR: Final = "\n\n"
"""Joins the text parts of a rebuild boundary into one text (SPEC R8.1)."""


# --------------------------------------------------------------------------- #
# JSON shapes
# --------------------------------------------------------------------------- #


def opt_object(value: object) -> Mapping[str, Any] | None:
    """``value`` as a JSON object, or None when it is not one."""
    if isinstance(value, Mapping):
        return value  # pyright: ignore[reportUnknownVariableType]
    return None


def json_object(value: object, where: str) -> Mapping[str, Any]:
    """``value`` as a JSON object.

    Raises:
        InvalidRequestError: It is not one; the message names ``where``.
    """
    found = opt_object(value)
    if found is None:
        raise InvalidRequestError(f"{where}: expected an object, got {type(value).__name__}")
    return found


def json_list(value: object, where: str) -> list[Any]:
    """``value`` (any sequence but a string) as a list.

    Raises:
        InvalidRequestError: It is not a list; the message names ``where``.
    """
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidRequestError(f"{where}: expected a list, got {type(value).__name__}")
    return list(value)  # pyright: ignore[reportUnknownArgumentType]


def json_entries(value: object, where: str) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    """The objects of the JSON list ``value``: ``(index, place, object)``, the place
    being ``where[index]`` (what an error names).

    Raises:
        InvalidRequestError: ``value`` is not a list, or an entry is not an object.
    """
    for index, raw in enumerate(json_list(value, where)):
        place = f"{where}[{index}]"
        yield index, place, json_object(raw, place)


# --------------------------------------------------------------------------- #
# Tool call arguments
# --------------------------------------------------------------------------- #


def encode_arguments(arguments: Mapping[str, Any]) -> str:
    """Tool call input -> the compact JSON text OpenAI expects in ``arguments``.

    ``{RAW_ARGUMENTS_KEY: text}`` (and nothing else) is sent back as ``text``.

    Raises:
        InvalidRequestError: The input cannot be serialised as JSON.
    """
    if len(arguments) == 1 and isinstance(arguments.get(RAW_ARGUMENTS_KEY), str):
        raw: str = arguments[RAW_ARGUMENTS_KEY]
        return raw
    try:
        return js_json(dict(arguments))
    except RecursionError as exc:
        raise InvalidRequestError(
            "tool call input is not JSON-serialisable: it is nested too deeply"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"tool call input is not JSON-serialisable: {exc}") from exc


def decode_arguments(arguments: object) -> dict[str, Any]:
    """Provider arguments (JSON text or an object) -> the internal input object.

    Text that does not parse to a JSON object is kept as ``{RAW_ARGUMENTS_KEY: text}``;
    an empty text reads as ``{}``.
    """
    if isinstance(arguments, Mapping):
        return dict(arguments)  # pyright: ignore[reportUnknownArgumentType]
    if arguments is None:
        return {}
    if not isinstance(arguments, str):
        return {RAW_ARGUMENTS_KEY: js_json(arguments)}
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {RAW_ARGUMENTS_KEY: arguments}
    if isinstance(value, dict):
        return value  # pyright: ignore[reportUnknownVariableType]
    return {RAW_ARGUMENTS_KEY: arguments}


# --------------------------------------------------------------------------- #
# Files and data URLs
# --------------------------------------------------------------------------- #


def file_mention(part: FilePart) -> str:
    """The text a file the provider cannot take is sent as (wording ours).

    A ``data:`` URL is not repeated (it would be the whole file as base64).
    """
    name = f"{part.filename} " if part.filename else ""
    where = "" if part.url.startswith("data:") else f": {part.url}"
    return f"[Attached file {name}({part.mime}) not sent to the model{where}]"


@dataclass(frozen=True, slots=True)
class DataUrl:
    """A parsed ``data:`` URL: its media type and payload (decoded only on demand)."""

    mime: str
    payload: str
    is_base64: bool

    @property
    def data(self) -> bytes:
        """The decoded bytes."""
        if self.is_base64:
            return base64.b64decode(self.payload)
        return urllib.parse.unquote_to_bytes(self.payload)

    @property
    def base64(self) -> str:
        """The bytes base64-encoded (what Anthropic's ``base64`` sources take).

        A base64 payload is returned as it is, without decoding it (images are
        large and this runs on every request).
        """
        if self.is_base64:
            return self.payload
        return base64.b64encode(self.data).decode("ascii")


def parse_data_url(url: str) -> DataUrl | None:
    """Parse a ``data:`` URL (RFC 2397); None when ``url`` is not one."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url[5:].partition(",")
    if not sep:
        return None
    params = header.split(";")
    mime = params[0].strip().lower() or "text/plain"
    is_base64 = "base64" in (p.strip().lower() for p in params[1:])
    return DataUrl(mime, payload, is_base64)


def make_data_url(mime: str, data: bytes | str) -> str:
    """Build a base64 ``data:`` URL; ``str`` data is taken as already base64-encoded."""
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode("ascii")
    return f"data:{mime};base64,{encoded}"


def guess_mime(url: str, default: str) -> str:
    """The media type of a URL: from a ``data:`` header, else from its extension."""
    parsed = parse_data_url(url)
    if parsed is not None:
        return parsed.mime
    guessed, _ = mimetypes.guess_type(urllib.parse.urlsplit(url).path)
    return guessed or default


# --------------------------------------------------------------------------- #
# Tool results
# --------------------------------------------------------------------------- #


def tool_result_content(parts: Iterable[Part]) -> tuple[str, list[FilePart]]:
    """The one rule for a tool result's content (see the module docs).

    Args:
        parts: The result's content as read by a converter: text parts, file parts
            (images, documents) and opaque parts for kinds it has no form for.

    Returns:
        The output text (text parts and the compact JSON of other parts, one per
        line) and the attachments (the file parts, in order).
    """
    lines: list[str] = []
    files: list[FilePart] = []
    for part in parts:
        if isinstance(part, TextPart):
            lines.append(part.text)
        elif isinstance(part, FilePart):
            files.append(part)
        elif isinstance(part, OpaquePart):
            lines.append(json.dumps(part.data, ensure_ascii=False, separators=(",", ":")))
        else:
            lines.append(js_json(part.model_dump(mode="json", exclude_none=True)))
    return "\n".join(lines), files


def result_content(
    content: object, parts: Callable[[object], Iterable[Part]]
) -> tuple[str, list[FilePart]]:
    """A provider's tool result content as ``(output, attachments)``: none is empty, a
    string is the output, a list is read into parts by ``parts`` and joined by
    :func:`tool_result_content`."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    return tool_result_content(parts(content))


def file_data_part(data: str, filename: str | None) -> FilePart:
    """A file a request carries inline (a ``data:`` URL or bare base64), its type
    guessed from the URL or else from ``filename``."""
    mime = guess_mime(filename or "", "application/octet-stream")
    url = data if parse_data_url(data) is not None else make_data_url(mime, data)
    return FilePart(mime=guess_mime(url, mime), url=url, filename=filename)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """The result sent for one tool call: text, whether it failed, image attachments."""

    output: str
    is_error: bool = False
    attachments: tuple[FilePart, ...] = ()


def tool_outcome(part: ToolPart, results: Mapping[str, ToolResultPart]) -> ToolOutcome:
    """The result to send for a call of the send view (SPEC A10).

    Args:
        part: A tool call of :func:`~mimo_ctx.view.apply_send_rules` output.
        results: :func:`~mimo_ctx.view.tool_results_by_call` of the same view; a
            separately stored result wins over the call's own state.

    Returns:
        The outcome; a call with neither (which the view never leaves) reads as
        interrupted.
    """
    stored = results.get(part.call_id)
    if stored is not None:
        return ToolOutcome(stored.output, stored.is_error, tuple(stored.attachments or ()))
    state = part.state
    if isinstance(state, ToolStateCompleted):
        return ToolOutcome(state.output, False, tuple(state.attachments))
    if isinstance(state, ToolStateError):
        return ToolOutcome(state.error, True)
    return ToolOutcome(INTERRUPTED_TOOL_ERROR, True)


# --------------------------------------------------------------------------- #
# Drafts
# --------------------------------------------------------------------------- #


@dataclass(slots=True)
class MessageDraft:
    """A message being built by a converter (parts may still change).

    Attributes:
        role: ``user``, ``assistant`` or ``tool``.
        parts: The content, in order.
        time: The message's own creation time (epoch ms), when the source says
            (transcripts); None: the time :func:`build_messages` is given.
        agent: The agent, when the source says (sub-agents of a transcript);
            None: the agent :func:`build_messages` is given.
        time_completed: When an assistant message finished, if known.
        finish: Finish reason (set: the message is complete).
        error: Why an assistant message failed.
        usage: Provider usage of an assistant message.
        model: The model that answered.
        provider_message_id: The provider's id of the message.
        metadata: Stored with the message unchanged.
        item: Index of the host item (in the list the converter was given) the
            draft came from, so a caller can tell which stored message stands
            for which host message.
    """

    role: Role
    parts: list[Part] = field(default_factory=list["Part"])
    time: int | None = None
    agent: str | None = None
    time_completed: int | None = None
    finish: str | None = None
    error: MessageFailure | None = None
    usage: TokenUsage | None = None
    model: str | None = None
    provider_message_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    item: int = 0

    @property
    def open_calls(self) -> list[ToolPart]:
        """The tool calls of the draft that have no result yet."""
        return [
            p
            for p in self.parts
            if isinstance(p, ToolPart) and isinstance(p.state, ToolStatePending | ToolStateRunning)
        ]


def infer_finish(draft: MessageDraft, *, followed: bool) -> str | None:
    """The finish reason of an assistant draft whose source gives none.

    ``tool-calls`` when it made tool calls, else ``stop``; a failed draft stays
    unfinished, and so does one with a call that never got a result and nothing
    after it (the agent was stopped while the tool ran).
    """
    if draft.error is not None:
        return None
    calls = [p for p in draft.parts if isinstance(p, ToolPart)]
    if not calls:
        return "stop"
    if not followed and draft.open_calls:
        return None
    return "tool-calls"


class ToolCallJoiner:
    """Joins tool results into the calls they answer.

    A call is added as an open :class:`~mimo_ctx.messages.ToolPart` (``pending``,
    or ``running`` when its start time is known); a result for it turns the part
    into ``completed`` (or ``error``) in place in its draft. A result for no open
    call (unknown, or already answered) is not joined: the converter keeps it as a
    :class:`~mimo_ctx.messages.ToolResultPart` in a ``tool`` message.
    """

    def __init__(self) -> None:
        self._open: dict[str, tuple[MessageDraft, int]] = {}

    def add_call(
        self,
        draft: MessageDraft,
        call_id: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        start: int | None = None,
    ) -> None:
        """Append an open call to ``draft`` and remember it."""
        state: ToolStatePending | ToolStateRunning
        if start is None:
            state = ToolStatePending(input=arguments)
        else:
            state = ToolStateRunning(input=arguments, time=ToolTime(start=start))
        draft.parts.append(ToolPart(call_id=call_id, tool=tool, state=state))
        self._open[call_id] = (draft, len(draft.parts) - 1)

    def latest_open(self, tool: str) -> str | None:
        """The call id of the newest open call of ``tool`` (legacy results name only
        the function)."""
        for call_id, (draft, index) in reversed(self._open.items()):
            part = draft.parts[index]
            if isinstance(part, ToolPart) and part.tool == tool:
                return call_id
        return None

    def is_open(self, call_id: str) -> bool:
        """True while ``call_id`` waits for its result."""
        return call_id in self._open

    def join(
        self,
        call_id: str,
        output: str,
        *,
        is_error: bool = False,
        attachments: Sequence[FilePart] = (),
        end: int | None = None,
    ) -> bool:
        """Record the result of an open call; False when no open call has that id."""
        found = self._open.pop(call_id, None)
        if found is None:
            return False
        draft, index = found
        call = draft.parts[index]
        assert isinstance(call, ToolPart)  # only add_call stores indexes
        start = call.state.time.start if isinstance(call.state, ToolStateRunning) else None
        timed = start is not None or end is not None
        time = ToolTime(start=start, end=end) if timed else ToolTime()
        state: ToolStateCompleted | ToolStateError
        if is_error:
            state = ToolStateError(input=call.state.input, error=output, time=time)
        else:
            state = ToolStateCompleted(
                input=call.state.input, output=output, attachments=list(attachments), time=time
            )
        draft.parts[index] = call.model_copy(update={"state": state})
        return True


def build_messages(
    drafts: Sequence[MessageDraft],
    *,
    session_id: str,
    agent: str = MAIN_AGENT,
    time_ms: int | None = None,
    finished: bool = False,
    keep_empty: bool = False,
) -> list[Message]:
    """Turn drafts into messages with fresh ascending ids, in order.

    Each message's time is its draft's own time, else ``time_ms`` (now when None),
    clamped to be no earlier than the message before it; ids are made for that
    time, and if the id generator cannot give a larger id for it (thousands of
    ids in one millisecond) the time moves on by a millisecond, so ids always
    ascend and agree with the store's ``(time_created, id)`` order.

    Args:
        drafts: The messages in order.
        session_id: Session the messages belong to.
        agent: Agent of drafts that name none.
        time_ms: Creation time (epoch ms) of drafts that have none; None: now, with
            ids newer than every id this process made before.
        finished: Every assistant draft without a finish reason is a finished turn
            (``tool-calls`` when it calls tools, else ``stop``): a provider payload
            holds only finished turns. A finished draft without a completion time
            completes when it is created.
        keep_empty: Keep drafts without parts (a transcript's record of an empty
            turn); by default they are skipped.

    Raises:
        InvalidRequestError: ``session_id`` is empty.
    """
    if not session_id:
        raise InvalidRequestError("session_id must be a non-empty string")
    out: list[Message] = []
    prev_time = 0
    prev_id = ""
    for draft in drafts:
        if not draft.parts and not keep_empty:
            continue
        if draft.time is None and time_ms is None:
            # Now: an id newer than every one this process made (a live message
            # must sort after the answer recorded just before it).
            message_id = ids.ascending("msg")
            at = max(prev_time, now_ms())
        else:
            at = max(prev_time, draft.time if draft.time is not None else time_ms or 0)
            message_id = ids.ascending("msg", timestamp_ms=at)
            while message_id <= prev_id:
                at += 1
                message_id = ids.ascending("msg", timestamp_ms=at)
        prev_time, prev_id = at, message_id
        finish = draft.finish
        if finish is None and finished and draft.role == "assistant":
            finish = infer_finish(draft, followed=True)
        completed = draft.time_completed
        if completed is not None:
            completed = max(at, completed)
        elif finish is not None and finished:
            completed = at
        out.append(
            Message(
                id=message_id,
                session_id=session_id,
                role=draft.role,
                agent=draft.agent if draft.agent is not None else agent,
                time_created=at,
                time_completed=completed,
                finish=finish,
                error=draft.error,
                usage=draft.usage,
                model=draft.model,
                provider_message_id=draft.provider_message_id,
                parts=list(draft.parts),
                metadata=draft.metadata,
            )
        )
    return out


def finished_messages(
    converted: tuple[str | None, list[MessageDraft]],
    session_id: str,
    agent: str,
    time_ms: int | None,
) -> tuple[str | None, list[Message]]:
    """A provider converter's ``(system text, drafts)`` with the drafts built into
    finished messages (:func:`build_messages` with ``finished=True``: a provider
    payload holds only finished turns)."""
    system, drafts = converted
    messages = build_messages(
        drafts, session_id=session_id, agent=agent, time_ms=time_ms, finished=True
    )
    return system, messages
