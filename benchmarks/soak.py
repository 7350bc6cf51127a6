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


FULL = _Plan(turns=3_000)
QUICK = _Plan(turns=60)


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


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the soak benchmark (``quick``: a few dozen turns)."""
    plan = QUICK if quick else FULL
    figures = _soak(plan.turns)
    durations: list[float] = figures["durations"]
    tenth = max(1, len(durations) // 10)
    first, last = durations[:tenth], durations[-tenth:]
    p95_first, p95_last = _percentile(first, 0.95), _percentile(last, 0.95)
    median_first, median_last = _percentile(first, 0.5), _percentile(last, 0.5)
    rss: list[tuple[int, int]] = [tuple(r) for r in figures["rss"]]  # type: ignore[misc]
    mark = max(1, plan.turns // 5)
    early = next((kib for turn, kib in rss if turn >= mark), rss[0][1])
    end = rss[-1][1]
    growth = (end - early) / early
    p95_ratio = p95_last / p95_first
    rows = [
        [
            f"first tenth (turns 1-{tenth})",
            fmt_ms(median_first),
            fmt_ms(p95_first),
            fmt_ms(max(first)),
        ],
        [
            f"last tenth (turns {len(durations) - tenth + 1}-{len(durations)})",
            fmt_ms(median_last),
            fmt_ms(p95_last),
            fmt_ms(max(last)),
        ],
    ]
    turns_table = table(
        f"Per-turn wall time ({fmt_num(plan.turns)} turns, {figures['rebuilds']} rebuilds, "
        f"{fmt_num(figures['stored'])} messages stored at the end)",
        ["turns", "median", "p95", "max"],
        rows,
    )
    rss_table = table(
        "RSS after a collection, every tenth of the run",
        ["turn", "RSS"],
        [[fmt_num(turn), f"{kib / 1024:.1f} MiB"] for turn, kib in rss],
    )
    targets = [
        Target(
            "per-turn p95, last tenth vs first tenth",
            "within 1.5×",
            f"{p95_ratio:.2f}×",
            p95_ratio <= 1.5,
            ratio=p95_ratio,
            note=f"medians {fmt_ms(median_first)} → {fmt_ms(median_last)}",
        ),
        Target(
            "RSS growth from 20% of the run to its end",
            "< 20%",
            f"{growth:+.1%}",
            growth < 0.20,
            ratio=growth,
            note=f"{early / 1024:.1f} MiB → {end / 1024:.1f} MiB",
        ),
    ]
    notes = [
        "A turn: ContextMiddleware.turn() with a scripted model (a tool round of about "
        "1 500 tokens; usable 36 000 tokens, so a rebuild every ~20 turns), a user message "
        "every tenth turn, three sub-agent rounds every 100 turns; writers run in the "
        "background, nothing waits for them.",
        "The session runs in a process of its own, on the SQLite store, so the RSS is its own.",
        f"Provider overflow errors during the run: {figures['overflow_errors']}.",
    ]
    data = {
        "turns": plan.turns,
        "p95_first_ms": p95_first * 1000,
        "p95_last_ms": p95_last * 1000,
        "p95_ratio": p95_ratio,
        "rss_early_kib": early,
        "rss_end_kib": end,
        "rss_growth": growth,
        "rebuilds": figures["rebuilds"],
        "rss": rss,
    }
    return result(
        NAME, TITLE, tables=[turns_table, rss_table], targets=targets, notes=notes, data=data
    )
