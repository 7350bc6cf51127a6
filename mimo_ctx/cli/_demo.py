"""``mimo-ctx demo``: a scripted agent session that shows a rebuild, offline, in seconds.

The library's own fake model (:class:`~mimo_ctx.testing.ScriptedModel`) plays a
coding agent fixing a bug in an imaginary project: one user request, about
forty tool rounds (``read``/``grep``/``bash``/``edit`` with outputs of one to
three thousand tokens), a second user message, a sub-agent slice, a task tree,
a background actor, project and global ``MEMORY.md`` files and session
``notes.md``. The model
window is small (50,000 tokens with a 4,000-token output limit, so the trigger
line is exactly 90%: 45,000), so the usage thresholds start the checkpoint
writer several times and the trigger line fires, inserting the rebuild boundary.

Everything runs on the embedded SQLite store. The demo waits for each writer
before the next turn so that its output is the same on every run (the offline
writer takes milliseconds; in a real agent it runs concurrently).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from mimo_ctx._util import now_ms
from mimo_ctx.cli._common import CliError, Streams, compacted_by_tool, section_json
from mimo_ctx.cli._inspect import section_rows
from mimo_ctx.cli._output import Output, dump_json, fmt_tokens
from mimo_ctx.cli._render import default_memory_root
from mimo_ctx.events import (
    AutoRebuildDisabled,
    ContextRebuilt,
    Event,
    StatusChanged,
    UsagePending,
    WaitingForWriter,
    WriterFailed,
    WriterFinished,
    WriterStarted,
)
from mimo_ctx.memory import MemoryLayout, write_text_atomic
from mimo_ctx.messages import MAIN_AGENT
from mimo_ctx.middleware import ContextMiddleware, RebuildReport
from mimo_ctx.store.base import Actor, Task, TaskStatus
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.testing import ScriptedModel, ScriptStep
from mimo_ctx.triggers import ModelLimits

__all__ = [
    "DEMO_LIMITS",
    "DemoEvent",
    "DemoRebuild",
    "DemoResult",
    "add_parser",
    "demo_script",
    "print_demo",
    "run_demo",
]

DEMO_LIMITS = ModelLimits(context_window=50_000, max_output_tokens=4_000)
"""usable = min(45,000, 50,000 - 4,000) = 45,000: the 90% ratio decides (SPEC R1.2)."""

PROJECT = "confkit"
SUBAGENT = "explore-1"

SYSTEM_PROMPT = (
    "You are a careful coding agent working in the confkit repository. Read before you "
    "edit, run the tests after every change, and keep the user's instructions."
)

_USER_REQUEST = (
    "confkit crashes with a KeyError when a config file is empty (`confkit load "
    "empty.toml`). Please find the cause, fix it in the loader, and add a regression "
    "test. Don't change the public signature of `load_config`; other teams import it."
)
_USER_FOLLOW_UP = (
    "One more thing: the fix must also cover files that only contain comments. "
    "And please keep the error message for missing files exactly as it is today."
)

_PROJECT_MEMORY = """# Project memory

## Project context
- confkit: a small library that loads layered TOML/env configuration.
- Entry point: `confkit.load_config(path, *, env=None)`; CLI `confkit load FILE`.

## Rules
- Public signatures are frozen between minor releases.
- Every bug fix comes with a regression test under tests/regressions/.

## Architecture decisions
- Sources are merged in order: defaults < file < environment.
- Parsing lives in loader.py; validation lives in schema.py.

## Discovered durable knowledge
- `tomllib.loads("")` returns an empty dict; the crash is ours, not the parser's.
"""

_GLOBAL_MEMORY = """# Global memory

## Preferences
- Small, reviewable commits; one topic each.
- Explain a fix in one paragraph before the diff.
"""

_NOTES = """Session notes
- Started from the bug report in issue #482 (empty files).
- The user wants the public API unchanged.
"""

_NOTES_LATER = """Session notes
- merge.py and schema.py both assume every layer has a [section]; fix both.
- Comments-only files take the same path as empty ones (tomllib returns {}).
"""

_FILES = (
    "src/confkit/loader.py",
    "src/confkit/schema.py",
    "src/confkit/sources/env.py",
    "src/confkit/sources/file.py",
    "src/confkit/merge.py",
    "tests/test_loader.py",
    "tests/test_schema.py",
    "src/confkit/cli.py",
)
_NAMES = (
    "load_config",
    "merge_layers",
    "read_source",
    "validate",
    "section",
    "defaults",
    "env_prefix",
    "coerce",
    "resolve_path",
    "apply_schema",
)


def _code(path: str, tokens: int, seed: int) -> str:
    """Deterministic source-looking text of about ``tokens`` tokens."""
    lines: list[str] = []
    size = 0
    n = 0
    while size < tokens * 4:
        name = _NAMES[(seed + n) % len(_NAMES)]
        other = _NAMES[(seed * 3 + n * 7) % len(_NAMES)]
        if n % 6 == 0:
            line = (
                f"{n + 1:5d}\tdef {name}(data: dict[str, object], *, strict: bool = True) -> dict:"
            )
        elif n % 6 == 1:
            line = f'{n + 1:5d}\t    """Return {name} applied to every section of {path}."""'
        elif n % 6 == 2:
            line = f"{n + 1:5d}\t    result = {other}(data.get('{name}', {{}}), strict=strict)"
        elif n % 6 == 3:
            line = f"{n + 1:5d}\t    if not result:  # an empty layer still needs its keys"
        elif n % 6 == 4:
            line = f"{n + 1:5d}\t        raise KeyError('{name}')"
        else:
            line = f"{n + 1:5d}\t    return {{**defaults(), **result}}"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines)


def _grep(pattern: str, tokens: int, seed: int) -> str:
    lines: list[str] = []
    size = 0
    n = 0
    while size < tokens * 4:
        path = _FILES[(seed + n) % len(_FILES)]
        line = f"{path}:{(seed * 17 + n * 13) % 400 + 1}:    value = {pattern}(layer, strict=True)"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines)


def _pytest(tokens: int, seed: int, *, failing: bool) -> str:
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.12.3, pytest-8.3.2",
        "collected 148 items",
        "",
    ]
    size = sum(len(x) + 1 for x in lines)
    n = 0
    while size < tokens * 4:
        test = f"tests/test_{_NAMES[(seed + n) % len(_NAMES)]}.py::test_case_{n}"
        status = "FAILED" if failing and n % 9 == 4 else "PASSED"
        line = f"{test} {status} [{min(99, n)}%]"
        lines.append(line)
        size += len(line) + 1
        n += 1
    if failing:
        lines.append("E   KeyError: 'section'  (src/confkit/loader.py:88 in merge_layers)")
        lines.append("==================== 3 failed, 145 passed in 2.31s ====================")
    else:
        lines.append("==================== 148 passed in 2.18s ====================")
    return "\n".join(lines)


def _read(path: str, tokens: int, seed: int, text: str | None = None) -> ScriptStep:
    return ScriptStep(
        text=text, tool="read", input={"file_path": path}, output=_code(path, tokens, seed)
    )


def demo_script() -> list[ScriptStep]:
    """The main agent's answers: ~40 tool rounds, a sub-agent request, a final answer."""
    steps: list[ScriptStep] = [
        _read("src/confkit/loader.py", 2600, 1, "I'll start with the loader, where the crash is."),
        ScriptStep(
            tool="bash",
            input={"command": "confkit load tests/data/empty.toml"},
            output="Traceback (most recent call last):\n"
            + _code("src/confkit/loader.py", 400, 2)
            + "\nKeyError: 'section'",
        ),
        ScriptStep(
            tool="grep",
            input={"pattern": "merge_layers", "path": "src"},
            output=_grep("merge_layers", 1200, 3),
        ),
        _read("src/confkit/merge.py", 2400, 4),
        _read("src/confkit/schema.py", 2800, 5, "The merge assumes every layer has sections."),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -x -q"},
            output=_pytest(1800, 6, failing=True),
        ),
        _read("src/confkit/sources/file.py", 2200, 7),
        ScriptStep(
            tool="grep",
            input={"pattern": "KeyError", "path": "src"},
            output=_grep("KeyError", 900, 8),
        ),
        _read("tests/test_loader.py", 2500, 9),
        ScriptStep(
            text="Reproduced. Now a failing regression test first.",
            tool="write",
            input={"file_path": "tests/regressions/test_empty_file.py"},
            output="Wrote 34 lines to tests/regressions/test_empty_file.py",
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests/regressions -q"},
            output=_pytest(1500, 11, failing=True),
        ),
        _read("src/confkit/sources/env.py", 2000, 12),
        # -- the user adds a requirement here (see run_demo) --
        ScriptStep(
            text="Comments-only files parse to an empty dict too; same code path.",
            tool="grep",
            input={"pattern": "tomllib.loads", "path": "src"},
            output=_grep("tomllib.loads", 1100, 13),
        ),
        _read("src/confkit/loader.py", 2700, 14),
        ScriptStep(
            tool="edit",
            input={"file_path": "src/confkit/loader.py", "old": "layer['section']"},
            output=_code("src/confkit/loader.py", 700, 15),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2000, 16, failing=True),
        ),
        _read("src/confkit/schema.py", 2600, 17),
        ScriptStep(
            text="Let me have a sub-agent survey every caller of merge_layers.",
            subtask="Survey all callers of merge_layers and how they treat empty layers",
        ),
        ScriptStep(
            tool="grep",
            input={"pattern": "def merge_layers", "path": "."},
            output=_grep("merge_layers", 800, 19),
        ),
        _read("src/confkit/cli.py", 2300, 20),
        ScriptStep(
            tool="edit",
            input={"file_path": "src/confkit/merge.py", "old": "for name in layer"},
            output=_code("src/confkit/merge.py", 800, 21),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2200, 22, failing=True),
        ),
        _read("src/confkit/merge.py", 2500, 23),
        ScriptStep(
            tool="grep",
            input={"pattern": "raise KeyError", "path": "src"},
            output=_grep("raise KeyError", 1000, 24),
        ),
        _read("tests/test_schema.py", 2400, 25),
        ScriptStep(
            tool="edit",
            input={"file_path": "src/confkit/schema.py", "old": "raise KeyError(name)"},
            output=_code("src/confkit/schema.py", 600, 26),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2100, 27, failing=False),
        ),
        _read("src/confkit/loader.py", 2600, 28, "Tests pass; checking the missing-file message."),
        ScriptStep(
            tool="grep",
            input={"pattern": "FileNotFoundError", "path": "src"},
            output=_grep("FileNotFoundError", 900, 29),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "confkit load missing.toml"},
            output="error: config file not found: missing.toml",
        ),
        _read("src/confkit/sources/file.py", 2300, 31),
        ScriptStep(
            tool="write",
            input={"file_path": "tests/data/comments_only.toml"},
            output="Wrote 4 lines to tests/data/comments_only.toml",
        ),
        ScriptStep(
            tool="edit",
            input={"file_path": "tests/regressions/test_empty_file.py", "old": "def test_empty"},
            output=_code("tests/regressions/test_empty_file.py", 500, 33),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2300, 34, failing=False),
        ),
        _read("src/confkit/merge.py", 2400, 35),
        ScriptStep(
            tool="grep",
            input={"pattern": "load_config(", "path": "."},
            output=_grep("load_config", 1200, 36),
        ),
        _read("src/confkit/schema.py", 2200, 37),
        ScriptStep(
            tool="bash",
            input={"command": "ruff check src tests && pyright src"},
            output="All checks passed!\n0 errors, 0 warnings, 0 informations",
        ),
        _read("tests/test_loader.py", 2500, 39),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2400, 40, failing=False),
        ),
        _read("src/confkit/loader.py", 2000, 41),
        ScriptStep(
            text=(
                "Fixed: empty and comments-only files now load as empty layers "
                "(merge.py and schema.py no longer assume a section exists). "
                "`load_config` keeps its signature, the missing-file message is "
                "unchanged, and tests/regressions/test_empty_file.py covers both cases."
            )
        ),
    ]
    return steps


def _subagent_script() -> list[ScriptStep]:
    return [
        ScriptStep(
            tool="grep",
            input={"pattern": "merge_layers(", "path": "."},
            output=_grep("merge_layers", 1500, 50),
        ),
        _read("src/confkit/cli.py", 1800, 51),
        ScriptStep(
            text=(
                "merge_layers has 3 callers (loader.load_config, cli.main, "
                "sources.file.read_source); none guards against an empty layer."
            )
        ),
    ]


@dataclass(frozen=True, slots=True)
class DemoEvent:
    """One line of the demo's timeline."""

    turn: int
    kind: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        """``{"turn", "event", "detail"}``."""
        return {"turn": self.turn, "event": self.kind, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class DemoRebuild:
    """A rebuild of the demo and the tail it collapsed."""

    turn: int
    report: RebuildReport
    tokens_after: int
    tail_messages: int
    tail_folded: int
    tail_kept: int
    request_messages: int


@dataclass(slots=True)
class DemoResult:
    """What the demo did."""

    store_path: str
    memory_root: str
    session_id: str
    window: int
    trigger_tokens: int
    thresholds: list[int]
    turns: int = 0
    events: list[DemoEvent] = field(default_factory=list[DemoEvent])
    rebuilds: list[DemoRebuild] = field(default_factory=list[DemoRebuild])
    compacted: dict[str, int] = field(default_factory=dict[str, int])
    peak_tokens: int = 0
    final_tokens: int = 0
    messages_stored: int = 0
    seconds: float = 0.0
    kept: bool = False
    memory_kept: bool = False

    def to_json(self) -> dict[str, Any]:
        """The document ``mimo-ctx demo --json`` prints."""
        return {
            "session_id": self.session_id,
            "store": self.store_path if self.kept else None,
            "memory_root": self.memory_root if self.memory_kept else None,
            "window": self.window,
            "trigger_tokens": self.trigger_tokens,
            "writer_thresholds": self.thresholds,
            "turns": self.turns,
            "events": [e.to_json() for e in self.events],
            "rebuilds": [
                {
                    "turn": r.turn,
                    "outcome": r.report.outcome,
                    "watermark": r.report.watermark,
                    "tokens_before": r.report.tokens_before,
                    "tokens_after": r.tokens_after,
                    "compacted_results": r.report.compacted_results,
                    "tail": {
                        "messages": r.tail_messages,
                        "folded_into_digest": r.tail_folded,
                        "kept_verbatim": r.tail_kept,
                    },
                    "request_messages": r.request_messages,
                    "sections": [
                        section_json(s)
                        for s in (r.report.sections.sections if r.report.sections else [])
                    ],
                }
                for r in self.rebuilds
            ],
            "compacted_by_tool": self.compacted,
            "peak_request_tokens": self.peak_tokens,
            "final_request_tokens": self.final_tokens,
            "messages_stored": self.messages_stored,
        }


def _describe(event: Event) -> tuple[str, str] | None:
    if isinstance(event, WriterStarted):
        return (
            "writer started",
            f"{event.writer} writer, {event.reason}, watermark {event.watermark}",
        )
    if isinstance(event, WriterFinished):
        return (
            "writer finished",
            f"checkpoint.md written ({fmt_tokens(event.checkpoint_tokens)} tokens), "
            f"covers up to {event.watermark}",
        )
    if isinstance(event, WriterFailed):
        return "writer failed", f"{event.writer}: {event.error}"
    if isinstance(event, UsagePending):
        return "usage pending", "rebuild in progress: usage figures are stale"
    if isinstance(event, WaitingForWriter):
        return "waiting for writer", f"{event.status} (at most {event.timeout:g} s)"
    if isinstance(event, StatusChanged):
        return "status", event.status
    if isinstance(event, ContextRebuilt):
        return (
            "context rebuilt",
            f"{event.outcome}: {fmt_tokens(event.tokens_before)} -> "
            f"{fmt_tokens(event.tokens_after)} tokens, {event.compacted_results} tool "
            f"results cleared, boundary {event.boundary_id}",
        )
    if isinstance(event, AutoRebuildDisabled):
        return "auto rebuild disabled", event.reason
    return None


async def _settle(middleware: ContextMiddleware, session_id: str) -> None:
    await anyio.lowlevel.checkpoint()
    while middleware.writer_running(session_id):
        await middleware.wait_for_writer(session_id, timeout=60)
        await anyio.lowlevel.checkpoint()


def _task(session_id: str, task_id: str, status: TaskStatus, summary: str, now: int) -> Task:
    parent = task_id.rsplit(".", 1)[0] if "." in task_id else None
    return Task(
        id=task_id,
        session_id=session_id,
        parent_id=parent,
        status=status,
        summary=summary,
        time_created=now,
        time_updated=now,
    )


async def run_demo(
    store_path: Path, memory_root: Path, *, kept: bool = False, memory_kept: bool | None = None
) -> DemoResult:
    """Run the scripted session on an SQLite store at ``store_path``.

    Args:
        store_path: The SQLite file (created if missing; an existing mimo_ctx store
            gets one more session).
        memory_root: Where checkpoint, memory and notes files go.
        kept: The caller keeps the store (reported in the JSON document).
        memory_kept: The caller keeps the memory root (default: like ``kept``).
    """
    started = time.perf_counter()
    now = now_ms()
    current_turn = [0]
    result_events: list[DemoEvent] = []

    def on_event(event: Event) -> None:
        described = _describe(event)
        if described is not None:
            result_events.append(DemoEvent(current_turn[0], *described))

    tools: list[dict[str, object]] = [
        {"type": "function", "function": {"name": name, "description": about}}
        for name, about in (
            ("read", "Read a file"),
            ("grep", "Search file contents"),
            ("bash", "Run a shell command"),
            ("edit", "Edit a file"),
            ("write", "Write a file"),
            ("task", "Start a sub-agent"),
        )
    ]
    layout = MemoryLayout(memory_root)
    async with (
        SQLiteStore(store_path) as store,
        ContextMiddleware(store, memory_root, model=DEMO_LIMITS, on_event=on_event) as mw,
    ):
        session = await mw.open_session(
            project_id=PROJECT, system=SYSTEM_PROMPT, tools=tools, title="confkit: empty files"
        )
        sid = session.id
        result = DemoResult(
            store_path=str(store_path),
            memory_root=str(memory_root),
            session_id=sid,
            window=DEMO_LIMITS.context_window,
            trigger_tokens=mw.usable,
            thresholds=list(mw.thresholds),
            kept=kept,
            memory_kept=kept if memory_kept is None else memory_kept,
        )
        await write_text_atomic(layout.project_memory_path(PROJECT), _PROJECT_MEMORY)
        await write_text_atomic(layout.global_memory_path(), _GLOBAL_MEMORY)
        await write_text_atomic(layout.notes_path(sid), _NOTES)
        initial: tuple[tuple[str, TaskStatus, str], ...] = (
            ("T1", "in_progress", "Fix the KeyError on empty config files"),
            ("T1.1", "in_progress", "Reproduce the crash"),
            ("T1.2", "open", "Patch the loader and merge"),
            ("T2", "open", "Add regression tests for empty and comments-only files"),
        )
        for task_id, status, summary in initial:
            await store.upsert_task(_task(sid, task_id, status, summary, now))
        await store.upsert_actor(
            Actor(
                id="act_pytest_watch",
                session_id=sid,
                agent="test-runner",
                description="pytest --watch on tests/",
                status="running",
                time_created=now,
                time_last_activity=now,
            )
        )
        await mw.add_user_message(sid, _USER_REQUEST)

        model = ScriptedModel(demo_script())
        subagent = ScriptedModel(_subagent_script())
        turn = 0
        while not model.done:
            turn += 1
            current_turn[0] = turn
            if turn == 13:
                await mw.add_user_message(sid, _USER_FOLLOW_UP)
            if turn == 9:
                await store.upsert_task(_task(sid, "T1.1", "done", "Reproduce the crash", now))
                await store.upsert_task(
                    _task(sid, "T1.2", "in_progress", "Patch the loader and merge", now)
                )
            if turn == 28:
                await store.upsert_task(
                    _task(sid, "T1.2", "done", "Patch the loader and merge", now)
                )
                await store.upsert_task(
                    _task(
                        sid,
                        "T2",
                        "in_progress",
                        "Add regression tests for empty and comments-only files",
                        now,
                    )
                )
            if turn == 20:
                # The agent jots a note mid-session; the next writer folds it in.
                await write_text_atomic(layout.notes_path(sid), _NOTES_LATER)
            reply = await mw.turn(sid, model.complete)
            await _settle(mw, sid)
            view = model.requests[-1]
            result.peak_tokens = max(result.peak_tokens, view.tokens)
            result.final_tokens = view.tokens
            if view.rebuild is not None:
                result.rebuilds.append(
                    await _rebuild_figures(
                        store,
                        session_id=sid,
                        turn=turn,
                        report=view.rebuild,
                        tokens_after=view.tokens,
                        request_messages=len(view.messages),
                    )
                )
            if any(p.type == "subtask" for p in reply.parts):
                await _run_subagent(mw, sid, subagent)
        result.turns = turn
        everything = await store.list_messages(sid, agent=None)
        result.messages_stored = len(everything)
        result.compacted = compacted_by_tool(everything)
    result.events = result_events
    result.seconds = time.perf_counter() - started
    return result


async def _run_subagent(mw: ContextMiddleware, session_id: str, model: ScriptedModel) -> None:
    """A sub-agent slice: its own user prompt and turns, in the same session."""
    await mw.add_user_message(
        session_id,
        "Survey all callers of merge_layers and how they treat empty layers.",
        agent=SUBAGENT,
    )
    while not model.done:
        await mw.turn(session_id, model.complete, agent=SUBAGENT)
        await _settle(mw, session_id)


async def _rebuild_figures(
    store: SQLiteStore,
    *,
    session_id: str,
    turn: int,
    report: RebuildReport,
    tokens_after: int,
    request_messages: int,
) -> DemoRebuild:
    tail_messages = tail_folded = tail_kept = 0
    boundary = await store.get_message(report.boundary_id) if report.boundary_id else None
    checkpoint = boundary.checkpoint_part if boundary is not None else None
    if checkpoint is not None and boundary is not None:
        main = await store.list_messages(session_id, agent=MAIN_AGENT)
        tail = [
            m for m in main if checkpoint.covered_up_to < m.id < boundary.id and not m.is_boundary
        ]
        tail_messages = len(tail)
        digest_up_to = checkpoint.digest_up_to
        tail_folded = sum(
            1
            for m in tail
            if m.role != "user" and digest_up_to is not None and m.id <= digest_up_to
        )
        tail_kept = tail_messages - tail_folded
    return DemoRebuild(
        turn=turn,
        report=report,
        tokens_after=tokens_after,
        tail_messages=tail_messages,
        tail_folded=tail_folded,
        tail_kept=tail_kept,
        request_messages=request_messages,
    )


def print_demo(result: DemoResult, out: Output) -> None:
    """Human output of the demo."""
    out.heading("mimo-ctx demo: a scripted agent session (no network, no API key)")
    out.fields(
        [
            ("Session", result.session_id),
            (
                "Model window",
                f"{fmt_tokens(result.window)} tokens; trigger line "
                f"{fmt_tokens(result.trigger_tokens)} (90%)",
            ),
            (
                "Writer thresholds",
                ", ".join(fmt_tokens(t) for t in result.thresholds) + " tokens of usage",
            ),
            ("Store", result.store_path + ("" if result.kept else "  (temporary)")),
            (
                "Memory root",
                result.memory_root + ("" if result.memory_kept else "  (temporary)"),
            ),
        ]
    )
    out.heading("Timeline")
    out.table(
        ["Turn", "Event", "Detail"],
        [[str(e.turn), e.kind, e.detail] for e in result.events],
        align=["right", "left", "left"],
    )
    for rebuild in result.rebuilds:
        report = rebuild.report
        out.heading(f"Rebuild at turn {rebuild.turn}: {report.outcome}")
        if report.sections is not None:
            out.table(
                ["#", "Section", "Tokens", "Cap", "Use"],
                section_rows(list(report.sections.sections)),
                align=["right", "left", "right", "right", "right"],
                title="Sections of the rebuilt request (tokens vs caps)",
            )
        out.fields(
            [
                ("Watermark", report.watermark or "-"),
                (
                    "Request tokens",
                    f"{fmt_tokens(report.tokens_before)} before -> "
                    f"{fmt_tokens(rebuild.tokens_after)} after",
                ),
                (
                    "Collapsed tail",
                    f"{rebuild.tail_messages} messages after the watermark: "
                    f"{rebuild.tail_folded} folded into # Recent activity, "
                    f"{rebuild.tail_kept} user message(s) kept verbatim; the request now "
                    f"carries {rebuild.request_messages} messages",
                ),
                ("Micro-compaction", f"{report.compacted_results} tool results cleared"),
            ]
        )
    out.heading("Summary")
    cleared = sum(result.compacted.values())
    out.fields(
        [
            ("Turns", f"{result.turns} main-agent turns (+ a sub-agent slice)"),
            ("Writer runs", str(sum(1 for e in result.events if e.kind == "writer finished"))),
            ("Rebuilds", str(len(result.rebuilds))),
            (
                "Request size",
                f"peak {fmt_tokens(result.peak_tokens)} tokens, last "
                f"{fmt_tokens(result.final_tokens)} (trigger line "
                f"{fmt_tokens(result.trigger_tokens)})",
            ),
            (
                "Tool results cleared",
                f"{cleared} in storage, still there, sent as a placeholder" if cleared else "none",
            ),
            ("Messages stored", f"{result.messages_stored} (nothing deleted)"),
            ("Took", f"{result.seconds:.1f} s"),
        ]
    )
    if result.kept:
        out.line()
        out.line(
            "Next: see what the next request would carry with\n"
            f"  mimo-ctx render --store {result.store_path} --session {result.session_id}"
        )
    else:
        out.line()
        out.line("The store was temporary; pass --store PATH to keep it and try `mimo-ctx render`.")


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Register ``mimo-ctx demo`` on ``subparsers``."""
    demo = subparsers.add_parser(
        "demo",
        parents=[common],
        help="run a scripted agent session offline and show a rebuild",
        description="Run a scripted agent session (no network, no API key) on the embedded "
        "SQLite store: usage thresholds start the checkpoint writer, the trigger line "
        "fires and the rebuild boundary is inserted.",
    )
    demo.add_argument(
        "--store",
        metavar="PATH",
        help="keep the session in this SQLite file (default: a temporary directory)",
    )
    demo.add_argument(
        "--memory-root",
        metavar="DIR",
        help="memory files directory (default with --store: <dir>/<stem>-memory beside it)",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON document")
    demo.set_defaults(run=_run)


async def _run(args: argparse.Namespace, streams: Streams) -> int:
    store_arg = cast("str | None", args.store)
    memory_arg = cast("str | None", args.memory_root)
    if store_arg is not None:
        store_path = Path(store_arg)
        if await anyio.Path(store_path).is_dir():
            raise CliError(f"--store {store_path}: a directory; give a file path such as demo.db")
        memory_root = Path(memory_arg) if memory_arg else default_memory_root(store_path)
        result = await run_demo(store_path, memory_root, kept=True)
    else:
        directory = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "mimo-ctx-demo-"))
        try:
            memory_root = Path(memory_arg) if memory_arg else directory / "memory"
            result = await run_demo(
                directory / "demo.db", memory_root, memory_kept=memory_arg is not None
            )
        finally:
            await anyio.to_thread.run_sync(partial(shutil.rmtree, directory, ignore_errors=True))
    if args.json:
        dump_json(result.to_json(), streams.out)
    else:
        print_demo(result, Output(streams.out, plain=args.plain))
    return 0
