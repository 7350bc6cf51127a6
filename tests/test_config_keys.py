"""No dead configuration key (SPEC R5.10 beyond, issue 17 item 13).

The test walks every field of :class:`RebuildConfig` (nested models included)
and, for each, runs a probe through the running middleware with the default
value and with a changed one: the observed behaviour must differ. A key added
without a probe fails ``test_every_key_has_a_probe``; a key whose value no code
reads fails its probe.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
from pydantic import BaseModel

import mimo_ctx._heap as heap
from mimo_ctx import (
    Actor,
    CheckpointDraft,
    ContextMiddleware,
    InMemoryStore,
    InMemoryWriterLease,
    Message,
    ModelLimits,
    OfflineCheckpointWriter,
    RebuildConfig,
    Task,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
    WriterFinished,
    WriterRequest,
)
from mimo_ctx.hooks import HostSection, RebuildContext
from mimo_ctx.testing import filler_text
from mimo_ctx.view import apply_send_rules

LIMITS = ModelLimits(100_000, input_limit=100_000)  # usable 90_000
USABLE = 90_000
T0 = 1_700_000_000_000

Observe = Callable[[RebuildConfig, Path], Awaitable[object]]


def config_keys(model: type[BaseModel] = RebuildConfig, prefix: str = "") -> list[str]:
    """Every leaf key of the configuration, dotted, as a config file spells it."""
    keys: list[str] = []
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(config_keys(annotation, key + "."))
        else:
            keys.append(key)
    return keys


def with_key(key: str, value: object) -> RebuildConfig:
    """The default configuration with one dotted key changed."""
    path = key.split(".")
    data: dict[str, Any] = {}
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return RebuildConfig.model_validate(data)


# --------------------------------------------------------------------------- #
# Writers
# --------------------------------------------------------------------------- #

_SECTION_TITLES = (
    "Active intent",
    "Next concrete action",
    "Directives",
    "Task tree",
    "Current work",
    "Files and code sections",
    "Discovered knowledge",
    "Errors and fixes",
    "Live resources",
    "Design decisions and discussion outcomes",
    "Open notes",
)


class RichWriter:
    """Writes a checkpoint whose eleven sections all hold ~400 tokens."""

    name = "rich"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        lines = ["Topic: config probe", ""]
        for number, title in enumerate(_SECTION_TITLES, start=1):
            lines += [f"## {number}. {title}", "_about it_", filler_text(400, seed=number), ""]
        return CheckpointDraft(text="\n".join(lines))


class HangingWriter:
    """Never finishes (until cancelled at shutdown)."""

    name = "hanging"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class SwitchWriter:
    """The offline writer until ``hang`` is set."""

    name = "switch"

    def __init__(self) -> None:
        self.hang = False

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        if self.hang:
            await anyio.sleep_forever()
        return OfflineCheckpointWriter().build(request)


class RecordingLease(InMemoryWriterLease):
    """Records the lifetime every acquisition asked for."""

    def __init__(self, store: InMemoryStore) -> None:
        super().__init__(store)
        self.ttls: list[float] = []

    async def acquire(self, session_id: str, owner: str, ttl: float) -> bool:
        self.ttls.append(ttl)
        return await super().acquire(session_id, owner, ttl)


# --------------------------------------------------------------------------- #
# Session builders
# --------------------------------------------------------------------------- #


def _tool_round(session_id: str, i: int, *, usage: int, tool: str = "read") -> Message:
    at = T0 + 100 + i
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=at,
        time_completed=at,
        finish="tool-calls",
        usage=TokenUsage(input=usage),
        parts=[
            TextPart(text=f"Step {i}: " + filler_text(80, seed=i)),
            ToolPart(
                call_id=f"call_{i}",
                tool=tool,
                state=ToolStateCompleted(
                    input={"file_path": f"src/pkg/module_{i}/" + "deep/" * 30 + "file.py"},
                    output=filler_text(700, seed=i),
                    time=ToolTime(start=at, end=at),
                ),
            ),
        ],
    )


def _user(session_id: str, text: str, at: int) -> Message:
    return Message(session_id=session_id, role="user", time_created=at, parts=[TextPart(text=text)])


async def _fill_sources(mw: ContextMiddleware, session_id: str) -> None:
    """Tasks, actors, both MEMORY.md files, notes and memory files, all sizeable."""
    store, layout = mw.store, mw.layout
    for i in range(12):
        await store.upsert_task(
            Task(
                id=f"T{i + 1}",
                session_id=session_id,
                summary=f"task {i}: " + filler_text(30, seed=i),
                time_created=T0,
                time_updated=T0,
            )
        )
    for i in range(8):
        await store.upsert_actor(
            Actor(
                id=f"act_{i}",
                session_id=session_id,
                agent="explore",
                description=filler_text(20, seed=i),
                status="running",
                time_created=T0,
                time_last_activity=T0,
            )
        )
    files = {
        layout.project_memory_path("p"): "# Project\n\n## Rules\n" + filler_text(500, seed=1),
        layout.global_memory_path(): "# Global\n\n## Rules\n" + filler_text(500, seed=2),
        layout.notes_path(session_id): filler_text(500, seed=3),
    }
    for i in range(10):
        files[layout.session_dir(session_id) / f"topic-{i}.md"] = f"# topic {i}\n\nbody\n"
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


async def _history(mw: ContextMiddleware, session_id: str, *, rounds: int, start: int = 0) -> None:
    messages = [
        _user(
            session_id, "Please refactor everything. " + filler_text(1200, seed=start), T0 + start
        ),
        _user(session_id, "Also keep the tests green. " + filler_text(200, seed=9), T0 + start + 1),
    ]
    for i in range(rounds):
        usage = USABLE + 500 if i == rounds - 1 else 1_000 + i
        tool = "bash" if i % 2 else "read"
        messages.append(_tool_round(session_id, start + i, usage=usage, tool=tool))
    await mw.append(messages)


@dataclass(frozen=True)
class Fingerprint:
    outcome: str | None
    compacted: int
    body: str
    second_outcome: str | None
    auto_disabled: bool


async def rebuild_fingerprint(config: RebuildConfig, root: Path) -> Fingerprint:
    """Two automatic rebuilds of a session rich in every source the body reads."""
    store = InMemoryStore()
    async with ContextMiddleware(
        store, root / "mem", model=LIMITS, config=config, writer=RichWriter()
    ) as mw:
        session = await mw.open_session(system="You are a coding agent.", project_id="p")
        await _fill_sources(mw, session.id)
        await _history(mw, session.id, rounds=24)
        first = (await mw.prepare(session.id)).rebuild
        await _history(mw, session.id, rounds=24, start=1_000)
        second = (await mw.prepare(session.id)).rebuild
        boundary = await store.latest_boundary(session.id)
        stored = await mw.store.get_session(session.id)
        assert stored is not None
        state = stored.state
    body = ""
    if first is not None and first.boundary_id is not None:
        stored = await store.get_message(first.boundary_id)
        assert stored is not None
        body = "\n".join(p.text for p in stored.parts if isinstance(p, TextPart))
    assert boundary is not None
    return Fingerprint(
        outcome=first.outcome if first else None,
        compacted=first.compacted_results if first else 0,
        body=body,
        second_outcome=second.outcome if second else None,
        auto_disabled=state.auto_rebuild_disabled,
    )


async def limits_figures(config: RebuildConfig, root: Path) -> object:
    """The trigger line and the writer thresholds the middleware runs with."""
    async with ContextMiddleware(
        InMemoryStore(), root / "mem", model=ModelLimits(200_000), config=config
    ) as mw:
        return mw.usable, mw.thresholds


async def writer_watermark(config: RebuildConfig, root: Path) -> object:
    """Where the writer puts the watermark, counted from the end, in two sessions.

    Messages of ~1000 tokens. In the sparse session every third one has text (a
    "text block", A2), so the five text blocks bind; in the dense one every one
    has, so the 10000-token floor binds.
    """
    store = InMemoryStore()
    positions: list[int] = []
    async with ContextMiddleware(store, root / "mem", model=LIMITS, config=config) as mw:
        for every in (3, 1):
            session = await mw.open_session(project_id="p")
            messages = [_user(session.id, "go", T0)]
            for i in range(60):
                at = T0 + 10 + i
                parts: list[Any] = [
                    ToolPart(
                        call_id=f"c{i}",
                        tool="read",
                        state=ToolStateCompleted(
                            input={"i": i},
                            output=filler_text(1000, seed=i),
                            time=ToolTime(start=at, end=at),
                        ),
                    )
                ]
                if i % every == 0:
                    parts.insert(0, TextPart(text="note"))
                messages.append(
                    Message(
                        session_id=session.id,
                        role="assistant",
                        time_created=at,
                        time_completed=at,
                        finish="tool-calls",
                        usage=TokenUsage(input=100 + i),
                        parts=parts,
                    )
                )
            await mw.append(messages)
            assert await mw.start_writer(session.id) == "started"
            assert await mw.wait_for_writer(session.id, timeout=30) == "finished"
            watermark = await store.get_watermark(session.id)
            ids = [m.id for m in messages]
            assert watermark is not None
            positions.append(len(ids) - ids.index(watermark))
    return positions


_PATIENCE = 1.0
"""How long a wait probe watches a rebuild that waits for a hung writer."""


async def _within_patience(call: Callable[[], Awaitable[object]]) -> str:
    with anyio.move_on_after(_PATIENCE):
        await call()
        return "finished"
    return "still waiting"


async def wait_with_watermark(config: RebuildConfig, root: Path) -> object:
    """A rebuild with a checkpoint on disk, while a writer hangs."""
    writer = SwitchWriter()
    async with ContextMiddleware(
        InMemoryStore(), root / "mem", model=LIMITS, config=config, writer=writer
    ) as mw:
        session = await mw.open_session(project_id="p")
        await _history(mw, session.id, rounds=12)
        assert await mw.start_writer(session.id) == "started"
        assert await mw.wait_for_writer(session.id, timeout=30) == "finished"
        writer.hang = True
        await _history(mw, session.id, rounds=12, start=1_000)
        assert await mw.start_writer(session.id) == "started"
        return await _within_patience(lambda: mw.prepare(session.id))


async def wait_without_watermark(config: RebuildConfig, root: Path) -> object:
    """No watermark yet; a writer a threshold started hangs (R3.2's 5-minute case)."""
    async with ContextMiddleware(
        InMemoryStore(), root / "mem", model=LIMITS, config=config, writer=HangingWriter()
    ) as mw:
        session = await mw.open_session(project_id="p")
        await _history(mw, session.id, rounds=12)
        assert await mw.start_writer(session.id) == "started"
        return await _within_patience(lambda: mw.prepare(session.id))


async def ensure_wait(config: RebuildConfig, root: Path, *, manual: bool) -> object:
    """No watermark and no writer: the rebuild starts one, which hangs (A3)."""
    async with ContextMiddleware(
        InMemoryStore(), root / "mem", model=LIMITS, config=config, writer=HangingWriter()
    ) as mw:
        session = await mw.open_session(project_id="p")
        await _history(mw, session.id, rounds=12)
        if manual:
            return await _within_patience(lambda: mw.rebuild(session.id))
        return await _within_patience(lambda: mw.prepare(session.id))


async def ensure_wait_auto(config: RebuildConfig, root: Path) -> object:
    return await ensure_wait(config, root, manual=False)


async def ensure_wait_manual(config: RebuildConfig, root: Path) -> object:
    return await ensure_wait(config, root, manual=True)


async def lease_lifetime(config: RebuildConfig, root: Path) -> object:
    """The lifetime a writer asks its cross-worker lease for."""
    store = InMemoryStore()
    lease = RecordingLease(store)
    async with ContextMiddleware(
        store, root / "mem", model=LIMITS, config=config, writer_lease=lease
    ) as mw:
        session = await mw.open_session(project_id="p")
        await _history(mw, session.id, rounds=12)
        assert await mw.start_writer(session.id) == "started"
        assert await mw.wait_for_writer(session.id, timeout=30) == "finished"
    return lease.ttls


class SlowWriter:
    """The offline writer's checkpoint, after a second."""

    name = "slow"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        await anyio.sleep(1.0)
        return OfflineCheckpointWriter().build(request)


async def run_timeout(config: RebuildConfig, root: Path) -> object:
    """Which writer's checkpoint a run keeps when the primary writer is slow."""
    finished: list[str] = []

    def on_event(event: object) -> None:
        if isinstance(event, WriterFinished):
            finished.append(event.writer)

    async with ContextMiddleware(
        InMemoryStore(),
        root / "mem",
        model=LIMITS,
        config=config,
        writer=SlowWriter(),
        fallback_writer=OfflineCheckpointWriter(),
        on_event=on_event,
    ) as mw:
        session = await mw.open_session(project_id="p")
        await _history(mw, session.id, rounds=12)
        assert await mw.start_writer(session.id) == "started"
        assert await mw.wait_for_writer(session.id, timeout=30) == "finished"
    return finished


async def cleared_as(config: RebuildConfig, root: Path) -> object:
    """What the results a rebuild cleared read in the next request's sources."""
    store = InMemoryStore()
    async with ContextMiddleware(store, root / "mem", model=LIMITS, config=config) as mw:
        session = await mw.open_session(project_id="p")
        await _history(mw, session.id, rounds=24)
        report = (await mw.prepare(session.id)).rebuild
        assert report is not None
        assert report.compacted_results > 0
        stored = await store.list_messages(session.id)
    return sorted(
        {
            part.state.output
            for message in apply_send_rules(stored)
            for part in message.parts
            if isinstance(part, ToolPart)
            and isinstance(part.state, ToolStateCompleted)
            and part.state.time.compacted is not None
        }
    )


async def heap_released(config: RebuildConfig, root: Path) -> object:
    """Whether a rebuild hands the allocator's free heap pages back (mimo_ctx._heap)."""
    released = anyio.Event()

    def release() -> bool:  # the worker thread's call, counted instead of run
        anyio.from_thread.run_sync(released.set)
        return True

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heap, "release_free_heap", release)
        patch.setattr(heap, "_LIMITER", heap.ReleaseLimiter())  # no release before this one
        patch.setattr(heap, "read_heap", lambda: None)  # no reading: the gate lets it through
        async with ContextMiddleware(
            InMemoryStore(), root / "mem", model=LIMITS, config=config
        ) as mw:
            session = await mw.open_session(project_id="p")
            await _history(mw, session.id, rounds=24)
            assert (await mw.prepare(session.id)).rebuild is not None
            with anyio.move_on_after(5 if config.release_memory_after_rebuild else 0.3):
                await released.wait()
    return released.is_set()


async def heap_releases_of_two_rebuilds(config: RebuildConfig, root: Path) -> object:
    """How many heap releases two rebuilds in a row start within 0.3 s (mimo_ctx._heap)."""
    calls: list[int] = []

    def release() -> bool:  # the worker thread's call, counted instead of run
        calls.append(1)
        return True

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heap, "release_free_heap", release)
        patch.setattr(heap, "_LIMITER", heap.ReleaseLimiter())  # none before these two
        patch.setattr(heap, "read_heap", lambda: None)  # no reading: the gate lets both through
        async with ContextMiddleware(
            InMemoryStore(), root / "mem", model=LIMITS, config=config
        ) as mw:
            session = await mw.open_session(project_id="p")
            await _history(mw, session.id, rounds=24)
            assert (await mw.prepare(session.id)).rebuild is not None
            await _history(mw, session.id, rounds=24, start=1_000)
            assert (await mw.prepare(session.id)).rebuild is not None
            await anyio.sleep(0.3)
    return len(calls)


async def focus_and_host_body(config: RebuildConfig, root: Path) -> object:
    """A manual rebuild with a long focus and a (slow) hook adding a long section."""

    async def before(context: RebuildContext) -> HostSection:
        await anyio.sleep(0.3)
        return HostSection("Open pull request", filler_text(3_000, seed=7))

    store = InMemoryStore()
    async with ContextMiddleware(
        store, root / "mem", model=LIMITS, config=config, before_rebuild=before
    ) as mw:
        session = await mw.open_session(project_id="p")
        await _history(mw, session.id, rounds=12)
        report = await mw.rebuild(session.id, focus=filler_text(2_000, seed=8))
        assert report.boundary_id is not None
        boundary = await store.get_message(report.boundary_id)
    assert boundary is not None
    return "\n".join(p.text for p in boundary.parts if isinstance(p, TextPart))


# --------------------------------------------------------------------------- #
# The probes: one changed value per key, and what to watch
# --------------------------------------------------------------------------- #

PROBES: dict[str, tuple[object, Observe]] = {
    "checkpoint_enabled": (False, rebuild_fingerprint),
    "trigger_ratio": (0.5, limits_figures),
    "max_context": ("50%", limits_figures),
    "push_caps.tasks_ledger": (200, rebuild_fingerprint),
    "push_caps.checkpoint": (300, rebuild_fingerprint),
    "push_caps.actor_ledger": (30, rebuild_fingerprint),
    "push_caps.recent_user": (300, rebuild_fingerprint),
    "push_caps.recent_user_per_msg": (300, rebuild_fingerprint),
    "push_caps.memory": (60, rebuild_fingerprint),
    "push_caps.global": (60, rebuild_fingerprint),
    "push_caps.notes": (60, rebuild_fingerprint),
    "push_caps.memory_titles": (10, rebuild_fingerprint),
    "push_caps.focus_task": (60, rebuild_fingerprint),
    "push_caps.design_decisions": (60, rebuild_fingerprint),
    "push_caps.open_notes": (60, rebuild_fingerprint),
    "push_caps.rebuild_focus": (60, focus_and_host_body),
    "push_caps.host_section": (60, focus_and_host_body),
    "tail.min_tokens": (0, writer_watermark),
    "tail.max_tokens": (2_000, writer_watermark),
    "tail.min_text_block_messages": (0, writer_watermark),
    "writer.wait_with_watermark": (0.05, wait_with_watermark),
    "writer.wait_without_watermark": (0.05, wait_without_watermark),
    "writer.ensure_wait_auto": (0.05, ensure_wait_auto),
    "writer.ensure_wait_manual": (0.05, ensure_wait_manual),
    "writer.thresholds": (("50%",), limits_figures),
    "writer.reserved": (100_000, limits_figures),
    "writer.lease_ttl": (7.0, lease_lifetime),
    "writer.run_timeout": (0.05, run_timeout),
    "micro_compact_tools": (("grep",), rebuild_fingerprint),
    "micro_compact_exclude": (("read",), rebuild_fingerprint),
    "micro_compact_keep": (3, rebuild_fingerprint),
    "micro_compact_placeholder": ("[cleared]", cleared_as),
    "recent_user_window": (3, rebuild_fingerprint),
    "activity_max_lines": (2, rebuild_fingerprint),
    "activity_text_chars": (20, rebuild_fingerprint),
    "activity_arg_chars": (20, rebuild_fingerprint),
    "total_cap": (1_500, rebuild_fingerprint),
    "min_freed_fraction": (1.0, rebuild_fingerprint),
    "hook_timeout": (0.05, focus_and_host_body),
    "release_memory_after_rebuild": (False, heap_released),
    "release_memory_interval": (0.0, heap_releases_of_two_rebuilds),
}


def test_every_key_has_a_probe() -> None:
    assert sorted(PROBES) == sorted(config_keys())


_baselines: dict[Observe, object] = {}


@pytest.mark.parametrize("key", sorted(PROBES))
async def test_key_changes_behaviour(key: str, tmp_path: Path) -> None:
    value, observe = PROBES[key]
    if observe not in _baselines:
        (tmp_path / "base").mkdir()
        _baselines[observe] = await observe(RebuildConfig(), tmp_path / "base")
    (tmp_path / "changed").mkdir()
    changed = await observe(with_key(key, value), tmp_path / "changed")
    assert changed != _baselines[observe], f"{key}={value!r} changed nothing"


async def test_rich_scenario_rebuilds_twice_by_default(tmp_path: Path) -> None:
    """The baseline the probes compare with really rebuilds and renders every section."""
    fingerprint = await rebuild_fingerprint(RebuildConfig(), tmp_path)
    assert (fingerprint.outcome, fingerprint.second_outcome) == ("rebuilt", "rebuilt")
    assert fingerprint.compacted > 0
    assert not fingerprint.auto_disabled
    for heading in (
        "# Tasks ledger",
        "# Session checkpoint",
        "# Active actors",
        "# Recent user input (verbatim)",
        "# Project durable knowledge",
        "# Global memory",
        "# Session notes",
        "# Memory keys index",
        "# Recent activity",
    ):
        assert heading in fingerprint.body
