"""Tests of the memory directory module (SPEC A13, R5.6, A6)."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from mimo_ctx import memory
from mimo_ctx.errors import MimoCtxError, PathEscapeError
from mimo_ctx.memory import MemoryLayout, list_memory_files, read_text, write_text_atomic

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes and symlinks")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "memory"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the memory root, with a file in it."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.md").write_text("secret", encoding="utf-8")
    return path


@pytest.fixture
def layout(root: Path) -> MemoryLayout:
    return MemoryLayout(root)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ layout (A13)


def test_a13_paths(layout: MemoryLayout, root: Path) -> None:
    assert layout.root == root.resolve()
    assert layout.session_dir("ses_1") == root / "sessions" / "ses_1"
    assert layout.checkpoint_path("ses_1") == root / "sessions/ses_1/checkpoint.md"
    assert layout.notes_path("ses_1") == root / "sessions/ses_1/notes.md"
    assert layout.tasks_dir("ses_1") == root / "sessions/ses_1/tasks"
    assert (
        layout.task_progress_path("ses_1", "T1.2") == root / "sessions/ses_1/tasks/T1.2/progress.md"
    )
    assert layout.project_dir("proj") == root / "projects" / "proj"
    assert layout.project_memory_path("proj") == root / "projects/proj/MEMORY.md"
    assert layout.global_dir() == root / "global"
    assert layout.global_memory_path() == root / "global/MEMORY.md"


def test_a13_relative_paths_are_posix(layout: MemoryLayout) -> None:
    assert layout.relative(layout.checkpoint_path("s")) == "sessions/s/checkpoint.md"
    assert (
        layout.relative(layout.task_progress_path("s", "T1")) == "sessions/s/tasks/T1/progress.md"
    )
    assert layout.relative(layout.project_memory_path("p")) == "projects/p/MEMORY.md"
    assert layout.relative(layout.global_memory_path()) == "global/MEMORY.md"
    assert layout.relative(layout.root) == "."


def test_path_methods_create_nothing(layout: MemoryLayout, root: Path) -> None:
    layout.task_progress_path("s", "T1")
    layout.project_memory_path("p")
    assert list(root.iterdir()) == []


def test_root_is_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    layout = MemoryLayout("mem")
    assert layout.root == tmp_path.resolve() / "mem"
    assert "mem" in repr(layout)


@posix_only
def test_root_symlink_is_resolved(tmp_path: Path, root: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    layout = MemoryLayout(alias)
    assert layout.root == root.resolve()
    # A path spelled through the alias is still recognised as inside.
    assert layout.relative(alias / "global" / "MEMORY.md") == "global/MEMORY.md"


_BAD_IDS = ["", ".", "..", "a/b", "../x", "a\\b", "a\x00b", "/abs"]


_ID_METHODS: list[tuple[Callable[[MemoryLayout, str], Path], str]] = [
    (lambda lay, v: lay.session_dir(v), "session id"),
    (lambda lay, v: lay.checkpoint_path(v), "session id"),
    (lambda lay, v: lay.notes_path(v), "session id"),
    (lambda lay, v: lay.tasks_dir(v), "session id"),
    (lambda lay, v: lay.task_progress_path(v, "T1"), "session id"),
    (lambda lay, v: lay.task_progress_path("s", v), "task id"),
    (lambda lay, v: lay.project_dir(v), "project id"),
    (lambda lay, v: lay.project_memory_path(v), "project id"),
]


@pytest.mark.parametrize("bad", _BAD_IDS)
@pytest.mark.parametrize(("method", "what"), _ID_METHODS)
def test_r5_6_bad_ids_are_refused(
    layout: MemoryLayout, method: Callable[[MemoryLayout, str], Path], what: str, bad: str
) -> None:
    with pytest.raises(PathEscapeError, match=what) as info:
        method(layout, bad)
    assert isinstance(info.value, MimoCtxError)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("good", ["ses_01JABC", "T1.2", "a..b", "proj-name with spaces", "日本"])
def test_ids_that_are_one_plain_component_are_accepted(layout: MemoryLayout, good: str) -> None:
    assert layout.session_dir(good).name == good
    assert layout.project_dir(good).parent == layout.root / "projects"


# ------------------------------------------------------------------ resolve / relative


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("sessions/s/notes.md", "sessions/s/notes.md"),
        ("./global/MEMORY.md", "global/MEMORY.md"),
        ("global//prefs.md", "global/prefs.md"),
        ("a..b/c.md", "a..b/c.md"),
        (".", "."),
        ("", "."),
    ],
)
def test_resolve_keeps_paths_under_the_root(
    layout: MemoryLayout, relative: str, expected: str
) -> None:
    resolved = layout.resolve(relative)
    assert resolved.is_absolute()
    assert layout.relative(resolved) == expected
    assert layout.relative(relative) == expected


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("/etc/passwd", "absolute"),
        ("//server/share/x.md", "absolute"),
        ("C:\\Windows\\x.md", "absolute"),
        ("C:x.md", "absolute"),
        ("\\\\server\\share\\x.md", "absolute"),
        ("..", r"'\.\.'"),
        ("../outside/secret.md", r"'\.\.'"),
        ("sessions/../../x.md", r"'\.\.'"),
        ("sessions/s/..", r"'\.\.'"),
        ("sessions/../global/MEMORY.md", r"'\.\.'"),  # stays inside, still refused
        ("a\x00b.md", "NUL"),
    ],
)
def test_r5_6_resolve_refuses_escapes(layout: MemoryLayout, bad: str, reason: str) -> None:
    with pytest.raises(PathEscapeError, match=reason) as info:
        layout.resolve(bad)
    assert repr(bad) in str(info.value)


@posix_only
def test_r5_6_resolve_refuses_symlinks_out(layout: MemoryLayout, root: Path, outside: Path) -> None:
    (root / "sessions").mkdir()
    (root / "sessions" / "out").symlink_to(outside, target_is_directory=True)
    (root / "file-out.md").symlink_to(outside / "secret.md")
    (root / "dangling-out.md").symlink_to(outside / "does-not-exist.md")
    for bad in ("sessions/out/secret.md", "sessions/out", "file-out.md", "dangling-out.md"):
        with pytest.raises(PathEscapeError, match="symlink"):
            layout.resolve(bad)
        with pytest.raises(PathEscapeError):
            layout.relative(root / bad)


@posix_only
def test_resolve_accepts_symlinks_inside(layout: MemoryLayout, root: Path) -> None:
    target = _write(root / "global" / "prefs.md")
    (root / "alias.md").symlink_to(target)
    (root / "g").symlink_to(root / "global", target_is_directory=True)
    assert layout.resolve("alias.md") == root / "alias.md"
    assert layout.resolve("g/prefs.md") == root / "g" / "prefs.md"
    assert layout.relative(root / "g" / "prefs.md") == "g/prefs.md"


def test_relative_refuses_paths_outside(layout: MemoryLayout, root: Path, outside: Path) -> None:
    for bad in (outside / "secret.md", root.parent, root / ".." / "outside" / "secret.md"):
        with pytest.raises(PathEscapeError, match="outside the memory root"):
            layout.relative(bad)
    with pytest.raises(PathEscapeError):
        layout.relative("../outside/secret.md")


def test_relative_normalises_lexically_inside_paths(layout: MemoryLayout, root: Path) -> None:
    assert layout.relative(root / "sessions" / ".." / "global" / "MEMORY.md") == "global/MEMORY.md"


def test_path_escape_error_is_a_value_error() -> None:
    assert issubclass(PathEscapeError, ValueError)
    assert issubclass(PathEscapeError, MimoCtxError)


# ------------------------------------------------------------------ read_text


async def test_read_text_missing_file_is_none(root: Path) -> None:
    assert await read_text(root / "absent.md") is None
    assert await read_text(root / "no" / "such" / "dir.md") is None
    _write(root / "file.md")
    assert await read_text(root / "file.md" / "child.md") is None  # parent is a file


async def test_read_text_directory_is_none(root: Path) -> None:
    assert await read_text(root) is None


async def test_read_text_utf8(root: Path) -> None:
    text = "# Title\n\n修复登录 🎉 — ok\n"
    path = _write(root / "a.md", text)
    assert await read_text(path) == text
    assert await read_text(str(path)) == text


async def test_read_text_empty_file(root: Path) -> None:
    assert await read_text(_write(root / "empty.md", "")) == ""


async def test_read_text_invalid_utf8_is_replaced(root: Path) -> None:
    path = root / "bad.md"
    path.write_bytes(b"ok \xff\xfe then \xc3( end")
    assert await read_text(path) == "ok \ufffd\ufffd then \ufffd( end"


async def test_read_text_drops_bom_and_normalises_newlines(root: Path) -> None:
    path = root / "win.md"
    path.write_bytes(b"\xef\xbb\xbf# T\r\nline\rold-mac\n")
    assert await read_text(path) == "# T\nline\nold-mac\n"


async def test_read_text_binary_file_is_none(root: Path) -> None:
    path = root / "image.md"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert await read_text(path) is None


@posix_only
async def test_read_text_fifo_and_device_are_none(root: Path) -> None:
    fifo = root / "pipe.md"
    os.mkfifo(fifo)
    # Without a writer, opening a FIFO for reading would block forever.
    with anyio.fail_after(10):
        assert await read_text(fifo) is None
    device = root / "null.md"
    device.symlink_to("/dev/null")
    assert await read_text(device) is None


async def test_read_text_nul_after_the_first_8_kib_is_text(root: Path) -> None:
    path = root / "late-nul.md"
    path.write_bytes(b"a" * 8192 + b"\x00b")
    assert await read_text(path) == "a" * 8192 + "\x00b"


async def test_read_text_chunk_boundaries(root: Path) -> None:
    # A CRLF pair and a multi-byte character straddling the 8 KiB and 72 KiB reads.
    path = root / "edges.md"
    data = b"a" * 8191 + b"\r\nb" + b"c" * (65536 - 4) + "é🎉".encode() + b"\r\n"
    path.write_bytes(data)
    assert await read_text(path) == data.decode("utf-8").replace("\r\n", "\n")


@pytest.mark.parametrize("max_chars", [0, 1, 5, 8191, 8192, 70_000, 10**9])
async def test_read_text_max_chars(root: Path, max_chars: int) -> None:
    text = ("é🎉abc\n" * 20_000)[:100_000]
    path = _write(root / "big.md", text)
    assert await read_text(path, max_chars=max_chars) == text[:max_chars]


async def test_read_text_max_chars_reads_a_bounded_amount(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = root / "huge.md"
    path.write_bytes(b"0123456789abcdef\n" * 200_000)  # 3.4 MB
    read_bytes: list[int] = []
    real_read = memory._read_chunk  # pyright: ignore[reportPrivateUsage]

    def counting_read(fd: int, size: int) -> bytes:
        data = real_read(fd, size)
        read_bytes.append(len(data))
        return data

    monkeypatch.setattr(memory, "_read_chunk", counting_read)
    text = await read_text(path, max_chars=100)
    assert text == ("0123456789abcdef\n" * 10)[:100]
    assert sum(read_bytes) <= 8192 + 65536


async def test_read_text_rejects_negative_max_chars(root: Path) -> None:
    with pytest.raises(ValueError, match="max_chars"):
        await read_text(root / "a.md", max_chars=-1)


# ------------------------------------------------------------------ write_text_atomic


async def test_write_text_atomic_creates_parents_and_writes_exactly(root: Path) -> None:
    path = root / "sessions" / "s" / "tasks" / "T1" / "progress.md"
    text = "# Progress\r\nkept as given: CRLF, é, 🎉\n"
    await write_text_atomic(path, text)
    assert path.read_bytes() == text.encode("utf-8")
    assert _names(path.parent) == ["progress.md"]


async def test_write_text_atomic_replaces_content(root: Path) -> None:
    path = _write(root / "checkpoint.md", "old " * 1000)
    await write_text_atomic(str(path), "new")
    assert path.read_text(encoding="utf-8") == "new"
    assert _names(root) == ["checkpoint.md"]


@pytest.mark.parametrize("failing", ["replace", "fsync", "write"])
async def test_write_text_atomic_failure_keeps_the_old_file(
    root: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = _write(root / "checkpoint.md", "old content")

    def boom(*args: object, **kwargs: object) -> Any:
        raise OSError(28, "No space left on device")

    if failing == "write":
        real_fdopen = os.fdopen

        class _FailingFile:
            def __init__(self, handle: Any) -> None:
                self._handle = handle

            def __enter__(self) -> _FailingFile:
                return self

            def __exit__(self, *exc: object) -> None:
                self._handle.close()

            def write(self, data: bytes) -> int:
                self._handle.write(data[: len(data) // 2])  # a partial write, then failure
                raise OSError(28, "No space left on device")

        def failing_fdopen(fd: int, mode: str) -> _FailingFile:
            return _FailingFile(real_fdopen(fd, mode))

        monkeypatch.setattr(os, "fdopen", failing_fdopen)
    else:
        monkeypatch.setattr(os, failing, boom)

    with pytest.raises(OSError, match="No space left"):
        await write_text_atomic(path, "new content that never lands")
    assert path.read_text(encoding="utf-8") == "old content"
    assert _names(root) == ["checkpoint.md"], "temporary file removed"


async def test_write_text_atomic_lone_surrogate_writes_nothing(root: Path) -> None:
    path = _write(root / "notes.md", "old")
    with pytest.raises(UnicodeEncodeError):
        await write_text_atomic(path, "broken \ud83d")
    assert path.read_text(encoding="utf-8") == "old"
    assert _names(root) == ["notes.md"]


@posix_only
async def test_write_text_atomic_keeps_the_file_mode(root: Path) -> None:
    path = _write(root / "MEMORY.md", "old")
    path.chmod(0o640)
    await write_text_atomic(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


async def test_write_text_atomic_concurrent_writers_never_mix(root: Path) -> None:
    path = root / "checkpoint.md"
    texts = [f"version {i}\n" * 2000 for i in range(20)]
    async with anyio.create_task_group() as group:
        for text in texts:
            group.start_soon(write_text_atomic, path, text)
    assert path.read_text(encoding="utf-8") in texts
    assert _names(root) == ["checkpoint.md"]


async def test_write_then_read_round_trip(root: Path) -> None:
    path = root / "global" / "MEMORY.md"
    await write_text_atomic(path, "# Global\n\n## Rules\n- be kind\n")
    assert await read_text(path) == "# Global\n\n## Rules\n- be kind\n"


# ------------------------------------------------------------------ list_memory_files (R5.6)


def _tree(root: Path) -> None:
    for relative in [
        "sessions/s1/checkpoint.md",  # injected: not listed
        "sessions/s1/notes.md",
        "sessions/s1/checkpoint-auth-flow.md",  # overflow file (A14): listed
        "sessions/s1/checkpoint-learning.md",  # learning files: never listed (A6)
        "sessions/s1/checkpoint-learning-2026.md",
        "sessions/s1/tasks/T1/progress.md",
        "sessions/s1/tasks/T1.2/progress.md",
        "sessions/s1/deep/er/MEMORY.md",  # not the injected one: listed
        "sessions/s1/readme.txt",  # not markdown
        "sessions/s1/.draft.md",  # hidden
        "sessions/s1/.checkpoint.md.0a1b2c.tmp",  # a crashed atomic write
        "sessions/s1/UPPER.MD",  # the suffix is case-sensitive
        "sessions/s2/other-session.md",  # another session: never listed
        "projects/p1/MEMORY.md",  # injected: not listed
        "projects/p1/architecture.md",
        "projects/p2/other-project.md",  # another project: never listed
        "global/MEMORY.md",  # injected: not listed
        "global/preferences.md",
        "stray.md",  # outside every scope
    ]:
        _write(root / relative)


async def test_r5_6_list_memory_files(layout: MemoryLayout, root: Path) -> None:
    _tree(root)
    assert await list_memory_files(layout, session_id="s1", project_id="p1") == [
        "global/preferences.md",
        "projects/p1/architecture.md",
        "sessions/s1/checkpoint-auth-flow.md",
        "sessions/s1/deep/er/MEMORY.md",
        "sessions/s1/notes.md",
        "sessions/s1/tasks/T1.2/progress.md",
        "sessions/s1/tasks/T1/progress.md",
    ]


async def test_r5_6_list_memory_files_other_session_and_no_project(
    layout: MemoryLayout, root: Path
) -> None:
    _tree(root)
    assert await list_memory_files(layout, session_id="s2", project_id=None) == [
        "global/preferences.md",
        "sessions/s2/other-session.md",
    ]


async def test_r5_6_list_memory_files_empty_root(layout: MemoryLayout) -> None:
    assert await list_memory_files(layout, session_id="s1", project_id="p1") == []
    assert (
        await list_memory_files(
            MemoryLayout(layout.root / "absent"), session_id="s", project_id="p"
        )
        == []
    )


async def test_r5_6_list_memory_files_sees_files_written_since(
    layout: MemoryLayout, root: Path
) -> None:
    assert await list_memory_files(layout, session_id="s1", project_id="p1") == []
    _write(root / "sessions" / "s1" / "late.md")
    assert await list_memory_files(layout, session_id="s1", project_id="p1") == [
        "sessions/s1/late.md"
    ]


@pytest.mark.parametrize(("session_id", "project_id"), [("..", "p"), ("s", "../p"), ("a/b", None)])
async def test_r5_6_list_memory_files_refuses_bad_ids(
    layout: MemoryLayout, session_id: str, project_id: str | None
) -> None:
    with pytest.raises(PathEscapeError):
        await list_memory_files(layout, session_id=session_id, project_id=project_id)


@posix_only
async def test_r5_6_list_memory_files_never_leaves_the_root(
    layout: MemoryLayout, root: Path, outside: Path
) -> None:
    session = root / "sessions" / "s1"
    target_inside = _write(root / "projects" / "p1" / "architecture.md")
    _write(session / "notes.md")
    (session / "link-out.md").symlink_to(outside / "secret.md")
    (session / "dangling.md").symlink_to(outside / "nothing.md")
    (session / "dir-out").symlink_to(outside, target_is_directory=True)
    (session / "link-in.md").symlink_to(target_inside)
    # A directory symlink, even inside the root, is not followed (no loops, no
    # file listed twice under two paths).
    (session / "dir-in").symlink_to(root / "projects", target_is_directory=True)
    (session / "loop").symlink_to(session, target_is_directory=True)
    (session / "dir-link.md").symlink_to(root / "projects", target_is_directory=True)
    assert await list_memory_files(layout, session_id="s1", project_id="p1") == [
        "projects/p1/architecture.md",
        "sessions/s1/link-in.md",
        "sessions/s1/notes.md",
    ]


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system accepting any bytes")
async def test_list_memory_files_skips_names_that_are_not_utf8(
    layout: MemoryLayout, root: Path
) -> None:
    session = layout.session_dir("s1")
    session.mkdir(parents=True)
    _write(session / "fine.md")
    (session / os.fsdecode(b"bad-\xff.md")).write_text("x", encoding="utf-8")
    assert await list_memory_files(layout, session_id="s1", project_id=None) == [
        "sessions/s1/fine.md"
    ]


@posix_only
async def test_r5_6_scope_directory_symlinked_out_is_skipped(
    layout: MemoryLayout, root: Path, outside: Path
) -> None:
    (root / "sessions").mkdir()
    (root / "sessions" / "s1").symlink_to(outside, target_is_directory=True)
    (root / "global").symlink_to(outside, target_is_directory=True)
    assert await list_memory_files(layout, session_id="s1", project_id="p1") == []


async def test_list_memory_files_runs_off_the_event_loop(
    layout: MemoryLayout, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(root)
    calls: list[object] = []
    real = memory.anyio.to_thread.run_sync

    async def recording(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(memory.anyio.to_thread, "run_sync", recording)
    assert await list_memory_files(layout, session_id="s1", project_id="p1")
    assert len(calls) == 1


async def test_read_cancelled_while_opening_leaves_no_open_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader cancelled while the worker thread opens the file (a writer being
    cancelled at shutdown) closes it: no descriptor is left for the GC to find."""
    import gc
    import threading
    import warnings

    path = tmp_path / "checkpoint.state.json"
    path.write_text('{"digest": "x"}', encoding="utf-8")
    entered, release = threading.Event(), threading.Event()
    real_open = memory._open_nonblocking  # pyright: ignore[reportPrivateUsage]

    def slow_open(name: str, flags: int) -> int:
        entered.set()
        release.wait(10)
        return real_open(name, flags)

    monkeypatch.setattr(memory, "_open_nonblocking", slow_open)
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_text, path)
                await anyio.to_thread.run_sync(entered.wait)
                tg.cancel_scope.cancel()
                release.set()
        for _ in range(20):  # the executor thread finishes the open meanwhile
            await anyio.sleep(0.01)
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert unraisable == []


async def test_read_text_whole_file_in_few_reads(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a bound the file's size is known: the sniff, then the whole file in
    # one read of its size and a byte more (the short read is the end), all in one
    # worker-thread call (a megabyte used to take a dozen round trips).
    path = root / "large.md"
    path.write_bytes(("é🎉 line\r\n" * 100_000).encode())
    sizes: list[int] = []
    real_read = memory._read_chunk  # pyright: ignore[reportPrivateUsage]

    def counting_read(fd: int, size: int) -> bytes:
        sizes.append(size)
        return real_read(fd, size)

    hops: list[object] = []
    real_run_sync = memory.anyio.to_thread.run_sync

    async def counting_run_sync(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return await real_run_sync(func, *args, **kwargs)

    monkeypatch.setattr(memory, "_read_chunk", counting_read)
    monkeypatch.setattr(memory.anyio.to_thread, "run_sync", counting_run_sync)
    text = await read_text(path, root=root)
    assert text == "é🎉 line\n" * 100_000
    assert sizes == [8192, path.stat().st_size + 1]
    assert len(hops) == 1
