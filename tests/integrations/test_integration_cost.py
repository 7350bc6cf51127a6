"""The integrations read the framework's history in O(new messages) per request (issue 16).

A framework resends its whole history with every model request. The integration
hands that list to the reconciler, which compares it with the last one (identities,
no walk in Python) and keeps its own copy extended in place; a copy of the whole
list per request would cost O(history) every time, and would be one more list of
the whole history for every collection to walk while the model call runs. The
framework's list is a list that counts the items iteration visits: over a long
history, a request visits a handful of them, not all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, TextPart, UserPromptPart
from pydantic_ai.messages import ModelRequest as PaiRequest
from pydantic_ai.messages import ModelResponse as PaiResponse
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel

from mimo_ctx.integrations.langchain import MimoCtxMiddleware
from mimo_ctx.integrations.pydantic_ai import MimoCtxCapability

from .conftest import running

HISTORY = 300


class _Visits(list[Any]):
    """A framework's history that counts the items iteration visits."""

    visited = 0

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            _Visits.visited += 1
            yield item


@dataclass
class _Counting(AbstractCapability[Any]):
    """Hands the next capability the request's history as a :class:`_Visits` list."""

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        request_context.messages = _Visits(request_context.messages)
        _Visits.visited = 0
        return request_context


def _pydantic_ai_history() -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for turn in range(HISTORY // 2):
        out.append(PaiRequest(parts=[UserPromptPart(f"Question {turn}?")]))
        out.append(PaiResponse(parts=[TextPart(f"Answer {turn}.")]))
    return out


async def test_pydantic_ai_requests_visit_only_new_messages(tmp_path: Path) -> None:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
        return PaiResponse(parts=[TextPart("Reply.")])

    async with running(tmp_path) as engine:
        agent = Agent(
            FunctionModel(answer),
            capabilities=[_Counting(), MimoCtxCapability(engine.middleware, session_id="ses_c")],
        )
        history = _pydantic_ai_history()
        result = await agent.run("Go on.", message_history=history)
        visits: list[int] = []
        for turn in range(3):
            result = await agent.run(f"Turn {turn}.", message_history=result.all_messages())
            visits.append(_Visits.visited)
        assert len(result.all_messages()) > HISTORY
        assert max(visits) < 10, visits


def _langchain_history() -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for turn in range(HISTORY // 2):
        out.append(HumanMessage(f"Question {turn}?", id=f"h{turn}"))
        out.append(AIMessage(f"Answer {turn}.", id=f"a{turn}"))
    return out


class _CountingMiddleware(AgentMiddleware[Any, Any]):
    """Hands the next middleware the request's messages as a :class:`_Visits` list."""

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Any
    ) -> ModelResponse[Any]:
        counted = request.override(messages=_Visits(request.messages))
        _Visits.visited = 0
        return await handler(counted)


class _Model(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


async def test_langchain_requests_visit_only_new_messages(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        replies = iter([AIMessage(f"Reply {n}.") for n in range(8)])
        agent: Any = create_agent(  # pyright: ignore[reportUnknownVariableType]
            _Model(messages=replies),
            [],
            middleware=[
                _CountingMiddleware(),
                MimoCtxMiddleware(engine.middleware, session_id="ses_c"),
            ],
        )
        state = await agent.ainvoke({"messages": [*_langchain_history(), HumanMessage("Go on.")]})
        visits: list[int] = []
        for turn in range(3):
            messages = [*state["messages"], HumanMessage(f"Turn {turn}.")]
            state = await agent.ainvoke({"messages": messages})
            visits.append(_Visits.visited)
        assert len(state["messages"]) > HISTORY
        assert max(visits) < 10, visits
