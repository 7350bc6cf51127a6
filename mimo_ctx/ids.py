"""Ascending, sortable identifiers (SPEC A1).

An id is ``<prefix>_`` + a hex time field + 14 random base62 characters. The time
field encodes ``ms_timestamp * 4096 + counter`` so lexicographic order equals
creation order, even for thousands of ids made inside one millisecond.

Our choice (documented difference from the original): the original keeps only the
low 48 bits of that value (12 hex digits), which wraps every 2**36 ms (~795 days;
the last wrap was in August 2026), so ids made on either side of a wrap sort
backwards. We keep 14 hex digits, which does not wrap before the year 2500. The
shape (prefix, hex time, base62 tail) is otherwise the original's.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from typing import Final, Literal

__all__ = ["IdPrefix", "ascending", "timestamp_of"]

IdPrefix = Literal["ses", "msg", "prt", "tsk", "act"]

_BASE62: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_HEX_DIGITS: Final = 14
_RANDOM_CHARS: Final = 14
_COUNTER_BITS: Final = 4096
_MAX_VALUE: Final = 16**_HEX_DIGITS - 1
# What :func:`ascending` produces after the prefix: int(..., 16) alone would also
# accept signs, spaces, underscores and upper-case digits, i.e. strings that are
# not ids (and would not sort like them).
_BODY = re.compile(rf"[0-9a-f]{{{_HEX_DIGITS}}}[0-9A-Za-z]{{{_RANDOM_CHARS}}}")

_lock = threading.Lock()
# One-element list so the generator state can be updated without `global`.
_last_value = [0]
# Counters for ids made for an explicit (usually past) timestamp. Bounded so an
# importer walking millions of timestamps cannot grow memory without limit.
_explicit: OrderedDict[int, int] = OrderedDict()
_EXPLICIT_MAX: Final = 4096


_UNBIASED_BELOW: Final = 62 * 4  # bytes under 248 map evenly onto the 62 characters


def _random_tail() -> str:
    # One read of the system's random source per id (a draw per character cost
    # five times as much: every message and part a turn makes takes an id).
    chars: list[str] = []
    while len(chars) < _RANDOM_CHARS:
        chars.extend(
            _BASE62[b % 62] for b in secrets.token_bytes(_RANDOM_CHARS + 4) if b < _UNBIASED_BELOW
        )
    return "".join(chars[:_RANDOM_CHARS])


def ascending(
    prefix: IdPrefix, *, timestamp_ms: int | None = None, newer_than: str | None = None
) -> str:
    """Return a new ascending id.

    Args:
        prefix: What the id names (``ses`` session, ``msg`` message, ``prt`` part...).
        timestamp_ms: Make the id for this time instead of now. Ids made for the same
            explicit timestamp still ascend among themselves; they sort by that time
            against ids made for other times. Used by importers, which rebuild ids
            from a transcript's own timestamps.
        newer_than: An id (made by any worker) the new id must sort after, whatever
            this machine's clock says: a worker whose clock lags must still insert a
            rebuild boundary newer than every message (SPEC R4.3). Ignored with
            ``timestamp_ms`` and when it is not an ascending id.

    Returns:
        A string such as ``msg_0196f3a1b2c3d4Ab3dE9fGh1Jk2Lm``.

    Raises:
        ValueError: ``timestamp_ms`` is negative or too large to encode.
    """
    with _lock:
        if timestamp_ms is None:
            now = time.time_ns() // 1_000_000
            # Strictly greater than every id made before in this process, even if
            # the clock stalls, steps backwards or 4096 ids land in one millisecond.
            value = max(now * _COUNTER_BITS, _last_value[0] + 1)
            if newer_than is not None:
                floor = _value_of(newer_than)
                if floor is not None and floor < _MAX_VALUE:
                    value = max(value, floor + 1)
            _last_value[0] = value
        else:
            if timestamp_ms < 0 or timestamp_ms * _COUNTER_BITS > _MAX_VALUE:
                raise ValueError(f"timestamp_ms out of range: {timestamp_ms!r}")
            counter = _explicit.pop(timestamp_ms, -1) + 1
            _explicit[timestamp_ms] = counter
            if len(_explicit) > _EXPLICIT_MAX:
                _explicit.popitem(last=False)
            # Past 4095 ids for one explicit millisecond the value would spill into
            # the next millisecond's range; clamping keeps ids for time t below ids
            # for t+1, and the random tail keeps them unique.
            value = timestamp_ms * _COUNTER_BITS + min(counter, _COUNTER_BITS - 1)
    return f"{prefix}_{value:0{_HEX_DIGITS}x}{_random_tail()}"


def _value_of(identifier: str) -> int | None:
    _, sep, rest = identifier.partition("_")
    if not sep or _BODY.fullmatch(rest) is None:
        return None
    return int(rest[:_HEX_DIGITS], 16)


def timestamp_of(identifier: str) -> int:
    """Return the millisecond timestamp encoded in an id made by :func:`ascending`.

    Raises:
        ValueError: ``identifier`` is not an ascending id.
    """
    _, sep, rest = identifier.partition("_")
    if not sep or _BODY.fullmatch(rest) is None:
        raise ValueError(f"not an ascending id: {identifier!r}")
    return int(rest[:_HEX_DIGITS], 16) // _COUNTER_BITS
