"""PostgresStore: the whole Store contract against a real PostgreSQL server, and
what only a database shared by many workers must guarantee: once per usage across
processes (SPEC R1.4, R4), a change feed no reader can skip under concurrent
writers, versioned schema upgrades, and the cross-worker writer lease (SPEC A3).

The server's DSN comes from ``MIMO_CTX_PG_DSN`` (``scripts/start_postgres.sh``
starts a throwaway one and prints it; these tests never start a server). Without
a reachable server the tests skip, except under ``CI=true``, where they fail:
CI starts the server, so a missing one is a broken build, not a reason to skip.

Every store gets its own PostgreSQL schema (dropped after the test), so each test
starts from an empty store.
"""

# The plan tests read the module's statements on purpose.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart
from mimo_ctx.store import SessionState, Store

from .builders import T0, assistant, boundary, make_session, user

# Re-run the whole Store contract suite here: its tests take the `store` and
# `store_factory` fixtures, which this module overrides with PostgreSQL stores.
from .test_contract import *  # noqa: F403

_IN_CI = os.environ.get("CI", "").strip().lower() == "true"
_DSN_ENV = "MIMO_CTX_PG_DSN"


def _unavailable(reason: str) -> None:
    """Skip, or fail under CI (where the server is started, so it must be there)."""
    if _IN_CI:
        pytest.fail(f"{reason} (CI=true: the PostgreSQL tests must run in CI)", pytrace=False)
    pytest.skip(reason)


try:
    from mimo_ctx.store import _pg_driver as pg_driver
    from mimo_ctx.store import _pg_schema as pg_schema
    from mimo_ctx.store.postgres import (
        SCHEMA_VERSION,
        PostgresStore,
        PostgresWriterLease,
        upgrade,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    if _IN_CI:
        raise
    pytest.skip(
        f'PostgreSQL tests need asyncpg (pip install "mimo-ctx[postgres]"): {exc}',
        allow_module_level=True,
    )

REPO_ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- server access


def _run_async(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``fn`` on a fresh event loop in a helper thread.

    For sync fixtures, which may run while pytest-asyncio owns this thread's loop.
    """
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(anyio.run(fn))
        except BaseException as exc:  # handed back to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


async def _admin(dsn: str, *statements: str) -> list[list[tuple[Any, ...]]]:
    conn = await pg_driver.connect(dsn, timeout=10)
    try:
        return [[tuple(r) for r in await conn.fetch(sql)] for sql in statements]
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The test server's DSN; skips (fails under CI) when there is none."""
    dsn = os.environ.get(_DSN_ENV, "").strip()
    if not dsn:
        _unavailable(
            f"{_DSN_ENV} is not set, so there is no PostgreSQL server to test against; "
            f'start one with `export {_DSN_ENV}="$(bash scripts/start_postgres.sh)"`'
        )
    try:
        _run_async(lambda: _admin(dsn, "SELECT 1"))
    except Exception as exc:
        _unavailable(
            f"the PostgreSQL server at {pg_driver.redact(dsn)} ({_DSN_ENV}) is unreachable: {exc}"
        )
    return dsn


class _Schemas:
    """Fresh schema names for one test, dropped when it ends."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.names: list[str] = []
        self._counter = itertools.count()

    def new(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}_{next(self._counter)}"
        self.names.append(name)
        return name

    def drop_all(self) -> None:
        if self.names:
            drops = [f'DROP SCHEMA IF EXISTS "{n}" CASCADE' for n in self.names]
            _run_async(lambda: _admin(self.dsn, *drops))


@pytest.fixture
def schemas(pg_dsn: str) -> Iterator[_Schemas]:
    made = _Schemas(pg_dsn)
    yield made
    made.drop_all()


@pytest.fixture
def store_factory(schemas: _Schemas) -> Callable[[], Awaitable[Store]]:
    """Overrides the contract suite's fixture: fresh PostgreSQL stores only."""

    async def factory() -> Store:
        return await PostgresStore.open(schemas.dsn, schema=schemas.new(), create_schema=True)

    return factory


@pytest.fixture
async def pg_store(schemas: _Schemas) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(schemas.dsn, schema=schemas.new(), create_schema=True)
    yield store
    await store.aclose()


# --------------------------------------------------------------------------- helpers


def _compactable(session_id: str, t: int) -> Message:
    return assistant(session_id, "read it", t=t, finish="tool-calls")


def _worker_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_worker_env(),
        cwd=REPO_ROOT,
    )


async def _read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = await anyio.to_thread.run_sync(proc.stdout.readline)
    if not line:
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"worker exited early (code {proc.returncode}): {err}")
    return line.strip()


# --------------------------------------------------------------------------- R1.4 across processes

_COMMIT_WORKER = r"""
import json
import sys

import anyio

from mimo_ctx.store.postgres import PostgresStore
from tests.store.builders import boundary

dsn, schema, session_id, assistant_id, attempts, keys = sys.argv[1:7]


async def main() -> None:
    async with PostgresStore(dsn, schema=schema, max_size=10) as store:
        assistant = await store.get_message(assistant_id)
        assert assistant is not None
        print("ready", flush=True)
        sys.stdin.readline()  # the parent says go when both workers are ready
        results: list[tuple[str, bool]] = []

        async def attempt(i: int) -> None:
            key = f"usage-{i % int(keys)}"
            b = boundary(session_id, assistant_id, t=assistant.time_created + 1)
            updated = [assistant.model_copy(update={"summary": True})]
            won = await store.commit_rebuild(
                session_id, usage_key=key, boundary=b, updated=updated
            )
            results.append((key, won))

        async with anyio.create_task_group() as tg:
            for i in range(int(attempts)):
                tg.start_soon(attempt, i)
        print(json.dumps(results), flush=True)


anyio.run(main)
"""


@pytest.mark.parametrize("keys", [1, 5])
async def test_r1_4_two_processes_50_concurrent_commits_one_boundary_per_usage(
    pg_store: PostgresStore, keys: int
) -> None:
    """Two OS processes x 50 concurrent commit_rebuild calls on one session, all
    for the same usage key (or spread over five): exactly one commit per key wins,
    across processes, and only its boundary is stored (R1.4, R4)."""
    s = make_session()
    await pg_store.create_session(s)
    a = _compactable(s.id, T0)
    await pg_store.append_messages([user(s.id, "go", t=T0 - 10), a])

    procs = [
        _spawn(_COMMIT_WORKER, pg_store.dsn, pg_store.schema, s.id, a.id, "50", str(keys))
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert await _read_line(proc) == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results: list[tuple[str, bool]] = []
        for proc in procs:
            results.extend(tuple(r) for r in json.loads(await _read_line(proc)))
            assert await anyio.to_thread.run_sync(lambda p=proc: p.wait(timeout=120)) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()

    assert len(results) == 100
    winners = sorted(key for key, won in results if won)
    assert winners == [f"usage-{k}" for k in range(keys)]
    stored = await pg_store.list_messages(s.id, agent=None)
    assert sum(m.is_boundary for m in stored) == keys
    assert len(stored) == 2 + keys
    changed, _ = await pg_store.changes_since(s.id, 0)
    assert sum(m.is_boundary for m in changed) == keys
    got = await pg_store.get_message(a.id)
    assert got is not None
    assert got.summary is True


# --------------------------------------------------------------------------- change feed


async def test_changes_since_never_skips_a_write_under_concurrent_writers(
    pg_store: PostgresStore,
) -> None:
    """Writers of this session and of another one run concurrently on separate
    connections while a reader follows the feed: every write of the session shows
    up, although sequence numbers commit out of order across transactions."""
    s = make_session()
    other = make_session()
    await pg_store.create_session(s)
    await pg_store.create_session(other)
    written: list[str] = []
    seen: set[str] = set()
    done = anyio.Event()

    async def writer(w: int, session_id: str) -> None:
        for i in range(30):
            batch = [user(session_id, f"w{w}-{i}-{j}", t=T0 + i) for j in range(1 + i % 3)]
            await pg_store.append_messages(batch)
            if session_id == s.id:
                written.extend(m.id for m in batch)
                if i % 4 == 0:
                    await pg_store.update_messages([batch[0]])

    async def reader() -> None:
        seq = 0
        while True:
            finished = done.is_set()
            changed, seq = await pg_store.changes_since(s.id, seq)
            seen.update(m.id for m in changed)
            if finished:
                return
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as readers:
        readers.start_soon(reader)
        async with anyio.create_task_group() as writers:
            for w in range(6):
                writers.start_soon(writer, w, s.id if w % 2 == 0 else other.id)
        done.set()

    assert seen == set(written)
    assert len(written) == await pg_store.count_messages(s.id)


async def test_seq_is_store_wide_and_increasing(pg_store: PostgresStore) -> None:
    s = make_session()
    await pg_store.create_session(s)
    _, first = await pg_store.changes_since(s.id, 0)
    assert first == 0  # nothing written yet
    await pg_store.append_messages([user(s.id, "one", t=T0)])
    _, second = await pg_store.changes_since(s.id, first)
    assert second > first
    # An unknown session has no changes but the store's current number.
    assert await pg_store.changes_since("ses_unknown", 0) == ([], second)


async def test_r4_cancelled_commit_rebuild_is_all_or_nothing(pg_store: PostgresStore) -> None:
    """Cancelling commit_rebuild at any moment leaves the key, the boundary and
    the compaction either all written or all absent, and the pool healthy (R4)."""
    s = make_session()
    await pg_store.create_session(s)
    a = _compactable(s.id, T0)
    await pg_store.append_messages([a])
    for i in range(25):
        key = f"usage-{i}"
        b = boundary(s.id, a.id, t=T0 + 1)
        changed = a.model_copy(update={"summary": True, "model": f"m{i}"})
        with anyio.move_on_after(i * 0.0004):
            await pg_store.commit_rebuild(s.id, usage_key=key, boundary=b, updated=[changed])
        committed = await pg_store.get_message(b.id) is not None
        stored = await pg_store.get_message(a.id)
        assert stored is not None
        assert (stored.model == f"m{i}") is committed
        retry = boundary(s.id, a.id, t=T0 + 1)
        assert await pg_store.commit_rebuild(s.id, usage_key=key, boundary=retry, updated=[]) is (
            not committed
        )
        with anyio.move_on_after(i * 0.0002):
            await pg_store.changes_since(s.id, 0)
    boundaries = [m for m in await pg_store.list_messages(s.id) if m.is_boundary]
    assert len(boundaries) == 25


# --------------------------------------------------------------------------- schema versions


async def test_missing_schema_is_refused_with_the_upgrade_command(
    schemas: _Schemas,
) -> None:
    store = PostgresStore(schemas.dsn, schema=schemas.new())
    with pytest.raises(StoreError, match="mimo-ctx db upgrade"):
        await store.list_sessions()
    await store.aclose()


async def test_upgrade_creates_the_schema_idempotently_and_concurrently(
    schemas: _Schemas,
) -> None:
    name = schemas.new()
    versions: list[int] = []

    async def run() -> None:
        versions.append(await upgrade(schemas.dsn, schema=name))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(run)
    assert versions == [SCHEMA_VERSION] * 4
    assert await upgrade(schemas.dsn, schema=name) == SCHEMA_VERSION
    rows = await _admin(schemas.dsn, f'SELECT version FROM "{name}".schema_version')
    assert rows == [[(SCHEMA_VERSION,)]]
    async with PostgresStore(schemas.dsn, schema=name) as store:
        assert await store.upgrade() == SCHEMA_VERSION
        await store.create_session(make_session())
        assert len(await store.list_sessions()) == 1


async def test_version_1_schema_is_upgraded_to_the_user_messages_index(
    schemas: _Schemas,
) -> None:
    # Schema step 2 (issue 14): an index of the main history's user messages.
    name = schemas.new()
    quoted = f'"{name}"'
    await _admin(
        schemas.dsn,
        f"CREATE SCHEMA {quoted}",
        f"CREATE TABLE {quoted}.schema_version (one boolean PRIMARY KEY DEFAULT true CHECK (one),"
        " version integer NOT NULL, time_upgraded timestamptz NOT NULL DEFAULT clock_timestamp())",
        f"INSERT INTO {quoted}.schema_version (version) VALUES (1)",
        *(pg_schema.render(statement, name) for statement in pg_schema.MIGRATIONS[0]),
    )
    with pytest.raises(StoreError, match="older than"):
        await PostgresStore.open(schemas.dsn, schema=name)
    assert await upgrade(schemas.dsn, schema=name) == SCHEMA_VERSION
    rows = await _admin(
        schemas.dsn, f"SELECT indexname FROM pg_indexes WHERE schemaname = '{name}'"
    )
    assert ("messages_user",) in rows[0]
    async with PostgresStore(schemas.dsn, schema=name) as store:
        session = make_session()
        await store.create_session(session)
        await store.append_messages([user(session.id, "hello", t=T0)])
        assert len(await store.list_user_messages(session.id, last=5)) == 1


async def test_newer_schema_version_is_refused(schemas: _Schemas) -> None:
    name = schemas.new()
    await upgrade(schemas.dsn, schema=name)
    await _admin(schemas.dsn, f'UPDATE "{name}".schema_version SET version = 99')
    with pytest.raises(StoreError, match="version 99"):
        await PostgresStore.open(schemas.dsn, schema=name)
    with pytest.raises(StoreError, match="version 99"):
        await upgrade(schemas.dsn, schema=name)


async def test_foreign_schema_is_refused_and_left_unchanged(schemas: _Schemas) -> None:
    name = schemas.new()
    await _admin(
        schemas.dsn,
        f'CREATE SCHEMA "{name}"',
        f'CREATE TABLE "{name}".invoices (id int)',
    )
    with pytest.raises(StoreError, match="not a mimo_ctx store"):
        await upgrade(schemas.dsn, schema=name)
    rows = await _admin(schemas.dsn, f"SELECT tablename FROM pg_tables WHERE schemaname = '{name}'")
    assert rows == [[("invoices",)]]


async def test_bad_settings_and_unreachable_server_give_store_errors(pg_dsn: str) -> None:
    with pytest.raises(StoreError, match="schema name"):
        PostgresStore(pg_dsn, schema="Bad-Name")
    with pytest.raises(StoreError, match="pool sizes"):
        PostgresStore(pg_dsn, min_size=5, max_size=2)
    with pytest.raises(StoreError, match="command_timeout"):
        PostgresStore(pg_dsn, command_timeout=0)
    with pytest.raises(StoreError, match="schema name"):
        await upgrade(pg_dsn, schema="x;drop")
    # Port 1 on loopback: refused at once. The password never reaches the message.
    dsn = "postgresql://someone:s3cret@127.0.0.1:1/db"
    with pytest.raises(StoreError, match="cannot connect") as info:
        await PostgresStore.open(dsn)
    assert "s3cret" not in str(info.value)
    assert "***" in str(info.value)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db?password=pw&x=1", "postgresql://u@h/db?password=***&x=1"),
        ("host=h user=u password=pw dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h password='p w' dbname=d", "host=h password=*** dbname=d"),
        ("postgresql://h/db", "postgresql://h/db"),
    ],
)
def test_dsn_passwords_are_redacted_in_messages(dsn: str, expected: str) -> None:
    assert pg_driver.redact(dsn) == expected


# --------------------------------------------------------------------------- hot query plans


async def test_per_turn_queries_use_indexes(pg_store: PostgresStore) -> None:
    """The per-turn lookups are index scans, not scans of the history."""
    s = make_session()
    await pg_store.create_session(s)
    history: list[Message] = []
    for i in range(1500):
        history.append(user(s.id, f"u{i}", t=T0 + 2 * i))
        history.append(assistant(s.id, f"a{i}", t=T0 + 2 * i + 1))
    await pg_store.append_messages(history)
    await pg_store.append_messages([boundary(s.id, history[10].id, t=T0 + 21)])
    sql = pg_store._sql
    checks = [
        (sql.latest_boundary, (s.id, MAIN_AGENT)),
        (sql.latest_finished, (s.id,)),
        (sql.latest_finished_by_agent, (s.id, MAIN_AGENT)),
        (sql.changes, (s.id, 10**9)),
    ]
    async with pg_store._connection() as conn:
        await conn.execute(f'ANALYZE "{pg_store.schema}".messages')
        for statement, params in checks:
            rows = await conn.fetch(f"EXPLAIN {statement}", *params)
            plan = "\n".join(str(r[0]) for r in rows)
            assert "Index" in plan, plan
            assert "Seq Scan on messages" not in plan, plan


# --------------------------------------------------------------------------- writer lease (A3)


@pytest.fixture
async def lease(pg_store: PostgresStore) -> AsyncIterator[PostgresWriterLease]:
    leases = PostgresWriterLease(pg_store)
    yield leases
    await leases.aclose()


async def test_a3_lease_is_exclusive_under_concurrent_acquires(
    lease: PostgresWriterLease,
) -> None:
    won: list[str] = []

    async def attempt(i: int) -> None:
        if await lease.acquire("ses_x", f"worker-{i}", ttl=600):
            won.append(f"worker-{i}")

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(attempt, i)
    assert len(won) == 1
    holder = await lease.holder("ses_x")
    assert holder is not None
    assert holder.owner == won[0]
    assert 0 < holder.expires_in <= 600


async def test_a3_lease_acquire_renew_release_cycle(lease: PostgresWriterLease) -> None:
    assert await lease.holder("ses_a") is None
    assert await lease.acquire("ses_a", "alpha", ttl=600)
    first = await lease.holder("ses_a")
    assert first is not None
    # The same owner acquiring again extends its lease, same generation.
    assert await lease.acquire("ses_a", "alpha", ttl=600)
    again = await lease.holder("ses_a")
    assert again is not None
    assert again.generation == first.generation
    assert not await lease.acquire("ses_a", "beta", ttl=600)
    assert await lease.acquire("ses_b", "beta", ttl=600)  # leases are per session
    assert await lease.renew("ses_a", "alpha", ttl=600)
    assert not await lease.renew("ses_a", "beta", ttl=600)
    assert not await lease.release("ses_a", "beta")
    assert await lease.release("ses_a", "alpha")
    assert not await lease.release("ses_a", "alpha")  # already released
    assert not await lease.renew("ses_a", "alpha", ttl=600)  # a released lease is gone
    assert await lease.holder("ses_a") is None
    assert await lease.acquire("ses_a", "beta", ttl=600)
    taken = await lease.holder("ses_a")
    assert taken is not None
    assert taken.owner == "beta"
    assert taken.generation == first.generation + 1


async def test_a3_lapsed_lease_cannot_be_renewed_and_is_taken_over(
    lease: PostgresWriterLease,
) -> None:
    assert await lease.acquire("ses_a", "alpha", ttl=0.05)
    assert await lease.wait_released("ses_a", timeout=60)  # it lapses
    assert not await lease.renew("ses_a", "alpha", ttl=600)
    assert await lease.acquire("ses_a", "beta", ttl=600)
    assert not await lease.acquire("ses_a", "alpha", ttl=600)


@pytest.mark.parametrize(
    ("listen", "min_poll", "max_poll"),
    [(True, 300.0, 300.0), (False, 0.05, 0.2)],
    ids=["notify", "polling"],
)
async def test_a3_wait_released_learns_of_a_release(
    pg_store: PostgresStore, listen: bool, min_poll: float, max_poll: float
) -> None:
    """Waiters with an hour to wait on a lease that would live 600 s return as
    soon as it is released: by NOTIFY alone (their first poll would come after
    300 s), or without LISTEN by polling alone. The 60 s watchdog only turns a
    missed release into a failure instead of an hour-long hang."""
    lease = PostgresWriterLease(
        pg_store, listen=listen, min_poll_interval=min_poll, max_poll_interval=max_poll
    )
    try:
        assert await lease.wait_released("ses_a", timeout=5)  # nobody holds it
        assert await lease.acquire("ses_a", "alpha", ttl=600)
        assert not await lease.wait_released("ses_a", timeout=0.1)
        results: list[bool] = []

        async def waiter() -> None:
            results.append(await lease.wait_released("ses_a", timeout=3600))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(waiter)
                await anyio.sleep(0.2)
                assert await lease.release("ses_a", "alpha")
        assert results == [True, True, True]
    finally:
        await lease.aclose()


async def test_a3_wait_released_for_a_generation_ends_at_takeover(
    lease: PostgresWriterLease,
) -> None:
    assert await lease.acquire("ses_a", "alpha", ttl=600)
    held = await lease.holder("ses_a")
    assert held is not None
    assert await lease.release("ses_a", "alpha")
    assert await lease.acquire("ses_a", "beta", ttl=600)
    # Beta holds a newer generation: the run alpha held is over.
    assert await lease.wait_released("ses_a", timeout=0.1, generation=held.generation)
    assert not await lease.wait_released("ses_a", timeout=0.1)


async def test_a3_fenced_watermark_needs_a_live_lease(
    pg_store: PostgresStore, lease: PostgresWriterLease
) -> None:
    s = make_session()
    await pg_store.create_session(s)
    assert not await lease.set_watermark_if_held(s.id, "alpha", "msg_1")
    assert await pg_store.get_watermark(s.id) is None
    assert await lease.acquire(s.id, "alpha", ttl=600)
    assert await lease.set_watermark_if_held(s.id, "alpha", "msg_1")
    assert not await lease.set_watermark_if_held(s.id, "beta", "msg_2")
    assert await pg_store.get_watermark(s.id) == "msg_1"
    with pytest.raises(StoreError, match="ses_unknown"):
        await lease.set_watermark_if_held("ses_unknown", "alpha", "msg_3")


async def test_a3_lease_rejects_bad_ttl_and_use_after_close(pg_store: PostgresStore) -> None:
    lease = PostgresWriterLease(pg_store)
    for ttl in (0, -1, float("inf"), float("nan")):
        with pytest.raises(StoreError, match="ttl"):
            await lease.acquire("ses_a", "alpha", ttl=ttl)
    with pytest.raises(StoreError, match="poll"):
        PostgresWriterLease(pg_store, min_poll_interval=2, max_poll_interval=1)
    await lease.aclose()
    await lease.aclose()
    with pytest.raises(StoreError, match="closed"):
        await lease.acquire("ses_a", "alpha", ttl=1)
    with pytest.raises(StoreError, match="closed"):
        await lease.wait_released("ses_a", timeout=1)


_LEASE_WORKER = r"""
import sys

import anyio

from mimo_ctx.store.postgres import PostgresStore, PostgresWriterLease
from tests.store.builders import user

dsn, schema, session_id, count = sys.argv[1:5]


async def main() -> None:
    async with PostgresStore(dsn, schema=schema) as store:
        lease = PostgresWriterLease(store)
        assert await lease.acquire(session_id, "doomed-worker", ttl=3)
        for i in range(int(count)):
            await store.append_messages([user(session_id, f"written-{i}", t=1_000 + i)])
        assert await lease.renew(session_id, "doomed-worker", ttl=3)
        print("holding", flush=True)
        await anyio.sleep(3600)  # killed here, lease held, never released


anyio.run(main)
"""


async def test_a3_killed_lease_holder_is_taken_over_after_expiry_nothing_lost(
    pg_store: PostgresStore, lease: PostgresWriterLease
) -> None:
    """A worker holding the writer lease is killed (SIGKILL: no release, no
    cleanup). Another worker cannot take the lease while it lives, learns when it
    lapses, takes it and commits the rebuild; everything the dead worker had
    committed is still there."""
    s = make_session()
    await pg_store.create_session(s)
    proc = _spawn(_LEASE_WORKER, pg_store.dsn, pg_store.schema, s.id, "40")
    try:
        assert await _read_line(proc) == "holding"
        holder = await lease.holder(s.id)
        assert holder is not None
        assert holder.owner == "doomed-worker"
        if holder.expires_in > 1.0:  # still live for a while: it must be refused
            assert not await lease.acquire(s.id, "survivor", ttl=60)
        proc.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    assert await lease.wait_released(s.id, timeout=60)
    assert await lease.acquire(s.id, "survivor", ttl=60)
    taken = await lease.holder(s.id)
    assert taken is not None
    assert taken.owner == "survivor"
    assert taken.generation == holder.generation + 1

    written = await pg_store.list_messages(s.id)
    assert [p.text for m in written for p in m.parts if isinstance(p, TextPart)] == [
        f"written-{i}" for i in range(40)
    ]
    b = boundary(s.id, written[-1].id, t=written[-1].time_created + 1)
    assert await pg_store.commit_rebuild(s.id, usage_key=written[-1].id, boundary=b, updated=[])
    assert await lease.set_watermark_if_held(s.id, "survivor", written[-1].id)
    assert await lease.release(s.id, "survivor")
    assert await pg_store.count_messages(s.id) == 41
    assert await pg_store.get_watermark(s.id) == written[-1].id


async def test_upgrade_from_version_1_orders_old_rows_by_id_and_new_ones_by_write(
    schemas: _Schemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 3 adds the write order of insertions and the state column (issue 17).
    A version-1 schema upgrades in place: old rows are ranked by id (the rule they
    were written under), messages written afterwards are newer than all of them
    whatever their ids, and a session's state written before survives."""
    name = schemas.new()
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", 1)
    assert await upgrade(schemas.dsn, schema=name) == 1
    monkeypatch.undo()
    s = make_session().model_copy(update={"state": SessionState(rebuilds=3)})
    u = user(s.id, "hello", t=T0)
    a_new = assistant(s.id, "newer id, written first", t=T0 + 20)
    a_old = assistant(s.id, "older id, written second", t=T0 + 10).model_copy(
        update={"id": "msg_00000000000001aaaaaaaaaaaaaa"}
    )
    b = boundary(s.id, u.id, t=T0 + 1)
    q = f'"{name}"'
    statements = [
        f"INSERT INTO {q}.sessions (id, time_created, watermark, payload) VALUES"
        f" ('{s.id}', {s.time_created}, NULL, '{s.model_dump_json()}')"
    ]
    for m in [u, a_new, a_old, b]:
        payload = m.model_dump_json().replace("'", "''")
        statements.append(
            f"INSERT INTO {q}.messages (id, session_id, agent, role, time_created, is_boundary,"
            " is_finished_assistant, token_estimate, payload, seq) VALUES"
            f" ('{m.id}', '{s.id}', '{m.agent}', '{m.role}', {m.time_created},"
            f" {str(m.is_boundary).lower()}, {str(m.role == 'assistant').lower()}, 1,"
            f" '{payload}', nextval('{q}.message_seq'))"
        )
    await _admin(schemas.dsn, *statements)
    assert await upgrade(schemas.dsn, schema=name) == SCHEMA_VERSION
    async with PostgresStore(schemas.dsn, schema=name) as store:
        got = await store.get_session(s.id)
        assert got is not None
        assert got.state.rebuilds == 3
        latest = await store.latest_finished_assistant(s.id)
        assert latest is not None
        assert latest.id == a_new.id  # by id, as version 1 decided
        stored = {m.id: m.insert_seq or 0 for m in await store.list_messages(s.id)}
        assert sorted(stored, key=lambda i: stored[i]) == sorted(stored)
        late = assistant(s.id, "written last, oldest id", t=T0 + 30).model_copy(
            update={"id": "msg_00000000000000aaaaaaaaaaaaaa"}
        )
        await store.append_messages([late])
        assert (late.insert_seq or 0) > max(stored.values())
        newest = await store.latest_finished_assistant(s.id)
        assert newest is not None
        assert newest.id == late.id
        changed, _ = await store.changes_since(s.id, 0)
        assert {m.id: m.insert_seq for m in changed}[late.id] == late.insert_seq
