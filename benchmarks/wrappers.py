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
call's CPU time, the managed call's, and the overhead (the median of the
per-pair differences). Targets (issue 16): the overhead at 5,000 messages within
1.5x the overhead at 100, and under 0.5x the bare call's own cost at 5,000.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.triggers import ModelLimits

from ._common import Target, fmt_ms, fmt_ratio, result, settle_heap, table

NAME = "wrappers"
TITLE = "Wrappers and integrations: per-call overhead against the bare call"

SIZES = (100, 1_000, 5_000)
QUICK_SIZES = (20, 40)
SAMPLES = 31
QUICK_SAMPLES = 3
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
_TEXT = "Read the module, then explain what its public functions do and why. " * 3
_LIMITS = ModelLimits(10_000_000, input_limit=10_000_000)


@dataclass
class _Pair:
    bare: list[float]
    managed: list[float]
    alone: list[float] | None = None  # the managed call on a stub client: ours only

    @property
    def overhead(self) -> float:
        return statistics.median(m - b for b, m in zip(self.bare, self.managed, strict=True))


async def _timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    cpu = time.process_time()
    value = await fn()
    return time.process_time() - cpu, value


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


def _transport(answer: Callable[[int], dict[str, Any] | bytes]) -> Any:
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
_SDK_CALLS: dict[str, tuple[_HistoryOf, _Call]] = {
    "openai": (_openai_history, _openai_call),
    "openai stream": (_openai_history, _openai_stream_call),
    "openai responses": (_responses_history, _responses_call),
    "anthropic": (_anthropic_history, _anthropic_call),
    "anthropic stream": (_anthropic_history, _anthropic_stream_call),
}


async def _sdk_way(way: str, size: int, samples: int, root: Path) -> _Pair:
    import anthropic
    import openai

    from mimo_ctx.providers import wrap_anthropic, wrap_openai

    store = await SQLiteStore.open(root / f"{way}-{size}.db")
    session = f"ses-{way.replace(' ', '-')}-{size}"
    try:
        async with ContextMiddleware(store, root / "memory", model=_LIMITS) as mw:
            if way.startswith("openai"):
                answer = {
                    "openai": _openai_answer,
                    "openai stream": _openai_stream,
                    "openai responses": _responses_answer,
                }[way]
                raw: Any = openai.AsyncOpenAI(
                    api_key="sk",
                    base_url="http://fake/v1",
                    max_retries=0,
                    http_client=_transport(answer),
                )
                managed: Any = wrap_openai(raw, mw, session_id=session)
            else:
                answer = _anthropic_stream if way == "anthropic stream" else _anthropic_answer
                raw = anthropic.AsyncAnthropic(
                    api_key="sk",
                    base_url="http://fake",
                    max_retries=0,
                    http_client=_transport(answer),
                )
                managed = wrap_anthropic(raw, mw, session_id=session)
            history_of, call = _SDK_CALLS[way]
            host = history_of(size)

            async def bare_call() -> Any:
                return await call(raw, host)

            async def managed_call() -> Any:
                return await call(managed, host)

            def answer_of(text: Any) -> Any:
                return {"role": "assistant", "content": text}

            return await _pairs(host, bare_call, managed_call, answer_of, samples)
    finally:
        await store.aclose()


async def _pairs(
    host: list[Any],
    bare_call: Callable[[], Awaitable[Any]],
    managed_call: Callable[[], Awaitable[Any]],
    answer_of: Callable[[Any], Any],
    samples: int,
) -> _Pair:
    """Warm up (the first managed call syncs the whole history), then time pairs."""
    if host[-1].get("role") == "assistant":
        host.append({"role": "user", "content": "Go on."})
    reply = await managed_call()
    for warm in range(3):
        host += [answer_of(reply), {"role": "user", "content": f"Warm {warm}."}]
        reply = await managed_call()
    settle_heap()
    pair = _Pair([], [])
    for sample in range(samples):
        host += [answer_of(reply), {"role": "user", "content": f"Turn {sample}."}]
        if sample % 2:
            bare, _ = await _timed(bare_call)
            managed, reply = await _timed(managed_call)
        else:
            managed, reply = await _timed(managed_call)
            bare, _ = await _timed(bare_call)
        pair.bare.append(bare)
        pair.managed.append(managed)
    return pair


class _StubCompletions:
    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make

    async def create(self, **kwargs: Any) -> Any:
        return self._make()


class _StubClient:
    """An async client whose managed calls answer at once, with no request built: a
    wrapped stub costs what mimo_ctx itself does (the SDK's own work left out)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        completions = _StubCompletions(make)
        self.chat = type("Chat", (), {"completions": completions})()
        self.messages = completions
        self.responses = completions


async def _alone(way: str, size: int, samples: int, root: Path) -> list[float]:
    """The managed call's CPU time on a stub client (see :class:`_StubClient`)."""
    import anthropic.types
    import openai.types.chat

    from mimo_ctx.providers import wrap_anthropic, wrap_openai

    store = await SQLiteStore.open(root / f"{way}-alone-{size}.db")
    try:
        async with ContextMiddleware(store, root / "memory", model=_LIMITS) as mw:
            if way == "openai":
                completion = openai.types.chat.ChatCompletion.model_validate(_openai_answer(1))
                managed: Any = wrap_openai(_StubClient(lambda: completion), mw, session_id="alone")
                host: list[Any] = _openai_history(size)

                async def call() -> Any:
                    return await managed.chat.completions.create(model="gpt-test", messages=host)

                def answer_of(reply: Any) -> Any:
                    return {"role": "assistant", "content": reply.choices[0].message.content}
            else:
                message = anthropic.types.Message.model_validate(_anthropic_answer(1))
                managed = wrap_anthropic(_StubClient(lambda: message), mw, session_id="alone")
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
                spent, reply = await _timed(call)
                out.append(spent)
            return out
    finally:
        await store.aclose()


# --------------------------------------------------------------------------- frameworks


async def _pydantic_ai_way(size: int, samples: int, root: Path) -> _Pair:
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
        async with ContextMiddleware(store, root / "memory", model=_LIMITS) as mw:
            bare_agent = Agent(FunctionModel(answer))
            managed_agent = Agent(
                FunctionModel(answer),
                capabilities=[MimoCtxCapability(mw, session_id=f"pai-{size}")],
            )
            current = [history]
            prompt = ["Go on."]

            async def bare_call() -> Any:
                return await bare_agent.run(prompt[0], message_history=current[0])

            async def managed_call() -> Any:
                return await managed_agent.run(prompt[0], message_history=current[0])

            result_ = await managed_call()
            for warm in range(3):
                current[0], prompt[0] = result_.all_messages(), f"Warm {warm}."
                result_ = await managed_call()
            settle_heap()
            pair = _Pair([], [])
            for sample in range(samples):
                current[0], prompt[0] = result_.all_messages(), f"Turn {sample}."
                if sample % 2:
                    bare, _ = await _timed(bare_call)
                    managed, result_ = await _timed(managed_call)
                else:
                    managed, result_ = await _timed(managed_call)
                    bare, _ = await _timed(bare_call)
                pair.bare.append(bare)
                pair.managed.append(managed)
            return pair
    finally:
        await store.aclose()


async def _langchain_way(size: int, samples: int, root: Path) -> _Pair:
    from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    from mimo_ctx.integrations.langchain import MimoCtxMiddleware

    class Model(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            return self

        def _generate(
            self,
            messages: list[BaseMessage],
            stop: Any = None,
            run_manager: Any = None,
            **kwargs: Any,
        ) -> ChatResult:  # type: ignore[override]
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
        async with ContextMiddleware(store, root / "memory", model=_LIMITS) as mw:
            # Without middleware langchain leaves the graph's context type unsolved.
            bare_agent: Any = create_agent(Model(messages=iter([])), [])  # pyright: ignore[reportUnknownVariableType]
            managed_agent: Any = create_agent(
                Model(messages=iter([])),
                [],
                middleware=[MimoCtxMiddleware(mw, session_id=f"lc-{size}")],
            )
            current: list[list[BaseMessage]] = [[*history, HumanMessage("Go on.")]]

            async def bare_call() -> Any:
                return await bare_agent.ainvoke({"messages": current[0]}, config)

            async def managed_call() -> Any:
                return await managed_agent.ainvoke({"messages": current[0]}, config)

            state = await managed_call()
            for warm in range(3):
                current[0] = [*state["messages"], HumanMessage(f"Warm {warm}.")]
                state = await managed_call()
            settle_heap()
            pair = _Pair([], [])
            for sample in range(samples):
                current[0] = [*state["messages"], HumanMessage(f"Turn {sample}.")]
                if sample % 2:
                    bare, _ = await _timed(bare_call)
                    managed, state = await _timed(managed_call)
                else:
                    managed, state = await _timed(managed_call)
                    bare, _ = await _timed(bare_call)
                pair.bare.append(bare)
                pair.managed.append(managed)
            return pair
    finally:
        await store.aclose()


# --------------------------------------------------------------------------- run


async def _measure(quick: bool) -> dict[str, dict[int, _Pair]]:
    sizes = QUICK_SIZES if quick else SIZES
    samples = QUICK_SAMPLES if quick else SAMPLES
    out: dict[str, dict[int, _Pair]] = {}
    root = Path(tempfile.mkdtemp(prefix="mimo-wrappers-"))
    try:
        for way in WAYS:
            out[way] = {}
            for size in sizes:
                if way in _SDK_WAYS:
                    out[way][size] = await _sdk_way(way, size, samples, root)
                    if way in ("openai", "anthropic"):
                        out[way][size].alone = await _alone(way, size, samples, root)
                elif way == "pydantic-ai":
                    out[way][size] = await _pydantic_ai_way(size, samples, root)
                else:
                    out[way][size] = await _langchain_way(size, samples, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def run(*, quick: bool = False) -> dict[str, Any]:
    """Measure every way in at every size; return the result tables and targets."""
    measured = anyio.run(_measure, quick)
    rows: list[list[object]] = []
    targets: list[Target] = []
    data: dict[str, Any] = {}
    for way, by_size in measured.items():
        sizes = sorted(by_size)
        data[way] = {}
        for size in sizes:
            pair = by_size[size]
            bare = statistics.median(pair.bare)
            managed = statistics.median(pair.managed)
            alone = statistics.median(pair.alone) if pair.alone else None
            rows.append(
                [
                    way,
                    f"{size:,}",
                    fmt_ms(bare),
                    fmt_ms(managed),
                    fmt_ms(pair.overhead),
                    fmt_ratio(pair.overhead / bare),
                    "—" if alone is None else fmt_ms(alone),
                ]
            )
            data[way][str(size)] = {
                "bare_ms": bare * 1000,
                "managed_ms": managed * 1000,
                "overhead_ms": pair.overhead * 1000,
                "alone_ms": None if alone is None else alone * 1000,
                "samples": len(pair.bare),
            }
        small, large = by_size[sizes[0]], by_size[sizes[-1]]
        flat = large.overhead / small.overhead if small.overhead > 0 else float("inf")
        large_bare = statistics.median(large.bare)
        share = large.overhead / large_bare
        targets.append(
            Target(
                f"{way}: overhead at {sizes[-1]:,} vs at {sizes[0]:,} messages",
                "within 1.5x",
                f"{fmt_ms(large.overhead)} vs {fmt_ms(small.overhead)} ({flat:.2f}x)",
                flat <= 1.5,
                flat,
            )
        )
        targets.append(
            Target(
                f"{way}: overhead at {sizes[-1]:,} messages vs the bare call",
                "< 0.5x",
                f"{fmt_ms(large.overhead)} vs {fmt_ms(large_bare)} ({share:.2f}x)",
                share < 0.5,
                share,
            )
        )
        if small.alone and large.alone:
            alone_small = statistics.median(small.alone)
            alone_large = statistics.median(large.alone)
            targets.append(
                Target(
                    f"{way}: mimo_ctx alone (stub client) at {sizes[-1]:,} vs at {sizes[0]:,}",
                    "within 1.5x",
                    f"{fmt_ms(alone_large)} vs {fmt_ms(alone_small)} "
                    f"({alone_large / alone_small:.2f}x)",
                    alone_large / alone_small <= 1.5,
                    alone_large / alone_small,
                    "the same turn without the SDK's request building",
                )
            )
    header = [
        "way in",
        "history",
        "bare call (CPU)",
        "managed call (CPU)",
        "overhead",
        "overhead / bare",
        "stub client: mimo_ctx alone",
    ]
    return result(
        NAME,
        TITLE,
        tables=[
            table(
                "Per-call CPU time, medians (overhead: median of per-pair differences)",
                header,
                rows,
            )
        ],
        targets=targets,
        notes=[
            "The last column is the managed call on a client that answers at once without "
            "building a request (no SDK work): what mimo_ctx itself costs per call. At 5,000 "
            "messages the OpenAI SDK's own request building takes most of a second of CPU, so "
            "the difference of two such calls is within their noise; this column is not.",
            "CPU time of the process (the SQLite worker thread included), median over "
            f"{QUICK_SAMPLES if quick else SAMPLES} interleaved pairs per size; the bare call "
            "is the same SDK client, agent or graph without mimo_ctx, on the same list.",
        ],
        data={"ways": data},
    )
