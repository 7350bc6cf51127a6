"""The read cache of :func:`mimo_ctx.memory.read_text` (R5.6 reads; issue 9).

Unchanged memory files are served from memory; a file that changed (or changed
too recently for its timestamps to tell) is always read again.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mimo_ctx import memory
from mimo_ctx.memory import read_text


async def test_just_written_file_is_not_cached(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("fresh\n", encoding="utf-8")
    assert await read_text(path) == "fresh\n"
    # Its mtime is within the racy window: a same-size rewrite could keep it.
    assert (str(path), None) not in memory._read_cache  # pyright: ignore[reportPrivateUsage]
    path.write_text("FRESH\n", encoding="utf-8")
    assert await read_text(path) == "FRESH\n"


async def test_stable_file_is_served_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("one\n", encoding="utf-8")
    old = os.stat(path).st_mtime_ns - 3_600_000_000_000
    os.utime(path, ns=(old, old))
    # Treat every file as stable (its ctime is still now: it cannot be set back).
    monkeypatch.setattr(memory, "_STABLE_NS", -(10**18))
    assert await read_text(path, max_chars=100) == "one\n"
    assert (str(path), 100) in memory._read_cache  # pyright: ignore[reportPrivateUsage]
    assert await read_text(path, max_chars=100) == "one\n"  # a hit
    assert await read_text(path, max_chars=2) == "on"  # another bound: its own entry
    path.write_text("two, longer\n", encoding="utf-8")
    assert await read_text(path, max_chars=100) == "two, longer\n"
    path.unlink()
    assert await read_text(path, max_chars=100) is None


async def test_read_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_STABLE_NS", -(10**18))
    entries = memory._READ_CACHE_ENTRIES  # pyright: ignore[reportPrivateUsage]
    for i in range(2 * entries):
        path = tmp_path / f"f{i}.md"
        path.write_text(f"file {i}\n", encoding="utf-8")
        assert await read_text(path) == f"file {i}\n"
    assert len(memory._read_cache) <= entries  # pyright: ignore[reportPrivateUsage]
