"""When to write a checkpoint and when to rebuild (SPEC R1, A3).

Pure functions: the trigger line ``usable`` of R1.2, the writer threshold
schedule of A3, context-pressure levels, and the once-per-usage rule of R1.4.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx.config import RebuildConfig, parse_token_amount
from mimo_ctx.errors import ConfigError
from mimo_ctx.messages import Message, TokenUsage, written_after
from mimo_ctx.tokens import estimate_message_tokens

__all__ = [
    "KNOWN_MODELS",
    "OUTPUT_TOKEN_MAX",
    "ModelLimits",
    "due_thresholds",
    "effective_window",
    "estimated_usage",
    "is_recovered",
    "lacks_usage",
    "pressure_level",
    "usable_tokens",
    "usage_tokens",
    "writer_thresholds",
]

OUTPUT_TOKEN_MAX: Final = 20000
"""Output reserve ceiling for models without a separate input limit (R1.2)."""

_NO_WRITER_BELOW: Final = 25000


KNOWN_MODELS: Final[dict[str, tuple[int, int | None, int]]] = {
    # name: (context window, separate input limit or None, max output tokens), as
    # the providers publish them. A dated or versioned name (gpt-4o-2024-08-06,
    # claude-sonnet-4-5-20250929) takes the entry of its base name.
    "gpt-4o": (128_000, None, 16_384),
    "gpt-4o-mini": (128_000, None, 16_384),
    "gpt-4.1": (1_047_576, None, 32_768),
    "gpt-4.1-mini": (1_047_576, None, 32_768),
    "gpt-4.1-nano": (1_047_576, None, 32_768),
    "gpt-5": (400_000, 272_000, 128_000),
    "gpt-5-mini": (400_000, 272_000, 128_000),
    "gpt-5-nano": (400_000, 272_000, 128_000),
    "o3": (200_000, None, 100_000),
    "o4-mini": (200_000, None, 100_000),
    "claude-opus-4-1": (200_000, None, 32_000),
    "claude-opus-4": (200_000, None, 32_000),
    "claude-sonnet-4-5": (200_000, None, 64_000),
    "claude-sonnet-4": (200_000, None, 64_000),
    "claude-haiku-4-5": (200_000, None, 64_000),
    "claude-3-7-sonnet": (200_000, None, 64_000),
    "claude-3-5-haiku": (200_000, None, 8_192),
    "gemini-2.5-pro": (1_048_576, None, 65_536),
    "gemini-2.5-flash": (1_048_576, None, 65_536),
}
"""The limits :meth:`ModelLimits.for_model` knows (a small table of common models)."""


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What the model can take.

    Attributes:
        context_window: Total context window in tokens.
        input_limit: A separate input limit, for models that have one.
        max_output_tokens: The model's output limit (default: ``OUTPUT_TOKEN_MAX``).
    """

    context_window: int
    input_limit: int | None = None
    max_output_tokens: int | None = None

    @classmethod
    def for_model(
        cls,
        name: str,
        *,
        context_window: int | None = None,
        input_limit: int | None = None,
        max_output_tokens: int | None = None,
    ) -> ModelLimits:
        """The limits of a common model by name (:data:`KNOWN_MODELS`); explicit values win.

        ``openai:gpt-4o`` and ``openai/gpt-4o`` (a provider prefix) and dated or
        versioned names (``claude-sonnet-4-5-20250929``) read as their base name.

        Raises:
            ConfigError: The name is not in the table and no ``context_window`` is
                given; the message lists the names it knows.
        """
        base = name.strip().lower().rsplit(":", 1)[-1].rsplit("/", 1)[-1]
        known = next(
            (
                KNOWN_MODELS[key]
                for key in sorted(KNOWN_MODELS, key=len, reverse=True)
                if base == key or base.startswith(f"{key}-")
            ),
            None,
        )
        if known is None:
            if context_window is None:
                raise ConfigError(
                    f"model {name!r}: its limits are not known; pass "
                    "ModelLimits(context_window=..., max_output_tokens=...) or one of: "
                    f"{', '.join(sorted(KNOWN_MODELS))}"
                )
            known = (context_window, None, OUTPUT_TOKEN_MAX)
        window, limit, output = known
        return cls(
            context_window=context_window if context_window is not None else window,
            input_limit=input_limit if input_limit is not None else limit,
            max_output_tokens=max_output_tokens if max_output_tokens is not None else output,
        )

    def __post_init__(self) -> None:
        for name in ("context_window", "input_limit", "max_output_tokens"):
            value: object = getattr(self, name)
            # A wrong type ("200k", 1.5, True, NaN) would otherwise fail later with a
            # raw TypeError deep in the arithmetic, or be silently misread.
            if (value is not None or name == "context_window") and (
                isinstance(value, bool) or not isinstance(value, int)
            ):
                raise ConfigError(f"{name}: expected a whole number of tokens, got {value!r}")
        if self.context_window <= 0:
            raise ConfigError(
                f"context_window: expected a positive token count, got {self.context_window!r}"
            )
        if self.input_limit is not None and self.input_limit <= 0:
            raise ConfigError(
                f"input_limit: expected a positive token count, got {self.input_limit!r}"
            )
        if self.max_output_tokens is not None and self.max_output_tokens < 0:
            raise ConfigError(
                "max_output_tokens: expected a non-negative token count, "
                f"got {self.max_output_tokens!r}"
            )


def effective_window(limits: ModelLimits, config: RebuildConfig | None = None) -> int:
    """The window the trigger line is a share of (SPEC R1.2).

    The model's input limit if it has one, else its context window, lowered by
    ``config.max_context`` when that is set.
    """
    effective = limits.input_limit if limits.input_limit is not None else limits.context_window
    if config is not None and config.max_context is not None:
        effective = min(effective, parse_token_amount(config.max_context, of=effective))
    return effective


def usable_tokens(limits: ModelLimits, config: RebuildConfig | None = None) -> int:
    """The trigger line (SPEC R1.2).

    ``usable = min(floor(effective * ratio), effective - completion)``, where
    ``effective`` is the input limit if the model has one, else its context window,
    optionally lowered by ``config.max_context``; ``completion`` reserves room for
    the answer on models without a separate input limit.
    """
    config = config or RebuildConfig()
    has_input_limit = limits.input_limit is not None
    effective = effective_window(limits, config)
    output_reserve = (
        0
        if has_input_limit
        else min(limits.max_output_tokens or OUTPUT_TOKEN_MAX, OUTPUT_TOKEN_MAX)
    )
    completion = min(output_reserve, effective // 2)
    return max(0, min(math.floor(effective * config.trigger_ratio), effective - completion))


def usage_tokens(message: Message | None) -> int | None:
    """Tokens the provider reported for a finished assistant message (R1.2).

    ``None`` for anything that cannot trigger: no message, not a finished
    assistant message, no usage, or a compaction summary (its own usage never
    triggers).
    """
    if message is None or message.role != "assistant" or message.finish is None:
        return None
    if message.summary or message.usage is None:
        return None
    return message.usage.context_tokens


def lacks_usage(message: Message) -> bool:
    """True for a finished assistant answer whose provider reported no usage.

    Some OpenAI-compatible servers send no ``usage`` (or only zeros). Such an
    answer gets :func:`estimated_usage`, or neither the writer thresholds nor the
    trigger line could ever fire. A compaction summary's usage never triggers, so
    it needs none.
    """
    if message.role != "assistant" or message.finish is None or message.summary:
        return False
    return message.usage is None or message.usage.context_tokens == 0


def estimated_usage(message: Message, request_tokens: int) -> TokenUsage:
    """The usage of an answer the provider reported none for.

    ``request_tokens`` (the estimate of the request that was sent) as input, the
    answer's own estimate (SPEC R2.2) as output, marked ``estimated``.
    """
    return TokenUsage(input=request_tokens, output=estimate_message_tokens(message), estimated=True)


def writer_thresholds(usable: int, config: RebuildConfig | None = None) -> list[int]:
    """Usage levels (tokens) at which a checkpoint writer starts (SPEC A3).

    Default schedule, as shares of ``usable``: none below 25000; up to 200000,
    20/40/60/80%; up to 500000, every 10% to 90%; above, every 5% to 90%. A
    configured list (``"40%"``, ``"100K"``, ``"1.5M"``, numbers) replaces it. Every
    threshold is capped at ``usable - writer.reserved``: the first one over the cap
    is clamped to it and later ones are dropped.
    """
    config = config or RebuildConfig()
    if config.writer.thresholds is not None:
        raw = sorted(parse_token_amount(t, of=usable) for t in config.writer.thresholds)
    elif usable < _NO_WRITER_BELOW:
        return []
    else:
        if usable <= 200_000:
            shares: Iterable[int] = (20, 40, 60, 80)
        elif usable <= 500_000:
            shares = range(10, 91, 10)
        else:
            shares = range(5, 91, 5)
        raw = [usable * s // 100 for s in shares]
    cap = usable - config.writer.reserved
    result: list[int] = []
    for threshold in raw:
        if threshold <= 0:
            continue
        if threshold > cap:
            if cap > 0 and (not result or result[-1] < cap):
                result.append(cap)
            break
        if not result or result[-1] != threshold:
            result.append(threshold)
    return result


def due_thresholds(usage: int, thresholds: Sequence[int], crossed: Iterable[int]) -> list[int]:
    """Thresholds reached by ``usage`` that have not fired yet in this session."""
    done = set(crossed)
    return [t for t in thresholds if t <= usage and t not in done]


def pressure_level(usage: int, usable: int) -> int:
    """Context pressure 0..3 (information only, SPEC A3): <50%, <70%, <85%, above."""
    if usable <= 0:
        return 3
    share = usage / usable
    if share < 0.50:
        return 0
    if share < 0.70:
        return 1
    if share < 0.85:
        return 2
    return 3


def is_recovered(last_finished: Message | None, latest_boundary: Message | None) -> bool:
    """The once-per-usage rule (SPEC R1.4, amended): decided by the store's write order.

    A usage is recovered when a boundary (checkpoint or compaction) was written
    after the last finished assistant message. The boundary's time is back-dated,
    so times cannot say it; ids cannot either, since they come from the clock of
    the worker that made them (a lagging one makes new ids that sort early), so
    the store's write order decides (:func:`~mimo_ctx.messages.written_after`).
    """
    if latest_boundary is None or last_finished is None:
        return False
    return written_after(latest_boundary, last_finished)
