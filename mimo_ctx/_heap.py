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

A release that could give back little is skipped (:class:`ReleaseGate`): the
walk costs the loop about as much whether or not anything comes back (2 GB,
nothing new to give back: a 10-15 ms call, the loop's allocations waiting 4-5 ms).
Before each release the worker thread reads the process's anonymous resident size
(``/proc/self/statm``, ~10 µs, no lock) and the bytes ``malloc`` holds free in its
heaps (``mallinfo2``'s ``fordblks``: it takes each arena's lock and walks its free
lists, 0.01 ms on a 300 MB heap, 0.2-0.6 ms on 2 GB, the loop's allocations
waiting up to ~2 ms there): the *slack*, the only memory a release can give back.
The release runs when the slack grew by at least a sixteenth of the resident size
(and 1 MiB) over the least it was since the last release.

Why the free bytes, not the resident size minus the bytes in use: CPython keeps its
small objects in arenas it maps itself, outside ``malloc``, so in a Python process
that difference grows with every live object (three million small tuples: +229 MB)
while no release could give any of it back. The free bytes stay where they are as
such objects come and go; they grow when ``malloc`` blocks are freed, fall as free
blocks are reused, and a release leaves them where they were (it returns the
pages, the blocks stay free), so growth over the least since a release is what was
freed since, resident.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import ContextRebuilt

__all__ = [
    "HeapReading",
    "HeapRelease",
    "ReleaseGate",
    "ReleaseLimiter",
    "read_heap",
    "release_free_heap",
    "release_if_worthwhile",
]

_WINDOW_DROPPED: Final = frozenset({"rebuilt", "compacted"})
"""Rebuild outcomes after which the old window's messages are gone from memory."""


def _glibc() -> bool:
    """Whether the C library is glibc."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a glibc (or no confstr at all)
        return False
    return bool(version) and version.startswith("glibc")


def _glibc_function(name: str, argtypes: list[Any], restype: Any) -> Any:
    """glibc's function ``name``, typed, or ``None`` where the C library is not glibc
    or has no such function (``mallinfo2`` came with 2.33)."""
    if not _glibc():
        return None
    try:
        function = getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function


@functools.cache
def _load_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where the C library is not glibc (looked up once)."""
    return _glibc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (every field a ``size_t``)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _load_mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc's ``mallinfo2`` (2.33 and later), or ``None`` (looked up once)."""
    return _glibc_function("mallinfo2", [], _MallInfo2)


@dataclass(frozen=True, slots=True)
class HeapReading:
    """The process's memory as a release sees it.

    Attributes:
        resident: Bytes of anonymous memory resident (``/proc/self/statm``: resident
            minus file-backed pages).
        free: Bytes ``malloc`` holds free in its heaps (``mallinfo2``'s
            ``fordblks``, whether their pages are resident or were given back);
            ``None`` when unknown.
    """

    resident: int
    free: int | None = None

    @property
    def slack(self) -> int:
        """What the gate follows: the free bytes, or the resident size when they are unknown."""
        return self.resident if self.free is None else self.free


_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_heap() -> HeapReading | None:
    """The process's :class:`HeapReading`, ``None`` where there is none (not Linux).

    Blocking: ``mallinfo2`` takes each arena's lock while it walks its free lists
    (0.2-0.6 ms on a 2 GB heap): call it where the event loop does not wait.
    """
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        resident = (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, IndexError, ValueError):
        return None
    mallinfo2 = _load_mallinfo2()
    if mallinfo2 is None:
        return HeapReading(resident)
    info = mallinfo2()
    return HeapReading(resident, int(info.fordblks))


@dataclass(slots=True)
class ReleaseGate:
    """Whether a release could give back enough to be worth its walk (pure).

    The *slack* (:attr:`HeapReading.slack`) right after a release is the floor:
    free blocks whose pages were just given back (or could not be). A release is
    worth it once the slack grew by ``max(min_bytes, resident * min_share)`` over
    the least it has been since (a lower reading means free blocks were reused: the
    floor follows it down, and what is freed again counts again). The gain asked
    for grows with the heap as the walk does. The process's gate is used by one
    release at a time (the :class:`ReleaseLimiter` lets one run).

    Attributes:
        min_bytes: The least gain worth a release.
        min_share: The least gain as a share of the resident size.
        floor: The least slack since the last release; ``None`` before the first
            (which is always worth it).
    """

    min_bytes: int = 1 << 20
    min_share: float = 1 / 16
    floor: int | None = None

    def worth(self, reading: HeapReading) -> bool:
        """Whether to release now; a reading that says no lowers the floor if it can."""
        if self.floor is None:
            return True
        slack = reading.slack
        if slack - self.floor >= max(self.min_bytes, reading.resident * self.min_share):
            return True
        self.floor = min(self.floor, slack)
        return False

    def released(self, after: HeapReading) -> None:
        """A release ran; ``after`` was read once it was done."""
        self.floor = after.slack


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


def release_if_worthwhile(gate: ReleaseGate) -> bool:
    """:func:`release_free_heap` when ``gate`` says it could give back enough (blocking).

    Without a reading (not Linux) it releases as before; after a release the gate
    gets a fresh reading.

    Returns:
        Whether a release ran.
    """
    reading = read_heap()
    if reading is not None and not gate.worth(reading):
        return False
    if not release_free_heap():
        return False
    after = read_heap()
    if after is not None:
        gate.released(after)
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

_GATE = ReleaseGate()
"""The process's gate (used only by the one release the limiter lets run)."""


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
            task_group.start_soon(self._release, _LIMITER, _GATE, wait)

    async def _release(self, limiter: ReleaseLimiter, gate: ReleaseGate, wait: float) -> None:
        finished = False
        try:
            next_wait: float | None = wait
            while next_wait is not None:
                await anyio.sleep(next_wait)
                with _LOCK:
                    limiter.start(self._clock())
                await anyio.to_thread.run_sync(release_if_worthwhile, gate)
                with _LOCK:
                    next_wait = limiter.finish(self._clock())
            finished = True
        finally:
            if not finished:  # cancelled (the middleware closes): nothing stays scheduled
                with _LOCK:
                    limiter.abandon()
