"""Calibrating the estimator with the providers' token-count endpoints (issue 16, build 5).

Optional and off the hot path: one count request, sent only when the host asks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from anthropic.types import MessageParam
from fake_servers import (
    COUNT_ANTHROPIC,
    COUNT_OPENAI,
    FakeProvider,
    anthropic_client,
    openai_client,
    running_middleware,
)

from mimo_ctx.providers import wrap_anthropic, wrap_openai
from mimo_ctx.providers.calibrate import (
    CalibratedEstimator,
    calibrate_anthropic,
    calibrate_openai,
)
from mimo_ctx.tokens import estimate_text_tokens

SID = "ses_calibrate"


async def test_anthropic_count_compares_the_next_request_with_the_estimate(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        history: list[MessageParam] = [
            {"role": "user", "content": "Summarise the repository in one paragraph."}
        ]
        await client.messages.create(
            model="claude-test", max_tokens=64, messages=history, system="Be brief."
        )
        calls = len(fake.requests)
        calibration = await calibrate_anthropic(client, mw, SID, model="claude-test")
        assert len(fake.requests) == calls + 1  # one count request, nothing else sent
        body = fake.bodies(COUNT_ANTHROPIC)[-1]
        assert body["system"] == "Be brief."
        assert [m["role"] for m in body["messages"]] == ["user", "assistant"]
        assert calibration.counted == len(json.dumps(body)) // 3
        view = await mw.prepare(SID)
        assert calibration.estimated == view.tokens
        assert calibration.ratio == pytest.approx(calibration.counted / view.tokens)
        counter = calibration.counter()
        assert counter.count("x" * 400) == round(
            estimate_text_tokens("x" * 400) * calibration.ratio
        )


async def test_openai_count_uses_the_responses_endpoint(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        await client.chat.completions.create(
            model="gpt-test",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi."},
            ],
        )
        calibration = await calibrate_openai(client, mw, SID, model="gpt-test")
        body = fake.bodies(COUNT_OPENAI)[-1]
        assert body["instructions"] == "Be brief."
        assert body["input"][0]["role"] == "user"
        assert calibration.counted > 0


def test_a_calibrated_estimator_needs_a_positive_ratio() -> None:
    with pytest.raises(ValueError, match="positive"):
        CalibratedEstimator(0)
