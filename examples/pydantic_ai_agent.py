"""A pydantic-ai agent that outgrows its context window — offline, in about a second.

mimo_ctx is one line of the agent's construction::

    Agent(model, capabilities=[MimoCtxCapability(middleware, session_id="demo")])

The capability stores what is new in the history pydantic-ai sends, starts the
background checkpoint writer as usage grows, and when the last usage crosses
the trigger line sends the rebuilt context instead of the full history: the
checkpoint summary first, the user's own words, then only the live tail. The
run's own history (``result.all_messages()``) keeps everything.

The model is a pydantic-ai ``FunctionModel`` that "reads" forty files of about
3,000 tokens each and reports usage like a provider, so the example needs no
network and no API key; replace it with any pydantic-ai model (and the limits
with that model's) to use it for real. Halfway through, the fake provider also
refuses one request as too long, to show the one-time overflow recovery.

Run it with ``python examples/pydantic_ai_agent.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from mimo_ctx.events import ContextRebuilt, Event, WriterFinished, WriterStarted
from mimo_ctx.integrations.pydantic_ai import MimoCtxCapability
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.testing import FakeOverflowError, filler_text
from mimo_ctx.triggers import ModelLimits
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER

# usable = 90% of 100,000 = 90,000 tokens: about thirty file reads.
MODEL = ModelLimits(context_window=100_000, input_limit=100_000)
FILES = 40


def tokens(messages: list[ModelMessage]) -> int:
    """What a provider would report as input tokens (JSON size / 4)."""
    return len(ModelMessagesTypeAdapter.dump_json(messages)) // 4


class FakeProvider:
    """Reads every file, then answers; refuses one request as too long."""

    def __init__(self) -> None:
        self.requests = 0
        self.reads = 0
        self.refused = False
        self.summary: str | None = None

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        size = tokens(messages)
        head = messages[0]
        prompts = head.parts if isinstance(head, ModelRequest) else ()
        summary = next(
            (
                p.content
                for p in prompts
                if isinstance(p, UserPromptPart)
                and isinstance(p.content, str)
                and p.content.startswith(CHECKPOINT_SUMMARY_HEADER)
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
        usage = RequestUsage(input_tokens=size, output_tokens=30)
        if self.reads < FILES:
            self.reads += 1
            call = ToolCallPart("read", {"path": f"src/module_{self.reads:02d}.py"})
            return ModelResponse(parts=[call], usage=usage)
        text = "Read all 40 modules; 03, 11 and 27 still use the old API."
        return ModelResponse(parts=[TextPart(text)], usage=usage)


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
            provider = FakeProvider()
            agent = Agent(
                FunctionModel(provider),
                system_prompt="You are a careful coding agent.",
                capabilities=[MimoCtxCapability(middleware, session_id="demo")],  # the one line
            )

            @agent.tool_plain
            def read(path: str) -> str:
                """Read a source file."""
                return f"# {path}\n" + filler_text(3_000, seed=len(path) + provider.reads)

            result = await agent.run("Find every module that still uses the old API.")
            kept = sum(isinstance(m, ModelResponse) for m in result.all_messages())
            print(f"answer after {provider.requests} requests: {result.output}")
            print(f"pydantic-ai kept its full history: {kept} model responses")
        await store.aclose()


if __name__ == "__main__":
    anyio.run(main)
