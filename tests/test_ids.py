"""Tests of ascending ids (SPEC A1): lexicographic order == creation order."""

from __future__ import annotations

import itertools
import re
import secrets
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx import ids

_ID = re.compile(r"^(ses|msg|prt|tsk|act)_[0-9a-f]{14}[0-9A-Za-z]{14}$")
_FROZEN_NS = 1_767_000_000_123 * 1_000_000  # some millisecond in 2026


@pytest.fixture(autouse=True)
def _fresh_generator_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give each test its own generator state, restored afterwards.

    Tests here move the clock around (even into the future); without this, later
    tests in the same process would inherit a "last id" far in the future.
    """
    monkeypatch.setattr(ids, "_last_value", [0])
    monkeypatch.setattr(ids, "_explicit", OrderedDict[int, int]())


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Freeze ``time.time_ns`` so every id is made "in the same millisecond"."""
    monkeypatch.setattr(ids.time, "time_ns", lambda: _FROZEN_NS)


def test_a1_shape() -> None:
    for prefix in ("ses", "msg", "prt", "tsk", "act"):
        made = ids.ascending(prefix)
        assert _ID.match(made), made
        assert made.startswith(prefix + "_")


@pytest.mark.usefixtures("frozen_clock")
def test_a1_ten_thousand_ids_in_one_millisecond_sort_by_creation() -> None:
    made = [ids.ascending("msg") for _ in range(10_000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_a1_clock_stepping_backwards_keeps_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # The clock jumps back by an hour, then by another second, then stalls.
    readings: Iterator[int] = iter(
        [_FROZEN_NS, _FROZEN_NS - 3_600_000_000_000, _FROZEN_NS - 3_601_000_000_000]
        + [_FROZEN_NS - 3_601_000_000_000] * 5
    )
    monkeypatch.setattr(ids.time, "time_ns", lambda: next(readings))
    made = [ids.ascending("msg") for _ in range(8)]
    assert made == sorted(made)
    assert len(set(made)) == 8


def test_a1_ids_made_later_sort_after_ids_made_earlier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids.time, "time_ns", lambda: _FROZEN_NS)
    first = ids.ascending("msg")
    monkeypatch.setattr(ids.time, "time_ns", lambda: _FROZEN_NS + 5_000_000)
    second = ids.ascending("msg")
    assert first < second
    assert ids.timestamp_of(second) - ids.timestamp_of(first) == 5


def test_a1_timestamp_of_round_trip_for_now(monkeypatch: pytest.MonkeyPatch) -> None:
    # Far in the future of every id made so far, so the "strictly greater than
    # the last id" rule does not push the value into a later millisecond.
    future_ns = 4_000_000_000_000 * 1_000_000
    monkeypatch.setattr(ids.time, "time_ns", lambda: future_ns)
    assert ids.timestamp_of(ids.ascending("ses")) == 4_000_000_000_000


@given(st.integers(min_value=0, max_value=2**44 - 1))
def test_a1_timestamp_of_round_trip_for_explicit_timestamps(timestamp_ms: int) -> None:
    assert ids.timestamp_of(ids.ascending("msg", timestamp_ms=timestamp_ms)) == timestamp_ms


def test_a1_explicit_timestamp_ids_ascend_for_the_same_timestamp() -> None:
    timestamp = 1_600_000_000_000
    made = [ids.ascending("msg", timestamp_ms=timestamp) for _ in range(4096)]
    assert made == sorted(made)
    assert {ids.timestamp_of(m) for m in made} == {timestamp}


def test_a1_explicit_timestamp_ids_past_4096_stay_below_the_next_millisecond() -> None:
    """Past 4096 ids for one explicit millisecond the counter is clamped: the ids are
    still unique and still sort before every id for the next millisecond."""
    timestamp = 1_600_000_001_000
    made = [ids.ascending("msg", timestamp_ms=timestamp) for _ in range(4200)]
    later = ids.ascending("msg", timestamp_ms=timestamp + 1)
    assert len(set(made)) == len(made)
    assert max(made) < later
    assert made[:4096] == sorted(made[:4096])


def test_a1_explicit_timestamp_ids_sort_by_timestamp() -> None:
    # Made out of order; they must sort by their timestamps.
    stamps = [1_700_000_000_500, 1_700_000_000_100, 1_700_000_000_300, 1_700_000_000_100]
    made = [ids.ascending("msg", timestamp_ms=t) for t in stamps]
    by_id = sorted(range(len(made)), key=lambda i: made[i])
    assert [stamps[i] for i in by_id] == sorted(stamps)
    # The two ids for the same timestamp keep their creation order.
    assert made[1] < made[3]


def test_a1_explicit_ids_sort_against_clock_ids_by_time() -> None:
    now_ms = ids.timestamp_of(ids.ascending("msg"))
    past = ids.ascending("msg", timestamp_ms=now_ms - 10_000)
    now = ids.ascending("msg")
    assert past < now


@pytest.mark.parametrize("bad", [-1, 2**44, 2**60])
def test_a1_explicit_timestamp_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match="timestamp_ms out of range"):
        ids.ascending("msg", timestamp_ms=bad)


def test_a1_ids_are_unique_across_threads() -> None:
    results: list[list[str]] = [[] for _ in range(8)]

    def work(out: list[str]) -> None:
        out.extend(ids.ascending("prt") for _ in range(2000))

    threads = [threading.Thread(target=work, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = list(itertools.chain.from_iterable(results))
    assert len(set(every)) == len(every)
    for made in results:
        # Within one thread, creation order is program order.
        assert made == sorted(made)


_PREFIXES: list[ids.IdPrefix] = ["ses", "msg", "prt", "tsk", "act"]


@given(st.lists(st.sampled_from(_PREFIXES), min_size=2, max_size=50))
def test_a1_property_ids_sort_by_creation_whatever_the_prefix(prefixes: list[ids.IdPrefix]) -> None:
    made = [ids.ascending(p) for p in prefixes]
    bodies = [m.partition("_")[2] for m in made]
    assert bodies == sorted(bodies)
    assert len(set(made)) == len(made)


@given(st.lists(st.integers(min_value=0, max_value=2**44 - 1), min_size=1, max_size=30))
def test_a1_property_explicit_ids_sort_by_timestamp_then_creation(stamps: list[int]) -> None:
    # The per-timestamp counters are process-wide; start each example afresh so
    # examples that reuse a timestamp (Hypothesis loves 0) never reach the clamp.
    ids._explicit.clear()  # pyright: ignore[reportPrivateUsage]
    made = [ids.ascending("act", timestamp_ms=t) for t in stamps]
    expected = sorted(range(len(stamps)), key=lambda i: (stamps[i], i))
    assert sorted(range(len(made)), key=lambda i: made[i]) == expected


_TIME = "0196f3a1b2c3d4"
_TAIL = "Ab3dE9fGh1Jk2L"


def test_a1_timestamp_of_accepts_a_well_formed_id() -> None:
    assert ids.timestamp_of(f"msg_{_TIME}{_TAIL}") == int(_TIME, 16) // 4096


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "msg",
        "msg_",
        f"msg{_TIME}{_TAIL}",  # no separator
        f"msg_{_TIME}{_TAIL[:-1]}",  # one character short
        f"msg_{_TIME}{_TAIL}X",  # one character long
        f"msg_{_TIME[:-1]}z{_TAIL}",  # non-hex time field
        f"msg_{_TIME.upper()}{_TAIL}",  # upper-case hex does not sort like ids
        f"msg_-{_TIME[1:]}{_TAIL}",  # int(..., 16) would accept a sign,
        f"msg_+{_TIME[1:]}{_TAIL}",
        f"msg_{_TIME[:4]}_{_TIME[5:]}{_TAIL}",  # underscores,
        f"msg_ {_TIME[1:]}{_TAIL}",  # and spaces
        f"msg_{_TIME}{_TAIL[:-2]}!!",  # tail not base62
    ],
)
def test_a1_timestamp_of_rejects_non_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="not an ascending id"):
        ids.timestamp_of(bad)


def test_a1_newer_than_beats_a_lagging_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """R4.3 across workers: a boundary id sorts after the newest stored message even
    when this machine's clock is an hour behind the worker that stored it."""
    ahead = ids.ascending("msg", timestamp_ms=2_000_000_000_000)
    made = ids.ascending("msg", newer_than=ahead)
    assert made > ahead
    assert ids.ascending("msg") > made  # and later local ids keep ascending
    # Not one of our ids: ignored, never an error.
    assert ids.ascending("msg", newer_than="call_abc").startswith("msg_")


def test_a1_random_tail_is_one_read_of_the_random_source_and_uniform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    token_bytes = secrets.token_bytes

    def counted(n: int) -> bytes:
        reads.append(n)
        return token_bytes(n)

    monkeypatch.setattr(secrets, "token_bytes", counted)
    tails = [ids.ascending("msg")[-14:] for _ in range(6_200)]
    # One read per id; a second only when too many bytes were refused (rare).
    assert 6_200 <= len(reads) <= 6_200 * 1.1
    counts = Counter("".join(tails))
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    assert set(counts) == set(alphabet)
    expected = 6_200 * 14 / 62  # 1,400 per character
    assert all(abs(c - expected) < 0.15 * expected for c in counts.values()), counts
