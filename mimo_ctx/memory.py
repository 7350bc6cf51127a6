"""The memory directory: layout, safe paths, text reads and atomic writes (SPEC A13, R5.6).

Layout (SPEC A13; every path is under one *memory root*)::

    <root>/sessions/<session_id>/checkpoint.md
    <root>/sessions/<session_id>/checkpoint-<topic>.md      overflow files (A14)
    <root>/sessions/<session_id>/notes.md
    <root>/sessions/<session_id>/tasks/<task_id>/progress.md
    <root>/projects/<project_id>/MEMORY.md
    <root>/global/MEMORY.md

Safety. Nothing here ever touches a path outside the root (SPEC R5.6):

* ids used as path components (session, project and task ids) must be a single
  plain component — not empty, at most :data:`~mimo_ctx.session.MAX_ID_BYTES` bytes, no ``/`` or
  ``\\``, not ``.`` or ``..``, no control character, line separator or lone
  surrogate — else :class:`~mimo_ctx.errors.InvalidIdError` (:func:`~mimo_ctx.session.check_id`);
* :meth:`MemoryLayout.resolve` refuses absolute paths, any ``..`` component, and
  paths that leave the root through a symlink;
* :func:`list_memory_files` does not descend into symlinked directories and lists
  a symlinked file only when its target is a regular file inside the root, so
  each file is listed once, under one path.

Reads and writes are async: :func:`read_text` (bounded by ``max_chars``),
:func:`write_text_atomic` and :func:`list_memory_files` each do their blocking
work in one worker-thread call (:func:`anyio.to_thread.run_sync`).
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath
from typing import Final

import anyio.to_thread

from mimo_ctx.errors import PathEscapeError
from mimo_ctx.session import check_id

__all__ = [
    "CHECKPOINT_LEARNING_PREFIX",
    "MemoryLayout",
    "is_hard_link",
    "list_memory_files",
    "read_text",
    "read_text_blocking",
    "write_text_atomic",
]

CHECKPOINT_LEARNING_PREFIX: Final = "checkpoint-learning"
"""Files named ``checkpoint-learning*.md`` are the writer's scratch notes of what it
learnt; like the original, the memory keys index never lists them (SPEC A6)."""

_SNIFF_BYTES: Final = 8192
_CHUNK_BYTES: Final = 65536
_MAX_CHUNK_BYTES: Final = 4 * 1024 * 1024
_TEMP_SUFFIX: Final = ".tmp"


class MemoryLayout:
    """Where memory files live under one root (SPEC A13).

    Path methods only compute paths; they create nothing. The root is made
    absolute and its symlinks resolved once, at construction, so containment
    checks compare real paths.

    Args:
        root: The memory root directory (it need not exist yet).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(os.path.realpath(os.fspath(root)))

    def __repr__(self) -> str:
        return f"MemoryLayout({str(self._root)!r})"

    @property
    def root(self) -> Path:
        """The absolute, symlink-free memory root."""
        return self._root

    # -- session ----------------------------------------------------------------------------
    def session_dir(self, session_id: str) -> Path:
        """``<root>/sessions/<session_id>``."""
        return self._root / "sessions" / check_id(session_id, "session id")

    def checkpoint_path(self, session_id: str) -> Path:
        """``<root>/sessions/<session_id>/checkpoint.md``."""
        return self.session_dir(session_id) / "checkpoint.md"

    def checkpoint_state_path(self, session_id: str) -> Path:
        """``<root>/sessions/<session_id>/checkpoint.state.json`` (the offline writer's state)."""
        return self.session_dir(session_id) / "checkpoint.state.json"

    def notes_path(self, session_id: str) -> Path:
        """``<root>/sessions/<session_id>/notes.md``."""
        return self.session_dir(session_id) / "notes.md"

    def tasks_dir(self, session_id: str) -> Path:
        """``<root>/sessions/<session_id>/tasks``."""
        return self.session_dir(session_id) / "tasks"

    def task_progress_path(self, session_id: str, task_id: str) -> Path:
        """``<root>/sessions/<session_id>/tasks/<task_id>/progress.md`` (SPEC A16)."""
        return self.tasks_dir(session_id) / check_id(task_id, "task id") / "progress.md"

    # -- project and global -----------------------------------------------------------------
    def project_dir(self, project_id: str) -> Path:
        """``<root>/projects/<project_id>``."""
        return self._root / "projects" / check_id(project_id, "project id")

    def project_memory_path(self, project_id: str) -> Path:
        """``<root>/projects/<project_id>/MEMORY.md``."""
        return self.project_dir(project_id) / "MEMORY.md"

    def global_dir(self) -> Path:
        """``<root>/global``."""
        return self._root / "global"

    def global_memory_path(self) -> Path:
        """``<root>/global/MEMORY.md``."""
        return self.global_dir() / "MEMORY.md"

    # -- safe paths -------------------------------------------------------------------------
    def contains(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path``'s real location (symlinks resolved) is the root or inside it."""
        return Path(os.path.realpath(os.fspath(path))).is_relative_to(self._root)

    def resolve(self, relative: str | os.PathLike[str]) -> Path:
        """Turn a path relative to the root into an absolute path under the root.

        ``.`` components are dropped; the result keeps the caller's spelling (it is
        not symlink-resolved), but its real location is checked to be inside the root.
        This touches the file system (to follow symlinks) but does not block for long.

        Args:
            relative: A relative path such as ``sessions/ses_1/notes.md``; ``/`` is the
                separator on every platform.

        Raises:
            PathEscapeError: ``relative`` is absolute, contains a ``..`` component or a
                NUL character, or leads outside the root through a symlink.
        """
        text = os.fspath(relative)
        if "\x00" in text:
            raise PathEscapeError(f"memory path {text!r} contains a NUL character")
        if (
            PurePosixPath(text).is_absolute()
            or PureWindowsPath(text).anchor
            or PurePath(text).is_absolute()
        ):
            raise PathEscapeError(f"memory path {text!r} is absolute; expected a relative path")
        parts = PurePath(text).parts
        if ".." in parts or ".." in PurePosixPath(text).parts:
            raise PathEscapeError(f"memory path {text!r} contains '..'")
        candidate = self._root.joinpath(*parts)
        if not self.contains(candidate):
            raise PathEscapeError(
                f"memory path {text!r} leads outside the memory root {str(self._root)!r} "
                "through a symlink"
            )
        return candidate

    def relative(self, path: str | os.PathLike[str]) -> str:
        """Return ``path`` relative to the root, as a POSIX path (``.`` for the root).

        An absolute path must be inside the root; a relative one is taken as
        relative to the root and checked as :meth:`resolve` does.

        Raises:
            PathEscapeError: ``path`` is (or leads through a symlink) outside the root.
        """
        text = os.fspath(path)
        if "\x00" in text:
            raise PathEscapeError(f"memory path {text!r} contains a NUL character")
        given = Path(text)
        if not given.is_absolute():
            resolved = self.resolve(given)
            return resolved.relative_to(self._root).as_posix()
        lexical = Path(os.path.normpath(given))
        if lexical.is_relative_to(self._root):
            inside = lexical
        else:
            # The caller may spell the root differently (through a symlink such as
            # macOS's /tmp -> /private/tmp); its real location decides.
            inside = Path(os.path.realpath(given))
            if not inside.is_relative_to(self._root):
                raise PathEscapeError(
                    f"path {text!r} is outside the memory root {str(self._root)!r}"
                )
        if not self.contains(inside):
            raise PathEscapeError(
                f"path {text!r} leads outside the memory root {str(self._root)!r} through a symlink"
            )
        return inside.relative_to(self._root).as_posix()


def _open_nonblocking(path: str, flags: int) -> int:
    # Opening a FIFO for reading blocks until a writer appears; O_NONBLOCK makes the
    # open return at once (it changes nothing for regular files), and read_text then
    # refuses anything that is not a regular file.
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def is_hard_link(info: os.stat_result) -> bool:
    """True for a regular file with more than one name (a hard link).

    A path check cannot see where a hard link's other name is: a file linked into a
    session directory from outside the memory root (or from another session) looks
    like any file inside it. Memory files are written by atomic rename and have one
    name, so one with more is refused wherever a memory file is read.
    """
    return stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def _contained(path: str, root: str | os.PathLike[str], action: str) -> str:
    """The real location of ``path`` (symlinks resolved), refused when outside ``root``."""
    real = os.path.realpath(path)
    base: str = os.path.realpath(Path(root))
    if not Path(real).is_relative_to(base):
        raise PathEscapeError(
            f"refusing to {action} {path!r}: it leads outside the memory root {base!r} "
            "through a symlink"
        )
    return real


async def read_text(
    path: str | os.PathLike[str],
    *,
    max_chars: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> str | None:
    """Read a memory file as text.

    Decoding: UTF-8 (a leading byte-order mark is dropped); invalid bytes become
    U+FFFD; line endings are normalised to ``\\n`` as in Python's text mode.

    Args:
        path: The file.
        max_chars: Return at most this many characters; only about that much of the
            file is read, so huge files cost bounded memory.
        root: The memory root. When given, a ``path`` whose real location (symlinks
            resolved) is outside it is refused, and the real location is what is
            opened (SPEC R5.6: a symlink cannot pull an outside file into a prompt).

    Returns:
        The text, or ``None`` when there is no such file (missing, or a directory),
        it is not a regular file (a FIFO, a device), or it is not a text file (a
        NUL byte in its first 8 KiB).

    Raises:
        ValueError: ``max_chars`` is negative.
        OSError: The file exists but cannot be read (permissions, I/O error).
        PathEscapeError: ``root`` is given and ``path`` leads outside it.
    """
    if max_chars is not None and max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars!r}")
    # One worker-thread call does it all (containment, open, stat, the reads, the
    # decoding): each await of a thread costs a round trip through the event loop,
    # and a megabyte read in chunks took a dozen of them. The call is not
    # cancellable once started (anyio waits for the thread), and the file is closed
    # in it whatever happens, so no descriptor leaks.
    return await anyio.to_thread.run_sync(_read_text_sync, os.fspath(path), max_chars, root)


def read_text_blocking(
    path: str | os.PathLike[str],
    *,
    max_chars: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> str | None:
    """:func:`read_text` for a worker thread that reads several files in one call.

    Same decoding, bounds, containment and answers as :func:`read_text`; it
    blocks, so it is never called on the event loop.

    Raises:
        ValueError: ``max_chars`` is negative.
        OSError: The file exists but cannot be read (permissions, I/O error).
        PathEscapeError: ``root`` is given and ``path`` leads outside it.
    """
    if max_chars is not None and max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars!r}")
    return _read_text_sync(os.fspath(path), max_chars, root)


def _read_text_sync(
    target: str, max_chars: int | None, root: str | os.PathLike[str] | None
) -> str | None:
    """:func:`read_text`'s work, blocking (run in a worker thread)."""
    if root is not None:
        target = _contained(target, root, "read")
    started = time.time_ns()
    try:
        fd = _open_nonblocking(target, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None  # a directory, a FIFO or a device: reading could block or never end
        if root is not None and is_hard_link(info):
            raise PathEscapeError(
                f"refusing to read {target!r}: it is a hard link, and its other name may "
                "be outside the memory root"
            )
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        cache_key = (target, max_chars)
        with _read_cache_lock:
            cached = _read_cache.get(cache_key)
        if cached is not None and cached[0] == identity:
            return cached[1]
        chunk = _read_chunk(fd, _SNIFF_BYTES)
        if b"\x00" in chunk:
            return None
        if max_chars is None or info.st_size <= max_chars:
            # The whole file (it has no more characters than bytes): read, then
            # decoded in one piece, the cheapest way (fewer large buffers to
            # allocate and copy than a decoder fed chunk by chunk).
            limit = None if max_chars is None else 4 * max_chars + 8
            result = _decode_whole(_read_whole(fd, limit, info.st_size))
        else:
            result = _decode_bounded(fd, chunk, max_chars)
    finally:
        os.close(fd)
    result = result if max_chars is None else result[:max_chars]
    if max(info.st_mtime_ns, info.st_ctime_ns) < started - _STABLE_NS:
        _remember(cache_key, identity, result)
    return result


def _read_whole(fd: int, limit: int | None, measured: int) -> bytes:
    """The file from its start to its end, at most ``limit`` bytes.

    ``measured`` is the file's size when it was measured: the file is asked for in
    one read of that size and a byte more (which shows whether it grew), so an
    unchanged file is one buffer, never copied into another. ``limit`` (four bytes
    per character wanted, and a few) only matters for a file that grew after it was
    measured: what it cuts is past the characters kept.
    """
    os.lseek(fd, 0, os.SEEK_SET)
    chunks: list[bytes] = []
    have = 0
    size = measured + 1
    while limit is None or have < limit:
        size = size if limit is None else min(size, limit - have)
        chunk = _read_chunk(fd, size)
        chunks.append(chunk)
        have += len(chunk)
        if len(chunk) < size:
            break  # a short chunk ends at the end of the file
        size = _MAX_CHUNK_BYTES
    # One chunk (the usual case) is returned as it is by join.
    return b"".join(chunks)


def _decode_whole(data: bytes) -> str:
    """UTF-8 (a leading byte-order mark dropped, invalid bytes as U+FFFD), lines as ``\\n``.

    What :func:`_decode_bounded`'s incremental decoder gives for the same bytes.
    """
    text = data.decode("utf-8-sig", errors="replace")
    # A carriage return in the text is one in the bytes (0x0D is never part of a
    # multi-byte sequence, nor taken into a replaced one): searching the bytes is a
    # memchr, searching the text (four bytes a character with an emoji in it) is not.
    if b"\r" in data:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _decode_bounded(fd: int, chunk: bytes, max_chars: int) -> str:
    """Decode from ``chunk`` on until ``max_chars`` characters are had (or the file ends).

    Growing chunks: reading past ``max_chars`` stays within what was already read
    (each chunk at most doubles it).
    """
    # Plain UTF-8 with the byte-order mark dropped by hand: CPython's incremental
    # "utf-8-sig" decoder drops a file's last bytes when they are the start of a
    # mark (b"\xef" decodes to "" at the end), where a whole-file decode gives U+FFFD.
    decoder = io.IncrementalNewlineDecoder(
        codecs.getincrementaldecoder("utf-8")(errors="replace"), translate=True
    )
    pieces: list[str] = []
    started = False
    have = 0
    size = _CHUNK_BYTES
    while True:
        text = decoder.decode(chunk, final=not chunk)
        if text and not started:
            started = True
            text = text.removeprefix("\ufeff")
        pieces.append(text)
        have += len(text)
        if not chunk or have >= max_chars:
            return "".join(pieces)
        chunk = _read_chunk(fd, size)
        size = min(2 * size, _MAX_CHUNK_BYTES)


def _read_chunk(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes from ``fd`` (fewer only at the end of the file)."""
    data = os.read(fd, size)
    if len(data) == size or not data:
        return data
    # A short read before the end (a signal, a network file system): read on.
    parts = [data]
    have = len(data)
    while have < size:
        more = os.read(fd, size - have)
        if not more:
            break
        parts.append(more)
        have += len(more)
    return b"".join(parts)


_STABLE_NS: Final = 2_000_000_000
"""A file is cached only when it last changed this long before it was read.

File timestamps are coarse (a clock tick, up to 2 s on some file systems): a file
rewritten with the same size within one tick keeps its mtime. Caching only files
that were already this old when read means any later write gives a newer mtime or
ctime than the cached one, so a stale text is never returned (the "racy git" rule).
"""
_READ_CACHE_ENTRIES: Final = 16
_READ_CACHE_CHARS: Final = 24_000_000
_read_cache: dict[tuple[str, int | None], tuple[tuple[int, int, int, int, int], str]] = {}
# Reads run in worker threads, several at a time.
_read_cache_lock = threading.Lock()


def _remember(
    key: tuple[str, int | None], identity: tuple[int, int, int, int, int], text: str
) -> None:
    """Keep ``text`` for ``key`` (least recently stored dropped first, bounded)."""
    # Unchanged memory files (project and global MEMORY.md) are read on every
    # rebuild; megabytes of them cost more than a stat.
    with _read_cache_lock:
        _read_cache.pop(key, None)
        _read_cache[key] = (identity, text)
        held = sum(len(value[1]) for value in _read_cache.values())
        while len(_read_cache) > 1 and (
            len(_read_cache) > _READ_CACHE_ENTRIES or held > _READ_CACHE_CHARS
        ):
            oldest = next(iter(_read_cache))
            held -= len(_read_cache.pop(oldest)[1])


def _write_atomic(path: Path, data: bytes) -> None:
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    # A dot-name ending in .tmp: never listed as a memory file, even if a crash
    # leaves it behind.
    temp = directory / f".{path.name}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"
    # 0o666 minus the umask, like a file opened normally; O_EXCL: never reuse a file.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileNotFoundError):
            # Keep the mode of the file being replaced.
            os.chmod(temp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable on POSIX; not possible (nor needed) on Windows.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


async def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, root: str | os.PathLike[str] | None = None
) -> None:
    """Replace a file's content atomically: readers see the old text or the new, never a mix.

    Writes UTF-8 to a temporary file in the same directory, flushes it to disk,
    then renames it over ``path``. Parent directories are created. On any failure
    the old file is left intact and the temporary file removed.

    Args:
        path: The file to write.
        text: Its new content, written as given (no newline translation).
        root: The memory root. When given, a ``path`` whose directory's real location
            (symlinks resolved) is outside it is refused and nothing is written
            (SPEC R5.6). A symlink at ``path`` itself is replaced, never followed.

    Raises:
        UnicodeEncodeError: ``text`` holds a lone surrogate (nothing is written).
        OSError: The directory or file cannot be written.
        PathEscapeError: ``root`` is given and ``path`` leads outside it.
    """
    data = text.encode("utf-8")
    target = Path(os.fspath(path))
    if root is not None:
        directory = await anyio.to_thread.run_sync(_contained, str(target.parent), root, "write")
        target = Path(directory) / target.name
    await anyio.to_thread.run_sync(_write_atomic, target, data)


def _is_listed(name: str) -> bool:
    return (
        name.endswith(".md")
        and not name.startswith(CHECKPOINT_LEARNING_PREFIX)
        and not name.startswith(".")
        and _is_utf8_name(name)
    )


def _is_utf8_name(name: str) -> bool:
    # A name whose bytes are not UTF-8 reaches Python with surrogate escapes; it
    # could not be shown to a model or stored as JSON, so it is not listed.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _walk_markdown(layout: MemoryLayout, top: Path) -> Iterator[Path]:
    """Yield the listable ``*.md`` files under ``top``, never leaving the root."""
    if not top.is_dir() or not layout.contains(top):
        return
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # vanished or unreadable: list what can be listed
        for entry in entries:
            try:
                if entry.is_symlink():
                    # Symlinked directories are not followed (no loops, no duplicates);
                    # a symlinked file counts only if its target is inside the root.
                    if _is_listed(entry.name) and entry.is_file() and layout.contains(entry.path):
                        yield Path(entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False) and _is_listed(entry.name):
                    yield Path(entry.path)
            except OSError:
                continue


def _list_memory_files(layout: MemoryLayout, session_id: str, project_id: str | None) -> list[str]:
    tops = [layout.session_dir(session_id)]
    excluded = {layout.checkpoint_path(session_id), layout.global_memory_path()}
    if project_id is not None:
        tops.append(layout.project_dir(project_id))
        excluded.add(layout.project_memory_path(project_id))
    tops.append(layout.global_dir())
    found: set[str] = set()
    for top in tops:
        for path in _walk_markdown(layout, top):
            if path not in excluded:
                found.add(path.relative_to(layout.root).as_posix())
    return sorted(found)


async def list_memory_files(
    layout: MemoryLayout, *, session_id: str, project_id: str | None
) -> list[str]:
    """List the memory files the ``# Memory keys index`` section shows (SPEC R5.6, A6).

    Every ``*.md`` file under the session's directory, the project's directory and
    the global directory, recursively, as POSIX paths relative to the root, sorted.
    Read from the disk each time, so files written by anything appear. Not listed:

    * the files the rebuild body already injects: the session's ``checkpoint.md``,
      the project's ``MEMORY.md`` and the global ``MEMORY.md`` (only those exact
      paths; a ``MEMORY.md`` deeper down is listed);
    * checkpoint "learning" files, ``checkpoint-learning*.md`` (A6);
    * hidden files (``.name.md``), e.g. editor and temporary files;
    * anything reached through a symlinked directory, and symlinked files whose
      target is not a regular file inside the root.

    Checkpoint overflow files (``checkpoint-<topic>.md``), ``notes.md`` and task
    ``progress.md`` files are listed.

    Args:
        layout: The memory layout.
        session_id: The session whose directory is listed.
        project_id: The session's project, or ``None`` for none.

    Raises:
        PathEscapeError: ``session_id`` or ``project_id`` is not a safe path component.
    """
    return await anyio.to_thread.run_sync(_list_memory_files, layout, session_id, project_id)
