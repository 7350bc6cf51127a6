"""The public face of ``ContextMiddleware``: read-only settings and the writer controls."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo_ctx.config import RebuildConfig
from mimo_ctx.errors import MimoCtxError
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import InMemoryStore, Session
from mimo_ctx.testing import ScriptedModel, tool_round
from mimo_ctx.triggers import ModelLimits

LIMITS = ModelLimits(100_000, input_limit=100_000)

_SETTINGS = (
    "store",
    "config",
    "limits",
    "layout",
    "memory_index",
    "events",
    "counter",
    "writer",
    "usable",
    "thresholds",
)


@pytest.mark.parametrize("name", _SETTINGS)
def test_settings_are_read_only(name: str, tmp_path: Path) -> None:
    mw = ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS)
    value = getattr(mw, name)
    with pytest.raises(AttributeError):
        setattr(mw, name, value)


def test_settings_are_what_it_was_built_with(tmp_path: Path) -> None:
    store = InMemoryStore()
    config = RebuildConfig()
    mw = ContextMiddleware(store, tmp_path / "mem", model=LIMITS, config=config)
    assert mw.store is store
    assert mw.config is config
    assert mw.limits is LIMITS
    assert mw.layout.root == tmp_path / "mem"
    assert mw.usable == 90_000
    assert mw.thresholds == sorted(mw.thresholds)
    # A copy: changing it changes nothing inside.
    mw.thresholds.append(1)
    assert 1 not in mw.thresholds


async def test_start_writer_needs_a_running_middleware(tmp_path: Path) -> None:
    store = InMemoryStore()
    mw = ContextMiddleware(store, tmp_path / "mem", model=LIMITS)
    session = Session(time_created=0)
    await store.create_session(session)
    with pytest.raises(MimoCtxError, match="running middleware"):
        await mw.start_writer(session.id)


async def test_start_writer_then_wait_for_it(tmp_path: Path) -> None:
    """A host can checkpoint when it chooses; the wait reports how the writer ended."""
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system="sys")
        assert not mw.writer_running(session.id)
        assert await mw.wait_for_writer(session.id, timeout=5) == "idle"
        await mw.add_user_message(session.id, "Read the files.")
        model = ScriptedModel([tool_round("read", 500, seed=i, path=f"f{i}.py") for i in range(6)])
        for _ in range(6):
            await mw.turn(session.id, model.complete)
        assert not mw.writer_running(session.id)  # far below the first usage threshold
        assert await mw.start_writer(session.id, reason="idle") == "started"
        assert mw.writer_running(session.id)
        assert await mw.wait_for_writer(session.id, timeout=60) == "finished"
        assert not mw.writer_running(session.id)
        assert await mw.store.get_watermark(session.id) is not None
        assert mw.layout.checkpoint_path(session.id).is_file()
