"""A rebuild reads the main agent's messages from the live window, not the store (R4, R5).

The rebuild needs every agent's messages from the watermark on (the tail and what
micro-compaction clears). When the live window reaches back to the watermark, the
main agent's come from it and only the sub-agents' are read; randomised sessions --
sub-agent messages in between, back-dated messages, updates, earlier boundaries --
check that the result is exactly what the store listing gives.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mimo_ctx.messages import MAIN_AGENT, Message, Role, TextPart, TokenUsage, message_key
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.rebuild import build_boundary_message
from mimo_ctx.store import InMemoryStore, SQLiteStore, Store
from mimo_ctx.triggers import ModelLimits


def _message(rng: random.Random, sid: str, t: int, step: int) -> Message:
    agent = MAIN_AGENT if rng.random() < 0.75 else rng.choice(["sub-1", "sub-2"])
    role: Role = rng.choice(["user", "assistant"])
    return Message(
        session_id=sid,
        role=role,
        agent=agent,
        time_created=t,
        finish="stop" if role == "assistant" else None,
        usage=TokenUsage(input=10) if role == "assistant" else None,
        parts=[TextPart(text=f"{role} {step} " + "w" * rng.randint(0, 40))],
    )


async def _scenario(seed: int, store: Store, root: Path) -> None:
    rng = random.Random(seed)
    async with ContextMiddleware(store, root, model=ModelLimits(10_000_000)) as mw:
        session = await mw.open_session(system="sys")
        sid = session.id
        now = 1_700_000_000_000
        stored: list[Message] = []
        for step in range(rng.randint(20, 260)):
            now += rng.randint(0, 3)
            t = now if rng.random() > 0.1 else now - rng.randint(1, 40)
            message = _message(rng, sid, t, step)
            await mw.append([message])
            stored.append(message)
            if rng.random() < 0.05:
                old = rng.choice(stored)
                edited = old.model_copy(update={"parts": [*old.parts, TextPart(text="edit")]})
                await store.update_messages([edited])
                stored[stored.index(old)] = edited
            if rng.random() < 0.02 and len(stored) > 4:
                main = sorted((m for m in stored if m.agent == MAIN_AGENT), key=message_key)
                if len(main) > 2:
                    watermark = main[rng.randrange(len(main) - 1)]
                    boundary = build_boundary_message(
                        watermark=watermark,
                        digest_up_to=None,
                        directory="d",
                        number=1,
                        index_text="i",
                        body="b",
                        actors_text="a",
                        newer_than=max(m.id for m in stored),
                    )
                    await store.commit_rebuild(
                        sid, usage_key=f"k{step}", boundary=boundary, updated=[]
                    )
                    stored.append(boundary)
            if rng.random() < 0.2:
                await mw.prepare(sid)
        await mw.prepare(sid)
        state = mw._sessions[sid]  # pyright: ignore[reportPrivateUsage]
        rebuilder = mw._rebuilder  # pyright: ignore[reportPrivateUsage]
        main = sorted((m for m in stored if m.agent == MAIN_AGENT), key=message_key)
        for watermark in rng.sample(main, min(len(main), 12)):
            read = await rebuilder._read(sid, state, watermark.id)  # pyright: ignore[reportPrivateUsage]
            assert read is not None
            held, listed = read[0], read[1]
            # The watermark as the store has it (from the window when it holds it).
            assert held.model_dump() == watermark.model_dump()
            want = await store.list_messages(sid, agent=None, since=message_key(watermark))
            # The watermark itself may be left out (nothing downstream reads it).
            got = [m for m in listed if m.id != watermark.id]
            assert [m.model_dump() for m in got] == [
                m.model_dump() for m in want if m.id != watermark.id
            ], (seed, watermark.id)


@pytest.mark.parametrize("seed", range(12))
async def test_r5_rebuild_inputs_from_the_window_equal_the_store_memory(
    seed: int, tmp_path: Path
) -> None:
    await _scenario(seed, InMemoryStore(), tmp_path / "mem")


@pytest.mark.parametrize("seed", range(3))
async def test_r5_rebuild_inputs_from_the_window_equal_the_store_sqlite(
    seed: int, tmp_path: Path
) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        await _scenario(500 + seed, store, tmp_path / "mem")


async def test_a_rebuild_reads_the_store_once_before_it_renders(tmp_path: Path) -> None:
    # Tasks, actors, the sub-agents' messages and the user messages the window does
    # not hold were read in one worker-thread call each (four to six hand-offs).
    async with (
        SQLiteStore(tmp_path / "s.db") as store,
        ContextMiddleware(store, tmp_path / "mem", model=ModelLimits(10_000_000)) as mw,
    ):
        session = await mw.open_session(system="sys")
        sid = session.id
        rng = random.Random(7)
        messages = [_message(rng, sid, 1_700_000_000_000 + i, i) for i in range(60)]
        await mw.append(messages)
        main = [m for m in messages if m.agent == MAIN_AGENT]
        await store.set_watermark(sid, main[len(main) // 2].id)
        checkpoint = mw.layout.checkpoint_path(sid)
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_text("Topic: t\n\n## Current intent\n_intent_\n- go on\n")
        await mw.prepare(sid)
        one_by_one: list[str] = []
        for name in ("list_tasks", "list_actors", "list_user_messages", "list_messages"):
            real = getattr(store, name)

            async def recording(
                *args: object, _name: str = name, _real: object = real, **kw: object
            ) -> object:
                one_by_one.append(_name)
                return await _real(*args, **kw)  # pyright: ignore[reportCallIssue, reportUnknownVariableType]

            setattr(store, name, recording)
        report = await mw.rebuild(sid, manual=True)
        assert report.outcome == "rebuilt"
        assert one_by_one == []
