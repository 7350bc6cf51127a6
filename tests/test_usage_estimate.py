"""Providers that report no usage (issue 17 item 11).

Some OpenAI-compatible servers send no ``usage``. Without one, neither a writer
threshold nor the trigger line fires, and every cycle sends one request over the
window and waits for the provider's error. The middleware estimates the usage
from the request it prepared and says so with a ``UsageEstimated`` event.
"""

from __future__ import annotations

from pathlib import Path

from mimo_ctx import (
    ContextMiddleware,
    ContextRebuilt,
    Event,
    InMemoryStore,
    Message,
    ModelLimits,
    RequestView,
    TextPart,
    TokenUsage,
    UsageEstimated,
)
from mimo_ctx.testing import ScriptedModel, tool_round
from mimo_ctx.tokens import estimate_message_tokens
from mimo_ctx.triggers import estimated_usage, lacks_usage

WINDOW = 50_000
LIMITS = ModelLimits(context_window=WINDOW, input_limit=WINDOW)


def _answer(session_id: str, usage: TokenUsage | None, *, finish: str | None = "stop") -> Message:
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=1,
        finish=finish,
        usage=usage,
        parts=[TextPart(text="done")],
    )


def test_which_answers_lack_usage() -> None:
    assert lacks_usage(_answer("s", None))
    assert lacks_usage(_answer("s", TokenUsage()))  # zeros: nothing reported
    assert not lacks_usage(_answer("s", TokenUsage(input=10)))
    assert not lacks_usage(_answer("s", None, finish=None))  # still streaming
    summary = _answer("s", None).model_copy(update={"summary": True})
    assert not lacks_usage(summary)
    user = Message(session_id="s", role="user", time_created=1, parts=[TextPart(text="hi")])
    assert not lacks_usage(user)


def test_estimated_usage_is_the_request_plus_the_answer() -> None:
    answer = _answer("s", None)
    usage = estimated_usage(answer, 1234)
    assert usage.estimated
    assert usage.context_tokens == 1234 + estimate_message_tokens(answer)


async def test_a_provider_without_usage_still_rebuilds_before_overflowing(tmp_path: Path) -> None:
    model = ScriptedModel(
        [tool_round("read", 3000, seed=i, path=f"f{i}.py") for i in range(40)],
        overflow_above=WINDOW,
    )

    async def no_usage(view: RequestView) -> Message:
        reply = await model.complete(view)
        return reply.model_copy(update={"usage": None})

    events: list[Event] = []
    store = InMemoryStore()
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, on_event=events.append
    ) as mw:
        session = await mw.open_session(system="You are a coding agent.")
        await mw.add_user_message(session.id, "Read every file.")
        for _ in range(40):
            await mw.turn(session.id, no_usage)
        stored = await store.list_messages(session.id)

    assert model.overflow_errors == 0
    assert max(r.tokens for r in model.requests) <= mw.usable
    rebuilds = [e for e in events if isinstance(e, ContextRebuilt)]
    assert rebuilds
    assert all(not e.manual for e in rebuilds)
    estimates = [e for e in events if isinstance(e, UsageEstimated)]
    answers = [m for m in stored if m.role == "assistant"]
    assert len(estimates) == len(answers) == 40
    for answer, event in zip(answers, estimates, strict=True):
        assert answer.usage is not None
        assert answer.usage.estimated
        assert event.message_id == answer.id
        assert event.tokens == answer.usage.context_tokens
    # The estimate's input is the request the model actually got.
    assert [e.request_tokens for e in estimates] == [r.tokens for r in model.requests]


async def test_a_reported_usage_is_kept(tmp_path: Path) -> None:
    events: list[Event] = []
    async with ContextMiddleware(
        InMemoryStore(), tmp_path / "mem", model=LIMITS, on_event=events.append
    ) as mw:
        session = await mw.open_session()
        await mw.add_user_message(session.id, "hi")
        await mw.prepare(session.id)
        answer = _answer(session.id, TokenUsage(input=777))
        await mw.record(answer)
        stored = await mw.store.get_message(answer.id)
    assert stored is not None
    assert stored.usage == TokenUsage(input=777)
    assert not any(isinstance(e, UsageEstimated) for e in events)


async def test_an_answer_recorded_without_a_prepare_here_is_estimated_from_the_window(
    tmp_path: Path,
) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system="sys")
        await mw.add_user_message(session.id, "hello " * 400)
        answer = _answer(session.id, None)
        await mw.record(answer)
        stored = await mw.store.get_message(answer.id)
        view = await mw.prepare(session.id)
    assert stored is not None
    assert stored.usage is not None
    assert stored.usage.estimated
    # The window held the user message when the answer came: the view now adds the answer.
    assert stored.usage.input == view.tokens - estimate_message_tokens(stored)
