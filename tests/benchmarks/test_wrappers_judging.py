"""How the wrappers benchmark judges its time and instruction rows (issue 16).

A time row whose 95% interval lies on both sides of its goal while the A/A control
(a second bare call minus the bare call) is as large as the effect gives no verdict
("not resolved by timing", never met); the instruction row of the same cell does.
"""

from __future__ import annotations

from benchmarks import _instructions, wrappers
from benchmarks import run_all as bench

_Pair = wrappers._Pair  # pyright: ignore[reportPrivateUsage]
_flat = wrappers._flat  # pyright: ignore[reportPrivateUsage]
_share = wrappers._share  # pyright: ignore[reportPrivateUsage]
_unresolved = wrappers._unresolved  # pyright: ignore[reportPrivateUsage]
_instruction_rows = wrappers._instruction_rows  # pyright: ignore[reportPrivateUsage]
_met = bench._met  # pyright: ignore[reportPrivateUsage]

_SPREAD = [-0.08, -0.06, -0.04, -0.02, 0.0, 0.02, 0.04, 0.06, 0.08]
"""Per-pair deviations of a two-second call (seconds): tens of milliseconds."""


def _cell(bare: float, overhead: float, spread: list[float], control: list[float] | None) -> _Pair:
    """A cell whose per-pair overheads are ``overhead`` plus ``spread``, and whose A/A
    differences (when given) are ``control``."""
    return _Pair(
        bare=[bare] * len(spread),
        managed=[bare + overhead + s for s in spread],
        control=None if control is None else [bare + c for c in control],
    )


def test_unresolved_needs_both_a_straddling_interval_and_an_a_a_as_large_as_the_effect() -> None:
    wide = (0.0, -0.08, 0.08)
    narrow = (0.0, -0.001, 0.001)
    assert _unresolved(True, 0.05, wide)
    assert _unresolved(True, 0.08, wide)  # as large as the effect
    assert not _unresolved(True, 0.05, narrow)  # the run's own spread is small
    assert not _unresolved(False, 0.001, wide)  # the interval is on one side of the goal
    assert not _unresolved(True, 0.05, None)  # no control: the medians' verdict


def test_a_straddling_time_row_with_a_wide_a_a_is_not_resolved_never_met() -> None:
    small = _cell(0.05, 0.004, [0.0] * 9, [0.0] * 9)
    # 5 ms at 5,000 against 4 ms at 100 (1.25x, met by the medians) but the interval
    # spans -80..+80 ms, and so does the A/A control: timing cannot tell.
    large = _cell(2.0, 0.005, _SPREAD, _SPREAD)
    target = _flat("openai", small, large, [100, 5_000])
    assert target.met is None
    assert target.status == wrappers.UNRESOLVED
    assert "the instruction row gives the verdict" in target.note
    assert _met(target.to_json()) == "not resolved by timing"
    # A median overhead of zero or less is unresolved too, not "not met" then.
    cheaper = _cell(2.0, -0.02, _SPREAD, _SPREAD)
    assert _flat("openai", small, cheaper, [100, 5_000]).status == wrappers.UNRESOLVED


def test_a_time_row_keeps_the_medians_verdict_when_the_a_a_is_small() -> None:
    small = _cell(0.05, 0.004, [0.0] * 9, [0.0] * 9)
    quiet = [x / 100 for x in _SPREAD]  # an A/A of under a millisecond
    large = _cell(2.0, 0.005, _SPREAD, quiet)
    target = _flat("openai", small, large, [100, 5_000])
    assert target.met is True
    assert target.status is None
    assert _met(target.to_json()) == "met"
    grown = _cell(2.0, 0.02, _SPREAD, quiet)
    assert _flat("openai", small, grown, [100, 5_000]).met is False
    # Without a control (the Anthropic and framework ways) as before.
    assert _flat("anthropic", small, _cell(2.0, 0.005, _SPREAD, None), [100, 5_000]).met is True


def test_the_share_row_is_unresolved_only_when_its_interval_straddles_half_the_bare_call() -> None:
    assert _share("openai", _cell(2.0, 0.005, _SPREAD, _SPREAD), 5_000).met is True
    # 0.99 s overhead on a 2 s call, interval 0.91-1.07 s: both sides of 1 s.
    straddling = _cell(2.0, 0.99, _SPREAD, [10 * x for x in _SPREAD])
    target = _share("openai", straddling, 5_000)
    assert target.met is None
    assert target.status == wrappers.UNRESOLVED


def test_instruction_rows_judge_the_same_goals_on_the_counts() -> None:
    flat = {
        100: _instructions.Counts([100_000_000, 101_000_000], [103_800_000, 104_800_000]),
        5_000: _instructions.Counts([7_800_000_000], [7_805_000_000]),
    }
    grown = {
        100: _instructions.Counts([100_000_000], [103_800_000]),
        5_000: _instructions.Counts([7_800_000_000], [7_815_000_000]),
    }
    rows, targets = _instruction_rows({"openai": flat, "openai stream": grown})
    assert len(rows) == 4
    assert rows[0][:3] == ["openai", "100", 2]
    by_name = {t.name: t for t in targets}
    flatness = by_name["openai: instructions, overhead at 5,000 vs at 100 messages"]
    assert flatness.met is True
    assert flatness.ratio is not None
    assert abs(flatness.ratio - 5.0 / 3.8) < 1e-9
    assert by_name["openai stream: instructions, overhead at 5,000 vs at 100 messages"].met is False
    assert by_name["openai: instructions, overhead at 5,000 messages vs the bare call"].met is True
    # No valgrind: one row saying so, no verdict.
    rows, targets = _instruction_rows("valgrind is not installed")
    assert len(rows) == 1
    assert [t.met for t in targets] == [None]
    assert targets[0].note == "valgrind is not installed"


def test_a_callgrind_dump_gives_its_label_and_total() -> None:
    dump = (
        "version: 1\ncreator: callgrind-3.19.0\npid: 7\ncmd: python\npart: 2\n\n"
        "desc: I1 cache:\ndesc: Timerange: Basic block 1 - 2\n"
        "desc: Trigger: Client Request: openai_stream/5000/managed/0\n\n"
        "positions: line\nevents: Ir\nsummary: 7805000123\n\n\nfn=(1) main\n0 12\n"
        "totals: 7805000123\n"
    )
    assert _instructions.parse_dump(dump) == ("openai_stream/5000/managed/0", 7_805_000_123)
    end = "desc: Trigger: Program termination\nevents: Ir\nsummary: 0\ntotals: 0\n"
    assert _instructions.parse_dump(end) is None
