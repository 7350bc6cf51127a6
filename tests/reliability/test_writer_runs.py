"""Checkpoint-writer runs at the edges (issue 17): a hung writer (item 6), garbage
drafts (item 7), the watermark landing on a boundary (item 8) and a threshold whose
writer had nothing new (item 10).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from mimo_ctx.checkpoint import CheckpointDraft, OfflineCheckpointWriter, WriterRequest
from mimo_ctx.checkpoint.document import checkpoint_defect
from mimo_ctx.config import RebuildConfig, WriterConfig, load_config
from mimo_ctx.errors import ConfigError
from mimo_ctx.events import WriterFailed, WriterFinished
from mimo_ctx.messages import Message, TextPart, TokenUsage
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import Store

from .conftest import (
    LIMITS,
    SYSTEM,
    USABLE,
    assistant_with_tool,
    fill_to_trigger,
    now_ms,
    recorder,
    settle,
)


class HangingWriter:
    """Never answers on its own."""

    name = "hanging"

    def __init__(self) -> None:
        self.cancelled = 0

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


class DraftWriter:
    """Answers with a fixed draft."""

    name = "drafting"

    def __init__(self, draft: Callable[[WriterRequest], CheckpointDraft]) -> None:
        self.draft = draft

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        return self.draft(request)


# ----------------------------------------------------------------- item 6: run_timeout


def test_item6_run_timeout_is_a_validated_config_key() -> None:
    assert WriterConfig().run_timeout == 150
    assert WriterConfig().run_timeout < WriterConfig().ensure_wait_auto
    assert load_config({"checkpoint": {"writer": {"run_timeout": 2.5}}}).writer.run_timeout == 2.5
    for bad in (0, -1, float("nan"), float("inf"), "soon"):
        with pytest.raises(ConfigError, match=r"checkpoint\.writer\.run_timeout"):
            load_config({"checkpoint": {"writer": {"run_timeout": bad}}})


async def test_item6_a_hung_writer_is_cancelled_at_run_timeout_and_the_fallback_writes(
    store: Store, tmp_path: Path
) -> None:
    """The primary writer never answers. Past ``run_timeout`` it is cancelled, the
    failure is reported, the fallback writes the checkpoint and the rebuild uses it
    well inside its wait; the writer slot is free again. Before the fix the run held
    the slot for good: the rebuild waited its whole bound and fell back to a plain
    compaction, and no later writer could start."""
    events, on_event = recorder()
    hanging = HangingWriter()
    config = RebuildConfig(writer=WriterConfig(run_timeout=0.2, ensure_wait_auto=30))
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        config=config,
        writer=hanging,
        fallback_writer=OfflineCheckpointWriter(),
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        started = anyio.current_time()
        with anyio.fail_after(20):
            view = await mw.prepare(session.id)
        assert anyio.current_time() - started < 10
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        assert hanging.cancelled == 1
        failed = [e for e in events if isinstance(e, WriterFailed)]
        assert [e.writer for e in failed] == ["hanging"]
        assert "checkpoint.writer.run_timeout" in failed[0].error
        (finished,) = [e for e in events if isinstance(e, WriterFinished)]
        assert finished.writer == "offline"
        assert not mw.writer_running(session.id)


# ---------------------------------------------------------------- item 7: bad drafts


def _good(request: WriterRequest) -> CheckpointDraft:
    return OfflineCheckpointWriter().build(request)


GARBAGE: dict[str, Callable[[WriterRequest], CheckpointDraft]] = {
    "nul-filled": lambda r: CheckpointDraft(text="\x00" * 4096),
    "nul-in-a-good-checkpoint": lambda r: CheckpointDraft(text=_good(r).text + "\x00\x00\n"),
    "binary": lambda r: CheckpointDraft(text=bytes(range(256)).decode("latin-1") * 8),
    "undecoded": lambda r: CheckpointDraft(text="Topic: x\n" + "\ufffd" * 500),
    "empty": lambda r: CheckpointDraft(text=" \n\t\n"),
    "missing-sections": lambda r: CheckpointDraft(text="Topic: t\n\n## 1. Active intent\nx\n"),
    "garbage-spill-over": lambda r: CheckpointDraft(
        text=_good(r).text, extra_files={"checkpoint-x.md": "\x00\x01\x02"}
    ),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
async def test_item7_a_garbage_draft_keeps_the_previous_checkpoint_and_watermark(
    store: Store, tmp_path: Path, kind: str
) -> None:
    """A first writer run writes a good checkpoint. The next run's draft is garbage:
    it is refused with an event saying why, ``checkpoint.md`` stays byte-identical
    and the watermark does not move. Before the fix a NUL-filled, binary or
    section-less draft replaced the good checkpoint and moved the watermark on."""
    events, on_event = recorder()
    writer = DraftWriter(_good)
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        writer=writer,
        fallback_writer=False,
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=60_000)
        assert await mw.start_writer(session.id) == "started"
        await settle(mw, session.id)
        path = mw.layout.checkpoint_path(session.id)
        good, watermark = path.read_bytes(), await store.get_watermark(session.id)
        assert watermark is not None

        writer.draft = GARBAGE[kind]
        last = await store.latest_finished_assistant(session.id)
        assert last is not None
        more = [
            assistant_with_tool(session.id, at=last.time_created + 1 + i, usage=61_000, seed=50 + i)
            for i in range(6)
        ]
        await mw.append(more)
        assert await mw.start_writer(session.id) == "started"
        await settle(mw, session.id)
        assert path.read_bytes() == good
        assert await store.get_watermark(session.id) == watermark
        assert not list(path.parent.glob("checkpoint-x.md"))
        rejected = [e for e in events if isinstance(e, WriterFailed)]
        assert len(rejected) == 1
        assert "rejected" in rejected[0].error or "empty" in rejected[0].error


def test_item7_checkpoint_defect_names_what_is_wrong() -> None:
    request_text = (
        OfflineCheckpointWriter()
        .build(
            WriterRequest(
                session_id="ses_x",
                project_id="p",
                watermark="msg_1",
                messages=[],
                previous_checkpoint=None,
                notes=None,
                tasks=[],
                checkpoint_path=Path("/tmp/c.md"),
                project_memory_path=Path("/tmp/m.md"),
                notes_path=Path("/tmp/n.md"),
                tasks_dir=Path("/tmp/t"),
                budgets={},
            )
        )
        .text
    )
    assert checkpoint_defect(request_text) is None  # the offline writer's output passes
    assert checkpoint_defect(request_text + "\n日本語のメモ 🙂\tok\r\n") is None
    assert "control character" in (checkpoint_defect("\x00abc") or "")
    assert "U+0000" in (checkpoint_defect("abc\x00") or "")
    assert "unreadable" in (checkpoint_defect("a" * 10 + "\ufffd" * 5) or "")
    assert "empty" in (checkpoint_defect("  \n") or "")
    defect = checkpoint_defect("Topic: t\n\n## 1. Active intent\nx\n") or ""
    assert "Next concrete action" in defect
    assert "Open notes" in defect
    assert checkpoint_defect("- a spill-over list\n", sections=False) is None


# ------------------------------------------------------- item 8: never a boundary


async def test_item8_the_watermark_is_never_a_boundary(store: Store, tmp_path: Path) -> None:
    """One large last turn (over the tail ceiling alone), a rebuild, then ``/rebuild``
    right after: the second writer run must not take the first boundary as its
    watermark (it is "the message before the last completed assistant"). Before the
    fix it did: the second boundary covered up to the first, so messages already in
    the first digest were sent live again."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        history = await fill_to_trigger(mw, session.id, rounds=12, final_usage=60_000)
        big = assistant_with_tool(
            session.id, at=history[-1].time_created + 5, usage=USABLE + 500, tokens=26_000, seed=9
        )
        await mw.append([big])
        first = await mw.prepare(session.id)
        assert first.rebuild is not None
        assert first.rebuild.outcome == "rebuilt"
        second = await mw.rebuild(session.id)
        await settle(mw, session.id)
        stored = await store.list_messages(session.id)
        boundary_ids = {m.id for m in stored if m.is_boundary}
        watermark = await store.get_watermark(session.id)
        assert watermark not in boundary_ids
        assert second.watermark not in boundary_ids
        for message in stored:
            if message.is_boundary:
                assert message.covered_up_to not in boundary_ids
        view = await mw.prepare(session.id)
        ids = [m.id for m in view.messages]
        assert len(ids) == len(set(ids))


# -------------------------------------------- item 10: a threshold with nothing new


async def test_item10_a_threshold_whose_writer_had_nothing_new_is_not_retried_every_turn(
    store: Store, tmp_path: Path
) -> None:
    """A short history the watermark cannot move past (it covers everything already):
    a threshold crossed after the first writer run has nothing new for the writer.
    It is marked like a threshold that ran, so the next turns do not recompute the
    watermark (read the newest 1 000 messages) again and again. Before the fix every
    turn above the threshold did, until the watermark could move."""
    config = RebuildConfig(writer=WriterConfig(thresholds=("20%", "40%")))  # 18 000 / 36 000
    reads: list[int] = []
    original: Callable[..., Awaitable[Any]] = store.list_messages

    async def counting(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("last") is not None:
            reads.append(kwargs["last"])
        return await original(*args, **kwargs)

    store.list_messages = counting
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, config=config) as mw:
        session = await mw.open_session(system=SYSTEM)
        t = now_ms()

        def reply(i: int, usage: int) -> Message:
            return Message(
                session_id=session.id,
                role="assistant",
                time_created=t + i,
                time_completed=t + i,
                finish="stop",
                usage=TokenUsage(input=usage),
                parts=[TextPart(text=f"short answer {i}")],
            )

        await mw.add_user_message(session.id, "Keep it short.")
        await mw.record(reply(0, 20_000))  # crosses 20%: the first writer run
        await settle(mw, session.id)
        assert await store.get_watermark(session.id) is not None
        reads.clear()
        for i in range(1, 11):  # every turn above 40%, nothing new to cover
            await mw.record(reply(i, 40_000 + i))
            await mw.prepare(session.id)
            await settle(mw, session.id)
        got = await store.get_session(session.id)
        assert got is not None
        assert got.state.crossed_thresholds == [18_000, 36_000]
        assert len(reads) <= 1, f"the watermark was recomputed {len(reads)} times"
