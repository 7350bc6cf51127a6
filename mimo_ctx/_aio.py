"""Async helpers the I/O layers share (private)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import anyio

__all__ = ["shielded"]

_T = TypeVar("_T")


async def shielded(work: Awaitable[_T]) -> _T:
    """Await ``work`` shielded from cancellation; a cancelled caller is cancelled afterwards.

    For steps that must not be cut in half: a transaction's commit, opening a file
    whose handle would otherwise be dropped unclosed.
    """
    done: list[_T] = []
    with anyio.CancelScope(shield=True):
        done.append(await work)
    return done[0]
