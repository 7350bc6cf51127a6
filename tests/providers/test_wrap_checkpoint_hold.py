"""A wrapped call holds the SQLite store's idle checkpoint from its start to its end.

The call writes the host's new messages, then the SDK builds its request, then
the answer is written: the store's idle checkpoint waits for the call's end
(see ``mimo_ctx._sqlite_worker``) instead of running while the SDK works. The
real SDKs over ``httpx2.MockTransport``, every way in: the fake provider reads
the store's outstanding holds while it answers; after the call (answer recorded,
stream read to its end or closed, an error) none is left.
"""

# The hold count is the store's own state.
# pyright: reportPrivateUsage=false

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_servers import (
    ErrorReply,
    FakeProvider,
    Reply,
    anthropic_client,
    openai_client,
    running_middleware,
)
from managed_calls import WAYS

from mimo_ctx.providers import wrap_anthropic, wrap_openai
from mimo_ctx.store.sqlite import SQLiteStore


def _holds_seen(fake: FakeProvider, store: SQLiteStore) -> list[int]:
    """The store's outstanding holds at each request the fake answers."""
    seen: list[int] = []

    def route(path: str, body: dict[str, Any]) -> None:
        seen.append(store._holds)

    fake.route = route
    return seen


def _client(sdk: str, fake: FakeProvider, mw: Any) -> Any:
    if sdk == "openai":
        return wrap_openai(openai_client(fake), mw, session_id="ses_hold")
    return wrap_anthropic(anthropic_client(fake), mw, session_id="ses_hold")


@pytest.mark.parametrize("way", list(WAYS))
async def test_the_call_holds_the_checkpoint_until_its_answer_is_recorded(
    tmp_path: Path, way: str
) -> None:
    sdk, call = WAYS[way]
    fake = FakeProvider()
    async with SQLiteStore(tmp_path / "agent.db") as store:
        async with running_middleware(tmp_path, store) as mw:
            seen = _holds_seen(fake, store)
            client = _client(sdk, fake, mw)
            host: list[Any] = [{"role": "user", "content": "Read a.py."}]
            for turn in range(3):
                fake.add(Reply(text=f"Answer {turn}."))
                answer = await call(client, host)
                assert answer == f"Answer {turn}."
                assert store._holds == 0
                host += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "Go on."},
                ]
            assert seen == [1, 1, 1]


@pytest.mark.parametrize("way", list(WAYS))
async def test_a_failed_call_releases_its_hold(tmp_path: Path, way: str) -> None:
    sdk, call = WAYS[way]
    fake = FakeProvider()
    async with SQLiteStore(tmp_path / "agent.db") as store:
        async with running_middleware(tmp_path, store) as mw:
            seen = _holds_seen(fake, store)
            client = _client(sdk, fake, mw)
            fake.add(ErrorReply(500, {"error": {"type": "api_error", "message": "down"}}))
            with pytest.raises(Exception, match="down"):
                await call(client, [{"role": "user", "content": "Read a.py."}])
            assert seen == [1]
            assert store._holds == 0


async def test_a_stream_holds_until_the_host_has_read_or_closed_it(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with SQLiteStore(tmp_path / "agent.db") as store:
        async with running_middleware(tmp_path, store) as mw:
            client = _client("openai", fake, mw)
            host: list[Any] = [{"role": "user", "content": "Read a.py."}]
            fake.add(Reply(text="First."), Reply(text="Second."))
            stream = await client.chat.completions.create(
                model="gpt-test", messages=host, stream=True
            )
            assert store._holds == 1  # the answer is still on its way
            async for _ in stream:
                pass
            assert store._holds == 0
            host += [
                {"role": "assistant", "content": "First."},
                {"role": "user", "content": "Go on."},
            ]
            stream = await client.chat.completions.create(
                model="gpt-test", messages=host, stream=True
            )
            await stream.close()  # the host leaves before the end
            assert store._holds == 0
