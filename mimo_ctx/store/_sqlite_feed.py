"""What an SQLite store knows of its change feed without reading the file (private).

A turn writes a message or two and then reads the change feed
(:meth:`~mimo_ctx.store.base.Store.changes_since`): each is a hand-off to the
store's worker thread, and on a busy machine every hand-off costs a wake-up of
two threads, several times the work itself. The feed read after the store's
own writes needs no I/O when nobody else has written since: :class:`KnownFeed`
keeps what the store itself wrote from a change-feed position on (``start``) up
to the counter's value (``head``), and the store connection's
``PRAGMA data_version`` when ``head`` was known to be the counter's value.
``data_version`` changes whenever any *other* connection (another store on the
file, another process) commits, never with the connection's own commits; the
same number later means nothing was committed by anyone else since, so the feed
after ``start`` is exactly what this store wrote. The number is read inside a
transaction: on the snapshot a file read of the feed used, or under the write
lock of a write that found it unknown or someone else's numbers before its own.

Checking it is one query on the event loop's thread that reads the WAL index in
shared memory: it never waits (between jobs the connection's busy timeout is 0,
see :mod:`mimo_ctx._sqlite_worker`; the store's lock is only tried), and any
doubt -- the lock held by a running call, a different number, a position before
``start`` -- answers ``None``: the caller reads the file on the worker thread as
before, and that read makes the feed known again.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from mimo_ctx.messages import Message

__all__ = ["KNOWN_ENTRIES", "KnownFeed", "data_version"]

KNOWN_ENTRIES: Final = 256
"""Messages written by the store that the feed keeps, the newest: a turn writes a
few between two reads of a window; one further behind reads the file. Bounded so
that memory does not grow with the session (most are in the write cache too)."""

_SQL_DATA_VERSION: Final = "PRAGMA data_version"


def data_version(conn: sqlite3.Connection) -> int | None:
    """The connection's ``data_version`` (``None`` when SQLite refuses it right now)."""
    try:
        return int(conn.execute(_SQL_DATA_VERSION).fetchone()[0])
    except sqlite3.Error:
        return None


@dataclass(slots=True)
class KnownFeed:
    """The change feed from ``start`` to ``head``, as far as this store wrote it.

    Every number in ``(start, head]`` was taken by this store's own writes (under
    the file's write lock, so nobody else's fell between them); ``written`` holds,
    for each message row those writes left, its newest version and number, in
    number order. ``version`` is the store connection's ``data_version`` when
    ``head`` was the counter's value (``None``: not known).
    """

    start: int | None = None
    head: int = 0
    version: int | None = None
    written: OrderedDict[str, tuple[int, Message]] = field(
        default_factory=OrderedDict[str, tuple[int, Message]]
    )

    def forget(self) -> None:
        """Know nothing: the next feed read goes to the file."""
        self.start = None
        self.version = None
        self.written.clear()

    def wrote(self, first: int, last: int, rows: Sequence[tuple[int, Message]] | None) -> None:
        """This store's transaction took the numbers ``(first, last]`` and committed.

        ``rows``: every message row it wrote, with its number; ``None`` when the
        writer does not report them (the feed then starts again after ``last``).
        """
        if rows is None or self.start is None or first != self.head:
            # Someone else's numbers fell between (or nothing is known before).
            self.start = first if rows is not None else last
            self.written.clear()
        for seq, message in rows or ():
            self.written[message.id] = (seq, message)
            self.written.move_to_end(message.id)
        self.head = last
        while len(self.written) > KNOWN_ENTRIES:
            _, (seq, _) = self.written.popitem(last=False)
            self.start = seq

    def read(self, current: int) -> None:
        """The file's feed was read up to ``current`` (the counter's value then)."""
        if self.start is None or current != self.head:
            self.start = current
            self.written.clear()
        self.head = current

    def after(self, session_id: str, seq: int) -> tuple[list[Message], int] | None:
        """The session's messages written after ``seq`` and ``head``, when known here.

        The caller has checked ``version`` against the connection. ``None`` when ``seq``
        lies before what is known.
        """
        if self.start is None or seq < self.start:
            return None
        changed: list[Message] = []
        for number, message in reversed(self.written.values()):
            if number <= seq:
                break
            if message.session_id == session_id:
                changed.append(message)
        changed.reverse()
        return changed, self.head
