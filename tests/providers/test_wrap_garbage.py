"""A managed call leaves no garbage for the cycle collector (issue 16, O(new) per call).

Each call builds an O(history) payload and holds an O(history) request view while
it runs. Left in a reference cycle, they would stay alive after the call until a
collection of their generation, and every collection meanwhile would walk both
lists (two whole-history walks per collection, on the SDK's time and ours). Freed
by reference counting, they are gone the moment the call returns. The real SDKs,
over ``httpx2.MockTransport``, every managed way in.
"""

from __future__ import annotations

import gc
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fake_servers import FakeProvider, Reply, anthropic_client, openai_client, running_middleware
from managed_calls import WAYS

from mimo_ctx.providers import wrap_anthropic, wrap_openai


@contextmanager
def _cyclic_garbage() -> Generator[list[object]]:
    """What becomes cyclic garbage inside the block (the collector paused meanwhile)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    found: list[object] = []
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found.extend(gc.garbage)
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
    finally:
        if enabled:
            gc.enable()


def _ours(objects: list[object]) -> list[str]:
    """The names of mimo_ctx's own types among ``objects`` (a call's turn, its request
    view, its recovering call: what a cycle through a call keeps alive)."""
    names: list[str] = []
    for value in objects:
        module = type(value).__module__
        if module.startswith("mimo_ctx"):
            names.append(type(value).__qualname__)
    return sorted(names)


@pytest.mark.parametrize("way", list(WAYS))
async def test_a_managed_call_leaves_no_cyclic_garbage(tmp_path: Path, way: str) -> None:
    sdk, call = WAYS[way]
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        if sdk == "openai":
            client: Any = wrap_openai(openai_client(fake), mw, session_id="ses_gc")
        else:
            client = wrap_anthropic(anthropic_client(fake), mw, session_id="ses_gc")
        host: list[Any] = [{"role": "user", "content": "Read a.py."}]
        for turn in range(3):
            fake.add(Reply(text=f"Answer {turn}."))
            answer = await call(client, host)
            host += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "Go on."},
            ]
        fake.add(Reply(text="The last answer."))
        with _cyclic_garbage() as garbage:
            assert await call(client, host) == "The last answer."
        assert _ours(garbage) == []
