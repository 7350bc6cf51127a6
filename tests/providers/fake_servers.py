"""Fake OpenAI and Anthropic servers that speak the real wire formats (no network).

:class:`FakeProvider` answers ``POST /v1/chat/completions``, ``/v1/responses`` and
``/v1/messages`` from a queue of scripted replies, as JSON or — when the request
says ``"stream": true`` — as server-sent events, chunk by chunk, exactly as the
providers send them. It records every request body. Plug it into the real SDKs
through ``httpx2.MockTransport`` (:func:`openai_client`, :func:`anthropic_client`)
or serve it on 127.0.0.1 (:class:`LoopbackServer`).

Wire formats follow the providers' API references: Chat Completions chunks end
with ``data: [DONE]`` (a usage-only chunk first when ``stream_options.include_usage``
is set); Responses streams are ``event:``-named ``response.*`` events ending in
``response.completed``; Anthropic streams run ``message_start``,
``content_block_*``, ``message_delta``, ``message_stop`` (with ``ping``).
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai

from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.messages import Message, TextPart
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers._sync import RecordingStream
from mimo_ctx.providers.validate import RequestFormat, validate_request
from mimo_ctx.reminders import per_turn_reminder
from mimo_ctx.store import InMemoryStore, Store
from mimo_ctx.triggers import ModelLimits
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER

__all__ = [
    "LIMITS",
    "OVER_THE_LINE",
    "CutStream",
    "ErrorReply",
    "FakeProvider",
    "Hang",
    "LoopbackServer",
    "Reply",
    "StreamError",
    "anthropic_client",
    "boundary_text",
    "count_boundaries",
    "openai_client",
    "overflow",
    "running_middleware",
    "seed_memory",
    "stored_boundary",
    "stream_recorded",
]

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_ANTHROPIC = "/v1/messages/count_tokens"
COUNT_OPENAI = "/v1/responses/input_tokens"


@dataclass
class Reply:
    """A successful answer.

    Attributes:
        text: Assistant text (None: none).
        calls: Tool calls ``(call_id, name, input)``.
        input_tokens: Input tokens reported (prompt tokens, cache included).
        output_tokens: Output tokens reported.
        cached_tokens: Cached input tokens (OpenAI cached / Anthropic cache read).
        finish: Finish / stop reason override (else derived from the content).
        reasoning_id: Responses only: a reasoning item with this id comes first.
        thinking: Anthropic only: a thinking block ``(text, signature)`` comes first.
    """

    text: str | None = "ok"
    calls: list[tuple[str, str, dict[str, Any]]] = field(
        default_factory=list[tuple[str, str, dict[str, Any]]]
    )
    input_tokens: int = 100
    output_tokens: int = 10
    cached_tokens: int = 0
    finish: str | None = None
    reasoning_id: str | None = None
    thinking: tuple[str, str] | None = None


@dataclass
class ErrorReply:
    """An HTTP error answer."""

    status: int
    body: dict[str, Any]


@dataclass
class StreamError:
    """A 200 stream that reports an error event; ``after`` text chunks come first."""

    body: dict[str, Any]
    after: str | None = None


@dataclass
class CutStream:
    """A 200 stream of ``reply`` cut after its first ``keep`` events: no finish reason,
    no closing event. ``drop`` also drops the connection mid-body (over the loopback
    server the SDK then sees a broken transfer, as on a real network cut)."""

    reply: Reply
    keep: int
    drop: bool = False


@dataclass
class Hang:
    """No answer for ``seconds`` (or until the fake is released), then the default reply.

    Only for the loopback server: its handler thread waits, the client's request
    stays open.
    """

    seconds: float = 30.0


ReplySpec = Reply | ErrorReply | StreamError | CutStream | Hang

Route = Callable[[str, dict[str, Any]], "ReplySpec | None"]
"""Picks a reply from a request (path, body) before the queue is asked; None: the queue."""


def overflow(api: str) -> ErrorReply:
    """The provider's real context-overflow error for ``api`` (chat, responses, anthropic)."""
    if api == "chat":
        return ErrorReply(
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens. However, "
                    "your messages resulted in 131072 tokens. Please reduce the length of "
                    "the messages.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
        )
    if api == "responses":
        return ErrorReply(
            400,
            {
                "error": {
                    "message": "Your input exceeds the context window of this model. Please "
                    "adjust your input and try again.",
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": "context_length_exceeded",
                }
            },
        )
    return ErrorReply(
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208310 tokens > 200000 maximum",
            },
            "request_id": "req_011CfakeOverflow",
        },
    )


def _sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _cut(cut: CutStream) -> dict[str, str]:
    return {"x-fake-drop": "1"} if cut.drop else {}


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _halves(text: str) -> list[str]:
    cut = max(1, len(text) // 2)
    return [p for p in (text[:cut], text[cut:]) if p]


@dataclass
class Recorded:
    """One request the fake received."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    size: int = 0
    """Bytes of the request body as sent."""


class FakeProvider:
    """Scripted provider: ``replies`` are answered in order (then :class:`Reply` defaults).

    Args:
        model: Model name put on answers.
        check: Run :func:`validate_request` on every request body; failures are
            collected in :attr:`invalid` (and the request is still answered).
    """

    def __init__(self, *, model: str = "fake-model", check: bool = False) -> None:
        self.model = model
        self.check = check
        self.replies: deque[ReplySpec] = deque()
        self.route: Route | None = None
        self.released = threading.Event()
        self.requests: list[Recorded] = []
        self.invalid: list[str] = []
        self._counter = 0
        self._lock = threading.Lock()

    # -- scripting ----------------------------------------------------------------
    def add(self, *replies: ReplySpec) -> FakeProvider:
        """Queue replies."""
        self.replies.extend(replies)
        return self

    def bodies(self, path: str | None = None) -> list[dict[str, Any]]:
        """Request bodies received (for one path, or all)."""
        return [r.body for r in self.requests if path is None or r.path == path]

    def _next_id(self) -> int:
        self._counter += 1
        return self._counter

    # -- the HTTP side -----------------------------------------------------------------
    def respond(
        self, path: str, body: dict[str, Any], headers: dict[str, str], size: int = 0
    ) -> tuple[int, dict[str, str], list[bytes]]:
        """Answer one request: status, headers and body chunks."""
        if path in (COUNT_ANTHROPIC, COUNT_OPENAI):
            # Token-count endpoints: a deterministic count (JSON size / 3).
            with self._lock:
                self.requests.append(Recorded(path, body, headers))
            count: dict[str, int | str] = {"input_tokens": len(json.dumps(body)) // 3}
            if path == COUNT_OPENAI:
                count["object"] = "response.input_tokens"
            return 200, {"content-type": "application/json"}, [json.dumps(count).encode()]
        with self._lock:
            self.requests.append(Recorded(path, body, headers, size))
            self._validate(path, body)
            routed = self.route(path, body) if self.route is not None else None
            if routed is not None:
                reply = routed
            else:
                reply = self.replies.popleft() if self.replies else Reply()
            number = self._next_id()
        if isinstance(reply, Hang):
            self.released.wait(reply.seconds)
            reply = Reply()
        if isinstance(reply, ErrorReply):
            return (
                reply.status,
                {"content-type": "application/json"},
                [json.dumps(reply.body).encode()],
            )
        stream = body.get("stream") is True
        if isinstance(reply, CutStream):
            return (
                200,
                {"content-type": "text/event-stream", **_cut(reply)},
                self._cut(path, reply, number),
            )
        if path not in (CHAT, RESPONSES, MESSAGES):
            return 404, {"content-type": "application/json"}, [b'{"error":{"message":"no route"}}']
        if not stream:
            # An error event exists only inside a stream: a script that queues one for a
            # plain request is a mistake of the test.
            assert isinstance(reply, Reply), f"{path}: a StreamError answers streamed requests"
            return 200, {"content-type": "application/json"}, [self._json(path, reply, number)]
        if path == CHAT:
            chunks = list(self._chat_stream(reply, number, body))
        elif path == RESPONSES:
            chunks = list(self._responses_stream(reply, number))
        else:
            chunks = list(self._anthropic_stream(reply, number))
        return 200, {"content-type": "text/event-stream"}, chunks

    def _json(self, path: str, reply: Reply, number: int) -> bytes:
        if path == CHAT:
            answer = self._chat_json(reply, number)
        elif path == RESPONSES:
            answer = self._response_json(reply, number)
        else:
            answer = self._anthropic_json(reply, number)
        return json.dumps(answer).encode()

    def _cut(self, path: str, cut: CutStream, number: int) -> list[bytes]:
        if path == CHAT:
            events = self.chat_chunks(cut.reply, number, usage=False)
            return [_sse(e) for e in events[: cut.keep]]
        if path == RESPONSES:
            events = self.response_events(cut.reply, number)
            return [_sse(e, e["type"]) for e in events[: cut.keep]]
        events = self.anthropic_events(cut.reply, number)
        return [_sse(e, e["type"]) for e in events[: cut.keep]]

    def _validate(self, path: str, body: dict[str, Any]) -> None:
        if not self.check:
            return
        formats: dict[str, RequestFormat] = {
            CHAT: "openai-chat",
            RESPONSES: "openai-responses",
            MESSAGES: "anthropic",
        }
        fmt = formats.get(path)
        if fmt is None:
            return
        try:
            validate_request(body, format=fmt)
        except InvalidRequestError as exc:
            self.invalid.append(f"{path}: {exc}")

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        """An ``httpx2.MockTransport`` handler."""
        body = json.loads(request.content or b"{}")
        status, headers, chunks = self.respond(
            request.url.path, body, dict(request.headers), len(request.content)
        )

        async def stream() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        if headers["content-type"] == "text/event-stream":
            return httpx2.Response(status, headers=headers, content=stream())
        return httpx2.Response(status, headers=headers, content=b"".join(chunks))

    # -- Chat Completions ------------------------------------------------------------
    def _chat_usage(self, reply: Reply) -> dict[str, Any]:
        return {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        }

    def _chat_finish(self, reply: Reply) -> str:
        return reply.finish or ("tool_calls" if reply.calls else "stop")

    def _chat_json(self, reply: Reply, number: int) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text,
            "refusal": None,
            "annotations": [],
        }
        if reply.calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": _compact(args),
                    },
                }
                for call_id, name, args in reply.calls
            ]
        return {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": 1_700_000_000 + number,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._chat_finish(reply),
                }
            ],
            "usage": self._chat_usage(reply),
            "service_tier": "default",
            "system_fingerprint": None,
        }

    def chat_chunks(self, reply: Reply, number: int, *, usage: bool) -> list[dict[str, Any]]:
        """The chunk objects a Chat Completions stream of ``reply`` sends."""
        base = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000 + number,
            "model": self.model,
            "system_fingerprint": None,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out: dict[str, Any] = {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if usage:
                out["usage"] = None
            return out

        chunks = [chunk({"role": "assistant", "content": "", "refusal": None})]
        for piece in _halves(reply.text or ""):
            chunks.append(chunk({"content": piece}))
        for index, (call_id, name, args) in enumerate(reply.calls):
            chunks.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in _halves(_compact(args)):
                chunks.append(
                    chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                )
        chunks.append(chunk({}, self._chat_finish(reply)))
        if usage:
            chunks.append({**base, "choices": [], "usage": self._chat_usage(reply)})
        return chunks

    def _chat_stream(self, reply: ReplySpec, number: int, body: dict[str, Any]) -> Iterator[bytes]:
        options: dict[str, Any] = body.get("stream_options") or {}
        if isinstance(reply, StreamError):
            if reply.after:
                for chunk in self.chat_chunks(Reply(text=reply.after), number, usage=False)[:-1]:
                    yield _sse(chunk)
            yield _sse(reply.body)
            return
        assert isinstance(reply, Reply)
        for chunk in self.chat_chunks(reply, number, usage=bool(options.get("include_usage"))):
            yield _sse(chunk)
        yield _sse("[DONE]")

    # -- Responses -----------------------------------------------------------------------
    def _response_items(self, reply: Reply, number: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if reply.reasoning_id:
            items.append(
                {
                    "type": "reasoning",
                    "id": reply.reasoning_id,
                    "summary": [{"type": "summary_text", "text": "thinking it over"}],
                    "encrypted_content": f"enc-{reply.reasoning_id}",
                }
            )
        if reply.text is not None:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{number}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [
                        {
                            "type": "output_text",
                            "text": reply.text,
                            "annotations": [],
                            "logprobs": [],
                        }
                    ],
                }
            )
        for call_id, name, args in reply.calls:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{call_id}",
                    "call_id": call_id,
                    "name": name,
                    "arguments": _compact(args),
                    "status": "completed",
                }
            )
        return items

    def _response_json(
        self, reply: Reply, number: int, *, status: str = "completed", output: bool = True
    ) -> dict[str, Any]:
        return {
            "id": f"resp_{number}",
            "object": "response",
            "created_at": 1_700_000_000 + number,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "model": self.model,
            "output": self._response_items(reply, number) if output else [],
            "parallel_tool_calls": True,
            "temperature": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "usage": (
                {
                    "input_tokens": reply.input_tokens,
                    "input_tokens_details": {"cached_tokens": reply.cached_tokens},
                    "output_tokens": reply.output_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": reply.input_tokens + reply.output_tokens,
                }
                if output
                else None
            ),
        }

    def response_events(self, reply: Reply, number: int) -> list[dict[str, Any]]:
        """The events a Responses stream of ``reply`` sends."""
        events: list[dict[str, Any]] = []

        def emit(kind: str, **fields: Any) -> None:
            events.append({"type": kind, "sequence_number": len(events), **fields})

        start = self._response_json(reply, number, status="in_progress", output=False)
        emit("response.created", response=start)
        emit("response.in_progress", response=start)
        for index, item in enumerate(self._response_items(reply, number)):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                part: dict[str, Any] = {
                    "type": "output_text",
                    "text": "",
                    "annotations": [],
                    "logprobs": [],
                }
                emit(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
                for piece in _halves(text):
                    emit(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                emit(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
                emit(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part={**part, "text": text},
                )
            elif item["type"] == "function_call":
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                for piece in _halves(item["arguments"]):
                    emit(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=piece,
                    )
                emit(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                    name=item["name"],
                )
            else:
                emit("response.output_item.added", output_index=index, item=item)
            emit("response.output_item.done", output_index=index, item=item)
        emit("response.completed", response=self._response_json(reply, number))
        return events

    def _responses_stream(self, reply: ReplySpec, number: int) -> Iterator[bytes]:
        if isinstance(reply, StreamError):
            start = self._response_json(Reply(), number, status="in_progress", output=False)
            yield _sse(
                {"type": "response.created", "sequence_number": 0, "response": start},
                "response.created",
            )
            sequence = 1
            if reply.after:
                for event in self.response_events(Reply(text=reply.after), number)[2:5]:
                    yield _sse({**event, "sequence_number": sequence}, event["type"])
                    sequence += 1
            yield _sse({**reply.body, "sequence_number": sequence}, reply.body["type"])
            return
        assert isinstance(reply, Reply)
        for event in self.response_events(reply, number):
            yield _sse(event, event["type"])

    # -- Anthropic Messages ------------------------------------------------------------
    def _anthropic_blocks(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.thinking is not None:
            thinking, signature = reply.thinking
            blocks.append({"type": "thinking", "thinking": thinking, "signature": signature})
        if reply.text is not None:
            blocks.append({"type": "text", "text": reply.text})
        for call_id, name, args in reply.calls:
            blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
        return blocks

    def _anthropic_usage(self, reply: Reply, *, output: int | None = None) -> dict[str, Any]:
        return {
            "input_tokens": reply.input_tokens - reply.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": reply.cached_tokens,
            "output_tokens": reply.output_tokens if output is None else output,
            "service_tier": "standard",
        }

    def _stop_reason(self, reply: Reply) -> str:
        return reply.finish or ("tool_use" if reply.calls else "end_turn")

    def _anthropic_json(self, reply: Reply, number: int) -> dict[str, Any]:
        return {
            "id": f"msg_{number:024d}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self._anthropic_blocks(reply),
            "stop_reason": self._stop_reason(reply),
            "stop_sequence": None,
            "usage": self._anthropic_usage(reply),
        }

    def anthropic_events(self, reply: Reply, number: int) -> list[dict[str, Any]]:
        """The events an Anthropic stream of ``reply`` sends (without ``ping``)."""
        start: dict[str, Any] = {
            **self._anthropic_json(reply, number),
            "content": [],
            "stop_reason": None,
            "usage": self._anthropic_usage(reply, output=1),
        }
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
        for index, block in enumerate(self._anthropic_blocks(reply)):
            if block["type"] == "text":
                events.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    }
                )
                for piece in _halves(block["text"]):
                    events.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": piece},
                        }
                    )
            elif block["type"] == "thinking":
                events.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                    }
                )
                for piece in _halves(block["thinking"]):
                    events.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "thinking_delta", "thinking": piece},
                        }
                    )
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": block["signature"]},
                    }
                )
            else:
                events.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {**block, "input": {}},
                    }
                )
                for piece in _halves(_compact(block["input"])):
                    events.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        }
                    )
            events.append({"type": "content_block_stop", "index": index})
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": self._stop_reason(reply), "stop_sequence": None},
                "usage": {"output_tokens": reply.output_tokens},
            }
        )
        events.append({"type": "message_stop"})
        return events

    def _anthropic_stream(self, reply: ReplySpec, number: int) -> Iterator[bytes]:
        if isinstance(reply, StreamError):
            events = self.anthropic_events(Reply(text=reply.after or "x"), number)
            yield _sse(events[0], "message_start")
            if reply.after:
                for event in events[1:3]:
                    yield _sse(event, event["type"])
            yield _sse(reply.body, "error")
            return
        assert isinstance(reply, Reply)
        events = self.anthropic_events(reply, number)
        for position, event in enumerate(events):
            yield _sse(event, event["type"])
            if position == 0:
                yield _sse({"type": "ping"}, "ping")


# --------------------------------------------------------------------------- clients


def openai_client(fake: FakeProvider) -> openai.AsyncOpenAI:
    """A real ``AsyncOpenAI`` client talking to ``fake`` through ``httpx2.MockTransport``."""
    return openai.AsyncOpenAI(
        api_key="sk-test",
        base_url="http://fake.test/v1",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handler)),
    )


def anthropic_client(fake: FakeProvider) -> anthropic.AsyncAnthropic:
    """A real ``AsyncAnthropic`` client talking to ``fake`` through ``httpx2.MockTransport``."""
    return anthropic.AsyncAnthropic(
        api_key="sk-ant-test",
        base_url="http://fake.test",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handler)),
    )


# --------------------------------------------------------------------------- loopback


class LoopbackServer:
    """Serves a :class:`FakeProvider` over HTTP/1.1 on 127.0.0.1 (random port), in a thread.

    Use as a context manager; :attr:`base_url` is ``http://127.0.0.1:<port>``.
    """

    def __init__(self, fake: FakeProvider) -> None:
        provider = fake

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                body = json.loads(raw or b"{}")
                status, headers, chunks = provider.respond(
                    self.path.split("?")[0], body, dict(self.headers.items()), len(raw)
                )
                try:
                    self._answer(status, headers, chunks)
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up (a cancelled writer): nothing to answer

            def _answer(self, status: int, headers: dict[str, str], chunks: list[bytes]) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    if key != "x-fake-drop":
                        self.send_header(key, value)
                if headers["content-type"] == "text/event-stream":
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for chunk in chunks:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    if "x-fake-drop" in headers:
                        # A network cut: the body stops without its last chunk.
                        self.close_connection = True
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    data = b"".join(chunks)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._fake = fake
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._fake.released.set()  # a hanging handler answers now
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# --------------------------------------------------------------------------- test helpers

LIMITS = ModelLimits(100_000, input_limit=100_000)
"""A small window: the trigger line is 90 000 tokens."""

OVER_THE_LINE = 95_000
"""Input tokens a fake answer reports to cross the trigger line of :data:`LIMITS`."""


@asynccontextmanager
async def running_middleware(
    tmp_path: Path, store: Store | None = None
) -> AsyncGenerator[ContextMiddleware]:
    """A running :class:`ContextMiddleware` with :data:`LIMITS` on an in-memory store."""
    async with ContextMiddleware(store or InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        yield mw


def seed_memory(mw: ContextMiddleware, session_id: str) -> str:
    """Give the session a memory file so every request carries the per-turn reminder
    (SPEC R8.3) from the first turn on; returns the reminder text."""
    directory = mw.layout.session_dir(session_id)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "notes.md").write_text("# Notes\n\n- the user prefers short answers\n")
    return per_turn_reminder(str(directory))


async def stored_boundary(mw: ContextMiddleware, session_id: str) -> Message:
    """The session's newest boundary message (fails the test when there is none)."""
    boundary = await mw.store.latest_boundary(session_id)
    assert boundary is not None, "no rebuild boundary was inserted"
    return boundary


def boundary_text(boundary: Message) -> str:
    """The one text a boundary is sent as (SPEC R8.1): the checkpoint header, then its
    text parts, joined with a blank line."""
    texts = [CHECKPOINT_SUMMARY_HEADER]
    texts += [p.text for p in boundary.parts if isinstance(p, TextPart)]
    return "\n\n".join(texts)


def stream_recorded(stream: object) -> Message | None:
    """What a wrapped client's stream recorded when it ended (None: nothing yet).

    A ``stream=True`` call of a wrapped client is typed as the SDK's stream (host code
    type-checks unchanged); this checks it is the wrapper's :class:`RecordingStream`
    and reads what the wrapper adds.
    """
    assert isinstance(stream, RecordingStream), f"not a recording stream: {type(stream)!r}"
    return stream.recorded


async def count_boundaries(mw: ContextMiddleware, session_id: str) -> int:
    """How many boundary messages the session holds."""
    return sum(m.is_boundary for m in await mw.store.list_messages(session_id, agent=None))
