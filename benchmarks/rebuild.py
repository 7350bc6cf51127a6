"""Rebuild: render + insert + micro-compact, against a realistic floor and the bare floor.

Rows: sessions of 300 and 5,000 stored main-agent messages, each with memory
files (``checkpoint.md``, the project and global ``MEMORY.md``, ``notes.md``)
of 4 KB and of 1 MB, written in ASCII and in non-ASCII text (Chinese with
emoji, which the estimator counts in UTF-16 code units: astral characters
twice). Every session is live: its window is loaded (a previous boundary leaves
~260 messages live), the checkpoint writer has finished (fresh files on disk,
watermark set 150 messages before the end, the memory index caught up as the
middleware does in the background after a writer), and every source is at its
cap (tasks, actors, user text, memory files).

Timed: ``ContextMiddleware.rebuild(session_id, manual=True)``, once per session,
on freshly written files (nothing served from a cache of an earlier rebuild).
In the same loop, interleaved with the rebuilds (the order rotates), the two
floors on the same session and files:

* **realistic floor**: read each memory file once, one pass over it that finds
  the lines the section-aware read must keep (level-2 headings, italic lines,
  index lines) and its UTF-16 length, and one JSON serialisation of the tail;
* **bare floor**: read the budgeted bytes only (each file's cap, in bytes).

The target is the rebuild within 3x of the realistic floor on every row; the
bare-floor ratio is printed beside it.
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx import ids
from mimo_ctx.checkpoint import CHECKPOINT_SECTIONS
from mimo_ctx.compaction import build_boundary_message
from mimo_ctx.config import PushCaps, RebuildConfig
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import (
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.base import Actor, Session, Task
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.tokens import utf16_length
from mimo_ctx.triggers import ModelLimits

from ._common import (
    Samples,
    Target,
    atime,
    fmt_ms,
    fmt_num,
    fmt_ratio,
    result,
    settle_heap,
    source_text,
    table,
)

__all__ = ["NAME", "TITLE", "run"]

NAME = "rebuild"
TITLE = "Rebuild: render + insert + micro-compact, every source at its cap"

HUGE = ModelLimits(10_000_000)
PROJECT = "bench-project"
_TOOLS = ("read", "bash", "grep", "edit", "task")
SCRIPTS = ("ASCII", "non-ASCII")


@dataclass(frozen=True, slots=True)
class _Plan:
    histories: tuple[int, ...]  # stored main-agent messages per session
    file_sizes: tuple[int, ...]  # characters of each of the four memory files
    live: int  # messages the previous boundary leaves live (the loaded window)
    tail: int  # messages after the new watermark
    samples: int  # sessions (one rebuild each) per row
    memory_files: int
    tasks: int
    actors: int


FULL = _Plan(
    histories=(300, 5_000),
    file_sizes=(4_000, 1_000_000),
    live=260,
    tail=150,
    samples=9,
    memory_files=30,
    tasks=40,
    actors=12,
)
QUICK = _Plan(
    histories=(60, 120),
    file_sizes=(4_000, 20_000),
    live=40,
    tail=20,
    samples=2,
    memory_files=4,
    tasks=4,
    actors=3,
)


class _Text:
    """Deterministic words: the library's own code (ASCII), or Chinese with emoji."""

    _HAN = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理府研质"  # noqa: E501
    _EMOJI = "😀🚀📁🔧✅🧪🐍📝"

    def __init__(self) -> None:
        self.code = source_text()
        self.words = self.code.split()
        rng = random.Random(7)
        self.wide = [
            "".join(rng.choice(self._HAN) for _ in range(rng.randint(1, 4)))
            + (rng.choice(self._EMOJI) if rng.random() < 0.15 else "")
            for _ in range(4000)
        ]

    def words_from(self, seed: int, count: int, script: str = "ASCII") -> str:
        words = self.words if script == "ASCII" else self.wide
        start = (seed * 7919) % max(1, len(words) - count)
        return " ".join(words[start : start + count])

    def code_slice(self, seed: int, chars: int) -> str:
        start = (seed * 104729) % max(1, len(self.code) - chars)
        return self.code[start : start + chars]


# --------------------------------------------------------------------------- data


def _message(text: _Text, session_id: str, index: int, time_ms: int, *, small: bool) -> Message:
    """Main-agent message ``index``: a user turn every eighth, else a tool round.

    ``small`` messages (the history before the live window, which a rebuild never
    reads) are short, so a 5,000-message session stays quick to build.
    """
    message_id = ids.ascending("msg", timestamp_ms=time_ms)
    if index % 8 == 0:
        # User turns: ~1.2k tokens, every fifth one ~3k (over the per-message cap).
        words = 20 if small else (900 if index % 40 else 2200)
        return Message(
            id=message_id,
            session_id=session_id,
            role="user",
            time_created=time_ms,
            parts=[TextPart(text=text.words_from(index, words))],
        )
    return Message(
        id=message_id,
        session_id=session_id,
        role="assistant",
        time_created=time_ms,
        time_completed=time_ms + 5,
        finish="tool-calls",
        model="bench",
        usage=TokenUsage(input=100_000, output=200),
        parts=[
            TextPart(text=text.words_from(index + 1, 6 if small else 30)),
            ToolPart(
                call_id=f"call_{index}",
                tool=_TOOLS[index % len(_TOOLS)],
                state=ToolStateCompleted(
                    input={"path": f"src/module_{index % 53}.py", "pattern": f"def f{index}"},
                    output=text.code_slice(index, 80 if small else 1600),
                    time=ToolTime(start=time_ms + 1, end=time_ms + 4),
                ),
            ),
        ],
    )


def _markdown(
    text: _Text, headings: list[str], size: int, *, seed: int, preamble: str, script: str
) -> str:
    """A section-structured markdown file of about ``size`` characters."""
    per_section = max(1, size // max(1, len(headings)))
    out = [preamble, ""]
    for number, heading in enumerate(headings):
        out.extend([heading, f"_What section {number + 1} holds._"])
        if number % 3 == 0:
            out.append(f"- See checkpoint-topic{number}.md (12 items) - spilled-over details")
        written = 0
        line = 0
        while written < per_section:
            entry = f"- {text.words_from(seed * 1000 + number * 97 + line, 24, script)}"
            out.append(entry)
            written += len(entry) + 1
            line += 1
        out.append("")
    return "\n".join(out)


_PROJECT_HEADINGS = [
    "## Project context",
    "## Rules",
    "## Architecture decisions",
    "## Discovered durable knowledge",
]


def _memory_files(
    layout: MemoryLayout, text: _Text, session_id: str, size: int, script: str, seed: int
) -> dict[Path, str]:
    """Fresh contents of the four memory files, as a writer and the agent leave them."""
    notes_words = max(1, size // 120)
    return {
        layout.checkpoint_path(session_id): _markdown(
            text,
            [s.heading for s in CHECKPOINT_SECTIONS],
            size,
            seed=seed,
            preamble="Topic: benchmark session rebuilding a large context",
            script=script,
        ),
        layout.project_memory_path(PROJECT): "# Memory\n"
        + _markdown(
            text, _PROJECT_HEADINGS, size, seed=seed + 1, preamble="Shared.", script=script
        ),
        layout.global_memory_path(): "# Memory\n"
        + _markdown(
            text, _PROJECT_HEADINGS, size, seed=seed + 2, preamble="Global.", script=script
        ),
        layout.notes_path(session_id): "\n".join(
            text.words_from(seed * 31 + i, 20, script) for i in range(notes_words // 20 + 1)
        ),
    }


async def _session(
    store: SQLiteStore, layout: MemoryLayout, text: _Text, plan: _Plan, stored: int, number: int
) -> tuple[str, list[Message]]:
    """Store one session of ``stored`` messages; return its id and its tail."""
    start = time.time_ns() // 1_000_000 - 100_000_000 + number * 1_000_000
    session = Session(project_id=PROJECT, time_created=start)
    await store.create_session(session)
    live_from = stored - plan.live
    messages = [
        _message(text, session.id, i, start + i * 10, small=i < live_from - 200)
        for i in range(stored)
    ]
    for first in range(0, stored, 2000):
        await store.append_messages(messages[first : first + 2000])
    # The previous rebuild: its watermark leaves the newest `live` messages live.
    previous = build_boundary_message(
        watermark=messages[live_from - 1],
        digest_up_to=None,
        directory="memory",
        number=1,
        index_text="## Checkpoint\n(previous)",
        body="The previous rebuild's body.",
        actors_text="## Active Actors\n(none)",
        newer_than=messages[-1].id,
    )
    assert await store.commit_rebuild(
        session.id, usage_key="previous", boundary=previous, updated=[]
    )
    await store.set_watermark(session.id, messages[stored - plan.tail - 1].id)
    now = time.time_ns() // 1_000_000
    statuses = ("open", "in_progress", "blocked", "done", "abandoned")
    for i in range(plan.tasks):
        parent = f"T{i // 4 + 1}" if i % 4 else None
        task_id = f"{parent}.{i % 4}" if parent else f"T{i // 4 + 1}"
        await store.upsert_task(
            Task(
                id=task_id,
                session_id=session.id,
                parent_id=parent,
                status=statuses[i % len(statuses)],
                summary=text.words_from(300 + i, 14),
                time_created=now,
                time_updated=now,
            )
        )
    for i in range(plan.actors):
        await store.upsert_actor(
            Actor(
                id=f"act_{stored}_{number}_{i}",
                session_id=session.id,
                agent="explore",
                description=text.words_from(500 + i, 12),
                status="running" if i % 2 else "pending",
                time_created=now,
                time_last_activity=now,
            )
        )
    for i in range(plan.memory_files):
        where = layout.session_dir(session.id) if i % 2 else layout.project_dir(PROJECT)
        extra = where / "topics" / f"topic-{number:03d}-{i:03d}.md"
        extra.parent.mkdir(parents=True, exist_ok=True)
        extra.write_text(f"# Topic {i}\n\n{text.words_from(i, 40)}\n", encoding="utf-8")
    return session.id, messages[stored - plan.tail :]


# --------------------------------------------------------------------------- floors

# What the section-aware read must find (SPEC R6.2, A8), as whole-text scans.
_SKELETON = re.compile(r"\n(?:## |[^\S\n]*_[^\n]*_[^\S\n]*(?=\n|\Z)|- See \S+\.md \(\d+)")


def _realistic_floor(paths: list[Path], tail: list[Message]) -> int:
    """Read each file once, one pass for its skeleton lines and UTF-16 length, JSON of the tail."""
    found = 0
    for path in paths:
        content = path.read_bytes().decode("utf-8")
        found += len(_SKELETON.findall(content)) + utf16_length(content)
    for message in tail:
        found += len(message.model_dump_json())
    return found


def _bare_floor(budgets: list[tuple[Path, int]]) -> int:
    """Read the budgeted bytes only: each file's cap, four bytes per token."""
    read = 0
    for path, tokens in budgets:
        with path.open("rb") as handle:
            read += len(handle.read(tokens * 4))
    return read


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


# --------------------------------------------------------------------------- run


@dataclass(slots=True)
class _Row:
    stored: int
    size: int
    script: str
    rebuild: Samples
    realistic: Samples
    bare: Samples
    tokens: int
    outcomes: list[str]
    sections: list[Any]


async def _measure_row(
    middleware: ContextMiddleware,
    layout: MemoryLayout,
    text: _Text,
    sessions: list[tuple[str, list[Message]]],
    stored: int,
    size: int,
    script: str,
    seed: int,
) -> _Row:
    caps = PushCaps()
    rebuilds: list[tuple[float, float]] = []
    realistic: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    outcomes: list[str] = []
    body_tokens = 0
    sections: list[Any] = []
    for number, (session_id, tail) in enumerate(sessions):
        files = _memory_files(layout, text, session_id, size, script, seed + number)
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
        # The writer just finished: the middleware indexes its files in the
        # background, so the rebuild's own reconcile (R5.6) finds the index current.
        await middleware.memory_index.reconcile(layout, session_id=session_id, project_id=PROJECT)
        await middleware.prepare(session_id)  # a live session: its window is loaded
        paths = list(files)
        budgets = list(
            zip(paths, (caps.checkpoint, caps.memory, caps.global_, caps.notes), strict=True)
        )
        # Interleaved: the position of the rebuild among the three rotates.
        order = ("rebuild", "realistic", "bare")
        shift = number % 3
        for step in order[shift:] + order[:shift]:
            if step == "realistic":
                realistic.append(_timed(partial(_realistic_floor, paths, tail)))
            elif step == "bare":
                bare.append(_timed(partial(_bare_floor, budgets)))
            else:
                seconds, report = await atime(
                    lambda s=session_id: middleware.rebuild(s, manual=True)
                )
                rebuilds.append(seconds)
                outcomes.append(report.outcome)
                if report.sections is not None:
                    body_tokens = report.sections.tokens
                    sections = report.sections.sections
    return _Row(
        stored,
        size,
        script,
        Samples.of(rebuilds),
        Samples.of(realistic),
        Samples.of(bare),
        body_tokens,
        outcomes,
        sections,
    )


async def _run(plan: _Plan) -> dict[str, Any]:
    text = _Text()
    directory = Path(tempfile.mkdtemp(prefix="mimo-ctx-bench-rebuild-"))
    config = RebuildConfig()
    rows: list[_Row] = []
    try:
        layout = MemoryLayout(directory / "memory")
        db_path = directory / "rebuild.db"
        variants = [(size, script) for size in plan.file_sizes for script in SCRIPTS]
        async with SQLiteStore(db_path) as store:
            by_history: dict[int, list[list[tuple[str, list[Message]]]]] = {}
            number = 0
            for stored in plan.histories:
                by_history[stored] = []
                for _variant in variants:
                    row_sessions: list[tuple[str, list[Message]]] = []
                    for _ in range(plan.samples):
                        row_sessions.append(
                            await _session(store, layout, text, plan, stored, number)
                        )
                        number += 1
                    by_history[stored].append(row_sessions)
        async with (
            SQLiteStore(db_path) as store,
            ContextMiddleware(store, layout.root, model=HUGE, config=config) as middleware,
        ):
            settle_heap()
            seed = 100
            for stored in plan.histories:
                for (size, script), row_sessions in zip(variants, by_history[stored], strict=True):
                    rows.append(
                        await _measure_row(
                            middleware, layout, text, row_sessions, stored, size, script, seed
                        )
                    )
                    seed += plan.samples * 10
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _report(plan, rows)


def _size_label(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1_000_000 else f"{size / 1e3:.0f} KB"


def _report(plan: _Plan, rows: list[_Row]) -> dict[str, Any]:
    timing_rows: list[list[str]] = []
    worst: _Row | None = None
    worst_ratio = 0.0
    for row in rows:
        ratio = row.rebuild.median / row.realistic.median
        bare_ratio = row.rebuild.median / row.bare.median
        if ratio > worst_ratio:
            worst, worst_ratio = row, ratio
        timing_rows.append(
            [
                fmt_num(row.stored),
                f"{_size_label(row.size)} {row.script}",
                fmt_ms(row.rebuild.median),
                fmt_ms(row.rebuild.minimum),
                fmt_ms(row.rebuild.cpu_median),
                fmt_ms(row.realistic.median),
                fmt_ms(row.bare.median),
                fmt_ratio(ratio),
                f"{row.rebuild.cpu_median / row.realistic.cpu_median:.1f}×",
                fmt_ratio(bare_ratio),
                fmt_num(row.tokens),
            ]
        )
    timing = table(
        f"Rebuild per row (median of {plan.samples} sessions, one rebuild each, "
        "floors interleaved on the same sessions)",
        [
            "stored msgs",
            "memory files",
            "rebuild median",
            "min",
            "CPU median",
            "realistic floor",
            "bare floor",
            "÷ realistic",
            "÷ realistic (CPU)",
            "÷ bare",
            "body tokens",
        ],
        timing_rows,
    )
    largest = max(rows, key=lambda r: (r.size, r.stored, r.script == "non-ASCII"))
    section_table = table(
        f"Body sections ({fmt_num(largest.stored)} stored, {_size_label(largest.size)} "
        f"{largest.script} files; outcomes {', '.join(sorted(set(largest.outcomes)))})",
        ["section", "tokens", "cap", "unit"],
        [[s.heading, fmt_num(s.tokens), fmt_num(s.cap), s.unit] for s in largest.sections],
    )
    slowest = max(rows, key=lambda r: r.rebuild.median)
    ratios = " / ".join(fmt_ratio(r.rebuild.median / r.realistic.median) for r in rows)
    targets = [
        Target(
            "rebuild vs realistic floor, every row",
            "within 3×",
            ratios,
            worst_ratio <= 3,
            ratio=worst_ratio,
            note=(
                f"worst: {fmt_num(worst.stored)} stored, {_size_label(worst.size)} {worst.script}"
                if worst is not None
                else ""
            ),
        ),
        Target(
            "rebuild median, every row",
            "≤ 50 ms",
            fmt_ms(slowest.rebuild.median),
            slowest.rebuild.median <= 0.050,
            ratio=slowest.rebuild.median / 0.050,
            note=f"slowest: {fmt_num(slowest.stored)} stored, {_size_label(slowest.size)} "
            f"{slowest.script}",
        ),
    ]
    notes = [
        f"Each session: a previous boundary leaves {plan.live} messages live (the loaded "
        f"window), the watermark lies {plan.tail} messages before the end; {plan.tasks} tasks, "
        f"{plan.actors} active actors, {plan.memory_files} extra memory files. The four memory "
        "files are rewritten before every rebuild (fresh content, as after a writer) and the "
        "memory index is caught up first, as the middleware does after a writer finishes.",
        "Realistic floor: read each memory file once, one regex pass over it for the skeleton "
        "lines and its UTF-16 length, one JSON serialisation (pydantic-core) of the tail. Bare "
        "floor: read each file's cap in bytes (four per token) and nothing else.",
        "Non-ASCII files: Chinese words with emoji (astral characters count two UTF-16 units).",
    ]
    data: dict[str, Any] = {
        "rows": [
            {
                "stored": r.stored,
                "file_size": r.size,
                "script": r.script,
                "rebuild": r.rebuild.to_json(),
                "realistic_floor": r.realistic.to_json(),
                "bare_floor": r.bare.to_json(),
                "ratio_realistic": r.rebuild.median / r.realistic.median,
                "ratio_bare": r.rebuild.median / r.bare.median,
                "body_tokens": r.tokens,
                "outcomes": r.outcomes,
            }
            for r in rows
        ],
        "worst_ratio": worst_ratio,
    }
    return result(
        NAME, TITLE, tables=[timing, section_table], targets=targets, notes=notes, data=data
    )


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the rebuild benchmark (``quick``: small sessions and files, two per row)."""
    return anyio.run(_run, QUICK if quick else FULL)
