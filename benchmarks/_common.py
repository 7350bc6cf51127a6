"""Shared helpers of the benchmarks: timing, machine facts, sample data, result tables.

Every benchmark module exposes ``NAME``, ``TITLE`` and ``run(*, quick) -> dict``
returning a *result*: ``{"name", "title", "tables", "targets", "notes", "data"}``
(see :func:`result`). :mod:`mimo_ctx.bench` runs them and renders the tables.

Figures are medians over several runs with the baselines measured in the same
run on the same data; nothing here asserts a timing.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "REPO_ROOT",
    "Samples",
    "Target",
    "atime",
    "fmt_ms",
    "fmt_num",
    "fmt_ratio",
    "machine_info",
    "result",
    "settle_heap",
    "source_text",
    "table",
    "time_call",
    "transcripts_dir",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The checkout the benchmarks live in."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Samples:
    """Durations of repeated runs of one operation, in seconds.

    ``values`` are wall-clock durations; ``cpu`` the process CPU time of the same
    runs (every thread of the process, so store worker threads count). On a
    machine shared with other work, wall-clock figures grow with the load while
    CPU time stays close to the cost of the code itself.
    """

    values: tuple[float, ...]
    cpu: tuple[float, ...] = ()

    @classmethod
    def of(cls, timings: Sequence[tuple[float, float]]) -> Samples:
        """Samples from ``(wall, cpu)`` pairs."""
        return cls(tuple(w for w, _ in timings), tuple(c for _, c in timings))

    @property
    def cpu_median(self) -> float:
        """The median CPU time (the wall-clock median when CPU time was not taken)."""
        return statistics.median(self.cpu) if self.cpu else self.median

    @property
    def median(self) -> float:
        """The median duration."""
        return statistics.median(self.values)

    @property
    def minimum(self) -> float:
        """The fastest run."""
        return min(self.values)

    @property
    def p90(self) -> float:
        """The 90th percentile (nearest rank)."""
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]

    def to_json(self) -> dict[str, float | int]:
        """Median, minimum and p90 in milliseconds, and the sample count."""
        return {
            "median_ms": self.median * 1000,
            "min_ms": self.minimum * 1000,
            "p90_ms": self.p90 * 1000,
            "cpu_median_ms": self.cpu_median * 1000,
            "n": len(self.values),
        }


def time_call(fn: Callable[[], object], repeats: int) -> Samples:
    """Run ``fn`` ``repeats`` times and return each duration.

    The garbage collector is paused inside each run (it catches up between runs),
    so a collection triggered by earlier allocations does not land in a random
    sample. Call :func:`settle_heap` once after building large data.
    """
    timings: list[tuple[float, float]] = []
    for _ in range(repeats):
        gc.disable()
        try:
            start, cpu = time.perf_counter(), time.process_time()
            fn()
            timings.append((time.perf_counter() - start, time.process_time() - cpu))
        finally:
            gc.enable()
    return Samples.of(timings)


def settle_heap() -> None:
    """Collect once and move every live object out of the collector's view.

    Benchmarks build large histories up front; without this, each later
    full collection would walk them again and land in random samples.
    """
    gc.collect()
    gc.freeze()


async def atime(fn: Callable[[], Awaitable[_T]]) -> tuple[tuple[float, float], _T]:
    """Await ``fn()`` once with the collector paused; return ((wall, cpu) seconds, result)."""
    gc.disable()
    try:
        start, cpu = time.perf_counter(), time.process_time()
        value = await fn()
        return (time.perf_counter() - start, time.process_time() - cpu), value
    finally:
        gc.enable()


@dataclass(frozen=True, slots=True)
class Target:
    """One target of issue 9 with its measurement.

    Attributes:
        name: What is measured.
        goal: The target, as the issue states it.
        measured: The measured figure, formatted.
        met: Whether the target is met (``None`` when not measurable here).
        ratio: The measured ratio next to the target (``None`` when not a ratio).
        note: Why it is missed, or what the figure means.
        status: Shown instead of met / MISSED when the measurement cannot give a
            verdict (``met`` is then None), e.g. "not resolved by timing".
    """

    name: str
    goal: str
    measured: str
    met: bool | None
    ratio: float | None = None
    note: str = ""
    status: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The target as a JSON-ready mapping."""
        return {
            "name": self.name,
            "goal": self.goal,
            "measured": self.measured,
            "met": self.met,
            "ratio": self.ratio,
            "note": self.note,
            "status": self.status,
        }


def table(title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> dict[str, Any]:
    """A result table: a title, column headers and rows of printable cells."""
    return {"title": title, "headers": list(headers), "rows": [[str(c) for c in r] for r in rows]}


def result(
    name: str,
    title: str,
    *,
    tables: Sequence[dict[str, Any]],
    targets: Sequence[Target] = (),
    notes: Sequence[str] = (),
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble one benchmark's result."""
    return {
        "name": name,
        "title": title,
        "tables": list(tables),
        "targets": [t.to_json() for t in targets],
        "notes": list(notes),
        "data": data or {},
    }


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds with three significant decimals."""
    ms = seconds * 1000
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.3f} ms"


def fmt_ratio(value: float) -> str:
    """A ratio such as ``12.3×``."""
    return f"{value:.1f}×" if value < 100 else f"{value:.0f}×"


def fmt_num(value: float) -> str:
    """A large number with thousands separators."""
    return f"{value:,.0f}"


def machine_info() -> dict[str, Any]:
    """Where the figures were measured: date, cores, Python, platform."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cores": os.cpu_count() or 0,
        "usable_cores": usable,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        # Other work on the machine inflates timings: say how busy it was.
        "load_average": _load_average(),
    }


def _load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except (AttributeError, OSError):  # not available on this platform
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_text() -> str:
    """The library's own Python sources, concatenated: deterministic realistic code."""
    package = REPO_ROOT / "mimo_ctx"
    files = sorted(package.rglob("*.py"))
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def transcripts_dir() -> Path | None:
    """The shared real transcripts folder, or ``None`` when it is absent.

    ``MIMO_CTX_TRANSCRIPTS`` when set, else ``../shared/data/transcripts`` beside
    the checkout.
    """
    env = os.environ.get("MIMO_CTX_TRANSCRIPTS")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "transcripts"
    return path if path.is_dir() else None
