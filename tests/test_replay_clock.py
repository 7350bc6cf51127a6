"""Replays are deterministic and keep the per-turn reminder (issue 17 item 17).

"Has this session memory files or tasks?" (SPEC R8.3) used to be cached for one
second of wall-clock time, so the same ``mimo-ctx replay`` gave different
rebuilds under different machine load, and a fast replay left out the reminder
a live agent (whose turns take seconds) sends. The check now runs on the
session's own clock (its messages' times: the transcript's in a replay) and is
redone as soon as a checkpoint writer has written the session's directory.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mimo_ctx import ContextMiddleware, InMemoryStore, Message, ModelLimits, TextPart
from mimo_ctx.importers import load_transcript
from mimo_ctx.reminders import PER_TURN_MARKER
from mimo_ctx.replay import replay_transcript, stable_ids
from mimo_ctx.testing import ScriptedModel, tool_round
from tests.cli.conftest import write_chat_transcript

T0 = 1_700_000_000_000


def _has_reminder(messages: list[Message]) -> bool:
    return any(
        isinstance(p, TextPart) and PER_TURN_MARKER in p.text for m in messages for p in m.parts
    )


def _user(session_id: str, text: str, at: int) -> Message:
    return Message(session_id=session_id, role="user", time_created=at, parts=[TextPart(text=text)])


async def test_the_check_follows_the_session_clock_not_the_wall_clock(tmp_path: Path) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=100_000) as mw:
        session = await mw.open_session()
        await mw.append([_user(session.id, "hello", T0)])
        assert not _has_reminder((await mw.prepare(session.id)).messages)
        notes = mw.layout.notes_path(session.id)
        notes.parent.mkdir(parents=True)
        notes.write_text("- port 8080\n")
        # A second and more of wall-clock time, none of the session's: same answer.
        await anyio.sleep(1.2)
        assert not _has_reminder((await mw.prepare(session.id)).messages)
        # Two seconds later on the session's clock: re-checked, reminder sent.
        await mw.append([_user(session.id, "next", T0 + 2_000)])
        assert _has_reminder((await mw.prepare(session.id)).messages)


async def test_a_fast_loop_sends_the_reminder_right_after_the_first_checkpoint(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([tool_round("read", 3_000, seed=i, path=f"f{i}.py") for i in range(12)])
    async with ContextMiddleware(
        InMemoryStore(), tmp_path / "mem", model=ModelLimits(100_000, input_limit=100_000)
    ) as mw:
        session = await mw.open_session()
        await mw.add_user_message(session.id, "Read every file.")
        checkpoint = mw.layout.checkpoint_path(session.id)
        first_with_checkpoint: int | None = None
        for turn in range(12):
            await mw.turn(session.id, model.complete)
            await mw.wait_for_writer(session.id, timeout=30)
            if first_with_checkpoint is None and checkpoint.exists():
                first_with_checkpoint = turn + 1
    assert first_with_checkpoint is not None
    requests = model.requests
    assert not _has_reminder(requests[0].messages)
    # The request right after the writer finished carries it, however fast the loop ran.
    assert all(_has_reminder(r.messages) for r in requests[first_with_checkpoint:])


@pytest.mark.parametrize("recheck", [0.0, 1e9])
async def test_replay_does_not_depend_on_the_recheck_cadence(
    tmp_path: Path, recheck: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_chat_transcript(tmp_path / "chat.json", rounds=60)
    transcript = stable_ids(load_transcript(path))
    baseline = await replay_transcript(transcript, window=30_000)
    monkeypatch.setattr("mimo_ctx._window.MEMORY_RECHECK_SECONDS", recheck)
    again = await replay_transcript(transcript, window=30_000)
    assert len(baseline.rebuilds) >= 2
    assert again.to_json() == baseline.to_json()
