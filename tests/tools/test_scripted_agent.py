"""A scripted agent follows every pointer a rebuild gives it (issue 8 done-when).

End to end: :class:`~mimo_ctx.middleware.ContextMiddleware` rebuilds a session
whose long user message gets elided (SPEC R5.5, A7); the request goes through
the real OpenAI SDK to a scripted model (``httpx2.MockTransport``), which calls
the tools exactly as the context tells it to:

1. ``history around`` with the id from the elision line → the full text;
2. ``memory search`` for a word found only in the project ``MEMORY.md`` → that
   file and line;
3. ``memory read`` of the path on a ``File:`` line of the body;
4. ``task list`` and ``actor status`` → this session's answers, never another's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx2
import pytest

from mimo_ctx.messages import Message, TextPart, TokenUsage
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import InMemoryStore
from mimo_ctx.tools import SessionTools

from .conftest import make_actor, make_task

openai = pytest.importorskip("openai")
from mimo_ctx.providers.openai import to_openai_chat  # noqa: E402

MIDDLE = "MIDDLE-OF-THE-LONG-MESSAGE-7f3a"


def long_user_text() -> str:
    """About 40 000 characters (5x the 2000-token cap) with a marker in the middle.

    Under the tool's 50 000-character page, so one call returns it whole.
    """
    words = " ".join(f"req{i}" for i in range(3000))
    return f"BEGIN {words} {MIDDLE} {words} END-OF-LONG"


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One Chat Completions tool call."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def reply(*, calls: list[dict[str, Any]] | None = None, text: str | None = None) -> dict[str, Any]:
    """A Chat Completions response body."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls" if calls else "stop",
                "message": message,
            }
        ],
    }


class ScriptedModel:
    """Answers each request by following the pointers found in the conversation."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        messages: list[dict[str, Any]] = body["messages"]
        step = sum(1 for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
        context = json.dumps(messages[:-1] if step else messages, ensure_ascii=False)
        if step == 0:
            elided = re.search(r"messageID=(msg_[0-9A-Za-z]+); use the history tool", context)
            assert elided is not None, "no elision line in the rebuilt request"
            return httpx2.Response(
                200,
                json=reply(
                    calls=[
                        tool_call(
                            "c1", "history", {"operation": "around", "message_id": elided.group(1)}
                        )
                    ]
                ),
            )
        if step == 1:
            args = {"operation": "search", "query": "flamingo"}
            return httpx2.Response(200, json=reply(calls=[tool_call("c2", "memory", args)]))
        if step == 2:
            file_line = re.search(r"File: (\S*projects\S*MEMORY\.md)", context)
            assert file_line is not None, "no File: line for the project memory"
            args = {"operation": "read", "path": file_line.group(1)}
            return httpx2.Response(200, json=reply(calls=[tool_call("c3", "memory", args)]))
        if step == 3:
            return httpx2.Response(
                200,
                json=reply(
                    calls=[
                        tool_call("c4", "task", {"operation": "list"}),
                        tool_call("c5", "actor", {"operation": "status", "actor_id": "act_mine"}),
                        tool_call("c6", "actor", {"operation": "status", "actor_id": "act_theirs"}),
                    ]
                ),
            )
        return httpx2.Response(200, json=reply(text="all pointers followed"))


async def test_issue8_scripted_agent_follows_every_pointer(tmp_path: Path) -> None:
    """After a rebuild the model reaches the elided text, memory, tasks and actors."""
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path / "memory", model=200_000) as mw:
        mine = await mw.open_session(project_id="proj", system="You are a scripted agent.")
        theirs = await mw.open_session(project_id="other")
        memory = mw.layout.project_memory_path("proj")
        memory.parent.mkdir(parents=True)
        memory.write_text(
            "# Project memory\n\n## Rules\n- keep commits small\n- the mascot is a flamingo\n",
            encoding="utf-8",
        )
        other_memory = mw.layout.project_memory_path("other")
        other_memory.parent.mkdir(parents=True)
        other_memory.write_text("# Other\n- their flamingo secret\n", encoding="utf-8")
        await store.upsert_task(make_task(mine.id, "T1", "in_progress", "ship the parser"))
        await store.upsert_task(make_task(theirs.id, "T9", summary="their task"))
        await store.upsert_actor(make_actor(mine.id, "act_mine"))
        await store.upsert_actor(make_actor(theirs.id, "act_theirs"))

        long = await mw.add_user_message(mine.id, long_user_text())
        t = long.time_created
        for i in range(8):
            await mw.record(
                Message(
                    session_id=mine.id,
                    role="assistant",
                    time_created=t + 1 + 2 * i,
                    finish="stop",
                    usage=TokenUsage(input=1000, output=10),
                    parts=[TextPart(text=f"reply {i} " + "x" * 3000)],
                )
            )
            await mw.add_user_message(mine.id, f"follow-up {i}")
        report = await mw.rebuild(mine.id)
        assert report.outcome == "rebuilt"
        view = await mw.prepare(mine.id)
        messages = to_openai_chat(view.messages, system=view.prefix.system)
    sent = json.dumps(messages, ensure_ascii=False)
    assert MIDDLE not in sent, "the long message was not elided"

    model = ScriptedModel()
    results: dict[str, str] = {}
    async with (
        SessionTools(store, mw.layout, mine.id) as tools,
        openai.AsyncOpenAI(
            api_key="test",
            base_url="http://model.test/v1",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(model)),
        ) as client,
    ):
        for _turn in range(10):
            response = await client.chat.completions.create(
                model="scripted", messages=messages, tools=tools.to_openai_tools()
            )
            message = response.choices[0].message
            if not message.tool_calls:
                assert message.content == "all pointers followed"
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                assert call.type == "function"
                text = await tools.call(call.function.name, call.function.arguments)
                results[call.id] = text
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        else:
            pytest.fail("the scripted agent did not finish")

    assert model.requests[0]["tools"] == tools.to_openai_tools()
    # 1. The elided message comes back whole.
    assert long_user_text() in results["c1"]
    assert f">>> message {long.id}" in results["c1"]
    # 2. The word only in the project MEMORY.md: that file and line, not the other project's.
    assert "projects/proj/MEMORY.md:5: - the mascot is a flamingo" in results["c2"]
    assert "other" not in results["c2"]
    # 3. The File: line of the body is readable through the memory tool.
    assert results["c3"].startswith("File: projects/proj/MEMORY.md (lines 1-5 of 5)")
    # 4. Tasks and actors of this session only.
    assert results["c4"] == "Tasks of this session (1):\n- T1 in_progress — ship the parser"
    assert results["c5"].startswith("Actor act_mine: running")
    assert results["c6"].startswith("Error: there is no actor 'act_theirs' in this session")
