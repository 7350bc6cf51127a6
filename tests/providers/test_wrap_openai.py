"""wrap_openai with the real ``openai`` SDK against a fake server (issue 5.2, 5.3).

Exact request bodies before and after a rebuild (SPEC R1.1, R8.1), one retry on
an overflow and no loop on a second one (R1.4, R1.5, A11), streams passed through
unchanged and recorded, history sync across turns and processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from fake_servers import (
    CHAT,
    OVER_THE_LINE,
    RESPONSES,
    ErrorReply,
    FakeProvider,
    LoopbackServer,
    Reply,
    StreamError,
    boundary_text,
    count_boundaries,
    openai_client,
    overflow,
    running_middleware,
    seed_memory,
    stored_boundary,
    stream_recorded,
)
from openai.types.chat import (
    ChatCompletionStreamOptionsParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionToolParam,
    ChatCompletionUserMessageParam,
)

from mimo_ctx.errors import ConfigError, ContextOverflowError, InvalidRequestError
from mimo_ctx.messages import TextPart, ToolResultPart
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.providers import openai_client as openai_module
from mimo_ctx.providers import wrap_openai
from mimo_ctx.store import InMemoryStore

SID = "ses_wrap_openai"
MODEL = "gpt-test"
SYSTEM: ChatCompletionSystemMessageParam = {
    "role": "system",
    "content": "You are a careful coding agent.",
}
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def user(text: str, reminder: str | None = None) -> ChatCompletionUserMessageParam:
    """A user message as the wrapper sends it (the per-turn reminder appended, R8.3)."""
    if reminder is None:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "text", "text": reminder}],
    }


def tool(call_id: str, output: str) -> ChatCompletionToolMessageParam:
    return {"role": "tool", "tool_call_id": call_id, "content": output}


CALLS = [("call_a", "read", {"path": "a.py"}), ("call_b", "read", {"path": "b.py"})]
ASSISTANT_CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "read", "arguments": '{"path":"a.py"}'},
        },
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "read", "arguments": '{"path":"b.py"}'},
        },
    ],
}


async def test_r8_1_chat_request_bodies_before_and_after_rebuild(tmp_path: Path) -> None:
    """Before the trigger line the body is the host's request (history as stored);
    after it, the system prompt, the boundary as one text and the live user turn."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [SYSTEM, {"role": "user", "content": "Read a.py and b.py."}]
        fake.add(Reply(text=None, calls=CALLS, input_tokens=5_000))
        first = await client.chat.completions.create(
            model=MODEL, messages=host, tools=TOOLS, temperature=0
        )
        host += [first.choices[0].message, tool("call_a", "print(1)"), tool("call_b", "print(2)")]
        fake.add(Reply(text="Both print a number.", input_tokens=OVER_THE_LINE))
        second = await client.chat.completions.create(
            model=MODEL, messages=host, tools=TOOLS, temperature=0
        )
        host += [
            {"role": "assistant", "content": second.choices[0].message.content},
            {"role": "user", "content": "Now c.py."},
        ]
        fake.add(Reply(text="Reading c.py."))
        third = await client.chat.completions.create(
            model=MODEL, messages=host, tools=TOOLS, temperature=0
        )
        assert third.choices[0].message.content == "Reading c.py."
        boundary = await stored_boundary(mw, SID)

        bodies = fake.bodies(CHAT)
        assert bodies[0] == {
            "model": MODEL,
            "messages": [SYSTEM, user("Read a.py and b.py.", reminder)],
            "tools": TOOLS,
            "temperature": 0,
        }
        assert bodies[1] == {
            "model": MODEL,
            "messages": [
                SYSTEM,
                user("Read a.py and b.py.", reminder),
                ASSISTANT_CALLS,
                tool("call_a", "print(1)"),
                tool("call_b", "print(2)"),
            ],
            "tools": TOOLS,
            "temperature": 0,
        }
        # After the rebuild (R8.1): system first, byte-identical; the boundary as one
        # user text; the history before the watermark and the digested tail are gone.
        assert bodies[2] == {
            "model": MODEL,
            "messages": [
                SYSTEM,
                {"role": "user", "content": boundary_text(boundary)},
                user("Now c.py.", reminder),
            ],
            "tools": TOOLS,
            "temperature": 0,
        }
        assert "Read a.py and b.py." in boundary_text(boundary)  # verbatim user input (R5)
        assert await count_boundaries(mw, SID) == 1


async def test_sync_stores_only_new_messages_even_after_a_rebuild(tmp_path: Path) -> None:
    """The host keeps resending its old full list after a rebuild: nothing is stored twice."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [SYSTEM, {"role": "user", "content": "Read a.py and b.py."}]
        fake.add(Reply(text=None, calls=CALLS, input_tokens=5_000))
        reply = await client.chat.completions.create(model=MODEL, messages=host)
        host += [reply.choices[0].message, tool("call_a", "1"), tool("call_b", "2")]
        fake.add(Reply(text="Done.", input_tokens=OVER_THE_LINE))
        reply = await client.chat.completions.create(model=MODEL, messages=host)
        host += [reply.choices[0].message.model_dump(), {"role": "user", "content": "continue"}]
        await client.chat.completions.create(model=MODEL, messages=host)  # rebuilds
        assert await count_boundaries(mw, SID) == 1
        stored = await mw.store.list_messages(SID, agent=None)
        # u1, assistant (calls), two results, assistant, "continue", answer, boundary.
        assert len(stored) == 8
        results = [p for m in stored for p in m.parts if isinstance(p, ToolResultPart)]
        assert [(r.call_id, r.tool) for r in results] == [("call_a", "read"), ("call_b", "read")]
        # The same list again plus the answer and a second "continue": two new messages.
        host += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "continue"}]
        await client.chat.completions.create(model=MODEL, messages=host)
        stored = await mw.store.list_messages(SID, agent=None)
        assert len(stored) == 10
        texts = [
            p.text for m in stored if m.role == "user" for p in m.parts if isinstance(p, TextPart)
        ]
        assert texts.count("continue") == 2


async def test_sync_survives_a_new_process(tmp_path: Path) -> None:
    """Which host messages are stored lives in the store's host index: a new middleware
    on the same store recognises the whole resent history."""
    fake = FakeProvider()
    store = InMemoryStore()
    host: list[Any] = [SYSTEM, {"role": "user", "content": "Read a.py and b.py."}]
    async with running_middleware(tmp_path, store) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        fake.add(Reply(text=None, calls=CALLS))
        reply = await client.chat.completions.create(model=MODEL, messages=host)
        host += [reply.choices[0].message, tool("call_a", "1"), tool("call_b", "2")]
        await client.chat.completions.create(model=MODEL, messages=host)
    before = await store.list_messages(SID, agent=None)
    assert len((await store.host_index(SID, agent="main")).nodes) == len(host) - 1 + 1
    async with running_middleware(tmp_path, store) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
        await client.chat.completions.create(model=MODEL, messages=host)
    after = await store.list_messages(SID, agent=None)
    assert len(after) == len(before) + 2  # "next" and its answer only


async def test_chat_stream_passes_chunks_through_and_records(tmp_path: Path) -> None:
    """stream=True: the host gets exactly the chunks the server sent; the answer is
    recorded at the end with the exact usage when the host asked for it."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        reply = Reply(text="Reading both.", calls=CALLS, input_tokens=1_234, cached_tokens=200)
        fake.add(reply)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[SYSTEM, {"role": "user", "content": "Read them."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        received = [chunk.model_dump(mode="json", exclude_unset=True) async for chunk in stream]
        assert received == fake.chat_chunks(reply, 1, usage=True)
        assert fake.bodies(CHAT)[0]["stream_options"] == {"include_usage": True}
        recorded = stream_recorded(stream)
        assert recorded is not None
        assert recorded.finish == "tool-calls"
        assert recorded.usage is not None
        assert (recorded.usage.input, recorded.usage.cache_read) == (1_034, 200)
        assert recorded.usage.total == 1_234 + 10
        assert [p.text for p in recorded.parts if isinstance(p, TextPart)] == ["Reading both."]


async def test_chat_stream_without_usage_is_estimated_not_changed(tmp_path: Path) -> None:
    """Our choice: the host's request is left alone (no stream_options added); usage is
    estimated and marked so."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async with stream:
            texts = [c.choices[0].delta.content async for c in stream if c.choices]
        assert "".join(t or "" for t in texts) == "ok"
        assert "stream_options" not in fake.bodies(CHAT)[0]
        recorded = stream_recorded(stream)
        assert recorded is not None
        assert recorded.usage is not None
        assert recorded.usage.estimated
        assert recorded.usage.input > 0


async def test_r8_1_chat_stream_bodies_before_and_after_rebuild(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [SYSTEM, {"role": "user", "content": "Summarise the repo."}]
        fake.add(Reply(text="It is a library.", input_tokens=OVER_THE_LINE))
        options: ChatCompletionStreamOptionsParam = {"include_usage": True}
        stream = await client.chat.completions.create(
            model=MODEL, messages=host, stream=True, stream_options=options
        )
        answer = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        host += [{"role": "assistant", "content": answer}, {"role": "user", "content": "More."}]
        stream = await client.chat.completions.create(
            model=MODEL, messages=host, stream=True, stream_options=options
        )
        async for _ in stream:
            pass
        boundary = await stored_boundary(mw, SID)
        before, after = fake.bodies(CHAT)
        assert before == {
            "model": MODEL,
            "stream": True,
            "messages": [SYSTEM, user("Summarise the repo.", reminder)],
            "stream_options": options,
        }
        assert after == {
            "model": MODEL,
            "stream": True,
            "messages": [
                SYSTEM,
                {"role": "user", "content": boundary_text(boundary)},
                user("More.", reminder),
            ],
            "stream_options": options,
        }


# --------------------------------------------------------------------------- overflow


async def test_r1_1b_chat_overflow_rebuilds_once_and_retries(tmp_path: Path) -> None:
    """A 400 context_length_exceeded leads to exactly one rebuild and one retry."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [SYSTEM, {"role": "user", "content": "Go."}]
        first = await client.chat.completions.create(model=MODEL, messages=host)
        host += [first.choices[0].message, {"role": "user", "content": "And again."}]
        fake.add(overflow("chat"), Reply(text="Recovered."))
        reply = await client.chat.completions.create(model=MODEL, messages=host)
        assert reply.choices[0].message.content == "Recovered."
        bodies = fake.bodies(CHAT)
        assert len(bodies) == 3  # first turn, the overflow, the one retry
        boundary = await stored_boundary(mw, SID)
        assert bodies[1]["messages"] == [
            SYSTEM,
            user("Go."),
            {"role": "assistant", "content": "ok"},
            user("And again.", reminder),
        ]
        assert bodies[2]["messages"] == [
            SYSTEM,
            {"role": "user", "content": boundary_text(boundary)},
            user("And again.", reminder),
        ]
        assert await count_boundaries(mw, SID) == 1


async def test_r1_4_chat_second_overflow_raises_without_loop(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [SYSTEM, {"role": "user", "content": "Go."}]
        first = await client.chat.completions.create(model=MODEL, messages=host)
        host += [first.choices[0].message, {"role": "user", "content": "More."}]
        fake.add(overflow("chat"), overflow("chat"))
        with pytest.raises(ContextOverflowError) as info:
            await client.chat.completions.create(model=MODEL, messages=host)
        cause = info.value.__cause__
        assert isinstance(cause, openai.BadRequestError)
        assert cause.code == "context_length_exceeded"
        assert len(fake.bodies(CHAT)) == 3  # first turn, the overflow, one retry: no loop
        # The host tries again with the same usage: refused after one request.
        fake.add(overflow("chat"))
        with pytest.raises(ContextOverflowError):
            await client.chat.completions.create(model=MODEL, messages=host)
        assert len(fake.bodies(CHAT)) == 4
        assert await count_boundaries(mw, SID) == 1


async def test_chat_overflow_at_stream_start_is_retried_transparently(tmp_path: Path) -> None:
    """An error chunk before any content: the SDK raises, the wrapper rebuilds and the
    host reads the retried stream only."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        error = overflow("chat").body
        fake.add(StreamError(error), Reply(text="fresh"))
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        chunks = [c async for c in stream]
        assert {c.id for c in chunks} == {"chatcmpl-2"}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "fresh"
        assert await count_boundaries(mw, SID) == 1
        assert stream_recorded(stream) is not None


async def test_chat_overflow_after_content_reaches_host_and_rebuilds(tmp_path: Path) -> None:
    """Too late to retry: the SDK's error reaches the host unchanged, the rebuild runs
    so the next turn fits, and the unfinished answer is not recorded."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        fake.add(StreamError(overflow("chat").body, after="partial"))
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        seen: list[Any] = []

        async def consume() -> None:
            async for chunk in stream:
                seen.append(chunk)

        with pytest.raises(openai.APIError) as info:
            await consume()
        assert info.value.code == "context_length_exceeded"
        assert "".join(c.choices[0].delta.content or "" for c in seen) == "partial"
        assert stream_recorded(stream) is None
        assert await count_boundaries(mw, SID) == 1


async def test_other_errors_propagate_unchanged(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        fake.add(
            ErrorReply(429, {"error": {"message": "Rate limit: too many tokens per minute"}}),
            ErrorReply(400, {"error": {"message": "Invalid 'messages[0].content'", "code": None}}),
        )
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=MODEL, messages=[user("a")])
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model=MODEL, messages=[user("a")])
        assert len(fake.bodies(CHAT)) == 2  # no retry
        assert await count_boundaries(mw, SID) == 0


async def test_other_error_is_the_same_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_middleware(tmp_path) as mw:
        raw = openai_client(FakeProvider())
        client = wrap_openai(raw, mw, session_id=SID)
        error = RuntimeError("connection reset")

        async def broken(**kwargs: Any) -> Any:
            raise error

        monkeypatch.setattr(raw.chat.completions, "create", broken)
        with pytest.raises(RuntimeError) as info:
            await client.chat.completions.create(model=MODEL, messages=[user("a")])
        assert info.value is error


async def test_invalid_payload_is_refused_before_sending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validator runs on every payload: an orphan tool result is never sent."""
    fake = FakeProvider()

    def broken(messages: Any, *, system: str | None = None) -> list[dict[str, Any]]:
        return [
            {"role": "user", "content": "a"},
            {"role": "tool", "tool_call_id": "call_zz", "content": "orphan"},
        ]

    monkeypatch.setattr(openai_module, "to_openai_chat", broken)
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        with pytest.raises(InvalidRequestError, match="call_zz"):
            await client.chat.completions.create(model=MODEL, messages=[user("a")])
    assert fake.requests == []


def test_a11_real_sdk_errors_are_recognised() -> None:
    """R1.5: the overflow recogniser reads the openai SDK's real exception shapes."""

    def error(status: int, body: dict[str, Any]) -> openai.APIStatusError:
        response = httpx2.Response(
            status, json=body, request=httpx2.Request("POST", "http://x/v1/chat/completions")
        )
        client = openai.OpenAI(api_key="x")
        return client._make_status_error_from_response(response)  # pyright: ignore[reportPrivateUsage]

    assert is_context_overflow(error(400, overflow("chat").body))
    assert is_context_overflow(error(400, overflow("responses").body))
    assert is_context_overflow(error(413, {"error": {"message": "Request too large"}}))
    assert not is_context_overflow(
        error(429, {"error": {"message": "Request too large for gpt-4: tokens per min"}})
    )
    assert not is_context_overflow(error(400, {"error": {"message": "Invalid model"}}))


# --------------------------------------------------------------------------- responses

INSTRUCTIONS = "You are a careful coding agent."


async def test_r8_1_responses_bodies_before_and_after_rebuild(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Read a.py and b.py."}]
        fake.add(Reply(text=None, calls=CALLS, reasoning_id="rs_1", input_tokens=5_000))
        first = await client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=host)
        host += list(first.output)
        host += [
            {"type": "function_call_output", "call_id": "call_a", "output": "print(1)"},
            {"type": "function_call_output", "call_id": "call_b", "output": "print(2)"},
        ]
        fake.add(Reply(text="Both print.", input_tokens=OVER_THE_LINE))
        second = await client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=host)
        host += [*second.output, {"role": "user", "content": "Now c.py."}]
        await client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=host)
        boundary = await stored_boundary(mw, SID)

        def user_item(text: str) -> dict[str, Any]:
            return {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": text},
                    {"type": "input_text", "text": reminder},
                ],
            }

        bodies = fake.bodies(RESPONSES)
        assert bodies[0] == {
            "model": MODEL,
            "instructions": INSTRUCTIONS,
            "input": [user_item("Read a.py and b.py.")],
        }
        assert bodies[1] == {
            "model": MODEL,
            "instructions": INSTRUCTIONS,
            "input": [
                user_item("Read a.py and b.py."),
                {
                    "id": "rs_1",
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": "thinking it over"}],
                    "encrypted_content": "enc-rs_1",
                },
                {
                    "type": "function_call",
                    "call_id": "call_a",
                    "name": "read",
                    "arguments": '{"path":"a.py"}',
                    "id": "fc_call_a",
                },
                {
                    "type": "function_call",
                    "call_id": "call_b",
                    "name": "read",
                    "arguments": '{"path":"b.py"}',
                },
                {"type": "function_call_output", "call_id": "call_a", "output": "print(1)"},
                {"type": "function_call_output", "call_id": "call_b", "output": "print(2)"},
            ],
        }
        assert bodies[2] == {
            "model": MODEL,
            "instructions": INSTRUCTIONS,
            "input": [
                # One plain text: sent in the API's shorthand, as hosts send it.
                {"role": "user", "content": boundary_text(boundary)},
                user_item("Now c.py."),
            ],
        }
        stored = await mw.store.list_messages(SID, agent=None)
        assert len(stored) == 8  # user, calls, results, answer, user, answer, boundary


async def test_r8_1_responses_stream_bodies_and_events(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Explain."}]
        reply = Reply(text="It explains itself.", input_tokens=OVER_THE_LINE)
        fake.add(reply)
        stream = await client.responses.create(model=MODEL, input=host, stream=True)
        events = [e.model_dump(mode="json", exclude_unset=True) async for e in stream]
        assert events == fake.response_events(reply, 1)
        recorded = stream_recorded(stream)
        assert recorded is not None
        assert recorded.usage is not None
        assert recorded.usage.total == OVER_THE_LINE + 10
        host += [{"role": "assistant", "content": "It explains itself."}]
        host += [{"role": "user", "content": "Shorter."}]
        stream = await client.responses.create(model=MODEL, input=host, stream=True)
        async for _ in stream:
            pass
        boundary = await stored_boundary(mw, SID)
        before, after = fake.bodies(RESPONSES)
        assert before["stream"] is True
        assert after == {
            "model": MODEL,
            "stream": True,
            "input": [
                {"role": "user", "content": boundary_text(boundary)},  # the shorthand
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Shorter."},
                        {"type": "input_text", "text": reminder},
                    ],
                },
            ],
        }


async def test_r1_1b_responses_overflow_and_error_event_retry_once(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Go."}]
        fake.add(overflow("responses"), Reply(text="Recovered."))
        first = await client.responses.create(model=MODEL, input=host)
        assert first.output_text == "Recovered."
        assert len(fake.bodies(RESPONSES)) == 2
        assert await count_boundaries(mw, SID) == 1
        # An ``error`` event right after ``response.created``: the host sees only the
        # retried stream (its first event belongs to the second response).
        host += [*first.output, {"role": "user", "content": "Again."}]
        error_event = {
            "type": "error",
            "code": "context_length_exceeded",
            "message": "Your input exceeds the context window of this model.",
            "param": None,
        }
        fake.add(Reply(text="Fine.", input_tokens=50), StreamError(error_event), Reply(text="Ok."))
        second = await client.responses.create(model=MODEL, input=host)
        host += [*second.output, {"role": "user", "content": "Stream it."}]
        stream = await client.responses.create(model=MODEL, input=host, stream=True)
        events = [e async for e in stream]
        assert events[0].type == "response.created"
        assert events[0].response.id == "resp_5"  # request 4 failed, request 5 answered
        assert all(e.type != "error" for e in events)
        assert events[-1].type == "response.completed"
        assert len(fake.bodies(RESPONSES)) == 5
        assert await count_boundaries(mw, SID) == 2


@pytest.mark.parametrize(
    "native",
    [
        {"previous_response_id": "resp_0"},
        {"conversation": "conv_0"},
        {"truncation": "auto"},
        {"extra_body": {"context_management": [{"type": "compaction", "compact_threshold": 1000}]}},
    ],
)
async def test_native_context_management_is_refused_with_the_choice_named(
    tmp_path: Path, native: dict[str, Any]
) -> None:
    """One policy (issue 16): a call that asks OpenAI to manage the context is refused
    before anything is sent or stored; the message says how to choose. The unwrapped
    client makes the same call untouched."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_openai(openai_client(fake), mw, session_id=SID)
        with pytest.raises(ConfigError, match=r"client\.unwrapped") as info:
            await client.responses.create(model=MODEL, input="hi", **native)
        assert "leave the parameter out" in str(info.value)
        assert fake.bodies(RESPONSES) == []
        assert await mw.store.get_session(SID) is None
        assert isinstance(client, openai_module.OpenAIWrapper)
        await client.unwrapped.responses.create(model=MODEL, input="hi", **native)
        assert len(fake.bodies(RESPONSES)) == 1


# --------------------------------------------------------------------------- surface


async def test_surface_is_delegated(tmp_path: Path) -> None:
    async with running_middleware(tmp_path) as mw:
        raw = openai_client(FakeProvider())
        client = wrap_openai(raw, mw, session_id=SID)
        assert client.models is raw.models
        assert client.chat.completions.with_raw_response is not None
        assert client.api_key == "sk-test"
        other = client.with_options(timeout=5)
        assert isinstance(other, openai_module.OpenAIWrapper)
        assert other.unwrapped is not raw


def test_wrap_openai_refuses_sync_clients_and_empty_sessions() -> None:
    # No middleware on purpose: the client and the session id are refused before it is needed.
    with pytest.raises(ConfigError, match="async"):
        wrap_openai(openai.OpenAI(api_key="x"), None, session_id=SID)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ConfigError, match="session_id"):
        wrap_openai(openai.AsyncOpenAI(api_key="x"), None, session_id="")  # pyright: ignore[reportArgumentType]


async def test_wrap_openai_refuses_a_client_it_already_wraps(tmp_path: Path) -> None:
    # A wrapped create is a plain function returning the call's coroutine: without the
    # check the async test below it would call the wrapper a sync client.
    async with running_middleware(tmp_path) as mw:
        raw = openai.AsyncOpenAI(api_key="x")
        client = wrap_openai(raw, mw, session_id=SID)
        fix = r"already wraps \(OpenAIWrapper\).*client\.unwrapped"
        with pytest.raises(ConfigError, match=fix):
            wrap_openai(client, mw, session_id=SID)
        again = wrap_openai(raw, mw, session_id=SID)  # the SDK client: a second binding is fine
        assert isinstance(again, openai_module.OpenAIWrapper)


async def test_loopback_server_streams_over_real_sockets(tmp_path: Path) -> None:
    """The same wrapper over the SDK's default transport and a real HTTP server."""
    fake = FakeProvider()
    fake.add(Reply(text="over the wire"))
    with LoopbackServer(fake) as server:
        async with running_middleware(tmp_path) as mw:
            raw = openai.AsyncOpenAI(api_key="x", base_url=f"{server.base_url}/v1", max_retries=0)
            client = wrap_openai(raw, mw, session_id=SID)
            stream = await client.chat.completions.create(
                model=MODEL, messages=[user("hi")], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            await raw.close()
    assert text == "over the wire"
    assert stream_recorded(stream) is not None
