"""Full turn per turn shape: ``record()`` (and the host's appends) plus ``prepare()``.

A history of 5,000 stored messages on the SQLite store, with a boundary whose
watermark leaves a live window of 500 messages (~150k estimated tokens); the
model window is huge, so no rebuild or writer runs while timing. Each shape is
what a host produces for one model turn:

* **tool loop**: one ``record()`` of an assistant message whose tool call holds
  its result (the native shape), no user message for turns on end;
* **split result**: ``record()`` of the assistant's call, then the result as its
  own ``role="tool"`` message (what the provider wrappers store);
* **update**: the answer recorded when its stream starts (call pending, no usage
  yet) and recorded again when it ends (call completed, usage): an update of a
  stored message;
* **user turn**: a user message, then a streamed text answer recorded at the end.

Timed per turn: the shape's writes through the middleware and the next
``prepare()``, together (the full turn) and apart (``record`` / ``prepare``).
Interleaved with each timed turn, on the same window and the same new messages:

* **(i)** a host re-estimating from ``json.dumps`` of the plain dicts it holds
  (the Chat Completions messages): the cheapest honest way to count;
* **(ii)** LangChain 1.x's ``SummarizationMiddleware`` (trigger not firing) plus
  ``ContextEditingMiddleware`` with ``ClearToolUsesEdit`` on the same messages as
  a LangChain agent holds them (skipped with a note when langchain is absent).

The window is reset to 500 messages every few turns (a new boundary, untimed),
and the shapes take turns block by block (a block of each shape per reset round),
so a busy spell of a shared machine falls on every shape alike.
"""

from __future__ import annotations

import gc
import itertools
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx.messages import (
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStatePending,
    ToolTime,
    new_message_id,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.store.sqlite import SQLiteStore

from ._common import Samples, Target, fmt_ms, fmt_num, fmt_ratio, result, settle_heap, table
from .hot_path import (
    HUGE,
    _build,  # pyright: ignore[reportPrivateUsage]
    _langchain_available,  # pyright: ignore[reportPrivateUsage]
    _LangChainPair,  # pyright: ignore[reportPrivateUsage]
    _prefix,  # pyright: ignore[reportPrivateUsage]
    _reset_window,  # pyright: ignore[reportPrivateUsage]
    _Stored,  # pyright: ignore[reportPrivateUsage]
    _Text,  # pyright: ignore[reportPrivateUsage]
    _window_messages,  # pyright: ignore[reportPrivateUsage]
    to_langchain,
)

__all__ = ["NAME", "SHAPES", "TITLE", "run"]

NAME = "turns"
TITLE = "Full turn per turn shape: record() + prepare(), 500-message window"

SHAPES = ("tool loop", "split result", "update", "user turn")


@dataclass(frozen=True, slots=True)
class _Plan:
    stored: int
    window: int
    resets: int
    turns: int


FULL = _Plan(stored=5_000, window=500, resets=10, turns=25)
QUICK = _Plan(stored=200, window=60, resets=2, turns=3)


# --------------------------------------------------------------------------- shapes


def _assistant(
    text: _Text, session_id: str, index: int, *, done: bool, finished: bool = True
) -> Message:
    now = time.time_ns() // 1_000_000
    state: ToolStateCompleted | ToolStatePending = (
        ToolStateCompleted(
            input={"path": f"src/module_{index % 97}.py", "limit": 200},
            output=text.code_slice(index, 700),
            time=ToolTime(start=now, end=now + 3),
        )
        if done
        else ToolStatePending(input={"path": f"src/module_{index % 97}.py", "limit": 200})
    )
    return Message(
        id=new_message_id(),
        session_id=session_id,
        role="assistant",
        time_created=now,
        time_completed=now + 5 if finished else None,
        finish="tool-calls" if finished else None,
        model="bench",
        usage=TokenUsage(input=100_000, output=200) if finished else None,
        parts=[
            TextPart(text=text.prose_slice(index + 3, 120)),
            ToolPart(call_id=f"call_{index}", tool="read", state=state),
        ],
    )


@dataclass(frozen=True, slots=True)
class _Turn:
    """One turn: the middleware's writes, in order, and the messages as they end up."""

    writes: list[tuple[str, Message]]  # ("record" | "append", message)
    final: list[Message]  # what the host holds after the turn


def _turn(shape: str, text: _Text, session_id: str, index: int) -> _Turn:
    if shape == "tool loop":
        message = _assistant(text, session_id, index, done=True)
        return _Turn([("record", message)], [message])
    if shape == "split result":
        call = _assistant(text, session_id, index, done=False)
        now = time.time_ns() // 1_000_000
        result_message = Message(
            id=new_message_id(),
            session_id=session_id,
            role="tool",
            time_created=now,
            parts=[
                ToolResultPart(
                    call_id=f"call_{index}", tool="read", output=text.code_slice(index, 700)
                )
            ],
        )
        return _Turn([("record", call), ("append", result_message)], [call, result_message])
    if shape == "update":
        started = _assistant(text, session_id, index, done=False, finished=False)
        done = _assistant(text, session_id, index, done=True).model_copy(
            update={"id": started.id, "time_created": started.time_created}
        )
        return _Turn([("record", started), ("record", done)], [done])
    now = time.time_ns() // 1_000_000
    user = Message(
        id=new_message_id(),
        session_id=session_id,
        role="user",
        time_created=now,
        parts=[TextPart(text=text.prose_slice(index, 420))],
    )
    answer = Message(
        id=new_message_id(),
        session_id=session_id,
        role="assistant",
        time_created=now,
        time_completed=now + 5,
        finish="stop",
        model="bench",
        usage=TokenUsage(input=100_000, output=300),
        parts=[TextPart(text=text.prose_slice(index + 7, 900))],
    )
    return _Turn([("append", user), ("record", answer)], [user, answer])


# --------------------------------------------------------------------------- timing


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - start[0], time.process_time() - start[1]


def _baseline_i(messages: list[dict[str, Any]]) -> int:
    """(i): re-estimate the whole request from the JSON of the dicts the host holds."""
    return len(json.dumps(messages, ensure_ascii=False, separators=(",", ":"))) // 4


@dataclass(slots=True)
class _ShapeTimings:
    turn: list[tuple[float, float]]
    record: list[tuple[float, float]]
    prepare: list[tuple[float, float]]
    base_i: list[tuple[float, float]]
    base_ii: list[tuple[float, float]]
    # Per full turn: the CPU time of the event loop's thread, and of every other
    # thread (the store's worker thread), which together make the process's.
    loop_cpu: list[float] = field(default_factory=list[float])
    other_cpu: list[float] = field(default_factory=list[float])
    view_messages: int = 0


async def _measure_block(
    middleware: ContextMiddleware,
    store: SQLiteStore,
    stored: _Stored,
    text: _Text,
    plan: _Plan,
    shape: str,
    counter: itertools.count[int],
    pair: _LangChainPair | None,
    timings: _ShapeTimings,
) -> None:
    """One block of ``plan.turns`` turns of ``shape`` on a window reset to ``plan.window``."""
    sid = stored.session_id
    await _reset_window(store, text, stored, plan.window)
    view = await middleware.prepare(sid)  # untimed: loads the new window
    timings.view_messages = len(view.messages)
    window = await _window_messages(store, stored, plan.window)
    host = to_openai_chat(window)
    chain = to_langchain(window) if pair is not None else []
    for _turn_number in range(plan.turns):
        turn = _turn(shape, text, sid, next(counter))
        gc.disable()
        try:
            loop_start = time.thread_time()
            start = _clock()
            for kind, message in turn.writes:
                if kind == "record":
                    await middleware.record(message)
                else:
                    await middleware.append([message])
            wrote = _since(start)
            between = _clock()
            await middleware.prepare(sid)
            prepared = _since(between)
            loop_cpu = time.thread_time() - loop_start
        finally:
            gc.enable()
        timings.loop_cpu.append(loop_cpu)
        timings.other_cpu.append(max(0.0, wrote[1] + prepared[1] - loop_cpu))
        stored.main.extend((m.id, m.time_created) for m in turn.final)
        timings.record.append(wrote)
        timings.prepare.append(prepared)
        timings.turn.append((wrote[0] + prepared[0], wrote[1] + prepared[1]))
        # The baselines, interleaved: the same turn on the same window.
        host.extend(to_openai_chat(turn.final))
        gc.disable()
        try:
            start = _clock()
            _baseline_i(host)
            timings.base_i.append(_since(start))
        finally:
            gc.enable()
        if pair is not None:
            chain.extend(to_langchain(turn.final))
            gc.disable()
            try:
                start = _clock()
                pair.turn(chain)
                timings.base_ii.append(_since(start))
            finally:
                gc.enable()


async def _run(plan: _Plan) -> dict[str, Any]:
    text = _Text()
    langchain = _langchain_available()
    directory = Path(tempfile.mkdtemp(prefix="mimo-ctx-bench-turns-"))
    shapes = {shape: _ShapeTimings([], [], [], [], []) for shape in SHAPES}
    try:
        stored = await _build(directory, text, plan.stored, plan.window)
        memory_root = directory / "memory"
        session_dir = memory_root / "sessions" / stored.session_id
        session_dir.mkdir(parents=True)
        # After a rebuild the session has a checkpoint, so the per-turn reminder is on.
        (session_dir / "checkpoint.md").write_text("Topic: bench\n", encoding="utf-8")
        pair = _LangChainPair(_prefix(text).system) if langchain else None
        counter = itertools.count(plan.stored)
        async with (
            SQLiteStore(stored.path) as store,
            ContextMiddleware(store, memory_root, model=HUGE) as middleware,
        ):
            await middleware.prepare(stored.session_id)
            settle_heap()
            # The shapes take turns block by block, so a busy spell of the machine
            # falls on every shape alike rather than on whichever ran then.
            for _block in range(plan.resets):
                for shape in SHAPES:
                    await _measure_block(
                        middleware, store, stored, text, plan, shape, counter, pair, shapes[shape]
                    )
        gc.unfreeze()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _report(plan, shapes, langchain)


def _report(plan: _Plan, shapes: dict[str, _ShapeTimings], langchain: bool) -> dict[str, Any]:
    rows: list[list[str]] = []
    worst_i: tuple[float, str] = (float("inf"), "")
    worst_ii: tuple[float, str] = (float("inf"), "")
    worst_cpu_i = worst_min_i = worst_cpu_ii = worst_min_ii = float("inf")
    data: dict[str, Any] = {}
    for shape, t in shapes.items():
        turn, record, prepare = Samples.of(t.turn), Samples.of(t.record), Samples.of(t.prepare)
        base_i = Samples.of(t.base_i)
        base_ii = Samples.of(t.base_ii) if t.base_ii else None
        ratio_i = base_i.median / turn.median
        ratio_ii = base_ii.median / turn.median if base_ii is not None else None
        cpu_i = base_i.cpu_median / turn.cpu_median
        min_i = base_i.minimum / turn.minimum
        cpu_ii = base_ii.cpu_median / turn.cpu_median if base_ii is not None else None
        min_ii = base_ii.minimum / turn.minimum if base_ii is not None else None
        worst_i = min(worst_i, (ratio_i, shape))
        if ratio_ii is not None:
            worst_ii = min(worst_ii, (ratio_ii, shape))
        worst_cpu_i = min(worst_cpu_i, cpu_i)
        worst_min_i = min(worst_min_i, min_i)
        if cpu_ii is not None and min_ii is not None:
            worst_cpu_ii = min(worst_cpu_ii, cpu_ii)
            worst_min_ii = min(worst_min_ii, min_ii)
        rows.append(
            [
                shape,
                fmt_ms(turn.median),
                fmt_ms(turn.minimum),
                fmt_ms(turn.cpu_median),
                f"{fmt_ms(statistics.median(t.loop_cpu))} / "
                f"{fmt_ms(statistics.median(t.other_cpu))}",
                fmt_ms(record.median),
                fmt_ms(prepare.median),
                fmt_ms(base_i.median),
                fmt_ms(base_ii.median) if base_ii is not None else "n/a",
                fmt_ratio(ratio_i),
                f"{fmt_ratio(min_i)} / {fmt_ratio(cpu_i)}",
                fmt_ratio(ratio_ii) if ratio_ii is not None else "n/a",
                f"{fmt_ratio(min_ii)} / {fmt_ratio(cpu_ii)}"
                if min_ii is not None and cpu_ii is not None
                else "n/a",
            ]
        )
        data[shape] = {
            "turn": turn.to_json(),
            "record": record.to_json(),
            "prepare": prepare.to_json(),
            "base_i": base_i.to_json(),
            "base_ii": base_ii.to_json() if base_ii is not None else None,
            "ratio_i": ratio_i,
            "ratio_ii": ratio_ii,
            "ratio_i_min": min_i,
            "ratio_i_cpu": cpu_i,
            "ratio_ii_min": min_ii,
            "ratio_ii_cpu": cpu_ii,
            "view_messages": t.view_messages,
            "loop_cpu_median_ms": statistics.median(t.loop_cpu) * 1000,
            "other_cpu_median_ms": statistics.median(t.other_cpu) * 1000,
        }
    main = table(
        f"Full turn medians ({fmt_num(plan.stored)} stored, window {plan.window} messages, "
        f"n={plan.resets * plan.turns} turns per shape, baselines interleaved)",
        [
            "turn shape",
            "full turn",
            "min",
            "its CPU time",
            "of it: loop thread / other threads",
            "record part",
            "prepare part",
            "(i) json.dumps",
            "(ii) LangChain pair",
            "(i)/ours",
            "(i)/ours min / CPU",
            "(ii)/ours",
            "(ii)/ours min / CPU",
        ],
        rows,
    )
    targets = [
        Target(
            "full turn vs (i) re-estimating from json.dumps, every shape",
            "≥ 5×",
            fmt_ratio(worst_i[0]),
            worst_i[0] >= 5,
            ratio=worst_i[0],
            note=f"worst shape: {worst_i[1]}; worst ratio of minimums "
            f"{fmt_ratio(worst_min_i)}, of CPU medians {fmt_ratio(worst_cpu_i)}",
        )
    ]
    if langchain:
        targets.append(
            Target(
                "full turn vs (ii) LangChain summarization + context editing, every shape",
                "≥ 10×",
                fmt_ratio(worst_ii[0]),
                worst_ii[0] >= 10,
                ratio=worst_ii[0],
                note=f"worst shape: {worst_ii[1]}; worst ratio of minimums "
                f"{fmt_ratio(worst_min_ii)}, of CPU medians {fmt_ratio(worst_cpu_ii)}",
            )
        )
    else:
        targets.append(
            Target(
                "full turn vs (ii) LangChain pair",
                "≥ 10×",
                "not measured",
                None,
                note="langchain is not installed (pip install 'mimo-ctx[test]')",
            )
        )
    notes = [
        "Full turn = the shape's writes through the middleware (record(), append()) plus "
        "the next prepare(); record part and prepare part are the same turns split.",
        "Its CPU time is the process's (every thread); split into the event loop's thread "
        "(time.thread_time) and the rest, the store's worker thread (medians of each, so "
        "they need not add up exactly).",
        "(i) holds the window as Chat Completions dicts (converted once, untimed, new "
        "messages appended as they come) and times one json.dumps of the list per turn; "
        "(ii) holds LangChain messages likewise and times the two middlewares' per-turn "
        "hooks with triggers that do not fire.",
        f"The window is reset to {plan.window} messages every {plan.turns} turns; the "
        f"shapes take turns block by block ({plan.resets} blocks of each).",
    ]
    return result(NAME, TITLE, tables=[main], targets=targets, notes=notes, data=data)


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the full-turn benchmark (``quick``: a small history, a few turns)."""
    return anyio.run(_run, QUICK if quick else FULL)
