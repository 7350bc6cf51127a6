"""The FTS5 memory index (SPEC R5.6, issue 8): reconcile, scopes, escaping, safety."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_ctx.errors import StoreError
from mimo_ctx.memory import MemoryLayout, list_memory_files
from mimo_ctx.memory_index import MemoryIndex, ReconcileStats, fts_match_expression

S, P = "ses_1", "proj"


def write(path: Path, text: str) -> Path:
    """Write ``text`` (creating parents) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
async def index() -> AsyncIterator[MemoryIndex]:
    """A fresh in-memory index."""
    async with MemoryIndex() as idx:
        yield idx


async def search(
    index: MemoryIndex, query: str, *, session: str = S, project: str = P
) -> list[str]:
    """``path:line`` of every hit."""
    hits = await index.search(query, session_id=session, project_id=project, limit=50)
    return [f"{h.path}:{h.line}" for h in hits]


# -- reconcile ---------------------------------------------------------------------------------


async def test_r5_6_reconcile_add_modify_delete(layout: MemoryLayout, index: MemoryIndex) -> None:
    """New files are indexed, changed files re-indexed, deleted files dropped, others kept."""
    notes = write(layout.notes_path(S), "alpha\n")
    memory = write(layout.project_memory_path(P), "# Project\nbravo\n")
    write(layout.global_memory_path(), "charlie\n")
    stats = await index.reconcile(layout, session_id=S, project_id=P)
    assert stats == ReconcileStats(added=3)
    assert await index.reconcile(layout, session_id=S, project_id=P) == ReconcileStats(unchanged=3)

    notes.write_text("alpha\ndelta was added\n", encoding="utf-8")
    memory.unlink()
    write(layout.task_progress_path(S, "T1"), "echo\n")  # written outside the tools
    stats = await index.reconcile(layout, session_id=S, project_id=P)
    assert stats == ReconcileStats(added=1, updated=1, removed=1, unchanged=1)
    assert await search(index, "delta") == ["sessions/ses_1/notes.md:2"]
    assert await search(index, "bravo") == []
    assert await search(index, "echo") == ["sessions/ses_1/tasks/T1/progress.md:1"]


async def test_reconcile_notices_same_size_rewrite(
    layout: MemoryLayout, index: MemoryIndex
) -> None:
    """A rewrite that keeps the size is still noticed, by its mtime (ns)."""
    notes = write(layout.notes_path(S), "apple\n")
    await index.reconcile(layout, session_id=S, project_id=P)
    before = os.stat(notes).st_mtime_ns
    notes.write_text("mango\n", encoding="utf-8")
    os.utime(notes, ns=(before + 1_000_000, before + 1_000_000))
    stats = await index.reconcile(layout, session_id=S, project_id=P)
    assert stats.updated == 1
    assert await search(index, "mango") == ["sessions/ses_1/notes.md:1"]
    assert await search(index, "apple") == []


async def test_reconcile_missing_directories(layout: MemoryLayout, index: MemoryIndex) -> None:
    """No memory directories yet: nothing to index, no error; a removed directory empties."""
    assert await index.reconcile(layout, session_id=S, project_id=P) == ReconcileStats()
    write(layout.notes_path(S), "zeta\n")
    await index.reconcile(layout, session_id=S, project_id=None)
    assert await search(index, "zeta") == ["sessions/ses_1/notes.md:1"]
    layout.notes_path(S).unlink()
    layout.session_dir(S).rmdir()
    stats = await index.reconcile(layout, session_id=S, project_id=None)
    assert stats.removed == 1
    assert await search(index, "zeta") == []


async def test_persistent_index_only_reads_changes(layout: MemoryLayout, tmp_path: Path) -> None:
    """A file-backed index reopened later reads only what changed meanwhile."""
    db = tmp_path / "index.sqlite3"
    write(layout.notes_path(S), "one\n")
    write(layout.global_memory_path(), "two\n")
    async with MemoryIndex(db) as idx:
        assert (await idx.reconcile(layout, session_id=S, project_id=P)).added == 2
    write(layout.notes_path(S), "one and three\n")
    async with MemoryIndex(db) as idx:
        stats = await idx.reconcile(layout, session_id=S, project_id=P)
        assert stats == ReconcileStats(updated=1, unchanged=1)
        assert await search(idx, "three") == ["sessions/ses_1/notes.md:1"]


async def test_index_rebuilt_for_another_root(tmp_path: Path) -> None:
    """An index file built for another memory root starts over (it is a cache)."""
    db = tmp_path / "index.sqlite3"
    first = MemoryLayout(tmp_path / "m1")
    second = MemoryLayout(tmp_path / "m2")
    write(first.notes_path(S), "first root\n")
    write(second.notes_path(S), "second root\n")
    async with MemoryIndex(db) as idx:
        await idx.reconcile(first, session_id=S, project_id=P)
        assert await search(idx, "first") == ["sessions/ses_1/notes.md:1"]
        await idx.reconcile(second, session_id=S, project_id=P)
        assert await search(idx, "first") == []
        assert await search(idx, "second") == ["sessions/ses_1/notes.md:1"]


async def test_foreign_database_refused(tmp_path: Path) -> None:
    """A database that is not an index, or not a database, is refused with a clear error."""
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("create table customers (id integer)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a usable memory index"):
        await MemoryIndex(foreign).__aenter__()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable memory index"):
        await MemoryIndex(garbage).__aenter__()


async def test_closed_index_and_bad_limit(index: MemoryIndex) -> None:
    """Misuse gets a StoreError naming the problem."""
    with pytest.raises(StoreError, match="limit must be at least 1"):
        await index.search("x", session_id=S, project_id=P, limit=0)
    await index.aclose()
    await index.aclose()
    with pytest.raises(StoreError, match="is closed"):
        await index.paths(S, P)


# -- scopes and safety -------------------------------------------------------------------------


async def test_r5_4_search_never_sees_another_session(
    layout: MemoryLayout, index: MemoryIndex
) -> None:
    """Both sessions are in one index; each search sees its session, project and global only."""
    write(layout.notes_path("ses_1"), "shared word kiwi\n")
    write(layout.notes_path("ses_2"), "kiwi of session two\n")
    write(layout.project_memory_path("p1"), "kiwi in p1\n")
    write(layout.project_memory_path("p2"), "kiwi in p2\n")
    write(layout.global_memory_path(), "kiwi everywhere\n")
    await index.reconcile(layout, session_id="ses_1", project_id="p1")
    await index.reconcile(layout, session_id="ses_2", project_id="p2")
    one = await search(index, "kiwi", session="ses_1", project="p1")
    two = await search(index, "kiwi", session="ses_2", project="p2")
    assert sorted(one) == [
        "global/MEMORY.md:1",
        "projects/p1/MEMORY.md:1",
        "sessions/ses_1/notes.md:1",
    ]
    assert sorted(two) == [
        "global/MEMORY.md:1",
        "projects/p2/MEMORY.md:1",
        "sessions/ses_2/notes.md:1",
    ]
    assert await index.paths("ses_1", "p1") == ["sessions/ses_1/notes.md"]


async def test_r5_6_symlinks_out_of_the_root_are_never_indexed(
    layout: MemoryLayout, index: MemoryIndex, tmp_path: Path
) -> None:
    """File symlinks out, directory symlinks and a scope directory linked out are skipped."""
    outside = tmp_path / "outside"
    write(outside / "secret.md", "secret lemur\n")
    write(layout.notes_path(S), "inside\n")
    session_dir = layout.session_dir(S)
    os.symlink(outside / "secret.md", session_dir / "link.md")
    os.symlink(outside, session_dir / "linked-dir")
    os.symlink(layout.notes_path(S), session_dir / "alias.md")  # inside the root: fine
    os.symlink(outside, layout.root / "global")
    stats = await index.reconcile(layout, session_id=S, project_id=P)
    assert stats.skipped == 1
    assert await search(index, "lemur") == []
    assert await index.paths(S, P) == ["sessions/ses_1/alias.md", "sessions/ses_1/notes.md"]


async def test_binary_skipped_and_invalid_utf8_replaced(
    layout: MemoryLayout, index: MemoryIndex
) -> None:
    """A NUL byte marks a binary file (not indexed); invalid UTF-8 is decoded with U+FFFD."""
    session_dir = layout.session_dir(S)
    session_dir.mkdir(parents=True)
    (session_dir / "blob.md").write_bytes(b"\x00\x01walrus\x00")
    (session_dir / "latin1.txt").write_bytes(b"caf\xe9 walrus\n")
    stats = await index.reconcile(layout, session_id=S, project_id=P)
    assert stats == ReconcileStats(added=2, skipped=1)
    hits = await index.search("walrus", session_id=S, project_id=P)
    assert [(h.path, h.snippet) for h in hits] == [
        ("sessions/ses_1/latin1.txt", "caf\ufffd walrus")
    ]
    assert await index.reconcile(layout, session_id=S, project_id=P) == ReconcileStats(unchanged=2)


async def test_r5_6_paths_match_list_memory_files(layout: MemoryLayout, index: MemoryIndex) -> None:
    """``paths`` selects what ``list_memory_files`` lists (the keys index, R5.6, A6)."""
    for path in (
        layout.checkpoint_path(S),
        layout.notes_path(S),
        layout.session_dir(S) / "checkpoint-parser.md",
        layout.session_dir(S) / "checkpoint-learning-1.md",
        layout.session_dir(S) / ".hidden.md",
        layout.session_dir(S) / "scratch.txt",
        layout.task_progress_path(S, "T1"),
        layout.project_memory_path(P),
        layout.project_dir(P) / "deep" / "MEMORY.md",
        layout.global_memory_path(),
        layout.global_dir() / "style.md",
    ):
        write(path, "text\n")
    await index.reconcile(layout, session_id=S, project_id=P)
    expected = await list_memory_files(layout, session_id=S, project_id=P)
    assert await index.paths(S, P) == expected
    assert "sessions/ses_1/checkpoint.md" in await index.paths(S, P, exclude_injected=False)


# -- search ------------------------------------------------------------------------------------


async def test_hit_line_is_the_line_with_the_term(layout: MemoryLayout, index: MemoryIndex) -> None:
    """Hits point at the line holding the term, also deep inside a paragraph."""
    lines = [f"line {i} filler" for i in range(1, 41)]
    lines[32] = "line 33 has the needle"
    write(layout.notes_path(S), "# Notes\n\n" + "\n".join(lines) + "\n")
    await index.reconcile(layout, session_id=S, project_id=P)
    hits = await index.search("needle", session_id=S, project_id=P)
    assert [(h.path, h.line, h.snippet, h.scope) for h in hits] == [
        ("sessions/ses_1/notes.md", 35, "line 33 has the needle", "session")
    ]


async def test_bm25_ranks_more_matching_chunks_first(
    layout: MemoryLayout, index: MemoryIndex
) -> None:
    """OR-joined words: a chunk holding both words outranks chunks holding one."""
    write(layout.notes_path(S), "rate only\n\nlimit only\n\nthe rate limit is 5 per second\n")
    await index.reconcile(layout, session_id=S, project_id=P)
    hits = await index.search("rate limit", session_id=S, project_id=P)
    assert hits[0].line == 5
    assert sorted(h.line for h in hits) == [1, 3, 5]


async def test_long_line_snippet_is_cut_around_the_term(
    layout: MemoryLayout, index: MemoryIndex
) -> None:
    """A very long line gives a snippet of about 200 characters around the term."""
    write(layout.notes_path(S), "x " * 2000 + "unicorn " + "y " * 2000 + "\n")
    await index.reconcile(layout, session_id=S, project_id=P)
    (hit,) = await index.search("unicorn", session_id=S, project_id=P)
    assert "unicorn" in hit.snippet
    assert hit.snippet.startswith("…")
    assert hit.snippet.endswith("…")
    assert len(hit.snippet) <= 202


async def test_non_ascii_search(layout: MemoryLayout, index: MemoryIndex) -> None:
    """CJK words match inside unspaced text; diacritics fold; emoji never raise."""
    write(
        layout.project_memory_path(P),
        "# 项目\n\n我们的数据库很慢,需要索引。\n\nLe café est prêt 🎉\n\nデータベースの設定\n",
    )
    await index.reconcile(layout, session_id=S, project_id=P)
    assert await search(index, "数据库") == ["projects/proj/MEMORY.md:3"]
    assert await search(index, "需要 索引") == ["projects/proj/MEMORY.md:3"]
    assert await search(index, "データベース") == ["projects/proj/MEMORY.md:7"]
    assert await search(index, "cafe") == ["projects/proj/MEMORY.md:5"]
    assert await search(index, "🎉") == []
    assert await search(index, "数据库x") == ["projects/proj/MEMORY.md:3"]


FTS_SPECIALS = [
    '"',
    '""',
    '"unterminated',
    "(",
    ")",
    "()",
    "*",
    "a*",
    "NEAR",
    "NEAR(a b)",
    "NEAR(a b, 2)",
    "a OR",
    "OR",
    "AND",
    "NOT",
    "a NOT b",
    "-x",
    "col:val",
    "body:x",
    "{body cjk}: x",
    "^",
    "^start",
    "+",
    "数据库",
    "😀",
    "🎉 party",
    "\x00",
    "a\x00b",
    "'; DROP TABLE files; --",
    "\\",
    "x" * 5000,
    " ".join(f"w{i}" for i in range(100)),
    "",
    "   ",
]


@pytest.mark.parametrize("query", FTS_SPECIALS)
async def test_fts_syntax_in_queries_never_raises(
    layout: MemoryLayout, index: MemoryIndex, query: str
) -> None:
    """FTS5 operators and syntax characters are plain text (issue 8 done-when)."""
    write(layout.notes_path(S), "a b start x party NEAR col val body\n")
    await index.reconcile(layout, session_id=S, project_id=P)
    await index.search(query, session_id=S, project_id=P)
    assert await search(index, "NEAR") == ["sessions/ses_1/notes.md:1"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60))
def test_match_expression_is_always_valid_fts(query: str) -> None:
    """Property: any text becomes ``None`` or an expression FTS5 accepts."""
    expression = fts_match_expression(query)
    if expression is None:
        assert not any(ch.isalnum() for ch in query.replace("\x00", ""))
        return
    conn = sqlite3.connect(":memory:")
    conn.execute("create virtual table t using fts5(body, cjk)")
    conn.execute("insert into t values ('some text', '')")
    conn.execute("select count(*) from t where t match ?", (expression,)).fetchall()
    conn.close()


async def test_search_plan_streams_in_rank_order(tmp_path: Path, layout: MemoryLayout) -> None:
    """The search query lets FTS5 sort by rank itself: no temporary B-tree over all matches."""
    from mimo_ctx.memory_index import _SEARCH_SQL  # pyright: ignore[reportPrivateUsage]

    db = tmp_path / "plan.sqlite3"
    write(layout.notes_path(S), "plan\n")
    async with MemoryIndex(db) as idx:
        await idx.reconcile(layout, session_id=S, project_id=P)
    conn = sqlite3.connect(db)
    try:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {_SEARCH_SQL}", ('"plan"', P, S, 10)).fetchall()
    finally:
        conn.close()
    details = " | ".join(str(row[-1]) for row in plan)
    assert "TEMP B-TREE" not in details
    assert "SEARCH f USING INTEGER PRIMARY KEY" in details


async def test_two_indexes_share_one_file(layout: MemoryLayout, tmp_path: Path) -> None:
    """Two index objects (as two processes would) reconcile one file concurrently, safely."""
    import anyio

    for i in range(60):
        write(layout.session_dir(S) / f"f{i}.md", f"file {i} says quokka{i}\n")
    db = tmp_path / "shared.sqlite3"
    async with MemoryIndex(db) as first, MemoryIndex(db) as second:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: first.reconcile(layout, session_id=S, project_id=P))
            tg.start_soon(lambda: second.reconcile(layout, session_id=S, project_id=P))
        assert await first.reconcile(layout, session_id=S, project_id=P) == ReconcileStats(
            unchanged=60
        )
        assert await search(second, "quokka7") == ["sessions/ses_1/f7.md:1"]
        assert len(await second.paths(S, P)) == 60
