"""Checkpoint-writer run cost at 1k, 5k and 20k stored messages, and the event loop meanwhile.

Each session lives on the SQLite store with the default (offline) writer: its
history of main-agent messages (a user turn every tenth, tool rounds of ~700
characters of output), a rebuild boundary leaving the newest 500 messages live,
and a checkpoint the writer wrote earlier (its state beside it, the watermark
set). Timed: one writer run after 20 new messages, as the usage thresholds
start it -- ``start_writer`` then ``wait_for_writer``: placing the watermark,
reading what the writer gets, building, writing ``checkpoint.md`` and its
state, persisting the watermark. The sessions of the three sizes take turns
(interleaved), several runs each.

While a run is in flight a heartbeat task sleeps 1 ms again and again and
records how late it wakes: the loop's longest stall. A stall is charged to the
writer as far as the process's threads ran during it (code on the loop thread,
or the writer's thread holding the GIL); the wall-clock stall is printed too (on
a shared machine the whole process is sometimes not scheduled, which no code of
ours causes). The heartbeat goes on for a moment after each run, while what the
run set off (the memory index of the files it wrote) runs; the longest stall and
the 99th percentile of every beat are reported. The same heartbeat over idle
stretches of the same length gives the machine's own noise.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.sqlite import SQLiteStore

from ._common import Samples, Target, fmt_ms, fmt_num, fmt_ratio, result, settle_heap, table
from .hot_path import (
    HUGE,
    _build,  # pyright: ignore[reportPrivateUsage]
    _Stored,  # pyright: ignore[reportPrivateUsage]
    _Text,  # pyright: ignore[reportPrivateUsage]
    make_message,
)

__all__ = ["NAME", "TITLE", "run"]

NAME = "writer"
TITLE = "Checkpoint-writer runs at 1k / 5k / 20k stored messages"


@dataclass(frozen=True, slots=True)
class _Plan:
    sizes: tuple[int, ...]
    window: int
    new: int  # messages added before each run
    runs: int  # runs per size


FULL = _Plan(sizes=(1_000, 5_000, 20_000), window=500, new=20, runs=9)
QUICK = _Plan(sizes=(150, 300), window=60, new=6, runs=2)


@dataclass(slots=True)
class _Heartbeat:
    """How late a 1 ms sleep wakes, and how much of the delay our own threads ran."""

    running: bool = True
    stall: float = 0.0
    stall_cpu: float = 0.0
    charged: list[float] = field(default_factory=list[float])

    async def beat(self) -> None:
        while self.running:
            start, cpu = time.perf_counter(), time.process_time()
            await anyio.sleep(0.001)
            late = time.perf_counter() - start - 0.001
            self.stall = max(self.stall, late)
            # Our process's threads ran for at most this long of the delay: the loop
            # thread's own code, or a worker thread holding the GIL. The rest of a
            # late wake-up is the machine not running the process at all.
            charged = min(late, time.process_time() - cpu)
            self.stall_cpu = max(self.stall_cpu, charged)
            self.charged.append(charged)


AFTER = 0.05
"""Seconds the heartbeat goes on after a run: what it set off (the memory index of
the files it wrote, in the middleware's background) stalls the loop then."""


def _p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank); 0 without values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


@dataclass(slots=True)
class _Size:
    stored: _Stored
    middleware: ContextMiddleware
    store: SQLiteStore
    runs: list[tuple[float, float]] = field(default_factory=list[tuple[float, float]])
    stall: float = 0.0
    stall_cpu: float = 0.0
    charged: list[float] = field(default_factory=list[float])  # every beat's, all runs
    nominal: int = 0  # stored messages when the timed runs began


async def _append_new(size: _Size, text: _Text, counter: itertools.count[int], new: int) -> None:
    now = time.time_ns() // 1_000_000
    messages = [
        make_message(text, size.stored.session_id, next(counter), now + i, fresh=True)
        for i in range(new)
    ]
    await size.middleware.append(messages)
    size.stored.main.extend((m.id, m.time_created) for m in messages)


async def _one_run(size: _Size) -> None:
    sid = size.stored.session_id
    beat = _Heartbeat()
    async with anyio.create_task_group() as group:
        group.start_soon(beat.beat)
        await anyio.sleep(0.005)  # the heartbeat is ticking
        start, cpu = time.perf_counter(), time.process_time()
        started = await size.middleware.start_writer(sid, reason="bench")
        outcome = await size.middleware.wait_for_writer(sid, timeout=120)
        size.runs.append((time.perf_counter() - start, time.process_time() - cpu))
        await anyio.sleep(AFTER)
        beat.running = False
        assert started == "started", started
        assert outcome == "finished", outcome
    size.stall = max(size.stall, beat.stall)
    size.stall_cpu = max(size.stall_cpu, beat.stall_cpu)
    size.charged.extend(beat.charged)


async def _idle_noise(seconds: float) -> _Heartbeat:
    beat = _Heartbeat()
    async with anyio.create_task_group() as group:
        group.start_soon(beat.beat)
        await anyio.sleep(seconds)
        beat.running = False
    return beat


async def _run(plan: _Plan) -> dict[str, Any]:
    text = _Text()
    directory = Path(tempfile.mkdtemp(prefix="mimo-ctx-bench-writer-"))
    counter = itertools.count(10_000_000)
    sizes: list[_Size] = []
    idle: list[_Heartbeat] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            for stored_count in plan.sizes:
                stored = await _build(directory, text, stored_count, plan.window)
                store = await stack.enter_async_context(SQLiteStore(stored.path))
                middleware = await stack.enter_async_context(
                    ContextMiddleware(store, directory / f"memory-{stored_count}", model=HUGE)
                )
                size = _Size(stored, middleware, store)
                await middleware.prepare(stored.session_id)
                # A writer ran before: a checkpoint, its state and a watermark exist.
                await _append_new(size, text, counter, plan.new)
                await _one_run(size)
                size.runs.clear()
                size.charged.clear()
                size.stall = size.stall_cpu = 0.0
                size.nominal = len(stored.main)
                sizes.append(size)
            settle_heap()
            for _ in range(plan.runs):
                for size in sizes:  # interleaved: the sizes take turns
                    await _append_new(size, text, counter, plan.new)
                    await _one_run(size)
                    idle.append(await _idle_noise(size.runs[-1][0] + AFTER))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _report(plan, sizes, idle)


def _report(plan: _Plan, sizes: list[_Size], idle: list[_Heartbeat]) -> dict[str, Any]:
    rows: list[list[str]] = []
    data: dict[str, Any] = {"sizes": []}
    for size in sizes:
        runs = Samples.of(size.runs)
        rows.append(
            [
                fmt_num(size.nominal),
                fmt_ms(runs.median),
                fmt_ms(runs.minimum),
                fmt_ms(runs.cpu_median),
                fmt_ms(runs.p90),
                fmt_ms(size.stall),
                fmt_ms(size.stall_cpu),
                fmt_ms(_p99(size.charged)),
            ]
        )
        data["sizes"].append(
            {
                "stored": size.nominal,
                "runs": runs.to_json(),
                "stall_ms": size.stall * 1000,
                "stall_cpu_ms": size.stall_cpu * 1000,
                "stall_cpu_p99_ms": _p99(size.charged) * 1000,
            }
        )
    idle_stall = max((b.stall for b in idle), default=0.0)
    idle_cpu = max((b.stall_cpu for b in idle), default=0.0)
    idle_p99 = _p99([c for b in idle for c in b.charged])
    charged_p99 = _p99([c for size in sizes for c in size.charged])
    main = table(
        f"One writer run after {plan.new} new messages (median of {plan.runs} runs per size, "
        "sizes interleaved)",
        [
            "stored msgs (at the first run)",
            "run median",
            "min",
            "CPU median",
            "p90",
            "loop's longest stall (wall)",
            "of it, our threads running",
            "p99 of our threads' part",
        ],
        rows,
    )
    first, last = Samples.of(sizes[0].runs), Samples.of(sizes[-1].runs)
    ratio = last.median / first.median
    cpu_ratio = last.cpu_median / first.cpu_median
    stall_cpu = max(s.stall_cpu for s in sizes)
    stall = max(s.stall for s in sizes)
    targets = [
        Target(
            f"writer run at {fmt_num(sizes[-1].nominal)} stored vs {fmt_num(sizes[0].nominal)}",
            "within 1.5×",
            fmt_ratio(ratio),
            ratio <= 1.5,
            ratio=ratio,
            note=f"ratio of CPU medians {fmt_ratio(cpu_ratio)}",
        ),
        Target(
            "event loop blocked by a writer",
            "≤ 10 ms",
            fmt_ms(stall_cpu),
            stall_cpu <= 0.010,
            ratio=stall_cpu / 0.010,
            note=f"longest wall-clock stall {fmt_ms(stall)}, p99 {fmt_ms(charged_p99)}; idle "
            f"machine noise over as long: {fmt_ms(idle_stall)} wall, {fmt_ms(idle_cpu)} with our "
            f"threads running, p99 {fmt_ms(idle_p99)}",
        ),
    ]
    notes = [
        f"Each session: its history, a boundary leaving the newest {plan.window} messages "
        "live, a checkpoint (with the offline writer's state) from an earlier run; before "
        f"each timed run {plan.new} new messages are appended.",
        "A run = start_writer() to wait_for_writer() returning: watermark, the writer's "
        "request (what the model sees: messages after the previous watermark or the newest "
        "boundary), the offline build (in a worker thread), checkpoint.md and its state "
        "written, the watermark persisted.",
        "Stall: the latest a 1 ms heartbeat woke while the run was in flight; charged to the "
        "writer as far as the process's threads ran during it (the loop's own code, or the "
        "writer's thread holding the GIL); the heartbeat goes on for "
        f"{AFTER * 1000:g} ms after each run, while what the run set off (the memory index "
        "of the files it wrote) runs. p99: over every beat of every run. Idle noise: the same "
        "heartbeat with no writer, for as long as each run (and what followed it) took.",
    ]
    data["idle_stall_ms"] = idle_stall * 1000
    data["idle_stall_cpu_ms"] = idle_cpu * 1000
    data["idle_stall_cpu_p99_ms"] = idle_p99 * 1000
    data["stall_cpu_p99_ms"] = charged_p99 * 1000
    data["ratio"] = ratio
    return result(NAME, TITLE, tables=[main], targets=targets, notes=notes, data=data)


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the writer benchmark (``quick``: small sessions, two runs each)."""
    return anyio.run(_run, QUICK if quick else FULL)
