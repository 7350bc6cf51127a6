"""The writer's file steps: the previous checkpoint read, ``notes.md`` emptied, whose checkpoint.

Private to the checkpoint package: the writer runs call them.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import anyio
import anyio.to_thread

from mimo_ctx.checkpoint.state import CheckpointState, checkpoint_digest
from mimo_ctx.errors import PathEscapeError
from mimo_ctx.memory import MemoryLayout, read_text, read_text_blocking

__all__ = ["empty_folded_notes", "offline_checkpoint_on_disk", "read_previous_checkpoint"]

_log = logging.getLogger("mimo_ctx")

_STATE_CHARS = 8_000_000
"""The offline writer's state and checkpoint are compared up to this many characters."""


async def read_previous_checkpoint(path: Path, root: Path, *, max_chars: int) -> str | None:
    """The checkpoint (or its state file) to carry forward; unreadable, the writer starts afresh.

    It is about to be replaced, so a file that cannot be read (or that leads out of
    the memory root) is logged and ignored. ``notes.md`` gets no such grace: its
    content is folded in and then removed, so a read error fails the writer.
    """
    try:
        return await read_text(path, max_chars=max_chars, root=root)
    except (OSError, PathEscapeError) as exc:
        _log.warning("mimo_ctx: previous checkpoint %s could not be read: %s", path, exc)
        return None


async def empty_folded_notes(path: Path, folded: str, *, root: Path) -> None:
    """Remove from ``notes.md`` what the writer folded in (A14), nothing else.

    The agent may add notes while the writer runs, and a huge file is only read in
    part: what was not folded in stays. A file rewritten meanwhile (or whose bytes
    differ from the text read, e.g. ``\r\n`` line ends) is kept whole: folding a
    note twice is better than losing one. The rest of the file is streamed, never
    held in memory whole.
    """
    await anyio.to_thread.run_sync(_drop_prefix, path, folded, root)


def _drop_prefix(path: Path, prefix: str, root: Path) -> None:
    # Bytes, not text: the folded text was decoded with replacements, so a file
    # holding invalid UTF-8 (or a byte-order mark, or ``\r\n``) does not start with
    # the prefix's own encoding and is kept whole; the rest of a file that does is
    # copied byte for byte, invalid bytes included. Nothing the writer did not
    # fold in exactly is rewritten.
    expected = prefix.encode("utf-8", errors="surrogatepass")
    try:
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(os.path.realpath(root)):
            return
        with real.open("rb") as source:
            if source.read(len(expected)) != expected:
                return
            temporary = real.with_name(f".{real.name}.{uuid.uuid4().hex}.tmp")
            try:
                with temporary.open("wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
                    target.flush()
                    os.fsync(target.fileno())
                os.replace(temporary, real)
            finally:
                temporary.unlink(missing_ok=True)
    except FileNotFoundError:
        return


async def offline_checkpoint_on_disk(layout: MemoryLayout, session_id: str) -> bool:
    """True when ``checkpoint.md`` is the one the offline writer's state file wrote.

    Read within the memory root and bounded, both files and the parse in one
    worker-thread call (the state grows with the session: parsing it on the event
    loop would stall every other session's turn); anything unreadable, or a
    checkpoint another writer (or anything else) put there, answers ``False``.
    """

    def check() -> bool:
        try:
            saved = read_text_blocking(
                layout.checkpoint_state_path(session_id), max_chars=_STATE_CHARS, root=layout.root
            )
            state = CheckpointState.from_json(saved)
            if state is None or state.checkpoint_sha256 is None:
                return False
            text = read_text_blocking(
                layout.checkpoint_path(session_id), max_chars=_STATE_CHARS, root=layout.root
            )
        except (OSError, PathEscapeError):
            return False
        return text is not None and checkpoint_digest(text) == state.checkpoint_sha256

    return await anyio.to_thread.run_sync(check)
