"""The paths real hosts take, with the real openai and anthropic SDKs over loopback HTTP (issue 16).

* Two conversations on one wrapped client never see each other's words: the
  second is refused (naming the session), or with ``conversations=
  "per-first-message"`` gets a session of its own.
* Regenerate and edit-and-resend send exactly what the host sent (plus the
  managed view, which here adds nothing): no discarded answer, no invented result.
* Two workers on one store (SQLite and PostgreSQL, each worker a separate OS
  process with its own middleware) serving alternate turns of one conversation
  for 50 turns store every message once and raise nothing.
* A stream cut before its end (the connection dropped, or no finish reason, or
  the host closing it) is stored as incomplete, and the next request sends it the
  way an interrupted call is sent (SPEC A10), or not at all when the host left it out.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from fake_servers import (
    CHAT,
    MESSAGES,
    RESPONSES,
    CutStream,
    FakeProvider,
    LoopbackServer,
    Reply,
    running_middleware,
)

from mimo_ctx.errors import ConversationMismatchError
from mimo_ctx.messages import Message, TextPart, ToolPart, ToolStatePending
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers import wrap_anthropic, wrap_openai
from mimo_ctx.providers._sync import INCOMPLETE_STREAM
from mimo_ctx.providers.anthropic import mark_conversation_cache
from mimo_ctx.store import SQLiteStore, Store
from mimo_ctx.view import INTERRUPTED_TOOL_ERROR
from tests.pg_support import SchemaNames, require_pg_dsn
from tests.worker_process import WorkerProcess

SID = "ses_conversations"
MODEL = "gpt-test"
SYSTEM = {"role": "system", "content": "You are a careful agent."}
ALICE = "Alice: my account password hint is BLUE-42"
BOB = "Bob: what is the weather like?"
HERE = Path(__file__).resolve().parent


@pytest.fixture
def server() -> Iterator[tuple[FakeProvider, LoopbackServer]]:
    fake = FakeProvider(check=True)
    with LoopbackServer(fake) as loopback:
        yield fake, loopback


@asynccontextmanager
async def _clients(
    tmp_path: Path, loopback: LoopbackServer, store: Store | None = None, **options: Any
) -> AsyncGenerator[tuple[ContextMiddleware, Any, Any]]:
    raw_openai = openai.AsyncOpenAI(api_key="sk", base_url=f"{loopback.base_url}/v1", max_retries=0)
    raw_anthropic = anthropic.AsyncAnthropic(
        api_key="sk-ant", base_url=loopback.base_url, max_retries=0
    )
    try:
        async with running_middleware(tmp_path, store) as mw:
            yield (
                mw,
                wrap_openai(raw_openai, mw, session_id=SID, **options),
                wrap_anthropic(raw_anthropic, mw, session_id=SID, **options),
            )
    finally:
        await raw_openai.close()
        await raw_anthropic.close()


def _u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _a(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


# --------------------------------------------------------------------------- privacy


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
async def test_a_second_conversation_is_refused_and_never_sees_the_first(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer], api: str
) -> None:
    fake, loopback = server
    async with _clients(tmp_path, loopback) as (mw, oai, ant):

        async def send(messages: list[dict[str, Any]]) -> None:
            if api == "chat":
                await oai.chat.completions.create(model=MODEL, messages=[SYSTEM, *messages])
            elif api == "responses":
                await oai.responses.create(model=MODEL, input=messages, instructions="Careful.")
            else:
                await ant.messages.create(model=MODEL, max_tokens=64, messages=messages)

        await send([_u(ALICE)])
        with pytest.raises(ConversationMismatchError, match=SID):
            await send([_u(BOB)])
        assert len(fake.requests) == 1  # Bob's request was never sent
        stored = json.dumps([m.model_dump(mode="json") for m in await mw.store.list_messages(SID)])
        assert "Bob" not in stored
    assert fake.invalid == []


@pytest.mark.parametrize("api", ["chat", "anthropic"])
async def test_per_first_message_gives_each_conversation_its_own_session(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer], api: str
) -> None:
    fake, loopback = server
    async with _clients(tmp_path, loopback, conversations="per-first-message") as (mw, oai, ant):

        async def send(messages: list[dict[str, Any]]) -> str:
            if api == "chat":
                reply = await oai.chat.completions.create(model=MODEL, messages=[SYSTEM, *messages])
                return reply.choices[0].message.content or ""
            reply = await ant.messages.create(model=MODEL, max_tokens=64, messages=messages)
            return "".join(b.text for b in reply.content if b.type == "text")

        alice = [_u(ALICE)]
        alice.append(_a(await send(alice)))
        bob = [_u(BOB)]
        bob.append(_a(await send(bob)))
        alice.append(_u("Alice: and the second hint?"))
        await send(alice)
        bob.append(_u("Bob: thanks"))
        await send(bob)
        bodies = [json.dumps(r.body) for r in fake.requests]
        # Bob's requests carry only Bob's words, Alice's only Alice's.
        assert ["BLUE-42" in b for b in bodies] == [True, False, True, False]
        assert ["Bob:" in b for b in bodies] == [False, True, False, True]
        sessions = {s.id for s in await mw.store.list_sessions()}
        assert len(sessions) == 2
        assert SID in sessions
    assert fake.invalid == []


# --------------------------------------------------------------------------- branches


async def test_chat_regenerate_and_edit_send_exactly_the_host_list(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    async with _clients(tmp_path, loopback) as (mw, oai, _):
        host = [SYSTEM, _u("List the files.")]
        fake.add(Reply(text=None, calls=[("call_1", "ls", {"path": "."})]))
        await oai.chat.completions.create(model=MODEL, messages=host)
        # Regenerate: the host drops the answer (a tool call) and asks again.
        fake.add(Reply(text="There are three files."))
        await oai.chat.completions.create(model=MODEL, messages=host)
        assert fake.bodies(CHAT)[-1]["messages"] == host  # no call, no invented result
        host += [_a("There are three files."), _u("Which is largest?")]
        fake.add(Reply(text="b.py"))
        await oai.chat.completions.create(model=MODEL, messages=host)
        assert fake.bodies(CHAT)[-1]["messages"] == host
        # Edit-and-resend: the host edits its last question and resends from there.
        host = [*host[:3], _u("Which is smallest?")]
        await oai.chat.completions.create(model=MODEL, messages=host)
        assert fake.bodies(CHAT)[-1]["messages"] == host
        listed = await mw.store.list_messages(SID)
        assert [m.role for m in listed] == ["user", "assistant", "user", "assistant"]
        assert await mw.store.count_messages(SID) == 7  # nothing deleted: 3 off the branch
    assert fake.invalid == []


async def test_anthropic_regenerate_and_edit_send_exactly_the_host_list(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    async with _clients(tmp_path, loopback) as (_, _, ant):
        host = [_u("List the files.")]
        fake.add(Reply(text=None, calls=[("toolu_1", "ls", {"path": "."})]))
        await ant.messages.create(model=MODEL, max_tokens=64, messages=host)
        fake.add(Reply(text="Three files."))
        async with ant.messages.stream(model=MODEL, max_tokens=64, messages=host) as stream:
            await stream.get_final_message()
        # Exactly the host's list, plus the one prompt-cache breakpoint the wrapper
        # puts on the last turn's last block (docs/providers.md).
        assert fake.bodies(MESSAGES)[-1]["messages"] == mark_conversation_cache(host)
        host += [_a("Three files."), _u("Which is largest?")]
        await ant.messages.create(model=MODEL, max_tokens=64, messages=host)
        host = [*host[:2], _u("Which is smallest?")]
        await ant.messages.create(model=MODEL, max_tokens=64, messages=host)
        assert fake.bodies(MESSAGES)[-1]["messages"] == mark_conversation_cache(host)
    assert fake.invalid == []


# --------------------------------------------------------------------------- workers


class _Worker(WorkerProcess):
    """A wrapped client in its own OS process (tests/providers/_conversation_worker.py)."""

    def __init__(self, store: str, base_url: str, memory: Path) -> None:
        super().__init__(HERE / "_conversation_worker.py", store, base_url, SID, str(memory))

    def turn(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        message: dict[str, Any] = self.ask({"messages": messages})["message"]
        return message


def _alternate_turns(
    fake: FakeProvider, workers: list[_Worker], turns: int
) -> list[dict[str, Any]]:
    host: list[dict[str, Any]] = [SYSTEM, _u("Work through the files.")]
    for turn in range(turns):
        if turn % 3 == 0:
            fake.add(Reply(text=None, calls=[(f"call_{turn}", "read", {"n": turn})]))
        else:
            fake.add(Reply(text=f"Answer {turn}."))
        answer = workers[turn % 2].turn(host)
        host.append(answer)
        if answer.get("tool_calls"):
            host.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": f"file {turn}"})
        else:
            host.append(_u(f"Next {turn}."))
    return host


async def _check_stored_once(store: Store, host: list[dict[str, Any]]) -> None:
    listed = await store.list_messages(SID)
    # Every host message once: the answers, tool results joined or not, users.
    assert await store.count_messages(SID) == len(listed)
    # The system prompt is the frozen prefix; the host's last message was never sent.
    assert len(listed) == len(host) - 2
    texts = [
        "".join(p.text for p in m.parts if isinstance(p, TextPart))
        for m in listed
        if m.role == "user"
    ]
    assert len(texts) == len(set(texts))
    calls = [p.call_id for m in listed for p in m.parts if isinstance(p, ToolPart)]
    assert len(calls) == len(set(calls))


def test_two_worker_processes_on_one_sqlite_file_serve_alternate_turns(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    path = tmp_path / "shared.db"
    workers = [_Worker(f"sqlite:{path}", loopback.base_url, tmp_path / "mem") for _ in range(2)]
    try:
        host = _alternate_turns(fake, workers, 50)
    finally:
        for worker in workers:
            worker.close()
    assert fake.invalid == []
    assert len(fake.bodies(CHAT)) == 50

    async def check() -> None:
        async with SQLiteStore(path) as store:
            await _check_stored_once(store, host)

    import anyio

    anyio.run(check)


def test_two_worker_processes_on_one_postgres_schema_serve_alternate_turns(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    names = SchemaNames(require_pg_dsn())
    schema = names.new()
    try:
        workers = [_Worker(f"pg:{schema}", loopback.base_url, tmp_path / "mem") for _ in range(2)]
        try:
            host = _alternate_turns(fake, workers, 50)
        finally:
            for worker in workers:
                worker.close()
        assert fake.invalid == []

        async def check() -> None:
            from mimo_ctx.store.postgres import PostgresStore

            async with await PostgresStore.open(names.dsn, schema=schema) as store:
                await _check_stored_once(store, host)

        import anyio

        anyio.run(check)
    finally:
        names.drop_all()


async def test_two_middlewares_alternate_anthropic_turns_on_one_sqlite_file(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    stores = [await SQLiteStore.open(tmp_path / "shared.db") for _ in range(2)]
    try:
        async with (
            _clients(tmp_path / "a", loopback, stores[0]) as (_, _, first),
            _clients(tmp_path / "b", loopback, stores[1]) as (_, _, second),
        ):
            host: list[dict[str, Any]] = [_u("Work through the files.")]
            for turn in range(50):
                client = first if turn % 2 == 0 else second
                calls = turn % 3 == 0
                fake.add(
                    Reply(text=None, calls=[(f"toolu_{turn}", "read", {"n": turn})])
                    if calls
                    else Reply(text=f"Answer {turn}.")
                )
                reply = await client.messages.create(model=MODEL, max_tokens=64, messages=host)
                host.append(
                    {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
                )
                if calls:
                    result = {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{turn}",
                        "content": "ok",
                    }
                    host.append(
                        {
                            "role": "user",
                            "content": [result, {"type": "text", "text": f"Go {turn}"}],
                        }
                    )
                else:
                    host.append(_u(f"Next {turn}."))
            listed = await stores[0].list_messages(SID)
            assert await stores[0].count_messages(SID) == len(listed)
            calls_stored = [p.call_id for m in listed for p in m.parts if isinstance(p, ToolPart)]
            assert len(calls_stored) == len(set(calls_stored)) == 17
    finally:
        for store in stores:
            await store.aclose()
    assert fake.invalid == []


# --------------------------------------------------------------------------- streams


def _only(messages: list[Message], role: str) -> Message:
    found = [m for m in messages if m.role == role]
    assert len(found) == 1
    return found[0]


async def test_a_cut_chat_stream_is_stored_incomplete_and_sent_as_interrupted(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    reply = Reply(text="Reading it.", calls=[("call_x", "bash", {"cmd": "cat file.txt"})])
    # Role, two text pieces, the call's start and half its arguments: then the cut.
    fake.add(CutStream(reply, keep=5, drop=True))
    async with _clients(tmp_path, loopback) as (mw, oai, _):
        host = [SYSTEM, _u("Show file.txt.")]
        stream = await oai.chat.completions.create(model=MODEL, messages=host, stream=True)
        with pytest.raises(openai.APIError):
            _ = [chunk async for chunk in stream]
        answer = _only(await mw.store.list_messages(SID), "assistant")
        assert answer.finish is None
        assert answer.error is not None
        assert (answer.error.name, answer.error.aborted) == (INCOMPLETE_STREAM, True)
        call = next(p for p in answer.parts if isinstance(p, ToolPart))
        assert isinstance(call.state, ToolStatePending)  # not a finished call
        assert call.state.input == {"__raw_arguments__": '{"cmd":"cat'}
        # The host keeps what it received and goes on: the call is sent as interrupted.
        kept = {
            "role": "assistant",
            "content": "Reading it.",
            "tool_calls": [
                {
                    "id": "call_x",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd":"cat'},
                }
            ],
        }
        await oai.chat.completions.create(model=MODEL, messages=[*host, kept, _u("Go on.")])
        sent = fake.bodies(CHAT)[-1]["messages"]
        assert sent[2] == kept
        assert sent[3] == {
            "role": "tool",
            "tool_call_id": "call_x",
            "content": INTERRUPTED_TOOL_ERROR,
        }
        # Had the host dropped it, it would not be sent at all.
        await oai.chat.completions.create(model=MODEL, messages=[*host, _u("Go on.")])
        assert fake.bodies(CHAT)[-1]["messages"] == [*host, _u("Go on.")]
    assert fake.invalid == []


async def test_a_chat_stream_the_host_closes_is_stored_incomplete(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    fake.add(Reply(text="A long answer that the host stops reading."))
    async with _clients(tmp_path, loopback) as (mw, oai, _):
        stream = await oai.chat.completions.create(
            model=MODEL, messages=[SYSTEM, _u("Talk.")], stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
        answer = _only(await mw.store.list_messages(SID), "assistant")
        assert answer.finish is None
        assert answer.error is not None
        assert answer.error.name == INCOMPLETE_STREAM
        assert "closed" in answer.error.message


async def test_responses_and_anthropic_streams_without_their_end_are_stored_incomplete(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    reply = Reply(text="Half an answer.", calls=[("toolu_1", "bash", {"cmd": "ls -la"})])
    fake.add(CutStream(reply, keep=6), CutStream(reply, keep=7))
    async with _clients(tmp_path, loopback) as (mw, oai, ant):
        stream = await oai.responses.create(model=MODEL, input="Go.", stream=True)
        _ = [event async for event in stream]
        first = _only(await mw.store.list_messages(SID), "assistant")
        assert first.finish is None
        assert first.error is not None
        assert first.error.name == INCOMPLETE_STREAM
        await mw.close_session(SID)
    async with _clients(tmp_path / "b", loopback) as (mw, _, ant):
        async with ant.messages.stream(model=MODEL, max_tokens=64, messages=[_u("Go.")]) as stream:
            _ = [text async for text in stream.text_stream]
        answer = _only(await mw.store.list_messages(SID), "assistant")
        assert answer.finish is None
        assert answer.error is not None
        assert answer.error.name == INCOMPLETE_STREAM
        call = next(p for p in answer.parts if isinstance(p, ToolPart))
        assert isinstance(call.state, ToolStatePending)
    assert fake.bodies(RESPONSES)


# --------------------------------------------------------------------------- the host's own objects


def _spy(resource: Any) -> list[dict[str, Any]]:
    """Record the keyword arguments each call of ``resource.create`` gets (the SDK's own
    method still sends them)."""
    calls: list[dict[str, Any]] = []
    create = resource.create

    async def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return await create(**kwargs)

    resource.create = spy
    return calls


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
async def test_the_sdk_gets_the_host_s_own_items_for_unchanged_messages(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer], api: str
) -> None:
    fake, loopback = server
    async with _clients(tmp_path, loopback) as (_, oai, ant):
        if api == "chat":
            calls = _spy(oai.unwrapped.chat.completions)
            host: list[dict[str, Any]] = [SYSTEM, _u("List the files.")]
        elif api == "responses":
            calls = _spy(oai.unwrapped.responses)
            host = [_u("List the files.")]
        else:
            calls = _spy(ant.unwrapped.messages)
            host = [_u("List the files.")]
        key = "input" if api == "responses" else "messages"

        async def send() -> None:
            if api == "chat":
                await oai.chat.completions.create(model=MODEL, messages=host)
            elif api == "responses":
                await oai.responses.create(model=MODEL, input=host)
            else:
                await ant.messages.create(model=MODEL, max_tokens=64, messages=host)

        for turn in range(4):
            fake.add(Reply(text=f"Answer {turn}."))
            await send()
            host += [_a(f"Answer {turn}."), _u(f"Question {turn}.")]
        await send()
        sent = calls[-1][key]
        assert sent is not host  # the call's own list: the host's is never changed
        # Every message goes out as the host's own object (the Anthropic last turn
        # is a copy carrying the prompt-cache breakpoint); the bytes are the host's.
        same = len(host) - 1 if api == "anthropic" else len(host)
        assert [a is b for a, b in zip(sent, host, strict=True)] == [True] * same + [False] * (
            len(host) - same
        )
        body = fake.bodies(MESSAGES if api == "anthropic" else CHAT if api == "chat" else RESPONSES)
        expected = mark_conversation_cache(host) if api == "anthropic" else host
        assert body[-1][key] == expected
    assert fake.invalid == []


async def test_a_host_item_unlike_what_is_sent_is_not_reused(
    tmp_path: Path, server: tuple[FakeProvider, LoopbackServer]
) -> None:
    fake, loopback = server
    async with _clients(tmp_path, loopback) as (_, _, ant):
        calls = _spy(ant.unwrapped.messages)
        block: dict[str, Any] = {
            "type": "text",
            "text": "List the files.",
            "cache_control": {"type": "ephemeral"},
        }
        marked: dict[str, Any] = {"role": "user", "content": [block]}
        host: list[dict[str, Any]] = [marked]
        fake.add(Reply(text="Three files."))
        await ant.messages.create(model=MODEL, max_tokens=64, messages=host)
        host += [_a("Three files."), _u("Which is largest?")]
        fake.add(Reply(text="a.py."))
        await ant.messages.create(model=MODEL, max_tokens=64, messages=host)
        sent = calls[-1]["messages"]
        # The host's own marker is not carried over (docs/providers.md): its item is
        # not what is sent, so ours goes out; the equal answer is the host's own.
        assert sent[0] is not marked
        assert sent[0] == {"role": "user", "content": "List the files."}
        assert sent[1] is host[1]
        assert block["cache_control"] == {"type": "ephemeral"}  # untouched
    assert fake.invalid == []
