"""Faults (issue 10 §2): writers that fail, hang, get cancelled or answer nonsense;
memory files that vanish or cannot be read; a full disk; a process killed in the
middle of a rebuild commit; a corrupted SQLite file; provider errors of unknown
shape (SPEC R3.2, R3.3, R4, A2, A3).

Every case has a defined result: a documented degradation (the rebuild uses the
checkpoint on disk, or falls back to a plain compaction) or a clear
:class:`~mimo_ctx.errors.MimoCtxError` -- never a raw traceback from inside the
library, never a half-written checkpoint, never a lost message.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from mimo_ctx import memory
from mimo_ctx.checkpoint import (
    CheckpointDraft,
    LLMCheckpointWriter,
    OfflineCheckpointWriter,
    WriterRequest,
    parse_llm_answer,
)
from mimo_ctx.config import RebuildConfig, WriterConfig
from mimo_ctx.errors import MimoCtxError, StoreError
from mimo_ctx.events import ContextRebuilt, WriterFailed, WriterFinished
from mimo_ctx.messages import ToolPart, ToolStateCompleted
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.store import InMemoryStore, SQLiteStore, Store
from mimo_ctx.testing import FakeOverflowError

from .conftest import (
    LIMITS,
    SYSTEM,
    assistant_with_tool,
    body_text,
    boundaries,
    fill_to_trigger,
    recorder,
    settle,
)

KILL_WORKER = Path(__file__).with_name("_kill_worker.py")


class FaultyWriter:
    """A checkpoint writer whose behaviour the test switches."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.calls = 0
        self.release = anyio.Event()
        self.entered = anyio.Event()
        self.cancelled = False

    @property
    def name(self) -> str:
        return "faulty"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        self.calls += 1
        self.entered.set()
        if self.mode == "raise":
            raise RuntimeError("model unavailable (503)")
        if self.mode == "hang":
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled = True
                raise
        if self.mode == "empty":
            return CheckpointDraft(text="  \n\n")
        if self.mode == "self-cancel":
            # What an inner asyncio task of a model client being cancelled looks like.
            raise asyncio.CancelledError
        return OfflineCheckpointWriter().build(request)


async def prime_checkpoint(mw: ContextMiddleware, session_id: str) -> tuple[bytes, str]:
    """A session below the line with a checkpoint and watermark on disk."""
    await fill_to_trigger(mw, session_id, final_usage=80_000)
    assert await mw.start_writer(session_id, reason="test") == "started"
    # The writer this test started must finish (however loaded the machine is)
    # before the watermark is read: a bounded settle alone can end too early.
    assert await mw.wait_for_writer(session_id, timeout=30) == "finished"
    await settle(mw, session_id)
    watermark = await mw.store.get_watermark(session_id)
    assert watermark is not None
    return mw.layout.checkpoint_path(session_id).read_bytes(), watermark


async def cross_line(mw: ContextMiddleware, session_id: str, usage: int = 95_000) -> None:
    """One more finished assistant message whose usage crosses the trigger line."""
    last = await mw.store.latest_finished_assistant(session_id)
    assert last is not None
    await mw.append(
        [assistant_with_tool(session_id, at=last.time_created + 5, usage=usage, seed=77)]
    )


def leftovers(directory: Path) -> list[str]:
    """Temporary files of atomic writes left in a directory."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# --------------------------------------------------------------------------- writers


async def test_r3_3_writer_raises_without_checkpoint_falls_back(
    store: Store, tmp_path: Path
) -> None:
    """A3: no checkpoint and the writer fails -> outcome writer-failed, a plain
    compaction is inserted instead; the caller sees no exception."""
    events, on_event = recorder()
    writer = FaultyWriter("raise")
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        writer=writer,
        fallback_writer=False,
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        before = await store.count_messages(session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert (view.rebuild.outcome, view.rebuild.fallback) == ("writer-failed", "compaction")
        failed = [e for e in events if isinstance(e, WriterFailed)]
        assert [e.writer for e in failed] == ["faulty"]
        assert "model unavailable" in failed[0].error
        assert not mw.layout.checkpoint_path(session.id).exists()
        assert await store.get_watermark(session.id) is None
        stored = await store.list_messages(session.id, agent=None)
        (boundary,) = boundaries(stored)
        assert boundary.parts[0].type == "compaction"
        assert len(stored) == before + 1


async def test_r3_3_writer_raises_rebuild_uses_checkpoint_on_disk(
    store: Store, tmp_path: Path
) -> None:
    writer = FaultyWriter()
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, writer=writer, fallback_writer=False
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        old, watermark = await prime_checkpoint(mw, session.id)
        writer.mode = "raise"
        assert await mw.start_writer(session.id, reason="again") in ("started", "skipped")
        await cross_line(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert (view.rebuild.outcome, view.rebuild.watermark) == ("rebuilt", watermark)
        assert mw.layout.checkpoint_path(session.id).read_bytes() == old
        assert await store.get_watermark(session.id) == watermark


async def test_r3_2_writer_hangs_past_the_ensure_bound(store: Store, tmp_path: Path) -> None:
    """No checkpoint, the writer hangs: the rebuild waits ensure_wait_auto, then falls
    back to a plain compaction; the hung writer is cancelled at shutdown, leaving no
    task behind and no checkpoint half-written."""
    writer = FaultyWriter("hang")
    config = RebuildConfig(writer=WriterConfig(ensure_wait_auto=0.3))
    tasks_before = len(asyncio.all_tasks())
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=config, writer=writer, fallback_writer=False
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        with anyio.fail_after(10):
            view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert (view.rebuild.outcome, view.rebuild.fallback) == ("writer-failed", "compaction")
        assert mw.writer_running(session.id)
    assert writer.cancelled
    assert not mw.layout.checkpoint_path(session.id).exists()
    assert await store.get_watermark(session.id) is None
    assert len(asyncio.all_tasks()) == tasks_before


async def test_r3_2_writer_hangs_past_the_wait_bound_with_checkpoint(
    store: Store, tmp_path: Path
) -> None:
    writer = FaultyWriter()
    config = RebuildConfig(writer=WriterConfig(wait_with_watermark=0.2))
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=config, writer=writer, fallback_writer=False
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        old, watermark = await prime_checkpoint(mw, session.id)
        writer.mode = "hang"
        await cross_line(mw, session.id, usage=85_000)
        assert await mw.start_writer(session.id, reason="hang") == "started"
        await cross_line(mw, session.id)
        with anyio.fail_after(10):
            view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert (view.rebuild.outcome, view.rebuild.watermark) == ("rebuilt", watermark)
        assert mw.layout.checkpoint_path(session.id).read_bytes() == old


async def test_r3_3_writer_cancelled_by_shutdown_writes_nothing(
    store: Store, tmp_path: Path
) -> None:
    """Leaving the middleware cancels a running writer: the checkpoint and the
    watermark stay as they were, no task is left, the host's own error propagates
    as it is (not wrapped in an exception group)."""
    writer = FaultyWriter()
    tasks_before = len(asyncio.all_tasks())
    seen: dict[str, Any] = {}

    async def host() -> None:
        async with ContextMiddleware(
            store, tmp_path / "mem", model=LIMITS, writer=writer, fallback_writer=False
        ) as mw:
            session = await mw.open_session(system=SYSTEM)
            seen["old"], seen["watermark"] = await prime_checkpoint(mw, session.id)
            seen["mw"], seen["session"] = mw, session
            writer.mode = "hang"
            await cross_line(mw, session.id, usage=85_000)
            assert await mw.start_writer(session.id, reason="hang") == "started"
            await anyio.sleep(0.05)
            raise KeyError("host failure")

    with pytest.raises(KeyError, match="host failure"):
        await host()
    mw: ContextMiddleware = seen["mw"]
    session, old, watermark = seen["session"], seen["old"], seen["watermark"]
    assert writer.cancelled
    assert mw.layout.checkpoint_path(session.id).read_bytes() == old
    assert await store.get_watermark(session.id) == watermark
    assert leftovers(mw.layout.session_dir(session.id)) == []
    assert len(asyncio.all_tasks()) == tasks_before


async def test_r3_3_writer_raising_cancellation_does_not_cancel_the_host(tmp_path: Path) -> None:
    writer = FaultyWriter("self-cancel")
    alive = False
    async with ContextMiddleware(
        InMemoryStore(), tmp_path / "mem", model=LIMITS, writer=writer, fallback_writer=False
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        with anyio.fail_after(10):
            view = await mw.prepare(session.id)
        await anyio.sleep(0.05)
        alive = True
        assert view.rebuild is not None
        assert view.rebuild.outcome == "writer-failed"
    assert alive


async def test_r3_3_store_error_while_scheduling_a_writer_does_not_cancel_the_host(
    tmp_path: Path,
) -> None:
    """A store error while the coordinator starts the queued writer is that writer's
    failure (logged, an event), never an error in the task group enclosing the host."""
    store = InMemoryStore()
    writer = FaultyWriter("hang")
    alive = False
    with anyio.fail_after(10):
        async with ContextMiddleware(
            store, tmp_path / "mem", model=LIMITS, writer=writer, fallback_writer=False
        ) as mw:
            session = await mw.open_session(system=SYSTEM)
            await fill_to_trigger(mw, session.id, final_usage=50_000)
            assert await mw.start_writer(session.id, reason="first") == "started"
            assert await mw.start_writer(session.id, reason="second") == "queued"

            async def disk_error(*args: Any, **kwargs: Any) -> Any:
                raise StoreError("SQLite store s.db: disk I/O error")

            store.list_messages = disk_error
            writer.release.set()
            await anyio.sleep(0.1)
            alive = True
    assert alive


async def test_a3_writer_returning_empty_text_is_a_failure(store: Store, tmp_path: Path) -> None:
    events, on_event = recorder()
    writer = FaultyWriter("empty")
    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        writer=writer,
        fallback_writer=False,
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "writer-failed"
        (failed,) = [e for e in events if isinstance(e, WriterFailed)]
        assert "empty checkpoint" in failed.error
        assert not mw.layout.checkpoint_path(session.id).exists()
        assert await store.get_watermark(session.id) is None


async def test_notes_added_while_the_writer_runs_are_not_lost(tmp_path: Path) -> None:
    """The writer folds notes.md and empties it; a note written while it ran was not
    folded and must survive (in notes.md or in the checkpoint)."""
    writer = FaultyWriter("hang")
    async with ContextMiddleware(
        InMemoryStore(), tmp_path / "mem", model=LIMITS, writer=writer, fallback_writer=False
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=80_000)
        notes = mw.layout.notes_path(session.id)
        notes.parent.mkdir(parents=True)
        notes.write_text("- first note\n")
        assert await mw.start_writer(session.id, reason="notes") == "started"
        with anyio.fail_after(10):
            await writer.entered.wait()
        # The agent writes a note (memory tool, bash...) while the writer runs.
        notes.write_text("- first note\n- LATE NOTE added while the writer ran\n")
        writer.release.set()
        await settle(mw, session.id)
        checkpoint = mw.layout.checkpoint_path(session.id).read_text()
        assert "first note" in checkpoint
        assert "LATE NOTE" in notes.read_text() + checkpoint


GARBAGE_ANSWERS = [
    "",
    "   \n\n",
    "```\n```",
    "<html><body>502 Bad Gateway</body></html>",
    "I'm sorry, I can't help with that.",
    "Topic: x\n\n## 1. Active intent\n_q_\n(none)\n",  # 10 of 11 sections missing
    "\x00\x01\x02 binary \ufffd\ufffd",
    "Topic: x\n" + "## Random heading\n" * 11,
]


@pytest.mark.parametrize("answer", GARBAGE_ANSWERS, ids=range(len(GARBAGE_ANSWERS)))
def test_a14_garbage_llm_answers_are_rejected(answer: str) -> None:
    with pytest.raises(MimoCtxError, match="lacks sections"):
        parse_llm_answer(answer)


async def test_a14_llm_writer_garbage_falls_back_to_offline(store: Store, tmp_path: Path) -> None:
    """The model's answer is not a checkpoint: the LLM writer fails, the offline
    writer (the default fallback) writes the checkpoint, the rebuild succeeds."""
    events, on_event = recorder()

    async def complete(system: str, prompt: str) -> str:
        return "<html><body>502 Bad Gateway</body></html>"

    async with ContextMiddleware(
        store,
        tmp_path / "mem",
        model=LIMITS,
        writer=LLMCheckpointWriter(complete),
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        failed = [e for e in events if isinstance(e, WriterFailed)]
        finished = [e for e in events if isinstance(e, WriterFinished)]
        assert [e.writer for e in failed] == ["llm"]
        assert "lacks sections" in failed[0].error
        assert [e.writer for e in finished] == ["offline"]
        assert "502 Bad Gateway" not in mw.layout.checkpoint_path(session.id).read_text()


# --------------------------------------------------------------------------- memory files


async def test_memory_root_missing_is_created(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "does" / "not" / "exist"
    async with ContextMiddleware(store, root, model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        assert mw.layout.checkpoint_path(session.id).is_file()


async def test_memory_root_is_a_file_degrades_to_plain_compaction(
    store: Store, tmp_path: Path
) -> None:
    """The memory root cannot hold files: every writer fails (the event names the
    error), the rebuild falls back to a plain compaction; prepare() never raises."""
    events, on_event = recorder()
    root = tmp_path / "mem"
    root.write_text("not a directory")
    async with ContextMiddleware(store, root, model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert (view.rebuild.outcome, view.rebuild.fallback) == ("writer-failed", "compaction")
        assert any("NotADirectoryError" in e.error for e in events if isinstance(e, WriterFailed))
    assert root.read_text() == "not a directory"


def _patch_opener(
    monkeypatch: pytest.MonkeyPatch, target: Path, before_open: Callable[[Path], None]
) -> None:
    real = memory._open_nonblocking  # pyright: ignore[reportPrivateUsage]

    def opener(path: str, flags: int) -> int:
        if path == str(target):
            before_open(target)
        return real(path, flags)

    monkeypatch.setattr(memory, "_open_nonblocking", opener)


async def test_checkpoint_deleted_between_check_and_read(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint.md exists when the rebuild starts and is gone when it is read:
    the boundary is still inserted, without the checkpoint section (the user's words,
    the activity digest and the index part's "no checkpoints yet" remain)."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        await cross_line(mw, session.id)
        _patch_opener(monkeypatch, mw.layout.checkpoint_path(session.id), lambda p: p.unlink(True))
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        boundary = view.messages[0]
        assert view.rebuild.boundary_id == boundary.id
        assert "No checkpoints yet." in boundary.parts[1].model_dump_json()
        body = body_text(boundary)
        assert "# Session checkpoint" not in body
        assert "Refactor every module. Never touch tests." in body


async def test_notes_deleted_while_being_read(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """notes.md is unlinked right after it was opened: POSIX keeps the open file
    readable, so its whole content is read (nothing is half-read)."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        notes = mw.layout.notes_path(session.id)
        notes.write_text("- port 8080 is the dev server\n" * 50 + "- LAST NOTE\n")
        real_open = memory._open_nonblocking  # pyright: ignore[reportPrivateUsage]

        def open_then_unlink(path: str, flags: int) -> int:
            fd = real_open(path, flags)
            if path == str(notes):
                notes.unlink()
            return fd

        monkeypatch.setattr(memory, "_open_nonblocking", open_then_unlink)
        await cross_line(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        assert "- LAST NOTE" in body_text(view.messages[0])


def _deny_reads(monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
    """Make ``target`` unreadable. Tests may run as root (CI), where chmod 000 does
    not deny reads, so the open itself is made to fail as it would (EACCES)."""
    if os.name == "posix" and os.geteuid() != 0:
        target.chmod(0)
        return

    def deny(path: Path) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    _patch_opener(monkeypatch, target, deny)


@pytest.mark.parametrize("which", ["notes", "checkpoint", "project", "global"])
async def test_unreadable_memory_file_degrades_visibly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    """Expected: the boundary is inserted; the file's section keeps its heading and
    ``File:`` line with a one-line notice that it could not be read; a warning
    naming the file is logged."""
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        target = {
            "notes": mw.layout.notes_path(session.id),
            "checkpoint": mw.layout.checkpoint_path(session.id),
            "project": mw.layout.project_memory_path(session.project_id),
            "global": mw.layout.global_memory_path(),
        }[which]
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_text("## Rules\n- unreadable content\n")
        _deny_reads(monkeypatch, target)
        await cross_line(mw, session.id)
        with caplog.at_level(logging.WARNING, logger="mimo_ctx"):
            view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        body = body_text(view.messages[0])
        assert f"File: {target}\n" in body
        assert "could not be read" in body
        assert str(target) in caplog.text


async def test_unreadable_notes_fail_the_writer_not_the_host(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer reads notes.md; unreadable, the writer fails (the event gives the
    error, the log the path) and the rebuild falls back to a plain compaction. prepare() returns."""
    events, on_event = recorder()
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        notes = mw.layout.notes_path(session.id)
        notes.parent.mkdir(parents=True)
        notes.write_text("- a note\n")
        _deny_reads(monkeypatch, notes)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert (view.rebuild.outcome, view.rebuild.fallback) == ("writer-failed", "compaction")
        failed = [e for e in events if isinstance(e, WriterFailed)]
        assert any("Permission denied" in e.error for e in failed)
        assert notes.exists()


class _FullDisk:
    """A file object whose write hits ENOSPC after a partial write."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def write(self, data: bytes) -> int:
        self._handle.write(data[: len(data) // 3])
        raise OSError(errno.ENOSPC, "No space left on device")


async def test_disk_full_on_checkpoint_write_keeps_old_checkpoint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while writing checkpoint.md: the writer fails (event names the error),
    the old checkpoint is byte-identical, no temporary file is left, the watermark
    is unchanged, and the rebuild uses the old checkpoint."""
    events, on_event = recorder()
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM)
        old, watermark = await prime_checkpoint(mw, session.id)
        real_fdopen = os.fdopen

        def full_disk_fdopen(fd: int, mode: str) -> _FullDisk:
            return _FullDisk(real_fdopen(fd, mode))

        monkeypatch.setattr(os, "fdopen", full_disk_fdopen)
        await cross_line(mw, session.id, usage=85_000)
        assert await mw.start_writer(session.id, reason="full disk") == "started"
        await settle(mw, session.id)
        failed = [e for e in events if isinstance(e, WriterFailed)]
        assert failed
        assert "No space left on device" in failed[-1].error
        directory = mw.layout.session_dir(session.id)
        assert mw.layout.checkpoint_path(session.id).read_bytes() == old
        assert leftovers(directory) == []
        assert await store.get_watermark(session.id) == watermark
        monkeypatch.undo()
        await cross_line(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert (view.rebuild.outcome, view.rebuild.watermark)[0] == "rebuilt"


# --------------------------------------------------------------------------- the store


def _compacted(messages: list[Any]) -> int:
    return sum(
        1
        for m in messages
        for p in m.parts
        if isinstance(p, ToolPart)
        and isinstance(p.state, ToolStateCompleted)
        and p.state.time.compacted is not None
    )


@pytest.mark.parametrize("mode", ["inside", "after"])
async def test_r4_killed_during_commit_store_is_consistent(tmp_path: Path, mode: str) -> None:
    """A process is killed (os._exit, no cleanup) inside the rebuild transaction,
    after the boundary row was inserted and before micro-compaction -- or right
    after the commit. On restart the store holds both or neither: no boundary and
    no compacted result (then the next prepare rebuilds once), or the boundary with
    its compacted results (then nothing rebuilds again)."""
    db = tmp_path / "s.db"
    root = tmp_path / "mem"
    store = await SQLiteStore.open(db)
    async with ContextMiddleware(store, root, model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        await cross_line(mw, session.id)
    count = await store.count_messages(session.id)
    await store.aclose()

    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(KILL_WORKER), str(db), str(root), session.id, mode],
            env=env,
            check=False,
        )
    assert result.returncode == 9, result.stderr.decode()

    async with SQLiteStore(db) as reopened:
        stored = await reopened.list_messages(session.id, agent=None)
        if mode == "inside":
            assert boundaries(stored) == []
            assert _compacted(stored) == 0
            assert len(stored) == count
        else:
            assert len(boundaries(stored)) == 1
            assert _compacted(stored) > 0
            assert len(stored) == count + 1
        async with ContextMiddleware(reopened, root, model=LIMITS) as mw:
            view = await mw.prepare(session.id)
            assert (view.rebuild is not None) == (mode == "inside")
        stored = await reopened.list_messages(session.id, agent=None)
        assert len(boundaries(stored)) == 1
        assert _compacted(stored) > 0
        assert len(stored) == count + 1


async def test_r4_failure_inside_the_rebuild_transaction_rolls_back(
    sqlite_store: SQLiteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error inside the transaction (after the boundary insert): prepare()
    raises a StoreError naming the file, nothing of the rebuild is stored, the
    usage key stays free, and the next prepare() rebuilds."""
    store = sqlite_store
    original = SQLiteStore._update_contents  # pyright: ignore[reportPrivateUsage]

    def failing(
        self: SQLiteStore, conn: Any, rows: Any, insert_seqs: Any, what: str, *args: Any
    ) -> None:
        if what == "commit_rebuild":
            raise sqlite3.OperationalError("disk I/O error")
        original(self, conn, rows, insert_seqs, what, *args)

    def failing_edit(self: SQLiteStore, *args: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        await cross_line(mw, session.id)
        count = await store.count_messages(session.id)
        monkeypatch.setattr(SQLiteStore, "_update_contents", failing)
        # The cleared results are written as edits of their rows (or in full).
        monkeypatch.setattr(SQLiteStore, "_mark_compacted", failing_edit)
        with pytest.raises(StoreError, match=r"s\.db: disk I/O error"):
            await mw.prepare(session.id)
        stored = await store.list_messages(session.id, agent=None)
        assert boundaries(stored) == []
        assert _compacted(stored) == 0
        assert len(stored) == count
        monkeypatch.undo()
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        assert len(boundaries(await store.list_messages(session.id, agent=None))) == 1


async def test_r4_in_memory_commit_is_all_or_nothing(tmp_path: Path) -> None:
    """InMemoryStore: a commit whose micro-compaction names a missing message
    writes nothing (the boundary is not appended, the key stays free)."""
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        messages = await fill_to_trigger(mw, session.id)
        ghost = messages[-1].model_copy(update={"id": "msg_ghost"})
        boundary = messages[0].model_copy(update={"id": "msg_zzzz"})
        with pytest.raises(StoreError):
            await store.commit_rebuild(
                session.id, usage_key="k", boundary=boundary, updated=[ghost]
            )
        assert await store.get_message("msg_zzzz") is None
        assert await store.commit_rebuild(session.id, usage_key="k", boundary=boundary, updated=[])


def _wal_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _valid_db(path: Path) -> None:
    async with (
        SQLiteStore(path) as store,
        ContextMiddleware(store, path.parent / "m", model=LIMITS) as mw,
    ):
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)


@pytest.mark.parametrize("damage", ["text", "header", "pages", "truncated"])
async def test_corrupted_sqlite_file_clear_error_nothing_overwritten(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "agent.db"
    if damage == "text":
        path.write_text("this is my shopping list, not a database\n" * 100)
    else:
        await _valid_db(path)
        data = bytearray(path.read_bytes())
        if damage == "header":
            data[0:16] = b"NOT SQLITE AT AL"
        elif damage == "pages":
            for offset in range(4096, len(data), 4096):  # every page but the first
                data[offset : offset + 512] = os.urandom(512)
        else:
            data = data[: len(data) // 3]
        path.write_bytes(bytes(data))
    before = _digest(path)

    async def use() -> None:
        async with SQLiteStore(path) as store:
            sessions = await store.list_sessions()
            for session in sessions:
                await store.list_messages(session.id, agent=None)
            async with ContextMiddleware(store, tmp_path / "m", model=LIMITS) as mw:
                for session in sessions:
                    await mw.prepare(session.id)

    with pytest.raises(StoreError, match=path.name):
        await use()
    assert _digest(path) == before
    assert _wal_bytes(path) == 0


# --------------------------------------------------------------------------- provider errors


class _NoResponseYet(Exception):
    @property
    def status_code(self) -> int:
        raise RuntimeError("response not received")


class _Proxy(Exception):
    def __getattr__(self, name: str) -> Any:
        raise KeyError(name)


class _ClosedResponse:
    @property
    def status_code(self) -> int:
        raise ValueError("I/O operation on closed response")


class _BadResponse(Exception):
    response = _ClosedResponse()


class _BrokenStr(Exception):
    def __str__(self) -> str:
        raise TypeError("no str")


class _OddBody(Exception):
    status_code = "five hundred"
    body: ClassVar[list[Any]] = [
        1,
        None,
        {"error": {"code": 12, "message": ["nested", {"deep": b"x"}]}},
    ]
    code = object()


class _Huge(Exception):
    pass


UNKNOWN_ERRORS: list[Callable[[], BaseException]] = [
    lambda: _NoResponseYet("upstream failed"),
    lambda: _Proxy("proxy failed"),
    lambda: _BadResponse("bad response"),
    _BrokenStr,
    lambda: _OddBody("odd"),
    lambda: _Huge("x" * 1_000_000),
    lambda: ExceptionGroup("many", [ValueError("a"), TypeError("b")]),
    lambda: TimeoutError("read timed out"),
    lambda: ConnectionResetError(104, "Connection reset by peer"),
]


@pytest.mark.parametrize("make", UNKNOWN_ERRORS, ids=lambda f: type(f()).__name__)
async def test_r1_5_unknown_provider_errors_propagate_unchanged(
    tmp_path: Path, make: Callable[[], BaseException]
) -> None:
    """Errors that are not a recognisable overflow reach the caller as the very same
    object, and nothing is rebuilt or written."""
    store = InMemoryStore()
    events, on_event = recorder()
    error = make()
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=60_000)
        count = await store.count_messages(session.id)

        async def call(view: RequestView) -> Any:
            raise error

        with pytest.raises(BaseException) as info:
            await mw.turn(session.id, call)
        assert info.value is error
        assert await mw.on_error(session.id, error) is False
        assert await store.count_messages(session.id) == count
        assert not any(isinstance(e, ContextRebuilt) for e in events)


async def test_r1_5_overflow_still_recognised_next_to_unknown_shapes(tmp_path: Path) -> None:
    """The hardening does not hide a real overflow wrapped around a broken cause."""
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=60_000)
        error = FakeOverflowError(120_000, 100_000)
        error.__cause__ = _Proxy("inner")
        assert await mw.on_error(session.id, error) is True
        assert len(boundaries(await store.list_messages(session.id, agent=None))) == 1


@pytest.mark.parametrize(
    "error",
    [
        _NoResponseYet("prompt is too long: 120000 tokens > 100000 maximum"),
        _Proxy("This model's maximum context length is 8192 tokens"),
        _BadResponse("input is too long for requested model"),
    ],
    ids=["status-raises", "proxy", "response-raises"],
)
def test_r1_5_overflow_message_recognised_despite_broken_attributes(error: Exception) -> None:
    """A probe that raises is skipped, not fatal: the message still decides."""
    assert is_context_overflow(error) is True
