"""One soak run in a process of its own (its RSS is the soak's alone); see ``soak.py``.

``python -m benchmarks._soak_run <turns> <directory>`` prints one JSON line: the
wall time of every turn, and the RSS at every tenth of the run.

Every turn is what a host does: ``ContextMiddleware.turn()`` with a scripted
model (a main-agent tool round of about 1 500 tokens, so the 36 000-token
trigger line is crossed every ~20 turns and the session rebuilds), a user
message every tenth turn, and every 100 turns a sub-agent running three rounds
of its own. Checkpoint writers run in the background as the thresholds start
them; nothing waits for them.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import anyio

from mimo_ctx.events import ContextRebuilt, Event
from mimo_ctx.messages import Message
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.testing import ScriptedModel, ScriptStep, filler_text
from mimo_ctx.triggers import ModelLimits

LIMITS = ModelLimits(80_000, input_limit=80_000)  # usable 72 000: a rebuild every ~45 turns
TOOLS = ("read", "bash", "grep", "edit", "task_note")


class _Steps(Sequence[ScriptStep]):
    """An endless script built on demand, so the harness holds no history."""

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
        return ScriptStep(
            text="Looking further." if index % 3 == 0 else None,
            tool=TOOLS[index % len(TOOLS)],
            input={"path": f"src/module_{index % 97}.py", "n": index},
            output=filler_text(1_500, seed=index),
            error="exit status 1" if index % 29 == 0 else None,
        )


def _rss_kib() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


async def soak(turns: int, directory: Path) -> dict[str, Any]:
    rebuilds = 0

    def on_event(event: Event) -> None:
        nonlocal rebuilds
        if isinstance(event, ContextRebuilt) and event.outcome == "rebuilt":
            rebuilds += 1

    model = ScriptedModel(_Steps(), overflow_above=LIMITS.context_window)
    sub_model = ScriptedModel(_Steps(), overflow_above=LIMITS.context_window)
    durations: list[float] = []
    rss: list[tuple[int, int]] = []
    async with (
        SQLiteStore(directory / "soak.db") as store,
        ContextMiddleware(store, directory / "mem", model=LIMITS, on_event=on_event) as mw,
    ):
        session = await mw.open_session(system="You are a soak agent.", tools=[{"name": "read"}])
        sid = session.id

        async def main_call(view: RequestView) -> Message:
            reply = await model.complete(view)
            model.requests.clear()  # the harness keeps no views alive
            return reply

        async def sub_call(view: RequestView) -> Message:
            reply = await sub_model.complete(view)
            sub_model.requests.clear()
            return reply

        await mw.add_user_message(sid, "Soak: keep refactoring module by module. Never stop.")
        await mw.turn(sid, main_call)
        for turn in range(1, turns + 1):
            start = time.perf_counter()
            if turn % 10 == 0:
                await mw.add_user_message(sid, f"Instruction {turn}: keep the tests green.")
            if turn % 100 == 50:
                await mw.add_user_message(sid, f"Explore area {turn}.", agent="explore")
                for _ in range(3):
                    await mw.turn(sid, sub_call, agent="explore")
            await mw.turn(sid, main_call)
            durations.append(time.perf_counter() - start)
            if turn % max(1, turns // 10) == 0:
                gc.collect()
                rss.append((turn, _rss_kib()))
        stored = await store.count_messages(sid, agent=None)
    return {
        "turns": turns,
        "durations": durations,
        "rss": rss,
        "rebuilds": rebuilds,
        "stored": stored,
        "overflow_errors": model.overflow_errors + sub_model.overflow_errors,
    }


if __name__ == "__main__":
    figures = anyio.run(soak, int(sys.argv[1]), Path(sys.argv[2]))
    print(json.dumps(figures), flush=True)
