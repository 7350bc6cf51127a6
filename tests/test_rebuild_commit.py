"""The commit side of a rebuild against the full recompute it replaces (issue 18).

Micro-compaction marks old tool results and the store writes the marked copies in
the rebuild's transaction. The fast paths (estimates derived from the source's,
rows whose content alone changed written in one statement) must leave exactly
what the straightforward version leaves: every marked copy serialised and
estimated from scratch, every column of its row rewritten. Sessions are drawn at
random (seeded) and checked on every store: the in-memory one, SQLite, and
PostgreSQL when a test server is configured.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from strategies import messages as arbitrary_messages

from mimo_ctx._marks import marked_from, row_version, set_marked_from, set_row_version
from mimo_ctx.compaction import build_boundary_message, micro_compact
from mimo_ctx.errors import StoreError
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import (
    Message,
    Part,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolTime,
    part_units,
    set_part_units,
    stored_part_units,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import InMemoryStore, Session, SQLiteStore, Store, _sqlite_base
from mimo_ctx.store._sqlite_base import compaction_edit, message_json, message_payload, message_row
from mimo_ctx.tokens import (
    UNSERIALISABLE_PART_TOKENS,
    estimate_message_tokens,
    estimate_part_tokens,
    estimate_text_tokens,
    js_json,
    json_units,
)
from mimo_ctx.triggers import ModelLimits
from mimo_ctx.view import COMPACTED_PLACEHOLDER

# Text that JSON escapes, that UTF-16 counts twice, and plain words.
_PIECES = (
    "def f(x):\n    return x\n",
    'a "quoted" \\ path\\to\\file',
    "tab\there\r\n",
    "\x01\x1f control",
    "中文的输出",
    "emoji 😀🚀 and more",
    "plain words of a tool result",
    "",
)
_TOOLS = ("read", "Read", "bash", "grep", "todowrite", "mcp__x__get", "edit")


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 12)))


def _time(rng: random.Random, base: int) -> ToolTime:
    return ToolTime(
        start=base if rng.random() < 0.8 else None,
        end=base + 3 if rng.random() < 0.7 else None,
        compacted=base + 9 if rng.random() < 0.15 else None,
        placeholder=_text(rng) or None if rng.random() < 0.1 else None,
    )


def _tool_part(rng: random.Random, index: int, base: int) -> ToolPart:
    if rng.random() < 0.15:
        state: Any = ToolStateError(input={"i": index}, error=_text(rng), time=_time(rng, base))
    else:
        state = ToolStateCompleted(
            input={"path": _text(rng), "n": index, "deep": {"k": [1, 2.5, None, True]}},
            output=_text(rng),
            title=_text(rng) or None,
            metadata={"m": _text(rng)} if rng.random() < 0.3 else {},
            time=_time(rng, base),
        )
    return ToolPart(call_id=f"call_{index}", tool=rng.choice(_TOOLS), state=state)


def _session_messages(rng: random.Random, session_id: str, count: int) -> list[Message]:
    """A history of user turns, tool rounds (call and result in one message, or a
    separate ``tool`` message) and a sub-agent's rounds."""
    messages: list[Message] = []
    for index in range(count):
        base = 1_000_000 + index * 10
        agent = "main" if rng.random() < 0.8 else "explore"
        kind = rng.random()
        parts: list[Part]
        if kind < 0.2:
            role = "user"
            parts = [TextPart(text=_text(rng) or "hi")]
        elif kind < 0.4:
            role = "tool"
            parts = [
                ToolResultPart(
                    call_id=f"call_{index}_{n}",
                    tool=rng.choice(_TOOLS),
                    output=_text(rng),
                    is_error=rng.random() < 0.1,
                    time=_time(rng, base),
                )
                for n in range(rng.randint(1, 3))
            ]
        else:
            role = "assistant"
            parts = [TextPart(text=_text(rng))] if rng.random() < 0.7 else []
            parts += [_tool_part(rng, index * 10 + n, base) for n in range(rng.randint(0, 3))]
        messages.append(
            Message(
                id=f"msg_{index:05d}",
                session_id=session_id,
                role=role,
                agent=agent,
                time_created=base,
                finish="tool-calls" if role == "assistant" else None,
                parts=parts,
            )
        )
    return messages


def _compact(rng: random.Random, messages: list[Message], now: int) -> list[Message]:
    return micro_compact(
        messages,
        after_time=messages[rng.randrange(len(messages) // 2)].time_created,
        tools=rng.choice([("*",), ("read", "bash", "grep"), ("mcp__*", "edit")]),
        exclude=rng.choice([(), ("todowrite",), ("read",)]),
        keep=rng.choice([0, 0, 1, 3]),
        now_ms=now,
        placeholder=rng.choice([None, COMPACTED_PLACEHOLDER, "[cleared — 已清除 😀]", 'q"\n']),
        skip_ids={messages[-1].id},
    )


def _fresh(message: Message) -> Message:
    """The message parsed anew from its JSON: no cached estimate, nothing shared."""
    return Message.model_validate_json(message.model_dump_json())


StoreOpener = Callable[[], Awaitable[Store]]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreOpener]:
    """Opens the same store again (a new instance on the same data) on each call."""
    kind = str(request.param)
    opened: list[Store] = []
    if kind == "memory":
        shared = InMemoryStore()

        async def memory() -> Store:
            return shared

        yield memory
        await shared.aclose()
        return
    if kind == "sqlite":

        async def sqlite_file() -> Store:
            store = await SQLiteStore.open(tmp_path / "commit.db")
            opened.append(store)
            return store

        yield sqlite_file
    else:
        from mimo_ctx.store.postgres import PostgresStore
        from tests.pg_support import SchemaNames, require_pg_dsn

        names = SchemaNames(require_pg_dsn())
        schema = names.new()

        async def postgres() -> Store:
            store = await PostgresStore.open(names.dsn, schema=schema, create_schema=True)
            opened.append(store)
            return store

        try:
            yield postgres
        finally:
            for store in opened:
                await store.aclose()
            names.drop_all()
        return
    for store in opened:
        await store.aclose()


@pytest.mark.parametrize("seed", range(6))
async def test_a_committed_rebuild_stores_what_the_full_recompute_stores(
    opener: StoreOpener, seed: int
) -> None:
    rng = random.Random(seed)
    writer = await opener()
    session = Session(id=f"ses_{seed}", project_id="p", time_created=0)
    await writer.create_session(session)
    history = _session_messages(rng, session.id, rng.randint(8, 60))
    for message in history:
        estimate_message_tokens(message)  # as the window does: the lengths are known
    await writer.append_messages(history)
    # Listed by another instance: the estimates come from the rows, not the objects.
    reader = await opener()
    listed = await reader.list_messages(session.id, agent=None)
    now = 2_000_000 + seed
    compacted = _compact(rng, listed, now)
    reference = [_fresh(m) for m in compacted]
    assert [estimate_message_tokens(m) for m in compacted] == [
        estimate_message_tokens(m) for m in reference
    ]
    # Derived, not recomputed: the listed messages carried their part lengths.
    assert all(part_units(m) == tuple(json_units(p) for p in m.parts) for m in compacted)
    _, before = await reader.changes_since(session.id, 0)
    if isinstance(reader, SQLiteStore):
        # Each copy is written as an edit of its row (nothing serialised): what is
        # read back below must still be the full recompute, byte for byte.
        assert all(compaction_edit(m) is not None for m in compacted)
        reader._update_contents = _refuse  # type: ignore[method-assign]
    boundary = await _commit(reader, listed, compacted)
    # What another instance reads back: every message as the full recompute wrote it.
    fresh = await opener()
    changed, _ = await fresh.changes_since(session.id, before)
    assert [m.id for m in changed] == [boundary.id, *(m.id for m in compacted)]
    by_id = {m.id: m for m in changed}
    for expected in reference:
        got = by_id[expected.id]
        assert got.model_dump_json() == expected.model_dump_json()
        assert estimate_message_tokens(got) == estimate_message_tokens(expected)
        assert part_units(got) == tuple(json_units(p) for p in got.parts)
    original = {m.id: m for m in history}
    for got in await fresh.list_messages(session.id, agent=None):
        if got.id != boundary.id:
            want = next((r for r in reference if r.id == got.id), original[got.id])
            assert got.model_dump_json() == want.model_dump_json()
            assert got.insert_seq == original[got.id].insert_seq
    if isinstance(fresh, SQLiteStore):
        _assert_rows(fresh, reference)


async def _stored_and_compacted(
    store: Store, session: Session, seed: int, *, count: int = 30
) -> tuple[list[Message], list[Message]]:
    """A random session stored and listed back, and every result of it cleared but the last
    message's: the listing and the compacted copies."""
    await store.create_session(session)
    await store.append_messages(_session_messages(random.Random(seed), session.id, count))
    listed = await store.list_messages(session.id, agent=None)
    compacted = micro_compact(
        listed, after_time=0, tools=("*",), now_ms=5_000_000, skip_ids={listed[-1].id}
    )
    return listed, compacted


def _refuse(*args: object) -> list[int]:
    raise AssertionError("the copies were serialised and written in full")


async def _commit(
    store: Store, listed: list[Message], compacted: list[Message], *, body: str = "body"
) -> Message:
    """Commit a rebuild of the listed session with these compacted copies; its boundary."""
    boundary = build_boundary_message(
        watermark=listed[0],
        digest_up_to=None,
        directory="memory",
        number=1,
        index_text="## Checkpoint",
        body=body,
        actors_text="## Active Actors\n(none)",
        newer_than=max(m.id for m in listed),
    )
    session_id = listed[0].session_id
    assert await store.commit_rebuild(
        session_id, usage_key="usage", boundary=boundary, updated=compacted
    )
    return boundary


def _assert_rows(store: SQLiteStore, reference: list[Message]) -> None:
    """Every column of each compacted row, as :func:`message_row` writes it."""
    with sqlite3.connect(store.path) as conn:
        for expected in reference:
            row = conn.execute(
                "SELECT id, session_id, agent, role, time_created, is_boundary,"
                " is_finished_assistant, token_estimate, payload, off_branch, part_units"
                " FROM messages WHERE id = ?",
                (expected.id,),
            ).fetchone()
            assert tuple(row) == message_row(expected)


async def test_a_row_another_writer_changed_is_rewritten_whole(tmp_path: Path) -> None:
    """A row that no longer agrees with the copy (another process updated the
    message after the listing) gets every column of the copy, as before."""
    path = tmp_path / "s.db"
    rng = random.Random(99)
    async with await SQLiteStore.open(path) as store:
        session = Session(id="ses_w", project_id="p", time_created=0)
        await store.create_session(session)
        history = _session_messages(rng, session.id, 40)
        await store.append_messages(history)
        listed = await store.list_messages(session.id, agent=None)
        compacted = micro_compact(
            listed, after_time=0, tools=("*",), now_ms=5_000_000, skip_ids={listed[-1].id}
        )
        assert compacted
        target = compacted[0]
        async with await SQLiteStore.open(path) as other:
            await other.update_messages(
                [target.model_copy(update={"time_created": target.time_created + 1})]
            )
        boundary = await _commit(store, listed, compacted)
        _assert_rows(store, [_fresh(m) for m in compacted])
        _, current = await store.changes_since(session.id, 0)
        # The boundary and each copy took one number each, and only those.
        written = [boundary.id, *(m.id for m in compacted)]
        marks = ",".join("?" * len(written))
        with sqlite3.connect(path) as conn:
            rows = conn.execute(f"SELECT seq FROM messages WHERE id IN ({marks})", written)
            seqs = sorted(r[0] for r in rows)
        assert seqs == list(range(current - len(compacted), current + 1))


async def test_a_row_changed_in_place_since_the_listing_is_rewritten_whole(
    tmp_path: Path,
) -> None:
    """Another process changed a result's output after the listing, every other
    column the same: the copy, made from the version listed, is written in full
    (the edit of the row applies only to that version, so the other process's
    output is not kept under the copy's estimate)."""
    path = tmp_path / "s.db"
    async with await SQLiteStore.open(path) as store:
        session = Session(id="ses_i", project_id="p", time_created=0)
        listed, compacted = await _stored_and_compacted(store, session, 5, count=40)
        target = compacted[0]
        source = next(m for m in listed if m.id == target.id)
        index = next(i for i, p in enumerate(source.parts) if p is not target.parts[i])
        part = source.parts[index]
        changed: Part
        if isinstance(part, ToolPart):
            assert isinstance(part.state, ToolStateCompleted)
            state = part.state.model_copy(update={"output": "rewritten elsewhere"})
            changed = part.model_copy(update={"state": state})
        else:
            assert isinstance(part, ToolResultPart)
            changed = part.model_copy(update={"output": "rewritten elsewhere"})
        parts = list(source.parts)
        parts[index] = changed
        async with await SQLiteStore.open(path) as other:
            await other.update_messages([source.model_copy(update={"parts": parts})])
        await _commit(store, listed, compacted)
        _assert_rows(store, [_fresh(m) for m in compacted])


async def test_a_row_the_json_edit_refuses_is_rewritten_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When SQLite's JSON functions refuse an edit (here: a path they cannot
    read), the batch is written in full, with one number per row and no more."""
    edit = _sqlite_base._sql_mark_results  # pyright: ignore[reportPrivateUsage]

    def refused(marks: int) -> str:
        return edit(marks).replace("json_set(payload, ", "json_set(payload, 'no path', 0, ")

    monkeypatch.setattr(_sqlite_base, "_sql_mark_results", refused)
    path = tmp_path / "s.db"
    async with await SQLiteStore.open(path) as store:
        session = Session(id="ses_r", project_id="p", time_created=0)
        listed, compacted = await _stored_and_compacted(store, session, 6)
        assert compacted
        assert all(compaction_edit(m) is not None for m in compacted)
        _, before = await store.changes_since(session.id, 0)
        await _commit(store, listed, compacted)
        _assert_rows(store, [_fresh(m) for m in compacted])
        _, current = await store.changes_since(session.id, 0)
        assert current == before + 1 + len(compacted)


@pytest.mark.parametrize("seed", range(40))
def test_a_compacted_copy_is_estimated_as_its_recomputed_json(seed: int) -> None:
    """The derived estimate and part lengths of each copy against the copy's own JSON."""
    rng = random.Random(1000 + seed)
    messages = _session_messages(rng, "ses_x", rng.randint(4, 30))
    for message in messages:
        if rng.random() < 0.8:  # the rest: lengths unknown (rows written before)
            estimate_message_tokens(message)
    compacted = _compact(rng, messages, 3_000_000 + rng.randrange(10**9))
    source = {m.id: m for m in messages}
    for copy in compacted:
        expected = _fresh(copy)
        if part_units(source[copy.id]) is not None:
            assert part_units(copy) == tuple(json_units(p) for p in expected.parts)
        assert estimate_message_tokens(copy) == estimate_message_tokens(expected)
        assert estimate_message_tokens(copy) == sum(estimate_part_tokens(p) for p in copy.parts)


def test_an_unserialisable_result_counts_as_one_once_compacted() -> None:
    """A result whose JSON fails (bytes that are not UTF-8 in its input) stays at the A2 count."""
    part = ToolPart(
        call_id="c",
        tool="read",
        state=ToolStateCompleted(input={"x": b"\xff"}, output="out", time=ToolTime(start=1)),
    )
    message = Message(session_id="s", role="assistant", time_created=5, parts=[part])
    estimate_message_tokens(message)
    assert part_units(message) == (None,)
    (copy,) = micro_compact([message], after_time=0, tools=("*",), now_ms=9)
    assert part_units(copy) == (None,)
    assert estimate_message_tokens(copy) == UNSERIALISABLE_PART_TOKENS
    fresh = copy.model_copy(update={"parts": list(copy.parts)})
    assert estimate_message_tokens(fresh) == UNSERIALISABLE_PART_TOKENS


@pytest.mark.parametrize(
    "units", [(), (12,), (None,), (3, None, 1910), (0, 0)], ids=["none", "one", "x", "mix", "zero"]
)
def test_stored_part_units_read_back_as_written(units: tuple[int | None, ...]) -> None:
    message = Message(session_id="s", role="user", time_created=1)
    set_part_units(message, units)
    text = stored_part_units(message)
    assert text is not None
    loaded = Message(session_id="s", role="user", time_created=1)
    set_part_units(loaded, text)
    assert part_units(loaded) == units
    assert stored_part_units(loaded) == text
    odd = Message(session_id="s", role="user", time_created=1)
    set_part_units(odd, "1,,two")
    assert part_units(odd) is None


async def test_rows_written_before_the_part_lengths_are_recomputed(tmp_path: Path) -> None:
    """A row without part lengths (written before schema version 5): the copy's
    estimate is computed from its JSON, and written with its lengths."""
    path = tmp_path / "old.db"
    rng = random.Random(5)
    async with await SQLiteStore.open(path) as store:
        session = Session(id="ses_old", project_id="p", time_created=0)
        await store.create_session(session)
        await store.append_messages(_session_messages(rng, session.id, 30))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE messages SET part_units = NULL")
    async with await SQLiteStore.open(path) as store:
        listed = await store.list_messages(session.id, agent=None)
        assert all(part_units(m) is None for m in listed)
        compacted = micro_compact(listed, after_time=0, tools=("*",), now_ms=7_000_000)
        assert compacted
        await _commit(store, listed, compacted)
        _assert_rows(store, [_fresh(m) for m in compacted])
    async with await SQLiteStore.open(path) as store:
        for message in await store.list_messages(session.id, agent=None):
            if any(message.id == m.id for m in compacted):
                assert part_units(message) == tuple(json_units(p) for p in message.parts)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_the_view_after_a_rebuild_is_the_full_recompute(
    tmp_path: Path, kind: str, seed: int
) -> None:
    """What the middleware sends after a rebuild (its live window took the compacted
    copies with their derived estimates) against every message estimated from its
    JSON, and against a fresh middleware reading the stored rows."""
    rng = random.Random(500 + seed)
    root = tmp_path / "memory"
    path = tmp_path / "v.db"
    store: Store = InMemoryStore() if kind == "memory" else await SQLiteStore.open(path)
    async with ContextMiddleware(store, root, model=ModelLimits(1_000_000)) as mw:
        session = await mw.open_session(system="the system prompt")
        history = _session_messages(rng, session.id, rng.randint(30, 70))
        await mw.append(history)
        main = [m for m in history if m.agent == "main"]
        await store.set_watermark(session.id, main[len(main) // 3].id)
        checkpoint = MemoryLayout(root).checkpoint_path(session.id)
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_text("Topic: the commit side\n\n## Active intent\n- check it\n")
        await mw.prepare(session.id)  # a live session: its window is loaded
        report = await mw.rebuild(session.id, manual=True)
        assert report.outcome == "rebuilt"
        assert report.compacted_results > 0
        view = await mw.prepare(session.id)
    prefix = estimate_text_tokens(view.prefix.system) + estimate_text_tokens(
        js_json(view.prefix.tools)
    )
    assert view.tokens == prefix + sum(estimate_message_tokens(_fresh(m)) for m in view.messages)
    if isinstance(store, SQLiteStore):
        await store.aclose()
        store = await SQLiteStore.open(path)
    async with ContextMiddleware(store, root, model=ModelLimits(1_000_000)) as fresh:
        again = await fresh.prepare(session.id)
    assert [_sent(m) for m in again.messages] == [_sent(m) for m in view.messages]
    assert again.tokens == view.tokens
    await store.aclose()


def _sent(message: Message) -> str:
    """A sent message's JSON, the per-turn reminder's part id (new in each process) left out."""
    parts = [
        p.model_copy(update={"id": "reminder"})
        if isinstance(p, TextPart) and p.synthetic and p.text.startswith("<system-reminder")
        else p
        for p in message.parts
    ]
    return message.model_copy(update={"parts": parts}).model_dump_json()


def test_a_mark_grows_a_time_object_by_what_its_shape_says() -> None:
    """micro_compact measures a mark's growth once per shape of ``time``: whether
    another field is set (start or end) and the old placeholder. A field added to
    ToolTime must be part of that shape."""
    assert set(ToolTime.model_fields) == {"start", "end", "compacted", "placeholder"}


def test_a_changed_copy_is_no_longer_the_row_it_was_read_as() -> None:
    """A copy that changes anything drops the row version and the marks; a copy
    without changes (the same JSON) keeps both."""
    message = _session_messages(random.Random(7), "ses_v", 1)[0]
    set_row_version(message, 41)
    assert row_version(message.model_copy()) == 41
    copy = message.model_copy(update={"time_created": 5})
    assert row_version(copy) is None
    set_marked_from(copy, message, [2, 0])
    assert marked_from(copy) == (41, (0, 2))
    assert marked_from(copy.model_copy()) == (41, (0, 2))
    again = copy.model_copy(update={"parts": []})
    assert marked_from(again) is None
    assert row_version(again) is None
    unread = message.model_copy(update={"agent": "explore"})
    set_marked_from(unread, unread, [0])  # its source's version unknown: nothing recorded
    assert marked_from(unread) is None


async def test_an_edit_failing_otherwise_fails_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a refusal of SQLite's JSON functions falls back to the full rewrite: any
    other error of the edit (here: a table that is not there) fails the commit,
    and nothing of it is stored."""
    edit = _sqlite_base._sql_mark_results  # pyright: ignore[reportPrivateUsage]

    def broken(marks: int) -> str:
        return edit(marks).replace("UPDATE messages", "UPDATE no_such_table")

    monkeypatch.setattr(_sqlite_base, "_sql_mark_results", broken)
    async with await SQLiteStore.open(tmp_path / "s.db") as store:
        session = Session(id="ses_f", project_id="p", time_created=0)
        listed, compacted = await _stored_and_compacted(store, session, 8)
        assert compacted
        with pytest.raises(StoreError, match="no_such_table"):
            await _commit(store, listed, compacted)
        stored = await store.list_messages(session.id, agent=None)
        assert [m.model_dump_json() for m in stored] == [m.model_dump_json() for m in listed]


@pytest.mark.parametrize("seed", range(30))
def test_a_marked_result_is_the_generic_copy_of_its_part(seed: int) -> None:
    """Each cleared result, made in one step per nested model, is what the generic
    ``model_copy`` chain makes: the same fields, the same fields set, nothing private,
    and every part not cleared is the source's own object."""
    rng = random.Random(2000 + seed)
    messages = _session_messages(rng, "ses_m", rng.randint(4, 30))
    # Results whose times were never given (defaults, not in the fields set).
    bare: list[Part] = [
        ToolResultPart(call_id="bare_r", tool="read", output="out"),
        ToolPart(call_id="bare_c", tool="bash", state=ToolStateCompleted(input={}, output="o")),
    ]
    messages += [
        Message(
            id=f"msg_bare_{i}", session_id="ses_m", role=role, time_created=9_999 + i, parts=[p]
        )
        for i, (role, p) in enumerate(zip(("tool", "assistant"), bare, strict=True))
    ]
    now = 4_000_000 + seed
    placeholder = rng.choice([None, COMPACTED_PLACEHOLDER, "[gone]"])
    compacted = micro_compact(
        messages, after_time=0, tools=("*",), now_ms=now, placeholder=placeholder
    )
    stored = None if placeholder in (None, COMPACTED_PLACEHOLDER) else placeholder
    source = {m.id: m for m in messages}
    for copy in compacted:
        for before, after in zip(source[copy.id].parts, copy.parts, strict=True):
            if after is before:
                continue
            if isinstance(before, ToolPart):
                assert isinstance(before.state, ToolStateCompleted)
                time = before.state.time.model_copy(
                    update={"compacted": now, "placeholder": stored}
                )
                state = before.state.model_copy(update={"time": time})
                want: Part = before.model_copy(update={"state": state})
                assert isinstance(after, ToolPart)
                assert isinstance(after.state, ToolStateCompleted)
                got_nested: list[Any] = [after.state, after.state.time]
                want_nested: list[Any] = [state, time]
            else:
                assert isinstance(before, ToolResultPart)
                time = before.time.model_copy(update={"compacted": now, "placeholder": stored})
                want = before.model_copy(update={"time": time})
                assert isinstance(after, ToolResultPart)
                got_nested, want_nested = [after.time], [time]
            for got, expected in zip([after, *got_nested], [want, *want_nested], strict=True):
                assert type(got) is type(expected)
                assert got == expected
                assert got.__pydantic_fields_set__ == expected.__pydantic_fields_set__
                assert got.__pydantic_private__ is None
                assert got.__pydantic_extra__ is None


@settings(max_examples=60, deadline=None)
@given(message=arbitrary_messages())
def test_the_payload_bytes_are_the_message_json(message: Message) -> None:
    """The boundary's row is bound as UTF-8 bytes: the very JSON of the message."""
    assert message_json(message) == message.model_dump_json().encode()
    assert message_payload(message) == message.model_dump_json()


@pytest.mark.parametrize("seed", range(3))
async def test_a_boundary_bound_as_bytes_is_stored_and_read_as_text(
    tmp_path: Path, seed: int
) -> None:
    """A boundary whose body escapes, counts twice in UTF-16 and is beyond Latin-1,
    committed with compacted copies: its row holds TEXT (what SQLite's JSON
    functions read, not a BLOB), and a fresh store reads it back equal."""
    rng = random.Random(seed)
    body = "".join(rng.choice(_PIECES) for _ in range(2_000))
    path = tmp_path / "s.db"
    async with await SQLiteStore.open(path) as store:
        session = Session(id="ses_b", project_id="p", time_created=0)
        listed, compacted = await _stored_and_compacted(store, session, seed)
        boundary = await _commit(store, listed, compacted, body=body)
    with sqlite3.connect(path) as conn:
        kind, text = conn.execute(
            "SELECT typeof(payload), json_extract(payload, '$.parts[2].text')"
            " FROM messages WHERE id = ?",
            (boundary.id,),
        ).fetchone()
    assert (kind, text) == ("text", body)
    async with await SQLiteStore.open(path) as store:
        stored = await store.get_message(boundary.id)
        assert stored is not None
        assert stored.model_dump_json() == boundary.model_dump_json()
        assert estimate_message_tokens(stored) == estimate_message_tokens(boundary)
