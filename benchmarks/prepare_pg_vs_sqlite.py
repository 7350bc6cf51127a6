"""Per-turn ``prepare()`` on the SQLite store and on the PostgreSQL store, side by side.

The same session is written to both stores: ``size`` stored messages (every
tenth a user turn, the others assistant tool rounds with ~700 characters of
output), then a boundary whose watermark leaves a live window of ``window``
messages. The model window is huge, so no rebuild or writer runs while timing.
Measured, on one :class:`~mimo_ctx.middleware.ContextMiddleware` per store:

* **warm, no new messages**: ``prepare()`` again and again on a loaded session
  (one change-feed read per call);
* **warm, one turn each**: a user message and an assistant tool round are
  appended before each timed ``prepare()``, as in a live agent loop; the window
  is reset (a new boundary, untimed) every ``turns`` turns so it does not drift.

Figures are wall-clock medians and 95th percentiles, and the client process's
CPU time per call (PostgreSQL's own work happens in the server's processes).
The PostgreSQL server is whatever ``--dsn`` / ``MIMO_CTX_PG_DSN`` points at;
``scripts/start_postgres.sh`` starts a loopback test server (fsync off), so the
figures show the store's round trips on loopback, not a network or a durable
commit. Without a server only the SQLite rows are printed, with a note.

Run::

    python benchmarks/prepare_pg_vs_sqlite.py [--quick] [--dsn postgresql://...]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    # Run as a file: import this module as part of the benchmarks package instead.
    import runpy

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    runpy.run_module("benchmarks.prepare_pg_vs_sqlite", run_name="__main__", alter_sys=True)
    raise SystemExit(0)

import anyio

from mimo_ctx import ids
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import (
    CheckpointPart,
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
    new_message_id,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.base import RequestPrefix, Session, Store
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.triggers import ModelLimits

from ._common import fmt_ms, fmt_ratio, machine_info, result, settle_heap, source_text, table

__all__ = ["NAME", "TITLE", "main", "run"]

NAME = "prepare_pg_vs_sqlite"
TITLE = "prepare() per turn: SQLite vs PostgreSQL store"

DSN_ENV = "MIMO_CTX_PG_DSN"
HUGE = ModelLimits(10_000_000)
_BATCH = 1000


@dataclass(frozen=True, slots=True)
class _Plan:
    size: int  # stored messages
    window: int  # live messages after the boundary
    static: int  # warm prepares without new messages
    resets: int  # window resets in turn mode
    turns: int  # timed turns per reset


FULL = _Plan(size=2_000, window=500, static=300, resets=6, turns=25)
QUICK = _Plan(size=200, window=60, static=10, resets=1, turns=5)


@dataclass(frozen=True, slots=True)
class _Timings:
    """Wall-clock and client-CPU seconds of repeated calls."""

    wall: tuple[float, ...]
    cpu: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def p95(self) -> float:
        ordered = sorted(self.wall)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    def to_json(self) -> dict[str, float | int]:
        return {
            "median_ms": self.median * 1000,
            "p95_ms": self.p95 * 1000,
            "cpu_median_ms": self.cpu_median * 1000,
            "n": len(self.wall),
        }


# --------------------------------------------------------------------------- data


def _message(code: str, session_id: str, index: int, time_ms: int, *, fresh: bool) -> Message:
    """Message ``index`` of a coding session: every tenth a user turn, else a tool round."""
    message_id = new_message_id() if fresh else ids.ascending("msg", timestamp_ms=time_ms)
    start = (index * 7919) % max(1, len(code) - 800)
    if index % 10 == 0:
        return Message(
            id=message_id,
            session_id=session_id,
            role="user",
            time_created=time_ms,
            parts=[TextPart(text=" ".join(code[start : start + 420].split()))],
        )
    return Message(
        id=message_id,
        session_id=session_id,
        role="assistant",
        time_created=time_ms,
        time_completed=time_ms + 5,
        finish="tool-calls",
        model="bench",
        usage=TokenUsage(input=100_000, output=200),
        parts=[
            TextPart(text=" ".join(code[start + 700 : start + 820].split())),
            ToolPart(
                call_id=f"call_{index}",
                tool=("read", "bash", "grep", "edit")[index % 4],
                state=ToolStateCompleted(
                    input={"path": f"src/module_{index % 97}.py", "limit": 200},
                    output=code[start : start + 700],
                    time=ToolTime(start=time_ms + 1, end=time_ms + 4),
                ),
            ),
        ],
    )


def _boundary(code: str, watermark: tuple[str, int], session_id: str, number: int) -> Message:
    """A rebuild boundary covering up to ``watermark`` with an ~8k-token body."""
    watermark_id, watermark_time = watermark
    start = (number * 104_729) % max(1, len(code) - 32_000)
    return Message(
        id=new_message_id(),
        session_id=session_id,
        role="user",
        time_created=watermark_time + 1,
        parts=[
            CheckpointPart(covered_up_to=watermark_id, number=number, directory="memory"),
            TextPart(text="## Checkpoint\nTopic: bench", synthetic=True),
            TextPart(text=code[start : start + 32_000], synthetic=True),
            TextPart(text="## Active Actors\n(none)", synthetic=True),
        ],
    )


@dataclass(slots=True)
class _Session:
    session_id: str
    main: list[tuple[str, int]]  # (id, time) of every main-agent message, in order
    boundaries: int = 0


async def _fill(store: Store, code: str, plan: _Plan) -> _Session:
    start = time.time_ns() // 1_000_000 - plan.size * 10 - 60_000
    session = Session(
        time_created=start,
        prefix=RequestPrefix(system=code[:8000], tools=[{"name": f"tool_{i}"} for i in range(12)]),
    )
    await store.create_session(session)
    stored = _Session(session_id=session.id, main=[])
    for first in range(0, plan.size, _BATCH):
        batch = [
            _message(code, session.id, i, start + i * 10, fresh=False)
            for i in range(first, min(plan.size, first + _BATCH))
        ]
        await store.append_messages(batch)
        stored.main.extend((m.id, m.time_created) for m in batch)
    await _reset_window(store, code, stored, plan.window)
    return stored


async def _reset_window(store: Store, code: str, stored: _Session, window: int) -> None:
    stored.boundaries += 1
    watermark = stored.main[-window - 1]
    boundary = _boundary(code, watermark, stored.session_id, stored.boundaries)
    committed = await store.commit_rebuild(
        stored.session_id, usage_key=f"bench-{stored.boundaries}", boundary=boundary, updated=[]
    )
    assert committed


# --------------------------------------------------------------------------- timing


async def _timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    import gc

    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        await fn()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.enable()


async def _measure(store: Store, code: str, plan: _Plan, memory_root: Path) -> dict[str, Any]:
    stored = await _fill(store, code, plan)
    sid = stored.session_id
    session_dir = memory_root / "sessions" / sid
    session_dir.mkdir(parents=True)
    # After a rebuild the session has a checkpoint, so the per-turn reminder is on.
    (session_dir / "checkpoint.md").write_text("Topic: bench\n", encoding="utf-8")
    counter = itertools.count(plan.size)
    out: dict[str, Any] = {}
    async with ContextMiddleware(store, memory_root, model=HUGE) as middleware:
        view = await middleware.prepare(sid)
        settle_heap()
        out["window_messages"] = len(view.messages)
        out["window_tokens"] = view.tokens

        walls: list[float] = []
        cpus: list[float] = []
        for _ in range(plan.static):
            wall, cpu = await _timed(lambda: middleware.prepare(sid))
            walls.append(wall)
            cpus.append(cpu)
        out["warm_static"] = _Timings(tuple(walls), tuple(cpus))

        walls, cpus = [], []
        for _ in range(plan.resets):
            await _reset_window(store, code, stored, plan.window)
            await middleware.prepare(sid)  # untimed: loads the new window
            for _turn in range(plan.turns):
                now = time.time_ns() // 1_000_000
                index = next(counter) * 10
                new = [
                    _message(code, sid, index, now, fresh=True),
                    _message(code, sid, index + 1, now, fresh=True),
                ]
                await middleware.append(new)
                stored.main.extend((m.id, m.time_created) for m in new)
                wall, cpu = await _timed(lambda: middleware.prepare(sid))
                walls.append(wall)
                cpus.append(cpu)
        out["warm_turn"] = _Timings(tuple(walls), tuple(cpus))
    return out


@asynccontextmanager
async def _sqlite(directory: Path) -> AsyncGenerator[Store, None]:
    async with SQLiteStore(directory / "bench.db") as store:
        yield store


@asynccontextmanager
async def _postgres(dsn: str) -> AsyncGenerator[Store, None]:
    import asyncpg

    from mimo_ctx.store.postgres import PostgresStore

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    store = await PostgresStore.open(dsn, schema=schema, create_schema=True)
    try:
        yield store
    finally:
        await store.aclose()
        connect = cast("Callable[..., Awaitable[Any]]", asyncpg.connect)  # pyright: ignore[reportUnknownMemberType]
        conn = await connect(dsn, timeout=30)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


async def _run(plan: _Plan, dsn: str | None) -> dict[str, Any]:
    code = source_text()
    directory = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "mimo-ctx-pgbench-"))
    measured: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    try:
        async with _sqlite(directory) as store:
            measured["SQLite"] = await _measure(store, code, plan, directory / "memory")
        if dsn is None:
            notes.append(f"PostgreSQL not measured: no --dsn and {DSN_ENV} is not set")
        else:
            try:
                async with _postgres(dsn) as store:
                    measured["PostgreSQL"] = await _measure(store, code, plan, directory / "memory")
            except ImportError as exc:  # asyncpg missing: the message names the extra
                notes.append(f"PostgreSQL not measured: {exc}")
            except (StoreError, OSError) as exc:
                notes.append(f"PostgreSQL not measured: {exc}")
    finally:
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))

    base = measured["SQLite"]
    rows: list[list[str]] = []
    for mode, label in (("warm_static", "warm, no new messages"), ("warm_turn", "warm, 1 turn")):
        for store_name, figures in measured.items():
            timings: _Timings = figures[mode]
            ratio = timings.median / base[mode].median
            rows.append(
                [
                    label,
                    store_name,
                    fmt_ms(timings.median),
                    fmt_ms(timings.p95),
                    fmt_ms(timings.cpu_median),
                    "1.0×" if store_name == "SQLite" else fmt_ratio(ratio),
                ]
            )
    main_table = table(
        f"prepare() with a {plan.window}-message live window ({plan.size:,} stored)",
        ["Mode", "Store", "Median", "p95", "Client CPU (median)", "Median vs SQLite"],
        rows,
    )
    notes.extend(
        [
            f"{plan.static} warm prepares without new messages; {plan.resets * plan.turns} "
            f"turns (a user message and an assistant tool round appended before each timed "
            f"prepare), window reset to {plan.window} messages every {plan.turns} turns.",
            "PostgreSQL: the server named by --dsn / MIMO_CTX_PG_DSN (scripts/start_postgres.sh "
            "starts a loopback test server with fsync off); client CPU excludes the server's.",
        ]
    )
    data = {
        "plan": {
            "size": plan.size,
            "window": plan.window,
            "static": plan.static,
            "turns": plan.resets * plan.turns,
        },
        "stores": {
            name: {k: (v.to_json() if isinstance(v, _Timings) else v) for k, v in figures.items()}
            for name, figures in measured.items()
        },
    }
    return result(NAME, TITLE, tables=[main_table], notes=notes, data=data)


def run(*, quick: bool = False, dsn: str | None = None) -> dict[str, Any]:
    """Run the comparison (``quick``: a tiny session, a few samples).

    Args:
        quick: Tiny inputs (a smoke run; the figures mean nothing).
        dsn: The PostgreSQL server; default ``MIMO_CTX_PG_DSN``. Without one, only
            SQLite is measured.
    """
    chosen = (dsn if dsn is not None else os.environ.get(DSN_ENV, "")).strip() or None
    return anyio.run(_run, QUICK if quick else FULL, chosen)


def _print(outcome: dict[str, Any]) -> None:
    for tab in outcome["tables"]:
        headers: Sequence[str] = tab["headers"]
        rows: list[list[str]] = tab["rows"]
        widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
        print(tab["title"])
        print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    for note in outcome["notes"]:
        print(f"- {note}")
    facts = machine_info()
    print(
        f"- measured {facts['date']} on {facts['processor']} ({facts['usable_cores']} usable "
        f"cores), Python {facts['python']}, load average {facts['load_average']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``[--quick] [--dsn URL]``; prints the table."""
    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument("--quick", action="store_true", help="tiny inputs (smoke run)")
    parser.add_argument("--dsn", help=f"PostgreSQL URL (default ${DSN_ENV})")
    args = parser.parse_args(argv)
    _print(run(quick=args.quick, dsn=args.dsn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
