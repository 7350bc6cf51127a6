"""One worker of tests/integrations/test_integration_workers.py: a pydantic-ai agent or a
LangChain agent with mimo_ctx, in its own OS process, serving the runs it is handed.

Usage: ``python _framework_worker.py FRAMEWORK STORE SESSION_ID MEMORY_ROOT`` where
FRAMEWORK is ``pydantic-ai`` or ``langchain`` and STORE is ``sqlite:<path>`` or
``pg:<schema>`` (the DSN in ``MIMO_CTX_PG_DSN``). Each line on stdin is a JSON request
``{"history": <the framework's messages as JSON>, "prompt": "...", "turn": n, "tool": bool}``:
the worker runs the agent once on it (with ``tool``, the model first calls ``read``
with the call id ``call_<n>``, then answers) and replies with one JSON line,
``{"history": <every message after the run>}`` or ``{"error": "<type>: <text>"}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio

from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import SQLiteStore, Store
from mimo_ctx.triggers import ModelLimits

ANSWER = "Done with this turn."


async def _store(spec: str) -> Store:
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        return await SQLiteStore.open(where)
    from mimo_ctx.store.postgres import PostgresStore

    return await PostgresStore.open(os.environ["MIMO_CTX_PG_DSN"], schema=where, create_schema=True)


class _Script:
    """What the model does in the current run (set per request)."""

    turn = 0
    tool = False


def _pydantic_ai(middleware: ContextMiddleware, session_id: str) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from mimo_ctx.integrations.pydantic_ai import MimoCtxCapability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        returned = isinstance(last, ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in last.parts
        )
        if _Script.tool and not returned:
            call = ToolCallPart("read", {"n": _Script.turn}, tool_call_id=f"call_{_Script.turn}")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart(f"{ANSWER} ({_Script.turn})")])

    agent = Agent(
        FunctionModel(model),
        system_prompt="You are careful.",
        capabilities=[MimoCtxCapability(middleware, session_id=session_id)],
    )

    @agent.tool_plain
    def read(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        """Read file n."""
        return f"contents of file {n}"

    async def run(history: Any, prompt: str) -> Any:
        messages = ModelMessagesTypeAdapter.validate_python(history)
        result = await agent.run(prompt, message_history=messages)
        return json.loads(ModelMessagesTypeAdapter.dump_json(result.all_messages()))

    return run


def _langchain(middleware: ContextMiddleware, session_id: str) -> Any:
    from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        ToolMessage,
        messages_from_dict,
        messages_to_dict,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    from mimo_ctx.integrations.langchain import MimoCtxMiddleware

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
            if _Script.tool and not isinstance(messages[-1], ToolMessage):
                call = {
                    "name": "read",
                    "args": {"n": _Script.turn},
                    "id": f"call_{_Script.turn}",
                    "type": "tool_call",
                }
                message = AIMessage(content="", tool_calls=[call])
            else:
                message = AIMessage(content=f"{ANSWER} ({_Script.turn})")
            return ChatResult(generations=[ChatGeneration(message=message)])

    @tool
    def read(n: int) -> str:
        """Read file n."""
        return f"contents of file {n}"

    agent: Any = create_agent(
        Model(messages=iter([])),
        [read],
        system_prompt="You are careful.",
        middleware=[MimoCtxMiddleware(middleware, session_id=session_id)],
    )

    async def run(history: Any, prompt: str) -> Any:
        messages = [*messages_from_dict(history), HumanMessage(prompt)]
        state = await agent.ainvoke({"messages": messages}, {"recursion_limit": 20})
        return messages_to_dict(state["messages"])

    return run


async def main(framework: str, spec: str, session_id: str, memory_root: str) -> None:
    store = await _store(spec)
    limits = ModelLimits(100_000, input_limit=100_000)
    try:
        async with ContextMiddleware(store, memory_root, model=limits) as mw:
            make = _pydantic_ai if framework == "pydantic-ai" else _langchain
            run = make(mw, session_id)
            print(json.dumps({"ready": True}), flush=True)
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    return
                request = json.loads(line)
                _Script.turn, _Script.tool = request["turn"], request["tool"]
                try:
                    history = await run(request["history"], request["prompt"])
                    print(json.dumps({"history": history}), flush=True)
                except Exception as exc:  # reported to the test, which fails on it
                    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    finally:
        await store.aclose()


if __name__ == "__main__":
    framework, store_spec, session, memory = sys.argv[1:5]
    anyio.run(main, framework, store_spec, session, memory)
