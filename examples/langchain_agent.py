"""A LangChain agent that outgrows its context window — offline, in about a second.

mimo_ctx is one line of the agent's construction::

    create_agent(model, tools, middleware=[MimoCtxMiddleware(middleware, session_id="demo")])

The middleware stores what is new in the agent's messages, starts the background
checkpoint writer as usage grows, and when the last usage crosses the trigger
line hands the model the rebuilt context through ``request.override(messages=...)``:
the checkpoint summary first, the user's own words, then only the live tail. The
graph state keeps every message.

The model is LangChain's ``GenericFakeChatModel`` taught to call tools and to
report ``usage_metadata`` like a provider; it "reads" forty files of about 3,000
tokens each, so the example needs no network and no API key. Replace it with any
chat model (and the limits with that model's) to use it for real. Halfway
through, the fake provider also refuses one request as too long, to show the
one-time overflow recovery.

Run it with ``python examples/langchain_agent.py``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, message_to_dict
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from mimo_ctx.events import ContextRebuilt, Event, WriterFinished, WriterStarted
from mimo_ctx.integrations.langchain import MimoCtxMiddleware
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.testing import FakeOverflowError, filler_text
from mimo_ctx.triggers import ModelLimits
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER

# usable = 90% of 100,000 = 90,000 tokens: about thirty file reads.
MODEL = ModelLimits(context_window=100_000, input_limit=100_000)
FILES = 40


def tokens(messages: list[BaseMessage]) -> int:
    """What a provider would report as input tokens (JSON size / 4)."""
    return sum(len(json.dumps(message_to_dict(m), default=str)) for m in messages) // 4


class FakeProvider(GenericFakeChatModel):
    """Reads every file, then answers; refuses one request as too long."""

    requests: int = 0
    reads: int = 0
    refused: bool = False
    summary: str | None = None

    def bind_tools(self, tools: Any, **kwargs: Any) -> FakeProvider:
        return self  # the script knows its one tool

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.requests += 1
        size = tokens(messages)
        summary = next(
            (
                str(m.content)
                for m in messages
                if isinstance(m, HumanMessage)
                and str(m.content).startswith(CHECKPOINT_SUMMARY_HEADER)
            ),
            None,
        )
        new_summary = summary is not None and summary != self.summary
        self.summary = summary
        print(
            f"request {self.requests:2d}: {len(messages):2d} messages, {size:6,} tokens"
            + ("  <- starts with the checkpoint summary" if new_summary else "")
        )
        if self.reads == 8 and not self.refused:
            # An upstream proxy with a smaller limit refuses this one request.
            self.refused = True
            print("            provider: prompt is too long")
            raise FakeOverflowError(size, 30_000)
        usage = {"input_tokens": size, "output_tokens": 30, "total_tokens": size + 30}
        if self.reads < FILES:
            self.reads += 1
            call = {
                "name": "read",
                "args": {"path": f"src/module_{self.reads:02d}.py"},
                "id": f"call_{self.reads}",
                "type": "tool_call",
            }
            answer = AIMessage(content="", tool_calls=[call], usage_metadata=usage)
        else:
            text = "Read all 40 modules; 03, 11 and 27 still use the old API."
            answer = AIMessage(content=text, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=answer)])


@tool
def read(path: str) -> str:
    """Read a source file."""
    return f"# {path}\n" + filler_text(3_000, seed=len(path))


def on_event(event: Event) -> None:
    if isinstance(event, WriterStarted):
        print(f"            checkpoint writer started ({event.reason})")
    elif isinstance(event, WriterFinished):
        print(f"            checkpoint.md written ({event.checkpoint_tokens:,} tokens)")
    elif isinstance(event, ContextRebuilt):
        print(
            f"            context rebuilt ({event.outcome}), "
            f"{event.tokens_before:,} -> {event.tokens_after:,} tokens"
        )


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await SQLiteStore.open(Path(tmp) / "sessions.db")
        async with ContextMiddleware(
            store, Path(tmp) / "memory", model=MODEL, on_event=on_event
        ) as middleware:
            provider = FakeProvider(messages=iter([]))
            agent = create_agent(
                provider,
                [read],
                system_prompt="You are a careful coding agent.",
                middleware=[MimoCtxMiddleware(middleware, session_id="demo")],  # the one line
            )
            state = await agent.ainvoke(  # pyright: ignore[reportUnknownMemberType]
                {"messages": [HumanMessage("Find every module that still uses the old API.")]},
                {"recursion_limit": 200},
            )
            print(f"answer after {provider.requests} requests: {state['messages'][-1].content}")
            print(f"the graph state kept every message: {len(state['messages'])} messages")
        await store.aclose()


if __name__ == "__main__":
    anyio.run(main)
