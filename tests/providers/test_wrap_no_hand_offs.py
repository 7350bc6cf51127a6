"""A wrapped call on the SQLite store hands nothing to the store's thread (issue 16).

The reconciler's commits of a call (the host's new messages, the answer) are
small writes: they run on the caller's thread when nothing waits, as a message
write does, and their rows go to the store's known change feed, so the window's
refresh after them reads nothing from the file. A hand-off costs a thread
wake-up and a loop wake-up each (~40-130 µs of CPU), about what such a write
costs itself. Large commits still go to the thread; what the feed hands back is
what a fresh store reads from the file. The real SDK over ``httpx2.MockTransport``.
"""

# The hand-off counter wraps the worker's own method.
# pyright: reportPrivateUsage=false

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_servers import FakeProvider, Reply, openai_client, running_middleware, seed_memory

from mimo_ctx._sqlite_worker import SQLiteWorker
from mimo_ctx.providers import wrap_openai
from mimo_ctx.store.sqlite import SQLiteStore


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The label of each job handed to a worker thread."""
    seen: list[str] = []
    original = SQLiteWorker._hand_off

    async def counted(self: SQLiteWorker, work: Any) -> Any:
        seen.append(self._label)
        return await original(self, work)

    monkeypatch.setattr(SQLiteWorker, "_hand_off", counted)
    return seen


async def _call(client: Any, host: list[Any]) -> str:
    reply = await client.chat.completions.create(model="gpt-test", messages=host)
    return str(reply.choices[0].message.content)


async def test_a_wrapped_call_hands_nothing_to_the_store_thread(
    tmp_path: Path, hand_offs: list[str]
) -> None:
    fake = FakeProvider()
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        async with running_middleware(tmp_path, store) as mw:
            seed_memory(mw, "ses_inline")  # the reminder's check is decided once and for all
            client = wrap_openai(openai_client(fake), mw, session_id="ses_inline")
            host: list[Any] = [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Read a.py."},
            ]
            per_call: list[int] = []
            for turn in range(6):
                fake.add(Reply(text=f"Answer {turn}."))
                before = len(hand_offs)
                answer = await _call(client, host)
                per_call.append(len(hand_offs) - before)
                host += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"Turn {turn}."},
                ]
            # The first call opens the session (reads and writes on the thread).
            assert per_call[2:] == [0, 0, 0, 0], per_call
            _, seq = await store.changes_since("ses_inline", 0)
            known, _ = await store.changes_since("ses_inline", 0)
        # What the feed handed the window is what the file holds.
        async with SQLiteStore(path) as fresh:
            stored, fresh_seq = await fresh.changes_since("ses_inline", 0)
        assert fresh_seq == seq
        assert [m.model_dump() for m in known] == [m.model_dump() for m in stored]
        assert [m.insert_seq for m in known] == [m.insert_seq for m in stored]
        texts = [m.parts[0].model_dump().get("text") for m in stored if m.parts]
        assert "Answer 5." in texts
        assert "Turn 4." in texts


async def test_a_large_commit_goes_to_the_thread(tmp_path: Path, hand_offs: list[str]) -> None:
    fake = FakeProvider()
    async with SQLiteStore(tmp_path / "agent.db") as store:
        async with running_middleware(tmp_path, store) as mw:
            seed_memory(mw, "ses_large")
            client = wrap_openai(openai_client(fake), mw, session_id="ses_large")
            host: list[Any] = [{"role": "user", "content": "Read a.py."}]
            for turn in range(2):
                fake.add(Reply(text=f"Answer {turn}."))
                host += [{"role": "assistant", "content": await _call(client, host)}]
                host += [{"role": "user", "content": f"Turn {turn}."}]
            host[-1] = {"role": "user", "content": "x" * 40_000}  # over the inline size
            fake.add(Reply(text="Long."))
            before = len(hand_offs)
            assert await _call(client, host) == "Long."
            assert hand_offs[before:] == ["SQLite store"]  # the user's message, not the answer
            listed = await store.list_messages("ses_large")
            assert any(p.model_dump().get("text") == "x" * 40_000 for m in listed for p in m.parts)
