"""`mimo-ctx bench` runs the benchmark scripts (issue 9); smoke run only."""

from __future__ import annotations

import io

from mimo_ctx.cli import main


def test_bench_quick_runs_and_prints_tables() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["bench", "--quick", "--plain", "tokens"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert "tokens" in out.getvalue().lower()


def test_bench_unknown_name_is_a_one_line_error() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["bench", "--quick", "no-such-benchmark"], stdout=out, stderr=err)
    assert code == 2
    assert len(err.getvalue().strip().splitlines()) == 1
