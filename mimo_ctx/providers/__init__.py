"""Provider adapters: the pieces the converters (and, later, the client wrappers) share.

The converters themselves live in :mod:`mimo_ctx.providers.openai` (Chat
Completions and Responses) and :mod:`mimo_ctx.providers.anthropic` (Messages);
:mod:`mimo_ctx.providers.validate` checks a finished payload against the
provider's rules. All of them work on plain ``dict`` payloads, the JSON the
providers accept, and import no SDK: an SDK's typed params are ``TypedDict``
views of the same dicts, so a payload built here can be passed to the SDK as it
is, and an SDK object turns into such a dict with ``model_dump()``.

Every ``to_*`` converter first applies :func:`mimo_ctx.view.apply_send_rules`,
so what is sent follows SPEC A10 whatever the provider. Every ``from_*``
converter builds new messages with fresh ascending ids (made for ``time_ms`` when
given, so they sort at that time) and joins tool results into the calling
:class:`~mimo_ctx.messages.ToolPart` where it can.

Tool call arguments. Internally a call's input is a JSON object. Arguments that
are not a JSON object (a model sometimes emits broken JSON) are kept as
``{RAW_ARGUMENTS_KEY: "<the text>"}`` and sent back as the same text, so a host
can show the model exactly what it sent.

Client wrappers: :func:`wrap_openai` and :func:`wrap_anthropic` (and
:func:`validate_request`) are exported lazily, so importing this package needs
no SDK and does not load the middleware.
"""

from __future__ import annotations

import base64
import importlib
import json
import mimetypes
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from mimo_ctx import ids
from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.messages import (
    MAIN_AGENT,
    FilePart,
    Message,
    Part,
    Role,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
)
from mimo_ctx.tokens import js_json
from mimo_ctx.view import INTERRUPTED_TOOL_ERROR

if TYPE_CHECKING:
    from mimo_ctx.providers.anthropic_client import wrap_anthropic
    from mimo_ctx.providers.openai_client import wrap_openai
    from mimo_ctx.providers.validate import validate_request

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
    "file_mention",
    "guess_mime",
    "json_list",
    "json_object",
    "make_data_url",
    "opt_object",
    "parse_data_url",
    "tool_outcome",
    "validate_request",
    "wrap_anthropic",
    "wrap_openai",
]

_LAZY: Final = {
    "wrap_openai": "mimo_ctx.providers.openai_client",
    "wrap_anthropic": "mimo_ctx.providers.anthropic_client",
    "validate_request": "mimo_ctx.providers.validate",
}


def __getattr__(name: str) -> Any:
    # Lazy exports (PEP 562): the wrappers import the middleware, and the SDKs only
    # when called, so ``import mimo_ctx.providers`` stays light and SDK-free.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


RAW_ARGUMENTS_KEY: Final = "__raw_arguments__"
"""Key under which arguments that are not a JSON object are kept verbatim."""

BOUNDARY_TEXT_SEPARATOR: Final = "\n\n"
"""Joins the text parts of a rebuild boundary into one text (SPEC R8.1)."""


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


def file_mention(part: FilePart) -> str:
    """The text a file the provider cannot take is sent as (wording ours).

    A ``data:`` URL is not repeated (it would be the whole file as base64).
    """
    name = f"{part.filename} " if part.filename else ""
    where = "" if part.url.startswith("data:") else f": {part.url}"
    return f"[Attached file {name}({part.mime}) not sent to the model{where}]"


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
    except ValueError:
        return {RAW_ARGUMENTS_KEY: arguments}
    if isinstance(value, dict):
        return value  # pyright: ignore[reportUnknownVariableType]
    return {RAW_ARGUMENTS_KEY: arguments}


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
        return ToolOutcome(stored.output, stored.is_error)
    state = part.state
    if isinstance(state, ToolStateCompleted):
        return ToolOutcome(state.output, False, tuple(state.attachments))
    if isinstance(state, ToolStateError):
        return ToolOutcome(state.error, True)
    return ToolOutcome(INTERRUPTED_TOOL_ERROR, True)


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


@dataclass(slots=True)
class MessageDraft:
    """A message being built by a ``from_*`` converter (parts may still change)."""

    role: Role
    parts: list[Part] = field(default_factory=list["Part"])
    provider_message_id: str | None = None


class ToolCallJoiner:
    """Joins provider tool results into the calls they answer (``from_*`` converters).

    A call is added as a pending :class:`ToolPart`; a result for it turns the part
    into ``completed`` (or ``error``) in place in its draft. A result for no open
    call is not joined: the converter keeps it as a :class:`ToolResultPart` in a
    ``tool`` message.
    """

    def __init__(self) -> None:
        self._open: dict[str, tuple[MessageDraft, int]] = {}

    def add_call(
        self, draft: MessageDraft, call_id: str, tool: str, arguments: dict[str, Any]
    ) -> None:
        """Append a pending call to ``draft`` and remember it as open."""
        draft.parts.append(
            ToolPart(call_id=call_id, tool=tool, state=ToolStatePending(input=arguments))
        )
        self._open[call_id] = (draft, len(draft.parts) - 1)

    def join(
        self,
        call_id: str,
        output: str,
        *,
        is_error: bool = False,
        attachments: Sequence[FilePart] = (),
    ) -> bool:
        """Record the result of an open call; False when no open call has that id."""
        found = self._open.pop(call_id, None)
        if found is None:
            return False
        draft, index = found
        call = draft.parts[index]
        assert isinstance(call, ToolPart)  # only add_call stores indexes
        state: ToolStateCompleted | ToolStateError
        if is_error:
            state = ToolStateError(input=call.state.input, error=output)
        else:
            state = ToolStateCompleted(
                input=call.state.input, output=output, attachments=list(attachments)
            )
        draft.parts[index] = call.model_copy(update={"state": state})
        return True


def build_messages(
    drafts: Sequence[MessageDraft],
    *,
    session_id: str,
    agent: str = MAIN_AGENT,
    time_ms: int | None = None,
) -> list[Message]:
    """Turn drafts into messages with fresh ascending ids, in order.

    Empty drafts are skipped. Assistant messages are marked finished
    (``tool-calls`` when they call tools, else ``stop``): a payload holds only
    finished turns.

    Args:
        drafts: The messages in order.
        session_id: Session the messages belong to.
        agent: Agent id of the messages.
        time_ms: Creation time (epoch ms) of every message; now when None. Ids are
            made for this time and ascend in list order.
    """
    if not session_id:
        raise InvalidRequestError("session_id must be a non-empty string")
    when = time.time_ns() // 1_000_000 if time_ms is None else time_ms
    out: list[Message] = []
    for draft in drafts:
        if not draft.parts:
            continue
        finish: str | None = None
        completed: int | None = None
        if draft.role == "assistant":
            calls = any(isinstance(p, ToolPart) for p in draft.parts)
            finish = "tool-calls" if calls else "stop"
            completed = when
        out.append(
            Message(
                id=ids.ascending("msg", timestamp_ms=when),
                session_id=session_id,
                role=draft.role,
                agent=agent,
                time_created=when,
                time_completed=completed,
                finish=finish,
                provider_message_id=draft.provider_message_id,
                parts=list(draft.parts),
            )
        )
    return out
