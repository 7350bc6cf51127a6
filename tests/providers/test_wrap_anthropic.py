"""wrap_anthropic with the real ``anthropic`` SDK against a fake server (issue 5.2, 5.3).

Exact request bodies before and after a rebuild for ``messages.create``,
``messages.create(stream=True)`` and ``messages.stream`` (SPEC R1.1, R8.1); one
retry on an overflow ("prompt is too long", 413, an error event, the
``model_context_window_exceeded`` stop reason) and no loop (R1.4, R1.5, A11).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import TextBlockParam, ToolParam
from fake_servers import (
    MESSAGES,
    OVER_THE_LINE,
    ErrorReply,
    FakeProvider,
    Reply,
    StreamError,
    anthropic_client,
    boundary_text,
    count_boundaries,
    overflow,
    running_middleware,
    seed_memory,
    stored_boundary,
    stream_recorded,
)

from mimo_ctx.errors import ConfigError, ContextOverflowError
from mimo_ctx.messages import TextPart, ToolPart, ToolResultPart
from mimo_ctx.overflow import is_context_overflow
from mimo_ctx.providers import wrap_anthropic
from mimo_ctx.providers.anthropic import mark_conversation_cache
from mimo_ctx.providers.anthropic_client import AnthropicWrapper
from mimo_ctx.reminders import per_turn_reminder

SID = "ses_wrap_anthropic"
MODEL = "claude-test"
SYSTEM: list[TextBlockParam] = [
    {
        "type": "text",
        "text": "You are a careful coding agent.",
        "cache_control": {"type": "ephemeral"},
    }
]
TOOLS: list[ToolParam] = [
    {
        "name": "read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
CALLS = [("toolu_a", "read", {"path": "a.py"}), ("toolu_b", "read", {"path": "b.py"})]
RESULTS = {
    "role": "user",
    "content": [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "print(1)"},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "print(2)"},
    ],
}


def user(text: str, reminder: str) -> dict[str, Any]:
    """A user turn as sent: its text, then the per-turn reminder (R8.3)."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "text", "text": reminder}],
    }


def request(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The body the wrapper sends: the conversation breakpoint on the last turn's last block."""
    return {
        "max_tokens": 1024,
        "messages": mark_conversation_cache(messages),
        "model": MODEL,
        "system": SYSTEM,
        "tools": TOOLS,
        **extra,
    }


async def test_r8_1_messages_create_bodies_before_and_after_rebuild(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Read a.py and b.py."}]
        fake.add(Reply(text="Reading both.", calls=CALLS, input_tokens=5_000))
        first = await client.messages.create(
            model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=host
        )
        assert first.stop_reason == "tool_use"
        host += [{"role": "assistant", "content": first.content}, RESULTS]
        fake.add(Reply(text="Both print a number.", input_tokens=OVER_THE_LINE))
        second = await client.messages.create(
            model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=host
        )
        host += [
            {"role": "assistant", "content": second.content},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Now c.py.", "cache_control": {"type": "ephemeral"}}
                ],
            },
        ]
        await client.messages.create(
            model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=host
        )
        boundary = await stored_boundary(mw, SID)

        bodies = fake.bodies(MESSAGES)
        assert bodies[0] == request([user("Read a.py and b.py.", reminder)])
        assert bodies[1] == request(
            [
                user("Read a.py and b.py.", reminder),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Reading both."},
                        {
                            "type": "tool_use",
                            "id": "toolu_a",
                            "name": "read",
                            "input": {"path": "a.py"},
                        },
                        {
                            "type": "tool_use",
                            "id": "toolu_b",
                            "name": "read",
                            "input": {"path": "b.py"},
                        },
                    ],
                },
                RESULTS,
            ]
        )
        # After the rebuild: the boundary and the live user turn, merged into one
        # user turn (alternation); system and tools byte-identical.
        assert bodies[2] == request(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": boundary_text(boundary)},
                        {"type": "text", "text": "Now c.py."},
                        {"type": "text", "text": reminder},
                    ],
                }
            ]
        )
        stored = await mw.store.list_messages(SID, agent=None)
        # user, assistant (calls), results, answer, user, answer, boundary.
        assert len(stored) == 7
        results = [p for m in stored for p in m.parts if isinstance(p, ToolResultPart)]
        assert [(r.call_id, r.tool) for r in results] == [("toolu_a", "read"), ("toolu_b", "read")]
        recorded = [m for m in stored if m.role == "assistant"]
        assert [m.finish for m in recorded] == ["tool-calls", "stop", "stop"]
        assert recorded[1].usage is not None
        assert recorded[1].usage.context_tokens == OVER_THE_LINE + 10


async def test_r8_1_messages_stream_bodies_text_stream_and_final_message(tmp_path: Path) -> None:
    """``messages.stream``: the SDK helper works unchanged (text_stream,
    get_final_message) and the request is the rewritten one."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Summarise the repo."}]
        fake.add(Reply(text="It is a library.", input_tokens=OVER_THE_LINE))
        async with client.messages.stream(
            model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=host
        ) as stream:
            pieces = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        assert "".join(pieces) == "It is a library."
        assert final.content[0].type == "text"
        assert final.usage.input_tokens == OVER_THE_LINE
        host += [{"role": "assistant", "content": final.content}]
        host += [{"role": "user", "content": "More."}]
        async with client.messages.stream(
            model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=host
        ) as stream:
            assert await stream.get_final_text() == "ok"
        boundary = await stored_boundary(mw, SID)
        before, after = fake.bodies(MESSAGES)
        assert before == request([user("Summarise the repo.", reminder)], stream=True)
        assert after == request(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": boundary_text(boundary)},
                        {"type": "text", "text": "More."},
                        {"type": "text", "text": reminder},
                    ],
                }
            ],
            stream=True,
        )
        recorded = [m for m in await mw.store.list_messages(SID) if m.role == "assistant"]
        assert [m.usage and m.usage.input for m in recorded] == [OVER_THE_LINE, 100]


async def test_create_stream_passes_events_through_and_records(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        reply = Reply(text="Reading.", calls=CALLS, input_tokens=4_000, cached_tokens=1_000)
        fake.add(reply)
        stream = await client.messages.create(
            model=MODEL,
            max_tokens=1024,
            messages=[{"role": "user", "content": "Read them."}],
            stream=True,
        )
        events = [e.model_dump(mode="json", exclude_unset=True) async for e in stream]
        assert events == fake.anthropic_events(reply, 1)  # ``ping`` is dropped by the SDK
        recorded = stream_recorded(stream)
        assert recorded is not None
        assert recorded.finish == "tool-calls"
        assert recorded.usage is not None
        assert (recorded.usage.input, recorded.usage.cache_read, recorded.usage.output) == (
            3_000,
            1_000,
            10,
        )
        calls = [p for p in recorded.parts if isinstance(p, ToolPart)]
        assert [(c.call_id, c.state.input) for c in calls] == [
            ("toolu_a", {"path": "a.py"}),
            ("toolu_b", {"path": "b.py"}),
        ]
        assert [p.text for p in recorded.parts if isinstance(p, TextPart)] == ["Reading."]


async def test_r8_1_create_stream_bodies_before_and_after_rebuild(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        reminder = seed_memory(mw, SID)
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Go."}]
        fake.add(Reply(text="Went.", input_tokens=OVER_THE_LINE))
        kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 1024, "system": SYSTEM}
        stream = await client.messages.create(**kwargs, tools=TOOLS, messages=host, stream=True)
        async for _ in stream:
            pass
        host += [{"role": "assistant", "content": "Went."}, {"role": "user", "content": "Next."}]
        stream = await client.messages.create(**kwargs, tools=TOOLS, messages=host, stream=True)
        async for _ in stream:
            pass
        boundary = await stored_boundary(mw, SID)
        before, after = fake.bodies(MESSAGES)
        assert before == request([user("Go.", reminder)], stream=True)
        assert after == request(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": boundary_text(boundary)},
                        {"type": "text", "text": "Next."},
                        {"type": "text", "text": reminder},
                    ],
                }
            ],
            stream=True,
        )


async def test_streamed_thinking_is_recorded_and_sent_back_with_its_signature(
    tmp_path: Path,
) -> None:
    """Thinking blocks keep their signature through the stream accumulator, so the
    next request sends them back as the API requires with tool use."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        fake.add(Reply(text=None, calls=CALLS[:1], thinking=("Need the file.", "sig-123")))
        host: list[Any] = [{"role": "user", "content": "Read a.py."}]
        async with client.messages.stream(model=MODEL, max_tokens=64, messages=host) as stream:
            final = await stream.get_final_message()
        host += [
            {"role": "assistant", "content": final.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "1"}],
            },
        ]
        await client.messages.create(model=MODEL, max_tokens=64, messages=host)
        assert fake.bodies(MESSAGES)[1]["messages"][1] == {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Need the file.", "signature": "sig-123"},
                {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "a.py"}},
            ],
        }
        stored = await mw.store.list_messages(SID)
        assert len(stored) == 4  # user, answer, result, answer: the resent turn was known


# --------------------------------------------------------------------------- overflow


@pytest.mark.parametrize(
    "error",
    [
        overflow("anthropic"),
        ErrorReply(
            413,
            {
                "type": "error",
                "error": {
                    "type": "request_too_large",
                    "message": "Request exceeds the maximum size",
                },
            },
        ),
    ],
    ids=["prompt-is-too-long", "http-413"],
)
async def test_r1_1b_overflow_rebuilds_once_and_retries(tmp_path: Path, error: ErrorReply) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Go."}]
        first = await client.messages.create(model=MODEL, max_tokens=64, messages=host)
        host += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": "More."},
        ]
        fake.add(error, Reply(text="Recovered."))
        reply = await client.messages.create(model=MODEL, max_tokens=64, messages=host)
        assert reply.content[0].type == "text"
        assert reply.content[0].text == "Recovered."
        assert len(fake.bodies(MESSAGES)) == 3
        boundary = await stored_boundary(mw, SID)
        # The rebuild wrote checkpoint.md: from the retry on the per-turn reminder
        # is sent (SPEC R8.3), however soon after the first request it comes.
        reminder = per_turn_reminder(str(mw.layout.session_dir(SID)))
        assert fake.bodies(MESSAGES)[2]["messages"] == [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": boundary_text(boundary)},
                    {"type": "text", "text": "More."},
                    {"type": "text", "text": reminder, "cache_control": {"type": "ephemeral"}},
                ],
            }
        ]
        assert await count_boundaries(mw, SID) == 1


async def test_r1_4_second_overflow_raises_chained_without_loop(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Go."}]
        first = await client.messages.create(model=MODEL, max_tokens=64, messages=host)
        host += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": "More."},
        ]
        fake.add(overflow("anthropic"), overflow("anthropic"))
        with pytest.raises(ContextOverflowError) as info:
            async with client.messages.stream(model=MODEL, max_tokens=64, messages=host) as s:
                await s.get_final_message()
        assert isinstance(info.value.__cause__, anthropic.BadRequestError)
        assert "prompt is too long" in str(info.value.__cause__)
        assert len(fake.bodies(MESSAGES)) == 3  # first turn, the overflow, one retry
        assert await count_boundaries(mw, SID) == 1


async def test_error_event_at_stream_start_is_retried_transparently(tmp_path: Path) -> None:
    """An ``error`` event right after ``message_start``: the host reads only the retry."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        fake.add(StreamError(overflow("anthropic").body), Reply(text="fresh"))
        async with client.messages.stream(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            events = [e async for e in stream]
            final = await stream.get_final_message()
        assert events[0].type == "message_start"
        assert final.id == f"msg_{2:024d}"
        assert await stream.get_final_text() == "fresh"
        assert len(fake.bodies(MESSAGES)) == 2
        assert await count_boundaries(mw, SID) == 1


async def test_error_event_after_content_reaches_host_and_rebuilds(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        fake.add(StreamError(overflow("anthropic").body, after="partial"))
        stream = await client.messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        seen: list[Any] = []

        async def consume() -> None:
            async for event in stream:
                seen.append(event)

        with pytest.raises(anthropic.APIStatusError, match="prompt is too long"):
            await consume()
        assert [e.type for e in seen] == [
            "message_start",
            "content_block_start",
            "content_block_delta",
        ]
        assert stream_recorded(stream) is None
        assert await count_boundaries(mw, SID) == 1


async def test_model_context_window_exceeded_stop_reason_is_retried(tmp_path: Path) -> None:
    """A non-streamed answer stopped by ``model_context_window_exceeded`` is retried on
    the rebuilt context; the host only sees the retry's answer."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        fake.add(Reply(text="trunc", finish="model_context_window_exceeded"), Reply(text="whole"))
        reply = await client.messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.stop_reason == "end_turn"
        assert len(fake.bodies(MESSAGES)) == 2
        assert await count_boundaries(mw, SID) == 1
        answers = [m for m in await mw.store.list_messages(SID) if m.role == "assistant"]
        assert len(answers) == 1  # the truncated answer was not recorded


async def test_model_context_window_exceeded_in_stream_is_recorded_and_rebuilds(
    tmp_path: Path,
) -> None:
    """After content was streamed the stop cannot be taken back: recorded as
    ``length``, and the rebuild runs so the next turn fits."""
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        fake.add(Reply(text="truncated", finish="model_context_window_exceeded"))
        async with client.messages.stream(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason == "model_context_window_exceeded"
        answers = [m for m in await mw.store.list_messages(SID) if m.role == "assistant"]
        assert [m.finish for m in answers] == ["length"]
        assert await count_boundaries(mw, SID) == 1


async def test_other_errors_propagate_unchanged(tmp_path: Path) -> None:
    fake = FakeProvider()
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        fake.add(
            ErrorReply(
                429,
                {
                    "type": "error",
                    "error": {"type": "rate_limit_error", "message": "Too many tokens"},
                },
            )
        )
        with pytest.raises(anthropic.RateLimitError):
            await client.messages.create(
                model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
            )
        assert len(fake.bodies(MESSAGES)) == 1
        assert await count_boundaries(mw, SID) == 0


def test_a11_real_sdk_errors_are_recognised() -> None:
    client = anthropic.Anthropic(api_key="x")

    def error(status: int, body: dict[str, Any]) -> Exception:
        response = httpx2.Response(
            status, json=body, request=httpx2.Request("POST", "http://x/v1/messages")
        )
        return client._make_status_error_from_response(response)  # pyright: ignore[reportPrivateUsage]

    assert is_context_overflow(error(400, overflow("anthropic").body))
    assert is_context_overflow(
        error(413, {"type": "error", "error": {"type": "request_too_large"}})
    )
    assert not is_context_overflow(
        error(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
    )
    assert not is_context_overflow(
        error(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})
    )


# --------------------------------------------------------------------------- surface


async def test_surface_is_delegated(tmp_path: Path) -> None:
    async with running_middleware(tmp_path) as mw:
        raw = anthropic_client(FakeProvider())
        client = wrap_anthropic(raw, mw, session_id=SID)
        assert client.models is raw.models
        assert client.messages.batches is raw.messages.batches
        assert isinstance(client.with_options(timeout=5), AnthropicWrapper)


def test_wrap_anthropic_refuses_sync_clients() -> None:
    with pytest.raises(ConfigError, match="async"):
        # No middleware on purpose: the client is refused before it is needed.
        wrap_anthropic(anthropic.Anthropic(api_key="x"), None, session_id=SID)  # pyright: ignore[reportArgumentType]


async def test_wrap_anthropic_refuses_a_client_it_already_wraps(tmp_path: Path) -> None:
    async with running_middleware(tmp_path) as mw:
        client = wrap_anthropic(anthropic_client(FakeProvider()), mw, session_id=SID)
        with pytest.raises(ConfigError, match=r"already wraps \(AnthropicWrapper\)"):
            wrap_anthropic(client, mw, session_id=SID)


def test_sdk_message_stream_still_exposes_its_raw_stream() -> None:
    """messages.stream relies on AsyncMessageStream keeping ``_raw_stream`` (pinned here)."""
    from anthropic.lib.streaming import AsyncMessageStream

    marker = object()  # not a stream on purpose: only its identity is checked
    stream = AsyncMessageStream(marker, output_format=anthropic.not_given)  # pyright: ignore[reportArgumentType]
    assert stream._raw_stream is marker  # pyright: ignore[reportPrivateUsage]
