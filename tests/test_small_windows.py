"""Small windows recover (issue 17 item 12; SPEC R2.3 scaled, R5.9 beyond).

With the SPEC's fixed tail bounds a 10000-token floor sat above a 4000-token
trigger line (window 8000): with the checkpoint disabled or its writer failing
the plain compaction kept the whole tail live, the request grew turn after turn
and the agent died with ``ContextOverflowError``. The bounds now scale with the
trigger line, the compaction summary gets only the room under it, and a rebuilt
request that still cannot fit says so (``over_line``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx import (
    CheckpointDraft,
    ContextMiddleware,
    ContextRebuilt,
    Event,
    InMemoryStore,
    ModelLimits,
    RebuildConfig,
    TailConfig,
    WriterRequest,
)
from mimo_ctx.boundary import TAIL_MAX_SHARE, TAIL_MIN_SHARE, scale_tail
from mimo_ctx.importers import load_transcript
from mimo_ctx.replay import replay_transcript
from mimo_ctx.testing import ScriptedModel, tool_round
from tests.cli.conftest import run_cli


@given(
    usable=st.integers(min_value=0, max_value=2_000_000),
    low=st.integers(min_value=0, max_value=100_000),
    high=st.integers(min_value=0, max_value=100_000),
)
def test_scaled_tail_bounds_stay_under_their_share_of_the_line(
    usable: int, low: int, high: int
) -> None:
    tail = TailConfig(min_tokens=low, max_tokens=high)
    scaled = scale_tail(tail, usable)
    assert scaled.min_tokens == min(low, int(usable * TAIL_MIN_SHARE))
    assert scaled.max_tokens == min(high, int(usable * TAIL_MAX_SHARE))
    assert scaled.min_text_block_messages == tail.min_text_block_messages


def test_large_windows_keep_the_spec_constants() -> None:
    for usable in (80_000, 180_000, 900_000):
        assert scale_tail(TailConfig(), usable) == TailConfig()
    assert scale_tail(TailConfig(), 4_000) == TailConfig(min_tokens=500, max_tokens=1_000)


class FailingWriter:
    name = "failing"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        raise RuntimeError("model unavailable (503)")


@pytest.mark.parametrize("case", ["checkpoint-off", "writer-failed"])
@pytest.mark.parametrize("output", [300, 1500])
async def test_an_8k_window_without_a_checkpoint_keeps_going(
    case: str, output: int, tmp_path: Path
) -> None:
    window = 8_000
    model = ScriptedModel(
        [tool_round("read", output, seed=i, path=f"f{i}.py") for i in range(60)],
        overflow_above=window,
    )
    events: list[Event] = []
    config = RebuildConfig(checkpoint_enabled=case != "checkpoint-off")
    async with ContextMiddleware(
        InMemoryStore(),
        tmp_path / "mem",
        model=ModelLimits(window),
        config=config,
        writer=FailingWriter() if case == "writer-failed" else None,
        fallback_writer=False,
        on_event=events.append,
    ) as mw:
        assert mw.usable == 4_000
        session = await mw.open_session(system="You are a coding agent.")
        await mw.add_user_message(session.id, "Read every file.")
        for _ in range(60):
            await mw.turn(session.id, model.complete)
        stored = await mw.store.get_session(session.id)
        assert stored is not None
        state = stored.state
    rebuilds = [e for e in events if isinstance(e, ContextRebuilt)]
    assert len(rebuilds) >= 3
    assert {e.outcome for e in rebuilds} == {case}
    for event in rebuilds:
        assert event.tokens_after is not None
        assert event.tokens_after <= mw.usable
        assert not event.over_line
    assert model.overflow_errors == 0
    assert max(r.tokens for r in model.requests) <= window
    assert not state.auto_rebuild_disabled


async def test_a_tail_that_cannot_fit_is_reported(tmp_path: Path) -> None:
    """One user message larger than the line stays live (user words are never folded)."""
    events: list[Event] = []
    model = ScriptedModel([tool_round("read", 200, seed=i) for i in range(30)])
    async with ContextMiddleware(
        InMemoryStore(), tmp_path / "mem", model=ModelLimits(8_000), on_event=events.append
    ) as mw:
        session = await mw.open_session()
        await mw.add_user_message(session.id, "Start.")
        for _ in range(25):
            await mw.turn(session.id, model.complete)
        await mw.add_user_message(session.id, "word " * 5_000)  # ~6250 tokens
        report = await mw.rebuild(session.id)
    assert report.outcome == "rebuilt"
    assert report.over_line
    assert report.tokens_after is not None
    assert report.tokens_after > mw.usable
    last = [e for e in events if isinstance(e, ContextRebuilt)][-1]
    assert last.manual
    assert last.over_line


SWEAGENT = (
    "6e44b9__sweagenttestrepo-1c2844.traj",
    "pydicom__pydicom-1458.traj",
    "swe-agent__test-repo-i1.traj",
)


@pytest.mark.transcripts
@pytest.mark.parametrize("name", SWEAGENT)
@pytest.mark.parametrize("window", [200_000, 16_000, 8_000])
async def test_sweagent_replays_fit_under_the_line(
    transcripts_dir: Path, name: str, window: int
) -> None:
    path = transcripts_dir / "sweagent" / name
    if not path.is_file():
        pytest.skip(f"{path} not found")
    report = await replay_transcript(load_transcript(path), window=window)
    for rebuild in report.rebuilds:
        assert rebuild.tokens_after <= report.trigger_tokens, rebuild


@pytest.mark.transcripts
@pytest.mark.parametrize("name", SWEAGENT)
@pytest.mark.parametrize("window", ["200K", "16K", "8K"])
def test_sweagent_manual_rebuild_fits_under_the_line(
    transcripts_dir: Path, name: str, window: str
) -> None:
    path = transcripts_dir / "sweagent" / name
    if not path.is_file():
        pytest.skip(f"{path} not found")
    doc = run_cli("inspect", str(path), "--window", window, "--json").json()
    assert doc["outcome"] == "rebuilt"
    assert doc["tokens_after"] <= doc["trigger_tokens"]
