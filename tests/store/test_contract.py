"""The Store contract (mimo_ctx.store.base), run against every implementation.

Each test gets a fresh store from the ``store`` fixture, parametrised over
InMemoryStore, SQLiteStore on a file and SQLiteStore on ``:memory:``.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import messages as any_messages
from strategies import sessions as generated_sessions

from mimo_ctx import ids
from mimo_ctx.errors import StoreError
from mimo_ctx.messages import (
    MAIN_AGENT,
    Message,
    Part,
    TextPart,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.store import Session, SessionState, Store
from mimo_ctx.store.base import HeadMove, HostNode
from mimo_ctx.tokens import estimate_message_tokens

from .builders import (
    T0,
    actor,
    assistant,
    boundary,
    every_part_message,
    ids_of,
    make_session,
    task,
    user,
)
from .conftest import StoreFactory

# --------------------------------------------------------------------------- helpers


async def new_session(store: Store, t: int = T0) -> Session:
    session = make_session(t)
    await store.create_session(session)
    return session


def dumps(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump() for m in messages]


def with_text(message: Message, text: str) -> Message:
    """A new version of ``message`` with its first part's text replaced."""
    first = message.parts[0]
    assert isinstance(first, TextPart)
    return message.model_copy(update={"parts": [first.model_copy(update={"text": text})]})


# --------------------------------------------------------------------------- sessions


async def test_store_satisfies_protocol(store: Store) -> None:
    assert isinstance(store, Store)


async def test_session_create_get_update_list(store: Store) -> None:
    newer = make_session(T0 + 10)
    older = make_session(T0)  # created second, but older by time
    await store.create_session(newer)
    await store.create_session(older)
    with pytest.raises(StoreError, match=newer.id):
        await store.create_session(newer)

    assert await store.get_session(newer.id) == newer
    assert await store.get_session("ses_missing") is None
    assert [s.id for s in await store.list_sessions()] == [older.id, newer.id]

    renamed = newer.model_copy(
        update={
            "title": "renamed",
            "state": SessionState(crossed_thresholds=[20_000], freed_fractions=[0.5], rebuilds=2),
            "metadata": {"k": ["v", 1]},
        }
    )
    await store.update_session(renamed)
    # The state is not replaced with the session: only state changes change it.
    assert await store.get_session(newer.id) == renamed.model_copy(update={"state": newer.state})
    with pytest.raises(StoreError, match="unknown session"):
        await store.update_session(make_session())


async def test_session_state_changes_apply_to_the_stored_state(store: Store) -> None:
    """update_session_state runs the change on the state as stored, inside the write:
    50 concurrent increments all count, and a session replaced from an old copy
    keeps them (issue 17: lost updates of session state)."""
    session = await new_session(store)
    stale = await store.get_session(session.id)
    assert stale is not None

    def bump(state: SessionState) -> SessionState:
        return state.model_copy(
            update={"rebuilds": state.rebuilds + 1, "crossed_thresholds": [state.rebuilds]}
        )

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(store.update_session_state, session.id, bump)
    await store.update_session(stale.model_copy(update={"title": "renamed"}))
    got = await store.get_session(session.id)
    assert got is not None
    assert got.title == "renamed"
    assert got.state.rebuilds == 50
    assert got.state.crossed_thresholds == [49]
    new = await store.update_session_state(session.id, bump)
    assert new.rebuilds == 51
    with pytest.raises(StoreError, match="ses_unknown"):
        await store.update_session_state("ses_unknown", bump)
    with pytest.raises(StoreError, match="not a SessionState"):
        # A change that returns nothing on purpose: the store refuses it.
        await store.update_session_state(session.id, lambda s: None)  # pyright: ignore[reportArgumentType]
    after = await store.get_session(session.id)
    assert after is not None
    assert after.state.rebuilds == 51


async def test_returned_and_given_sessions_are_not_shared(store: Store) -> None:
    session = await new_session(store)
    session.state.crossed_thresholds.append(1)  # caller edits its own object after storing
    got = await store.get_session(session.id)
    assert got is not None
    assert got.state.crossed_thresholds == []
    got.state.crossed_thresholds.append(2)  # caller edits a returned object
    again = await store.get_session(session.id)
    assert again is not None
    assert again.state.crossed_thresholds == []


async def test_r2_1_watermark_get_set(store: Store) -> None:
    session = await new_session(store)
    assert await store.get_watermark(session.id) is None
    await store.set_watermark(session.id, "msg_0000000000000000000000000001")
    assert await store.get_watermark(session.id) == "msg_0000000000000000000000000001"
    got = await store.get_session(session.id)
    assert got is not None
    assert got.watermark == "msg_0000000000000000000000000001"
    assert got.title == session.title
    assert got.prefix == session.prefix
    await store.set_watermark(session.id, "msg_2")
    assert await store.get_watermark(session.id) == "msg_2"
    assert await store.get_watermark("ses_unknown") is None
    with pytest.raises(StoreError, match="ses_unknown"):
        await store.set_watermark("ses_unknown", "msg_x")


async def test_r2_1_session_replace_never_rolls_back_the_watermark(store: Store) -> None:
    """The writer owns the watermark: replacing a session from an older copy keeps it,
    and so do state changes."""
    session = await new_session(store)
    stale = await store.get_session(session.id)
    assert stale is not None
    await store.set_watermark(session.id, "msg_newer")
    await store.update_session(stale.model_copy(update={"title": "again"}))
    assert await store.get_watermark(session.id) == "msg_newer"
    await store.update_session_state(
        session.id, lambda s: s.model_copy(update={"crossed_thresholds": [1000]})
    )
    got = await store.get_session(session.id)
    assert got is not None
    assert got.state.crossed_thresholds == [1000]
    assert got.watermark == "msg_newer"
    u1 = user(session.id, "hi", t=T0)
    await store.append_messages([u1])
    await store.commit_rebuild(
        session.id,
        usage_key="k",
        boundary=boundary(session.id, u1.id, t=T0 + 1),
        updated=[],
        state=lambda s: s.model_copy(update={"rebuilds": s.rebuilds + 1}),
    )
    assert await store.get_watermark(session.id) == "msg_newer"
    got = await store.get_session(session.id)
    assert got is not None
    assert got.state.rebuilds == 1
    assert got.state.crossed_thresholds == [1000]


# --------------------------------------------------------------------------- ordering


async def test_a1_backdated_message_lists_by_time_but_latest_uses_ids(store: Store) -> None:
    """A boundary back-dated to watermark + 1 ms lists after the watermark (A1, R4.3),
    but "newest" is decided by ids (R1.4)."""
    s = await new_session(store)
    u1 = user(s.id, "first", t=T0 + 1000)
    a1 = assistant(s.id, "one", t=T0 + 2000)
    u2 = user(s.id, "second", t=T0 + 3000)
    a2 = assistant(s.id, "two", t=T0 + 4000)
    await store.append_messages([u1, a1, u2, a2])
    b = boundary(s.id, a1.id, t=a1.time_created + 1)  # created last: the newest id
    await store.append_messages([b])

    assert ids_of(await store.list_messages(s.id)) == [u1.id, a1.id, b.id, u2.id, a2.id]
    latest = await store.latest_boundary(s.id)
    assert latest is not None
    assert latest.id == b.id

    # A finished assistant created last but dated before everything else: it lists
    # first, yet it is the newest finished assistant because its id is the newest.
    late = assistant(s.id, "late", t=T0 + 1)
    await store.append_messages([late])
    assert ids_of(await store.list_messages(s.id))[0] == late.id
    newest = await store.latest_finished_assistant(s.id)
    assert newest is not None
    assert newest.id == late.id


async def test_a1_same_millisecond_orders_by_id(store: Store) -> None:
    s = await new_session(store)
    newer_id = user(s.id, "newer id", t=T0)
    older_id = user(s.id, "older id", t=T0).model_copy(
        update={"id": ids.ascending("msg", timestamp_ms=1)}
    )
    await store.append_messages([newer_id])
    await store.append_messages([older_id])
    assert ids_of(await store.list_messages(s.id)) == [older_id.id, newer_id.id]


async def test_list_messages_since_last_and_agent_filters(store: Store) -> None:
    s = await new_session(store)
    main = [user(s.id, f"m{i}", t=T0 + 10 * i) for i in range(6)]
    sub = [user(s.id, f"s{i}", t=T0 + 10 * i + 5, agent="sub-1") for i in range(3)]
    await store.append_messages(main[:3])
    await store.append_messages(sub)
    await store.append_messages(main[3:])
    everything = sorted(main + sub, key=lambda m: (m.time_created, m.id))

    assert ids_of(await store.list_messages(s.id)) == ids_of(main)  # default: main agent
    assert ids_of(await store.list_messages(s.id, agent=MAIN_AGENT)) == ids_of(main)
    assert ids_of(await store.list_messages(s.id, agent=None)) == ids_of(everything)
    assert ids_of(await store.list_messages(s.id, agent="sub-1")) == ids_of(sub)
    assert await store.list_messages(s.id, agent="nobody") == []

    key = (main[2].time_created, main[2].id)
    assert ids_of(await store.list_messages(s.id, since=key)) == ids_of(main[2:])  # inclusive
    assert ids_of(await store.list_messages(s.id, agent=None, since=key)) == ids_of(
        [m for m in everything if (m.time_created, m.id) >= key]
    )
    # A key between stored keys starts at the next message.
    between = (main[2].time_created, "")
    assert ids_of(await store.list_messages(s.id, since=between)) == ids_of(main[2:])
    assert await store.list_messages(s.id, since=(T0 + 10_000, "")) == []

    assert ids_of(await store.list_messages(s.id, last=2)) == ids_of(main[4:])
    assert ids_of(await store.list_messages(s.id, agent=None, last=4)) == ids_of(everything[-4:])
    assert ids_of(await store.list_messages(s.id, agent="sub-1", last=2)) == ids_of(sub[1:])
    assert ids_of(await store.list_messages(s.id, last=100)) == ids_of(main)
    assert await store.list_messages(s.id, last=0) == []
    assert ids_of(await store.list_messages(s.id, since=key, last=10)) == ids_of(main[2:])
    assert ids_of(await store.list_messages(s.id, since=key, last=2)) == ids_of(main[4:])
    assert await store.list_messages("ses_unknown", agent=None) == []
    with pytest.raises(StoreError, match="last"):
        await store.list_messages(s.id, last=-1)

    # exclude_agent: every agent but one (the sub-agents, beside a main window).
    assert ids_of(await store.list_messages(s.id, agent=None, exclude_agent=MAIN_AGENT)) == ids_of(
        sub
    )
    assert ids_of(
        await store.list_messages(s.id, agent=None, since=key, exclude_agent=MAIN_AGENT)
    ) == ids_of([m for m in sub if (m.time_created, m.id) >= key])
    assert ids_of(
        await store.list_messages(s.id, agent=None, last=2, exclude_agent="sub-1")
    ) == ids_of(main[4:])
    assert await store.list_messages(s.id, exclude_agent=MAIN_AGENT) == []

    assert await store.count_messages(s.id) == 9
    assert await store.count_messages(s.id, agent=MAIN_AGENT) == 6
    assert await store.count_messages(s.id, agent="sub-1") == 3
    assert await store.count_messages("ses_unknown") == 0


async def test_list_user_messages_over_the_whole_history(store: Store) -> None:
    # Issue 14 finding 2: "Recent user input" reads the whole main history's user
    # messages through an index, newest pages first, not the newest 200 messages.
    s = await new_session(store)
    users = [user(s.id, f"u{i}", t=T0 + 100 * i) for i in range(5)]
    answers = [assistant(s.id, "ok", t=T0 + 100 * i + 1) for i in range(5)]
    sub = [user(s.id, f"s{i}", t=T0 + 100 * i + 2, agent="sub-1") for i in range(2)]
    marker = boundary(s.id, users[2].id, t=T0 + 201)
    await store.append_messages([m for pair in zip(users, answers, strict=True) for m in pair])
    await store.append_messages([*sub, marker])

    assert ids_of(await store.list_user_messages(s.id)) == ids_of(users)  # no boundary
    assert ids_of(await store.list_user_messages(s.id, first=2)) == ids_of(users[:2])
    assert ids_of(await store.list_user_messages(s.id, last=2)) == ids_of(users[3:])
    key = (users[3].time_created, users[3].id)
    assert ids_of(await store.list_user_messages(s.id, last=2, before=key)) == ids_of(users[1:3])
    assert ids_of(await store.list_user_messages(s.id, before=key)) == ids_of(users[:3])
    assert ids_of(await store.list_user_messages(s.id, agent="sub-1")) == ids_of(sub)
    assert await store.list_user_messages(s.id, last=0) == []
    assert await store.list_user_messages("ses_unknown") == []
    # An update that turns a user message into something else leaves the index.
    changed = users[4].model_copy(update={"role": "assistant"})
    await store.update_messages([changed])
    assert ids_of(await store.list_user_messages(s.id, last=1)) == [users[3].id]
    with pytest.raises(StoreError, match="first or last"):
        await store.list_user_messages(s.id, first=1, last=1)
    with pytest.raises(StoreError, match=">= 0"):
        await store.list_user_messages(s.id, last=-1)


async def test_returned_lists_are_new(store: Store) -> None:
    s = await new_session(store)
    await store.append_messages([user(s.id, f"m{i}", t=T0 + i) for i in range(3)])
    await store.upsert_task(task(s.id, "T1"))
    await store.upsert_actor(actor(s.id, "act_1"))
    for _ in range(2):
        listed = await store.list_messages(s.id)
        listed.clear()
        changed, _ = await store.changes_since(s.id, 0)
        changed.clear()
        tasks = await store.list_tasks(s.id)
        tasks[0].summary = "edited by caller"
        tasks.clear()
        actors = await store.list_actors(s.id)
        actors[0].status = "failed"
        actors.clear()
        sessions = await store.list_sessions()
        sessions.clear()
    assert len(await store.list_messages(s.id)) == 3
    assert len((await store.changes_since(s.id, 0))[0]) == 3
    assert [t.summary for t in await store.list_tasks(s.id)] == ["task T1"]
    assert [a.status for a in await store.list_actors(s.id)] == ["running"]
    assert len(await store.list_sessions()) == 1


# --------------------------------------------------------------------------- latest_*


async def test_r1_4_latest_finished_assistant_by_agent(store: Store) -> None:
    s = await new_session(store)
    assert await store.latest_finished_assistant(s.id) is None
    a_main = assistant(s.id, "main done", t=T0 + 1)
    a_sub = assistant(s.id, "sub done", t=T0 + 2, agent="sub-1")
    running = assistant(s.id, "main running", t=T0 + 3, finish=None)
    tool_msg = Message(session_id=s.id, role="tool", time_created=T0 + 4, finish="stop")
    await store.append_messages([a_main, a_sub, running, tool_msg])

    main_latest = await store.latest_finished_assistant(s.id)
    assert main_latest is not None
    assert main_latest.id == a_main.id
    any_latest = await store.latest_finished_assistant(s.id, agent=None)
    assert any_latest is not None
    assert any_latest.id == a_sub.id
    sub_latest = await store.latest_finished_assistant(s.id, agent="sub-1")
    assert sub_latest is not None
    assert sub_latest.id == a_sub.id
    assert await store.latest_finished_assistant(s.id, agent="nobody") is None
    assert await store.latest_finished_assistant("ses_unknown") is None


async def test_r1_4_latest_boundary_main_agent_user_only(store: Store) -> None:
    s = await new_session(store)
    assert await store.latest_boundary(s.id) is None
    compaction = boundary(s.id, "", t=T0 + 1, kind="compaction")
    await store.append_messages([user(s.id, "hello", t=T0), compaction])
    found = await store.latest_boundary(s.id)
    assert found is not None
    assert found.id == compaction.id

    sub_boundary = boundary(s.id, "", t=T0 + 2, agent="sub-1", kind="compaction")
    as_assistant = boundary(s.id, "", t=T0 + 3).model_copy(update={"role": "assistant"})
    plain = user(s.id, "later", t=T0 + 4)
    await store.append_messages([sub_boundary, as_assistant, plain])
    found = await store.latest_boundary(s.id)
    assert found is not None
    assert found.id == compaction.id

    checkpoint = boundary(s.id, plain.id, t=T0 + 5)
    await store.append_messages([checkpoint])
    found = await store.latest_boundary(s.id)
    assert found is not None
    assert found.id == checkpoint.id
    assert await store.latest_boundary("ses_unknown") is None


async def test_update_messages_reindexes(store: Store) -> None:
    s = await new_session(store)
    u = user(s.id, "u", t=T0)
    a = assistant(s.id, "a", t=T0 + 10)
    b = boundary(s.id, u.id, t=T0 + 20)
    await store.append_messages([u, a, b])

    await store.update_messages([a.model_copy(update={"finish": None})])
    assert await store.latest_finished_assistant(s.id) is None
    await store.update_messages([b.model_copy(update={"parts": [TextPart(text="plain now")]})])
    assert await store.latest_boundary(s.id) is None
    await store.update_messages([u.model_copy(update={"time_created": T0 + 30})])
    assert ids_of(await store.list_messages(s.id)) == [a.id, b.id, u.id]
    await store.update_messages([a.model_copy(update={"agent": "sub-1"})])
    assert ids_of(await store.list_messages(s.id)) == [b.id, u.id]
    assert ids_of(await store.list_messages(s.id, agent="sub-1")) == [a.id]
    got = await store.get_message(u.id)
    assert got is not None
    assert got.time_created == T0 + 30
    assert await store.count_messages(s.id) == 3


# --------------------------------------------------------------------------- change feed


async def test_changes_since_returns_appended_and_updated_once_in_write_order(
    store: Store,
) -> None:
    s = await new_session(store)
    other = await new_session(store)
    _, seq0 = await store.changes_since(s.id, 0)

    m1, m2, m3 = (user(s.id, f"m{i}", t=T0 + i) for i in range(1, 4))
    await store.append_messages([m1, m2, m3])
    await store.append_messages([user(other.id, "elsewhere", t=T0)])
    changed, seq1 = await store.changes_since(s.id, seq0)
    assert ids_of(changed) == [m1.id, m2.id, m3.id]
    assert seq1 > seq0
    assert await store.changes_since(s.id, seq1) == ([], seq1)

    m1b = with_text(m1, "m1 edited")
    await store.update_messages([m1b])
    changed, seq2 = await store.changes_since(s.id, seq1)
    assert dumps(changed) == dumps([m1b])
    assert seq2 > seq1

    m4 = user(s.id, "m4", t=T0 + 4)
    await store.append_messages([m4])
    await store.update_messages([with_text(m2, "m2 edited")])
    await store.update_messages([with_text(m3, "m3 once")])
    m3c = with_text(m3, "m3 twice")
    await store.update_messages([m3c])
    changed, seq3 = await store.changes_since(s.id, seq2)
    assert ids_of(changed) == [m4.id, m2.id, m3.id]
    assert changed[-1].model_dump() == m3c.model_dump()  # the newest version, once

    # From the start: every message once, ordered by its last write.
    changed, _ = await store.changes_since(s.id, seq0)
    assert ids_of(changed) == [m1.id, m4.id, m2.id, m3.id]

    # The seq is store-wide: another session's write moves it, without listing.
    await store.append_messages([user(other.id, "elsewhere 2", t=T0 + 1)])
    changed, seq4 = await store.changes_since(s.id, seq3)
    assert changed == []
    assert seq4 > seq3

    # commit_rebuild feeds the change feed too.
    b = boundary(s.id, m4.id, t=m4.time_created + 1)
    m1c = with_text(m1, "m1 compacted")
    assert await store.commit_rebuild(s.id, usage_key="u1", boundary=b, updated=[m1c])
    changed, seq5 = await store.changes_since(s.id, seq4)
    assert ids_of(changed) == [b.id, m1.id]
    assert seq5 > seq4


# --------------------------------------------------------------------------- commit_rebuild


def _compactable_assistant(session_id: str, t: int) -> Message:
    return assistant(
        session_id,
        "read it",
        t=t,
        finish="tool-calls",
        parts=[
            ToolPart(
                call_id="call_1",
                tool="read",
                state=ToolStateCompleted(input={"path": "x"}, output="x" * 500),
            )
        ],
    )


def _compacted(message: Message, when: int) -> Message:
    parts: list[Part] = []
    for p in message.parts:
        if isinstance(p, ToolPart) and isinstance(p.state, ToolStateCompleted):
            state = p.state.model_copy(update={"time": ToolTime(compacted=when)})
            parts.append(p.model_copy(update={"state": state}))
        else:
            parts.append(p)
    return message.model_copy(update={"parts": parts})


async def test_r4_commit_rebuild_once_per_usage(store: Store) -> None:
    s = await new_session(store)
    u1 = user(s.id, "do it", t=T0)
    a1 = _compactable_assistant(s.id, T0 + 10)
    a2 = assistant(s.id, "done", t=T0 + 20)
    await store.append_messages([u1, a1, a2])

    b1 = boundary(s.id, u1.id, t=u1.time_created + 1)
    compacted = _compacted(a1, T0 + 30)
    rebuilt = s.model_copy(update={"state": SessionState(rebuilds=1)})

    def rebuilt_state(state: SessionState) -> SessionState:
        return state.model_copy(update={"rebuilds": state.rebuilds + 1})

    assert (
        await store.commit_rebuild(
            s.id, usage_key=a2.id, boundary=b1, updated=[compacted], state=rebuilt_state
        )
        is True
    )
    latest = await store.latest_boundary(s.id)
    assert latest is not None
    assert latest.id == b1.id
    got = await store.get_message(a1.id)
    assert got is not None
    assert got.model_dump() == compacted.model_dump()
    assert await store.get_session(s.id) == rebuilt

    count = await store.count_messages(s.id)
    _, seq = await store.changes_since(s.id, 0)
    b2 = boundary(s.id, u1.id, t=u1.time_created + 1)
    a2_changed = with_text(a2, "should not be written")
    called: list[SessionState] = []

    def again(state: SessionState) -> SessionState:
        called.append(state)
        return state.model_copy(update={"rebuilds": 99})

    assert (
        await store.commit_rebuild(
            s.id, usage_key=a2.id, boundary=b2, updated=[a2_changed], state=again
        )
        is False
    )
    assert called == []
    assert await store.get_message(b2.id) is None
    got_a2 = await store.get_message(a2.id)
    assert got_a2 is not None
    assert got_a2.model_dump() == a2.model_dump()
    assert await store.get_session(s.id) == rebuilt
    assert await store.count_messages(s.id) == count
    assert await store.changes_since(s.id, seq) == ([], seq)

    # Another usage key commits; the same key in another session is independent.
    b3 = boundary(s.id, a1.id, t=a1.time_created + 1)
    assert await store.commit_rebuild(s.id, usage_key="other", boundary=b3, updated=[])
    other = await new_session(store)
    b4 = boundary(other.id, "", t=T0)
    assert await store.commit_rebuild(other.id, usage_key=a2.id, boundary=b4, updated=[])


async def test_r4_commit_rebuild_concurrent_same_key_exactly_one(store: Store) -> None:
    s = await new_session(store)
    a = _compactable_assistant(s.id, T0)
    await store.append_messages([a])
    results: list[bool] = []

    async def attempt(i: int) -> None:
        b = boundary(s.id, a.id, t=a.time_created + 1)
        updated = [_compacted(a, T0 + i)]
        results.append(
            await store.commit_rebuild(s.id, usage_key=a.id, boundary=b, updated=updated)
        )

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(attempt, i)

    assert len(results) == 50
    assert results.count(True) == 1
    stored = await store.list_messages(s.id, agent=None)
    assert sum(m.is_boundary for m in stored) == 1
    assert len(stored) == 2


async def test_r4_commit_rebuild_invalid_writes_nothing_and_keeps_key(store: Store) -> None:
    s = await new_session(store)
    other = await new_session(store)
    u = user(s.id, "u", t=T0)
    foreign = user(other.id, "foreign", t=T0)
    await store.append_messages([u, foreign])
    count = await store.count_messages(s.id)

    def b() -> Message:
        return boundary(s.id, u.id, t=T0 + 1)

    def not_a_state(_state: object) -> object:
        return "not a state"  # a state change must return the new state

    missing = user(s.id, "never stored", t=T0 + 2)
    bad_calls: list[dict[str, Any]] = [
        {"boundary": b(), "updated": [with_text(u, "x"), missing]},
        {"boundary": b(), "updated": [with_text(foreign, "moved")]},
        {"boundary": boundary(other.id, u.id, t=T0 + 1), "updated": []},
        {"boundary": b(), "updated": [], "state": not_a_state},
        {"boundary": u, "updated": []},  # boundary id already stored
    ]
    twice = b()
    bad_calls.append({"boundary": twice, "updated": [twice]})  # boundary also "updated"
    for kwargs in bad_calls:
        with pytest.raises(StoreError):
            await store.commit_rebuild(s.id, usage_key="k", **kwargs)
        assert await store.count_messages(s.id) == count
        got = await store.get_message(u.id)
        assert got is not None
        assert got.model_dump() == u.model_dump()
        got_foreign = await store.get_message(foreign.id)
        assert got_foreign is not None
        assert got_foreign.model_dump() == foreign.model_dump()
    with pytest.raises(StoreError, match="ses_unknown"):
        await store.commit_rebuild(
            "ses_unknown",
            usage_key="k",
            boundary=b().model_copy(update={"session_id": "ses_unknown"}),
            updated=[],
        )
    assert await store.latest_boundary(s.id) is None
    # The failed attempts did not consume the key.
    assert await store.commit_rebuild(s.id, usage_key="k", boundary=b(), updated=[])


# --------------------------------------------------------------------------- appends


async def test_append_duplicate_id_rejects_whole_batch(store: Store) -> None:
    s = await new_session(store)
    first = user(s.id, "first", t=T0)
    await store.append_messages([first])
    _, seq = await store.changes_since(s.id, 0)

    fresh_a = user(s.id, "a", t=T0 + 1)
    fresh_b = user(s.id, "b", t=T0 + 2)
    with pytest.raises(StoreError, match=first.id):
        await store.append_messages([fresh_a, with_text(first, "again"), fresh_b])
    repeated = user(s.id, "twice", t=T0 + 3)
    with pytest.raises(StoreError, match=repeated.id):
        await store.append_messages([repeated, repeated])
    stray = user("ses_unknown", "stray", t=T0)
    with pytest.raises(StoreError, match="ses_unknown"):
        await store.append_messages([fresh_a, stray])

    assert ids_of(await store.list_messages(s.id, agent=None)) == [first.id]
    for m in (fresh_a, fresh_b, repeated, stray):
        assert await store.get_message(m.id) is None
    got = await store.get_message(first.id)
    assert got is not None
    assert got.model_dump() == first.model_dump()
    assert await store.changes_since(s.id, seq) == ([], seq)
    await store.append_messages([])  # an empty batch is a no-op
    assert await store.count_messages(s.id) == 1


async def test_update_missing_or_moved_message_rejects_whole_batch(store: Store) -> None:
    s = await new_session(store)
    other = await new_session(store)
    m = user(s.id, "stored", t=T0)
    await store.append_messages([m])
    with pytest.raises(StoreError, match="does not exist"):
        await store.update_messages([with_text(m, "edited"), user(s.id, "missing", t=T0)])
    with pytest.raises(StoreError, match=m.id):
        await store.update_messages([m.model_copy(update={"session_id": other.id})])
    got = await store.get_message(m.id)
    assert got is not None
    assert got.model_dump() == m.model_dump()
    assert await store.count_messages(other.id) == 0
    await store.update_messages([])  # no-op


async def test_upsert_appends_new_and_replaces_known_messages(store: Store) -> None:
    """upsert_messages: one call appends new ids and replaces known ones; each write
    takes a change-feed position, the listing and the newest-finished index follow."""
    s = await new_session(store)
    first = user(s.id, "first", t=T0)
    await store.append_messages([first])
    _, seq = await store.changes_since(s.id, 0)
    edited = with_text(first, "first, edited")
    reply = assistant(s.id, "reply", t=T0 + 1)
    await store.upsert_messages([edited, reply])
    changed, after = await store.changes_since(s.id, seq)
    assert dumps(changed) == dumps([edited, reply])
    assert after > seq
    assert dumps(await store.list_messages(s.id)) == dumps([edited, reply])
    got = await store.get_message(first.id)
    assert got is not None
    assert got.model_dump() == edited.model_dump()
    assert estimate_message_tokens(got) == estimate_message_tokens(edited)
    latest = await store.latest_finished_assistant(s.id)
    assert latest is not None
    assert latest.id == reply.id
    # A streamed answer stored again when it finished: replaced, not duplicated.
    final = with_text(reply, "reply, finished")
    await store.upsert_messages([final])
    assert await store.count_messages(s.id) == 2
    changed, _ = await store.changes_since(s.id, after)
    assert dumps(changed) == dumps([final])
    await store.upsert_messages([])  # an empty batch is a no-op


async def test_upsert_rejects_bad_batches_whole(store: Store) -> None:
    s = await new_session(store)
    other = await new_session(store)
    m = user(s.id, "stored", t=T0)
    await store.append_messages([m])
    _, seq = await store.changes_since(s.id, 0)
    fresh = user(s.id, "fresh", t=T0 + 1)
    with pytest.raises(StoreError, match="ses_unknown"):
        await store.upsert_messages([fresh, user("ses_unknown", "stray", t=T0)])
    with pytest.raises(StoreError, match=fresh.id):
        await store.upsert_messages([fresh, fresh])
    with pytest.raises(StoreError, match=m.id):
        await store.upsert_messages([fresh, m.model_copy(update={"session_id": other.id})])
    assert await store.get_message(fresh.id) is None
    got = await store.get_message(m.id)
    assert got is not None
    assert got.model_dump() == m.model_dump()
    assert await store.count_messages(other.id) == 0
    assert await store.changes_since(s.id, seq) == ([], seq)


async def test_concurrent_appends_lose_nothing(store: Store) -> None:
    s = await new_session(store)
    written: list[str] = []

    async def writer(w: int) -> None:
        for i in range(25):
            batch = [user(s.id, f"w{w}-{i}-{j}", t=T0 + i) for j in range(1 + (i % 3))]
            await store.append_messages(batch)
            written.extend(ids_of(batch))

    async with anyio.create_task_group() as tg:
        for w in range(20):
            tg.start_soon(writer, w)

    assert await store.count_messages(s.id) == len(written)
    assert set(ids_of(await store.list_messages(s.id))) == set(written)
    changed, _ = await store.changes_since(s.id, 0)
    assert sorted(ids_of(changed)) == sorted(written)


# --------------------------------------------------------------------------- properties


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(5, 40))
def test_stored_message_count_never_decreases(
    store_factory: StoreFactory, seed: int, steps: int
) -> None:
    """Nothing is ever deleted from storage: under any mix of successful and
    rejected writes, the count only grows, by exactly what was accepted."""

    async def run() -> None:
        rng = random.Random(seed)
        store = await store_factory()
        try:
            s = await new_session(store)
            stored: list[Message] = []
            expected = 0
            for step in range(steps):
                before = await store.count_messages(s.id)
                op = rng.choice(["append", "append_dup", "update", "update_missing", "rebuild"])
                try:
                    if op == "append":
                        batch = [
                            user(s.id, f"{step}-{j}", t=T0 + step) for j in range(rng.randint(1, 3))
                        ]
                        await store.append_messages(batch)
                        stored.extend(batch)
                        expected += len(batch)
                    elif op == "append_dup" and stored:
                        await store.append_messages([user(s.id, "new", t=T0), rng.choice(stored)])
                    elif op == "update" and stored:
                        await store.update_messages([with_text(rng.choice(stored), f"edit {step}")])
                    elif op == "update_missing":
                        await store.update_messages([user(s.id, "missing", t=T0)])
                    elif op == "rebuild":
                        b = boundary(s.id, "", t=T0 + step)
                        if await store.commit_rebuild(
                            s.id, usage_key=str(rng.randint(0, 3)), boundary=b, updated=[]
                        ):
                            expected += 1
                except StoreError:
                    assert op in ("append_dup", "update_missing")
                after = await store.count_messages(s.id)
                assert after >= before
            assert await store.count_messages(s.id) == expected
        finally:
            await store.aclose()

    anyio.run(run)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=any_messages())
def test_json_round_trip_is_lossless_for_any_message(
    store_factory: StoreFactory, message: Message
) -> None:
    async def run() -> None:
        store = await store_factory()
        try:
            session = make_session()
            m = message.model_copy(update={"session_id": session.id})
            await store.create_session(session)
            await store.append_messages([m])
            got = await store.get_message(m.id)
            assert got is not None
            assert got.model_dump() == m.model_dump()
            assert estimate_message_tokens(got) == estimate_message_tokens(m)
        finally:
            await store.aclose()

    anyio.run(run)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=generated_sessions(), data=st.data())
def test_store_queries_match_a_reference_model(
    store_factory: StoreFactory, history: list[Message], data: st.DataObject
) -> None:
    """Listing, latest finished assistant and the change feed agree with plain
    Python over the same messages, however they were batched."""
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(history) - 1)), max_size=4)))

    async def run() -> None:
        store = await store_factory()
        try:
            session_id = history[0].session_id
            await store.create_session(Session(id=session_id, time_created=T0))
            for lo, hi in zip([0, *cuts], [*cuts, len(history)], strict=True):
                await store.append_messages(history[lo:hi])
            by_key = sorted(history, key=lambda m: (m.time_created, m.id))
            assert ids_of(await store.list_messages(session_id, agent=None)) == ids_of(by_key)
            agents = {m.agent for m in history}
            for agent in [*agents, None]:
                selected = [m for m in by_key if agent is None or m.agent == agent]
                assert ids_of(await store.list_messages(session_id, agent=agent)) == ids_of(
                    selected
                )
                finished = [m.id for m in selected if m.role == "assistant" and m.finish]
                latest = await store.latest_finished_assistant(session_id, agent=agent)
                assert (latest.id if latest else None) == (max(finished) if finished else None)
            changed, _ = await store.changes_since(session_id, 0)
            assert ids_of(changed) == ids_of(history)
            assert dumps(changed) == dumps(history)
        finally:
            await store.aclose()

    anyio.run(run)


async def test_json_round_trip_every_part_kind(store: Store) -> None:
    s = await new_session(store)
    m = every_part_message(s.id)
    kinds = {p.type for p in m.parts}
    assert kinds == {
        "text",
        "reasoning",
        "tool",
        "tool_result",
        "file",
        "subtask",
        "checkpoint",
        "compaction",
        "opaque",
    }
    await store.append_messages([m])
    by_id = await store.get_message(m.id)
    listed = await store.list_messages(s.id)
    changed, _ = await store.changes_since(s.id, 0)
    latest = await store.latest_finished_assistant(s.id)
    for got in (by_id, listed[0], changed[0], latest):
        assert got is not None
        assert got.model_dump() == m.model_dump()
        assert got.model_dump_json() == m.model_dump_json()
        assert estimate_message_tokens(got) == estimate_message_tokens(
            Message.model_validate_json(m.model_dump_json())
        )
    stored_session = await store.get_session(s.id)
    assert stored_session is not None
    assert stored_session.model_dump_json() == s.model_dump_json()


# --------------------------------------------------------------------------- tasks, actors


async def test_a16_tasks_natural_order_and_session_isolation(store: Store) -> None:
    a = await new_session(store)
    b = await new_session(store)
    for tid in ["T10", "T2", "T1.10", "T1", "T1.2", "T3"]:
        await store.upsert_task(task(a.id, tid))
    await store.upsert_task(task(b.id, "T1", summary="b's own T1"))

    assert [t.id for t in await store.list_tasks(a.id)] == [
        "T1",
        "T1.2",
        "T1.10",
        "T2",
        "T3",
        "T10",
    ]
    assert [t.id for t in await store.list_tasks(b.id)] == ["T1"]
    got = await store.get_task(b.id, "T1")
    assert got is not None
    assert got.summary == "b's own T1"
    a_t1 = await store.get_task(a.id, "T1")
    assert a_t1 is not None
    assert a_t1.summary == "task T1"
    assert await store.get_task(b.id, "T2") is None
    assert await store.list_tasks("ses_unknown") == []

    done = task(a.id, "T2", status="done", summary="finished")
    await store.upsert_task(done)
    assert await store.get_task(a.id, "T2") == done
    assert [t.status for t in await store.list_tasks(a.id) if t.id == "T2"] == ["done"]
    assert len(await store.list_tasks(a.id)) == 6


async def test_r5_4_actors_session_isolation(store: Store) -> None:
    a = await new_session(store)
    b = await new_session(store)
    a_run = actor(a.id, "act_run", status="running", t=T0 + 3)
    a_pend = actor(a.id, "act_pend", status="pending", t=T0 + 1)
    a_done = actor(a.id, "act_done", status="completed", t=T0 + 2)
    a_fg = actor(a.id, "act_fg", status="running", background=False, t=T0 + 4)
    b_run = actor(b.id, "act_b", status="running", t=T0)
    for x in (a_run, a_pend, a_done, a_fg, b_run):
        await store.upsert_actor(x)

    assert [x.id for x in await store.list_actors(a.id, active_only=True)] == [
        a_pend.id,
        a_run.id,
    ]
    assert [x.id for x in await store.list_actors(a.id)] == [
        a_pend.id,
        a_done.id,
        a_run.id,
        a_fg.id,
    ]
    assert [x.id for x in await store.list_actors(b.id, active_only=True)] == [b_run.id]
    assert await store.get_actor(a.id, b_run.id) is None
    assert await store.get_actor(b.id, b_run.id) == b_run
    assert await store.get_actor(a.id, a_run.id) == a_run

    # An actor id of another session cannot be taken over.
    with pytest.raises(StoreError, match=b_run.id):
        await store.upsert_actor(actor(a.id, b_run.id, status="failed"))
    assert await store.get_actor(b.id, b_run.id) == b_run
    assert await store.get_actor(a.id, b_run.id) is None

    finished = a_run.model_copy(update={"status": "completed"})
    await store.upsert_actor(finished)
    assert [x.id for x in await store.list_actors(a.id, active_only=True)] == [a_pend.id]
    assert await store.get_actor(a.id, a_run.id) == finished


# --------------------------------------------------------------------------- host index


def _node(chain: str, parent: str = "", *ids: str, depth: int = 0) -> HostNode:
    return HostNode(
        chain=chain, parent=parent, fingerprint=f"fp-{chain}", depth=depth, message_ids=list(ids)
    )


async def test_host_history_commits_nodes_messages_and_head_together(store: Store) -> None:
    s = await new_session(store)
    first = user(s.id, "hello", t=T0)
    empty = await store.host_index(s.id, agent=MAIN_AGENT)
    assert (empty.nodes, empty.head) == ([], None)
    assert await store.commit_host_history(
        s.id,
        agent=MAIN_AGENT,
        nodes=[_node("c1", "", first.id)],
        messages=[first],
        move=HeadMove(expected=None, head="c1"),
    )
    index = await store.host_index(s.id, agent=MAIN_AGENT)
    assert [(n.chain, n.parent, n.message_ids) for n in index.nodes] == [("c1", "", [first.id])]
    assert index.head == "c1"
    assert ids_of(await store.list_messages(s.id)) == [first.id]
    # Only what was written since: nothing, then the next node.
    assert (await store.host_index(s.id, agent=MAIN_AGENT, since=index.seq)).nodes == []
    answer = assistant(s.id, "hi", t=T0 + 1)
    assert await store.commit_host_history(
        s.id,
        agent=MAIN_AGENT,
        nodes=[_node("c2", "c1", answer.id, depth=1)],
        messages=[answer],
        move=HeadMove(expected="c1", head="c2"),
    )
    later = await store.host_index(s.id, agent=MAIN_AGENT, since=index.seq)
    assert [n.chain for n in later.nodes] == ["c2"]
    assert later.nodes[0].seq > index.seq
    assert later.head == "c2"
    # Another agent's index is its own.
    assert (await store.host_index(s.id, agent="sub")).head is None


async def test_host_history_refuses_a_stored_chain_or_a_moved_head(store: Store) -> None:
    s = await new_session(store)
    first = user(s.id, "hello", t=T0)
    assert await store.commit_host_history(
        s.id,
        agent=MAIN_AGENT,
        nodes=[_node("c1")],
        messages=[first],
        move=HeadMove(expected=None, head="c1"),
    )
    again = user(s.id, "hello", t=T0)
    # The chain is taken: nothing is written, not even the message.
    assert not await store.commit_host_history(
        s.id, agent=MAIN_AGENT, nodes=[_node("c1")], messages=[again]
    )
    # The head moved since the caller read it: nothing is written.
    other = user(s.id, "other", t=T0 + 1)
    assert not await store.commit_host_history(
        s.id,
        agent=MAIN_AGENT,
        nodes=[_node("c9")],
        messages=[other],
        move=HeadMove(expected="c0", head="c9"),
    )
    assert ids_of(await store.list_messages(s.id)) == [first.id]
    assert [n.chain for n in (await store.host_index(s.id, agent=MAIN_AGENT)).nodes] == ["c1"]
    with pytest.raises(StoreError, match="unknown session"):
        await store.commit_host_history("ses_missing", agent=MAIN_AGENT, nodes=[_node("x")])


async def test_concurrent_commits_of_one_host_message_store_it_once(store: Store) -> None:
    s = await new_session(store)
    results: list[bool] = []

    async def commit(i: int) -> None:
        message = user(s.id, "same", t=T0)
        results.append(
            await store.commit_host_history(
                s.id, agent=MAIN_AGENT, nodes=[_node("c1", "", message.id)], messages=[message]
            )
        )

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(commit, i)
    assert sorted(results) == [False] * 7 + [True]
    assert len(await store.list_messages(s.id)) == 1


async def test_off_branch_messages_are_kept_but_not_listed(store: Store) -> None:
    s = await new_session(store)
    question = user(s.id, "q", t=T0)
    old = assistant(s.id, "first answer", t=T0 + 1)
    await store.append_messages([question, old])
    _, seq = await store.changes_since(s.id, 0)
    dropped = old.model_copy(update={"off_branch": True})
    assert await store.commit_host_history(s.id, agent=MAIN_AGENT, updated=[dropped])
    assert ids_of(await store.list_messages(s.id)) == [question.id]
    assert ids_of(await store.list_messages(s.id, last=5)) == [question.id]
    assert await store.latest_finished_assistant(s.id) is None
    assert await store.count_messages(s.id) == 2
    stored = await store.get_message(old.id)
    assert stored is not None
    assert stored.off_branch
    changed, _ = await store.changes_since(s.id, seq)
    assert [(m.id, m.off_branch) for m in changed] == [(old.id, True)]
    # Back on the branch (the host returned to that answer).
    await store.update_messages([old])
    assert ids_of(await store.list_messages(s.id)) == [question.id, old.id]
    assert (await store.latest_finished_assistant(s.id)) == old


async def test_a_batch_naming_one_id_twice_is_refused_alike_by_every_store(store: Store) -> None:
    s = await new_session(store)
    m = user(s.id, "once", t=T0)
    with pytest.raises(StoreError, match=r"append_messages: .* appears twice"):
        await store.append_messages([m, m])
    with pytest.raises(StoreError, match=r"upsert_messages: .* appears twice"):
        await store.upsert_messages([m, m])
    with pytest.raises(StoreError, match=r"commit_host_history: .* appears twice"):
        await store.commit_host_history(s.id, agent=MAIN_AGENT, messages=[m, m])
    assert await store.count_messages(s.id) == 0


async def test_a_window_beyond_64_bit_integers_means_no_limit(store: Store) -> None:
    """A huge configured window lists everything (both SQL stores' integers are 64-bit)."""
    s = await new_session(store)
    users = [user(s.id, f"u{i}", t=T0 + i) for i in range(3)]
    await store.append_messages(users)
    assert ids_of(await store.list_messages(s.id, last=2**64)) == ids_of(users)
    assert ids_of(await store.list_user_messages(s.id, last=2**64)) == ids_of(users)
    assert ids_of(await store.list_user_messages(s.id, first=2**64)) == ids_of(users)


# --------------------------------------------------------------------------- lifecycle


async def test_aclose_is_idempotent_and_closed_store_raises(store_factory: StoreFactory) -> None:
    store = await store_factory()
    s = make_session()
    await store.create_session(s)
    await store.aclose()
    await store.aclose()
    calls = [
        store.create_session(make_session()),
        store.get_session(s.id),
        store.list_sessions(),
        store.get_watermark(s.id),
        store.append_messages([user(s.id, "late", t=T0)]),
        store.list_messages(s.id),
        store.latest_boundary(s.id),
        store.changes_since(s.id, 0),
        store.commit_rebuild(s.id, usage_key="k", boundary=boundary(s.id, "", t=T0), updated=[]),
        store.list_tasks(s.id),
        store.list_actors(s.id),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="closed"):
            await call


async def test_a_closed_store_refuses_calls_it_could_answer_without_reading(
    store_factory: StoreFactory,
) -> None:
    """Empty batches and empty windows still say the store is closed, on every store."""
    store = await store_factory()
    s = make_session()
    await store.create_session(s)
    await store.aclose()
    calls = [
        store.append_messages([]),
        store.update_messages([]),
        store.upsert_messages([]),
        store.list_messages(s.id, last=0),
        store.list_user_messages(s.id, last=0),
        store.list_user_messages(s.id, first=0),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="closed"):
            await call
