"""What the memory index's ``files`` table holds per scope, as its connection last saw it.

Private to :mod:`mimo_ctx.memory_index`. A reconcile compares every file of a scope
with its row; a project's directory is shared by all its sessions and grows with
them, so reading every row of the scope again at each rebuild cost as much as the
walk itself. The rows are kept here instead, and trusted only while SQLite's
``PRAGMA data_version`` is unchanged: it changes when any *other* connection (another
process, another index on the same file) commits, and not for this connection's own
commits, which update the kept rows themselves (:meth:`Listings.written`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from mimo_ctx.memory import CHECKPOINT_LEARNING_PREFIX

__all__ = ["Listings", "ScopeListing", "key_paths", "read_listing"]


class Stamped(Protocol):
    """A file seen on the disk: its path relative to the root, size and mtime."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...


_S = TypeVar("_S", bound=Stamped)


@dataclass(slots=True)
class ScopeListing:
    """The rows of one scope: each path's ``(size, mtime_ns)``, and the indexed paths."""

    stamps: dict[str, tuple[int, int]] = field(default_factory=dict[str, tuple[int, int]])
    indexed: set[str] = field(default_factory=set[str])

    def changes(self, seen: Sequence[_S]) -> tuple[list[str], list[_S]]:
        """Paths gone from the disk, and the files seen that are new or changed."""
        stamps = self.stamps
        seen_paths = {s.path for s in seen}
        gone = [p for p in stamps if p not in seen_paths]
        todo = [s for s in seen if stamps.get(s.path) != (s.size, s.mtime_ns)]
        return gone, todo


def read_listing(conn: sqlite3.Connection, kind: str, scope: str) -> ScopeListing:
    """The rows of one scope as the database holds them now."""
    listing = ScopeListing()
    for path, size, mtime_ns, indexed in conn.execute(
        "SELECT path, size, mtime_ns, indexed FROM files WHERE kind = ? AND scope = ?",
        (kind, scope),
    ):
        listing.stamps[str(path)] = (int(size), int(mtime_ns))
        if indexed:
            listing.indexed.add(str(path))
    return listing


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


class Listings:
    """The kept rows of each scope read so far, valid for one ``data_version``."""

    def __init__(self) -> None:
        self._scopes: dict[tuple[str, str], ScopeListing] = {}
        self._version: int | None = None

    def clear(self) -> None:
        """Forget every kept row (this connection wrote what it did not follow)."""
        self._scopes.clear()
        self._version = None

    def of(self, conn: sqlite3.Connection, kind: str, scope: str) -> tuple[ScopeListing, int]:
        """The rows of one scope (read when not kept or stale) and the version they hold for."""
        version = _data_version(conn)
        if version != self._version:
            self._scopes.clear()
            self._version = version
        key = (kind, scope)
        listing = self._scopes.get(key)
        if listing is None:
            listing = self._scopes[key] = read_listing(conn, kind, scope)
        return listing, version

    def written(
        self,
        conn: sqlite3.Connection,
        kind: str,
        scope: str,
        listing: ScopeListing,
        *,
        version: int,
        foreign: bool,
    ) -> None:
        """This connection committed ``listing`` as the scope's rows.

        Kept when no other connection committed since ``version`` was read (its own
        commits leave the version as it was) and no row of another scope was
        touched (``foreign``); otherwise everything is read again next time.
        """
        if foreign or _data_version(conn) != version or version != self._version:
            self.clear()
            return
        self._scopes[(kind, scope)] = listing

    def indexed_paths(
        self, conn: sqlite3.Connection, scopes: list[tuple[str, str]]
    ) -> list[str] | None:
        """The indexed paths of ``scopes``, sorted as SQLite's ``ORDER BY path`` sorts.

        ``None`` when a scope's rows are not kept or another connection committed
        since they were read: the caller asks the database then. Python orders
        strings by code point, which is the byte order of their UTF-8 (SQLite's
        default collation).
        """
        if self._version is None or _data_version(conn) != self._version:
            return None
        paths: list[str] = []
        for key in scopes:
            listing = self._scopes.get(key)
            if listing is None:
                return None
            paths.extend(listing.indexed)
        paths.sort()
        return paths


def key_paths(
    paths: list[str], session_id: str, project_id: str | None, *, exclude_injected: bool
) -> list[str]:
    """The memory keys index's share of the indexed ``paths``, in their order.

    ``*.md`` files but the checkpoint "learning" files and, with
    ``exclude_injected``, the files the rebuild body injects whole (see
    :meth:`~mimo_ctx.memory_index.MemoryIndex.paths`).
    """
    injected: set[str] = set()
    if exclude_injected:
        injected = {f"sessions/{session_id}/checkpoint.md", "global/MEMORY.md"}
        if project_id is not None:
            injected.add(f"projects/{project_id}/MEMORY.md")
    out: list[str] = []
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if not name.endswith(".md") or name.startswith(CHECKPOINT_LEARNING_PREFIX):
            continue
        if path not in injected:
            out.append(path)
    return out
