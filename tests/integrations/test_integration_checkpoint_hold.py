"""The integrations hold the SQLite store's idle checkpoint while the model runs.

As for the client wrappers (``tests/providers/test_wrap_checkpoint_hold.py``): the
store's idle WAL checkpoint waits for the model call's end. The model reads the
store's outstanding holds while it answers; after the run none is left.
"""

# The hold count is the store's own state.
# pyright: reportPrivateUsage=false

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, TextPart
from pydantic_ai.messages import ModelResponse as PaiResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from mimo_ctx.integrations.langchain import MimoCtxMiddleware
from mimo_ctx.integrations.pydantic_ai import MimoCtxCapability
from mimo_ctx.store.sqlite import SQLiteStore

from .conftest import running


async def test_pydantic_ai_holds_the_checkpoint_during_the_model_request(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "agent.db") as store:
        seen: list[int] = []

        def answer(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
            seen.append(store._holds)
            return PaiResponse(parts=[TextPart("Reply.")])

        async with running(tmp_path, store=store) as engine:
            agent = Agent(
                FunctionModel(answer),
                capabilities=[MimoCtxCapability(engine.middleware, session_id="ses_h")],
            )
            result = await agent.run("Read a.py.")
            await agent.run("Go on.", message_history=result.all_messages())
            assert seen == [1, 1]
            assert store._holds == 0


async def test_langchain_holds_the_checkpoint_during_the_model_call(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "agent.db") as store:
        seen: list[int] = []

        class Model(GenericFakeChatModel):
            def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
                return self

            def _generate(
                self,
                messages: list[BaseMessage],
                stop: Any = None,
                run_manager: Any = None,
                **kwargs: Any,
            ) -> ChatResult:
                seen.append(store._holds)
                return ChatResult(generations=[ChatGeneration(message=AIMessage("Reply."))])

        async with running(tmp_path, store=store) as engine:
            agent: Any = create_agent(  # pyright: ignore[reportUnknownVariableType]
                Model(messages=iter([])),
                [],
                middleware=[MimoCtxMiddleware(engine.middleware, session_id="ses_h")],
            )
            state = await agent.ainvoke({"messages": [HumanMessage("Read a.py.")]})
            await agent.ainvoke({"messages": [*state["messages"], HumanMessage("Go on.")]})
            assert seen == [1, 1]
            assert store._holds == 0
