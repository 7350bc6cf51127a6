"""A plain async agent loop on ContextMiddleware — offline, in about a second.

The middleware hooks the loop at three points:

* ``prepare(session_id)`` before every request: returns what to send (the
  frozen system prompt and tools, then the messages), and first rebuilds the
  context when the last usage crossed the trigger line;
* ``record(reply)`` after every answer: stores it with its usage, and starts the
  background checkpoint writer when a usage threshold is crossed;
* ``on_error(session_id, exc)`` when a request fails: on a context-overflow
  error it rebuilds once and returns True (retry), else False (re-raise).

The model here is the library's scripted fake (it "reads" thirty files of about
1,500 tokens each), so the example needs no network and no API key. To use a
real model, replace ``model.complete(view)`` with a call that sends
``view.prefix.system``, ``view.prefix.tools`` and ``view.messages`` (the
converters in ``mimo_ctx.providers`` turn them into an OpenAI or Anthropic
payload) and turns the answer into a ``Message`` with its usage.

Run it with ``python examples/agent_loop.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio

from mimo_ctx.events import Event, WriterFinished, WriterStarted
from mimo_ctx.messages import Message, TextPart
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.testing import ScriptedModel, ScriptStep, tool_round
from mimo_ctx.triggers import ModelLimits

# A small window so that thirty file reads cross the trigger line:
# usable = min(90% of 40,000, 40,000 - 4,000) = 36,000 tokens.
MODEL = ModelLimits(context_window=40_000, max_output_tokens=4_000)


async def agent_loop(
    middleware: ContextMiddleware, session_id: str, model: ScriptedModel, *, max_turns: int = 100
) -> Message:
    """Call the model until it answers without asking for a tool."""
    for turn in range(1, max_turns + 1):
        view = await middleware.prepare(session_id)
        if view.rebuild is not None:
            report = view.rebuild
            print(
                f"turn {turn:2d}: context rebuilt ({report.outcome}), "
                f"{report.tokens_before:,} -> {view.tokens:,} tokens, "
                f"{report.compacted_results} old tool results cleared"
            )
        try:
            reply = await model.complete(view)  # your model call goes here
        except Exception as exc:
            if await middleware.on_error(session_id, exc):
                continue  # a context overflow: rebuilt, prepare again
            raise
        await middleware.record(reply)
        if reply.finish != "tool-calls":
            return reply
    raise RuntimeError(f"no final answer after {max_turns} turns")


async def run(directory: Path) -> None:
    model = ScriptedModel(
        [tool_round("read", 1_500, seed=i, file_path=f"src/module_{i:02d}.py") for i in range(30)]
        + [ScriptStep(text="Modules 03, 11 and 27 still use the old API.")]
    )

    def on_event(event: Event) -> None:
        # Events are for UIs and logs. The writer runs in the background while
        # the loop goes on, so it finishes a few turns after it started.
        if isinstance(event, WriterStarted):
            print(f"turn {len(model.requests):2d}: checkpoint writer started ({event.reason})")
        elif isinstance(event, WriterFinished):
            print(
                f"turn {len(model.requests):2d}: checkpoint.md written "
                f"({event.checkpoint_tokens} tokens)"
            )

    async with (
        SQLiteStore(directory / "agent.db") as store,
        ContextMiddleware(store, directory / "memory", model=MODEL, on_event=on_event) as mw,
    ):
        session = await mw.open_session(
            system="You are a coding agent. Read the code before answering.",
            tools=[{"name": "read", "description": "Read a file"}],
        )
        await mw.add_user_message(
            session.id, "Read every module under src/ and tell me which ones use the old API."
        )
        reply = await agent_loop(mw, session.id, model)
        # A writer the last answer started runs in the background: let it finish
        # (leaving the middleware would cancel it) before the final words.
        await mw.wait_for_writer(session.id, timeout=30)
        answer = " ".join(p.text for p in reply.parts if isinstance(p, TextPart))
        print(f"final answer after {len(model.requests)} requests: {answer}")


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        anyio.run(run, Path(directory))


if __name__ == "__main__":
    main()
