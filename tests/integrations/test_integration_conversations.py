"""The conversation rule and several workers, with real pydantic-ai and LangChain agents (issue 16).

* Two conversations under one fixed session id never see each other's words: the
  second is refused with :class:`~mimo_ctx.errors.ConversationMismatchError`
  naming the session (the default session ids, one per conversation, never mix).
* Regenerate and edit-and-resend send the model exactly the history the framework
  has, nothing it dropped.
* Two middlewares on one SQLite file serving alternate runs of one conversation
  for 50 turns store every message once and raise nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import FunctionModel

from mimo_ctx.errors import ConversationMismatchError
from mimo_ctx.integrations import _pydantic_ai_send as pydantic_ai_send
from mimo_ctx.integrations import langchain as langchain_integration
from mimo_ctx.integrations.langchain import MimoCtxMiddleware
from mimo_ctx.integrations.pydantic_ai import MimoCtxCapability
from mimo_ctx.messages import ToolPart
from mimo_ctx.store import SQLiteStore

from .conftest import running
from .fakes import ScriptedChatModel, ScriptedFunction

ALICE = "Alice: my account password hint is BLUE-42"
BOB = "Bob: what is the weather like?"
SID = "s-conversations"
CONFIG: Any = {"recursion_limit": 50}


def _agent(middleware: Any, model: ScriptedFunction, **capability: Any) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model),
        system_prompt="You are careful.",
        capabilities=[MimoCtxCapability(middleware, **capability)],
    )

    @agent.tool_plain
    def read(file_path: str) -> str:
        """Read a file."""
        return f"contents of {file_path}"

    return agent


def _texts(messages: list[ModelMessage]) -> list[str]:
    out: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                out.append(f"user: {part.content}")
            elif isinstance(part, TextPart):
                out.append(f"model: {part.content}")
    return out


# --------------------------------------------------------------------------- pydantic-ai


async def test_pydantic_ai_a_second_conversation_under_one_session_is_refused(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=0)
        agent = _agent(engine.middleware, model, session_id=SID)
        await agent.run(ALICE)
        with pytest.raises(ConversationMismatchError, match=SID):
            await agent.run(BOB)
        assert len(model.received) == 1  # Bob's request never reached the model
        # The default session (the run's conversation id) keeps them apart.
        free = _agent(engine.middleware, model)
        await free.run(ALICE)
        await free.run(BOB)
        assert "BLUE-42" not in ModelMessagesTypeAdapter.dump_json(model.received[-1]).decode()


async def test_pydantic_ai_regenerate_and_edit_send_exactly_the_history(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=0)
        agent = _agent(engine.middleware, model, session_id=SID)
        first = await agent.run("List the files.")
        history = first.all_messages()
        # Regenerate: the host drops the answer and runs the same request again.
        await agent.run(message_history=history[:1])
        assert _texts(model.received[-1]) == _texts(history[:1])
        second = await agent.run("Which is largest?", message_history=history)
        longer = second.all_messages()
        # Edit-and-resend: the last question edited, from the first answer on.
        await agent.run("Which is smallest?", message_history=longer[:2])
        sent = _texts(model.received[-1])
        assert sent == [*_texts(longer[:2]), "user: Which is smallest?"]
        assert "user: Which is largest?" not in sent


async def test_pydantic_ai_two_middlewares_serve_alternate_runs_for_50_turns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    async with (
        running(tmp_path / "a", store=await SQLiteStore.open(path)) as one,
        running(tmp_path / "b", store=await SQLiteStore.open(path)) as two,
    ):
        models = [ScriptedFunction(rounds=1), ScriptedFunction(rounds=1)]
        agents = [
            _agent(e.middleware, m, session_id=SID) for e, m in zip((one, two), models, strict=True)
        ]
        history: list[ModelMessage] = []
        for turn in range(50):
            model = models[turn % 2]
            model.answered = 0 if turn % 5 == 0 else 1  # a tool round every fifth turn
            result = await agents[turn % 2].run(f"Turn {turn}.", message_history=history)
            history = result.all_messages()
        stored = await one.store.list_messages(SID)
        assert await one.store.count_messages(SID) == len(stored)
        prompts = [
            p
            for m in history
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, UserPromptPart)
        ]
        answers = [m for m in history if isinstance(m, ModelResponse)]
        assert len([m for m in stored if m.role == "user"]) == len(prompts)
        assert len([m for m in stored if m.role == "assistant"]) == len(answers)
        calls = [p.call_id for m in stored for p in m.parts if isinstance(p, ToolPart)]
        assert len(calls) == len(set(calls)) == 10
    await one.store.aclose()
    await two.store.aclose()


# --------------------------------------------------------------------------- LangChain


@tool
def read(file_path: str) -> str:
    """Read a file."""
    return f"contents of {file_path}"


def _lc_agent(middleware: Any, model: ScriptedChatModel, **options: Any) -> Any:
    return create_agent(
        model,
        [read],
        system_prompt="You are careful.",
        middleware=[MimoCtxMiddleware(middleware, **options)],
    )


def _lc_texts(messages: list[BaseMessage]) -> list[str]:
    return [
        f"{m.type}: {m.content}"
        for m in messages
        if isinstance(m, HumanMessage | AIMessage) and isinstance(m.content, str) and m.content
    ]


async def test_langchain_a_second_conversation_under_one_session_is_refused(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=0)
        agent = _lc_agent(engine.middleware, model, session_id=SID)
        await agent.ainvoke({"messages": [HumanMessage(ALICE)]}, CONFIG)
        with pytest.raises(ConversationMismatchError, match=SID):
            await agent.ainvoke({"messages": [HumanMessage(BOB)]}, CONFIG)
        assert len(model.received) == 1
        assert all("Bob" not in json.dumps(m.content) for r in model.received for m in r)


async def test_langchain_regenerate_and_edit_send_exactly_the_history(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=0)
        agent = _lc_agent(engine.middleware, model, session_id=SID)
        state = await agent.ainvoke({"messages": [HumanMessage("List the files.")]}, CONFIG)
        history: list[BaseMessage] = state["messages"]
        await agent.ainvoke({"messages": history[:1]}, CONFIG)  # regenerate
        assert _lc_texts(model.received[-1]) == _lc_texts(history[:1])
        state = await agent.ainvoke(
            {"messages": [*history, HumanMessage("Which is largest?")]}, CONFIG
        )
        longer: list[BaseMessage] = state["messages"]
        await agent.ainvoke({"messages": [*longer[:2], HumanMessage("Which is smallest?")]}, CONFIG)
        sent = _lc_texts(model.received[-1])
        assert sent == [*_lc_texts(longer[:2]), "human: Which is smallest?"]


async def test_langchain_two_middlewares_serve_alternate_turns_for_50_turns(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    async with (
        running(tmp_path / "a", store=await SQLiteStore.open(path)) as one,
        running(tmp_path / "b", store=await SQLiteStore.open(path)) as two,
    ):
        models = [ScriptedChatModel(messages=iter([]), rounds=1) for _ in range(2)]
        agents = [
            _lc_agent(e.middleware, m, session_id=SID)
            for e, m in zip((one, two), models, strict=True)
        ]
        history: list[BaseMessage] = []
        for turn in range(50):
            model = models[turn % 2]
            model.answered = 0 if turn % 5 == 0 else 1
            state = await agents[turn % 2].ainvoke(
                {"messages": [*history, HumanMessage(f"Turn {turn}.")]}, CONFIG
            )
            history = state["messages"]
        stored = await one.store.list_messages(SID)
        assert await one.store.count_messages(SID) == len(stored) == len(history)
        assert len([m for m in stored if m.role == "tool"]) == len(
            [m for m in history if isinstance(m, ToolMessage)]
        )
        calls = [p.call_id for m in stored for p in m.parts if isinstance(p, ToolPart)]
        assert len(calls) == len(set(calls))
    await one.store.aclose()
    await two.store.aclose()


# --------------------------------------------------------------------------- incremental


async def test_pydantic_ai_incremental_outgoing_equals_the_whole_conversion(
    tmp_path: Path,
) -> None:
    """Build 4: the messages sent are built run by run; they equal converting the view."""
    checked: list[int] = []

    class Checking(MimoCtxCapability):
        async def prepare_model_request(self, ctx: Any, request_context: Any) -> Any:
            history = list(request_context.messages)
            out = await super().prepare_model_request(ctx, request_context)
            sync = self._sync(ctx)
            view = await self.middleware.prepare(sync.session_id)
            whole = pydantic_ai_send.outgoing(await sync.plan(view), view.messages, history)
            assert out.messages == whole
            checked.append(len(whole))
            return out

    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=2)
        agent = Agent(
            FunctionModel(model),
            system_prompt="Careful.",
            capabilities=[Checking(engine.middleware, session_id=SID)],
        )

        @agent.tool_plain
        def read(file_path: str) -> str:
            """Read a file."""
            return f"contents of {file_path}"

        history: list[ModelMessage] = []
        for turn in range(6):
            model.answered = 0 if turn % 2 == 0 else 2
            history = (await agent.run(f"Turn {turn}.", message_history=history)).all_messages()
    assert len(checked) > 6


async def test_langchain_incremental_outgoing_equals_the_whole_conversion(tmp_path: Path) -> None:
    checked: list[int] = []

    class Checking(MimoCtxMiddleware):
        async def _prepared(self, sync: Any, request: Any) -> Any:
            out = await super()._prepared(sync, request)
            view = await self.middleware.prepare(sync.session_id)
            whole = langchain_integration._outgoing(await sync.plan(view), view.messages, ())  # pyright: ignore[reportPrivateUsage]
            assert list(out.messages) == whole
            checked.append(len(whole))
            return out

    async with running(tmp_path) as engine:
        model = ScriptedChatModel(messages=iter([]), rounds=2)
        # Typed like _lc_agent's: langchain's compiled graph is only partly typed.
        agent: Any = create_agent(
            model, [read], middleware=[Checking(engine.middleware, session_id=SID)]
        )
        history: list[BaseMessage] = []
        for turn in range(6):
            model.answered = 0 if turn % 2 == 0 else 2
            state = await agent.ainvoke(
                {"messages": [*history, HumanMessage(f"Turn {turn}.")]}, CONFIG
            )
            history = state["messages"]
    assert len(checked) > 6
