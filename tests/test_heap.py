"""The heap release after rebuilds (mimo_ctx._heap, RebuildConfig.release_memory_after_rebuild)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.from_thread
import pytest

import mimo_ctx._heap as heap
from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import ContextRebuilt, Event
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import InMemoryStore
from mimo_ctx.testing import ScriptedModel, ScriptStep, tool_round
from mimo_ctx.triggers import ModelLimits


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return False


@pytest.fixture(autouse=True)
def _fresh_lookup() -> Iterator[None]:
    heap._load_trim.cache_clear()  # pyright: ignore[reportPrivateUsage]
    yield
    heap._load_trim.cache_clear()  # pyright: ignore[reportPrivateUsage]


def _answers(version: str) -> Callable[[str], str]:
    def confstr(name: str) -> str:
        assert name == "CS_GNU_LIBC_VERSION"
        return version

    return confstr


def test_without_glibc_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_glibc(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(heap.os, "confstr", no_glibc)
    assert heap.release_free_heap() is False
    monkeypatch.setattr(heap.os, "confstr", _answers("musl 1.2"))
    heap._load_trim.cache_clear()  # pyright: ignore[reportPrivateUsage]
    assert heap.release_free_heap() is False


def test_glibc_trims_every_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    class FakeTrim:
        argtypes: object = None
        restype: object = None

        def __call__(self, pad: int) -> int:
            calls.append(pad)
            return 1

    class FakeLibc:
        malloc_trim = FakeTrim()

    opened: list[str] = []

    def cdll(name: str) -> FakeLibc:
        opened.append(name)
        return FakeLibc()

    monkeypatch.setattr(heap.os, "confstr", _answers("glibc 2.36"))
    monkeypatch.setattr(heap.ctypes, "CDLL", cdll)
    assert heap.release_free_heap() is True
    assert heap.release_free_heap() is True
    assert calls == [0, 0]  # pad 0: every arena, keep nothing spare
    assert opened == ["libc.so.6"]  # looked up once


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's; other C libraries have none")
def test_freed_blocks_between_live_ones_go_back_to_the_system() -> None:
    # 100 KB blocks stay below glibc's mmap threshold, so they come from the heap;
    # keeping every tenth one pins the heap's top, so free() alone returns nothing.
    blocks = [bytes(100_000) + bytes([i % 256]) for i in range(2_000)]
    kept = blocks[::10]
    del blocks
    before = _rss_anon_kib()
    assert heap.release_free_heap() is True
    after = _rss_anon_kib()
    assert before - after > 100_000, (before, after)  # ~180 MB were free inside the heap
    assert len(kept) == 200


LIMITS = ModelLimits(100_000, input_limit=100_000)


async def _rebuild_once(tmp_path: Path, config: RebuildConfig) -> tuple[list[Event], int]:
    released: list[int] = []
    events: list[Event] = []
    done = anyio.Event()

    def fake_release() -> bool:  # runs in a worker thread
        released.append(1)
        anyio.from_thread.run_sync(done.set)
        return True

    model = ScriptedModel(
        [tool_round("grep", 3000, seed=i, pattern=f"p{i}") for i in range(8)]
        + [ScriptStep(text="Done.")]
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heap, "release_free_heap", fake_release)
        async with ContextMiddleware(
            InMemoryStore(), tmp_path / "mem", model=LIMITS, config=config, on_event=events.append
        ) as mw:
            session = await mw.open_session(system="You are careful.")
            await mw.add_user_message(session.id, "Search the repo.")
            for _ in range(9):
                await mw.turn(session.id, model.complete)
            assert not released  # turns alone release nothing
            report = await mw.rebuild(session.id)
            assert report.outcome == "rebuilt"
            # It runs in the background, off the loop (leaving would cancel it).
            # Turned off, give it the time it would take all the same.
            with anyio.move_on_after(5 if config.release_memory_after_rebuild else 0.3):
                await done.wait()
            await mw.turn(session.id, model.complete)
    return events, len(released)


async def test_a_rebuild_releases_the_heap_once(tmp_path: Path) -> None:
    events, released = await _rebuild_once(tmp_path, RebuildConfig())
    assert [e.outcome for e in events if isinstance(e, ContextRebuilt)] == ["rebuilt"]
    assert released == 1


async def test_the_release_can_be_turned_off(tmp_path: Path) -> None:
    _, released = await _rebuild_once(tmp_path, RebuildConfig(release_memory_after_rebuild=False))
    assert released == 0
