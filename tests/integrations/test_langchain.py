"""The LangChain integration end to end (SPEC R1, R4.5, R7.3, R8, A10, A11).

A real ``create_agent`` agent with a ``read`` tool runs on a scripted
``GenericFakeChatModel`` (tools bound, usage reported); the middleware is its only
mimo_ctx line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from mimo_ctx.config import RebuildConfig
from mimo_ctx.errors import ContextOverflowError, MimoCtxError
from mimo_ctx.integrations import langchain as integration
from mimo_ctx.integrations.langchain import (
    MimoCtxMiddleware,
    from_langchain_messages,
    to_langchain_messages,
    usage_from_langchain,
)
from mimo_ctx.messages import (
    FilePart,
    Message,
    OpaquePart,
    ReasoningPart,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStatePending,
)
from mimo_ctx.reminders import PER_TURN_MARKER
from mimo_ctx.store import SQLiteStore
from mimo_ctx.testing import FakeOverflowError, filler_text
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER, COMPACTED_PLACEHOLDER, INTERRUPTED_TOOL_ERROR

from .conftest import Engine, running
from .fakes import FINAL_ANSWER, ScriptedChatModel, assert_langchain_pairs, langchain_tokens

TASK = "Refactor every module. Never touch tests."
SYSTEM = "You are a careful coding agent."
CONFIG: Any = {"recursion_limit": 400}


@tool
def read(file_path: str) -> str:
    """Read a file."""
    return f"{file_path}\n" + filler_text(3000, seed=len(file_path))


def build_agent(engine: Engine, model: ScriptedChatModel, **options: Any) -> Any:
    checkpointer = options.pop("checkpointer", None)
    return create_agent(
        model,
        [read],
        system_prompt=SYSTEM,
        middleware=[MimoCtxMiddleware(engine.middleware, **options)],
        checkpointer=checkpointer,
    )


def is_boundary(message: BaseMessage) -> bool:
    return isinstance(message, HumanMessage) and str(message.content).startswith(
        CHECKPOINT_SUMMARY_HEADER
    )


def rebuilt_index(model: ScriptedChatModel) -> int:
    for index, request in enumerate(model.received):
        if any(is_boundary(m) for m in request):
            return index
    raise AssertionError("no request carried the rebuild boundary")


def tool_messages(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


async def test_r1_r8_rebuild_mid_run_sends_boundary_first(tmp_path: Path) -> None:
    """Usage crosses the trigger line mid-run: the model gets the rebuilt history
    (R8.1) through request.override(); the graph state keeps everything."""
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=40)
        agent = build_agent(engine, model, session_id="s1")
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)

        assert state["messages"][-1].content == FINAL_ANSWER
        assert len(engine.rebuilds) == 1
        index = rebuilt_index(model)
        before, after = model.received[index - 1], model.received[index]
        assert langchain_tokens(before) >= 85_000
        assert langchain_tokens(after) < 10_000
        # R8.1: the system message, then the boundary; the tail is folded into it
        # (R7.3) but for the open tool round the agent is in the middle of, sent in
        # full (beyond); nothing before the watermark is sent (R8.2).
        assert [type(m) for m in after] == [SystemMessage, HumanMessage, AIMessage, ToolMessage]
        assert len(str(after[3].content)) > 10_000
        assert after[0].content == SYSTEM
        body = str(after[1].content)
        assert body.startswith(CHECKPOINT_SUMMARY_HEADER + "\n\n## Checkpoint\n")
        assert "# Recent user input (verbatim)" in body
        assert TASK in body
        assert "- read(file_path=" in body
        # R7.4: later rounds are sent as they are.
        later = tool_messages(model.received[index + 3])
        assert len(later) == 4
        assert all(len(str(m.content)) > 10_000 for m in later)
        for request in model.received:
            assert_langchain_pairs(request[1:])

        # The graph state is untouched: all 40 results in full.
        results = tool_messages(state["messages"])
        assert len(results) == 40
        assert all(len(str(m.content)) > 10_000 for m in results)
        stored = await engine.store.list_messages("s1", agent=None)
        assert len(stored) == len(state["messages"]) + 1  # each once, plus the boundary
        assert len([m for m in stored if m.is_boundary]) == 1
        recorded = [m for m in stored if m.role == "assistant"]
        usages = [m.usage_metadata for m in state["messages"] if isinstance(m, AIMessage)]
        assert [m.usage.total if m.usage else None for m in recorded] == [
            u["total_tokens"] if u else None for u in usages
        ]


async def test_r4_5_compacted_results_are_sent_as_placeholders(tmp_path: Path) -> None:
    """Without an activity digest the tail stays live: old results read as the
    placeholder (R4.5, A10) in the request and in full in the graph state."""
    async with running(tmp_path, config=RebuildConfig(activity_max_lines=0)) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=36)
        agent = build_agent(engine, model, session_id="s1")
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)
        assert state["messages"][-1].content == FINAL_ANSWER
        after = model.received[rebuilt_index(model)]
        assert is_boundary(after[1])
        cleared = [m for m in tool_messages(after) if m.content == COMPACTED_PLACEHOLDER]
        assert len(cleared) >= 3
        # Every result but the open round's (kept for the model to answer) is cleared.
        assert len(cleared) == len(tool_messages(after)) - 1
        assert tool_messages(after)[-1].content != COMPACTED_PLACEHOLDER
        assert_langchain_pairs(after[1:])
        assert all(m.content != COMPACTED_PLACEHOLDER for m in tool_messages(state["messages"]))


async def test_clearing_knobs_placeholder_and_keep_reach_the_request(tmp_path: Path) -> None:
    """The configured placeholder is what cleared results read; the newest N stay."""
    config = RebuildConfig(
        activity_max_lines=0,
        micro_compact_placeholder="[cleared: fetch it with the history tool]",
        micro_compact_keep=2,
    )
    async with running(tmp_path, config=config) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=36)
        agent = build_agent(engine, model, session_id="s1")
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)
        after = tool_messages(model.received[rebuilt_index(model)])
        contents = [m.content for m in after]
        assert COMPACTED_PLACEHOLDER not in contents
        cleared = [c for c in contents if c == "[cleared: fetch it with the history tool]"]
        assert len(cleared) >= 3
        # The open round and the two newest results before it are sent in full.
        assert len(cleared) == len(after) - 3
        assert all(len(str(c)) > 10_000 for c in contents[-3:])
        assert all(len(str(m.content)) > 10_000 for m in tool_messages(state["messages"]))


async def test_r1_1b_overflow_is_recovered_exactly_once(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=24, overflow_above=60_000)
        agent = build_agent(engine, model, session_id="s1")
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)
        assert state["messages"][-1].content == FINAL_ANSWER
        assert model.overflow_errors == 1
        assert len(engine.rebuilds) == 1
        failed = next(i for i, r in enumerate(model.received) if langchain_tokens(r) > 60_000)
        retry = model.received[failed + 1]
        assert is_boundary(retry[1])
        assert langchain_tokens(retry) < 60_000
        for request in model.received:
            assert_langchain_pairs(request[1:])


async def test_r1_4_second_overflow_raises_context_overflow_error(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=30, overflow_from=12)
        agent = build_agent(engine, model, session_id="s1")
        with pytest.raises(ContextOverflowError) as info:
            await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)
        assert isinstance(info.value.__cause__, FakeOverflowError)
        assert model.overflow_errors == 2
        stored = await engine.store.list_messages("s1", agent=None)
        assert len([m for m in stored if m.is_boundary]) == 1


async def test_other_errors_propagate_unchanged(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(
            messages=iter([]), rounds=3, fail_with=RuntimeError("model unavailable")
        )
        agent = build_agent(engine, model, session_id="s1")
        with pytest.raises(RuntimeError, match="model unavailable"):
            await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)
        assert len(model.received) == 1
        assert engine.rebuilds == []


async def test_thread_id_is_the_session_and_turns_store_only_what_is_new(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=2)
        agent = build_agent(engine, model, checkpointer=InMemorySaver())
        config: Any = {**CONFIG, "configurable": {"thread_id": "thread-7"}}
        await agent.ainvoke({"messages": [HumanMessage(TASK)]}, config)
        assert await engine.store.count_messages("thread-7") == 6
        model.answered = 0
        state = await agent.ainvoke({"messages": [HumanMessage("Now the tests.")]}, config)
        assert await engine.store.count_messages("thread-7") == 12
        assert len(model.received[-1]) == len(state["messages"])  # system + all but the last


async def test_missing_session_and_sync_invoke_are_clear_errors(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        agent = build_agent(engine, ScriptedChatModel(messages=iter([]), rounds=0))
        with pytest.raises(MimoCtxError, match="thread_id"):
            await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)
        agent = build_agent(engine, ScriptedChatModel(messages=iter([]), rounds=0), session_id="s")
        with pytest.raises(MimoCtxError, match="ainvoke"):
            agent.invoke({"messages": [HumanMessage(TASK)]}, CONFIG)


async def test_carried_messages_reach_the_model_unchanged(tmp_path: Path) -> None:
    """A system message in mid-conversation is stored opaque and sent as it was."""
    async with running(tmp_path) as engine:
        note = SystemMessage("Budget: 3 more files.", id="note-1")
        model = ScriptedChatModel(messages=iter([]), rounds=0)
        agent = build_agent(engine, model, session_id="s1")
        history = [HumanMessage(TASK, id="h1"), AIMessage("On it.", id="a1"), note]
        await agent.ainvoke({"messages": [*history, HumanMessage("Go.", id="h2")]}, CONFIG)
        sent = model.received[0]
        assert [m.id for m in sent[1:]] == ["h1", "a1", "note-1", "h2"]
        assert sent[3] is note or sent[3] == note
        stored = await engine.store.list_messages("s1", agent=None)
        assert [p.kind for m in stored for p in m.parts if isinstance(p, OpaquePart)] == ["system"]


def test_a10_converters_keep_files_reasoning_and_errors() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    thinking = {"type": "thinking", "thinking": "plan", "signature": "sig"}
    call = {"name": "read", "args": {"file_path": "a"}, "id": "c1", "type": "tool_call"}
    usage = {
        "input_tokens": 1000,
        "output_tokens": 50,
        "total_tokens": 1050,
        "input_token_details": {"cache_read": 400},
    }
    history: list[BaseMessage] = [
        SystemMessage(SYSTEM),
        HumanMessage([{"type": "text", "text": "Look:"}, image]),
        AIMessage([thinking], tool_calls=[call], usage_metadata=usage),
        ToolMessage("boom", tool_call_id="c1", status="error"),
    ]
    user, assistant, result = from_langchain_messages(history, session_id="s")
    assert [type(p) for p in user.parts] == [TextPart, FilePart]
    reasoning, tool_call = assistant.parts
    assert isinstance(reasoning, ReasoningPart)
    assert reasoning.signature == "sig"
    assert isinstance(tool_call, ToolPart)
    assert assistant.usage == TokenUsage(input=600, output=50, cache_read=400, total=1050)
    part = result.parts[0]
    assert isinstance(part, ToolResultPart)
    assert part.is_error
    assert part.tool == "read"  # found through the call

    back = to_langchain_messages([user, assistant, result])
    assert back[0].content == [{"type": "text", "text": "Look:"}, image]
    assert isinstance(back[1], AIMessage)
    assert back[1].tool_calls[0]["id"] == "c1"
    assert isinstance(back[2], ToolMessage)
    assert back[2].status == "error"
    assert_langchain_pairs(back)


def test_a10_interrupted_call_is_answered_with_an_error() -> None:
    message = Message(
        session_id="s",
        role="assistant",
        time_created=1,
        finish="tool-calls",
        parts=[ToolPart(call_id="c1", tool="bash", state=ToolStatePending(input={"cmd": "ls"}))],
    )
    user = Message(session_id="s", role="user", time_created=0, parts=[TextPart(text="go")])
    back = to_langchain_messages([user, message])
    assert_langchain_pairs(back)
    answer = back[-1]
    assert isinstance(answer, ToolMessage)
    assert (answer.content, answer.status) == (INTERRUPTED_TOOL_ERROR, "error")


def test_usage_absent_is_none() -> None:
    assert usage_from_langchain(AIMessage("hi")) is None


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain.agents.middleware", None)
    monkeypatch.delitem(sys.modules, integration.__name__)
    with pytest.raises(ImportError, match=r'pip install "mimo-ctx\[langchain\]"'):
        __import__(integration.__name__)


async def test_r8_3_per_turn_reminder_is_sent_never_stored(tmp_path: Path) -> None:
    notes = tmp_path / "memory" / "sessions" / "s1" / "notes.md"
    notes.parent.mkdir(parents=True)
    notes.write_text("- the API moved to v2\n", encoding="utf-8")
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=2)
        agent = build_agent(engine, model, session_id="s1")
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]}, CONFIG)
        for request in model.received:
            task = request[1]
            assert isinstance(task, HumanMessage)
            assert isinstance(task.content, list)
            first, reminder = task.content
            assert first == {"type": "text", "text": TASK}
            assert isinstance(reminder, dict)
            assert str(reminder["text"]).startswith(PER_TURN_MARKER)
            assert_langchain_pairs(request[1:])
        assert state["messages"][0].content == TASK
        stored = await engine.store.list_messages("s1", agent=None)
        assert all(
            PER_TURN_MARKER not in p.text
            for m in stored
            for p in m.parts
            if isinstance(p, TextPart)
        )


async def test_restart_recognises_the_thread_from_stored_ids(tmp_path: Path) -> None:
    """A new process (new middleware on the same SQLite file) reads the stored keys
    back: the resent thread is not stored again, only the new turn is."""
    path = tmp_path / "s.db"
    saver = InMemorySaver()
    config: Any = {**CONFIG, "configurable": {"thread_id": "t1"}}
    async with running(tmp_path, store=await SQLiteStore.open(path)) as engine:
        agent = build_agent(
            engine, ScriptedChatModel(messages=iter([]), rounds=2), checkpointer=saver
        )
        await agent.ainvoke({"messages": [HumanMessage(TASK)]}, config)
        assert await engine.store.count_messages("t1") == 6
    await engine.store.aclose()
    async with running(tmp_path, store=await SQLiteStore.open(path)) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=0)
        agent = build_agent(engine, model, checkpointer=saver)
        await agent.ainvoke({"messages": [HumanMessage("Summarise.")]}, config)
        assert await engine.store.count_messages("t1") == 8
        assert_langchain_pairs(model.received[0][1:])
        assert len(model.received[0]) == 1 + 7  # the system message and the whole thread
    await engine.store.aclose()


async def test_rebuild_command_with_focus_rebuilds_without_calling_the_model(
    tmp_path: Path,
) -> None:
    """``/rebuild <focus>``: a manual rebuild (no model turn), the focus kept verbatim
    in its own body section of the next request."""
    focus = "Keep the parser refactor in view; the CLI work is done."
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=6)
        agent = build_agent(engine, model, checkpointer=InMemorySaver())
        config: Any = {**CONFIG, "configurable": {"thread_id": "t-focus"}}
        await agent.ainvoke({"messages": [HumanMessage(TASK)]}, config)
        calls = len(model.received)

        state = await agent.ainvoke({"messages": [HumanMessage(f"/rebuild {focus}")]}, config)
        assert len(model.received) == calls  # the model was not asked
        reply = state["messages"][-1]
        assert isinstance(reply, AIMessage)
        assert str(reply.content).startswith("Context rebuild: rebuilt")
        assert len(engine.rebuilds) == 1
        assert engine.rebuilds[0].manual

        model.rounds = model.answered  # answer the next turn in one go
        await agent.ainvoke({"messages": [HumanMessage("Carry on.")]}, config)
        request = model.received[-1]
        boundary = next(m for m in request if is_boundary(m))
        body = str(boundary.content)
        assert (
            f"# Rebuild focus\nWhat the user asked this rebuild to focus on, verbatim:\n{focus}\n"
            in body
        )
        # The focus section comes first, before the SPEC's nine.
        assert body.index("# Rebuild focus") < body.index("# Tasks ledger")
        # The command reply is not mistaken for a model usage over the line.
        assert len(engine.rebuilds) == 1


async def test_rebuild_command_alone_and_lookalikes(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=3)
        agent = build_agent(engine, model, checkpointer=InMemorySaver())
        config: Any = {**CONFIG, "configurable": {"thread_id": "t-plain"}}
        await agent.ainvoke({"messages": [HumanMessage(TASK)]}, config)
        calls = len(model.received)
        model.rounds = model.answered
        # Not a command: the model answers it as usual.
        await agent.ainvoke({"messages": [HumanMessage("/rebuilding the parser?")]}, config)
        assert len(model.received) == calls + 1
        state = await agent.ainvoke({"messages": [HumanMessage("  /rebuild  ")]}, config)
        assert len(model.received) == calls + 1
        assert str(state["messages"][-1].content).startswith("Context rebuild: rebuilt")
        stored = await engine.store.list_messages("t-plain", agent=None)
        boundary = next(m for m in stored if m.is_boundary)
        assert "# Rebuild focus" not in "".join(
            p.text for p in boundary.parts if isinstance(p, TextPart)
        )
