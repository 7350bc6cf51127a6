"""A managed call is a coroutine object written by hand (providers/_wrapper.py,
``_ManagedCall``): it behaves as the coroutine of an ``async def`` would.

It is one to asyncio (``create_task``, ``gather``), a cancellation thrown in while
the SDK works reaches the SDK's coroutine, propagates and releases the turn (the
store's checkpoint hold), and the session goes on with the next call. The real
SDKs over ``httpx2.MockTransport``; the SDK's method is replaced at its class by
one that waits forever, to be cancelled.
"""

# The hold count is the store's own state.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import openai.resources.chat.completions
import pytest
from fake_servers import FakeProvider, Reply, openai_client, running_middleware

from mimo_ctx.providers import wrap_openai
from mimo_ctx.store.sqlite import SQLiteStore

_HOST: list[Any] = [{"role": "user", "content": "Read a.py."}]


async def test_a_managed_call_is_a_coroutine_to_asyncio(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        managed = wrap_openai(openai_client(fake), mw, session_id="ses_coro")
        fake.add(Reply(text="One."))
        call = managed.chat.completions.create(model="gpt-test", messages=list(_HOST))
        assert asyncio.iscoroutine(call)
        reply = await asyncio.create_task(call)
        assert reply.choices[0].message.content == "One."
        host: list[Any] = [
            *_HOST,
            {"role": "assistant", "content": "One."},
            {"role": "user", "content": "On."},
        ]
        fake.add(Reply(text="Two."))
        (second,) = await asyncio.gather(
            managed.chat.completions.create(model="gpt-test", messages=host)
        )
        assert second.choices[0].message.content == "Two."


async def test_a_cancelled_sdk_call_propagates_and_releases_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = openai.resources.chat.completions.AsyncCompletions
    original: Any = owner.create
    entered: list[int] = []
    cancelled: list[bool] = []

    async def hanging(self: Any, **kwargs: Any) -> Any:
        entered.append(1)
        try:
            await anyio.sleep_forever()
        except BaseException:
            cancelled.append(True)  # the cancellation reached the SDK's coroutine
            raise
        return await original(self, **kwargs)  # pragma: no cover - never reached

    fake = FakeProvider()
    async with SQLiteStore(tmp_path / "agent.db") as store:
        async with running_middleware(tmp_path, store) as mw:
            managed = wrap_openai(openai_client(fake), mw, session_id="ses_cancel")
            monkeypatch.setattr(owner, "create", hanging)
            with anyio.move_on_after(0.2) as scope:
                await managed.chat.completions.create(model="gpt-test", messages=list(_HOST))
            assert scope.cancelled_caught
            assert entered == [1]
            assert cancelled == [True]
            assert store._holds == 0
            # The session goes on: the next call sends and records as usual.
            monkeypatch.setattr(owner, "create", original)
            fake.add(Reply(text="After."))
            reply = await managed.chat.completions.create(model="gpt-test", messages=list(_HOST))
            assert reply.choices[0].message.content == "After."
            assert store._holds == 0
