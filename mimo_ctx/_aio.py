"""Async helpers the I/O layers share (private)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread

__all__ = ["THREAD_SLICE", "run_sliced", "shielded"]

_T = TypeVar("_T")

THREAD_SLICE: Final = 0.001
"""Seconds a worker thread of :func:`run_sliced` works before it lets the event loop in."""


async def shielded(work: Awaitable[_T]) -> _T:
    """Await ``work`` shielded from cancellation; a cancelled caller is cancelled afterwards.

    For steps that must not be cut in half: a transaction's commit, opening a file
    whose handle would otherwise be dropped unclosed.
    """
    done: list[_T] = []
    with anyio.CancelScope(shield=True):
        done.append(await work)
    return done[0]


async def run_sliced(
    work: Callable[[Callable[[], None]], _T], *, slice_seconds: float | None = None
) -> _T:
    """Run ``work(pause)`` in a worker thread that lets the event loop in between slices.

    ``work`` calls ``pause()`` between units of its work (a message folded, a
    section rendered); once ``slice_seconds`` (default :data:`THREAD_SLICE`) have
    passed since the last time the loop got in, ``pause()`` blocks until the event
    loop has run one turn.

    Why: pure-Python work in a thread holds the GIL, and the loop thread waiting
    for it gets it only when the thread releases it -- after the interpreter's
    switch interval (``sys.getswitchinterval()``, 5 ms by default, the host's to
    set), plus the wake-up of the waiting thread, which on a busy machine is
    slow. A few milliseconds of folding thus stalled every coroutine of the host
    by about the switch interval. A short sleep would release the GIL too, but the
    thread may take it back before the loop thread has woken; a call into the
    loop hands it over for certain: the thread waits until the loop has run a
    turn, with everything that was due by then (one round trip, ~0.1 ms of CPU,
    per slice).
    """
    seconds = THREAD_SLICE if slice_seconds is None else slice_seconds
    return await anyio.to_thread.run_sync(lambda: work(_Slices(seconds)))


class _Slices:
    """The ``pause`` of :func:`run_sliced`: one loop turn per used-up slice."""

    __slots__ = ("_since", "_slice")

    def __init__(self, slice_seconds: float) -> None:
        # Made in the worker thread as its work starts: the first slice starts now.
        self._slice = slice_seconds
        self._since = time.perf_counter()

    def __call__(self) -> None:
        # Wall-clock: a thread the machine preempts while it holds the GIL holds
        # the loop up as long.
        if time.perf_counter() - self._since < self._slice:
            return
        anyio.from_thread.run_sync(_loop_turn)
        self._since = time.perf_counter()


def _loop_turn() -> None:
    """Nothing: running it at all means the loop took its turn."""
