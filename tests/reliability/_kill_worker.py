"""A process that dies in the middle of a rebuild commit (issue 10 §2).

Run by ``test_faults.py`` as ``python _kill_worker.py <db> <memory_root> <session> <mode>``.
It prepares the session (which crosses the trigger line) with
``SQLiteStore.commit_rebuild`` instrumented to end the process abruptly with
``os._exit`` — no cleanup, no rollback, like a kill -9:

* ``inside``: after the boundary row was inserted and before micro-compaction
  updates the tool results (as edits of their rows or in full), inside the open
  SQLite transaction;
* ``after``: right after the transaction committed.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import SQLiteStore
from mimo_ctx.store._sqlite_base import MessageRow
from mimo_ctx.triggers import ModelLimits

KILLED = 9


async def main(db: str, memory_root: str, session_id: str, mode: str) -> None:
    if mode == "inside":
        original = SQLiteStore._update_contents  # pyright: ignore[reportPrivateUsage]

        def update(
            self: SQLiteStore,
            conn: sqlite3.Connection,
            rows: Sequence[MessageRow],
            insert_seqs: Sequence[int | None],
            what: str,
            session_id: str,
        ) -> list[int]:
            if what == "commit_rebuild":
                os._exit(KILLED)  # the boundary insert ran; micro-compaction did not
            return original(self, conn, rows, insert_seqs, what, session_id)

        def mark(self: SQLiteStore, *args: Any) -> list[int] | None:
            os._exit(KILLED)  # the boundary insert ran; the cleared results' edits did not

        # The kill is injected inside the store's own transaction, so the private
        # methods are replaced on the class (the worker process ends with it):
        # the copies are written as edits of their rows, or in full.
        SQLiteStore._update_contents = update  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
        SQLiteStore._mark_compacted = mark  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    store = await SQLiteStore.open(db)
    if mode == "after":
        commit = store.commit_rebuild

        async def commit_then_die(*args: Any, **kwargs: Any) -> bool:
            await commit(*args, **kwargs)
            os._exit(KILLED)

        store.commit_rebuild = commit_then_die
    async with ContextMiddleware(
        store, memory_root, model=ModelLimits(100_000, input_limit=100_000)
    ) as mw:
        await mw.prepare(session_id)
    sys.exit("the commit was never reached")


if __name__ == "__main__":
    db, memory_root, session_id, mode = sys.argv[1:5]
    anyio.run(main, db, memory_root, session_id, mode)
