"""Run every benchmark and print its tables: ``python benchmarks/run_all.py``.

Usage::

    python benchmarks/run_all.py                    # all benchmarks (under 10 min on 2 cores)
    python benchmarks/run_all.py hot_path rebuild   # some of them
    python benchmarks/run_all.py --quick            # smoke run: tiny inputs, meaningless figures
    python benchmarks/run_all.py --write-results    # also update benchmarks/RESULTS.md
    python benchmarks/run_all.py --json out.json    # also write the raw figures

The same runner backs ``mimo-ctx bench`` (:mod:`mimo_ctx.bench`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

# Run from a checkout without installing: the repository root holds mimo_ctx.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mimo_ctx.bench import main as _bench_main

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), run the benchmarks, print; exit code."""
    return _bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
