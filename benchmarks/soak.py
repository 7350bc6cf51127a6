"""Soak: a long scripted session, its per-turn time and its RSS, first part vs last.

The session runs in a process of its own (``_soak_run.py``): every turn a
main-agent tool round through ``ContextMiddleware.turn()`` with a scripted model,
a user message every tenth turn, a sub-agent every 100 turns; the trigger line
is crossed every ~20 turns, so it rebuilds again and again, and checkpoint
writers run in the background. Nothing in the session's cost should grow with
its length: the per-turn p95 of the last tenth of the turns against the first
tenth, and the RSS from 20% of the run to its end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import REPO_ROOT, Target, fmt_ms, fmt_num, result, table

__all__ = ["NAME", "TITLE", "run"]

NAME = "soak"
TITLE = "Soak: per-turn time and RSS over a long session"


@dataclass(frozen=True, slots=True)
class _Plan:
    turns: int
    runs: int  # soaks, each in a fresh process; figures are their medians


FULL = _Plan(turns=3_000, runs=5)
QUICK = _Plan(turns=60, runs=1)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _soak(turns: int) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="mimo-ctx-bench-soak-"))
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks._soak_run", str(turns), str(directory)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"the soak run failed: {done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


@dataclass(frozen=True, slots=True)
class _Soak:
    """The figures of one soak run."""

    median_first: float
    median_last: float
    p95_first: float
    p95_last: float
    max_first: float
    max_last: float
    early_kib: int
    end_kib: int
    rebuilds: int
    stored: int
    overflow_errors: int
    rss: list[tuple[int, int]]

    @property
    def p95_ratio(self) -> float:
        return self.p95_last / self.p95_first

    @property
    def growth(self) -> float:
        return (self.end_kib - self.early_kib) / self.early_kib


def _one(turns: int) -> _Soak:
    figures = _soak(turns)
    durations: list[float] = figures["durations"]
    tenth = max(1, len(durations) // 10)
    first, last = durations[:tenth], durations[-tenth:]
    rss: list[tuple[int, int]] = [(int(t), int(k)) for t, k in figures["rss"]]
    mark = max(1, turns // 5)
    early = next((kib for turn, kib in rss if turn >= mark), rss[0][1])
    return _Soak(
        median_first=_percentile(first, 0.5),
        median_last=_percentile(last, 0.5),
        p95_first=_percentile(first, 0.95),
        p95_last=_percentile(last, 0.95),
        max_first=max(first),
        max_last=max(last),
        early_kib=early,
        end_kib=rss[-1][1],
        rebuilds=int(figures["rebuilds"]),
        stored=int(figures["stored"]),
        overflow_errors=int(figures["overflow_errors"]),
        rss=rss,
    )


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the soak benchmark (``quick``: a few dozen turns, one run)."""
    plan = QUICK if quick else FULL
    soaks = [_one(plan.turns) for _ in range(plan.runs)]
    # The run whose p95 ratio is the median one stands for all (its other figures too).
    soaks.sort(key=lambda s: s.p95_ratio)
    middle = soaks[len(soaks) // 2]
    tenth = max(1, plan.turns // 10)
    rows = [
        [
            f"first tenth (turns 1-{tenth})",
            fmt_ms(middle.median_first),
            fmt_ms(middle.p95_first),
            fmt_ms(middle.max_first),
        ],
        [
            f"last tenth (turns {plan.turns - tenth + 1}-{plan.turns})",
            fmt_ms(middle.median_last),
            fmt_ms(middle.p95_last),
            fmt_ms(middle.max_last),
        ],
    ]
    turns_table = table(
        f"Per-turn wall time, the median of {plan.runs} runs ({fmt_num(plan.turns)} turns, "
        f"{middle.rebuilds} rebuilds, {fmt_num(middle.stored)} messages stored at the end)",
        ["turns", "median", "p95", "max"],
        rows,
    )
    runs_table = table(
        "Every run (each in a fresh process)",
        ["run", "p95 first → last tenth", "ratio", "RSS at 20% → end", "growth"],
        [
            [
                str(number),
                f"{fmt_ms(s.p95_first)} → {fmt_ms(s.p95_last)}",
                f"{s.p95_ratio:.2f}×",
                f"{s.early_kib / 1024:.1f} → {s.end_kib / 1024:.1f} MiB",
                f"{s.growth:+.1%}",
            ]
            for number, s in enumerate(soaks, 1)
        ],
    )
    rss_table = table(
        "RSS after a collection, every tenth of that run",
        ["turn", "RSS"],
        [[fmt_num(turn), f"{kib / 1024:.1f} MiB"] for turn, kib in middle.rss],
    )
    growth = sorted(s.growth for s in soaks)[len(soaks) // 2]
    targets = [
        Target(
            "per-turn p95, last tenth vs first tenth",
            "within 1.5×",
            f"{middle.p95_ratio:.2f}×",
            middle.p95_ratio <= 1.5,
            ratio=middle.p95_ratio,
            note=f"median of {plan.runs} runs; per-turn medians "
            f"{fmt_ms(middle.median_first)} → {fmt_ms(middle.median_last)}",
        ),
        Target(
            "RSS growth from 20% of the run to its end",
            "< 20%",
            f"{growth:+.1%}",
            growth < 0.20,
            ratio=growth,
            note=f"median of {plan.runs} runs",
        ),
    ]
    notes = [
        "A turn: ContextMiddleware.turn() with a scripted model (a tool round of about "
        "1 500 tokens; usable 72 000 tokens, so a rebuild every ~45 turns), a user message "
        "every tenth turn, three sub-agent rounds every 100 turns; writers run in the "
        "background (about every ten turns), nothing waits for them.",
        "Each run is a session in a process of its own, on the SQLite store, so the RSS is "
        "its own. The slowest few percent of turns are rebuilds and turns that ran while a "
        "writer built in its thread (the GIL is shared), so a tenth's p95 moves from run "
        "to run; hence several runs and their median.",
        f"Provider overflow errors during the runs: {sum(s.overflow_errors for s in soaks)}.",
    ]
    data = {
        "turns": plan.turns,
        "runs": [
            {
                "p95_first_ms": s.p95_first * 1000,
                "p95_last_ms": s.p95_last * 1000,
                "p95_ratio": s.p95_ratio,
                "rss_early_kib": s.early_kib,
                "rss_end_kib": s.end_kib,
                "rss_growth": s.growth,
                "rebuilds": s.rebuilds,
            }
            for s in soaks
        ],
        "p95_ratio": middle.p95_ratio,
        "rss_growth": growth,
        "p95_first_ms": middle.p95_first * 1000,
        "rss": middle.rss,
        "rebuilds": middle.rebuilds,
    }
    return result(
        NAME,
        TITLE,
        tables=[turns_table, runs_table, rss_table],
        targets=targets,
        notes=notes,
        data=data,
    )
