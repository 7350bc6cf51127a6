"""The soak run (issue 10 §5): a long scripted session with periodic rebuilds and
sub-agents, on the SQLite store, in a process of its own.

Run by ``test_soak.py`` as ``python _soak.py <turns> <directory>``; prints one JSON
line of figures. In its own process the peak RSS it reports is the soak's alone.

Every turn: a user message now and then, a main-agent tool round of about 1 500
tokens (so the 36 000-token trigger line is crossed every ~20 turns), and every
100 turns a sub-agent runs three rounds of its own. Every request the model
receives is converted to the OpenAI Chat payload and checked by the provider
validator; the stored message count is checked never to decrease.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import anyio

from mimo_ctx.events import ContextRebuilt, Event
from mimo_ctx.messages import Message
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.store import SQLiteStore
from mimo_ctx.store.base import Actor, Task
from mimo_ctx.testing import ScriptedModel, ScriptStep, filler_text
from mimo_ctx.triggers import ModelLimits

LIMITS = ModelLimits(40_000, input_limit=40_000)  # usable 36 000
TOOLS = ("read", "bash", "grep", "edit", "task_note")  # task_note: not micro-compacted


class _Steps(Sequence[ScriptStep]):
    """An endless script built on demand, so the harness itself holds no history."""

    def __len__(self) -> int:
        return sys.maxsize

    @overload
    def __getitem__(self, index: int) -> ScriptStep: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ScriptStep]: ...
    def __getitem__(self, index: int | slice) -> ScriptStep | Sequence[ScriptStep]:
        if isinstance(index, slice):
            raise TypeError("the soak script is not sliceable")
        if index % 7 == 6:
            return ScriptStep(text=f"Progress report {index}: {filler_text(60, seed=index)}")
        tool = TOOLS[index % len(TOOLS)]
        return ScriptStep(
            text="Looking further." if index % 3 == 0 else None,
            tool=tool,
            input={"path": f"src/module_{index % 97}.py", "n": index},
            output=filler_text(1_500, seed=index),
            error="exit status 1" if index % 29 == 0 else None,
        )


def _rss_kib() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def soak(turns: int, directory: Path) -> dict[str, Any]:
    started = time.perf_counter()
    fds_start, tasks_start = _fds(), len(asyncio.all_tasks())
    store = await SQLiteStore.open(directory / "soak.db")
    rebuilds: list[ContextRebuilt] = []

    def on_event(event: Event) -> None:
        if isinstance(event, ContextRebuilt):
            rebuilds.append(event)

    model = ScriptedModel(_Steps(), overflow_above=LIMITS.context_window)
    sub_model = ScriptedModel(_Steps(), overflow_above=LIMITS.context_window)
    figures: dict[str, Any] = {"turns": turns}
    validated = 0
    count = previous = 0
    max_request = 0
    async with ContextMiddleware(store, directory / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(
            system="You are a soak-test agent.", tools=[{"name": "read"}]
        )
        sid = session.id

        async def send(view: RequestView, to: ScriptedModel) -> Message:
            nonlocal validated, max_request
            payload = to_openai_chat(view.messages, system=view.prefix.system)
            validate_request(payload, format="openai-chat")
            validated += 1
            max_request = max(max_request, view.tokens)
            reply = await to.complete(view)
            to.requests.clear()  # the harness keeps no views alive
            return reply

        async def main_call(view: RequestView) -> Message:
            return await send(view, model)

        async def sub_call(view: RequestView) -> Message:
            return await send(view, sub_model)

        await mw.add_user_message(sid, "Soak: keep refactoring module by module. Never stop.")
        await mw.turn(sid, main_call)
        baseline_fds, baseline_tasks = _fds(), len(asyncio.all_tasks())
        baseline_threads = threading.active_count()
        rss_marks: dict[str, int] = {}
        # (turn, seconds, RSS KiB, open fds, live Python blocks after a collection)
        samples: list[tuple[int, float, int, int, int]] = []
        for turn in range(1, turns + 1):
            if turn % 10 == 0:
                await mw.add_user_message(sid, f"Instruction {turn}: also keep the tests green.")
            if turn % 100 == 50:
                await mw.add_user_message(sid, f"Explore area {turn}.", agent="explore")
                for _ in range(3):
                    await mw.turn(sid, sub_call, agent="explore")
            if turn % 250 == 0:
                now = time.time_ns() // 1_000_000
                await store.upsert_task(
                    Task(
                        id=f"T{turn // 250}",
                        session_id=sid,
                        summary=f"Phase {turn}",
                        time_created=now,
                        time_updated=now,
                        status="in_progress",
                    )
                )
                await store.upsert_actor(
                    Actor(
                        id=f"actor_{turn}",
                        session_id=sid,
                        agent="explore",
                        description=f"Background job {turn}",
                        status="running",
                        time_created=now,
                        time_last_activity=now,
                    )
                )
            await mw.turn(sid, main_call)
            # Let a finished writer's follow-up run, without waiting on a slow one.
            await mw.wait_for_writer(sid, timeout=5)
            count = await store.count_messages(sid, agent=None)
            if count < previous:
                raise AssertionError(
                    f"turn {turn}: stored messages went from {previous} to {count}"
                )
            previous = count
            if turn == max(1, turns // 5):
                rss_marks["early"] = _rss_kib()
            if turn % max(1, turns // 10) == 0:
                gc.collect()
                elapsed = round(time.perf_counter() - started, 1)
                samples.append((turn, elapsed, _rss_kib(), _fds(), sys.getallocatedblocks()))
        rss_marks["end"] = _rss_kib()
        figures.update(
            fds_before=baseline_fds,
            fds_after=_fds(),
            tasks_before=baseline_tasks,
            tasks_after=len(asyncio.all_tasks()),
            threads_before=baseline_threads,
            threads_after=threading.active_count(),
            writer_in_flight=mw.writer_running(sid),
            samples=samples,
        )
    tasks_closed = len(asyncio.all_tasks())  # the middleware's task group has ended
    boundaries = [m for m in await store.list_messages(sid, agent=None) if m.is_boundary]
    figures.update(
        seconds=round(time.perf_counter() - started, 1),
        requests_validated=validated,
        stored_messages=count,
        main_messages=await store.count_messages(sid, agent="main"),
        sub_agent_messages=await store.count_messages(sid, agent="explore"),
        boundaries=len(boundaries),
        rebuilds=sum(e.outcome == "rebuilt" for e in rebuilds),
        compactions=sum(e.outcome == "compacted" for e in rebuilds),
        rebuild_events=len(rebuilds),
        overflow_errors=model.overflow_errors + sub_model.overflow_errors,
        max_request_tokens=max_request,
        rss_early_kib=rss_marks["early"],
        rss_end_kib=rss_marks["end"],
        peak_rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        db_bytes=(directory / "soak.db").stat().st_size,
    )
    await store.aclose()
    figures.update(
        fds_start=fds_start, fds_closed=_fds(), tasks_start=tasks_start, tasks_closed=tasks_closed
    )
    return figures


if __name__ == "__main__":
    result = anyio.run(soak, int(sys.argv[1]), Path(sys.argv[2]))
    print(json.dumps(result), flush=True)
