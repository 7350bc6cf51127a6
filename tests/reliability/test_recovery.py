"""Recovery at the edges (issue 17): cancellation inside the post-commit reload
(item 5), concurrent overflows of one usage (item 9) and a manual ``/rebuild``
right after a tool round (item 14).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from mimo_ctx.errors import ContextOverflowError
from mimo_ctx.events import UsagePending
from mimo_ctx.messages import Message, TextPart, TokenUsage
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.store import Store
from mimo_ctx.testing import FakeOverflowError

from .conftest import LIMITS, SYSTEM, USABLE, assistant_with_tool, fill_to_trigger, now_ms, recorder


def _hang_once(store: Store, method: str) -> list[bool]:
    """Make the next call of ``store.<method>`` (once armed) hang until cancelled."""
    armed = [False]
    original: Callable[..., Awaitable[Any]] = getattr(store, method)

    async def hanging(*args: Any, **kwargs: Any) -> Any:
        if armed[0]:
            armed[0] = False
            await anyio.sleep_forever()
        return await original(*args, **kwargs)

    setattr(store, method, hanging)
    return armed


async def test_item5_a_cancelled_reload_after_another_workers_rebuild_is_read_again(
    store: Store, tmp_path: Path
) -> None:
    """Worker B rebuilds; worker A's next prepare sees the new boundary in the change
    feed and reloads its window, and the host's turn timeout cancels it in the middle
    of that reload. A's next prepare sends the rebuilt request. Before the fix the
    window had already taken the new change-feed position: every later prepare sent
    the pre-rebuild request (over the trigger line) and each rebuild it tried
    answered ``already-recovered``."""
    memory_root = tmp_path / "mem"
    async with (
        ContextMiddleware(store, memory_root, model=LIMITS) as a,
        ContextMiddleware(store, memory_root, model=LIMITS) as b,
    ):
        session = await a.open_session(system=SYSTEM)
        await fill_to_trigger(a, session.id, final_usage=USABLE - 5000)
        before = await a.prepare(session.id)  # A's window is loaded, below the line
        assert before.rebuild is None
        assert before.boundary_id is None
        rebuilt = await b.rebuild(session.id)
        assert rebuilt.outcome == "rebuilt"

        armed = _hang_once(store, "latest_boundary")  # called by the window's reload
        armed[0] = True
        with anyio.move_on_after(0.5) as scope:
            await a.prepare(session.id)
        assert scope.cancelled_caught
        assert not armed[0]  # the hang was reached: cancelled inside the reload

        view = await a.prepare(session.id)
        assert view.boundary_id == rebuilt.boundary_id
        assert view.rebuild is None
        assert view.tokens < before.tokens
        assert view.tokens < USABLE


async def test_item5_a_cancelled_post_commit_refresh_keeps_the_rebuilt_window(
    store: Store, tmp_path: Path
) -> None:
    """The rebuild commits, then the host's timeout cancels the change-feed read
    that follows it: the next prepare sends the rebuilt request, with no second
    rebuild."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        original = store.commit_rebuild
        armed = _hang_once(store, "changes_since")

        async def commit(*args: Any, **kwargs: Any) -> bool:
            committed = await original(*args, **kwargs)
            armed[0] = committed
            return committed

        store.commit_rebuild = commit
        with anyio.move_on_after(2) as scope:
            await mw.prepare(session.id)
        assert scope.cancelled_caught
        assert not armed[0]
        boundaries = [m for m in await store.list_messages(session.id) if m.is_boundary]
        assert len(boundaries) == 1
        view = await mw.prepare(session.id)
        assert view.rebuild is None
        assert view.boundary_id == boundaries[0].id
        assert view.tokens < USABLE
        assert [m.id for m in await store.list_messages(session.id) if m.is_boundary] == [
            boundaries[0].id
        ]


# ------------------------------------------------ item 9: concurrent overflows


def _answer(session_id: str, at: int, usage: int) -> Message:
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=at,
        time_completed=at,
        finish="stop",
        usage=TokenUsage(input=usage),
        parts=[TextPart(text="done")],
    )


async def test_item9_concurrent_overflows_of_one_usage_all_retry_on_one_rebuild(
    store: Store, tmp_path: Path
) -> None:
    """60 concurrent turns of one session, below the trigger line, each sent on the
    pre-rebuild context, all overflow at the provider. The first caller rebuilds;
    the others wait for it and retry on its result: every turn succeeds, one
    boundary. Before the fix all but the first raised ``ContextOverflowError``."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=USABLE - 5000)
        first_views = anyio.Event()
        arrived: list[str | None] = []

        async def call(view: RequestView) -> Message:
            if view.boundary_id is None:
                arrived.append(view.boundary_id)
                if len(arrived) == 60:
                    first_views.set()
                await first_views.wait()  # all 60 requests were built before any rebuild
                raise FakeOverflowError(view.tokens + 20_000, LIMITS.context_window)
            return _answer(session.id, now_ms(), view.tokens + 100)

        outcomes: list[str] = []

        async def one() -> None:
            try:
                await mw.turn(session.id, call)
                outcomes.append("ok")
            except ContextOverflowError:
                outcomes.append("overflow")

        async with anyio.create_task_group() as tg:
            for _ in range(60):
                tg.start_soon(one)
        assert outcomes.count("ok") == 60, outcomes.count("overflow")
        boundaries = [m for m in await store.list_messages(session.id) if m.is_boundary]
        assert len(boundaries) == 1


async def test_item9_an_overflow_of_the_rebuilt_request_does_not_run_the_rebuild_again(
    store: Store, tmp_path: Path
) -> None:
    """The trigger line rebuilt the context; the rebuilt request overflows at the
    provider. ``on_error`` does not run the rebuild again (its commit could only be
    refused: the usage is recovered): it allows one retry of the request, then
    refuses. Before the fix the whole rebuild (writer wait, render, commit attempt)
    ran first."""
    events, on_event = recorder()
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS, on_event=on_event) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        pending = sum(isinstance(e, UsagePending) for e in events)
        writes = len(await store.list_messages(session.id, agent=None))
        # The task's own last view stands in for the request, then the explicit one.
        assert await mw.on_error(session.id, FakeOverflowError(120_000, 100_000)) is True
        assert sum(isinstance(e, UsagePending) for e in events) == pending
        with pytest.raises(ContextOverflowError, match="same usage"):
            await mw.on_error(session.id, FakeOverflowError(120_000, 100_000), view=view)
        assert sum(isinstance(e, UsagePending) for e in events) == pending
        assert len(await store.list_messages(session.id, agent=None)) == writes


async def test_item9_a_request_built_before_another_workers_rebuild_retries(
    store: Store, tmp_path: Path
) -> None:
    """Worker A sent a request on the old context; worker B rebuilt meanwhile. A's
    overflow is answered "retry" (on B's rebuild) without a rebuild of its own; A's
    retry, built on B's boundary, overflowing again is refused."""
    memory_root = tmp_path / "mem"
    async with (
        ContextMiddleware(store, memory_root, model=LIMITS) as a,
        ContextMiddleware(store, memory_root, model=LIMITS) as b,
    ):
        session = await a.open_session(system=SYSTEM)
        await fill_to_trigger(a, session.id, final_usage=USABLE - 5000)
        old = await a.prepare(session.id)
        rebuilt = await b.rebuild(session.id)
        assert rebuilt.outcome == "rebuilt"
        assert await a.on_error(session.id, FakeOverflowError(1, 1), view=old) is True
        retry = await a.prepare(session.id)
        assert retry.boundary_id == rebuilt.boundary_id
        assert await a.on_error(session.id, FakeOverflowError(1, 1), view=retry) is True
        with pytest.raises(ContextOverflowError):
            await a.on_error(session.id, FakeOverflowError(1, 1), view=retry)
        assert sum(m.is_boundary for m in await store.list_messages(session.id)) == 1


# ------------------------------------- item 14: manual /rebuild after a tool round


async def test_item14_manual_rebuild_right_after_a_tool_round_folds_the_whole_tail(
    store: Store, tmp_path: Path
) -> None:
    """The session's last message is an assistant tool round (``tool-calls``). An
    automatic rebuild there keeps that open round live; a manual ``/rebuild`` (idle,
    R7.4) folds it into the digest with the rest of the tail. Before the fix the
    manual rebuild kept it live too."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        history = await fill_to_trigger(mw, session.id, final_usage=USABLE - 5000)
        last_round = history[-1]
        assert last_round.finish == "tool-calls"
        report = await mw.rebuild(session.id)
        assert report.outcome == "rebuilt"
        boundary = await store.get_message(report.boundary_id or "")
        assert boundary is not None
        part = boundary.checkpoint_part
        assert part is not None
        assert part.digest_up_to == last_round.id
        view = await mw.prepare(session.id)
        assert last_round.id not in [m.id for m in view.messages]
        assert all(m.role == "user" for m in view.messages)


async def test_stress_an_overflow_of_the_retry_after_a_fresh_usage_is_recovered_again(
    store: Store, tmp_path: Path
) -> None:
    """Found by the multi-worker stress test: turns of one session run at once (on
    several workers), and each reports the usage of its own, older request. A turn
    overflows, ``on_error`` rebuilds, the retry is built on that rebuild, and while
    it is in flight another turn's answer is stored with a usage under the line
    (its request predates the growth) next to large tool results; the retry
    overflows too. That usage is new and not recovered: ``on_error`` rebuilds for
    it and the turn succeeds. Before the fix ``turn()`` gave up after one retry with
    ``ContextOverflowError`` without asking ``on_error``."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=USABLE - 5000)
        calls: list[str | None] = []

        async def call(view: RequestView) -> Message:
            calls.append(view.boundary_id)
            if len(calls) == 1:
                raise FakeOverflowError(view.tokens + 20_000, LIMITS.context_window)
            if len(calls) == 2:
                t = now_ms()
                await mw.append(
                    [
                        assistant_with_tool(
                            session.id, at=t + i, usage=40_000 + i, tokens=6000, seed=70 + i
                        )
                        for i in range(3)
                    ]
                )
                raise FakeOverflowError(view.tokens + 20_000, LIMITS.context_window)
            return _answer(session.id, now_ms(), view.tokens + 100)

        reply = await mw.turn(session.id, call)
        assert reply.finish == "stop"
        assert len(calls) == 3
        boundaries = [m.id for m in await store.list_messages(session.id) if m.is_boundary]
        assert calls == [None, boundaries[0], boundaries[1]]
        assert len(boundaries) == 2


async def test_stress_turn_retries_are_bounded_while_fresh_usages_keep_arriving(
    store: Store, tmp_path: Path
) -> None:
    """Every retry overflows again and, each time, another turn's answer with a
    fresh usage was stored meanwhile, so ``on_error`` would keep allowing retries:
    ``turn()`` stops after three retries with ``ContextOverflowError``."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=USABLE - 5000)
        calls: list[str | None] = []

        async def call(view: RequestView) -> Message:
            calls.append(view.boundary_id)
            t = now_ms()
            await mw.append(
                [assistant_with_tool(session.id, at=t, usage=40_000, tokens=500, seed=len(calls))]
            )
            raise FakeOverflowError(view.tokens + 20_000, LIMITS.context_window)

        with pytest.raises(ContextOverflowError, match="after 3 retries") as info:
            await mw.turn(session.id, call)
        assert isinstance(info.value.__cause__, FakeOverflowError)
        assert len(calls) == 4
