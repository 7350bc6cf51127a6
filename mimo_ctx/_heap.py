"""Handing the heap memory the C allocator keeps free back to the system (private).

A long session allocates and frees many blocks of 8-128 KB between long-lived
ones: messages' JSON for the store and the estimate, rebuild bodies, the offline
writer's state. glibc's ``malloc`` returns a freed block's pages to the system only
when the block lies at the top of its heap, so the pages of blocks freed in the
middle stay resident, and with several threads allocating (the event loop, the
SQLite worker, the writer's thread: one heap each) the resident size of a process
creeps up over a session although what is alive stays flat. ``malloc_trim(0)``
gives those pages back (``madvise``, the memory stays mapped). The soak benchmark
measured it: resident growth from 20 % of a 3,000-turn session to its end fell from
17-20 % to 8-9 % with one call per rebuild, which costs ~0.3 ms of CPU there. Other C
libraries (musl, macOS, Windows) have no such call, and nothing happens there.

The call is not free on a large heap, and not only for its own thread: glibc trims
one arena (heap) at a time and holds that arena's lock meanwhile, walking every
free chunk, so a thread allocating from it waits. Measured on a 2 GB heap of the
event loop's thread with three quarters freed in 8-120 KB blocks: the call took
160-230 ms, and a 32 KB allocation on the loop thread waited as long; called again
at once (nothing new to give back) 17-24 ms and ~20 ms. A service rebuilding many
sessions would call it again and again, so :class:`ReleaseLimiter` lets at most
one release start per interval in the whole process (``release_memory_interval``,
1 s by default); a release asked for meanwhile is not dropped but coalesced into
one at the interval's end.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import ContextRebuilt

__all__ = ["HeapRelease", "ReleaseLimiter", "release_free_heap"]

_WINDOW_DROPPED: Final = frozenset({"rebuilt", "compacted"})
"""Rebuild outcomes after which the old window's messages are gone from memory."""


@functools.cache
def _load_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where the C library is not glibc (looked up once)."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a glibc (or no confstr at all)
        return None
    if not version or not version.startswith("glibc"):
        return None
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Give the pages of freed heap blocks back to the system (blocking: a few 100 µs).

    Returns:
        ``True`` when the C library offers the call (glibc) and it ran, ``False``
        elsewhere.
    """
    trim = _load_trim()
    if trim is None:
        return False
    trim(0)
    return True


@dataclass(slots=True)
class ReleaseLimiter:
    """When heap releases may start: at most one per interval, requests coalesced (pure).

    ``now`` is the caller's clock reading (monotonic seconds); each request names
    its own interval: the least time since the last release started before
    another may start. The process's one limiter is used under :data:`_LOCK`
    (requests may come from several event loops' threads).

    The life of a release: :meth:`request` answers how long to wait before it
    (``None``: one is already on its way and this request is folded into it);
    :meth:`start` when it starts; :meth:`finish` when it is done, which answers
    whether another follows and after how long (a request came while it ran: the
    pages freed since may not have been seen); :meth:`abandon` when its task ends
    without finishing (cancelled): the next request schedules afresh.
    """

    last_start: float | None = None
    scheduled: bool = False  # a task waits for, or runs, the next release
    running: bool = False
    wanted: float | None = None  # while running: the least interval asked for meanwhile

    def request(self, now: float, interval: float) -> float | None:
        """A release is wanted: seconds to wait before it, or ``None`` when coalesced."""
        if self.running:
            self.wanted = interval if self.wanted is None else min(self.wanted, interval)
            return None
        if self.scheduled:
            return None
        self.scheduled = True
        return self._wait(now, interval)

    def start(self, now: float) -> None:
        """The scheduled release starts now."""
        self.running = True
        self.last_start = now

    def finish(self, now: float) -> float | None:
        """The release is done: seconds to wait before the one asked for meanwhile, if any."""
        self.running = False
        wanted, self.wanted = self.wanted, None
        if wanted is None:
            self.scheduled = False
            return None
        return self._wait(now, wanted)

    def abandon(self) -> None:
        """The scheduled release will not run or finish (its task was cancelled)."""
        self.running = False
        self.scheduled = False
        self.wanted = None

    def _wait(self, now: float, interval: float) -> float:
        if self.last_start is None:
            return 0.0
        return max(0.0, self.last_start + interval - now)


_LIMITER = ReleaseLimiter()
"""The process's limiter: the releases of every middleware share it."""

_LOCK = threading.Lock()
"""Guards :data:`_LIMITER`."""


class HeapRelease:
    """An event handler of the middleware: after a rebuild that dropped the old window,
    :func:`release_free_heap` in a worker thread, at most one per ``interval`` in the
    process (:class:`ReleaseLimiter`).

    Args:
        task_group: The middleware's running task group (``None`` while it is not
            running: nothing is started then). A release waiting for its interval
            waits in it.
        config: Its ``release_memory_interval``: seconds since the process's last
            release started before this middleware's request may start another.
        clock: Monotonic seconds, for the limiter.
    """

    def __init__(
        self,
        task_group: Callable[[], TaskGroup | None],
        config: RebuildConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._task_group = task_group
        self._interval = config.release_memory_interval
        self._clock = clock

    def __call__(self, event: object) -> None:
        if not isinstance(event, ContextRebuilt) or event.outcome not in _WINDOW_DROPPED:
            return
        task_group = self._task_group()
        if task_group is None:
            return
        with _LOCK:
            wait = _LIMITER.request(self._clock(), self._interval)
        if wait is not None:
            task_group.start_soon(self._release, _LIMITER, wait)

    async def _release(self, limiter: ReleaseLimiter, wait: float) -> None:
        finished = False
        try:
            next_wait: float | None = wait
            while next_wait is not None:
                await anyio.sleep(next_wait)
                with _LOCK:
                    limiter.start(self._clock())
                await anyio.to_thread.run_sync(release_free_heap)
                with _LOCK:
                    next_wait = limiter.finish(self._clock())
            finished = True
        finally:
            if not finished:  # cancelled (the middleware closes): nothing stays scheduled
                with _LOCK:
                    limiter.abandon()
