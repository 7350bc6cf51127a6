"""Recovery at the edges (issue 17): cancellation inside the post-commit reload
(item 5), concurrent overflows of one usage (item 9) and a manual ``/rebuild``
right after a tool round (item 14).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import Store

from .conftest import LIMITS, SYSTEM, USABLE, fill_to_trigger


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

        store.commit_rebuild = commit  # type: ignore[method-assign]
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
