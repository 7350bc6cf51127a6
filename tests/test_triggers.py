"""Trigger line, writer thresholds, pressure and once-per-usage (SPEC R1.2-R1.4, A3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.config import RebuildConfig, WriterConfig
from mimo_ctx.errors import ConfigError
from mimo_ctx.messages import Message, Role, TokenUsage, set_insert_seq
from mimo_ctx.triggers import (
    ModelLimits,
    due_thresholds,
    is_recovered,
    pressure_level,
    usable_tokens,
    usage_tokens,
    writer_thresholds,
)


@pytest.mark.parametrize(
    ("limits", "config", "expected"),
    [
        # 200k window, 32k output: reserve capped at 20000.
        (ModelLimits(200_000, max_output_tokens=32_000), RebuildConfig(), 180_000),
        # 128k window, 4k output: the ratio decides.
        (ModelLimits(128_000, max_output_tokens=4_096), RebuildConfig(), 115_200),
        # A separate input limit: no output reserve.
        (ModelLimits(400_000, input_limit=272_000), RebuildConfig(), 244_800),
        # A small window: the reserve is at most half the window.
        (ModelLimits(30_000), RebuildConfig(), 15_000),
        # max_context as a share and as an amount.
        (ModelLimits(200_000), RebuildConfig(max_context="50%"), 80_000),
        (ModelLimits(1_000_000), RebuildConfig(max_context="300K"), 270_000),
        (ModelLimits(200_000), RebuildConfig(max_context=1_000_000), 180_000),
        (ModelLimits(200_000, max_output_tokens=8_000), RebuildConfig(trigger_ratio=0.5), 100_000),
    ],
)
def test_r1_2_usable(limits: ModelLimits, config: RebuildConfig, expected: int) -> None:
    assert usable_tokens(limits, config) == expected


@given(
    window=st.integers(min_value=1, max_value=5_000_000),
    output=st.none() | st.integers(min_value=0, max_value=200_000),
    ratio=st.floats(min_value=0.05, max_value=1.0),
)
def test_r1_2_usable_never_exceeds_window(window: int, output: int | None, ratio: float) -> None:
    usable = usable_tokens(
        ModelLimits(window, max_output_tokens=output), RebuildConfig(trigger_ratio=ratio)
    )
    assert 0 <= usable <= window * ratio
    assert usable <= window - min(output or 20_000, 20_000, window // 2)


def test_model_limits_reject_nonsense() -> None:
    with pytest.raises(ConfigError, match="context_window"):
        ModelLimits(0)
    with pytest.raises(ConfigError, match="input_limit"):
        ModelLimits(1000, input_limit=-1)


def _assistant(
    usage: TokenUsage | None, *, finish: str | None = "stop", summary: bool = False
) -> Message:
    return Message(
        session_id="s",
        role="assistant",
        time_created=1,
        finish=finish,
        usage=usage,
        summary=summary,
    )


def test_r1_2_usage_tokens() -> None:
    assert (
        usage_tokens(_assistant(TokenUsage(input=10, output=5, cache_read=3, cache_write=2))) == 20
    )
    assert usage_tokens(_assistant(TokenUsage(input=10, output=5, total=99))) == 99
    # Unfinished, missing usage, summaries and users never trigger.
    assert usage_tokens(_assistant(TokenUsage(input=10), finish=None)) is None
    assert usage_tokens(_assistant(None)) is None
    assert usage_tokens(_assistant(TokenUsage(input=10**6), summary=True)) is None
    assert usage_tokens(Message(session_id="s", role="user", time_created=1)) is None
    assert usage_tokens(None) is None


@pytest.mark.parametrize(
    ("usable", "expected"),
    [
        (20_000, []),  # below 25000: no writer
        (180_000, [36_000, 72_000, 108_000, 144_000]),
        # 20/40/60% of 30000 = 6000/12000/18000; the cap is 30000 - 13000 = 17000:
        # the first over it is clamped, later ones dropped.
        (30_000, [6_000, 12_000, 17_000]),
        (400_000, [40_000 * i for i in range(1, 10)]),
        (900_000, [45_000 * i for i in range(1, 19)]),
    ],
)
def test_a3_default_threshold_schedule(usable: int, expected: list[int]) -> None:
    assert writer_thresholds(usable) == expected


def test_a3_configured_thresholds() -> None:
    config = RebuildConfig(writer=WriterConfig(thresholds=("40%", "100K", 50_000, "1.5M")))
    # 1.5M is over the cap (180000 - 13000): clamped to the cap.
    assert writer_thresholds(180_000, config) == [50_000, 72_000, 100_000, 167_000]


@given(st.integers(min_value=0, max_value=3_000_000))
def test_a3_thresholds_below_trigger_line(usable: int) -> None:
    # R1.3: the highest threshold never reaches the trigger line by itself.
    thresholds = writer_thresholds(usable)
    assert thresholds == sorted(set(thresholds))
    assert all(0 < t <= usable - 13_000 for t in thresholds)


def test_a3_due_thresholds_fire_once() -> None:
    assert due_thresholds(80_000, [36_000, 72_000, 108_000], []) == [36_000, 72_000]
    assert due_thresholds(80_000, [36_000, 72_000, 108_000], [36_000]) == [72_000]
    assert due_thresholds(80_000, [36_000, 72_000], [36_000, 72_000]) == []


@pytest.mark.parametrize(
    ("share", "level"),
    [(0.0, 0), (0.49, 0), (0.5, 1), (0.69, 1), (0.7, 2), (0.84, 2), (0.85, 3), (1.2, 3)],
)
def test_a3_pressure_levels(share: float, level: int) -> None:
    assert pressure_level(int(share * 100_000), 100_000) == level


def _stored(message_id: str, role: Role, insert_seq: int | None) -> Message:
    message = Message(id=message_id, session_id="ses_1", role=role, time_created=0)
    if insert_seq is not None:
        set_insert_seq(message, insert_seq)
    return message


def test_r1_4_recovered_by_write_order_not_ids_or_time() -> None:
    """R1.4 as amended (issue 17): the store's write order decides. A usage written
    after the boundary by a worker whose clock lags has the smaller id, yet it is
    newer: not recovered."""
    assert is_recovered(_stored("msg_0002", "assistant", 5), _stored("msg_0003", "user", 6))
    assert not is_recovered(_stored("msg_0003", "assistant", 6), _stored("msg_0002", "user", 5))
    lagging = _stored("msg_0001", "assistant", 7)  # smaller id, written later
    assert not is_recovered(lagging, _stored("msg_0003", "user", 6))
    assert is_recovered(_stored("msg_0009", "assistant", 5), _stored("msg_0003", "user", 6))
    # Never written (no write order yet): the ids decide, as within one process.
    assert is_recovered(_stored("msg_0002", "assistant", None), _stored("msg_0003", "user", None))
    assert not is_recovered(None, _stored("msg_0003", "user", 6))
    assert not is_recovered(_stored("msg_0003", "assistant", 6), None)


def test_model_limits_come_from_a_small_table_of_common_models() -> None:
    """Issue 16: the window need not be given by hand for common models."""
    assert ModelLimits.for_model("gpt-4o") == ModelLimits(128_000, max_output_tokens=16_384)
    five = ModelLimits.for_model("openai:gpt-5-2025-08-07")
    assert (five.context_window, five.input_limit) == (400_000, 272_000)
    sonnet = ModelLimits.for_model("anthropic/claude-sonnet-4-5-20250929")
    assert sonnet == ModelLimits(200_000, max_output_tokens=64_000)
    # gpt-4o-mini is its own entry, not gpt-4o's with a suffix.
    assert ModelLimits.for_model("gpt-4o-mini").context_window == 128_000
    # Explicit values win; an unknown name is a clear error naming what is known.
    assert ModelLimits.for_model("gpt-4o", context_window=64_000).context_window == 64_000
    assert ModelLimits.for_model("my-local-llm", context_window=32_000).context_window == 32_000
    with pytest.raises(ConfigError, match=r"my-local-llm.*not known.*gpt-4o"):
        ModelLimits.for_model("my-local-llm")


async def test_a_middleware_takes_a_model_name(tmp_path: Path) -> None:
    from mimo_ctx.middleware import ContextMiddleware
    from mimo_ctx.store import InMemoryStore

    mw = ContextMiddleware(InMemoryStore(), tmp_path / "m", model="claude-haiku-4-5")
    assert mw.limits.context_window == 200_000
    with pytest.raises(ConfigError, match="not known"):
        ContextMiddleware(InMemoryStore(), tmp_path / "m", model="nobody-knows-1")
