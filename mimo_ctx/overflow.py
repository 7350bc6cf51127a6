"""Recognising a provider's "context window exceeded" error (SPEC R1.5, A11).

Duck-typed, with no SDK import: the same code reads the exceptions of the
``openai`` and ``anthropic`` SDKs, of pydantic-ai and LangChain (which wrap them;
the ``__cause__`` / ``__context__`` chain is followed), plain error bodies
(``{"error": {...}}`` mappings) and bare messages. An error is an overflow when
any of these hold:

* the HTTP status is 413 (attributes ``status_code``, ``status``, or
  ``response.status_code`` / ``response.status``);
* an error code or type anywhere in the error body is one of
  :data:`OVERFLOW_ERROR_CODES` (attribute ``code`` / ``type``, body
  ``error.code``, ``error.type``...);
* a message (``str(exc)``, attribute ``message``, any string in the body) matches
  one of :data:`OVERFLOW_PATTERNS`, case-insensitively: the fragments the
  original matches for each provider (SPEC A11).

Our choice: an error whose status is 401, 403 or 429 is never an overflow
(authentication and rate limits are not fixed by a rebuild, and a rate-limit
message about "tokens per minute" must not trigger one).

Providers (and hosts) extend the recognition with
:func:`register_overflow_recognizer`. Errors inside a stream (an SSE ``error``
event, a Responses ``response.failed`` event, an OpenAI-compatible chunk with an
``error`` member or the z.ai finish reason) are read by
:func:`is_overflow_stream_event`, which looks only at error payloads, never at
generated text.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

__all__ = [
    "NOT_OVERFLOW_STATUSES",
    "OVERFLOW_ERROR_CODES",
    "OVERFLOW_PATTERNS",
    "OVERFLOW_STATUS",
    "OverflowRecognizer",
    "is_context_overflow",
    "is_overflow_stream_event",
    "register_overflow_recognizer",
    "unregister_overflow_recognizer",
]

OVERFLOW_STATUS: Final = 413
"""HTTP "request entity too large": always an overflow."""

NOT_OVERFLOW_STATUSES: Final = frozenset({401, 403, 429})
"""Statuses that are never an overflow, whatever the message says (our choice)."""

OVERFLOW_ERROR_CODES: Final = frozenset(
    {"context_length_exceeded", "model_context_window_exceeded"}
)
"""Error codes (or types, or finish reasons) that mean the context overflowed."""

_FRAGMENTS: Final[tuple[str, ...]] = (
    r"prompt is too long",  # Anthropic
    r"input is too long for requested model",  # Amazon Bedrock
    r"exceeds the context window",  # OpenAI
    r"input token count.*exceeds the maximum",  # Google Gemini
    r"maximum prompt length is \d+",  # xAI
    r"reduce the length of the messages",  # Groq
    r"maximum context length is \d+ tokens",  # OpenRouter, DeepSeek, vLLM
    r"exceeds the limit of \d+",  # GitHub Copilot
    r"exceeds the available context size",  # llama.cpp
    r"greater than the context length",  # LM Studio
    r"context window exceeds limit",  # MiniMax
    r"exceeded model token limit",  # Kimi (Moonshot)
    r"context[_ ]length[_ ]exceeded",  # generic, OpenAI's error code
    r"request entity too large",  # HTTP 413 text
    r"context length is only \d+ tokens",  # vLLM
    r"input length.*exceeds.*context length",  # vLLM
    r"prompt too long; exceeded (?:max )?context length",  # Ollama
    r"too large for model with \d+ maximum context length",  # Mistral
    r"model_context_window_exceeded",  # z.ai
)

OVERFLOW_PATTERNS: Final[tuple[re.Pattern[str], ...]] = tuple(
    re.compile(f, re.IGNORECASE | re.DOTALL) for f in _FRAGMENTS
)
"""The message fragments of SPEC A11, compiled case-insensitively."""

OverflowRecognizer = Callable[[object], bool | None]
"""A recogniser gets the error as given and answers True (overflow), False (surely
not an overflow) or None (no opinion: ask the next one, then the built-in rules)."""

_recognizers: list[OverflowRecognizer] = []
_recognizers_lock = threading.Lock()

# Bounds for walking untrusted error bodies and exception chains: error bodies
# are small, and a bound keeps a hostile or cyclic object from costing much.
_MAX_DEPTH: Final = 8
_MAX_STRINGS: Final = 256
_MAX_CHAIN: Final = 8
_CODE_KEYS: Final = frozenset({"code", "type", "error_code", "error_type", "finish_reason"})
_STATUS_KEYS: Final = ("status_code", "status", "http_status", "statusCode")


def register_overflow_recognizer(recognizer: OverflowRecognizer) -> OverflowRecognizer:
    """Add a recogniser consulted before the built-in rules (newest first).

    Usable as a decorator. Registering the same function twice has no effect.

    Args:
        recognizer: Called with the error as passed to :func:`is_context_overflow`
            (and with each exception of its ``__cause__`` chain); returns True,
            False or None. It must not raise; an exception it raises propagates.

    Returns:
        ``recognizer``, unchanged.
    """
    with _recognizers_lock:
        if recognizer not in _recognizers:
            _recognizers.insert(0, recognizer)
    return recognizer


def unregister_overflow_recognizer(recognizer: OverflowRecognizer) -> None:
    """Remove a recogniser added by :func:`register_overflow_recognizer` (no-op if absent)."""
    with _recognizers_lock:
        if recognizer in _recognizers:
            _recognizers.remove(recognizer)


def _as_status(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    # http.HTTPStatus and similar enums are ints already; objects with .value too.
    inner = getattr(value, "value", None)
    if isinstance(inner, int) and not isinstance(inner, bool):
        return inner
    return None


def _status_of(error: object) -> int | None:
    if isinstance(error, Mapping):
        mapping: Mapping[Any, Any] = error  # pyright: ignore[reportUnknownVariableType]
        for key in _STATUS_KEYS:
            status = _as_status(mapping.get(key))
            if status is not None:
                return status
        return None
    if isinstance(error, str):
        return None
    for key in _STATUS_KEYS:
        status = _as_status(getattr(error, key, None))
        if status is not None:
            return status
    response = getattr(error, "response", None)
    if response is not None and not isinstance(response, str | bytes):
        for key in ("status_code", "status"):
            status = _as_status(getattr(response, key, None))
            if status is not None:
                return status
    return None


def _walk_strings(
    value: object, key: str | None, depth: int, out: list[tuple[str | None, str]]
) -> None:
    """Collect (key, string) pairs from a JSON-like body, bounded in depth and count."""
    if len(out) >= _MAX_STRINGS or depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        out.append((key, value))
    elif isinstance(value, Mapping):
        mapping: Mapping[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
        for k, v in mapping.items():
            _walk_strings(v, k if isinstance(k, str) else None, depth + 1, out)
    elif isinstance(value, list | tuple):
        items: list[Any] | tuple[Any, ...] = value  # pyright: ignore[reportUnknownVariableType]
        for v in items:
            _walk_strings(v, key, depth + 1, out)


def _texts_of(error: object) -> list[tuple[str | None, str]]:
    """Every (key, text) the error carries: message, code, type and its body's strings."""
    out: list[tuple[str | None, str]] = []
    if isinstance(error, str):
        return [(None, error)]
    if isinstance(error, Mapping):
        body: Mapping[Any, Any] = error  # pyright: ignore[reportUnknownVariableType]
        _walk_strings(body, None, 0, out)
        return out
    for attr in ("code", "type", "message", "body", "error", "detail", "details"):
        try:
            value = getattr(error, attr, None)
        except Exception:  # a property that raises: skip it, read the others
            continue
        if value is None or callable(value):
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        _walk_strings(value, attr, 0, out)
    if isinstance(error, BaseException):
        # A broken __str__ must not hide what the attributes already said.
        with contextlib.suppress(Exception):
            out.append((None, str(error)))
    return out


def _matches(texts: list[tuple[str | None, str]]) -> bool:
    for key, text in texts:
        if key in _CODE_KEYS and text.strip().lower() in OVERFLOW_ERROR_CODES:
            return True
        if any(p.search(text) for p in OVERFLOW_PATTERNS):
            return True
    return False


def _chain(error: object) -> Iterator[object]:
    """The error, then its causes (``__cause__`` else ``__context__``), without cycles."""
    seen: set[int] = set()
    current: object | None = error
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        yield current
        if not isinstance(current, BaseException):
            return
        current = current.__cause__ or current.__context__


def _ask_recognizers(error: object) -> bool | None:
    with _recognizers_lock:
        recognizers = tuple(_recognizers)
    for recognizer in recognizers:
        answer = recognizer(error)
        if answer is not None:
            return answer
    return None


def _one(error: object) -> bool | None:
    answer = _ask_recognizers(error)
    if answer is not None:
        return answer
    # Each probe is guarded on its own: an error whose status attribute raises may
    # still carry a recognisable message (errors of unknown shape).
    status: int | None = None
    with contextlib.suppress(Exception):
        status = _status_of(error)
    if status == OVERFLOW_STATUS:
        return True
    if status in NOT_OVERFLOW_STATUSES:
        return False
    texts: list[tuple[str | None, str]] = []
    with contextlib.suppress(Exception):
        texts = _texts_of(error)
    if _matches(texts):
        return True
    return None


def is_context_overflow(error: BaseException | Mapping[str, Any] | str) -> bool:
    """True when ``error`` says the request did not fit the model's context (SPEC R1.5).

    Args:
        error: A provider SDK exception (or a wrapper of one), an error body such
            as ``{"error": {"code": ..., "message": ...}}``, or a message.

    Returns:
        True for an overflow; False otherwise (including rate limits and
        authentication errors, whatever their message).
    """
    for link in _chain(error):
        try:
            answer = _one(link)
        except Exception:
            # An error of unknown shape (a property that raises, a proxy, a broken
            # body mapping) says nothing recognisable. Not an overflow: the caller
            # must get the provider's own error back, never one raised in here.
            answer = None
        if answer is not None:
            return answer
    return False


_ERROR_EVENT_TYPES: Final = frozenset({"error", "response.failed"})


def _event_mapping(event: object) -> Mapping[str, Any] | None:
    if isinstance(event, Mapping):
        return event  # pyright: ignore[reportUnknownVariableType]
    dump = getattr(event, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump()
        except Exception:  # not a pydantic model after all
            return None
        if isinstance(dumped, Mapping):
            return dumped  # pyright: ignore[reportUnknownVariableType]
    return None


def _finish_reasons(event: Mapping[str, Any]) -> Iterator[object]:
    yield event.get("finish_reason")
    choices = event.get("choices")
    if isinstance(choices, list):
        items: list[Any] = choices  # pyright: ignore[reportUnknownVariableType]
        for choice in items:
            if isinstance(choice, Mapping):
                choice_map: Mapping[str, Any] = choice  # pyright: ignore[reportUnknownVariableType]
                yield choice_map.get("finish_reason")
    yield event.get("stop_reason")


def is_overflow_stream_event(event: object) -> bool:
    """True when a streamed event reports a context overflow (SPEC A11, "in streams too").

    Only error payloads are read, so text the model generates never matches:

    * an event of type ``error`` (Anthropic SSE, OpenAI Responses) or
      ``response.failed`` (its ``response.error``);
    * a chunk with a non-null ``error`` member (OpenAI-compatible gateways);
    * a finish / stop reason in :data:`OVERFLOW_ERROR_CODES` (z.ai).

    Args:
        event: A mapping, or an SDK event object (read with ``model_dump()``).

    Returns:
        True for an overflow error event; False for any other event.
    """
    mapping = _event_mapping(event)
    if mapping is None:
        return False
    for reason in _finish_reasons(mapping):
        if isinstance(reason, str) and reason.lower() in OVERFLOW_ERROR_CODES:
            return True
    kind = mapping.get("type")
    if kind == "response.failed":
        response = mapping.get("response")
        if isinstance(response, Mapping):
            response_map: Mapping[str, Any] = response  # pyright: ignore[reportUnknownVariableType]
            payload = response_map.get("error")
            return isinstance(payload, Mapping | str) and is_context_overflow(payload)  # pyright: ignore[reportUnknownArgumentType]
        return False
    if kind in _ERROR_EVENT_TYPES:
        return is_context_overflow(mapping)
    payload = mapping.get("error")
    if isinstance(payload, Mapping | str):
        return is_context_overflow({"error": payload})
    return False
