"""Session state keeps only fields something reads (issue 17 item 13)."""

from __future__ import annotations

from mimo_ctx.session import Session, SessionState


def test_the_unread_overflow_flag_is_gone() -> None:
    # R1.4's "skip the next overflow check once" is the once-per-usage rule: the
    # separate flag a rebuild used to store was never read.
    assert "skip_overflow_once" not in SessionState.model_fields


def test_state_written_by_earlier_versions_still_loads() -> None:
    row = {
        "id": "ses_1",
        "time_created": 1,
        "state": {"crossed_thresholds": [5], "skip_overflow_once": True, "rebuilds": 2},
    }
    session = Session.model_validate(row)
    assert session.state == SessionState(crossed_thresholds=[5], rebuilds=2)
    assert "skip_overflow_once" not in session.state.model_dump()
