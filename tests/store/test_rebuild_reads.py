"""A rebuild's store reads in one call (:mod:`mimo_ctx.store._reads`, issue 18).

The SQLite store answers them in one worker-thread call; every answer must be
the one its own methods give one call at a time (randomised sessions: several
agents, boundaries, messages off the branch, tasks, actors of every status, and
random listing keys), and the other stores are asked one method at a time.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx.messages import MAIN_AGENT, Message, message_key
from mimo_ctx.store import Actor, InMemoryStore, Session, SQLiteStore, Store, Task
from mimo_ctx.store._reads import (
    RebuildReadRequest,
    RebuildReads,
    UserRead,
    read_for_rebuild,
    read_one_by_one,
)

from .builders import T0, actor, assistant, boundary, make_session, task, user

_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
_TASK_STATUSES = ("open", "in_progress", "blocked", "done", "abandoned")


@dataclass(frozen=True, slots=True)
class _Data:
    session: Session
    messages: list[Message]
    tasks: list[Task]
    actors: list[Actor]


def _data(rng: random.Random) -> _Data:
    session = make_session()
    sid = session.id
    messages: list[Message] = []
    for i in range(rng.randint(0, 40)):
        agent = rng.choice((MAIN_AGENT, MAIN_AGENT, "explore", "review"))
        t = T0 + rng.randint(0, 30)  # clashing times: the id breaks ties
        kind = rng.random()
        if kind < 0.4:
            message = user(sid, f"user words {i}", t=t, agent=agent)
        elif kind < 0.9 or not messages:
            message = assistant(sid, f"answer {i}", t=t, agent=agent)
        else:
            message = boundary(sid, rng.choice(messages).id, t=t, agent=agent)
        if rng.random() < 0.1:
            message = message.model_copy(update={"off_branch": True})
        messages.append(message)
    tasks = [
        task(sid, f"T{i % 3 + 1}" + (f".{i}" if i > 2 else ""), status=rng.choice(_TASK_STATUSES))
        for i in range(rng.randint(0, 6))
    ]
    actors = [
        actor(
            sid,
            f"act_{i}",
            status=rng.choice(_STATUSES),
            background=rng.random() < 0.7,
            t=T0 + rng.randint(0, 5),
        )
        for i in range(rng.randint(0, 6))
    ]
    return _Data(session, messages, tasks, actors)


async def _fill(store: Store, data: _Data) -> None:
    await store.create_session(data.session)
    await store.append_messages([m.model_copy() for m in data.messages])
    for one in data.tasks:
        await store.upsert_task(one)
    for one in data.actors:
        await store.upsert_actor(one)


def _key(rng: random.Random, messages: list[Message]) -> tuple[int, str]:
    if messages and rng.random() < 0.8:
        return message_key(rng.choice(messages))
    return (T0 + rng.randint(-2, 32), "msg_")


def _request(rng: random.Random, sid: str, messages: list[Message]) -> RebuildReadRequest:
    users: list[UserRead] = []
    for _ in range(rng.randint(0, 3)):
        if rng.random() < 0.4:
            users.append(UserRead(first=rng.randint(0, 25)))
        else:
            before = _key(rng, messages) if rng.random() < 0.7 else None
            users.append(UserRead(last=rng.randint(0, 25), before=before))
    return RebuildReadRequest(
        sid,
        _key(rng, messages),
        exclude_agent=rng.choice((None, MAIN_AGENT, "explore")),
        users=tuple(users),
    )


def _dumped(reads: RebuildReads) -> object:
    return (
        [t.model_dump() for t in reads.tasks],
        [a.model_dump() for a in reads.actors],
        [m.model_dump() for m in reads.since],
        [(r, [m.model_dump() for m in ms]) for r, ms in reads.users.items()],
    )


@pytest.mark.parametrize("seed", range(25))
async def test_one_sqlite_call_answers_as_its_methods_one_by_one(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    async with SQLiteStore(tmp_path / "s.db") as store:
        calls: list[str] = []
        real: Callable[[Any], Awaitable[Any]] = store._run  # pyright: ignore[reportPrivateUsage]

        async def counting(fn: Any) -> Any:
            calls.append("call")
            return await real(fn)

        data = _data(rng)
        await _fill(store, data)
        for _ in range(8):
            request = _request(rng, data.session.id, data.messages)
            store._run = counting  # pyright: ignore[reportAttributeAccessIssue, reportPrivateUsage]
            calls.clear()
            one = await read_for_rebuild(store, request)
            assert calls == ["call"]
            store._run = real  # pyright: ignore[reportAttributeAccessIssue, reportPrivateUsage]
            assert _dumped(one) == _dumped(await read_one_by_one(store, request))


@pytest.mark.parametrize("seed", range(10))
async def test_every_store_gives_the_same_answers(seed: int, tmp_path: Path) -> None:
    # The same data in the in-memory store (asked one method at a time) and SQLite.
    rng = random.Random(seed)
    data = _data(rng)
    memory = InMemoryStore()
    await _fill(memory, data)
    async with SQLiteStore(tmp_path / "s.db") as sqlite:
        await _fill(sqlite, data)
        for _ in range(6):
            request = _request(rng, data.session.id, data.messages)
            got = await read_for_rebuild(memory, request)
            assert _dumped(got) == _dumped(await read_for_rebuild(sqlite, request))
