"""``SessionState.after_rebuild``: the state a committed rebuild leaves (R5.9 beyond loop guard)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.session import SessionState


def test_a_rebuild_clears_thresholds_and_counts_itself() -> None:
    state = SessionState(crossed_thresholds=[100, 200], rebuilds=2)
    after = state.after_rebuild(0.5, manual=False, min_freed=0.1)
    assert after.crossed_thresholds == []
    assert after.rebuilds == 3
    assert after.freed_fractions == [0.5]
    assert not after.auto_rebuild_disabled


def test_two_automatic_rebuilds_that_free_too_little_disable_automatic_rebuilds() -> None:
    once = SessionState().after_rebuild(0.05, manual=False, min_freed=0.1)
    assert not once.auto_rebuild_disabled
    assert once.after_rebuild(0.02, manual=False, min_freed=0.1).auto_rebuild_disabled


def test_a_manual_rebuild_never_disables_them() -> None:
    once = SessionState().after_rebuild(0.05, manual=False, min_freed=0.1)
    assert not once.after_rebuild(0.02, manual=True, min_freed=0.1).auto_rebuild_disabled


@given(st.lists(st.floats(min_value=0, max_value=1), max_size=12), st.booleans())
def test_the_last_five_fractions_are_kept_and_disabling_sticks(
    freed: list[float], manual: bool
) -> None:
    state = SessionState()
    disabled = False
    for fraction in freed:
        state = state.after_rebuild(fraction, manual=manual, min_freed=0.3)
        assert not disabled or state.auto_rebuild_disabled
        disabled = state.auto_rebuild_disabled
    assert state.freed_fractions == freed[-5:]
    assert state.rebuilds == len(freed)
