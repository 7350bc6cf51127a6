"""The private helpers of :mod:`mimo_ctx._util` and the one version source."""

from __future__ import annotations

import importlib.metadata
import io
import time
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

import mimo_ctx
from mimo_ctx._util import ago, follow_copy, now_ms, one_line
from mimo_ctx.cli import main


def test_version_comes_from_the_package_metadata() -> None:
    assert mimo_ctx.__version__ == importlib.metadata.version("mimo-ctx")


def test_cli_version_prints_the_package_version() -> None:
    out = io.StringIO()
    assert main(["--version"], stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue().strip() == f"mimo-ctx {mimo_ctx.__version__}"


def test_now_ms_is_the_wall_clock_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    value = now_ms()
    after = time.time_ns() // 1_000_000
    assert before <= value <= after


@given(st.text())
def test_one_line_has_no_line_break_and_no_double_space(text: str) -> None:
    flat = one_line(text)
    assert len(flat.splitlines()) <= 1
    assert "  " not in flat
    assert flat == flat.strip()
    assert flat.split() == text.split()


def test_ago_picks_the_largest_whole_unit() -> None:
    assert ago(-5_000) == "0s ago"
    assert ago(59_999) == "59s ago"
    assert ago(60_000) == "1m ago"
    assert ago(3_599_999) == "59m ago"
    assert ago(3_600_000) == "1h ago"
    assert ago(86_399_999) == "23h ago"
    assert ago(86_400_000) == "1d ago"
    assert ago(10 * 86_400_000) == "10d ago"


@given(
    old=st.lists(st.integers(0, 3), max_size=12),
    failed=st.lists(st.integers(0, 3), max_size=3),
    cut=st.integers(0, 12),
    tail=st.lists(st.integers(0, 3), max_size=5),
    as_tuple=st.booleans(),
)
def test_follow_copy_finds_the_common_prefix(
    old: list[int], failed: list[int], cut: int, tail: list[int], as_tuple: bool
) -> None:
    """The count is the longest common prefix with the last list; the copy is the new list
    exactly when it says so, else still the last list (what a failed call left is dropped)."""
    mine = [*old, *failed]
    new_list = [*old[:cut], *tail]
    new: Sequence[int] = tuple(new_list) if as_tuple else new_list
    count, current = follow_copy(mine, len(old), new)
    expected = 0
    while expected < min(len(old), len(new)) and old[expected] == new[expected]:
        expected += 1
    assert count == expected
    assert mine == (new_list if current else old)
    assert current == (not as_tuple and count == len(old))
