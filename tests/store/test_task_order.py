"""Natural ordering of task ids (SPEC A16): ``T2`` before ``T10``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.store import task_order_key

_paths = st.lists(st.integers(1, 5000), min_size=1, max_size=4)


def test_a16_examples() -> None:
    given_ids = ["T10", "T1.10", "T2", "T1", "T1.2", "T1.2.1", "T3", "T1.9"]
    ordered = sorted(given_ids, key=task_order_key)
    assert ordered == ["T1", "T1.2", "T1.2.1", "T1.9", "T1.10", "T2", "T3", "T10"]


@given(st.lists(_paths, max_size=20))
def test_a16_task_ids_sort_by_their_numbers(paths: list[list[int]]) -> None:
    task_ids = ["T" + ".".join(map(str, p)) for p in paths]
    by_key = sorted(task_ids, key=task_order_key)
    by_numbers = sorted(task_ids, key=lambda t: [int(x) for x in t[1:].split(".")])
    assert by_key == by_numbers


@given(st.text(max_size=20), st.text(max_size=20))
def test_any_strings_are_comparable(a: str, b: str) -> None:
    # Never raises (no int-vs-str comparison), and is a consistent order.
    ka, kb = task_order_key(a), task_order_key(b)
    assert (ka < kb) + (ka == kb) + (ka > kb) == 1
