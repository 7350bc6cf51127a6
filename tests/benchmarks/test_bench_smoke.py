"""Every benchmark runs on a tiny input, so the scripts cannot rot.

No timing is asserted (figures of a ``--quick`` run mean nothing): the tests
check that each benchmark runs end to end, reports its tables and targets, and
that the facts it reports which do not depend on timing hold (window sizes,
rebuild outcomes, estimator error sign, tool pairing of our requests).
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run_all as bench
from benchmarks import wrappers
from mimo_ctx.errors import ConfigError, MimoCtxError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick() -> Callable[[str], dict[str, Any]]:
    """Run one benchmark quickly (cached per module: each runs once)."""
    done: dict[str, dict[str, Any]] = {}

    def run(name: str) -> dict[str, Any]:
        if name not in done:
            done[name] = bench.run_benchmarks([name], quick=True)["results"][name]
        return done[name]

    return run


def _check_shape(result: dict[str, Any], name: str) -> None:
    assert result["name"] == name
    assert result["tables"], "a benchmark prints at least one table"
    for table in result["tables"]:
        assert table["rows"], f"empty table {table['title']!r}"
        assert all(len(row) == len(table["headers"]) for row in table["rows"])
    for target in result["targets"]:
        assert set(target) >= {"name", "goal", "measured", "met", "ratio", "note"}
    json.dumps(result["data"])  # raw figures are JSON-ready


def test_hot_path_quick_r2_2(quick: Callable[[str], dict[str, Any]]) -> None:
    """Hot path: every size measured warm, cold and against both baselines (R2.2)."""
    result = quick("hot_path")
    _check_shape(result, "hot_path")
    sizes = result["data"]["sizes"]
    assert [s["size"] for s in sizes] == [150, 300]
    for size in sizes:
        # The boundary plus a 60-message live window (the quick plan's window).
        assert size["window_messages"] == 61
        assert size["warm_turn"]["n"] == 6
        assert size["base_i_turn"]["n"] == size["warm_turn"]["n"]
        assert size["base_ii_turn"]["n"] == size["warm_turn"]["n"]
    assert len(result["targets"]) == 5


def test_turns_quick_every_shape(quick: Callable[[str], dict[str, Any]]) -> None:
    """Full turn: every shape timed with both baselines interleaved, turn for turn."""
    result = quick("turns")
    _check_shape(result, "turns")
    data = result["data"]
    assert set(data) == {"tool loop", "split result", "update", "user turn"}
    for shape in data.values():
        assert shape["turn"]["n"] == 6
        assert shape["base_i"]["n"] == shape["turn"]["n"]
        assert shape["base_ii"]["n"] == shape["turn"]["n"]
        # The window the turns ran on: the boundary plus the quick plan's 60 messages.
        assert shape["view_messages"] == 61
        # The turn's CPU split by thread: the loop's part is one thread's share.
        assert 0 < shape["loop_cpu_median_ms"] <= shape["turn"]["cpu_median_ms"] * 1.05
        assert shape["other_cpu_median_ms"] >= 0
    assert len(result["targets"]) == 2


def test_writer_quick_every_size(quick: Callable[[str], dict[str, Any]]) -> None:
    """Writer: every size ran its writer (started, finished) with the heartbeat on."""
    result = quick("writer")
    _check_shape(result, "writer")
    sizes = result["data"]["sizes"]
    assert [s["runs"]["n"] for s in sizes] == [2, 2]
    assert sizes[0]["stored"] < sizes[1]["stored"]
    assert all(s["stall_cpu_ms"] <= s["stall_ms"] for s in sizes)
    assert len(result["targets"]) == 2


def test_soak_quick_first_and_last_tenth(quick: Callable[[str], dict[str, Any]]) -> None:
    """Soak: a short session in its own process; per-turn and RSS figures reported."""
    result = quick("soak")
    _check_shape(result, "soak")
    data = result["data"]
    assert data["turns"] == 60
    assert len(data["rss"]) == 10
    assert data["rebuilds"] >= 1
    assert data["p95_first_ms"] > 0
    assert len(result["targets"]) == 2


def test_rebuild_quick_r4_r5(quick: Callable[[str], dict[str, Any]]) -> None:
    """Rebuild: every row (history x file size x script) rebuilt with a capped body,
    both floors measured on the same sessions (R4, R5)."""
    result = quick("rebuild")
    _check_shape(result, "rebuild")
    rows = result["data"]["rows"]
    assert {(r["stored"], r["file_size"], r["script"]) for r in rows} == {
        (stored, size, script)
        for stored in (60, 120)
        for size in (4_000, 20_000)
        for script in ("ASCII", "non-ASCII")
    }
    for row in rows:
        assert row["outcomes"] == ["rebuilt"] * 2
        assert row["body_tokens"] > 0
        assert row["rebuild"]["n"] == row["realistic_floor"]["n"] == row["bare_floor"]["n"] == 2
    sections = {row[0] for row in result["tables"][1]["rows"]}
    assert {"Tasks ledger", "Session checkpoint", "Recent activity"} <= sections


def test_tokens_quick_r2_2(quick: Callable[[str], dict[str, Any]]) -> None:
    """Token counting: every kind counted; chars/4 under-counts Chinese (R2.2 note)."""
    result = quick("tokens")
    _check_shape(result, "tokens")
    data = result["data"]
    for kind in ("JSON", "code", "English prose", "Chinese prose", "mixed"):
        assert data[kind]["exact_tokens"] > 0
    assert data["Chinese prose"]["estimator_error"] < -0.3
    assert data["cache"]["fresh_us"] > 0


def test_replay_quick_r1_r8(quick: Callable[[str], dict[str, Any]]) -> None:
    """Replay: the synthetic session rebuilds at 64k; our requests keep tool pairs (R1, R8)."""
    result = quick("replay")
    _check_shape(result, "replay")
    runs = result["data"]["runs"]
    synthetic = [r for r in runs if r["name"] == "synthetic"]
    assert {r["window"] for r in synthetic} == {200_000, 64_000}
    at_64k = next(r for r in synthetic if r["window"] == 64_000)
    ours = at_64k["strategies"]["mimo_ctx"]
    assert ours["events"], "the synthetic session crosses the 64k trigger line"
    assert ours["violations"] == 0
    for event in ours["events"]:
        assert event["tokens_after"] < at_64k["trigger"]
        assert event["retention"] == 1.0
    unmanaged = at_64k["strategies"]["(a) none"]
    assert unmanaged["peak"] > ours["peak"]
    assert unmanaged["turns"] == ours["turns"]


def test_unknown_benchmark_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown benchmark 'nope'"):
        bench.run_benchmarks(["nope"], quick=True)


def _fake_run(names: list[str]) -> dict[str, Any]:
    machine = {
        "date": "2026-01-01 00:00 UTC",
        "cores": 2,
        "usable_cores": 2,
        "python": "3.11.7",
        "implementation": "CPython",
        "platform": "Linux",
        "processor": "cpu",
        "load_average": (0.5, 0.5, 0.5),
    }
    results: dict[str, dict[str, Any]] = {
        name: {
            "name": name,
            "title": f"Title {name}",
            "tables": [{"title": "t", "headers": ["a", "b"], "rows": [["1", "x|y"]]}],
            "targets": [
                {
                    "name": "goal",
                    "goal": "≤ 1",
                    "measured": "2",
                    "met": False,
                    "ratio": 2.0,
                    "note": "why",
                }
            ],
            "notes": ["a note"],
            "data": dict[str, Any](),
            "seconds": 1.0,
        }
        for name in names
    }
    return {
        "quick": False,
        "machine": machine,
        "command": "cmd",
        "seconds": 2.0,
        "results": results,
    }


def test_write_results_keeps_hand_written_text(tmp_path: Path) -> None:
    """Only the marked blocks change; a partial run leaves the other blocks alone."""
    path = tmp_path / "RESULTS.md"
    bench.write_results(_fake_run(list(bench.BENCHMARKS)), path)
    first = path.read_text(encoding="utf-8")
    for name in (*bench.BENCHMARKS, "summary"):
        assert f"<!-- generated:{name}:start -->" in first
    assert "MISSED" in first
    assert "x\\|y" in first  # a pipe inside a cell is escaped
    path.write_text(first.replace("# Benchmark results", "# Benchmark results\n\nMy analysis."))
    partial = _fake_run(["rebuild"])
    partial["results"]["rebuild"]["notes"] = ["fresh note"]
    bench.write_results(partial, path)
    second = path.read_text(encoding="utf-8")
    assert "My analysis." in second
    assert "fresh note" in second
    assert second.count("<!-- generated:rebuild:start -->") == 1
    assert second.count("a note") == len(bench.BENCHMARKS) - 1  # the other blocks kept theirs


def test_write_results_refuses_a_quick_run(tmp_path: Path) -> None:
    run = _fake_run(["tokens"])
    run["quick"] = True
    with pytest.raises(MimoCtxError, match="quick"):
        bench.write_results(run, tmp_path / "RESULTS.md")


def test_run_all_script_quick_tokens() -> None:
    """``python benchmarks/run_all.py tokens --quick`` prints the tables and exits 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "tokens", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Token counting" in done.stdout
    assert "Targets" in done.stdout


def test_run_all_script_rejects_write_results_with_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--write-results"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "--write-results needs a full run" in done.stderr
    assert "Traceback" not in done.stderr


def test_run_all_as_a_module_lists_every_benchmark() -> None:
    """``python -m benchmarks.run_all --help`` from the repository root names each benchmark."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run_all", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in bench.BENCHMARKS:
        assert name in done.stdout


def test_wrappers_quick_issue_16(quick: Callable[[str], dict[str, Any]]) -> None:
    """Every way in is measured against its bare call at every size, with both targets."""
    result = quick("wrappers")
    _check_shape(result, "wrappers")
    ways = result["data"]["ways"]
    assert set(ways) == {
        "openai",
        "openai stream",
        "openai responses",
        "anthropic",
        "anthropic stream",
        "pydantic-ai",
        "langchain",
    }
    for figures in ways.values():
        assert len(figures) == 2  # the quick sizes
        assert all(f["samples"] >= 3 and f["bare_ms"] > 0 for f in figures.values())
        for f in figures.values():
            low, high = f["overhead_ci_ms"]
            assert low <= f["overhead_ms"] <= high
            assert f["bare_min_ms"] <= f["bare_ms"]
            assert f["managed_min_ms"] <= f["managed_ms"]
    for way in ("openai", "anthropic"):
        assert all(f["alone_after_walk_ms"] > 0 for f in ways[way].values())
    # The overhead split of the ways that make one SDK call: mimo_ctx's part outside
    # the SDK call, and the SDK's own work inside the managed call against the bare one.
    for way, figures in ways.items():
        split = way in ("openai", "openai responses", "anthropic")
        for f in figures.values():
            assert (f["outside_sdk_ms"] is not None) is split
            if split:
                assert 0 < f["outside_sdk_ms"] < f["managed_ms"]
                low, high = f["sdk_slower_ci_ms"]
                assert low <= f["sdk_slower_ms"] <= high
    # The A/A control (a second bare call per pair) of the OpenAI ways.
    for way, figures in ways.items():
        controlled = way.startswith("openai")
        for f in figures.values():
            assert (f["control_ms"] is not None) is controlled
            if controlled:
                low, high = f["control_ci_ms"]
                assert low <= f["control_ms"] <= high
    # CPU instructions (callgrind) of the OpenAI ways: a managed call does more than
    # the bare one on the same list, at every size; two more targets per way.
    counted = result["data"]["instructions"]
    instruction_targets = [t for t in result["targets"] if ": instructions" in t["name"]]
    if isinstance(counted, str):  # no valgrind here: said, no verdict
        assert [t["met"] for t in instruction_targets] == [None]
    else:
        assert set(counted) == {"openai", "openai stream", "openai responses"}
        for by_size in counted.values():
            assert set(by_size) == {"20", "40"}
            for cell in by_size.values():
                assert len(cell["bare"]) == len(cell["managed"]) == 2
                assert all(0 < b < m for b, m in zip(cell["bare"], cell["managed"], strict=True))
        assert len(instruction_targets) == 6
    # Two per way, and "alone" (plain, after a walk) for the two plain SDK calls.
    assert len(result["targets"]) - len(instruction_targets) == 18
    flat = [
        t
        for t in result["targets"]
        if t["name"].endswith("vs at 20 messages") and t not in instruction_targets
    ]
    assert len(flat) == 7
    assert all("per-pair differences" in t["note"] for t in flat)
    assert all(("A/A at 40" in t["note"]) is t["name"].startswith("openai") for t in flat)


def test_wrappers_flatness_is_never_met_on_a_non_positive_median_overhead() -> None:
    """A median overhead of zero or less (the managed call cheaper than the bare one: the
    SDK's own spread) fails the flatness target however small the ratio; a positive one
    is judged on the ratio of the medians."""
    small = wrappers._Pair(bare=[1.0] * 9, managed=[1.004] * 9)  # pyright: ignore[reportPrivateUsage]
    flat = wrappers._Pair(bare=[2.0] * 9, managed=[2.005] * 9)  # pyright: ignore[reportPrivateUsage]
    grown = wrappers._Pair(bare=[2.0] * 9, managed=[2.01] * 9)  # pyright: ignore[reportPrivateUsage]
    cheaper = wrappers._Pair(bare=[2.0] * 9, managed=[1.93] * 9)  # pyright: ignore[reportPrivateUsage]
    judge = wrappers._flat  # pyright: ignore[reportPrivateUsage]
    assert judge("w", small, flat, [100, 5_000]).met is True
    assert judge("w", small, grown, [100, 5_000]).met is False
    negative = judge("w", small, cheaper, [100, 5_000])
    assert negative.met is False
    assert negative.ratio is not None
    assert negative.ratio < 0
    assert "not met" in negative.note
    assert judge("w", cheaper, flat, [100, 5_000]).met is False


def test_wrappers_median_interval_covers_the_median() -> None:
    """The order-statistic interval of the wrappers benchmark covers the true median of a
    skewed distribution about 95% of the time (too narrow would overstate a verdict)."""
    rng = random.Random(16)
    for n in (20, 40, 120):
        covered = 0
        for _ in range(400):
            values = [rng.expovariate(1.0) for _ in range(n)]
            low, high = wrappers._median_ci(values)  # pyright: ignore[reportPrivateUsage]
            covered += low <= math.log(2) <= high
        assert 0.92 <= covered / 400 <= 0.995, (n, covered)


def test_wrappers_pair_gives_our_threads_cpu_to_the_managed_call() -> None:
    """CPU a ``mimo-ctx ...`` thread spends during a pair's pause or its bare call is
    the managed call's (only the managed side uses mimo_ctx's threads); CPU spent by
    the calls' own thread stays with each call."""
    import threading
    import time

    import anyio

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    burned, release = threading.Event(), threading.Event()

    def worker() -> None:
        burn(0.05)
        burned.set()
        release.wait()  # alive past the pair, as the store's worker is

    async def run() -> Any:
        pair = wrappers._Pair([], [])  # pyright: ignore[reportPrivateUsage]
        burner = threading.Thread(target=worker, name="mimo-ctx test worker")

        async def bare() -> None:
            burner.start()
            await anyio.to_thread.run_sync(burned.wait)
            burn(0.01)

        async def managed() -> str:
            burn(0.02)
            return "answer"

        wrappers._OURS.cpu()  # pyright: ignore[reportPrivateUsage]
        try:
            reply = await wrappers._pair(  # pyright: ignore[reportPrivateUsage]
                pair, bare, managed, gap=0.0, bare_first=True
            )
        finally:
            release.set()
        return reply, pair

    reply, pair = anyio.run(run)
    assert reply == "answer"
    (bare,), (managed,) = pair.bare, pair.managed
    assert 0.009 <= bare < 0.04  # its own CPU, not the worker's 50 ms
    assert managed >= 0.02 + 0.049  # its own and all of the worker's


def test_wrappers_plan_runs_blocks_within_its_budget() -> None:
    plan = wrappers._Plan(pairs=20, min_blocks=2, max_blocks=5, budget=6.0)  # pyright: ignore[reportPrivateUsage]
    assert plan.more(0, 100.0)
    assert plan.more(1, 100.0)
    assert not plan.more(2, 6.0)  # the budget is spent
    assert plan.more(4, 1.0)
    assert not plan.more(5, 1.0)


def test_wrappers_plan_shrinks_a_block_that_would_overrun_its_budget() -> None:
    plan = wrappers._Plan(pairs=20, min_blocks=2, max_blocks=6, budget=6.0, min_pairs=16)  # pyright: ignore[reportPrivateUsage]
    assert plan.block_pairs(0.1) == 20
    assert plan.block_pairs(0.35) == 17
    assert plan.block_pairs(6.3) == 16
    assert plan.block_pairs(0.0) == 20


def test_wrappers_a_shrunk_block_is_the_cells_only_one() -> None:
    import anyio

    plan = wrappers._Plan(pairs=20, min_blocks=2, max_blocks=6, budget=6.0, min_pairs=16)  # pyright: ignore[reportPrivateUsage]

    def blocks_run(pairs: int, each: float) -> tuple[int, int]:
        ran: list[int] = []

        async def block(number: int) -> Any:
            ran.append(number)
            return wrappers._Pair([each] * pairs, [each] * pairs)  # pyright: ignore[reportPrivateUsage]

        cell = anyio.run(wrappers._blocks, plan, block)  # pyright: ignore[reportPrivateUsage]
        return len(ran), len(cell.bare)

    assert blocks_run(16, 2.0) == (1, 16)  # shrunk: one block though min_blocks is 2
    assert blocks_run(20, 0.01) == (6, 120)  # cheap: up to max_blocks
    assert blocks_run(20, 0.1) == (2, 40)  # the budget is spent after min_blocks


def test_wrappers_control_pairs_rotate_over_the_six_orders() -> None:
    """With an A/A control each of the three calls comes first, last and in between
    equally often over six pairs, and each lands in its own list."""
    import anyio

    order: list[str] = []

    def call(name: str) -> Any:
        async def run() -> str:
            order.append(name)
            return name

        return run

    async def run() -> Any:
        pair = wrappers._Pair([], [])  # pyright: ignore[reportPrivateUsage]
        replies = [
            await wrappers._pair(  # pyright: ignore[reportPrivateUsage]
                pair,
                call("bare"),
                call("managed"),
                gap=0.0,
                bare_first=True,
                control_call=call("control"),
                rotation=rotation,
            )
            for rotation in range(6)
        ]
        return pair, replies

    pair, replies = anyio.run(run)
    assert replies == ["managed"] * 6
    assert len(pair.bare) == len(pair.managed) == len(pair.control or []) == 6
    assert len(pair.control_diffs) == 6
    triples = {tuple(order[i : i + 3]) for i in range(0, 18, 3)}
    assert len(triples) == 6
    assert all(set(t) == {"bare", "managed", "control"} for t in triples)


def _summary(text: str) -> str:
    return text.split("<!-- generated:summary:start -->", 1)[1].split(
        "<!-- generated:summary:end -->", 1
    )[0]


def test_a_partial_run_replaces_its_rows_of_the_summary(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    bench.write_results(_fake_run(list(bench.BENCHMARKS)), path)
    before = _summary(path.read_text(encoding="utf-8"))
    partial = _fake_run(["rebuild"])
    partial["machine"]["date"] = "2026-02-02 10:00 UTC"
    target = partial["results"]["rebuild"]["targets"][0]
    target.update(measured="1", met=True, ratio=0.5)
    bench.write_results(partial, path)
    after = _summary(path.read_text(encoding="utf-8"))
    rows = [line for line in after.split("\n") if line.startswith("| ")]
    old_rows = [line for line in before.split("\n") if line.startswith("| ")]
    # Same rows in the same places; only the rebuild row changed.
    assert len(rows) == len(old_rows)
    changed = [(a, b) for a, b in zip(old_rows, rows, strict=True) if a != b]
    assert changed == [
        (
            "| rebuild | goal | ≤ 1 | 2 | 2.00 | MISSED |",
            "| rebuild | goal | ≤ 1 | 1 | 0.50 | met |",
        )
    ]
    assert after.split("\n", 1)[0] == before.split("\n", 1)[0]  # the whole run's line
    note = "Re-measured since the whole run: `rebuild`: 2026-02-02 10:00 UTC on cpu"
    assert note in after
    # Measured again: the note is replaced, not repeated; another benchmark adds its own.
    partial["machine"]["date"] = "2026-02-03 10:00 UTC"
    bench.write_results(partial, path)
    bench.write_results(_fake_run(["tokens"]), path)
    again = _summary(path.read_text(encoding="utf-8"))
    assert again.count("Re-measured since the whole run: `rebuild`") == 1
    assert "`rebuild`: 2026-02-03 10:00 UTC" in again
    assert again.count("Re-measured since the whole run: `tokens`") == 1
    # A whole run rewrites the summary: no note is left.
    bench.write_results(_fake_run(list(bench.BENCHMARKS)), path)
    assert "Re-measured" not in _summary(path.read_text(encoding="utf-8"))
