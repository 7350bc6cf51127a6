"""A streaming Claude agent that survives "prompt is too long" by wrapping the client — offline.

The agent below is ordinary ``anthropic`` SDK code: each turn streams the answer
with ``client.messages.stream(...)`` (printing ``text_stream`` as it arrives,
then ``get_final_message()``), runs the tools the model asked for and resends
the whole history. The only new line is::

    client = wrap_anthropic(AsyncAnthropic(...), middleware, session_id="ses_claude_stream")

When the API answers a request with a context overflow (HTTP 400 "prompt is too
long", a 413, an overflow error event at the start of a stream), the wrapper
rebuilds the context once and sends the request again — on the rebuilt context —
so the host's ``async with`` block just sees the answer. A second overflow for
the same usage raises ``ContextOverflowError`` instead of looping.

No network and no API key: the example starts a tiny stand-in for the Messages
API on 127.0.0.1 (a random port), speaking its server-sent events, and points
the real SDK at it with ``base_url``. Its fourth request is refused as too long.
To talk to the real API instead, run with ``--live`` (needs ``ANTHROPIC_API_KEY``;
model from ``ANTHROPIC_MODEL``).

Run it with ``python examples/anthropic_stream.py``.
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
from anthropic import AsyncAnthropic

from mimo_ctx.events import ContextRebuilt, Event
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers import wrap_anthropic
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.triggers import ModelLimits

MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")
WINDOW = ModelLimits(context_window=200_000, max_output_tokens=8_000)
API = "\n".join(f"- demo.op_{i}(x): helper number {i} of the public API" for i in range(600))
FILES = {
    "README.md": f"# demo\nA library that adds numbers. Entry point: demo.add(a, b).\n{API}",
    "CHANGELOG.md": f"## 0.2.0\n- add() accepts floats\n## 0.1.0\n- first release\n{API}",
}
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file of the project.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
SYSTEM = "You are a concise assistant for the demo project."


# --------------------------------------------------------------------------- the agent


async def ask(client: AsyncAnthropic, history: list[Any], question: str) -> None:
    """One user question: stream the answers, run the tools, until the model is done."""
    history.append({"role": "user", "content": question})
    while True:
        async with client.messages.stream(
            model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=history
        ) as stream:
            streamed = False
            async for text in stream.text_stream:
                print(text if streamed else f"claude: {text}", end="", flush=True)
                streamed = True
            if streamed:
                print()
            final = await stream.get_final_message()
        history.append({"role": "assistant", "content": final.content})
        calls = [block for block in final.content if block.type == "tool_use"]
        if not calls:
            return
        results: list[Any] = []
        for call in calls:
            path = dict(call.input).get("path", "")
            print(f"  (tool) read_file({path})")
            output = FILES.get(str(path), f"error: no file {path}")
            results.append({"type": "tool_result", "tool_use_id": call.id, "content": output})
        history.append({"role": "user", "content": results})


async def run(directory: Path, base_url: str | None) -> None:
    def on_event(event: Event) -> None:
        if isinstance(event, ContextRebuilt):
            print(
                f"  (mimo_ctx) context rebuilt after an overflow: {event.outcome}, "
                f"{event.tokens_before:,} -> {event.tokens_after:,} estimated tokens"
            )

    async with (
        SQLiteStore(directory / "sessions.db") as store,
        ContextMiddleware(store, directory / "memory", model=WINDOW, on_event=on_event) as mw,
    ):
        raw = AsyncAnthropic(api_key="offline", base_url=base_url) if base_url else AsyncAnthropic()
        client = wrap_anthropic(raw, mw, session_id="ses_claude_stream")  # the one new line
        history: list[Any] = []
        await ask(client, history, "What does the project do?")
        await ask(client, history, "What changed in 0.2.0?")
        await raw.close()


# --------------------------------------------------------------------------- offline stand-in

OVERFLOW = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 201234 tokens > 200000 maximum",
    },
}
# What the stand-in answers, request by request: (text, tool call path, input tokens);
# None: refuse the request as too long.
SCRIPT: list[tuple[str | None, str | None, int] | None] = [
    ("Let me read the README.", "README.md", 2_000),
    ("It adds numbers: demo.add(a, b).", None, 60_000),
    (None, "CHANGELOG.md", 120_000),
    None,  # the history has grown too long: HTTP 400 "prompt is too long"
    ("In 0.2.0 add() started to accept floats.", None, 9_000),
]


class StandIn(BaseHTTPRequestHandler):
    """Answers POST /v1/messages from SCRIPT as a Messages API event stream."""

    protocol_version = "HTTP/1.1"
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        number = len(self.received)
        self.received.append(body)
        step = SCRIPT[min(number, len(SCRIPT) - 1)]
        if step is None:
            self.reply(400, "application/json", [json.dumps(OVERFLOW).encode()])
            return
        text, path, tokens = step
        usage = {"input_tokens": tokens, "output_tokens": 1}
        message: dict[str, Any] = {
            "id": f"msg_{number:04d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "usage": usage,
        }
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": message})
        ]
        blocks: list[tuple[dict[str, Any], dict[str, Any]]] = []
        if text:
            blocks.append(({"type": "text", "text": ""}, {"type": "text_delta", "text": text}))
        if path:
            start: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{number}",
                "name": "read_file",
                "input": {},
            }
            delta = {"type": "input_json_delta", "partial_json": json.dumps({"path": path})}
            blocks.append((start, delta))
        for index, (start, delta) in enumerate(blocks):
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start},
                )
            )
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        stop = {"stop_reason": "tool_use" if path else "end_turn", "stop_sequence": None}
        events.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 30}},
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        sse = [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]
        self.reply(200, "text/event-stream", sse)

    def reply(self, status: int, kind: str, chunks: list[bytes]) -> None:
        self.send_response(status)
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
    base_url = None if live else f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory() as directory:
            anyio.run(run, Path(directory), base_url)
    finally:
        server.shutdown()
        server.server_close()
    if not live:
        print(f"the stand-in received {len(StandIn.received)} requests; the retry sent:")
        for message in StandIn.received[-1]["messages"]:
            for block in message["content"]:
                text = block.get("text") or f"[{block['type']}]"
                print(f"  {message['role']}: {text.splitlines()[0][:70]}")


if __name__ == "__main__":
    main()
