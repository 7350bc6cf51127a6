"""SQLiteStore-specific behaviour: persistence, file safety, WAL, plans, processes."""

# The plan tests read the module's statement constants and caches on purpose.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message
from mimo_ctx.store import SCHEMA_VERSION, InMemoryStore, SQLiteStore, open_store
from mimo_ctx.store import _sqlite_schema as sqlite_schema
from mimo_ctx.store import sqlite as sqlite_module
from mimo_ctx.tokens import estimate_message_tokens

from .builders import T0, actor, assistant, boundary, every_part_message, make_session, task, user

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_reopening_the_file_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        s = make_session()
        await store.create_session(s)
        u = user(s.id, "hello", t=T0)
        a = every_part_message(s.id, t=T0 + 10)
        await store.append_messages([u, a])
        await store.set_watermark(s.id, u.id)
        b = boundary(s.id, u.id, t=T0 + 1)
        assert await store.commit_rebuild(s.id, usage_key=a.id, boundary=b, updated=[])
        await store.upsert_task(task(s.id, "T1", status="done"))
        await store.upsert_actor(actor(s.id, "act_1"))
        _, seq = await store.changes_since(s.id, 0)

    async with SQLiteStore(path) as store:
        got_session = await store.get_session(s.id)
        assert got_session is not None
        assert got_session.watermark == u.id
        assert got_session.prefix == s.prefix
        listed = await store.list_messages(s.id)
        assert [m.id for m in listed] == [u.id, b.id, a.id]
        assert listed[2].model_dump() == a.model_dump()
        latest = await store.latest_boundary(s.id)
        assert latest is not None
        assert latest.id == b.id
        assert [t.status for t in await store.list_tasks(s.id)] == ["done"]
        assert [x.id for x in await store.list_actors(s.id, active_only=True)] == ["act_1"]
        # The usage key survived: a second rebuild for it is refused.
        b2 = boundary(s.id, u.id, t=T0 + 1)
        assert not await store.commit_rebuild(s.id, usage_key=a.id, boundary=b2, updated=[])
        # The sequence continues where it was.
        assert await store.changes_since(s.id, seq) == ([], seq)
        later = user(s.id, "later", t=T0 + 20)
        await store.append_messages([later])
        changed, seq2 = await store.changes_since(s.id, seq)
        assert [m.id for m in changed] == [later.id]
        assert seq2 > seq


async def test_r2_2_token_estimate_is_stored_and_restored_on_load(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    s = make_session()
    m = every_part_message(s.id)
    expected = estimate_message_tokens(Message.model_validate_json(m.model_dump_json()))
    async with SQLiteStore(path) as store:
        await store.create_session(s)
        await store.append_messages([m])
    with sqlite3.connect(path) as raw:
        row = raw.execute("SELECT token_estimate FROM messages WHERE id = ?", (m.id,)).fetchone()
    assert row == (expected,)
    async with SQLiteStore(path) as store:
        loaded = await store.get_message(m.id)
    assert loaded is not None
    # The cache is filled from the row: no re-serialisation on a cold load.
    assert loaded._token_estimate == expected


async def test_update_rewrites_stored_estimate(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "agent.db") as store:
        s = make_session()
        await store.create_session(s)
        a = assistant(s.id, "short", t=T0)
        await store.append_messages([a])
        longer = a.model_copy(update={"parts": [*a.parts, *user(s.id, "x" * 4000, t=T0).parts]})
        await store.update_messages([longer])
        loaded = await store.get_message(a.id)
    assert loaded is not None
    assert loaded._token_estimate == estimate_message_tokens(longer)
    assert (loaded._token_estimate or 0) > 1000


@pytest.mark.parametrize(
    "content",
    [
        b"this is not a database, it is a text file\n" * 200,
        b"SQLite format 3\x00" + b"\xff" * 4000,  # right magic, garbage header
    ],
    ids=["text", "bad-header"],
)
async def test_corrupted_file_is_refused_and_left_unchanged(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "precious.db"
    path.write_bytes(content)
    with pytest.raises(StoreError, match=r"precious\.db"):
        await SQLiteStore.open(path)
    # Lazy open reports it on first use, too.
    store = SQLiteStore(path)
    with pytest.raises(StoreError, match=r"precious\.db"):
        await store.list_sessions()
    await store.aclose()
    assert path.read_bytes() == content


async def test_damaged_store_reports_store_error(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    async with SQLiteStore(path) as store:
        s = make_session()
        await store.create_session(s)
        await store.append_messages([user(s.id, "x" * 3000, t=T0 + i) for i in range(20)])
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    assert len(data) > 2 * page_size
    data[page_size:] = b"\xa5" * (len(data) - page_size)  # every page but the first
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"damaged\.db"):
        async with SQLiteStore(path) as store:
            await store.list_messages(s.id)


async def test_foreign_sqlite_database_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "someone_else.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        raw.execute("INSERT INTO customers (name) VALUES ('Ada')")
    raw.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match=r"someone_else\.db.*not a mimo_ctx store"):
        await SQLiteStore.open(path)
    assert path.read_bytes() == before


async def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    async with SQLiteStore(path):
        pass
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StoreError, match=r"future\.db.*schema version"):
        await SQLiteStore.open(path)


async def test_missing_directory_gives_store_error_naming_path(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "agent.db"
    with pytest.raises(StoreError, match=r"agent\.db"):
        await SQLiteStore.open(path)


async def test_wal_mode_and_schema_version_on_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    async with SQLiteStore(path):
        pass
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"sessions", "messages", "rebuilds", "tasks", "actors"} <= tables
    finally:
        raw.close()


async def test_memory_path_needs_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with SQLiteStore(":memory:") as store:
        s = make_session()
        await store.create_session(s)
        assert await store.get_session(s.id) == s
    assert [p async for p in anyio.Path(tmp_path).iterdir()] == []


@pytest.mark.parametrize(
    ("name", "sql", "index"),
    [
        ("latest boundary", sqlite_module._SQL_LATEST_BOUNDARY, "messages_boundaries"),
        (
            "latest finished (agent)",
            sqlite_module._SQL_LATEST_FINISHED_BY_AGENT,
            "messages_finished_by_agent",
        ),
        ("latest finished (any)", sqlite_module._SQL_LATEST_FINISHED, "messages_finished"),
        ("changes since", sqlite_module._SQL_CHANGES, "messages_by_seq"),
    ],
)
async def test_hot_queries_are_single_index_lookups(
    tmp_path: Path, name: str, sql: str, index: str
) -> None:
    """The per-turn queries (DESIGN: O(new messages) per turn) must search an
    index, never scan the table or sort in a temporary b-tree."""
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        s = make_session()
        await store.create_session(s)
        await store.append_messages([assistant(s.id, f"m{i}", t=T0 + i) for i in range(50)])
    raw = sqlite3.connect(path)
    try:
        raw.execute("ANALYZE")
        params = (s.id, MAIN_AGENT) if sql.count("?") == 2 else (s.id,)
        if sql is sqlite_module._SQL_CHANGES:
            params = (s.id, 10)
        plan = " | ".join(str(r[-1]) for r in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    finally:
        raw.close()
    assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, (name, plan)
    assert "TEMP B-TREE" not in plan, (name, plan)
    assert "SCAN" not in plan, (name, plan)


@pytest.mark.parametrize("with_agent", [True, False])
async def test_list_messages_window_uses_an_index(tmp_path: Path, with_agent: bool) -> None:
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        s = make_session()
        await store.create_session(s)
    agent_clause = " AND agent = ?" if with_agent else ""
    sql = (
        f"SELECT token_estimate, payload FROM messages WHERE session_id = ?{agent_clause}"
        " AND (time_created, id) >= (?, ?) ORDER BY time_created DESC, id DESC LIMIT 10"
    )
    params = (s.id, MAIN_AGENT, T0, "") if with_agent else (s.id, T0, "")
    raw = sqlite3.connect(path)
    try:
        plan = " | ".join(str(r[-1]) for r in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    finally:
        raw.close()
    assert "USING INDEX messages_by" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


async def test_sqlite_work_runs_off_the_event_loop_thread() -> None:
    async with SQLiteStore(":memory:") as store:
        worker = await store._run(lambda _conn: threading.get_ident())
    assert worker != threading.get_ident()


async def test_write_waits_for_another_connection_instead_of_failing(tmp_path: Path) -> None:
    """busy_timeout: a write lock held elsewhere delays a write; it does not fail
    with "database is locked"."""
    path = tmp_path / "agent.db"
    async with SQLiteStore(path) as store:
        s = make_session()
        await store.create_session(s)
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        released = threading.Event()

        def release() -> None:
            time.sleep(0.3)
            blocker.execute("COMMIT")
            released.set()

        thread = threading.Thread(target=release)
        thread.start()
        try:
            await store.append_messages([user(s.id, "after the lock", t=T0)])
        finally:
            thread.join()
            blocker.close()
        assert released.is_set()
        assert await store.count_messages(s.id) == 1


async def test_constructor_rejects_bad_settings() -> None:
    with pytest.raises(StoreError, match="busy_timeout"):
        SQLiteStore(":memory:", busy_timeout=-1)
    with pytest.raises(StoreError, match="synchronous"):
        # A synchronous mode outside the two allowed on purpose: refused by name.
        SQLiteStore(":memory:", synchronous="OFF")  # pyright: ignore[reportArgumentType]


async def test_open_store_picks_the_implementation(tmp_path: Path) -> None:
    memory = await open_store()
    assert isinstance(memory, InMemoryStore)
    await memory.aclose()
    path = tmp_path / "agent.db"
    on_disk = await open_store(path)
    assert isinstance(on_disk, SQLiteStore)
    assert on_disk.path == str(path)
    assert path.exists()
    await on_disk.aclose()


async def test_aclose_under_cancellation_releases_connection(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "agent.db")
    await store.create_session(make_session())
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.aclose()
    assert store._conn is None
    with pytest.raises(StoreError, match="closed"):
        await store.list_sessions()


# --------------------------------------------------------------------------- processes

_WORKER = r"""
import os, sys, time
from pathlib import Path

import anyio

from mimo_ctx.messages import CheckpointPart, Message, TextPart
from mimo_ctx.store import SQLiteStore

path, session_id, name = sys.argv[1], sys.argv[2], sys.argv[3]
count, barrier = int(sys.argv[4]), Path(sys.argv[5])


async def main() -> None:
    async with SQLiteStore(path) as store:
        (barrier / name).touch()
        deadline = time.monotonic() + 60
        while len(list(barrier.iterdir())) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the other process never started")
            await anyio.sleep(0.005)
        won = None
        for i in range(count):
            message = Message(
                session_id=session_id, role="user", time_created=1_000 + i,
                parts=[TextPart(text=f"{name}-{i}")],
            )
            await store.append_messages([message])
            if i == count // 2:
                boundary = Message(
                    session_id=session_id, role="user", time_created=1_000 + i,
                    parts=[CheckpointPart(covered_up_to=message.id)],
                )
                won = await store.commit_rebuild(
                    session_id, usage_key="usage-1", boundary=boundary, updated=[]
                )
        print(f"committed={won}")


anyio.run(main)
"""


def test_two_processes_share_one_file(tmp_path: Path) -> None:
    """Two OS processes appending to one file lose nothing, and of their two
    commits for the same usage key exactly one succeeds (R1.4 across processes)."""
    path = tmp_path / "shared.db"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    session = make_session()

    async def setup() -> None:
        async with SQLiteStore(path) as store:
            await store.create_session(session)

    anyio.run(setup)

    count = 150
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(path), session.id, name, str(count), str(barrier)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        for name in ("alpha", "beta")
    ]
    outputs: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        outputs.append(out.strip())
    assert sorted(outputs) == ["committed=False", "committed=True"]

    async def check() -> None:
        async with SQLiteStore(path) as store:
            stored = await store.list_messages(session.id, agent=None)
            texts = {p.text for m in stored for p in m.parts if p.type == "text"}
            assert texts == {f"{n}-{i}" for n in ("alpha", "beta") for i in range(count)}
            assert sum(m.is_boundary for m in stored) == 1
            assert len(stored) == 2 * count + 1
            changed, _ = await store.changes_since(session.id, 0)
            assert len(changed) == 2 * count + 1

    anyio.run(check)


async def test_version_1_file_is_migrated_to_the_user_messages_index(tmp_path: Path) -> None:
    # Schema step 2 (issue 14): an index of the main history's user messages.
    path = tmp_path / "v1.db"
    raw = sqlite3.connect(path)
    try:
        for statement in sqlite_schema.MIGRATIONS[0]:
            raw.execute(statement)
        raw.execute("PRAGMA user_version = 1")
        raw.commit()
    finally:
        raw.close()
    async with SQLiteStore(path) as store:
        session = make_session()
        await store.create_session(session)
        await store.append_messages([user(session.id, "hello", t=T0)])
        assert [m.id for m in await store.list_user_messages(session.id)]
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        plan = raw.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM messages WHERE session_id = 's' AND agent = 'main'"
            " AND role = 'user' AND is_boundary = 0 ORDER BY time_created DESC, id DESC LIMIT 5"
        ).fetchall()
        assert any("messages_user" in str(row) for row in plan), plan
    finally:
        raw.close()


async def test_upgrade_from_version_1_orders_old_rows_by_id_and_new_ones_by_write(
    tmp_path: Path,
) -> None:
    """Schema step 3 adds the write order of insertions (issue 17). A version-1 file
    upgrades in place: its rows, whose insertion order was never kept, are ranked by
    id (the rule they were written under), and every message written afterwards is
    newer than all of them, whatever its id."""
    path = tmp_path / "v1.db"
    s = make_session()
    u = user(s.id, "hello", t=T0)
    a_new = assistant(s.id, "newer id, written first", t=T0 + 20)
    a_old = assistant(s.id, "older id, written second", t=T0 + 10).model_copy(
        update={"id": "msg_00000000000001aaaaaaaaaaaaaa"}
    )
    b = boundary(s.id, u.id, t=T0 + 1)
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in sqlite_schema.MIGRATIONS[0]:
            raw.execute(statement)
        raw.execute("PRAGMA user_version = 1")
        raw.execute(
            "INSERT INTO sessions (id, time_created, payload) VALUES (?, ?, ?)",
            (s.id, s.time_created, s.model_dump_json()),
        )
        for seq, m in enumerate([u, a_new, a_old, b], start=1):
            raw.execute(
                "INSERT INTO messages (id, session_id, agent, role, time_created, is_boundary,"
                " is_finished_assistant, token_estimate, payload, seq)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    m.id,
                    s.id,
                    m.agent,
                    m.role,
                    m.time_created,
                    int(m.is_boundary),
                    int(m.role == "assistant"),
                    estimate_message_tokens(m),
                    m.model_dump_json(),
                    seq,
                ),
            )
        raw.execute("UPDATE counters SET value = 4 WHERE name = 'seq'")
    finally:
        raw.close()

    async with SQLiteStore(path) as store:
        latest = await store.latest_finished_assistant(s.id)
        assert latest is not None
        assert latest.id == a_new.id  # by id, as version 1 decided
        stored = {m.id: m.insert_seq for m in await store.list_messages(s.id)}
        assert sorted(stored, key=lambda i: stored[i] or 0) == sorted(stored)
        late = assistant(s.id, "written last, oldest id", t=T0 + 30).model_copy(
            update={"id": "msg_00000000000000aaaaaaaaaaaaaa"}
        )
        await store.append_messages([late])
        assert late.insert_seq is not None
        assert late.insert_seq > max(v or 0 for v in stored.values())
        newest = await store.latest_finished_assistant(s.id)
        assert newest is not None
        assert newest.id == late.id
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        raw.close()


async def test_a_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    """Every migration step (step 4: the host index, off-branch marks) keeps every
    stored message."""
    path = tmp_path / "v1.db"
    session = make_session()
    message = user(session.id, "kept", t=T0)
    payload = message.model_dump_json(exclude={"off_branch", "insert_seq"})
    with sqlite3.connect(path) as raw:
        for statement in sqlite_schema.MIGRATIONS[0]:
            raw.execute(statement)
        raw.execute("PRAGMA user_version = 1")
        raw.execute(
            "INSERT INTO sessions (id, time_created, payload) VALUES (?, ?, ?)",
            (session.id, session.time_created, session.model_dump_json()),
        )
        raw.execute(
            "INSERT INTO messages (id, session_id, agent, role, time_created, is_boundary,"
            " is_finished_assistant, token_estimate, seq, payload)"
            " VALUES (?, ?, 'main', 'user', ?, 0, 0, 1, 1, ?)",
            (message.id, session.id, message.time_created, payload),
        )
    raw.close()
    async with SQLiteStore(path) as store:
        assert [m.id for m in await store.list_messages(session.id)] == [message.id]
        assert (await store.host_index(session.id, agent="main")).head is None
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        raw.close()
