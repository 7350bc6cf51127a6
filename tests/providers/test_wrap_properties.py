"""Property: every payload the wrappers send passes the validator (issue 5.3, 5.4).

Hypothesis drives a host loop through ``wrap_openai`` (Chat Completions and
Responses) and ``wrap_anthropic`` with the real SDKs: random user text, parallel
tool calls, results the host forgets to send, usage crossing the trigger line
(rebuilds mid-loop, SPEC R1.1, R7.4), overflow errors (R1.1b) and streaming. The
fake server runs :func:`~mimo_ctx.providers.validate.validate_request` on every
body it receives; none may fail.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_servers import (
    OVER_THE_LINE,
    FakeProvider,
    Reply,
    anthropic_client,
    openai_client,
    overflow,
    running_middleware,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_ctx.providers import wrap_anthropic, wrap_openai

SID = "ses_property"
_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30
).filter(lambda s: s.strip() != "")


@dataclass(frozen=True)
class Turn:
    """One model turn of the generated host loop."""

    text: str | None
    calls: int
    forgotten: frozenset[int]
    over_the_line: bool
    overflow_first: bool
    stream: bool
    user_text: str | None


@st.composite
def turns(draw: st.DrawFn) -> list[Turn]:
    out: list[Turn] = []
    for index in range(draw(st.integers(1, 6))):
        calls = draw(st.integers(0, 3))
        forgotten = draw(st.frozensets(st.integers(0, max(calls - 1, 0)), max_size=1))
        text = draw(st.none() | _TEXT)
        if calls == 0 and text is None:
            text = "done"
        out.append(
            Turn(
                text=text,
                calls=calls,
                forgotten=forgotten if calls else frozenset(),
                over_the_line=draw(st.integers(0, 4)) == 0,
                overflow_first=index > 0 and draw(st.integers(0, 5)) == 0,
                stream=draw(st.booleans()),
                user_text=draw(_TEXT) if calls == 0 or draw(st.booleans()) else None,
            )
        )
    return out


def _reply(turn: Turn, number: int) -> Reply:
    calls = [
        (f"call_{number}_{i}", "read", {"path": f"src/f{number}_{i}.py"}) for i in range(turn.calls)
    ]
    tokens = OVER_THE_LINE if turn.over_the_line else 1_000 + number
    return Reply(text=turn.text, calls=calls, input_tokens=tokens)


async def _chat(client: Any, script: list[Turn], first: str, fake: FakeProvider) -> None:
    host: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": first}]
    for number, turn in enumerate(script):
        reply = _reply(turn, number)
        if turn.overflow_first:
            fake.add(overflow("chat"))
        fake.add(reply)
        if turn.stream:
            stream = await client.chat.completions.create(
                model="m", messages=host, stream=True, stream_options={"include_usage": True}
            )
            async for _ in stream:
                pass
            host.append(
                {
                    "role": "assistant",
                    "content": reply.text,
                    "tool_calls": [
                        {"id": c, "type": "function", "function": {"name": n, "arguments": "{}"}}
                        for c, n, _ in reply.calls
                    ]
                    or None,
                }
            )
        else:
            answer = await client.chat.completions.create(model="m", messages=host)
            host.append(answer.choices[0].message)
        for i, (call_id, _, _) in enumerate(reply.calls):
            if i not in turn.forgotten:
                host.append({"role": "tool", "tool_call_id": call_id, "content": f"out {i}"})
        if turn.user_text is not None:
            host.append({"role": "user", "content": turn.user_text})


async def _responses(client: Any, script: list[Turn], first: str, fake: FakeProvider) -> None:
    host: list[Any] = [{"role": "user", "content": first}]
    for number, turn in enumerate(script):
        reply = _reply(turn, number)
        if turn.overflow_first:
            fake.add(overflow("responses"))
        fake.add(reply)
        if turn.stream:
            stream = await client.responses.create(model="m", input=host, stream=True)
            events = [e async for e in stream]
            host += list(events[-1].response.output)
        else:
            answer = await client.responses.create(model="m", input=host)
            host += list(answer.output)
        for i, (call_id, _, _) in enumerate(reply.calls):
            if i not in turn.forgotten:
                host.append(
                    {"type": "function_call_output", "call_id": call_id, "output": f"out {i}"}
                )
        if turn.user_text is not None:
            host.append({"role": "user", "content": turn.user_text})


async def _anthropic(client: Any, script: list[Turn], first: str, fake: FakeProvider) -> None:
    host: list[Any] = [{"role": "user", "content": first}]
    for number, turn in enumerate(script):
        reply = _reply(turn, number)
        if turn.overflow_first:
            fake.add(overflow("anthropic"))
        fake.add(reply)
        if turn.stream:
            async with client.messages.stream(model="m", max_tokens=64, messages=host) as stream:
                final = await stream.get_final_message()
            host.append({"role": "assistant", "content": final.content})
        else:
            answer = await client.messages.create(model="m", max_tokens=64, messages=host)
            host.append({"role": "assistant", "content": answer.content})
        blocks: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": call_id, "content": f"out {i}"}
            for i, (call_id, _, _) in enumerate(reply.calls)
            if i not in turn.forgotten
        ]
        if turn.user_text is not None:
            blocks.append({"type": "text", "text": turn.user_text})
        if not blocks:
            blocks.append({"type": "text", "text": "go on"})
        host.append({"role": "user", "content": blocks})


_LOOPS = {"openai-chat": _chat, "openai-responses": _responses, "anthropic": _anthropic}


async def _run(api: str, script: list[Turn], first: str) -> FakeProvider:
    fake = FakeProvider(check=True)
    with tempfile.TemporaryDirectory() as directory:
        async with running_middleware(Path(directory)) as mw:
            if api == "anthropic":
                client = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
            else:
                client = wrap_openai(openai_client(fake), mw, session_id=SID)
            await _LOOPS[api](client, script, first, fake)
    return fake


@pytest.mark.parametrize("api", sorted(_LOOPS))
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=turns(), first=_TEXT)
def test_every_sent_payload_passes_the_validator(api: str, script: list[Turn], first: str) -> None:
    fake = anyio.run(_run, api, script, first)
    assert fake.invalid == []
    expected = len(script) + sum(t.overflow_first for t in script)
    assert len(fake.requests) == expected  # one retry per overflow, never more
