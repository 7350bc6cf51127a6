"""A wrapped call runs the SDK's method with no coroutine of ours around it (issue 16).

CPython walks the chain of running coroutines (their exception states) for every
exception raised inside the SDK call, and the OpenAI SDK raises and catches tens
per message while it builds a request: each coroutine a wrapper puts between the
host's await and the SDK's makes the SDK's own work slower in proportion to the
history (callgrind: +0.15% of the SDK's instructions for four of them, about 3
million instructions each at 5,000 messages). A managed ``create`` is a plain
function returning :func:`~mimo_ctx.providers._wrapper.managed_call`'s coroutine,
an object whose methods drive the SDK's coroutine: the host's await is the SDK's
caller. The real SDKs over ``httpx2.MockTransport``; the SDK's method is wrapped
at its class to see who awaits it.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import anthropic.resources.messages
import openai.resources.chat.completions
import openai.resources.responses
import pytest
from fake_servers import FakeProvider, Reply, anthropic_client, openai_client, running_middleware
from managed_calls import WAYS

from mimo_ctx.providers import wrap_anthropic, wrap_openai

_COROUTINE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE

_METHODS: dict[str, tuple[type, str]] = {
    "chat": (openai.resources.chat.completions.AsyncCompletions, "create"),
    "chat stream": (openai.resources.chat.completions.AsyncCompletions, "create"),
    "responses": (openai.resources.responses.AsyncResponses, "create"),
    "messages": (anthropic.resources.messages.AsyncMessages, "create"),
}
"""The ways in whose SDK work is one awaited method call (``messages.stream`` opens the
SDK's own stream manager instead)."""


def _between(frame: FrameType | None, host: Any) -> list[str]:
    """The coroutines from ``frame`` up to the host's call (whose code is ``host``)."""
    out: list[str] = []
    while frame is not None and frame.f_code is not host:
        if frame.f_code.co_flags & _COROUTINE:
            out.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")
        frame = frame.f_back
    assert frame is not None, "the host's call is not on the stack"
    return out


def _recording(original: Callable[..., Any], host: Any, seen: list[list[str]]) -> Any:
    async def create(self: Any, **kwargs: Any) -> Any:
        seen.append(_between(sys._getframe(1), host))  # pyright: ignore[reportPrivateUsage]
        return await original(self, **kwargs)

    return create


@pytest.mark.parametrize("way", list(_METHODS))
async def test_the_sdk_method_runs_with_no_coroutine_of_ours_around_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    provider, call = WAYS[way]
    owner, name = _METHODS[way]
    seen: list[list[str]] = []
    monkeypatch.setattr(owner, name, _recording(getattr(owner, name), call.__code__, seen))
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        if provider == "openai":
            raw: Any = openai_client(fake)
            managed = wrap_openai(raw, mw, session_id="ses_depth")
        else:
            raw = anthropic_client(fake)
            managed = wrap_anthropic(raw, mw, session_id="ses_depth")
        host: list[Any] = [{"role": "user", "content": "Read a.py."}]
        fake.add(Reply(text="Bare."))
        await call(raw, host)
        for turn in range(2):
            fake.add(Reply(text=f"Answer {turn}."))
            answer = await call(managed, host)
            assert answer == f"Answer {turn}."
            host += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"Turn {turn}."},
            ]
    bare, *wrapped = seen
    assert bare == []
    assert len(wrapped) == 2
    for between in wrapped:
        assert between == []
