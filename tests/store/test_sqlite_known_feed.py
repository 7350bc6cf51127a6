"""The SQLite change feed after the store's own writes, answered without the worker thread.

:meth:`SQLiteStore.changes_since` answers from what the store itself wrote when
the connection's ``data_version`` says nobody else has committed since
(see :mod:`mimo_ctx.store._sqlite_feed`). Pinned against the feed as the file
holds it (a plain ``sqlite3`` query) after random interleavings of this store's
writes -- appends, updates, upserts, rebuild commits, host-history commits,
rejected writes -- with writes of a second store on the same file and of another
OS process, at random earlier positions.
"""

from __future__ import annotations

import sqlite3
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import CheckpointPart, Message, Role, TextPart
from mimo_ctx.session import Session
from mimo_ctx.store import _sqlite_base
from mimo_ctx.store.base import HostNode
from mimo_ctx.store.sqlite import SQLiteStore

_REPO = Path(__file__).resolve().parents[2]


def _message(session_id: str, n: int, text: str = "", *, role: Role = "user") -> Message:
    return Message(
        session_id=session_id,
        role=role,
        time_created=1_000 + n,
        parts=[TextPart(text=text or f"message {n}")],
    )


def _file_feed(path: Path, session_id: str, seq: int) -> tuple[list[tuple[str, str, int]], int]:
    """The feed as the file holds it: (id, payload, insert_seq) after ``seq``, and the counter."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT id, payload, insert_seq FROM messages WHERE session_id = ? AND seq > ?"
            " ORDER BY seq",
            (session_id, seq),
        ).fetchall()
        current = conn.execute("SELECT value FROM counters WHERE name = 'seq'").fetchone()[0]
    finally:
        conn.close()
    return [(str(i), str(p), int(n)) for i, p, n in rows], int(current)


async def _check(store: SQLiteStore, path: Path, session_id: str, seq: int) -> int:
    changed, current = await store.changes_since(session_id, seq)
    expected, head = _file_feed(path, session_id, seq)
    assert current == head
    assert [m.id for m in changed] == [i for i, _, _ in expected]
    for message, (_, payload, insert_seq) in zip(changed, expected, strict=True):
        assert message.model_dump() == Message.model_validate_json(payload).model_dump()
        assert message.insert_seq == insert_seq
    return current


_OPS = st.lists(
    st.sampled_from(
        [
            "append",
            "append2",
            "update",
            "upsert_new",
            "upsert_old",
            "rebuild",
            "host",
            "host_conflict",
            "rejected",
            "other_append",
            "other_update",
            "other_session",
            "session_write",
            "check",
            "check_old",
        ]
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS, picks=st.randoms(use_true_random=False))
async def test_changes_since_equals_the_file_after_any_interleaving(
    tmp_path_factory: Any, ops: list[str], picks: Any
) -> None:
    path = tmp_path_factory.mktemp("feed") / "s.db"
    async with SQLiteStore(path) as store, SQLiteStore(path) as other:
        session = Session(time_created=0)
        second = Session(time_created=0)
        await store.create_session(session)
        await store.create_session(second)
        sid = session.id
        mine: list[Message] = []
        seen = [0]
        for n, op in enumerate(ops, 1):
            if op in ("append", "append2"):
                batch = [_message(sid, n)] + ([_message(sid, n + 1000)] if op == "append2" else [])
                await store.append_messages(batch)
                mine.extend(batch)
            elif op == "update" and mine:
                old = picks.choice(mine)
                new = old.model_copy(update={"parts": [TextPart(text=f"updated {n}")]})
                await store.update_messages([new])
                mine = [new if m.id == old.id else m for m in mine]
            elif op == "upsert_new":
                message = _message(sid, n, role="assistant")
                await store.upsert_messages([message])
                mine.append(message)
            elif op == "upsert_old" and mine:
                old = picks.choice(mine)
                new = old.model_copy(update={"parts": [TextPart(text=f"upserted {n}")]})
                await store.upsert_messages([new])
                mine = [new if m.id == old.id else m for m in mine]
            elif op == "rebuild" and mine:
                boundary = Message(
                    session_id=sid,
                    role="user",
                    time_created=1_000 + n,
                    parts=[CheckpointPart(covered_up_to=mine[-1].id)],
                )
                updated = [mine[0].model_copy(update={"parts": [TextPart(text=f"cut {n}")]})]
                await store.commit_rebuild(
                    sid, usage_key=f"k{n}", boundary=boundary, updated=updated
                )
                mine = [updated[0], *mine[1:], boundary]
            elif op == "host":
                message = _message(sid, n, role="assistant")
                node = HostNode(
                    chain=f"c{n}",
                    parent="",
                    fingerprint=f"f{n}",
                    depth=1,
                    message_ids=[message.id],
                    seq=0,
                )
                await store.commit_host_history(sid, agent="main", nodes=[node], messages=[message])
            elif op == "host_conflict":
                # The chain exists after a "host": rolled back after taking numbers.
                node = HostNode(chain="c-once", parent="", fingerprint="f", depth=1, seq=0)
                await store.commit_host_history(sid, agent="main", nodes=[node])
            elif op == "rejected" and mine:
                try:
                    await store.append_messages([mine[0]])  # the id exists: nothing written
                except StoreError:
                    pass
                else:
                    raise AssertionError("a repeated id was accepted")
            elif op == "other_append":
                await other.append_messages([_message(sid, n, "from the other store")])
            elif op == "other_update" and mine:
                old = picks.choice(mine)
                await other.update_messages(
                    [old.model_copy(update={"parts": [TextPart(text=f"other {n}")]})]
                )
            elif op == "other_session":
                await other.append_messages([_message(second.id, n)])
            elif op == "session_write":
                await store.set_watermark(sid, mine[-1].id if mine else "msg_none")
            elif op == "check_old":
                seen.append(await _check(store, path, sid, picks.choice(seen)))
            else:
                seen.append(await _check(store, path, sid, seen[-1]))
        await _check(store, path, sid, seen[-1])
        await _check(store, path, second.id, 0)


def _counting(store: SQLiteStore) -> list[str]:
    """Count the store's calls of its connection (on its thread or, for writes, inline)."""
    calls: list[str] = []

    def counting(run: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(fn: Callable[[sqlite3.Connection], Any]) -> Any:
            calls.append(fn.__qualname__)
            return await run(fn)

        return counted

    store._run = counting(store._run)  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    store._run_write = counting(store._run_write)  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    # Message writes come in after their own checks (one cancellation check per write).
    store._write_checked = counting(store._write_checked)  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    return calls


async def test_the_feed_after_own_writes_needs_no_worker_call(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = Session(time_created=0)
        await store.create_session(session)
        _, seq = await store.changes_since(session.id, 0)
        calls = _counting(store)
        for n in range(5):
            message = _message(session.id, n)
            await store.append_messages([message])
            await store.upsert_messages([message.model_copy(update={"role": "assistant"})])
            changed, seq = await store.changes_since(session.id, seq)
            assert [m.id for m in changed] == [message.id]
            assert changed[0].role == "assistant"
        assert [c for c in calls if "changes_since" in c] == []
        assert len(calls) == 10  # the writes only


async def test_a_write_by_another_process_is_seen_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        session = Session(time_created=0)
        await store.create_session(session)
        _, seq = await store.changes_since(session.id, 0)
        mine = _message(session.id, 1)
        await store.append_messages([mine])
        script = textwrap.dedent(
            f"""
            import anyio
            from mimo_ctx.messages import Message, TextPart
            from mimo_ctx.store.sqlite import SQLiteStore

            async def main() -> None:
                async with SQLiteStore({str(path)!r}) as store:
                    await store.append_messages([Message(
                        session_id={session.id!r}, role="user", time_created=5_000,
                        parts=[TextPart(text="from another process")])])

            anyio.run(main)
            """
        )
        with anyio.fail_after(60):
            await anyio.run_process([sys.executable, "-c", script], cwd=_REPO)
        changed, current = await store.changes_since(session.id, seq)
        assert changed[0].id == mine.id
        assert [t.text for m in changed[1:] for t in m.parts if isinstance(t, TextPart)] == [
            "from another process"
        ]
        assert (changed, current) == await store.changes_since(session.id, seq)
        assert _file_feed(path, session.id, seq)[1] == current


async def test_a_version_that_cannot_be_read_in_a_write_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        session = Session(time_created=0)
        await store.create_session(session)
        # Nothing read yet: the first write reads the version inside its transaction.
        refused: list[sqlite3.Connection] = []

        def unreadable(conn: sqlite3.Connection) -> int | None:
            refused.append(conn)
            return None  # what data_version answers when SQLite refuses it

        monkeypatch.setattr(_sqlite_base, "data_version", unreadable)
        message = _message(session.id, 1)
        await store.append_messages([message])  # committed: no error for the caller
        monkeypatch.undo()
        assert refused
        calls = _counting(store)
        changed, current = await store.changes_since(session.id, 0)
        assert [m.id for m in changed] == [message.id]
        assert _file_feed(path, session.id, 0)[1] == current
        assert [c for c in calls if "changes_since" in c]  # not known: read from the file


async def test_own_writes_read_no_version_and_no_counter_after_their_commit(
    tmp_path: Path,
) -> None:
    # The connection's data_version is unchanged by its own commits: a write after
    # the feed is known runs its four statements and nothing else.
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = Session(time_created=0)
        await store.create_session(session)
        _, seq = await store.changes_since(session.id, 0)
        statements: list[str] = []
        conn = store._conn  # pyright: ignore[reportPrivateUsage]
        assert conn is not None
        conn.set_trace_callback(statements.append)
        for n in range(3):
            await store.append_messages([_message(session.id, n)])
            changed, seq = await store.changes_since(session.id, seq)
            assert len(changed) == 1
        conn.set_trace_callback(None)
        kinds = [s.split()[0] for s in statements]
        # Each write: BEGIN, the counter's UPDATE ... RETURNING, the INSERT, COMMIT;
        # each feed check: the one data_version of changes_known.
        assert kinds == ["BEGIN", "UPDATE", "INSERT", "COMMIT", "PRAGMA"] * 3
        assert statements[4] == "PRAGMA data_version"
