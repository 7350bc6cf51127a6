"""The SQLite store's message writes, checked by its constraints instead of lookups first.

``append_messages`` and ``upsert_messages`` no longer look every session and id
up before writing: the table's foreign key and primary key refuse a bad row,
and only a refused write looks, to say why. Pinned against the plain rule (every
session checked first, then every id), on random batches over a random stored
state: the same error (the same message) or the same rows written, nothing
written by a refused batch, and the change feed and its numbers right after it.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import anyio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import Message, TextPart
from mimo_ctx.session import Session
from mimo_ctx.store.sqlite import SQLiteStore

_SESSIONS = ("ses_a", "ses_b")
_UNKNOWN = ("ses_x", "ses_y")
_IDS = tuple(f"msg_{n:02d}" for n in range(8))

# A stored state: which ids exist, and in which session.
_stored = st.dictionaries(st.sampled_from(_IDS), st.sampled_from(_SESSIONS), max_size=5)


def _message(message_id: str, session_id: str, n: int) -> Message:
    return Message(
        id=message_id,
        session_id=session_id,
        role="user",
        time_created=1_000 + n,
        parts=[TextPart(text=f"{message_id} #{n}")],
    )


def _expected_append(stored: dict[str, str], batch: list[tuple[str, str]]) -> str | None:
    """The plain rule's error for an append (``None``: written)."""
    for session_id in {s for _, s in batch}:
        if session_id not in _SESSIONS:
            return f"append_messages: unknown session {session_id!r}; nothing written"
    existing = sorted(i for i, _ in batch if i in stored)
    if existing:
        return f"append_messages: message id {existing[0]!r} already exists; nothing written"
    return None


def _expected_upsert(stored: dict[str, str], batch: list[tuple[str, str]]) -> str | None:
    """The plain rule's error for an upsert (``None``: written)."""
    for session_id in {s for _, s in batch}:
        if session_id not in _SESSIONS:
            return f"upsert_messages: unknown session {session_id!r}; nothing written"
    for message_id, session_id in batch:
        if message_id in stored and stored[message_id] != session_id:
            return (
                f"upsert_messages: message {message_id!r} belongs to session "
                f"{stored[message_id]!r}, not {session_id!r}; nothing written"
            )
    return None


def _rows(path: Path) -> list[tuple[str, str, str, int, int]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT id, session_id, payload, seq, insert_seq FROM messages ORDER BY id"
        ).fetchall()
    finally:
        conn.close()
    return [(str(a), str(b), str(c), int(d), int(e)) for a, b, c, d, e in rows]


# Sessions named by a batch: mostly known, so that most batches reach the id checks.
_batch_session = st.sampled_from(_SESSIONS * 3 + _UNKNOWN)
_batch = st.lists(
    st.tuples(st.sampled_from(_IDS), _batch_session),
    min_size=1,
    max_size=4,
    unique_by=lambda r: r[0],
)


@settings(max_examples=80, deadline=None)
@given(stored=_stored, batch=_batch, upsert=st.booleans(), after=_batch)
# A new id inserted before the known one is refused: the error names the known one.
@example(
    stored={"msg_03": "ses_a"},
    batch=[("msg_01", "ses_a"), ("msg_03", "ses_a")],
    upsert=False,
    after=[("msg_02", "ses_a")],
)
# An unknown session wins over a known id, whatever their order in the batch.
@example(
    stored={"msg_01": "ses_a"},
    batch=[("msg_01", "ses_a"), ("msg_02", "ses_x")],
    upsert=False,
    after=[("msg_02", "ses_b")],
)
@example(
    stored={"msg_01": "ses_a"},
    batch=[("msg_01", "ses_b"), ("msg_02", "ses_x")],
    upsert=True,
    after=[("msg_01", "ses_a")],
)
@example(
    stored={"msg_01": "ses_a"},
    batch=[("msg_02", "ses_b"), ("msg_01", "ses_b")],
    upsert=True,
    after=[("msg_03", "ses_b")],
)
def test_message_writes_refuse_and_accept_as_the_plain_checks_do(
    stored: dict[str, str], batch: list[tuple[str, str]], upsert: bool, after: list[tuple[str, str]]
) -> None:
    after = [(i, s if s in _SESSIONS else _SESSIONS[0]) for i, s in after]

    async def run(path: Path) -> None:
        async with SQLiteStore(path) as store:
            for session_id in _SESSIONS:
                await store.create_session(Session(id=session_id, time_created=1))
            for n, (message_id, session_id) in enumerate(sorted(stored.items())):
                await store.append_messages([_message(message_id, session_id, n)])
            _, seq = await store.changes_since(_SESSIONS[0], 0)
            before = _rows(path)
            messages = [_message(i, s, 100 + n) for n, (i, s) in enumerate(batch)]
            expected = (_expected_upsert if upsert else _expected_append)(stored, batch)
            error: str | None = None
            try:
                if upsert:
                    await store.upsert_messages(messages)
                else:
                    await store.append_messages(messages)
            except StoreError as exc:
                error = str(exc)
            assert error == expected
            if error is not None:
                assert _rows(path) == before  # nothing written
                written: dict[str, str] = dict(stored)
            else:
                rows = {r[0]: r for r in _rows(path)}
                for n, message in enumerate(messages):
                    assert rows[message.id][1] == message.session_id
                    assert rows[message.id][3] == seq + 1 + n  # consecutive numbers
                written = {**stored, **dict(batch)}
            # The next write and the feed after it are right either way.
            kept = [(i, s) for i, s in after if written.get(i, s) == s]
            if kept:
                await store.upsert_messages(
                    [_message(i, s, 200 + n) for n, (i, s) in enumerate(kept)]
                )
            for session_id in _SESSIONS:
                changed, current = await store.changes_since(session_id, 0)
                assert sorted(m.id for m in changed) == sorted(
                    i for i, s in {**written, **dict(kept)}.items() if s == session_id
                )
                file = [r for r in _rows(path) if r[1] == session_id]
                assert current == max((r[3] for r in _rows(path)), default=0)
                assert {m.id: m.insert_seq for m in changed} == {r[0]: r[4] for r in file}

    with tempfile.TemporaryDirectory() as directory:
        anyio.run(run, Path(directory) / "store.db")
