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
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from mimo_ctx._util import now_ms
from mimo_ctx.cli._common import CliError, Streams, compacted_by_tool, section_json
from mimo_ctx.cli._demo_script import (
    GLOBAL_MEMORY,
    NOTES,
    NOTES_LATER,
    PROJECT,
    PROJECT_MEMORY,
    SUBAGENT,
    SYSTEM_PROMPT,
    USER_FOLLOW_UP,
    USER_REQUEST,
    demo_script,
    subagent_script,
)
from mimo_ctx.cli._inspect import section_rows
from mimo_ctx.cli._output import Output, dump_json, fmt_tokens
from mimo_ctx.cli._render import default_memory_root
from mimo_ctx.digest import is_digested
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
from mimo_ctx.messages import MAIN_AGENT, Message, Part, ToolPart, ToolStateCompleted
from mimo_ctx.middleware import ContextMiddleware, RebuildReport
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.session import Actor, Task, TaskStatus
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.testing import ScriptedModel
from mimo_ctx.triggers import ModelLimits

__all__ = [
    "DEMO_LIMITS",
    "DemoEvent",
    "DemoRebuild",
    "DemoResult",
    "add_parser",
    "export_transcript",
    "print_demo",
    "run_demo",
]

DEMO_LIMITS = ModelLimits(context_window=50_000, max_output_tokens=4_000)
"""usable = min(45,000, 50,000 - 4,000) = 45,000: the 90% ratio decides (SPEC R1.2)."""


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
    store_path: Path,
    memory_root: Path,
    *,
    kept: bool = False,
    memory_kept: bool | None = None,
    transcript: Path | None = None,
) -> DemoResult:
    """Run the scripted session on an SQLite store at ``store_path``.

    Args:
        store_path: The SQLite file (created if missing; an existing mimo_ctx store
            gets one more session).
        memory_root: Where checkpoint, memory and notes files go.
        kept: The caller keeps the store (reported in the JSON document).
        memory_kept: The caller keeps the memory root (default: like ``kept``).
        transcript: Also write the main agent's session as an OpenAI chat transcript
            there (:func:`export_transcript`), for ``mimo-ctx replay``.
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
        await write_text_atomic(layout.project_memory_path(PROJECT), PROJECT_MEMORY)
        await write_text_atomic(layout.global_memory_path(), GLOBAL_MEMORY)
        await write_text_atomic(layout.notes_path(sid), NOTES)
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
        await mw.add_user_message(sid, USER_REQUEST)

        model = ScriptedModel(demo_script())
        subagent = ScriptedModel(subagent_script())
        turn = 0
        while not model.done:
            turn += 1
            current_turn[0] = turn
            if turn == 13:
                await mw.add_user_message(sid, USER_FOLLOW_UP)
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
                await write_text_atomic(layout.notes_path(sid), NOTES_LATER)
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
        if transcript is not None:
            document = export_transcript(everything, system=SYSTEM_PROMPT, tools=tools)
            text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
            await anyio.Path(transcript).write_text(text, encoding="utf-8")
    result.events = result_events
    result.seconds = time.perf_counter() - started
    return result


def export_transcript(
    messages: Sequence[Message], *, system: str, tools: Sequence[dict[str, object]]
) -> dict[str, Any]:
    """The main agent's history as an OpenAI chat transcript, as the agent produced it.

    Rebuild boundaries are left out and cleared tool results are written in full
    (what the agent saw before any rebuild); each assistant message carries its
    usage, so ``mimo-ctx replay`` of the file drives its triggers with the demo's
    own figures. The shape is the ``openai-chat`` import format
    (``{"messages": [...], "tools": [...]}``).
    """
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for message in messages:
        if message.agent != MAIN_AGENT or message.is_boundary:
            continue
        entries = to_openai_chat([_uncleared(message)])
        usage = message.usage
        if usage is not None and entries and entries[0].get("role") == "assistant":
            entries[0]["usage"] = {
                "prompt_tokens": usage.input,
                "completion_tokens": usage.output,
                "total_tokens": usage.total
                if usage.total is not None
                else usage.input + usage.output,
            }
        out.extend(entries)
    return {"messages": out, "tools": [dict(t) for t in tools]}


def _uncleared(message: Message) -> Message:
    """``message`` with its tool results as they were before micro-compaction."""
    parts: list[Part] = []
    for part in message.parts:
        if isinstance(part, ToolPart) and isinstance(part.state, ToolStateCompleted):
            time = part.state.time.model_copy(update={"compacted": None, "placeholder": None})
            state = part.state.model_copy(update={"time": time})
            parts.append(part.model_copy(update={"state": state}))
        else:
            parts.append(part)
    return message.model_copy(update={"parts": parts})


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
        tail_folded = sum(1 for m in tail if is_digested(m, checkpoint))
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
    demo.add_argument(
        "--transcript",
        metavar="FILE",
        help="also write the session as an OpenAI chat transcript (input for mimo-ctx replay)",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON document")
    demo.set_defaults(run=_run)


async def _run(args: argparse.Namespace, streams: Streams) -> int:
    store_arg = cast("str | None", args.store)
    memory_arg = cast("str | None", args.memory_root)
    transcript_arg = cast("str | None", args.transcript)
    transcript = Path(transcript_arg) if transcript_arg else None
    if transcript is not None and not await anyio.Path(transcript.parent).is_dir():
        raise CliError(f"--transcript {transcript}: no such directory {transcript.parent}")
    if store_arg is not None:
        store_path = Path(store_arg)
        if await anyio.Path(store_path).is_dir():
            raise CliError(f"--store {store_path}: a directory; give a file path such as demo.db")
        memory_root = Path(memory_arg) if memory_arg else default_memory_root(store_path)
        result = await run_demo(store_path, memory_root, kept=True, transcript=transcript)
    else:
        directory = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "mimo-ctx-demo-"))
        try:
            memory_root = Path(memory_arg) if memory_arg else directory / "memory"
            result = await run_demo(
                directory / "demo.db",
                memory_root,
                memory_kept=memory_arg is not None,
                transcript=transcript,
            )
        finally:
            await anyio.to_thread.run_sync(partial(shutil.rmtree, directory, ignore_errors=True))
    if args.json:
        dump_json(result.to_json(), streams.out)
    else:
        print_demo(result, Output(streams.out, plain=args.plain))
    return 0
