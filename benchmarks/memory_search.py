"""Benchmark of the FTS5 memory index (issue 8: 10,000 files / 100 MB under the root).

Generates a deterministic memory root (markdown files with headings and
paragraphs of Zipf-distributed synthetic words, spread over one session's
directory, its project's directory and the global directory, so one reconcile
walks all of them), then measures with a file-backed index:

* the initial index build (a reconcile from an empty index);
* a reconcile with nothing changed (what every ``memory search`` pays);
* a reconcile after rewriting 10 files;
* search latency (median and p95) over rare words, common words, multi-word
  queries and queries full of FTS5 syntax;
* ``paths()`` (the ``# Memory keys index`` listing).

Usage::

    python benchmarks/memory_search.py                 # 10,000 files, 100 MB
    python benchmarks/memory_search.py --files 50 --mb 0.5   # smoke run

Figures are printed as a table; nothing is asserted (benchmarks never gate tests).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mimo_ctx.memory import MemoryLayout
from mimo_ctx.memory_index import MemoryIndex

SESSION = "ses_bench"
PROJECT = "proj_bench"
_T = TypeVar("_T")

_SYLLABLES = [
    "ka", "to", "ri", "me", "na", "lo", "su", "vi", "de", "po",
    "ra", "ne", "ti", "mo", "la", "ku", "se", "fa", "gi", "bo",
]  # fmt: skip


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """``size`` distinct synthetic words of two to four syllables."""
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def file_paths(layout: MemoryLayout, count: int) -> list[Path]:
    """Where the ``count`` files go: half project, 40% session, 10% global."""
    paths: list[Path] = []
    for i in range(count):
        bucket = i % 10
        if bucket < 5:
            paths.append(layout.project_dir(PROJECT) / f"topic-{i // 100:03d}" / f"note-{i}.md")
        elif bucket < 9:
            paths.append(layout.task_progress_path(SESSION, f"T{i}"))
        else:
            paths.append(layout.global_dir() / f"g{i // 100:03d}" / f"fact-{i}.md")
    return paths


def document(rng: random.Random, words: list[str], cum: list[float], size: int) -> str:
    """A markdown file of about ``size`` characters (``cum``: cumulative word weights)."""
    lines = [f"# {' '.join(rng.choices(words, cum_weights=cum, k=4))}", ""]
    have = 0
    while have < size:
        lines.append(f"## {' '.join(rng.choices(words, cum_weights=cum, k=3))}")
        for _ in range(rng.randint(3, 8)):
            line = " ".join(rng.choices(words, cum_weights=cum, k=rng.randint(8, 14)))
            lines.append(line)
            have += len(line) + 1
        lines.append("")
    return "\n".join(lines)


def generate(root: Path, files: int, megabytes: float, seed: int) -> tuple[list[Path], list[str]]:
    """Write the memory root; return the file paths and the vocabulary (common first)."""
    rng = random.Random(seed)
    words = vocabulary(20_000, rng)
    rng.shuffle(words)
    cum = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))  # Zipf
    layout = MemoryLayout(root)
    paths = file_paths(layout, files)
    # Headings and blank lines add about 9% to the paragraph text counted below.
    per_file = max(200, int(megabytes * 1_000_000 * 0.92 / max(files, 1)))
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(document(rng, words, cum, per_file), encoding="utf-8")
    return paths, words


async def timed(fn: Callable[[], Awaitable[_T]]) -> tuple[float, _T]:
    """Seconds ``fn`` took, and its result."""
    start = time.perf_counter()
    result = await fn()
    return time.perf_counter() - start, result


def queries(words: list[str], count: int, seed: int) -> dict[str, list[str]]:
    """Query sets by kind (deterministic)."""
    rng = random.Random(seed + 1)
    common, rare = words[:50], words[5_000:]
    per = max(1, count // 4)
    return {
        "rare word": [rng.choice(rare) for _ in range(per)],
        "common word": [rng.choice(common) for _ in range(per)],
        "three words": [" ".join(rng.sample(words[:2_000], 3)) for _ in range(per)],
        "FTS syntax": [
            rng.choice(['"', "NEAR(", "*", "a OR", "-x", "col:val", "^", "(", "数据库", "🎉"])
            + " "
            + rng.choice(rare)
            for _ in range(per)
        ],
    }


def ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals."""
    return f"{seconds * 1000:.2f} ms"


async def run(files: int, megabytes: float, query_count: int, seed: int) -> None:
    """Generate, measure, print."""
    with tempfile.TemporaryDirectory(prefix="mimo-bench-") as tmp:
        root = Path(tmp) / "memory"
        started = time.perf_counter()
        paths, words = generate(root, files, megabytes, seed)
        generated = time.perf_counter() - started
        total_bytes = sum(p.stat().st_size for p in paths)
        layout = MemoryLayout(root)
        db = Path(tmp) / "index.sqlite3"
        rows: list[tuple[str, str]] = [
            ("files / bytes", f"{len(paths)} / {total_bytes / 1e6:.1f} MB"),
            ("generate (not the index)", f"{generated:.2f} s"),
        ]
        async with MemoryIndex(db) as index:

            def reconcile() -> Awaitable[object]:
                return index.reconcile(layout, session_id=SESSION, project_id=PROJECT)

            seconds, stats = await timed(reconcile)
            rows.append(("initial build", f"{seconds:.2f} s  ({stats})"))
            seconds, stats = await timed(reconcile)
            rows.append(("reconcile, no change", f"{ms(seconds)}  ({stats})"))
            rng = random.Random(seed + 2)
            for path in rng.sample(paths, min(10, len(paths))):
                with path.open("a", encoding="utf-8") as handle:
                    handle.write("\nappended line for the benchmark\n")
            seconds, stats = await timed(reconcile)
            rows.append(("reconcile, 10 files changed", f"{ms(seconds)}  ({stats})"))

            all_latencies: list[float] = []
            for kind, batch in queries(words, query_count, seed).items():
                latencies: list[float] = []
                hits = 0
                for query in batch:
                    start = time.perf_counter()
                    found = await index.search(
                        query, session_id=SESSION, project_id=PROJECT, limit=10
                    )
                    latencies.append(time.perf_counter() - start)
                    hits += len(found)
                all_latencies.extend(latencies)
                p95 = statistics.quantiles(latencies, n=20)[-1] if len(latencies) > 1 else 0.0
                rows.append(
                    (
                        f"search: {kind} ({len(batch)} q)",
                        f"median {ms(statistics.median(latencies))}, p95 {ms(p95)}, "
                        f"{hits / len(batch):.1f} hits/q",
                    )
                )
            rows.append(("search: all queries, median", ms(statistics.median(all_latencies))))
            seconds, listed = await timed(lambda: index.paths(SESSION, PROJECT))
            rows.append(("paths() (keys index)", f"{ms(seconds)}  ({len(listed)} paths)"))
        rows.append(("index size on disk", f"{_size(db) / 1e6:.1f} MB"))
    width = max(len(name) for name, _ in rows)
    print(f"memory index benchmark (SQLite {_sqlite_version()}, {os.cpu_count()} CPUs)")
    print(f"{'measure'.ljust(width)} | figure")
    print(f"{'-' * width}-|-{'-' * 40}")
    for name, value in rows:
        print(f"{name.ljust(width)} | {value}")


def _size(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def _sqlite_version() -> str:
    import sqlite3

    return sqlite3.sqlite_version


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run the benchmark."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000, help="number of files (10000)")
    parser.add_argument("--mb", type=float, default=100.0, help="total megabytes (100)")
    parser.add_argument("--queries", type=int, default=400, help="search queries (400)")
    parser.add_argument("--seed", type=int, default=8, help="random seed (8)")
    args = parser.parse_args(argv)
    if args.files < 1 or args.mb <= 0 or args.queries < 4:
        parser.error("need --files >= 1, --mb > 0 and --queries >= 4")
    anyio.run(run, args.files, args.mb, args.queries, args.seed)


if __name__ == "__main__":
    main()
