"""The four export shapes, each accepted by its own library (issue 8 done-when).

OpenAI and Anthropic: the SDKs' own typed dicts validate the shapes, and the
real SDK clients send them (over ``httpx2.MockTransport``, no network).
pydantic-ai: the tools run inside an ``Agent`` (``TestModel`` and a scripted
``FunctionModel``). LangChain: ``StructuredTool.ainvoke`` with plain input and
with a tool call.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from pydantic import TypeAdapter

from mimo_ctx.tools import ALL_TOOL_SPECS, to_anthropic_tools, to_openai_tools

from .conftest import World

Handler = Callable[[httpx2.Request], httpx2.Response]

CHAT_REPLY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "done"},
        }
    ],
}
RESPONSES_REPLY: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 0,
    "model": "gpt-test",
    "output": [],
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}
ANTHROPIC_REPLY: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [{"type": "text", "text": "done"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


def recorder(reply: dict[str, Any], bodies: list[dict[str, Any]]) -> Handler:
    """A mock transport handler recording request bodies and answering ``reply``."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        bodies.append(json.loads(request.content))
        return httpx2.Response(200, json=reply)

    return handle


# -- OpenAI --------------------------------------------------------------------------------------


async def test_openai_chat_tools_accepted_by_the_sdk(world: World) -> None:
    """Chat Completions shape: valid ``ChatCompletionFunctionToolParam``, sent unchanged."""
    openai = pytest.importorskip("openai")
    from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionToolUnionParam

    tools = world.tools_a.to_openai_tools()
    assert tools == to_openai_tools(ALL_TOOL_SPECS)
    strict: TypeAdapter[ChatCompletionFunctionToolParam] = TypeAdapter(
        ChatCompletionFunctionToolParam
    )
    union: TypeAdapter[ChatCompletionToolUnionParam] = TypeAdapter(ChatCompletionToolUnionParam)
    for tool in tools:
        assert strict.validate_python(tool) == tool
        union.validate_python(tool)
    bodies: list[dict[str, Any]] = []
    transport = httpx2.MockTransport(recorder(CHAT_REPLY, bodies))
    async with openai.AsyncOpenAI(
        api_key="test",
        base_url="http://openai.test/v1",
        http_client=httpx2.AsyncClient(transport=transport),
    ) as client:
        reply = await client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}], tools=tools
        )
    assert reply.choices[0].message.content == "done"
    assert bodies[0]["tools"] == tools


async def test_openai_responses_tools_accepted_by_the_sdk(world: World) -> None:
    """Responses API shape: valid ``FunctionToolParam``, sent unchanged."""
    openai = pytest.importorskip("openai")
    from openai.types.responses import FunctionToolParam

    tools = world.tools_a.to_openai_tools(api="responses")
    adapter: TypeAdapter[FunctionToolParam] = TypeAdapter(FunctionToolParam)
    for tool in tools:
        assert adapter.validate_python(tool) == tool
        assert tool["strict"] is False
    bodies: list[dict[str, Any]] = []
    transport = httpx2.MockTransport(recorder(RESPONSES_REPLY, bodies))
    async with openai.AsyncOpenAI(
        api_key="test",
        base_url="http://openai.test/v1",
        http_client=httpx2.AsyncClient(transport=transport),
    ) as client:
        reply = await client.responses.create(model="gpt-test", input="hi", tools=tools)
    assert reply.id == "resp_1"
    assert bodies[0]["tools"] == tools


# -- Anthropic -----------------------------------------------------------------------------------


async def test_anthropic_tools_accepted_by_the_sdk(world: World) -> None:
    """Anthropic shape: valid ``ToolParam``, sent unchanged by ``messages.create``."""
    anthropic = pytest.importorskip("anthropic")
    from anthropic.types import ToolParam, ToolUnionParam

    tools = world.tools_a.to_anthropic_tools()
    assert tools == to_anthropic_tools(ALL_TOOL_SPECS)
    adapter: TypeAdapter[ToolParam] = TypeAdapter(ToolParam)
    union: TypeAdapter[ToolUnionParam] = TypeAdapter(ToolUnionParam)
    for tool in tools:
        assert adapter.validate_python(tool) == tool
        union.validate_python(tool)
    bodies: list[dict[str, Any]] = []
    transport = httpx2.MockTransport(recorder(ANTHROPIC_REPLY, bodies))
    async with anthropic.AsyncAnthropic(
        api_key="test",
        base_url="http://anthropic.test",
        http_client=httpx2.AsyncClient(transport=transport),
    ) as client:
        reply = await client.messages.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            tools=tools,  # pyright: ignore[reportArgumentType]
        )
    assert reply.stop_reason == "end_turn"
    assert bodies[0]["tools"] == tools


# -- pydantic-ai ---------------------------------------------------------------------------------


async def test_pydantic_ai_tools_run_in_an_agent_with_test_model(world: World) -> None:
    """``TestModel`` sees our schemas and calls every tool; each answers (errors as text)."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.test import TestModel

    model = TestModel()
    agent = Agent(model, tools=world.tools_a.to_pydantic_ai_tools())
    result = await agent.run("use the tools")
    parameters = model.last_model_request_parameters
    assert parameters is not None
    seen = {t.name: t for t in parameters.function_tools}
    for spec in ALL_TOOL_SPECS:
        assert seen[spec.name].parameters_json_schema == spec.parameters
        assert seen[spec.name].description == spec.description
    returns = {
        part.tool_name: str(part.content)
        for message in result.all_messages()
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    assert set(returns) == {"history", "memory", "task", "actor"}
    # TestModel sends only the required "operation" (the first enum value).
    assert returns["task"].startswith("Tasks of this session (3):")
    assert returns["history"] == "Error: operation 'around' of the history tool needs: message_id"


async def test_pydantic_ai_scripted_tool_call(world: World) -> None:
    """A scripted ``FunctionModel`` calls ``actor status``; the agent gets our text back."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(
                parts=[ToolCallPart("actor", {"operation": "status", "actor_id": "act_a"})]
            )
        return ModelResponse(parts=[TextPart(str(returns[-1].content))])

    agent = Agent(FunctionModel(script), tools=world.tools_a.to_pydantic_ai_tools())
    result = await agent.run("how is act_a?")
    assert result.output.startswith("Actor act_a: running")


# -- LangChain -----------------------------------------------------------------------------------


async def test_langchain_tools_ainvoke(world: World) -> None:
    """``StructuredTool.ainvoke`` runs our handler with plain input and with a tool call."""
    pytest.importorskip("langchain_core")
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    tools = {t.name: t for t in world.tools_a.to_langchain_tools()}
    assert list(tools) == ["history", "memory", "task", "actor"]
    for spec in ALL_TOOL_SPECS:
        tool = tools[spec.name]
        assert isinstance(tool, BaseTool)
        converted = convert_to_openai_tool(tool)
        assert converted["function"]["name"] == spec.name
        assert converted["function"]["parameters"] == spec.parameters
    text = await tools["task"].ainvoke({"operation": "get", "task_id": "T1.1"})
    assert text.startswith("Task T1.1\nstatus: done")
    message = await tools["memory"].ainvoke(
        {
            "type": "tool_call",
            "id": "call_9",
            "name": "memory",
            "args": {"operation": "search", "query": "linter"},
        }
    )
    assert isinstance(message, ToolMessage)
    assert message.tool_call_id == "call_9"
    assert "projects/proj/MEMORY.md:4: - always run the linter" in str(message.content)
    refused = await tools["actor"].ainvoke({"operation": "status", "actor_id": "act_b"})
    assert refused.startswith("Error: there is no actor 'act_b' in this session; list them")


@pytest.mark.parametrize(
    ("module", "convert", "message"),
    [
        (
            "pydantic_ai",
            "to_pydantic_ai_tools",
            'pydantic-ai tools need pydantic-ai: pip install "mimo-ctx[pydantic-ai]"',
        ),
        (
            "langchain_core.tools",
            "to_langchain_tools",
            'LangChain tools need langchain-core: pip install "mimo-ctx[langchain]"',
        ),
    ],
)
def test_framework_tools_without_the_framework_name_the_extra(
    world: World, monkeypatch: pytest.MonkeyPatch, module: str, convert: str, message: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # the import fails as if not installed
    with pytest.raises(ImportError) as caught:
        getattr(world.tools_a, convert)()
    assert str(caught.value) == message
    assert isinstance(caught.value.__cause__, ImportError)
