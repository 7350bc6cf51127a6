"""The hot path's incremental view equals a full recomputation (SPEC R8, A10).

``prepare()`` extends the last view in O(new messages) while messages are only
appended; anything else (updates, back-dated messages, split tool results that
answer earlier calls, new boundaries, failed assistant messages) rebuilds it.
Randomised sessions check, after every step, that the view and its token count
are exactly what the send rules give over the whole window.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mimo_ctx._window import LiveSession, Windows
from mimo_ctx.compaction import build_boundary_message
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import (
    Message,
    MessageFailure,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStatePending,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.reminders import append_per_turn_reminder, per_turn_reminder, per_turn_reminder_part
from mimo_ctx.store import InMemoryStore, SQLiteStore, Store
from mimo_ctx.store.base import Session
from mimo_ctx.tokens import estimate_message_tokens, estimate_part_tokens
from mimo_ctx.triggers import ModelLimits


async def _scenario(seed: int, store: Store, root: Path, *, memory: bool = False) -> None:
    rng = random.Random(seed)
    async with ContextMiddleware(store, root, model=ModelLimits(10_000_000)) as mw:
        session = await mw.open_session(system="sys")
        sid = session.id
        directory = MemoryLayout(root).session_dir(sid)
        if memory:  # the per-turn reminder goes on the last user message (R8.3)
            directory.mkdir(parents=True)
            (directory / "checkpoint.md").write_text("Topic: t\n", encoding="utf-8")
        pending: list[str] = []
        messages: list[Message] = []
        now = 1_700_000_000_000
        for step in range(50):
            op = rng.random()
            now += rng.randint(0, 3)
            # Sometimes an older creation time (imports, other workers).
            t = now if rng.random() > 0.1 else now - rng.randint(1, 50)
            if op < 0.25:
                message = Message(
                    session_id=sid, role="user", time_created=t, parts=[TextPart(text=f"u{step}")]
                )
                await mw.append([message])
                messages.append(message)
            elif op < 0.5:
                call = f"c{step}"
                state: ToolStateCompleted | ToolStatePending
                if rng.random() < 0.6:
                    state = ToolStateCompleted(input={"a": step}, output="x" * rng.randint(1, 50))
                else:
                    state = ToolStatePending(input={})
                    pending.append(call)
                message = Message(
                    session_id=sid,
                    role="assistant",
                    time_created=t,
                    finish="tool-calls" if rng.random() < 0.7 else None,
                    usage=TokenUsage(input=10),
                    parts=[
                        TextPart(text=f"a{step}"),
                        ToolPart(call_id=call, tool=rng.choice(["read", "task"]), state=state),
                    ],
                )
                await mw.append([message])
                messages.append(message)
            elif op < 0.65 and pending:
                call = pending.pop(rng.randrange(len(pending)))
                message = Message(
                    session_id=sid,
                    role="tool",
                    time_created=t,
                    parts=[ToolResultPart(call_id=call, tool="read", output="r")],
                )
                await mw.append([message])
                messages.append(message)
            elif op < 0.75 and messages:
                old = rng.choice(messages)
                new = old.model_copy(update={"parts": [*old.parts, TextPart(text="edit")]})
                await store.update_messages([new])
                messages[messages.index(old)] = new
            elif op < 0.8 and len(messages) > 3:
                ordered = sorted(messages, key=lambda m: (m.time_created, m.id))
                watermark = ordered[rng.randrange(len(ordered) - 1)]
                digest = max(m.id for m in messages) if rng.random() < 0.5 else None
                boundary = build_boundary_message(
                    watermark=watermark,
                    digest_up_to=digest,
                    directory="d",
                    number=1,
                    index_text="i",
                    body="body",
                    actors_text="a",
                )
                await store.commit_rebuild(sid, usage_key=f"k{step}", boundary=boundary, updated=[])
                messages.append(boundary)
            elif op < 0.9:
                message = Message(
                    session_id=sid,
                    role="assistant",
                    time_created=t,
                    finish="stop",
                    error=MessageFailure(name="x", aborted=rng.random() < 0.5),
                    parts=[TextPart(text="err")],
                )
                await mw.append([message])
                messages.append(message)
            view = await mw.prepare(sid)
            state_ = mw._sessions[sid]  # pyright: ignore[reportPrivateUsage]
            window = state_.windows["main"]
            full, tokens = Windows.full_view(window, window.boundary)
            if memory:
                full = append_per_turn_reminder(full, str(directory))
                # Counted afresh: copies carry no cached estimate.
                tokens = sum(estimate_message_tokens(Message(**m.model_dump())) for m in full)
                # The same messages and parts; the reminder part (made once per
                # session) has its own id.
                assert [_shape(m) for m in view.messages] == [_shape(m) for m in full], (
                    seed,
                    step,
                )
            else:
                assert [m.model_dump() for m in view.messages] == [m.model_dump() for m in full], (
                    seed,
                    step,
                )
            assert view.tokens == tokens + (state_.prefix_tokens or 0), (seed, step)


def _shape(message: Message) -> tuple[str, list[tuple[str, str | None, bool]]]:
    """A message's id and, per part, its type, text and whether it is synthetic."""
    return message.id, [
        (p.type, getattr(p, "text", None), bool(getattr(p, "synthetic", False)))
        for p in message.parts
    ]


@pytest.mark.parametrize("seed", range(40))
async def test_r8_incremental_view_matches_full_recompute_memory(seed: int, tmp_path: Path) -> None:
    await _scenario(seed, InMemoryStore(), tmp_path / "mem")


@pytest.mark.parametrize("seed", range(4))
async def test_r8_incremental_view_matches_full_recompute_sqlite(seed: int, tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        await _scenario(1000 + seed, store, tmp_path / "mem")


@pytest.mark.parametrize("seed", range(12))
async def test_r8_3_view_with_the_per_turn_reminder_matches_full_recompute(
    seed: int, tmp_path: Path
) -> None:
    """The reminder's copy of the last user message is counted as its source plus the
    reminder part; the whole view's tokens equal a fresh count of every message."""
    if seed % 3:
        await _scenario(2000 + seed, InMemoryStore(), tmp_path / "mem", memory=True)
    else:
        async with SQLiteStore(tmp_path / "s.db") as store:
            await _scenario(2000 + seed, store, tmp_path / "mem", memory=True)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_r8_window_adopted_after_a_rebuild_equals_a_reload(kind: str, tmp_path: Path) -> None:
    """After a rebuild the window is built from what the rebuild read, not reloaded:
    it must hold exactly what a reload from the store gives."""
    from mimo_ctx.testing import ScriptedModel, tool_round

    store: Store = (
        InMemoryStore() if kind == "memory" else await SQLiteStore.open(tmp_path / "s.db")
    )
    model = ScriptedModel([tool_round("read", 4000, seed=i, file_path="q") for i in range(30)])
    limits = ModelLimits(100_000, input_limit=100_000)
    async with ContextMiddleware(store, tmp_path / "mem", model=limits) as mw:
        session = await mw.open_session(system="sys")
        await mw.add_user_message(session.id, "Go.")
        for _ in range(30):
            await mw.turn(session.id, model.complete)
            await mw.wait_for_writer(session.id, timeout=1.0)
            if model.requests[-1].rebuild is not None:
                break
        assert model.requests[-1].rebuild is not None
        # record() does not read back what it wrote: the window takes the last reply
        # from the change feed at the next refresh (what prepare() does first).
        state = mw._sessions[session.id]  # pyright: ignore[reportPrivateUsage]
        adopted = await mw._windows.refresh(session.id, state, "main")  # pyright: ignore[reportPrivateUsage]
        fresh = await mw._windows.load(session.id, "main")  # pyright: ignore[reportPrivateUsage]
        assert adopted.boundary is not None
        assert fresh.boundary is not None
        assert adopted.boundary.id == fresh.boundary.id
        assert adopted.start == fresh.start
        assert [m.model_dump() for m in adopted.messages] == [
            m.model_dump() for m in fresh.messages
        ]
        assert adopted.keys == fresh.keys
        assert adopted.last_finished is not None
        assert fresh.last_finished is not None
        assert adopted.last_finished.id == fresh.last_finished.id
    await store.aclose()


async def test_r8_3_the_reminder_part_is_made_once_per_session(tmp_path: Path) -> None:
    """Every new user message's copy carries the same reminder part, naming the
    session's memory directory; the stored messages never carry it."""
    root = tmp_path / "mem"
    async with ContextMiddleware(InMemoryStore(), root, model=ModelLimits(10_000_000)) as mw:
        sid = (await mw.open_session(system="sys")).id
        directory = MemoryLayout(root).session_dir(sid)
        directory.mkdir(parents=True)
        (directory / "checkpoint.md").write_text("Topic: t\n", encoding="utf-8")
        parts: list[TextPart] = []
        for turn in range(3):
            user = Message(
                session_id=sid,
                role="user",
                time_created=1_700_000_000_000 + turn,
                parts=[TextPart(text=f"u{turn}")],
            )
            await mw.append([user])
            view = await mw.prepare(sid)
            last = view.messages[-1]
            assert last.id == user.id
            assert next(p.text for p in last.parts if isinstance(p, TextPart)) == f"u{turn}"
            reminder = last.parts[-1]
            assert isinstance(reminder, TextPart)
            parts.append(reminder)
            stored = await mw.store.get_message(user.id)
            assert stored is not None
            assert len(stored.parts) == 1
        assert parts[0] is parts[1] is parts[2]
        assert parts[0].synthetic
        assert parts[0].text == per_turn_reminder(str(directory))


async def test_r8_3_the_rebuild_counts_the_reminder_part_the_views_append(tmp_path: Path) -> None:
    """One reminder part per session serves the views and the rebuild's count of the
    request after the insert: made on first use, then handed back as it is."""
    layout = MemoryLayout(tmp_path / "mem")
    store = InMemoryStore()
    session = Session(project_id="p", time_created=1)
    await store.create_session(session)

    async def read_session(session_id: str) -> Session:
        found = await store.get_session(session_id)
        assert found is not None
        return found

    windows = Windows(store, layout, read_session)
    state = LiveSession()
    assert state.reminder_part is None
    first = windows.reminder_part(session.id, state)
    part, tokens = first
    expected = per_turn_reminder_part(str(layout.session_dir(session.id)))
    # (Each part made has its own id; what it says and what it counts are the same.)
    assert (part.text, part.synthetic) == (expected.text, expected.synthetic)
    assert tokens == estimate_part_tokens(expected)
    assert state.reminder_part is first
    assert windows.reminder_part(session.id, state) is first
    # Another session's state gets its own part (it names another directory).
    other = Session(project_id="p", time_created=2)
    await store.create_session(other)
    other_part, _ = windows.reminder_part(other.id, LiveSession())
    assert other_part.text == per_turn_reminder(str(layout.session_dir(other.id)))
    assert other_part.text != part.text
