"""Several workers on one session (issue 17, items 1-4), in separate OS processes,
on SQLite and on PostgreSQL.

Each test forces one interleaving with file signals and store-call hooks (see
``_session_worker``): one worker is held inside its rebuild while another acts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mimo_ctx.messages import Message
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import Store

from ._workers import USABLE, SharedStore, run_workers, seed_session, step
from .conftest import LIMITS, SYSTEM, assistant_with_tool, body_text, fill_to_trigger, now_ms


def _boundaries(messages: list[Message]) -> list[Message]:
    return sorted((m for m in messages if m.is_boundary), key=lambda m: m.insert_seq or 0)


async def test_item1_commit_for_a_usage_older_than_a_stored_boundary_is_refused(
    shared: SharedStore,
) -> None:
    """Worker A rebuilds for usage X and is held before its commit; worker B records
    a newer usage Y over the line and rebuilds for it. A's commit for X comes after
    B's boundary for Y, which already recovered X too: it is refused
    (``already-recovered``). Before the fix each usage key was only unique, so A
    inserted a second boundary right after B's and Y was recovered twice."""
    session, _ = await seed_session(shared)
    a, b = await run_workers(
        shared,
        session.id,
        [
            {
                "steps": [{"op": "prepare"}],
                "hooks": [{"method": "commit_rebuild", "signal": "a-commit", "wait": "b-done"}],
            },
            {
                "steps": [
                    {"op": "wait", "name": "a-commit"},
                    {"op": "record", "tag": "b-y", "usage": USABLE + 2000},
                    {"op": "prepare"},
                    {"op": "signal", "name": "b-done"},
                ]
            },
        ],
    )
    assert step(b, "prepare")["outcome"] == "rebuilt"
    assert step(a, "prepare")["outcome"] == "already-recovered"
    stored = await shared.store.list_messages(session.id, agent=None)
    (boundary,) = _boundaries(stored)
    assert boundary.id == step(b, "prepare")["boundary_id"]
    state = await shared.store.get_session(session.id)
    assert state is not None
    assert state.state.rebuilds == 1


async def test_item2_a_usage_recorded_after_a_boundary_by_a_lagging_clock_is_not_recovered(
    shared: SharedStore,
) -> None:
    """Worker A rebuilds; then worker B, whose clock is 5 s behind, records a usage
    over the line: its id sorts before A's boundary, yet it was written after it.
    B's next prepare rebuilds for it. Before the fix ids decided "newer", so the
    new usage counted as recovered and the request stayed over the line."""
    session, _ = await seed_session(shared)
    a, b = await run_workers(
        shared,
        session.id,
        [
            {"steps": [{"op": "prepare"}, {"op": "signal", "name": "a-done"}]},
            {
                "clock_offset_ms": -5000,
                "steps": [
                    {"op": "wait", "name": "a-done"},
                    {"op": "record", "tag": "lagging", "usage": USABLE + 3000},
                    {"op": "prepare"},
                ],
            },
        ],
    )
    first = step(a, "prepare")
    assert first["outcome"] == "rebuilt"
    lagging = step(b, "record")["id"]
    assert lagging < first["boundary_id"]  # the scenario: the newer usage has the older id
    second = step(b, "prepare")
    assert second["outcome"] == "rebuilt"
    stored = await shared.store.list_messages(session.id, agent=None)
    assert [m.id for m in _boundaries(stored)] == [first["boundary_id"], second["boundary_id"]]
    latest = await shared.store.latest_boundary(session.id)
    assert latest is not None
    assert latest.id == second["boundary_id"]  # the newest by write order, not by id
    newest = await shared.store.latest_finished_assistant(session.id)
    assert newest is not None
    assert newest.id == lagging


async def test_item3_concurrent_rebuilds_count_every_boundary(shared: SharedStore) -> None:
    """Two manual rebuilds on two workers; A is held before its commit while B
    commits. ``state.rebuilds`` counts both. Before the fix A wrote back the session
    copy it read before its waits: one rebuild was lost."""
    session, _ = await seed_session(shared)
    a, b = await run_workers(
        shared,
        session.id,
        [
            {
                "steps": [{"op": "rebuild"}],
                "hooks": [{"method": "commit_rebuild", "signal": "a-commit", "wait": "b-done"}],
            },
            {
                "steps": [
                    {"op": "wait", "name": "a-commit"},
                    {"op": "rebuild"},
                    {"op": "signal", "name": "b-done"},
                ]
            },
        ],
    )
    assert step(a, "rebuild")["outcome"] == "rebuilt"
    assert step(b, "rebuild")["outcome"] == "rebuilt"
    stored = await shared.store.list_messages(session.id, agent=None)
    got = await shared.store.get_session(session.id)
    assert got is not None
    assert got.state.rebuilds == sum(m.is_boundary for m in stored) == 2
    assert len(got.state.freed_fractions) == 2


async def test_item3_threshold_mark_keeps_a_concurrent_rebuild(shared: SharedStore) -> None:
    """Worker A records a usage that crosses a writer threshold and is held right
    after reading the session; worker B rebuilds meanwhile. A then marks the
    threshold: the rebuild B counted stays counted. Before the fix A wrote back its
    old copy of the session (``rebuilds`` went back to 0)."""
    session, _ = await seed_session(shared)
    writer: dict[str, Any] = {"thresholds": ["20%"]}  # 18 000 tokens
    a, b = await run_workers(
        shared,
        session.id,
        [
            {
                "writer": writer,
                "steps": [{"op": "record", "tag": "a-t", "usage": 50_000}, {"op": "state"}],
                "hooks": [
                    {
                        "method": "get_session",
                        "when": "after",
                        "signal": "a-read",
                        "wait": "b-done",
                    }
                ],
            },
            {
                "writer": writer,
                "steps": [
                    {"op": "wait", "name": "a-read"},
                    {"op": "rebuild"},
                    {"op": "signal", "name": "b-done"},
                ],
            },
        ],
    )
    assert step(b, "rebuild")["outcome"] == "rebuilt"
    got = await shared.store.get_session(session.id)
    assert got is not None
    assert got.state.rebuilds == 1
    assert got.state.crossed_thresholds == [18_000]  # A's writer started: marked
    assert step(a, "state")["state"]["rebuilds"] == 1


async def test_item4_a_message_committed_after_the_rebuild_listed_the_tail_stays_live(
    shared: SharedStore,
) -> None:
    """Worker B builds an assistant message, worker A records two tool rounds (the
    second over the line) and rebuilds; right after A's rebuild listed the tail, B
    appends its message. The rebuild did not digest it, so it is sent live in every
    later request. Before the fix "digested" was the id range up to the newest
    digested id, which held B's older id: the message was neither sent, nor in the
    digest, nor in the checkpoint."""
    session, _ = await seed_session(shared)
    # The rebuild lists the tail with its other reads in one call where the store
    # offers it (mimo_ctx.store._reads), else with list_messages of every agent.
    listing: dict[str, Any] = (
        {"method": "read_for_rebuild"}
        if hasattr(shared.store, "read_for_rebuild")
        else {"method": "list_messages", "match": {"agent": None}}
    )
    a, b = await run_workers(
        shared,
        session.id,
        [
            {
                "steps": [
                    {"op": "wait", "name": "b-built"},
                    {"op": "record", "tag": "a-1", "usage": 60_000},
                    {"op": "record", "tag": "a-2", "usage": USABLE + 2000},
                    {"op": "prepare"},
                    {"op": "prepare"},
                ],
                "hooks": [{**listing, "when": "after", "signal": "a-listed", "wait": "b-appended"}],
            },
            {
                "steps": [
                    {"op": "build", "name": "late", "tag": "b-late", "usage": 1000},
                    {"op": "signal", "name": "b-built"},
                    {"op": "wait", "name": "a-listed"},
                    {"op": "append", "name": "late"},
                    {"op": "signal", "name": "b-appended"},
                    {"op": "prepare"},
                ],
            },
        ],
    )
    rebuilt = step(a, "prepare")
    assert rebuilt["outcome"] == "rebuilt"
    late = step(b, "append")["id"]
    boundary = await shared.store.get_message(rebuilt["boundary_id"])
    assert boundary is not None
    part = boundary.checkpoint_part
    assert part is not None
    assert part.digest_up_to is not None
    assert late < part.digest_up_to  # the scenario: inside the digested id range
    assert late in rebuilt["ids"]
    assert late in step(a, "prepare", 1)["ids"]
    assert late in step(b, "prepare")["ids"]


async def test_item4_one_process_a_message_built_before_a_rebuild_and_appended_after_is_sent(
    store: Store, tmp_path: Path
) -> None:
    """The one-process repro of item 4: build an assistant message, let a rebuild
    run, then append it. It is sent in the next request: the rebuild never listed
    it, so it was not digested, although its id lies inside the digested range."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        first = await fill_to_trigger(mw, session.id, rounds=22, final_usage=70_000)
        early = assistant_with_tool(session.id, at=now_ms(), usage=1000, seed=99)
        t = first[-1].time_created
        await mw.append(
            [
                assistant_with_tool(session.id, at=t + 1, usage=80_000, seed=23),
                assistant_with_tool(session.id, at=t + 2, usage=USABLE + 500, seed=24),
            ]
        )
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        boundary = await store.get_message(view.boundary_id or "")
        assert boundary is not None
        part = boundary.checkpoint_part
        assert part is not None
        assert part.digest_up_to is not None
        assert part.covered_up_to < early.id < part.digest_up_to  # inside the digested range
        await mw.append([early])
        after = await mw.prepare(session.id)
        assert early.id in [m.id for m in after.messages]


async def test_stress_the_open_round_kept_live_is_sent_even_when_its_id_is_older(
    store: Store, tmp_path: Path
) -> None:
    """Found by the stress test (4 PostgreSQL workers): the open tool round a
    mid-loop rebuild keeps live is the tail's last by listing order (time, then id),
    while "digested" is an id range. When the round's message got its id before an
    earlier-listed message did (made on another worker, or its time set before its
    id was drawn), its id falls inside the digested range: the request hid it and
    the digest did not list it (both were written before the listing, so write
    order does not tell them apart). The round stays live, and is not listed."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        first = await fill_to_trigger(mw, session.id, rounds=22, final_usage=70_000)
        t = first[-1].time_created
        # The open round is made (its id drawn) and written first, but lists last
        # (later time); the other message's usage, written after it, is the newest.
        open_round = assistant_with_tool(session.id, at=t + 5, usage=80_000, seed=50)
        earlier = assistant_with_tool(session.id, at=t + 4, usage=USABLE + 500, seed=51)
        assert open_round.id < earlier.id
        await mw.append([open_round])
        await mw.append([earlier])
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        boundary = await store.get_message(view.boundary_id or "")
        assert boundary is not None
        part = boundary.checkpoint_part
        assert part is not None
        assert part.digest_up_to == earlier.id  # the scenario: the round is inside the range
        sent = [m.id for m in view.messages]
        assert open_round.id in sent
        assert earlier.id not in sent  # digested, listed
        activity = body_text(boundary).split("# Recent activity", 1)[1]
        assert "src/m50.py" not in activity  # live, so not listed
        assert "src/m51.py" in activity
        after = await mw.prepare(session.id)
        assert open_round.id in [m.id for m in after.messages]


async def test_item5_processes_a_cancelled_reload_after_another_workers_rebuild_is_read_again(
    shared: SharedStore,
) -> None:
    """Worker B rebuilds; worker A's next prepare sees B's boundary in the change
    feed and reloads its window, and A's turn timeout cancels it inside that
    reload. A's next prepare sends B's rebuilt request. Before the fix A's window
    had already taken the new change-feed position: every later prepare sent the
    pre-rebuild request and each rebuild answered ``already-recovered``."""
    session, _ = await seed_session(shared, final_usage=USABLE - 5000)
    a, b = await run_workers(
        shared,
        session.id,
        [
            {
                "steps": [
                    {"op": "prepare"},
                    {"op": "signal", "name": "a-ready"},
                    {"op": "wait", "name": "b-rebuilt"},
                    {"op": "signal", "name": "arm"},
                    {"op": "prepare", "timeout": 1.0},
                    {"op": "wait", "name": "a-hung"},  # it hung in the reload, not elsewhere
                    {"op": "prepare"},
                    {"op": "prepare"},
                ],
                # The reload reads the newest boundary first: it hangs there.
                "hooks": [
                    {
                        "method": "latest_boundary",
                        "armed_by": "arm",
                        "signal": "a-hung",
                        "wait": "never",
                    }
                ],
            },
            {
                "steps": [
                    {"op": "wait", "name": "a-ready"},
                    {"op": "rebuild"},
                    {"op": "signal", "name": "b-rebuilt"},
                ]
            },
        ],
    )
    rebuilt = step(b, "rebuild")
    assert rebuilt["outcome"] == "rebuilt"
    before = step(a, "prepare", 0)
    assert before["boundary_id"] is None
    assert step(a, "prepare", 1)["cancelled"]  # cancelled inside the reload
    for nth in (2, 3):
        view = step(a, "prepare", nth)
        assert view["boundary_id"] == rebuilt["boundary_id"]
        assert view["outcome"] is None
        assert view["tokens"] < USABLE
    stored = await shared.store.list_messages(session.id, agent=None)
    assert [m.id for m in _boundaries(stored)] == [rebuilt["boundary_id"]]


async def test_item9_processes_a_late_overflow_of_one_usage_retries_on_the_rebuild(
    shared: SharedStore,
) -> None:
    """Workers A and B send requests built on one usage; both overflow at the
    provider. A rebuilds and is held right after its commit while B's overflow
    arrives: B is answered "retry" (on A's rebuild), runs no rebuild of its own,
    and both next requests are A's rebuilt one. Before the fix the late caller
    got ``ContextOverflowError``."""
    session, _ = await seed_session(shared, final_usage=USABLE - 5000)
    a, b = await run_workers(
        shared,
        session.id,
        [
            {
                "steps": [
                    {"op": "prepare"},
                    {"op": "signal", "name": "a-prepared"},
                    {"op": "wait", "name": "b-prepared"},
                    {"op": "overflow", "task_view": True},
                    {"op": "prepare"},
                ],
                "hooks": [
                    {
                        "method": "commit_rebuild",
                        "when": "after",
                        "signal": "a-committed",
                        "wait": "b-overflowed",
                    }
                ],
            },
            {
                "steps": [
                    {"op": "prepare"},
                    {"op": "signal", "name": "b-prepared"},
                    {"op": "wait", "name": "a-committed"},
                    {"op": "overflow", "task_view": True},
                    {"op": "signal", "name": "b-overflowed"},
                    {"op": "prepare"},
                ]
            },
        ],
    )
    assert step(a, "prepare", 0)["boundary_id"] is None
    assert step(b, "prepare", 0)["boundary_id"] is None
    assert step(a, "overflow")["retry"] is True
    assert step(b, "overflow")["retry"] is True
    stored = await shared.store.list_messages(session.id, agent=None)
    (boundary,) = _boundaries(stored)
    for report in (a, b):
        retry = step(report, "prepare", 1)
        assert retry["boundary_id"] == boundary.id
        assert retry["tokens"] < USABLE
    got = await shared.store.get_session(session.id)
    assert got is not None
    assert got.state.rebuilds == 1


async def test_item9_processes_an_overflow_of_the_rebuilt_request_does_not_rebuild_again(
    shared: SharedStore,
) -> None:
    """Worker A rebuilds at the trigger line; worker B's next request is built on
    A's boundary and overflows at the provider. B runs no rebuild (its commit could
    only be refused: the usage is recovered): it is allowed one retry, then refused.
    Before the fix B ran the whole rebuild (writer wait, render, refused commit)
    first."""
    session, _ = await seed_session(shared)
    a, b = await run_workers(
        shared,
        session.id,
        [
            {"steps": [{"op": "prepare"}, {"op": "signal", "name": "a-rebuilt"}]},
            {
                "steps": [
                    {"op": "wait", "name": "a-rebuilt"},
                    {"op": "prepare"},
                    {"op": "overflow", "task_view": True},
                    {"op": "overflow", "task_view": True},
                ]
            },
        ],
    )
    rebuilt = step(a, "prepare")
    assert rebuilt["outcome"] == "rebuilt"
    on_it = step(b, "prepare")
    assert on_it["boundary_id"] == rebuilt["boundary_id"]
    assert on_it["outcome"] is None
    assert step(b, "overflow", 0)["retry"] is True
    assert step(b, "overflow", 1)["retry"] == "raised"
    assert b["rebuild_runs"] == 0
    stored = await shared.store.list_messages(session.id, agent=None)
    assert [m.id for m in _boundaries(stored)] == [rebuilt["boundary_id"]]
