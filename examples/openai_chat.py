"""An OpenAI chat agent kept inside its context window by wrapping the client — offline.

The agent below is ordinary ``openai`` SDK code: a loop of
``client.chat.completions.create(...)`` calls that resends the whole history
every turn and runs the tools the model asks for. The only new line is::

    client = wrap_openai(AsyncOpenAI(...), middleware, session_id="ses_readme_chat")

From then on every call stores what is new in the history, sends the managed
view instead of the raw list (the same system prompt and tools, byte for byte),
records the answer with its usage and — once the usage crosses the trigger line
— rebuilds the context: the next request starts with one boundary message
("Summary of previous conversation from checkpoint files: ...") instead of the
old turns. Streams (``stream=True``) pass through chunk by chunk.

No network and no API key: the example starts a tiny stand-in for the OpenAI
API on 127.0.0.1 (a random port) and points the real SDK at it with
``base_url``. Its answers report large token counts so that three turns cross
the trigger line of a 100,000-token window. To talk to the real API instead,
run with ``--live`` (needs ``OPENAI_API_KEY``; model from ``OPENAI_MODEL``).

Run it with ``python examples/openai_chat.py``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import anyio
from openai import AsyncOpenAI

from mimo_ctx.events import ContextRebuilt, Event
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers import wrap_openai
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.triggers import ModelLimits

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")
WINDOW = ModelLimits(context_window=100_000, input_limit=100_000)  # trigger line: 90,000
API = "\n".join(f"- demo.op_{i}(x): helper number {i} of the public API" for i in range(600))
FILES = {  # large files: their results dominate the context until the rebuild
    "README.md": f"# demo\nA library that adds numbers. Entry point: demo.add(a, b).\n{API}",
    "CHANGELOG.md": f"## 0.2.0\n- add() accepts floats\n## 0.1.0\n- first release\n{API}",
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


# --------------------------------------------------------------------------- the agent


async def ask(client: AsyncOpenAI, history: list[Any], question: str) -> str:
    """One user question: call the model, run the tools it asks for, return its answer."""
    history.append({"role": "user", "content": question})
    while True:
        reply = await client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
        message = reply.choices[0].message
        history.append(message)
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            if call.type != "function":  # this agent only declares function tools
                continue
            path = json.loads(call.function.arguments).get("path", "")
            output = FILES.get(path, f"error: no file {path}")
            history.append({"role": "tool", "tool_call_id": call.id, "content": output})


async def run(directory: Path, base_url: str | None) -> None:
    def on_event(event: Event) -> None:
        if isinstance(event, ContextRebuilt):
            print(
                f"context rebuilt: {event.outcome}, {event.tokens_before:,} -> "
                f"{event.tokens_after:,} estimated tokens"
            )

    async with (
        SQLiteStore(directory / "sessions.db") as store,
        ContextMiddleware(store, directory / "memory", model=WINDOW, on_event=on_event) as mw,
    ):
        raw = AsyncOpenAI(api_key="offline", base_url=base_url) if base_url else AsyncOpenAI()
        client = wrap_openai(raw, mw, session_id="ses_readme_chat")  # the one new line
        history: list[Any] = [
            {"role": "system", "content": "You are a concise assistant for the demo project."}
        ]
        print("answer:", await ask(client, history, "What does the project do?"))
        print("answer:", await ask(client, history, "What changed in 0.2.0?"))

        history.append({"role": "user", "content": "Summarise both answers in one line."})
        stream = await client.chat.completions.create(
            model=MODEL, messages=history, stream=True, stream_options={"include_usage": True}
        )
        print("streamed: ", end="")
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
        print()
        await raw.close()
        stored = await store.list_messages("ses_readme_chat", agent=None)
    print(
        f"the host kept its {len(history)} messages; the store holds {len(stored)} (none deleted)"
    )


# --------------------------------------------------------------------------- offline stand-in

# What the stand-in answers, request by request: (text, tool call path, prompt tokens).
SCRIPT: list[tuple[str | None, str | None, int]] = [
    (None, "README.md", 2_000),
    ("It adds numbers: demo.add(a, b).", None, 30_000),
    (None, "CHANGELOG.md", 60_000),
    ("In 0.2.0 add() started to accept floats.", None, 95_000),  # crosses the trigger line
    ("demo adds numbers, and since 0.2.0 floats too.", None, 9_000),
]


class StandIn(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions from SCRIPT, as JSON or as an SSE stream."""

    protocol_version = "HTTP/1.1"
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        number = len(self.received)
        self.received.append(body)
        text, path, prompt = SCRIPT[min(number, len(SCRIPT) - 1)]
        calls = [
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
            }
        ]
        message = {"role": "assistant", "content": text, **({"tool_calls": calls} if path else {})}
        finish = "tool_calls" if path else "stop"
        usage = {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}
        base = {"id": f"chatcmpl-{number}", "created": 0, "model": body["model"]}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            data = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            self.reply("application/json", [json.dumps(data).encode()])
            return
        chunk = {**base, "object": "chat.completion.chunk"}
        words = (text or "").split(" ")
        pieces = [w + " " for w in words[:-1]] + words[-1:]
        deltas = [{"role": "assistant", "content": ""}, *({"content": p} for p in pieces)]
        events = [
            {**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
        ]
        events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        events.append({**chunk, "choices": [], "usage": usage})
        sse = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
        self.reply("text/event-stream", sse)

    def reply(self, kind: str, chunks: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        return


def main() -> None:
    live = "--live" in sys.argv
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = None if live else f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        with tempfile.TemporaryDirectory() as directory:
            anyio.run(run, Path(directory), base_url)
    finally:
        server.shutdown()
        server.server_close()
    if not live:
        sizes = ", ".join(f"{len(json.dumps(r['messages'])):,}" for r in StandIn.received)
        print(f"request sizes in characters: {sizes}")
        print("the last request (after the rebuild) sent:")
        for message in StandIn.received[-1]["messages"]:
            content = message["content"]
            text = content if isinstance(content, str) else content[0]["text"]
            print(f"  {message['role']}: {text.splitlines()[0][:70]}")


if __name__ == "__main__":
    main()
