"""The memory index's kept rows against reading them every time (issue 18).

A reconcile compares the disk with the rows of each scope as its connection last
saw them (:mod:`mimo_ctx._index_listing`), trusted while no other connection
committed, and the rebuild's paths come from those rows. Here one disk is served
by two worlds of two connections each (a second index on the same database file
stands for another process): one with the kept rows, one that reads every row
each time (the plain computation). Hypothesis draws what happens to the disk and
which connection reconciles; every answer must be the same in both worlds, and
the same as a fresh index of the disk.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx._index_listing import Listings, ScopeListing, read_listing
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.memory_index import MemoryIndex, ReconcileStats

S, OTHER, P = "ses_listing_a", "ses_listing_b", "proj"


class _ReadEveryTime(Listings):
    """The plain computation: every scope's rows read from the database each time."""

    def of(self, conn: sqlite3.Connection, kind: str, scope: str) -> tuple[ScopeListing, int]:
        return read_listing(conn, kind, scope), 0

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
        return

    def indexed_paths(
        self, conn: sqlite3.Connection, scopes: list[tuple[str, str]]
    ) -> list[str] | None:
        return None


def _files(layout: MemoryLayout) -> list[Path]:
    return [
        layout.checkpoint_path(S),
        layout.notes_path(S),
        layout.session_dir(S) / "topics" / "a.md",
        layout.session_dir(S) / "checkpoint-learning-1.md",
        layout.session_dir(OTHER) / "b.md",
        layout.project_memory_path(P),
        layout.project_dir(P) / "c.md",
        layout.project_dir(P) / "deep" / "er" / "d.txt",
        layout.global_memory_path(),
        layout.global_dir() / "e.md",
    ]


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 9), st.integers(0, 40)),
        st.tuples(st.just("binary"), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("touch"), st.integers(0, 9), st.integers(1, 3)),
        st.tuples(st.just("delete"), st.integers(0, 9), st.just(0)),
        # Which connection reconciles which session: 0 the one under test, 1 the
        # other "process" (its commits are what the kept rows must notice).
        st.tuples(st.just("reconcile"), st.integers(0, 1), st.sampled_from([S, OTHER])),
        # Another program drops a row from the database file behind both indexes.
        st.tuples(st.just("drop-row"), st.integers(0, 9), st.just(0)),
    ),
    max_size=14,
)


def _drop_row(db: Path, relative: str) -> None:
    # As the index drops a file: its row and its chunks (a rowid range).
    with sqlite3.connect(db, isolation_level=None) as conn:
        for first, count in conn.execute(
            "SELECT first_row, n_rows FROM files WHERE path = ?", (relative,)
        ).fetchall():
            conn.execute(
                "DELETE FROM chunks WHERE rowid BETWEEN ? AND ?", (first, first + count - 1)
            )
        conn.execute("DELETE FROM files WHERE path = ?", (relative,))
    conn.close()


async def _world(db: Path) -> tuple[MemoryIndex, MemoryIndex]:
    return await MemoryIndex(db).__aenter__(), await MemoryIndex(db).__aenter__()


async def _run(ops: list[tuple[str, int, object]]) -> None:
    with tempfile.TemporaryDirectory() as base:
        layout = MemoryLayout(Path(base, "memory"))
        files = _files(layout)
        kept = await _world(Path(base, "kept.db"))
        plain = await _world(Path(base, "plain.db"))
        for index in plain:
            index._listings = _ReadEveryTime()  # pyright: ignore[reportPrivateUsage]
        try:
            for op, number, arg in [*ops, ("reconcile", 0, S)]:
                path = files[number]
                if op in ("write", "binary"):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    data = b"x\x00y" if op == "binary" else b"line\n" * int(str(arg))
                    path.write_bytes(data)
                elif op == "touch" and path.exists():
                    info = path.stat()
                    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + int(str(arg)) * 10**9))
                elif op == "delete":
                    path.unlink(missing_ok=True)
                elif op == "drop-row":
                    for db in ("kept.db", "plain.db"):
                        _drop_row(Path(base, db), path.relative_to(layout.root).as_posix())
                elif op == "reconcile":
                    session = str(arg)
                    got: list[ReconcileStats] = []
                    for world in (kept, plain):
                        got.append(
                            await world[number].reconcile(layout, session_id=session, project_id=P)
                        )
                    assert got[0] == got[1]
                # After every step: the rebuild's paths, in both worlds, and fresh.
                answers: list[list[str]] = []
                for world in (kept, plain):
                    answers.append(
                        await world[0].reconciled_paths(layout, session_id=S, project_id=P)
                    )
                    answers.append(await world[0].paths(S, P))
                async with MemoryIndex() as fresh:
                    answers.append(await fresh.reconciled_paths(layout, session_id=S, project_id=P))
                assert all(answer == answers[0] for answer in answers), (op, number, answers)
        finally:
            for index in (*kept, *plain):
                await index.aclose()


@settings(max_examples=40, deadline=None)
@given(ops=_OPS)
def test_kept_rows_answer_as_reading_every_row(ops: list[tuple[str, int, object]]) -> None:
    anyio.run(_run, ops)


def test_another_connection_writing_is_seen(tmp_path: Path) -> None:
    # The case the data version is for, spelled out: the other connection indexes
    # a new file and drops one; the kept rows of the first are not trusted then.
    layout = MemoryLayout(tmp_path / "memory")
    files = _files(layout)

    async def run() -> None:
        for path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n")
        one, two = await _world(tmp_path / "index.db")
        try:
            first = await one.reconciled_paths(layout, session_id=S, project_id=P)
            (layout.project_dir(P) / "new.md").write_text("new\n")
            files[6].unlink()
            await two.reconcile(layout, session_id=OTHER, project_id=P)
            # The disk and the database now agree; `one` has nothing to write,
            # so only its kept rows could be wrong.
            second = await one.reconciled_paths(layout, session_id=S, project_id=P)
            assert f"projects/{P}/new.md" in second
            assert f"projects/{P}/c.md" in first
            assert f"projects/{P}/c.md" not in second
            assert second == await one.paths(S, P)
            # A row dropped by another program: indexed again, as the plain
            # computation (which reads the rows) does.
            _drop_row(tmp_path / "index.db", f"projects/{P}/new.md")
            assert await one.reconciled_paths(layout, session_id=S, project_id=P) == second
            assert await one.paths(S, P) == second
        finally:
            await one.aclose()
            await two.aclose()

    anyio.run(run)
