"""The pydantic-ai integration end to end (SPEC R1, R4.5, R7.3, R8, A10, A11).

A real pydantic-ai ``Agent`` with a ``read`` tool runs on a scripted
``FunctionModel`` that reports usage the way a provider does; the capability is
its only mimo_ctx line.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    CompactionPart,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    NativeToolCallPart,
    RetryFeedbackPart,
    RetryInfo,
    RetryPromptPart,  # pyright: ignore[reportDeprecated]
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.usage import RequestUsage

from mimo_ctx.config import RebuildConfig
from mimo_ctx.errors import ContextOverflowError
from mimo_ctx.integrations import pydantic_ai as integration
from mimo_ctx.integrations.pydantic_ai import (
    MimoCtxCapability,
    from_model_messages,
    to_model_messages,
    usage_from_pydantic_ai,
)
from mimo_ctx.messages import (
    FilePart,
    Message,
    OpaquePart,
    ReasoningPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStatePending,
)
from mimo_ctx.messages import (
    TextPart as CtxTextPart,
)
from mimo_ctx.reminders import PER_TURN_MARKER
from mimo_ctx.store import SQLiteStore
from mimo_ctx.testing import FakeOverflowError, filler_text
from mimo_ctx.view import (
    CHECKPOINT_SUMMARY_HEADER,
    COMPACTED_PLACEHOLDER,
    COMPACTION_SUMMARY_HEADER,
    INTERRUPTED_TOOL_ERROR,
)

from .conftest import Engine, running
from .fakes import FINAL_ANSWER, ScriptedFunction, assert_pydantic_ai_pairs, pydantic_ai_tokens

TASK = "Refactor every module. Never touch tests."
SYSTEM = "You are a careful coding agent."


def build_agent(engine: Engine, model: ScriptedFunction, **capability: Any) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model),
        system_prompt=SYSTEM,
        capabilities=[MimoCtxCapability(engine.middleware, **capability)],
    )

    @agent.tool_plain
    def read(file_path: str) -> str:
        """Read a file."""
        return f"{file_path}\n" + filler_text(3000, seed=len(model.received))

    return agent


def first_prompt(request: Sequence[ModelMessage]) -> str:
    head = request[0]
    assert isinstance(head, ModelRequest)
    prompts = [p for p in head.parts if isinstance(p, UserPromptPart)]
    assert prompts
    content = prompts[0].content
    assert isinstance(content, str)
    return content


def rebuilt_index(model: ScriptedFunction) -> int:
    """Index of the first request that starts with the rebuild boundary."""
    for index, request in enumerate(model.received):
        head = request[0]
        if isinstance(head, ModelRequest) and any(
            isinstance(p, UserPromptPart)
            and isinstance(p.content, str)
            and p.content.startswith(CHECKPOINT_SUMMARY_HEADER)
            for p in head.parts
        ):
            return index
    raise AssertionError("no request started with the rebuild boundary")


def tool_returns(messages: Sequence[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


async def test_r1_r8_rebuild_mid_run_sends_boundary_first(tmp_path: Path) -> None:
    """Usage crosses the trigger line mid-run: the model gets the rebuilt history
    (R8.1), later rounds are sent as they are, the run's history stays complete."""
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=40)
        agent = build_agent(engine, model, session_id="s1")
        result = await agent.run(TASK)

        assert result.output == FINAL_ANSWER
        assert len(engine.rebuilds) == 1
        assert engine.rebuilds[0].outcome == "rebuilt"
        index = rebuilt_index(model)
        before, after = model.received[index - 1], model.received[index]
        assert pydantic_ai_tokens(before) >= 85_000  # the previous usage crossed 90% of 100k
        assert pydantic_ai_tokens(after) < 10_000

        # R8.1: the frozen system prompt, then the boundary; nothing before the
        # watermark; the user's words verbatim inside the body.
        head = after[0]
        assert isinstance(head, ModelRequest)
        assert isinstance(head.parts[0], SystemPromptPart)
        assert head.parts[0].content == SYSTEM
        body = first_prompt(after)
        assert body.startswith(CHECKPOINT_SUMMARY_HEADER + "\n\n## Checkpoint\n")
        assert "# Recent user input (verbatim)" in body
        assert TASK in body
        assert "# Recent activity" in body
        assert "- read(file_path=" in body
        assert all(
            not (isinstance(p, UserPromptPart) and p.content == TASK)
            for m in after
            if isinstance(m, ModelRequest)
            for p in m.parts
        )
        # R7.3: the digested tail is folded into the boundary; only the open tool
        # round the agent is in the middle of stays, its result in full (beyond).
        assert len(after) == 3
        (open_result,) = tool_returns(after)
        assert len(str(open_result.content)) > 10_000
        # R7.4: tool rounds after the insert are sent as they are.
        later = model.received[index + 3]
        assert len(tool_returns(later)) == 4
        assert all(len(str(p.content)) > 10_000 for p in tool_returns(later))
        for request in model.received:
            assert_pydantic_ai_pairs(request)

        # Graph state untouched: the run's own history has every result in full.
        returns = tool_returns(result.all_messages())
        assert len(returns) == 40
        assert all(len(str(p.content)) > 10_000 for p in returns)

        # Stored once each: every framework message, plus the boundary (R1.4: one).
        stored = await engine.store.list_messages("s1", agent=None)
        assert len([m for m in stored if m.is_boundary]) == 1
        assert len([m for m in stored if m.role == "assistant"]) == 41
        assert len([m for m in stored if m.role == "tool"]) == 40
        assert len([m for m in stored if m.role == "user"]) == 2  # the task and the boundary
        # Usage recorded from ModelResponse.usage (it drives the trigger line).
        responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
        recorded = [m for m in stored if m.role == "assistant"]
        assert [m.usage.total if m.usage else None for m in recorded] == [
            r.usage.input_tokens + r.usage.output_tokens for r in responses
        ]


async def test_r4_5_compacted_results_are_sent_as_placeholders(tmp_path: Path) -> None:
    """Without an activity digest the tail stays live: old results read as the
    placeholder (R4.5, A10) in the request, in full in the run's history."""
    async with running(tmp_path, config=RebuildConfig(activity_max_lines=0)) as engine:
        model = ScriptedFunction(rounds=36)
        agent = build_agent(engine, model, session_id="s1")
        result = await agent.run(TASK)
        assert result.output == FINAL_ANSWER
        assert len(engine.rebuilds) == 1
        after = model.received[rebuilt_index(model)]
        assert first_prompt(after).startswith(CHECKPOINT_SUMMARY_HEADER)
        cleared = [p for p in tool_returns(after) if p.content == COMPACTED_PLACEHOLDER]
        assert len(cleared) >= 3
        # Every result but the open round's (kept for the model to answer) is cleared.
        assert len(cleared) == len(tool_returns(after)) - 1
        assert tool_returns(after)[-1].content != COMPACTED_PLACEHOLDER
        assert_pydantic_ai_pairs(after)
        assert all(p.content != COMPACTED_PLACEHOLDER for p in tool_returns(result.all_messages()))


async def test_clearing_knobs_placeholder_and_keep_reach_the_request(tmp_path: Path) -> None:
    """The configured placeholder is what cleared results read; the newest N stay."""
    config = RebuildConfig(
        activity_max_lines=0,
        micro_compact_placeholder="[cleared: fetch it with the history tool]",
        micro_compact_keep=2,
    )
    async with running(tmp_path, config=config) as engine:
        model = ScriptedFunction(rounds=36)
        agent = build_agent(engine, model, session_id="s1")
        result = await agent.run(TASK)
        after = tool_returns(model.received[rebuilt_index(model)])
        contents = [p.content for p in after]
        assert COMPACTED_PLACEHOLDER not in contents
        cleared = [c for c in contents if c == "[cleared: fetch it with the history tool]"]
        assert len(cleared) >= 3
        # The open round and the two newest results before it are sent in full.
        assert len(cleared) == len(after) - 3
        assert all(len(str(c)) > 10_000 for c in contents[-3:])
        assert all(len(str(p.content)) > 10_000 for p in tool_returns(result.all_messages()))


async def test_r1_1b_overflow_is_recovered_exactly_once(tmp_path: Path) -> None:
    """A provider overflow below the trigger line: one rebuild, one retry, and the
    agent finishes (R1.1 (b), A11)."""
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=24, overflow_above=60_000)
        agent = build_agent(engine, model, session_id="s1")
        result = await agent.run(TASK)

        assert result.output == FINAL_ANSWER
        assert model.overflow_errors == 1
        assert len(engine.rebuilds) == 1
        failed = next(i for i, r in enumerate(model.received) if pydantic_ai_tokens(r) > 60_000)
        retry = model.received[failed + 1]
        assert first_prompt(retry).startswith(CHECKPOINT_SUMMARY_HEADER)
        assert pydantic_ai_tokens(retry) < 60_000
        for request in model.received:
            assert_pydantic_ai_pairs(request)


async def test_r1_4_second_overflow_raises_context_overflow_error(tmp_path: Path) -> None:
    """The retry overflows again: ContextOverflowError, no loop (R1.4)."""
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=30, overflow_from=12)
        agent = build_agent(engine, model, session_id="s1")
        with pytest.raises(ContextOverflowError) as info:
            await agent.run(TASK)
        assert isinstance(info.value.__cause__, FakeOverflowError)
        assert model.overflow_errors == 2  # the first attempt and the one retry
        stored = await engine.store.list_messages("s1", agent=None)
        assert len([m for m in stored if m.is_boundary]) == 1


async def test_other_errors_propagate_unchanged(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=3, fail_with=RuntimeError("model unavailable"))
        agent = build_agent(engine, model, session_id="s1")
        with pytest.raises(RuntimeError, match="model unavailable"):
            await agent.run(TASK)
        assert len(model.received) == 1
        assert engine.rebuilds == []


async def test_resent_history_is_recognised_across_runs_and_restarts(tmp_path: Path) -> None:
    """Runs continuing a conversation store only what is new, also in a new process
    (keys kept in message metadata); the session follows the conversation id."""
    path = tmp_path / "s.db"
    async with running(tmp_path, store=await SQLiteStore.open(path)) as engine:
        model = ScriptedFunction(rounds=2)
        agent = build_agent(engine, model)  # session: the run's conversation id
        first = await agent.run(TASK)
        session_id = first.all_messages()[0].conversation_id
        assert session_id
        # The task, two calls with their results, the answer.
        assert await engine.store.count_messages(session_id) == 6
        model.answered = 0
        second = await agent.run("Now the tests too.", message_history=first.all_messages())
        assert second.all_messages()[0].conversation_id == session_id
        assert await engine.store.count_messages(session_id) == 12
        history = second.all_messages()
    await engine.store.aclose()

    async with running(tmp_path, store=await SQLiteStore.open(path)) as engine:
        model = ScriptedFunction(rounds=0)
        agent = build_agent(engine, model)
        third = await agent.run("Summarise.", message_history=history)
        assert third.output == FINAL_ANSWER
        assert await engine.store.count_messages(session_id) == 14
        # The model saw the whole conversation, as pydantic-ai has it.
        assert len(model.received[0]) == len(history) + 1
    await engine.store.aclose()


async def test_carried_parts_reach_the_model_unchanged(tmp_path: Path) -> None:
    """Part kinds mimo_ctx does not know (pydantic-ai's own compaction summary, a
    native tool call) are stored opaque and sent back as they were (A10: never
    rendered, never dropped)."""
    async with running(tmp_path) as engine:
        summary = ModelRequest(parts=[CompactionPart(content="Earlier: modules 1-9 refactored.")])
        native = NativeToolCallPart("web_search", {"query": "x"}, provider_name="openai")
        history: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(content=TASK)]),
            ModelResponse(parts=[native, TextPart(content="Searching.")]),
            summary,
        ]
        model = ScriptedFunction(rounds=0)
        agent = build_agent(engine, model, session_id="s1")
        await agent.run("Continue.", message_history=history)
        sent = model.received[0]
        assert any(p is native for m in sent for p in m.parts)
        assert any(
            isinstance(p, CompactionPart) and p.content == "Earlier: modules 1-9 refactored."
            for m in sent
            for p in m.parts
        )
        stored = await engine.store.list_messages("s1", agent=None)
        kinds = sorted(p.kind for m in stored for p in m.parts if isinstance(p, OpaquePart))
        assert kinds == ["builtin-tool-call", "compaction"]


@pytest.mark.filterwarnings("ignore:`RetryPromptPart` is deprecated")
def test_a10_converters_keep_thinking_retries_and_files() -> None:
    """ThinkingPart keeps its signature and provider fields; retry prompts and failed
    returns are error results; multimodal prompts keep their files; unknown parts
    are opaque and restored."""
    image = ImageUrl(url="https://example.com/a.png")
    binary = BinaryContent(data=b"\x89PNG", media_type="image/png")
    thinking = ThinkingPart(content="plan", signature="sig", provider_name="anthropic")
    history: list[ModelMessage] = [
        ModelRequest(
            parts=[SystemPromptPart(content=SYSTEM), UserPromptPart(["Look:", image, binary])]
        ),
        ModelResponse(
            parts=[thinking, ToolCallPart("read", {"file_path": "a"}, tool_call_id="c1")],
            usage=RequestUsage(input_tokens=1000, output_tokens=50, cache_read_tokens=400),
        ),
        ModelRequest(
            parts=[
                RetryPromptPart(  # pyright: ignore[reportDeprecated]
                    content="bad args", tool_name="read", tool_call_id="c1"
                )
            ]
        ),
        ModelResponse(parts=[ToolCallPart("read", {"file_path": "b"}, tool_call_id="c2")]),
        ModelRequest(parts=[ToolReturnPart("read", "boom", tool_call_id="c2", outcome="failed")]),
        ModelResponse(parts=[CompactionPart(content=None, provider_name="openai", id="cmp_1")]),
        ModelRequest(
            parts=[RetryFeedbackPart("answer in JSON", retry=RetryInfo(cause="model_retry"))]
        ),
    ]
    messages = from_model_messages(history, session_id="s")
    user, assistant, retry, _, failed, opaque, feedback = messages
    assert [type(p) for p in user.parts] == [CtxTextPart, FilePart, FilePart]
    first, second = user.parts[1], user.parts[2]
    assert isinstance(first, FilePart)
    assert first.url == image.url
    assert isinstance(second, FilePart)
    assert second.url == binary.data_uri
    reasoning = assistant.parts[0]
    assert isinstance(reasoning, ReasoningPart)
    assert reasoning.signature == "sig"
    assert reasoning.provider_data == {"pydantic-ai": {"provider_name": "anthropic"}}
    assert assistant.usage == TokenUsage(input=600, output=50, cache_read=400, total=1050)
    assert assistant.finish == "tool-calls"
    for message in (retry, failed):
        result = message.parts[0]
        assert message.role == "tool"
        assert isinstance(result, ToolResultPart)
        assert result.is_error
    assert isinstance(opaque.parts[0], OpaquePart)
    assert opaque.parts[0].kind == "compaction"
    text = feedback.parts[0]
    assert isinstance(text, CtxTextPart)
    assert text.synthetic
    assert "answer in JSON" in text.text

    back = to_model_messages(messages)
    prompt = back[0].parts[0]
    assert isinstance(prompt, UserPromptPart)
    assert prompt.content == ["Look:", image, binary]
    sent_thinking = back[1].parts[0]
    assert isinstance(sent_thinking, ThinkingPart)
    assert (sent_thinking.signature, sent_thinking.provider_name) == ("sig", "anthropic")
    restored = back[5].parts[0]
    assert isinstance(restored, CompactionPart)
    assert (restored.id, restored.provider_name) == ("cmp_1", "openai")
    assert_pydantic_ai_pairs(back)


def test_a10_interrupted_call_is_answered_with_an_error() -> None:
    message = Message(
        session_id="s",
        role="assistant",
        time_created=1,
        finish="tool-calls",
        parts=[ToolPart(call_id="c1", tool="bash", state=ToolStatePending(input={"cmd": "ls"}))],
    )
    user = Message(session_id="s", role="user", time_created=0, parts=[CtxTextPart(text="go")])
    back = to_model_messages([user, message])
    assert_pydantic_ai_pairs(back)
    answer = back[-1].parts[0]
    assert isinstance(answer, ToolReturnPart)
    assert (answer.content, answer.outcome) == (INTERRUPTED_TOOL_ERROR, "failed")


def test_usage_without_values_is_none() -> None:
    assert usage_from_pydantic_ai(RequestUsage()) is None


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    monkeypatch.delitem(sys.modules, integration.__name__)
    with pytest.raises(ImportError, match=r'pip install "mimo-ctx\[pydantic-ai\]"'):
        __import__(integration.__name__)


async def test_streamed_runs_are_stored_once_with_usage(tmp_path: Path) -> None:
    """``run_stream`` goes through the same hooks: each streamed response is
    recorded with its usage, and the next sync does not store it again."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done < 3:
            yield {0: DeltaToolCall(name="read", json_args=f'{{"file_path": "m{done}.py"}}')}
        else:
            yield "All "
            yield "done."

    async with running(tmp_path) as engine:
        agent = Agent(
            FunctionModel(stream_function=stream),
            capabilities=[MimoCtxCapability(engine.middleware, session_id="s1")],
        )

        @agent.tool_plain
        def read(file_path: str) -> str:
            """Read a file."""
            return filler_text(200)

        async with agent.run_stream(TASK) as streamed:
            assert await streamed.get_output() == "All done."
        stored = await engine.store.list_messages("s1", agent=None)
        assert [m.role for m in stored] == ["user", *["assistant", "tool"] * 3, "assistant"]
        assert all(m.usage is not None for m in stored if m.role == "assistant")


async def test_r1_4a_sub_agent_gets_a_plain_compaction(tmp_path: Path) -> None:
    """A sub-agent's history crossing the line is compacted, not rebuilt (R1.4a):
    its model gets "Summary of previous conversation:" first."""
    async with running(tmp_path) as engine:
        await engine.middleware.open_session("s1", system=SYSTEM)
        model = ScriptedFunction(rounds=36)
        agent = build_agent(engine, model, session_id="s1", agent="explore")
        result = await agent.run(TASK)
        assert result.output == FINAL_ANSWER
        stored = await engine.store.list_messages("s1", agent="explore")
        boundaries = [m for m in stored if m.is_boundary]
        assert len(boundaries) == 1
        assert boundaries[0].checkpoint_part is None  # a compaction, not a rebuild
        compacted = next(
            r for r in model.received if first_prompt(r).startswith(COMPACTION_SUMMARY_HEADER)
        )
        assert_pydantic_ai_pairs(compacted)
        assert await engine.store.list_messages("s1", agent="main") == []


async def test_carried_messages_follow_the_watermark(tmp_path: Path) -> None:
    """A message holding only carried parts is sent while it is live and hidden with
    everything else once a rebuild's watermark passes it (R8.2)."""
    async with running(tmp_path) as engine:
        summary = CompactionPart(content="Earlier: modules 1-9 refactored.")
        history: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(content=TASK)]),
            ModelResponse(parts=[TextPart(content="On it.")]),
            ModelRequest(parts=[summary]),
        ]
        model = ScriptedFunction(rounds=36)
        agent = build_agent(engine, model, session_id="s1")
        await agent.run("Continue.", message_history=history)

        def carries(request: Sequence[ModelMessage]) -> bool:
            return any(p is summary for m in request for p in m.parts)

        index = rebuilt_index(model)
        assert all(carries(r) for r in model.received[:index])
        assert not any(carries(r) for r in model.received[index:])


async def test_r8_3_per_turn_reminder_is_sent_never_stored(tmp_path: Path) -> None:
    """With memory files the last user prompt carries the per-turn reminder in the
    request only: not in the run's history, not in the store (R8.3, A12)."""
    notes = tmp_path / "memory" / "sessions" / "s1" / "notes.md"
    notes.parent.mkdir(parents=True)
    notes.write_text("- the API moved to v2\n", encoding="utf-8")
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=2)
        agent = build_agent(engine, model, session_id="s1")
        result = await agent.run(TASK)
        for request in model.received:
            head = request[0]
            assert isinstance(head, ModelRequest)
            prompts = [p for p in head.parts if isinstance(p, UserPromptPart)]
            assert [p.content for p in prompts[:1]] == [TASK]
            assert len(prompts) == 2
            assert str(prompts[1].content).startswith(PER_TURN_MARKER)
            assert_pydantic_ai_pairs(request)
        history = result.all_messages()
        assert all(
            PER_TURN_MARKER not in str(getattr(p, "content", "")) for m in history for p in m.parts
        )
        stored = await engine.store.list_messages("s1", agent=None)
        assert all(
            PER_TURN_MARKER not in p.text
            for m in stored
            for p in m.parts
            if isinstance(p, CtxTextPart)
        )


async def test_rebuild_command_with_focus_rebuilds_without_calling_the_model(
    tmp_path: Path,
) -> None:
    """``/rebuild <focus>``: a manual rebuild (no model turn), the focus kept verbatim
    in its own body section of the next request."""
    focus = "Keep the parser refactor in view; the CLI work is done."
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=6)
        agent = build_agent(engine, model, session_id="s-focus")
        first = await agent.run(TASK)
        calls = len(model.received)

        result = await agent.run(f"/rebuild {focus}", message_history=first.all_messages())
        assert len(model.received) == calls  # the model was not asked
        assert result.output.startswith("Context rebuild: rebuilt")
        assert len(engine.rebuilds) == 1
        assert engine.rebuilds[0].manual

        model.rounds = model.answered
        await agent.run("Carry on.", message_history=result.all_messages())
        body = first_prompt(model.received[-1])
        assert body.startswith(CHECKPOINT_SUMMARY_HEADER)
        assert (
            f"# Rebuild focus\nWhat the user asked this rebuild to focus on, verbatim:\n{focus}\n"
            in body
        )
        assert body.index("# Rebuild focus") < body.index("# Tasks ledger")
        assert len(engine.rebuilds) == 1  # the command's reply did not trigger another


async def test_rebuild_command_lookalike_is_sent_to_the_model(tmp_path: Path) -> None:
    async with running(tmp_path) as engine:
        model = ScriptedFunction(rounds=0)
        agent = build_agent(engine, model, session_id="s-look")
        await agent.run("/rebuilding the parser?")
        assert len(model.received) == 1
        assert engine.rebuilds == []
