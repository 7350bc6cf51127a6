"""Wrappers and integrations: the per-call overhead of mimo_ctx against the bare call.

For each way in (``wrap_openai`` chat completions, plain and streamed, and
Responses; ``wrap_anthropic`` messages, plain and through ``messages.stream()``;
the pydantic-ai capability; the LangChain middleware) and each host
history of 100, 1,000 and 5,000 messages, a host runs its usual turn: it sends
its whole list, appends the answer and its next message, sends again. The bare
call (the same SDK client, agent or graph without mimo_ctx) and the managed call
get the very same list, one after the other, alternating which goes first
(interleaved, same run, same data). The SDKs talk to an in-process transport
(``httpx2.MockTransport``) that answers with a canned reply, so the figures are
the SDK's own work plus ours, without a network.

The store is SQLite on a file, the window large enough that no rebuild or writer
runs: the view is the whole history, the worst case for the per-call work.
Every fifth answer is a tool call with its result. Reported per call: the bare
call's CPU time and the managed call's (median and minimum), and the overhead:
the median of the per-pair differences, with a 95% confidence interval of that
median. Pairs come in blocks (see :class:`_Plan`), as many as a CPU budget per
cell allows. Each pair starts after the same idle pause at every size (a host
waits for the model between its calls): the store's worker does its idle WAL
checkpoint there, and every pair starts from the same state whatever the size,
not hot after a 25 ms call at 100 messages and cold after a second of the SDK's
work at 5,000. The CPU of mimo_ctx's own threads (the store's worker, named
``mimo-ctx ...``) goes to the managed call of its pair wherever it ran (the bare
call never uses them): in the pause, in either call or in the SDK's call.
Targets (issue 16), judged on those medians: the overhead at 5,000
messages within 1.5x the overhead at 100, and under 0.5x the bare call's own
cost at 5,000. For the two plain SDK calls, a stub client also shows what
mimo_ctx alone costs, with warm caches and after a 5,000-message walk. For the
three calls that are one SDK method call (not the streams), the managed call's
SDK method is timed too (through the same clock as the bare call's, so that
both have its one coroutine in their chain): the overhead splits
into mimo_ctx's part (the managed call outside its SDK call) and how much longer
the SDK's own work took inside the managed call than in the bare one. For the
OpenAI ways each pair also times a second bare call (an A/A control, in a
rotating order of the three), so a reader sees what the SDK's own spread makes
of a difference of nothing beside each cell.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.triggers import ModelLimits

from . import _instructions
from ._common import Target, fmt_ms, fmt_ratio, result, settle_heap, table

NAME = "wrappers"
TITLE = "Wrappers and integrations: per-call overhead against the bare call"

SIZES = (100, 1_000, 5_000)
QUICK_SIZES = (20, 40)
WAYS = (
    "openai",
    "openai stream",
    "openai responses",
    "anthropic",
    "anthropic stream",
    "pydantic-ai",
    "langchain",
)
_SDK_WAYS = frozenset(w for w in WAYS if w.startswith(("openai", "anthropic")))
_SPLIT_WAYS = frozenset({"openai", "openai responses", "anthropic"})  # one SDK call each
# The ways whose SDK call at 5,000 messages costs seconds: each pair has an A/A control.
_CONTROL_WAYS = frozenset(w for w in WAYS if w.startswith("openai"))
_ORDERS = tuple(itertools.permutations(("bare", "managed", "control")))
_TEXT = "Read the module, then explain what its public functions do and why. " * 3
LIMITS = ModelLimits(10_000_000, input_limit=10_000_000)


@dataclass(frozen=True)
class _Plan:
    """How many pairs a cell (one way in, one history size) gets.

    Pairs come in blocks, each a session of its own on a fresh copy of the
    history: within a block the host's list grows by two messages a pair, so a
    block stays close to its size. Blocks run until ``budget`` seconds of CPU
    were spent on the cell's pairs (at least ``min_blocks``, at most
    ``max_blocks``). A block has ``pairs`` pairs, fewer (never under
    ``min_pairs``) when its warm-up calls say that so many would take more than
    ``budget``; such a block is the cell's only one. Cheap cells get a hundred
    pairs or more, where the intervals are tight anyway; a 5,000-message OpenAI
    call (about two seconds of the SDK's own work on this machine) gets
    ``min_pairs``: more would not fit the part's time, and its interval is
    set by the SDK's own spread (the A/A column), not by mimo_ctx.
    """

    pairs: int
    min_blocks: int
    max_blocks: int
    budget: float
    gap: float = 0.0
    """Seconds of idle before each pair (and each stub call): longer than the store
    worker's idle checkpoint delay, so that checkpoint runs in it."""
    min_pairs: int = 1

    def more(self, blocks: int, spent: float) -> bool:
        """True when another block should run after ``blocks`` that took ``spent`` s."""
        return blocks < self.min_blocks or (blocks < self.max_blocks and spent < self.budget)

    def block_pairs(self, pair_cpu: float) -> int:
        """The pairs of a block whose pair costs about ``pair_cpu`` seconds of CPU."""
        fit = int(self.budget / pair_cpu) if pair_cpu > 0 else self.pairs
        return max(self.min_pairs, min(self.pairs, fit))


PLAN = _Plan(pairs=20, min_blocks=2, max_blocks=6, budget=6.0, gap=0.1, min_pairs=16)
QUICK_PLAN = _Plan(pairs=3, min_blocks=1, max_blocks=1, budget=0.0, gap=0.01, min_pairs=3)
ALONE_SAMPLES = 61
QUICK_ALONE_SAMPLES = 3


def _median_ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval of the median (order statistics)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 0.98 * n**0.5  # 1.96 standard deviations of a Binomial(n, 1/2) rank, halved
    low = max(int(n / 2 - half), 0)
    high = min(int(n / 2 + half + 0.999), n - 1)
    return ordered[low], ordered[high]


@dataclass
class _Pair:
    bare: list[float]
    managed: list[float]
    alone: list[float] | None = None  # the managed call on a stub client: ours only
    pressured: list[float] | None = None  # the same after a 5,000-message walk each call
    inside: list[float] | None = None  # the SDK method call inside each managed call
    control: list[float] | None = None  # a second bare call per pair: the A/A control

    @property
    def spent(self) -> float:
        """CPU seconds of every call of the pairs (what a cell's budget counts)."""
        return sum(self.bare) + sum(self.managed) + sum(self.control or [])

    @property
    def control_diffs(self) -> list[float]:
        """Per pair: the second bare call minus the bare call (both the same SDK call on
        the same list): what the SDK's own spread makes of a difference of nothing."""
        assert self.control is not None
        return [c - b for b, c in zip(self.bare, self.control, strict=True)]

    @property
    def ours(self) -> list[float]:
        """Per pair: the managed call outside its SDK call (mimo_ctx's own part)."""
        assert self.inside is not None
        return [m - i for m, i in zip(self.managed, self.inside, strict=True)]

    @property
    def sdk_diffs(self) -> list[float]:
        """Per pair: the SDK call inside the managed call minus the bare call."""
        assert self.inside is not None
        return [i - b for b, i in zip(self.bare, self.inside, strict=True)]

    @property
    def diffs(self) -> list[float]:
        return [m - b for b, m in zip(self.bare, self.managed, strict=True)]

    @property
    def overhead(self) -> float:
        """The median of the per-pair differences (what the targets judge)."""
        return statistics.median(self.diffs)

    @property
    def overhead_ci(self) -> tuple[float, float]:
        return _median_ci(self.diffs)

    @property
    def min_overhead(self) -> float:
        """The fastest managed call minus the fastest bare call."""
        return min(self.managed) - min(self.bare)

    def extend(self, other: _Pair) -> None:
        self.bare += other.bare
        self.managed += other.managed
        if other.inside is not None:
            self.inside = [*(self.inside or []), *other.inside]
        if other.control is not None:
            self.control = [*(self.control or []), *other.control]


class _OurThreads:
    """The CPU time of mimo_ctx's own threads (named ``mimo-ctx ...``: the SQLite
    store's worker), summed over every one seen so far: a thread that ended keeps
    what it had spent when last seen (one that started and ended between two
    readings is missed; the store's worker lives on for seconds after its last job)."""

    def __init__(self) -> None:
        self._spent: dict[threading.Thread, float] = {}

    def cpu(self) -> float:
        """Seconds of CPU these threads have spent so far."""
        for thread in threading.enumerate():
            ident = thread.ident
            if ident is None or not thread.name.startswith("mimo-ctx"):
                continue
            # A thread that ended just now keeps what it had spent.
            with contextlib.suppress(OSError):
                self._spent[thread] = time.clock_gettime(time.pthread_getcpuclockid(ident))
        return sum(self._spent.values())


_OURS = _OurThreads()


async def _timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """The process CPU time of ``fn()`` without mimo_ctx's threads (counted per pair)."""
    cpu, ours = time.process_time(), _OURS.cpu()
    value = await fn()
    return time.process_time() - cpu - (_OURS.cpu() - ours), value


# --------------------------------------------------------------------------- SDKs


def _openai_history(size: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    turn = 0
    while len(out) < size:
        out.append({"role": "user", "content": f"{_TEXT} ({turn})"})
        if turn % 5 == 4:
            call = {
                "id": f"call_h{turn}",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path":"a.py"}'},
            }
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            out.append({"role": "tool", "tool_call_id": f"call_h{turn}", "content": _TEXT})
            out.append({"role": "assistant", "content": f"Done {turn}."})
        else:
            out.append({"role": "assistant", "content": f"Answer {turn}. {_TEXT}"})
        turn += 1
    return out[:size]


def _openai_answer(number: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"Reply {number}.", "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105},
    }


def _anthropic_answer(number: int) -> dict[str, Any]:
    return {
        "id": f"msg_{number:024d}",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": f"Reply {number}."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 5},
    }


def _responses_answer(number: int) -> dict[str, Any]:
    text: dict[str, Any] = {
        "type": "output_text",
        "text": f"Reply {number}.",
        "annotations": [],
        "logprobs": [],
    }
    return {
        "id": f"resp_{number}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": "gpt-test",
        "output": [
            {
                "type": "message",
                "id": f"msg_{number}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        ],
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "usage": {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 105,
        },
    }


def _sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _openai_stream(number: int) -> bytes:
    """A Chat Completions stream of the answer: role, two text pieces, finish, [DONE]."""
    base = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-test",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**base, "choices": [choice]})

    return b"".join(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Reply "}),
            chunk({"content": f"{number}."}),
            chunk({}, "stop"),
            _sse("[DONE]"),
        ]
    )


def _anthropic_stream(number: int) -> bytes:
    """A Messages stream of the answer: start, one text block in two deltas, delta, stop."""
    start: dict[str, Any] = {**_anthropic_answer(number), "content": [], "stop_reason": None}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Reply "},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": f"{number}."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(_sse(data, event) for event, data in events)


def transport(answer: Callable[[int], dict[str, Any] | bytes]) -> Any:
    import httpx2

    counter = [0]

    def handler(request: httpx2.Request) -> httpx2.Response:
        counter[0] += 1
        body = answer(counter[0])
        if isinstance(body, bytes):
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)
        return httpx2.Response(200, json=body)

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))


def _anthropic_history(size: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    turn = 0
    while len(out) < size:
        if turn % 5 == 4 and out:
            call = {
                "type": "tool_use",
                "id": f"toolu_h{turn}",
                "name": "read",
                "input": {"path": "a.py"},
            }
            out.append({"role": "user", "content": f"{_TEXT} ({turn})"})
            out.append({"role": "assistant", "content": [call]})
            result_block = {
                "type": "tool_result",
                "tool_use_id": f"toolu_h{turn}",
                "content": _TEXT,
            }
            out.append({"role": "user", "content": [result_block]})
            out.append({"role": "assistant", "content": f"Done {turn}."})
        else:
            out.append({"role": "user", "content": f"{_TEXT} ({turn})"})
            out.append({"role": "assistant", "content": f"Answer {turn}. {_TEXT}"})
        turn += 1
    while out[-1]["role"] != "assistant":
        out.pop()
    return out[:size] if out[min(size, len(out)) - 1]["role"] == "assistant" else out[: size - 1]


def _responses_history(size: int) -> list[dict[str, Any]]:
    """The chat history of :func:`_openai_history` as Responses input items."""
    out: list[dict[str, Any]] = []
    for message in _openai_history(size):
        if message["role"] == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
        elif message.get("tool_calls"):
            for call in message["tool_calls"]:
                out.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    }
                )
        else:
            out.append({"role": message["role"], "content": message["content"]})
    return out


async def _drain_chat(stream: Any) -> str:
    """Read a Chat Completions stream to its end, as a host does; its text."""
    text = ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text


async def _openai_call(client: Any, host: list[Any]) -> Any:
    reply = await client.chat.completions.create(model="gpt-test", messages=host)
    return reply.choices[0].message.content


async def _openai_stream_call(client: Any, host: list[Any]) -> Any:
    stream = await client.chat.completions.create(model="gpt-test", messages=host, stream=True)
    return await _drain_chat(stream)


async def _responses_call(client: Any, host: list[Any]) -> Any:
    reply = await client.responses.create(model="gpt-test", input=host)
    return reply.output_text


async def _anthropic_call(client: Any, host: list[Any]) -> Any:
    reply = await client.messages.create(model="claude-test", max_tokens=64, messages=host)
    return reply.content[0].text


async def _anthropic_stream_call(client: Any, host: list[Any]) -> Any:
    async with client.messages.stream(model="claude-test", max_tokens=64, messages=host) as stream:
        async for _ in stream.text_stream:
            pass
        final = await stream.get_final_message()
    return final.content[0].text


_HistoryOf = Callable[[int], list[dict[str, Any]]]
_Call = Callable[[Any, list[Any]], Awaitable[Any]]

# Per way: the host history it sends and the one SDK call it times.
SDK_CALLS: dict[str, tuple[_HistoryOf, _Call]] = {
    "openai": (_openai_history, _openai_call),
    "openai stream": (_openai_history, _openai_stream_call),
    "openai responses": (_responses_history, _responses_call),
    "anthropic": (_anthropic_history, _anthropic_call),
    "anthropic stream": (_anthropic_history, _anthropic_stream_call),
}

# Per way: what the in-process server answers (the n-th request's body).
ANSWERS: dict[str, Callable[[int], dict[str, Any] | bytes]] = {
    "openai": _openai_answer,
    "openai stream": _openai_stream,
    "openai responses": _responses_answer,
    "anthropic": _anthropic_answer,
    "anthropic stream": _anthropic_stream,
}


def answer_text(text: Any) -> Any:
    return {"role": "assistant", "content": text}


class _Clock:
    """An SDK resource whose ``create`` is timed into ``spent`` (process CPU without
    mimo_ctx's threads); every other attribute is the resource's own."""

    def __init__(self, inner: Any, spent: list[float]) -> None:
        self._inner = inner
        self._spent = spent

    async def create(self, **kwargs: Any) -> Any:
        cpu, ours = time.process_time(), _OURS.cpu()
        try:
            return await self._inner.create(**kwargs)
        finally:
            # mimo_ctx's threads are counted outside the SDK call (see _pairs).
            self._spent.append(time.process_time() - cpu - (_OURS.cpu() - ours))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ClockedClient:
    """The SDK client of both sides when the managed call's SDK call is timed: the
    same client, its ``create`` methods timed (:class:`_Clock`). The bare call goes
    through a clock of its own too (its times unused): the clock's coroutine is one
    more entry in the chain CPython walks for every exception the SDK raises (see
    :mod:`mimo_ctx.providers._wrapper`), so a clock on one side only would make that
    side's SDK work slower in proportion to the history."""

    def __init__(self, raw: Any, spent: list[float]) -> None:
        self._raw = raw
        self.base_url = raw.base_url
        if hasattr(raw, "chat"):
            self.chat = type("Chat", (), {"completions": _Clock(raw.chat.completions, spent)})()
            self.responses = _Clock(raw.responses, spent)
        else:
            self.messages = _Clock(raw.messages, spent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


async def _sdk_way(way: str, size: int, plan: _Plan, root: Path) -> _Pair:
    import anthropic
    import openai

    from mimo_ctx.providers import wrap_anthropic, wrap_openai

    store = await SQLiteStore.open(root / f"{way}-{size}.db")
    session = f"ses-{way.replace(' ', '-')}-{size}"
    try:
        async with ContextMiddleware(store, root / "memory", model=LIMITS) as mw:
            wrap: Callable[..., Any]
            answer = ANSWERS[way]
            if way.startswith("openai"):
                raw: Any = openai.AsyncOpenAI(
                    api_key="sk",
                    base_url="http://fake/v1",
                    max_retries=0,
                    http_client=transport(answer),
                )
                wrap = wrap_openai
            else:
                raw = anthropic.AsyncAnthropic(
                    api_key="sk",
                    base_url="http://fake",
                    max_retries=0,
                    http_client=transport(answer),
                )
                wrap = wrap_anthropic

            history_of, call = SDK_CALLS[way]

            async def block(number: int) -> _Pair:
                host = history_of(size)
                spent: list[float] | None = [] if way in _SPLIT_WAYS else None
                client = raw if spent is None else _ClockedClient(raw, spent)
                bare = raw if spent is None else _ClockedClient(raw, [])
                managed = wrap(client, mw, session_id=f"{session}-{number}")
                return await _pairs(
                    host,
                    partial(call, bare, host),
                    partial(call, managed, host),
                    answer_text,
                    plan,
                    spent=spent,
                    control=way in _CONTROL_WAYS,
                )

            return await _blocks(plan, block)
    finally:
        await store.aclose()


async def _pairs(
    host: list[Any],
    bare_call: Callable[[], Awaitable[Any]],
    managed_call: Callable[[], Awaitable[Any]],
    answer_of: Callable[[Any], Any],
    plan: _Plan,
    *,
    spent: list[float] | None = None,
    control: bool = False,
) -> _Pair:
    """Warm up (the first managed call syncs the whole history), then time a block of
    pairs (:meth:`_Plan.block_pairs`), each after ``plan.gap`` seconds of idle (see
    :func:`_pair`).

    ``spent``: where the managed side's SDK calls put their times (see
    :class:`_ClockedClient`); each pair then records the one of its managed call.
    ``control``: each pair also times a second bare call (the A/A control)."""
    if host[-1].get("role") == "assistant":
        host.append({"role": "user", "content": "Go on."})
    reply = await managed_call()
    warm_cpu = 0.0
    for warm in range(3):
        host += [answer_of(reply), {"role": "user", "content": f"Warm {warm}."}]
        warm_cpu, reply = await _timed(managed_call)
    settle_heap()
    pair = _Pair([], [], inside=None if spent is None else [], control=[] if control else None)
    calls = 3 if control else 2
    for sample in range(plan.block_pairs(calls * warm_cpu)):
        host += [answer_of(reply), {"role": "user", "content": f"Turn {sample}."}]
        before = len(spent) if spent is not None else 0
        reply = await _pair(
            pair,
            bare_call,
            managed_call,
            gap=plan.gap,
            bare_first=sample % 2 == 1,
            control_call=bare_call if control else None,
            rotation=sample,
        )
        if spent is not None and pair.inside is not None:
            pair.inside.append(sum(spent[before:]))
    return pair


async def _pair(
    pair: _Pair,
    bare_call: Callable[[], Awaitable[Any]],
    managed_call: Callable[[], Awaitable[Any]],
    *,
    gap: float,
    bare_first: bool,
    control_call: Callable[[], Awaitable[Any]] | None = None,
    rotation: int = 0,
) -> Any:
    """Time one pair after ``gap`` seconds of idle; return the managed call's answer.

    The CPU mimo_ctx's threads spent from the start of the pause to the end of the
    pair (the store worker's idle checkpoint after the last pair's writes, its part
    of either call) is the managed call's: only the managed side uses them.

    With ``control_call`` (a second bare call, the A/A control, into
    ``pair.control``) the three calls run in the order ``rotation`` picks of the
    six: each comes first after the pause, and each sits between the other two,
    equally often over six pairs.
    """
    ours = _OURS.cpu()
    await anyio.sleep(gap)
    reply: Any = None
    if control_call is None:
        order: tuple[str, ...] = ("bare", "managed") if bare_first else ("managed", "bare")
    else:
        order = _ORDERS[rotation % len(_ORDERS)]
    times: dict[str, float] = {}
    for arm in order:
        if arm == "managed":
            times[arm], reply = await _timed(managed_call)
        else:
            other = bare_call if arm == "bare" or control_call is None else control_call
            times[arm], _ = await _timed(other)
    pair.bare.append(times["bare"])
    pair.managed.append(times["managed"] + _OURS.cpu() - ours)
    if control_call is not None:
        if pair.control is None:
            pair.control = []
        pair.control.append(times["control"])
    return reply


class _StubCompletions:
    def __init__(self, make: Callable[[], Any], walk: list[Any] | None) -> None:
        self._make = make
        self._walk = walk
        self.walked: list[float] = []

    async def create(self, **kwargs: Any) -> Any:
        if self._walk is not None:
            # What an SDK does to a large request, in its cost to the caches: every
            # message visited and serialised. Timed, and taken out of the call's time.
            cpu = time.process_time()
            json.dumps(self._walk)
            self.walked.append(time.process_time() - cpu)
        return self._make()


class _StubClient:
    """An async client whose managed calls answer at once, with no request built: a
    wrapped stub costs what mimo_ctx itself does (the SDK's own work left out).

    With ``walk``, each call first serialises that payload (a 5,000-message history
    at every size): the CPU caches are as full of someone else's data as after a
    real SDK's 5,000-message request, whatever the history the call manages, so
    what is left after taking the walk's own time out is mimo_ctx's work under the
    same cache pressure at 100 and at 5,000 messages."""

    def __init__(self, make: Callable[[], Any], walk: list[Any] | None = None) -> None:
        completions = _StubCompletions(make, walk)
        self.completions = completions
        self.chat = type("Chat", (), {"completions": completions})()
        self.messages = completions
        self.responses = completions


async def _alone(
    way: str,
    size: int,
    samples: int,
    root: Path,
    *,
    gap: float,
    walk: list[Any] | None = None,
) -> list[float]:
    """The managed call's CPU time on a stub client (see :class:`_StubClient`), each
    call after ``gap`` seconds of idle, with mimo_ctx's threads' CPU from the start
    of the pause on (as :func:`_pair` counts a managed call)."""
    import anthropic.types
    import openai.types.chat

    from mimo_ctx.providers import wrap_anthropic, wrap_openai

    store = await SQLiteStore.open(root / f"{way}-alone-{size}-{walk is not None}.db")
    try:
        async with ContextMiddleware(store, root / "memory", model=LIMITS) as mw:
            stub: _StubClient
            if way == "openai":
                completion = openai.types.chat.ChatCompletion.model_validate(_openai_answer(1))
                stub = _StubClient(lambda: completion, walk)
                managed: Any = wrap_openai(stub, mw, session_id="alone")
                host: list[Any] = _openai_history(size)

                async def call() -> Any:
                    return await managed.chat.completions.create(model="gpt-test", messages=host)

                def answer_of(reply: Any) -> Any:
                    return {"role": "assistant", "content": reply.choices[0].message.content}
            else:
                message = anthropic.types.Message.model_validate(_anthropic_answer(1))
                stub = _StubClient(lambda: message, walk)
                managed = wrap_anthropic(stub, mw, session_id="alone")
                host = _anthropic_history(size)

                async def call() -> Any:
                    return await managed.messages.create(model="t", max_tokens=64, messages=host)

                def answer_of(reply: Any) -> Any:
                    return {"role": "assistant", "content": reply.content[0].text}

            if host[-1].get("role") == "assistant":
                host.append({"role": "user", "content": "Go on."})
            reply = await call()
            for warm in range(3):
                host += [answer_of(reply), {"role": "user", "content": f"Warm {warm}."}]
                reply = await call()
            settle_heap()
            out: list[float] = []
            for sample in range(samples):
                host += [answer_of(reply), {"role": "user", "content": f"Turn {sample}."}]
                walked = len(stub.completions.walked)
                ours = _OURS.cpu()
                await anyio.sleep(gap)
                spent, reply = await _timed(call)
                spent += _OURS.cpu() - ours
                out.append(spent - sum(stub.completions.walked[walked:]))
            return out
    finally:
        await store.aclose()


# --------------------------------------------------------------------------- frameworks


async def _pydantic_ai_way(size: int, plan: _Plan, root: Path) -> _Pair:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    from mimo_ctx.integrations.pydantic_ai import MimoCtxCapability

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(
            parts=[TextPart("Reply.")], usage=RequestUsage(input_tokens=100, output_tokens=5)
        )

    history: list[ModelMessage] = []
    turn = 0
    while len(history) < size:
        history.append(ModelRequest(parts=[UserPromptPart(f"{_TEXT} ({turn})")]))
        if turn % 5 == 4:
            call = ToolCallPart("read", {"path": "a.py"}, tool_call_id=f"call_h{turn}")
            history.append(ModelResponse(parts=[call]))
            history.append(
                ModelRequest(parts=[ToolReturnPart("read", _TEXT, tool_call_id=f"call_h{turn}")])
            )
        history.append(ModelResponse(parts=[TextPart(f"Answer {turn}. {_TEXT}")]))
        turn += 1
    store = await SQLiteStore.open(root / f"pydantic-ai-{size}.db")
    try:
        async with ContextMiddleware(store, root / "memory", model=LIMITS) as mw:
            bare_agent = Agent(FunctionModel(answer))

            async def block(session_id: str) -> _Pair:
                managed_agent = Agent(
                    FunctionModel(answer),
                    capabilities=[MimoCtxCapability(mw, session_id=session_id)],
                )
                current = [history]
                prompt = ["Go on."]

                async def bare_call() -> Any:
                    return await bare_agent.run(prompt[0], message_history=current[0])

                async def managed_call() -> Any:
                    return await managed_agent.run(prompt[0], message_history=current[0])

                def step(result_: Any, label: str) -> None:
                    current[0], prompt[0] = result_.all_messages(), label

                return await _framework_pairs(step, bare_call, managed_call, plan)

            return await _blocks(plan, lambda number: block(f"pai-{size}-{number}"))
    finally:
        await store.aclose()


async def _langchain_way(size: int, plan: _Plan, root: Path) -> _Pair:
    from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    from mimo_ctx.integrations.langchain import MimoCtxMiddleware

    class Model(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self,
            messages: list[BaseMessage],
            stop: Any = None,
            run_manager: Any = None,
            **kwargs: Any,
        ) -> ChatResult:
            usage = {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105}
            return ChatResult(
                generations=[
                    ChatGeneration(message=AIMessage(content="Reply.", usage_metadata=usage))
                ]
            )

    history: list[BaseMessage] = []
    turn = 0
    while len(history) < size:
        history.append(HumanMessage(f"{_TEXT} ({turn})", id=f"h{turn}"))
        if turn % 5 == 4:
            call = {
                "name": "read",
                "args": {"path": "a.py"},
                "id": f"call_h{turn}",
                "type": "tool_call",
            }
            history.append(AIMessage(content="", tool_calls=[call], id=f"a{turn}c"))
            history.append(ToolMessage(_TEXT, tool_call_id=f"call_h{turn}", id=f"t{turn}"))
        history.append(AIMessage(content=f"Answer {turn}. {_TEXT}", id=f"a{turn}"))
        turn += 1
    store = await SQLiteStore.open(root / f"langchain-{size}.db")
    config: Any = {"recursion_limit": 20}
    try:
        async with ContextMiddleware(store, root / "memory", model=LIMITS) as mw:
            # Without middleware langchain leaves the graph's context type unsolved.
            bare_agent: Any = create_agent(Model(messages=iter([])), [])  # pyright: ignore[reportUnknownVariableType]

            async def block(session_id: str) -> _Pair:
                managed_agent: Any = create_agent(
                    Model(messages=iter([])),
                    [],
                    middleware=[MimoCtxMiddleware(mw, session_id=session_id)],
                )
                current: list[list[BaseMessage]] = [[*history, HumanMessage("Go on.")]]

                async def bare_call() -> Any:
                    return await bare_agent.ainvoke({"messages": current[0]}, config)

                async def managed_call() -> Any:
                    return await managed_agent.ainvoke({"messages": current[0]}, config)

                def step(state: Any, label: str) -> None:
                    current[0] = [*state["messages"], HumanMessage(label)]

                return await _framework_pairs(step, bare_call, managed_call, plan)

            return await _blocks(plan, lambda number: block(f"lc-{size}-{number}"))
    finally:
        await store.aclose()


async def _framework_pairs(
    step: Callable[[Any, str], None],
    bare_call: Callable[[], Awaitable[Any]],
    managed_call: Callable[[], Awaitable[Any]],
    plan: _Plan,
) -> _Pair:
    """Like :func:`_pairs` for an agent run: ``step`` puts the last run's messages and
    the next prompt in place."""
    result_ = await managed_call()
    warm_cpu = 0.0
    for warm in range(3):
        step(result_, f"Warm {warm}.")
        warm_cpu, result_ = await _timed(managed_call)
    settle_heap()
    pair = _Pair([], [])
    for sample in range(plan.block_pairs(2 * warm_cpu)):
        step(result_, f"Turn {sample}.")
        result_ = await _pair(
            pair, bare_call, managed_call, gap=plan.gap, bare_first=sample % 2 == 1
        )
    return pair


async def _blocks(plan: _Plan, block: Callable[[int], Awaitable[_Pair]]) -> _Pair:
    """The pairs of one cell: blocks (each a session of its own) as long as ``plan``
    says; a block shrunk to fit the budget (see :meth:`_Plan.block_pairs`) is the only one."""
    pair = _Pair([], [])
    blocks = 0
    while plan.more(blocks, pair.spent):
        got = await block(blocks)
        pair.extend(got)
        blocks += 1
        if len(got.bare) < plan.pairs:
            break
    return pair


# --------------------------------------------------------------------------- run


async def _measure(quick: bool) -> dict[str, dict[int, _Pair]]:
    sizes = QUICK_SIZES if quick else SIZES
    plan = QUICK_PLAN if quick else PLAN
    alone_samples = QUICK_ALONE_SAMPLES if quick else ALONE_SAMPLES
    walk_size = sizes[-1]
    out: dict[str, dict[int, _Pair]] = {}
    root = Path(tempfile.mkdtemp(prefix="mimo-wrappers-"))
    try:
        for way in WAYS:
            out[way] = {}
            for size in sizes:
                if way in _SDK_WAYS:
                    pair = out[way][size] = await _sdk_way(way, size, plan, root)
                    if way in ("openai", "anthropic"):
                        pair.alone = await _alone(way, size, alone_samples, root, gap=plan.gap)
                        pair.pressured = await _alone(
                            way,
                            size,
                            alone_samples,
                            root,
                            gap=plan.gap,
                            walk=SDK_CALLS[way][0](walk_size),
                        )
                elif way == "pydantic-ai":
                    out[way][size] = await _pydantic_ai_way(size, plan, root)
                else:
                    out[way][size] = await _langchain_way(size, plan, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def _both(samples: list[float]) -> str:
    return f"{fmt_ms(statistics.median(samples))} / {fmt_ms(min(samples))}"


def _control(pair: _Pair) -> tuple[float, float, float] | None:
    """The A/A control of a cell: the median of its per-pair differences and its 95%
    interval, or None for a cell without a control."""
    if not pair.control or len(pair.control) != len(pair.bare):
        return None
    diffs = pair.control_diffs
    return (statistics.median(diffs), *_median_ci(diffs))


UNRESOLVED = "not resolved by timing"
"""The status of a time row whose run cannot give a verdict (see :func:`_unresolved`)."""


def _unresolved(
    straddles: bool, distance: float, control: tuple[float, float, float] | None
) -> bool:
    """Whether timing gives no verdict on a target: its 95% interval lies on both sides
    of the goal, and the A/A control (a second bare call minus the bare call, a
    difference of nothing) reaches at least as far from zero as the median is from the
    goal (``distance``, in seconds): the SDK's own spread could carry the median
    across the goal. The instruction row of the same cell gives the verdict then."""
    if not straddles or control is None:
        return False
    _, low, high = control
    return max(abs(low), abs(high)) >= distance


def _flat(way: str, small: _Pair, large: _Pair, sizes: list[int]) -> Target:
    """Overhead at the largest size against the smallest, judged on the medians.

    The verdict is the medians' (the issue's definition), and never "met" on a median
    overhead of zero or less at either size (noise, not a flat overhead); none
    (:data:`UNRESOLVED`) when the intervals allow both verdicts and the A/A control is
    as large as the effect (:func:`_unresolved`). The note gives the ratio the 95%
    intervals allow, says when they allow both verdicts (the run does not resolve
    the target), and, where measured, the A/A control at the largest size and
    mimo_ctx's part outside the SDK call at both sizes."""
    flat = large.overhead / small.overhead if small.overhead > 0 else float("inf")
    (small_low, small_high), (large_low, large_high) = small.overhead_ci, large.overhead_ci
    low = large_low / small_high if small_high > 0 else float("inf")
    high = large_high / small_low if small_low > 0 else float("inf")
    note = (
        f"medians of {len(large.diffs)} / {len(small.diffs)} per-pair differences; "
        f"from their 95% intervals the ratio is {low:.2f}-{high:.2f}x"
    )
    straddles = low <= 1.5 < high
    if straddles:
        note += ", both sides of 1.5x: this run does not resolve the target"
    control = _control(large)
    unresolved = _unresolved(straddles, abs(large.overhead - 1.5 * small.overhead), control)
    if unresolved:
        note += (
            "; the A/A control reaches as far from zero as the median overhead is from "
            f"1.5x the one at {sizes[0]:,}: {UNRESOLVED}, the instruction row gives the verdict"
        )
    # A managed call cannot truly cost less than the bare one: a median overhead of
    # zero or less is the SDK's own spread swamping ours, never a flat overhead.
    resolved = small.overhead > 0 and large.overhead > 0
    if not resolved and not unresolved:
        note += "; a median overhead of zero or less is the SDK's spread, not ours: not met"
    if control is not None:
        median, control_low, control_high = control
        note += (
            f"; A/A at {sizes[-1]:,} (a second bare call minus the bare call): "
            f"{fmt_ms(median)} [{fmt_ms(control_low)}, {fmt_ms(control_high)}], the SDK's "
            "own spread"
        )
    if small.inside is not None and large.inside is not None:
        outside_small = statistics.median(small.ours)
        outside_large = statistics.median(large.ours)
        note += (
            f"; outside its SDK call the managed call took {fmt_ms(outside_large)} vs "
            f"{fmt_ms(outside_small)} ({outside_large / outside_small:.2f}x)"
        )
    return Target(
        f"{way}: overhead at {sizes[-1]:,} vs at {sizes[0]:,} messages",
        "within 1.5x",
        f"{fmt_ms(large.overhead)} vs {fmt_ms(small.overhead)} ({flat:.2f}x)",
        None if unresolved else resolved and flat <= 1.5,
        flat,
        note,
        UNRESOLVED if unresolved else None,
    )


def _share(way: str, large: _Pair, size: int) -> Target:
    """Overhead at the largest size against the bare call's own cost there (< 0.5x),
    judged on the medians; none (:data:`UNRESOLVED`) as :func:`_flat` says."""
    bare = statistics.median(large.bare)
    share = large.overhead / bare
    low, high = large.overhead_ci
    unresolved = _unresolved(
        low <= 0.5 * bare < high, abs(large.overhead - 0.5 * bare), _control(large)
    )
    return Target(
        f"{way}: overhead at {size:,} messages vs the bare call",
        "< 0.5x",
        f"{fmt_ms(large.overhead)} vs {fmt_ms(bare)} ({share:.2f}x)",
        None if unresolved else share < 0.5,
        share,
        f"{UNRESOLVED}: the instruction row gives the verdict" if unresolved else "",
        UNRESOLVED if unresolved else None,
    )


def _count(instructions: float) -> str:
    return f"{instructions / 1e6:,.2f} M"


def _instruction_rows(
    counted: dict[str, dict[int, _instructions.Counts]] | str,
) -> tuple[list[list[object]], list[Target]]:
    """The instruction table's rows and the instruction targets of each counted way in
    (the same two goals as the time rows), or a row that says why none were counted."""
    if isinstance(counted, str):
        return [["—", "—", 0, "—", "—", "—", "—"]], [
            Target(
                "openai: instructions (callgrind)", "counted", "not measured", None, None, counted
            )
        ]
    rows: list[list[object]] = []
    targets: list[Target] = []
    for way, by_size in counted.items():
        sizes = sorted(by_size)
        for size in sizes:
            cell = by_size[size]
            rows.append(
                [
                    way,
                    f"{size:,}",
                    len(cell.diffs),
                    " / ".join(_count(b) for b in cell.bare),
                    " / ".join(_count(m) for m in cell.managed),
                    " / ".join(_count(d) for d in cell.diffs),
                    f"{cell.overhead / cell.base:.4f}x",
                ]
            )
        small, large = by_size[sizes[0]], by_size[sizes[-1]]
        flat = large.overhead / small.overhead if small.overhead > 0 else float("inf")
        targets.append(
            Target(
                f"{way}: instructions, overhead at {sizes[-1]:,} vs at {sizes[0]:,} messages",
                "within 1.5x",
                f"{_count(large.overhead)} vs {_count(small.overhead)} ({flat:.2f}x)",
                small.overhead > 0 and large.overhead > 0 and flat <= 1.5,
                flat,
                "callgrind: the instructions of the managed call minus the bare call's on "
                "the same list (mean of the pairs); the verdict where timing does not "
                "resolve the row above",
            )
        )
        share = large.overhead / large.base
        targets.append(
            Target(
                f"{way}: instructions, overhead at {sizes[-1]:,} messages vs the bare call",
                "< 0.5x",
                f"{_count(large.overhead)} vs {_count(large.base)} ({share:.4f}x)",
                share < 0.5,
                share,
            )
        )
    return rows, targets


def run(*, quick: bool = False) -> dict[str, Any]:
    """Measure every way in at every size; return the result tables and targets."""
    measured = anyio.run(_measure, quick)
    # After the timed cells, not beside them: the callgrind processes take both cores.
    counted = _instructions.measure(quick=quick)
    instruction_rows, instruction_targets = _instruction_rows(counted)
    counted_targets: dict[str, list[Target]] = {}
    for target in instruction_targets:
        counted_targets.setdefault(target.name.split(":")[0], []).append(target)
    plan = QUICK_PLAN if quick else PLAN
    largest = (QUICK_SIZES if quick else SIZES)[-1]
    rows: list[list[object]] = []
    targets: list[Target] = []
    data: dict[str, Any] = {}
    for way, by_size in measured.items():
        sizes = sorted(by_size)
        data[way] = {}
        for size in sizes:
            pair = by_size[size]
            bare = statistics.median(pair.bare)
            low, high = pair.overhead_ci
            alone = statistics.median(pair.alone) if pair.alone else None
            pressured = statistics.median(pair.pressured) if pair.pressured else None
            split = pair.inside is not None and len(pair.inside) == len(pair.bare)
            ours = statistics.median(pair.ours) if split else None
            sdk_diff = statistics.median(pair.sdk_diffs) if split else None
            sdk_low, sdk_high = _median_ci(pair.sdk_diffs) if split else (0.0, 0.0)
            control = _control(pair)
            rows.append(
                [
                    way,
                    f"{size:,}",
                    len(pair.diffs),
                    _both(pair.bare),
                    _both(pair.managed),
                    f"{fmt_ms(pair.overhead)} [{fmt_ms(low)}, {fmt_ms(high)}]",
                    fmt_ms(pair.min_overhead),
                    fmt_ratio(pair.overhead / bare),
                    "—"
                    if alone is None or pressured is None
                    else f"{fmt_ms(alone)} / {fmt_ms(pressured)}",
                    "—" if ours is None else fmt_ms(ours),
                    "—"
                    if sdk_diff is None
                    else f"{fmt_ms(sdk_diff)} [{fmt_ms(sdk_low)}, {fmt_ms(sdk_high)}]",
                    "—"
                    if control is None
                    else f"{fmt_ms(control[0])} [{fmt_ms(control[1])}, {fmt_ms(control[2])}]",
                ]
            )
            data[way][str(size)] = {
                "bare_ms": bare * 1000,
                "bare_min_ms": min(pair.bare) * 1000,
                "managed_ms": statistics.median(pair.managed) * 1000,
                "managed_min_ms": min(pair.managed) * 1000,
                "overhead_ms": pair.overhead * 1000,
                "overhead_ci_ms": [low * 1000, high * 1000],
                "overhead_of_minima_ms": pair.min_overhead * 1000,
                "alone_ms": None if alone is None else alone * 1000,
                "alone_after_walk_ms": None if pressured is None else pressured * 1000,
                "outside_sdk_ms": None if ours is None else ours * 1000,
                "sdk_slower_ms": None if sdk_diff is None else sdk_diff * 1000,
                "sdk_slower_ci_ms": None if sdk_diff is None else [sdk_low * 1000, sdk_high * 1000],
                "control_ms": None if control is None else control[0] * 1000,
                "control_ci_ms": None if control is None else [c * 1000 for c in control[1:]],
                "samples": len(pair.bare),
            }
        small, large = by_size[sizes[0]], by_size[sizes[-1]]
        targets.append(_flat(way, small, large, sizes))
        targets.append(_share(way, large, sizes[-1]))
        targets.extend(counted_targets.get(way, []))
        for label, small_alone, large_alone, note in (
            (
                "mimo_ctx alone (stub client)",
                small.alone,
                large.alone,
                "the same turn without the SDK's request building",
            ),
            (
                f"mimo_ctx alone after a {sizes[-1]:,}-message walk",
                small.pressured,
                large.pressured,
                "the stub serialises the same large payload at every size: equal cache "
                "pressure, only the managed history differs",
            ),
        ):
            if small_alone and large_alone:
                alone_small = statistics.median(small_alone)
                alone_large = statistics.median(large_alone)
                targets.append(
                    Target(
                        f"{way}: {label} at {sizes[-1]:,} vs at {sizes[0]:,}",
                        "within 1.5x",
                        f"{fmt_ms(alone_large)} vs {fmt_ms(alone_small)} "
                        f"({alone_large / alone_small:.2f}x)",
                        alone_large / alone_small <= 1.5,
                        alone_large / alone_small,
                        note,
                    )
                )
    header = [
        "way in",
        "history",
        "pairs",
        "bare call (CPU): median / min",
        "managed call: median / min",
        "overhead: median [95% CI]",
        "overhead of the minima",
        "overhead / bare",
        "stub client, mimo_ctx alone: plain / after a walk",
        "managed call outside its SDK call",
        "SDK call inside the managed call minus the bare call [95% CI]",
        "A/A: a second bare call minus the bare call [95% CI]",
    ]
    return result(
        NAME,
        TITLE,
        tables=[
            table(
                "Per-call CPU time (overhead: median of the per-pair differences)",
                header,
                rows,
            ),
            table(
                "Per-call CPU instructions (callgrind; one figure per measured pair)",
                [
                    "way in",
                    "history",
                    "pairs",
                    "bare call",
                    "managed call",
                    "overhead (managed minus bare)",
                    "overhead / bare",
                ],
                instruction_rows,
            ),
        ],
        targets=[*targets, *(instruction_targets if isinstance(counted, str) else [])],
        notes=[
            "How it is judged: each pair is one bare call and one managed call on the same "
            "list, one right after the other, the order alternating; the overhead of a cell "
            "is the median of its per-pair differences, and the targets compare those "
            "medians. The bracket is a distribution-free 95% confidence interval of that "
            "median; 'overhead of the minima' is the fastest managed call minus the fastest "
            "bare call. Pairs come in blocks of "
            f"{plan.pairs} (each block a session of its own on a fresh copy of the history, "
            f"so the list stays near its size), as many as {plan.budget:.0f} s of CPU per "
            f"cell allow (at least {plan.min_blocks} blocks, at most {plan.max_blocks}); a "
            f"cell whose block would take more than that gets one block of fewer pairs (at "
            f"least {plan.min_pairs}): the 1,000- and 5,000-message OpenAI cells, where the "
            "SDK's own work takes about half a second and two seconds per call.",
            "The A/A column (the OpenAI ways): each pair also times a second bare call, the "
            "three calls in an order that rotates over the six (each first after the pause, "
            "each between the other two, equally often), and shows the median of 'second "
            "bare call minus the bare call' with its 95% interval: what the SDK's own spread "
            "makes of a difference of nothing, beside the overhead measured against the "
            "same bare calls. Where the A/A interval is as wide as the overhead's, the run "
            "cannot tell the overhead's SDK part from the SDK's own spread: the flatness "
            "target's note then says that the run does not resolve it, and where the A/A "
            "control also reaches as far as the median is from the goal the row gives no "
            "verdict (see the instruction table's note). With the SDK's spread of a few percent "
            "of a two-second call per pair, resolving a millisecond would take thousands of "
            "pairs: the note gives mimo_ctx's steady part (the managed call outside its SDK "
            "call) beside it.",
            "The last column is the managed call on a client that answers at once without "
            "building a request (no SDK work), plain and after serialising a "
            f"{largest:,}-message payload every call (the walk's own time taken out): what "
            "mimo_ctx itself costs per call, with warm caches and with caches as full of "
            "other data as after a large SDK request. At 5,000 messages the OpenAI SDK's own "
            "request building takes most of a second of CPU: the per-pair differences there "
            "spread over tens of milliseconds, which the confidence interval shows.",
            "CPU time of the process; the CPU of mimo_ctx's own threads (the SQLite store's "
            "worker) is the managed call's, wherever it ran: from the start of the pause "
            "before its pair to the pair's end (the worker's idle WAL checkpoint included, "
            "in the pause or in either call). The bare call is the same SDK client, agent or "
            "graph without mimo_ctx, on the same list.",
            f"Each pair (and each stub call) starts after {plan.gap * 1000:.0f} ms of idle at "
            "every size, as a host's calls wait for the model: without it the calls at 100 "
            "messages ran back to back (warm caches, the worker's checkpoint often landing "
            "in a bare call) and those at 5,000 after a second of the SDK's own work, so the "
            "ratio compared a warm and a cold machine as much as two history sizes.",
            "The last two columns split the overhead of the three ways that make one SDK "
            "method call (the streams' SDK work goes on while the host reads them): the "
            "managed call outside its SDK call (mimo_ctx's part; the SDK method is timed "
            "through the same clock on both sides, the bare call's times unused, so "
            "that each side has the clock's one coroutine in its chain), and how much "
            "longer the same SDK work took inside the managed call than the bare call "
            "(median of the per-pair differences, with its 95% interval). The SDK gets the "
            "host's own message objects in a list in both calls, and makes the same "
            "Python calls (sys.setprofile count at 5,000 messages: 6,855,297 in the bare "
            "call, and in the managed one the same plus the counting script's own "
            "collector callback). "
            "What does differ is systematic and small: every coroutine between the host's "
            "await and the SDK's is one more entry in the exception-state chain that "
            "CPython walks for each exception raised in the SDK call, and the OpenAI SDK "
            "raises about 67 per message while building a request (callgrind at 300 "
            "messages: +0.15% of the SDK's instructions for mimo_ctx's four coroutines "
            "then, +0.076% for two).",
            "The instruction table (the OpenAI ways, at the smallest and the largest "
            "size): CPU instructions of one bare and one managed call on the same list, "
            "counted by valgrind's callgrind (benchmarks/_instructions.py: two processes "
            "under callgrind with instrumentation off, each cell built and warmed up as "
            "above, PYTHONHASHSEED=0; around each measured call only, instrumentation and "
            "collection are turned on by a client request and the count dumped after it; "
            "each pair, the three warm-up pairs' too, is the managed call then the bare one, "
            "so that each call follows one call of the other side at every size; two pairs "
            "below 1,000 messages, whose overheads agree to a few percent, one from 1,000 "
            "on). Instructions do not depend "
            "on the load or the clock, so they resolve what the time rows cannot: a "
            "5,000-message OpenAI call is most of a second of the SDK's own work whose "
            "spread from call to call is tens of milliseconds. A time row whose 95% "
            "interval lies on both sides of its goal while the A/A control reaches as far "
            f"as the median is from the goal is shown as '{UNRESOLVED}' (never met), and "
            "the instruction row of the same goal gives the verdict. The instructions "
            "count mimo_ctx's own threads too (all threads of the process, the pause "
            "before each call left out).",
        ],
        data={
            "ways": data,
            "instructions": counted
            if isinstance(counted, str)
            else {
                way: {
                    str(size): {"bare": cell.bare, "managed": cell.managed}
                    for size, cell in by_size.items()
                }
                for way, by_size in counted.items()
            },
        },
    )
