"""A model-backed checkpoint writer in one line, forked from the session — offline.

The agents below are ordinary SDK code (``openai`` chat completions and
``anthropic`` messages, each wrapped for mimo_ctx). The one line this example is
about builds the checkpoint writer from the same client and model::

    writer = LLMCheckpointWriter.from_openai(client, model=MODEL)
    writer = LLMCheckpointWriter.from_anthropic(client, model=MODEL)

Because the writer uses the session's own client and model it is *forked*: its
request is the session's last request, byte for byte, plus one user message
asking for the checkpoint, so the provider's prompt cache serves everything
before that message. The writer events report what it cost: input tokens sent,
tokens the provider served from its cache, output tokens.

No network and no API key: the example starts a small stand-in on 127.0.0.1
that speaks the OpenAI and Anthropic wire formats. It answers the agent with a
few tool calls, answers the writer with a checkpoint, and models a prompt cache
the simple way: the leading part of a request that repeats the previous
request's prompt (tools, system, messages, compared as sent) counts as cached,
for Anthropic up to the last ``cache_control`` breakpoint of that previous
request.

Run it with ``python examples/llm_writer.py``.
"""

from __future__ import annotations

import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, cast

import anyio
from anthropic import AsyncAnthropic
from anthropic.types import TextBlockParam
from openai import AsyncOpenAI

from mimo_ctx.checkpoint import LLMCheckpointWriter, render_checkpoint
from mimo_ctx.events import Event, WriterFailed, WriterFinished
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers import wrap_anthropic, wrap_openai
from mimo_ctx.store import InMemoryStore
from mimo_ctx.triggers import ModelLimits

MODEL = "stand-in-model"
WINDOW = ModelLimits(context_window=200_000)
SYSTEM = "You are a careful coding agent working on the demo parser."
REQUEST = "Split demo/parse.py into a tokenizer and a parser; keep `demo parse FILE` working."
FILES = {
    f"demo/{name}.py": "\n".join(
        f"def {name}_{i}(text):  # helper {i}\n    return text" for i in range(400)
    )
    for name in ("parse", "cli", "tokens")
}
OPENAI_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file of the project.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def report(provider: str) -> Any:
    """An event handler printing the writer's runs."""

    def on_event(event: Event) -> None:
        if isinstance(event, WriterFinished):
            share = event.tokens_cached / event.tokens_sent if event.tokens_sent else 0.0
            mode = "forked" if event.forked else "standalone"
            print(
                f"{provider}: checkpoint written by {event.writer} ({mode}), {event.calls} call, "
                f"{event.tokens_sent:,} tokens sent, {event.tokens_cached:,} of them cached "
                f"({share:.0%}), {event.tokens_output:,} output"
            )
        elif isinstance(event, WriterFailed):
            print(f"{provider}: the {event.writer} writer failed ({event.reason}): {event.error}")

    return on_event


# --------------------------------------------------------------------------- the agents


async def openai_agent(base_url: str, memory: Path) -> None:
    raw = AsyncOpenAI(api_key="offline", base_url=f"{base_url}/v1", max_retries=0)
    writer = LLMCheckpointWriter.from_openai(raw, model=MODEL)  # the one line
    async with ContextMiddleware(
        InMemoryStore(), memory, model=WINDOW, writer=writer, on_event=report("openai")
    ) as mw:
        client = wrap_openai(raw, mw, session_id="ses_llm_writer_openai")
        history: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": REQUEST},
        ]
        while True:
            reply = await client.chat.completions.create(
                model=MODEL, messages=history, tools=OPENAI_TOOLS
            )
            message = reply.choices[0].message
            history.append(message)
            if not message.tool_calls:
                print(f"openai: agent says: {message.content}")
                break
            for call in message.tool_calls:
                if call.type != "function":  # only function tools are declared
                    continue
                path = json.loads(call.function.arguments)["path"]
                history.append({"role": "tool", "tool_call_id": call.id, "content": FILES[path]})
        await mw.start_writer("ses_llm_writer_openai", reason="end of task")
        await mw.wait_for_writer("ses_llm_writer_openai", timeout=30)
        checkpoint = mw.layout.checkpoint_path("ses_llm_writer_openai").read_text()
    await raw.close()
    print("openai: " + checkpoint.splitlines()[0])


async def anthropic_agent(base_url: str, memory: Path) -> None:
    raw = AsyncAnthropic(api_key="offline", base_url=base_url, max_retries=0)
    writer = LLMCheckpointWriter.from_anthropic(raw, model=MODEL)  # the one line
    async with ContextMiddleware(
        InMemoryStore(), memory, model=WINDOW, writer=writer, on_event=report("anthropic")
    ) as mw:
        client = wrap_anthropic(raw, mw, session_id="ses_llm_writer_anthropic")
        system: list[TextBlockParam] = [
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}
        ]
        history: list[Any] = [{"role": "user", "content": REQUEST}]
        while True:
            reply = await client.messages.create(
                model=MODEL, max_tokens=2048, system=system, tools=ANTHROPIC_TOOLS, messages=history
            )
            history.append({"role": "assistant", "content": reply.content})
            calls = [b for b in reply.content if b.type == "tool_use"]
            if not calls:
                text = "".join(b.text for b in reply.content if b.type == "text")
                print(f"anthropic: agent says: {text}")
                break
            results: list[dict[str, Any]] = []
            for c in calls:
                path = cast(dict[str, str], c.input)["path"]  # the SDK types input as `object`
                results.append({"type": "tool_result", "tool_use_id": c.id, "content": FILES[path]})
            history.append({"role": "user", "content": results})
        await mw.start_writer("ses_llm_writer_anthropic", reason="end of task")
        await mw.wait_for_writer("ses_llm_writer_anthropic", timeout=30)
        checkpoint = mw.layout.checkpoint_path("ses_llm_writer_anthropic").read_text()
    await raw.close()
    print("anthropic: " + checkpoint.splitlines()[0])


# --------------------------------------------------------------------------- offline stand-in

CHECKPOINT = render_checkpoint(
    "Split the demo parser into a tokenizer and a parser",
    {
        1: [f'- "{REQUEST}"'],
        2: ["- move the parse_* helpers that only split text into demo/tokens.py"],
        6: ["- demo/parse.py, demo/cli.py, demo/tokens.py: read in full"],
        7: ["- demo/cli.py calls parse_0() for `demo parse FILE`"],
    },
)


def _segments(body: dict[str, Any]) -> list[str]:
    """The prompt as a provider caches it, segment by segment: tools, system, messages."""
    declared: list[Any] = body.get("tools") or []
    tools = [json.dumps(t) for t in declared]
    system = [json.dumps(body["system"])] if "system" in body else []
    return [*tools, *system, *(json.dumps(m) for m in body["messages"])]


def _breakpoint(segments: list[str]) -> int:
    """How many segments an Anthropic cache entry of this request covers."""
    marked = [i for i, s in enumerate(segments) if '"cache_control"' in s]
    return marked[-1] + 1 if marked else 0


class StandIn(BaseHTTPRequestHandler):
    """The agent's model and the writer's, on /v1/chat/completions and /v1/messages."""

    protocol_version = "HTTP/1.1"
    previous: ClassVar[dict[str, list[str]]] = {}
    turns: ClassVar[dict[str, int]] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        api = "anthropic" if self.path.startswith("/v1/messages") else "openai"
        segments = _segments(body)
        tokens = sum(len(s) for s in segments) // 4
        earlier = self.previous.get(api, [])
        if api == "anthropic":
            earlier = earlier[: _breakpoint(earlier)]
        same = 0
        for mine, theirs in zip(segments, earlier, strict=False):
            if mine != theirs:
                break
            same += len(mine) // 4
        cached = same if same >= 1024 else 0  # providers cache from 1,024 tokens on
        writer = "You maintain checkpoint.md" in json.dumps(body)
        if not writer:
            self.previous[api] = segments
        turn = self.turns[api] = self.turns.get(api, 0) + (0 if writer else 1)
        if writer:
            text, call = CHECKPOINT, None
        elif turn <= len(FILES):
            text, call = None, list(FILES)[turn - 1]
        else:
            text, call = "The split is planned: tokens.py first, then parse.py.", None
        output = len(text or "x") // 4
        make = _anthropic if api == "anthropic" else _openai
        answer = make(text, call, tokens=tokens, cached=cached, output=output, turn=turn)
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


def _openai(
    text: str | None, call: str | None, *, tokens: int, cached: int, output: int, turn: int
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if call is not None:
        arguments = json.dumps({"path": call})
        message["tool_calls"] = [
            {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "read_file", "arguments": arguments},
            }
        ]
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if call else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": tokens,
            "completion_tokens": output,
            "total_tokens": tokens + output,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def _anthropic(
    text: str | None, call: str | None, *, tokens: int, cached: int, output: int, turn: int
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    if call is not None:
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{turn}",
                "name": "read_file",
                "input": {"path": call},
            }
        )
    return {
        "id": f"msg_{turn:024d}",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": "tool_use" if call else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": tokens - cached,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": output,
        },
    }


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory() as directory:
            anyio.run(openai_agent, base_url, Path(directory) / "openai")
            anyio.run(anthropic_agent, base_url, Path(directory) / "anthropic")
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
