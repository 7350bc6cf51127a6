"""Hot path: the per-turn cost of ``ContextMiddleware.prepare()`` on the SQLite store.

Stored histories of 1k, 10k and 50k messages are written straight through
:class:`~mimo_ctx.store.sqlite.SQLiteStore` (batches of appends, then one
boundary committed with :meth:`~mimo_ctx.store.base.Store.commit_rebuild`
whose watermark leaves a live window of 500 messages, about 150k estimated
tokens). The model window is huge (``ModelLimits(10_000_000)``) so no rebuild or
writer runs while timing. Measured:

* **warm, no new messages**: ``prepare()`` again and again on a loaded session;
* **warm, one turn each**: before each timed ``prepare()``, one user message and
  one assistant reply (with a tool call and its result) are appended, as in a
  live agent loop. Every few turns the window is reset to 500 messages (a new
  boundary, untimed) so it does not drift upwards;
* **cold**: a new store connection and a new middleware, first ``prepare()``.

Baselines, timed in the same run on the same messages:

* **(i)** the same turn done the way peers do it: re-estimate every live
  message's tokens from JSON (each part's JSON / 4, no cache);
* **(ii)** LangChain 1.x: ``SummarizationMiddleware.before_model`` with a
  trigger that does not fire, plus ``ContextEditingMiddleware`` with
  ``ClearToolUsesEdit`` (not firing either) through ``wrap_model_call``, on the
  same window converted to LangChain messages; fake model, no network.
  Skipped with a note when langchain is not installed.
"""

from __future__ import annotations

import gc
import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx import ids
from mimo_ctx.messages import (
    CheckpointPart,
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
    new_message_id,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.base import RequestPrefix, Session
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.tokens import estimate_part_tokens
from mimo_ctx.triggers import ModelLimits
from mimo_ctx.view import apply_send_rules

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
    time_call,
)

__all__ = ["NAME", "TITLE", "run"]

NAME = "hot_path"
TITLE = "Hot path: prepare() per turn (SQLite store)"

HUGE = ModelLimits(10_000_000)
_TOOLS = ("read", "bash", "grep", "edit")
_BATCH = 2000


@dataclass(frozen=True, slots=True)
class _Plan:
    sizes: tuple[int, ...]
    window: int
    static: int  # warm prepares without new messages
    resets: int  # window resets in turn mode
    turns: int  # timed turns per reset
    cold: int  # cold first prepares
    baseline_static: int  # baseline runs without new messages


FULL = _Plan(
    sizes=(1_000, 10_000, 50_000),
    window=500,
    static=300,
    resets=6,
    turns=25,
    cold=7,
    baseline_static=40,
)
QUICK = _Plan(sizes=(150, 300), window=60, static=10, resets=2, turns=3, cold=2, baseline_static=3)


# --------------------------------------------------------------------------- data


class _Text:
    """Deterministic slices of real text: the library's code and Python's English docs."""

    def __init__(self) -> None:
        self.code = source_text()
        try:
            from pydoc_data.topics import topics

            self.prose = " ".join(" ".join(str(v).split()) for _, v in sorted(topics.items()))
        except ImportError:  # stripped Python builds
            self.prose = " ".join(self.code.split())

    @staticmethod
    def _slice(text: str, seed: int, chars: int) -> str:
        start = (seed * 7919) % max(1, len(text) - chars)
        return text[start : start + chars]

    def code_slice(self, seed: int, chars: int) -> str:
        return self._slice(self.code, seed, chars)

    def prose_slice(self, seed: int, chars: int) -> str:
        return self._slice(self.prose, seed, chars)


SYSTEM_PROMPT_CHARS = 8000
TOOL_DEFINITIONS = 12


def _prefix(text: _Text) -> RequestPrefix:
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": text.prose_slice(1000 + i, 400),
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["path"],
                },
            },
        }
        for i in range(TOOL_DEFINITIONS)
    ]
    return RequestPrefix(system=text.prose_slice(7, SYSTEM_PROMPT_CHARS), tools=tools)


def make_message(text: _Text, session_id: str, index: int, time_ms: int, *, fresh: bool) -> Message:
    """Message number ``index`` of a coding session: every tenth a user turn, else a tool round.

    ``fresh`` gives it an id made now (a live turn) instead of one for ``time_ms``.
    """
    message_id = new_message_id() if fresh else ids.ascending("msg", timestamp_ms=time_ms)
    if index % 10 == 0:
        return Message(
            id=message_id,
            session_id=session_id,
            role="user",
            time_created=time_ms,
            parts=[TextPart(text=text.prose_slice(index, 420))],
        )
    tool = _TOOLS[index % len(_TOOLS)]
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
            TextPart(text=text.prose_slice(index + 3, 120)),
            ToolPart(
                call_id=f"call_{index}",
                tool=tool,
                state=ToolStateCompleted(
                    input={"path": f"src/module_{index % 97}.py", "limit": 200},
                    output=text.code_slice(index, 700),
                    time=ToolTime(start=time_ms + 1, end=time_ms + 4),
                ),
            ),
        ],
    )


def make_boundary(text: _Text, watermark: tuple[str, int], session_id: str, number: int) -> Message:
    """A rebuild boundary covering up to ``watermark`` (id, time) with an ~8k-token body."""
    watermark_id, watermark_time = watermark
    return Message(
        id=new_message_id(),
        session_id=session_id,
        role="user",
        time_created=watermark_time + 1,
        parts=[
            CheckpointPart(covered_up_to=watermark_id, number=number, directory="memory"),
            TextPart(text="## Checkpoint\n" + text.prose_slice(number, 300), synthetic=True),
            TextPart(text=text.prose_slice(number + 11, 32_000), synthetic=True),
            TextPart(text="## Active Actors\n(none)", synthetic=True),
        ],
    )


# --------------------------------------------------------------------------- baselines


def reestimate(messages: Sequence[Message]) -> int:
    """Baseline (i): every live message's tokens re-estimated from JSON, no cache."""
    return sum(estimate_part_tokens(part) for message in messages for part in message.parts)


class _LangChainPair:
    """Baseline (ii): LangChain's summarization check plus context editing, not firing."""

    def __init__(self, system: str) -> None:
        from langchain.agents.middleware import (
            ClearToolUsesEdit,
            ContextEditingMiddleware,
            SummarizationMiddleware,
        )
        from langchain.agents.middleware.types import ModelRequest, ModelResponse
        from langchain_core.language_models.fake_chat_models import FakeListChatModel
        from langchain_core.messages import AIMessage, SystemMessage

        self._model = FakeListChatModel(responses=["ok"])
        self._summarize = SummarizationMiddleware(
            self._model, trigger=("tokens", 100_000_000), keep=("messages", 20)
        )
        self._edit = ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=100_000_000)])
        self._request_type = ModelRequest
        self._system = SystemMessage(content=system)
        answer = ModelResponse(result=[AIMessage(content="ok")])
        self._handler: Callable[[Any], Any] = lambda _request: answer

    def turn(self, messages: list[Any]) -> None:
        state: Any = {"messages": messages}
        self._summarize.before_model(state, None)  # pyright: ignore[reportArgumentType]
        request = self._request_type(
            model=self._model, messages=messages, system_message=self._system, tools=[]
        )
        self._edit.wrap_model_call(request, self._handler)


def to_langchain(messages: Sequence[Message]) -> list[Any]:
    """The messages as a LangChain agent holds them (send rules applied first)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[Any] = []
    for message in apply_send_rules(messages):
        texts = "\n".join(p.text for p in message.parts if isinstance(p, TextPart))
        if message.role == "user":
            out.append(HumanMessage(content=texts, id=message.id))
            continue
        calls = [p for p in message.parts if isinstance(p, ToolPart)]
        out.append(
            AIMessage(
                content=texts,
                id=message.id,
                tool_calls=[
                    {
                        "name": c.tool,
                        "args": dict(c.state.input),
                        "id": c.call_id,
                        "type": "tool_call",
                    }
                    for c in calls
                ],
            )
        )
        for call in calls:
            state = call.state
            output = state.output if isinstance(state, ToolStateCompleted) else ""
            out.append(
                ToolMessage(content=output, tool_call_id=call.call_id, name=call.tool, id=None)
            )
    return out


def _langchain_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("langchain.agents.middleware") is not None
    except ImportError:
        return False


# --------------------------------------------------------------------------- one size


@dataclass(slots=True)
class _Stored:
    path: Path
    session_id: str
    main: list[tuple[str, int]]  # (id, time) of every main-agent message, in order
    boundaries: int = 0


async def _build(directory: Path, text: _Text, size: int, window: int) -> _Stored:
    path = directory / f"history-{size}.db"
    start = time.time_ns() // 1_000_000 - size * 10 - 60_000
    async with SQLiteStore(path) as store:
        session = Session(time_created=start, prefix=_prefix(text))
        await store.create_session(session)
        main: list[tuple[str, int]] = []
        for first in range(0, size, _BATCH):
            batch = [
                make_message(text, session.id, i, start + i * 10, fresh=False)
                for i in range(first, min(size, first + _BATCH))
            ]
            await store.append_messages(batch)
            main.extend((m.id, m.time_created) for m in batch)
        stored = _Stored(path=path, session_id=session.id, main=main)
        await _reset_window(store, text, stored, window)
    return stored


async def _reset_window(store: SQLiteStore, text: _Text, stored: _Stored, window: int) -> None:
    """Commit a boundary whose watermark leaves the newest ``window`` messages live."""
    stored.boundaries += 1
    watermark = stored.main[-window - 1]
    boundary = make_boundary(text, watermark, stored.session_id, stored.boundaries)
    committed = await store.commit_rebuild(
        stored.session_id, usage_key=f"bench-{stored.boundaries}", boundary=boundary, updated=[]
    )
    assert committed


async def _window_messages(store: SQLiteStore, stored: _Stored, window: int) -> list[Message]:
    """The live window as stored: the newest boundary plus the messages after its watermark."""
    boundary = await store.latest_boundary(stored.session_id)
    assert boundary is not None
    watermark = stored.main[-window - 1]
    after = await store.list_messages(
        stored.session_id, since=(watermark[1], watermark[0] + "\uffff")
    )
    return [boundary, *[m for m in after if not m.is_boundary]]


def _turn_messages(text: _Text, session_id: str, counter: itertools.count[int]) -> list[Message]:
    now = time.time_ns() // 1_000_000
    index = next(counter) * 10
    return [
        make_message(text, session_id, index, now, fresh=True),
        make_message(text, session_id, index + 1, now, fresh=True),
    ]


async def _measure_size(
    directory: Path, text: _Text, size: int, plan: _Plan, langchain: bool
) -> dict[str, Any]:
    build_start = time.perf_counter()
    stored = await _build(directory, text, size, plan.window)
    build_seconds = time.perf_counter() - build_start
    memory_root = directory / f"memory-{size}"
    session_dir = memory_root / "sessions" / stored.session_id
    session_dir.mkdir(parents=True)
    # After a rebuild the session has a checkpoint, so the per-turn reminder is on.
    (session_dir / "checkpoint.md").write_text("Topic: bench\n", encoding="utf-8")
    sid = stored.session_id
    counter = itertools.count(size)
    out: dict[str, Any] = {"size": size, "build_seconds": build_seconds}

    async with (
        SQLiteStore(stored.path) as store,
        ContextMiddleware(store, memory_root, model=HUGE) as middleware,
    ):
        view = await middleware.prepare(sid)
        settle_heap()
        out["window_messages"] = len(view.messages)
        out["window_tokens"] = view.tokens

        # Warm, no new messages.
        values: list[tuple[float, float]] = []
        for _ in range(plan.static):
            seconds, _view = await atime(lambda: middleware.prepare(sid))
            values.append(seconds)
        out["warm_static"] = Samples.of(values)

        # Warm, one turn (user message + assistant tool round) before each prepare.
        values = []
        windows: list[list[Message]] = []
        turns: list[list[list[Message]]] = []
        for _ in range(plan.resets):
            await _reset_window(store, text, stored, plan.window)
            await middleware.prepare(sid)  # untimed: loads the new window
            windows.append(await _window_messages(store, stored, plan.window))
            appended: list[list[Message]] = []
            for _turn in range(plan.turns):
                new = _turn_messages(text, sid, counter)
                await middleware.append(new)
                stored.main.extend((m.id, m.time_created) for m in new)
                appended.append(new)
                seconds, _view = await atime(lambda: middleware.prepare(sid))
                values.append(seconds)
            turns.append(appended)
        out["warm_turn"] = Samples.of(values)
        out["turn_window_tokens"] = (await middleware.prepare(sid)).tokens

    # Cold: a new connection and a new middleware, first prepare.
    values = []
    for _ in range(plan.cold):
        store = SQLiteStore(stored.path)
        try:
            async with ContextMiddleware(store, memory_root, model=HUGE) as middleware:
                seconds, _view = await atime(lambda: middleware.prepare(sid))
                values.append(seconds)
        finally:
            await store.aclose()
    out["cold"] = Samples.of(values)

    # Baselines on the same windows and the same new messages.
    settle_heap()
    static_window = windows[0]
    out["base_i_static"] = time_call(lambda: reestimate(static_window), plan.baseline_static)
    out["base_i_turn"] = _turn_baseline(windows, turns, reestimate, list)
    if langchain:
        pair = _LangChainPair(_prefix(text).system)
        converted = to_langchain(static_window)
        out["base_ii_static"] = time_call(lambda: pair.turn(converted), plan.baseline_static)
        out["base_ii_turn"] = _turn_baseline(windows, turns, pair.turn, to_langchain)
    gc.unfreeze()
    return out


def _turn_baseline(
    windows: list[list[Message]],
    turns: list[list[list[Message]]],
    step: Callable[[Any], object],
    convert: Callable[[Sequence[Message]], list[Any]],
) -> Samples:
    """Time ``step`` on each turn's window, the window growing as in the mimo_ctx run."""
    values: list[tuple[float, float]] = []
    for window, appended in zip(windows, turns, strict=True):
        current = convert(window)
        for new in appended:
            current.extend(convert(new))
            gc.disable()
            try:
                start, cpu = time.perf_counter(), time.process_time()
                step(current)
                values.append((time.perf_counter() - start, time.process_time() - cpu))
            finally:
                gc.enable()
    return Samples.of(values)


# --------------------------------------------------------------------------- report


def _ratio(base: Samples | None, ours: Samples) -> float | None:
    return None if base is None else base.median / ours.median


async def _run(plan: _Plan) -> dict[str, Any]:
    text = _Text()
    langchain = _langchain_available()
    directory = Path(tempfile.mkdtemp(prefix="mimo-ctx-bench-hot-"))
    try:
        sizes = [await _measure_size(directory, text, n, plan, langchain) for n in plan.sizes]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _report(plan, sizes, langchain)


def _report(plan: _Plan, sizes: list[dict[str, Any]], langchain: bool) -> dict[str, Any]:
    rows: list[list[str]] = []
    for s in sizes:
        rows.append(
            [
                fmt_num(s["size"]),
                f"{s['window_messages']} msgs / {fmt_num(s['window_tokens'])} tok",
                fmt_ms(s["warm_static"].median),
                fmt_ms(s["warm_turn"].median),
                fmt_ms(s["warm_turn"].cpu_median),
                fmt_ms(s["warm_turn"].p90),
                fmt_ms(s["cold"].median),
                fmt_ms(s["base_i_turn"].median),
                fmt_ms(s["base_ii_turn"].median) if "base_ii_turn" in s else "n/a",
                fmt_ratio(_ratio(s["base_i_turn"], s["warm_turn"]) or 0),
                fmt_ratio(_ratio(s.get("base_ii_turn"), s["warm_turn"]) or 0)
                if "base_ii_turn" in s
                else "n/a",
            ]
        )
    main = table(
        f"prepare() medians (window {plan.window} messages; warm static n={plan.static}, "
        f"turn n={plan.resets * plan.turns}, cold n={plan.cold})",
        [
            "stored msgs",
            "live window",
            "warm (no new msgs)",
            "warm (1 turn)",
            "its CPU time",
            "warm p90",
            "cold (1st prepare)",
            "(i) re-estimate",
            "(ii) LangChain pair",
            "(i)/ours",
            "(ii)/ours",
        ],
        rows,
    )
    static_rows = [
        [
            fmt_num(s["size"]),
            fmt_ms(s["warm_static"].median),
            fmt_ms(s["base_i_static"].median),
            fmt_ms(s["base_ii_static"].median) if "base_ii_static" in s else "n/a",
            fmt_ratio(_ratio(s["base_i_static"], s["warm_static"]) or 0),
            fmt_ratio(_ratio(s.get("base_ii_static"), s["warm_static"]) or 0)
            if "base_ii_static" in s
            else "n/a",
            f"{s['build_seconds']:.1f} s",
        ]
        for s in sizes
    ]
    static = table(
        "Without new messages: ours vs baselines on the same window",
        [
            "stored msgs",
            "ours",
            "(i) re-estimate",
            "(ii) LangChain pair",
            "(i)/ours",
            "(ii)/ours",
            "build",
        ],
        static_rows,
    )

    first, last = sizes[0], sizes[-1]
    turn_ms = [s["warm_turn"].median for s in sizes]
    flat = last["warm_turn"].median / first["warm_turn"].median
    worst_i = min(_ratio(s["base_i_turn"], s["warm_turn"]) or 0 for s in sizes)
    turn_cpu = [s["warm_turn"].cpu_median for s in sizes]
    cpu_i = min(s["base_i_turn"].cpu_median / s["warm_turn"].cpu_median for s in sizes)
    targets = [
        Target(
            "warm prepare() median, 1 turn, 500-message window",
            "≤ 1 ms",
            " / ".join(fmt_ms(v) for v in turn_ms),
            max(turn_ms) <= 0.001,
            ratio=max(turn_ms) / 0.001,
            note="CPU time " + " / ".join(fmt_ms(v) for v in turn_cpu),
        ),
        Target(
            f"flat: {fmt_num(last['size'])} stored vs {fmt_num(first['size'])}",
            "within 1.5×",
            fmt_ratio(flat),
            flat <= 1.5,
            ratio=flat,
        ),
        Target(
            f"cold first prepare at {fmt_num(last['size'])} stored",
            "≤ 50 ms",
            fmt_ms(last["cold"].median),
            last["cold"].median <= 0.050,
            ratio=last["cold"].median / 0.050,
        ),
        Target(
            "cheaper than (i) re-estimating from JSON",
            "≥ 5×",
            fmt_ratio(worst_i),
            worst_i >= 5,
            ratio=worst_i,
            note=f"worst ratio of CPU times {fmt_ratio(cpu_i)}",
        ),
    ]
    if langchain:
        worst_ii = min(_ratio(s.get("base_ii_turn"), s["warm_turn"]) or 0 for s in sizes)
        cpu_ii = min(
            s["base_ii_turn"].cpu_median / s["warm_turn"].cpu_median
            for s in sizes
            if "base_ii_turn" in s
        )
        targets.append(
            Target(
                "cheaper than (ii) LangChain summarization + context editing",
                "≥ 10×",
                fmt_ratio(worst_ii),
                worst_ii >= 10,
                ratio=worst_ii,
                note=f"worst ratio of CPU times {fmt_ratio(cpu_ii)}",
            )
        )
    else:
        targets.append(
            Target(
                "cheaper than (ii) LangChain pair",
                "≥ 10×",
                "not measured",
                None,
                note="langchain is not installed (pip install 'mimo-ctx[test]')",
            )
        )
    data = {
        "plan": {
            "sizes": list(plan.sizes),
            "window": plan.window,
            "static": plan.static,
            "turns": plan.resets * plan.turns,
            "cold": plan.cold,
        },
        "sizes": [
            {
                key: (value.to_json() if isinstance(value, Samples) else value)
                for key, value in s.items()
            }
            for s in sizes
        ],
    }
    notes = [
        "Warm (1 turn): one user message and one assistant tool round are appended before "
        "each timed prepare(); the window is reset to "
        f"{plan.window} messages every {plan.turns} turns.",
        "Baselines run on the same window and the same appended messages; (ii) converts them "
        "to LangChain messages once (untimed), as a LangChain agent holds them.",
        f"Median of medians across sizes: {fmt_ms(statistics.median(turn_ms))}.",
    ]
    return result(NAME, TITLE, tables=[main, static], targets=targets, notes=notes, data=data)


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the hot-path benchmark (``quick``: tiny histories, a few samples)."""
    return anyio.run(_run, QUICK if quick else FULL)
