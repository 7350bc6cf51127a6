"""Offline fake models for the framework integration tests (no network anywhere).

Both fakes answer like :class:`mimo_ctx.testing.ScriptedModel`: a scripted
number of ``read`` tool calls, then a final answer; they report usage the way a
provider does (the request's size as input tokens), record every request, and
can raise a provider-shaped overflow error (:class:`~mimo_ctx.testing.FakeOverflowError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, message_to_dict
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.usage import RequestUsage

from mimo_ctx.testing import FakeOverflowError

FINAL_ANSWER = "All modules refactored."


def pydantic_ai_tokens(messages: Sequence[ModelMessage]) -> int:
    """What a provider would report as input tokens: the JSON size / 4."""
    return len(ModelMessagesTypeAdapter.dump_json(list(messages))) // 4


def langchain_tokens(messages: Sequence[BaseMessage]) -> int:
    """What a provider would report as input tokens: the JSON size / 4."""
    return sum(len(json.dumps(message_to_dict(m), default=str)) for m in messages) // 4


@dataclass
class ScriptedFunction:
    """A pydantic-ai ``FunctionModel`` function: ``rounds`` reads, then the final answer.

    Attributes:
        rounds: How many ``read`` calls before the final answer.
        overflow_above: Raise an overflow for requests larger than this (tokens).
        overflow_from: Raise an overflow for every request from this call on (1-based).
        fail_with: Raise this error on the first call.
    """

    rounds: int
    overflow_above: int | None = None
    overflow_from: int | None = None
    fail_with: Exception | None = None
    received: list[list[ModelMessage]] = field(default_factory=list[list[ModelMessage]])
    overflow_errors: int = 0
    answered: int = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.received.append(list(messages))
        if self.fail_with is not None:
            raise self.fail_with
        tokens = pydantic_ai_tokens(messages)
        over = self.overflow_above is not None and tokens > self.overflow_above
        if over or (self.overflow_from is not None and len(self.received) >= self.overflow_from):
            self.overflow_errors += 1
            raise FakeOverflowError(tokens, self.overflow_above or 200_000)
        self.answered += 1
        usage = RequestUsage(input_tokens=tokens, output_tokens=25)
        if self.answered <= self.rounds:
            call = ToolCallPart("read", {"file_path": f"src/m{self.answered}.py"})
            return ModelResponse(parts=[call], usage=usage)
        return ModelResponse(parts=[TextPart(FINAL_ANSWER)], usage=usage)


def assert_pydantic_ai_pairs(messages: Sequence[ModelMessage]) -> None:
    """Every tool call is answered in the next request; every return answers a call."""
    for index, message in enumerate(messages):
        if isinstance(message, ModelResponse):
            calls = {p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart)}
            if not calls:
                continue
            following = messages[index + 1]
            assert isinstance(following, ModelRequest), f"calls of message {index} unanswered"
            returns = {p.tool_call_id for p in following.parts if isinstance(p, ToolReturnPart)}
            assert calls <= returns, f"calls {calls - returns} of message {index} unanswered"
        else:
            previous = messages[index - 1] if index else None
            called: set[str] = set()
            if isinstance(previous, ModelResponse):
                called = {p.tool_call_id for p in previous.parts if isinstance(p, ToolCallPart)}
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    assert part.tool_call_id in called, f"orphan return in message {index}"


class ScriptedChatModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` with tools bound, usage reported and requests recorded."""

    rounds: int = 40
    overflow_above: int | None = None
    overflow_from: int | None = None
    fail_with: Exception | None = None
    received: list[list[BaseMessage]] = Field(default_factory=list[list[BaseMessage]])
    overflow_errors: int = 0
    answered: int = 0

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.received.append(list(messages))
        if self.fail_with is not None:
            raise self.fail_with
        tokens = langchain_tokens(messages)
        over = self.overflow_above is not None and tokens > self.overflow_above
        if over or (self.overflow_from is not None and len(self.received) >= self.overflow_from):
            self.overflow_errors += 1
            raise FakeOverflowError(tokens, self.overflow_above or 200_000)
        self.answered += 1
        usage = {"input_tokens": tokens, "output_tokens": 25, "total_tokens": tokens + 25}
        if self.answered <= self.rounds:
            call = {
                "name": "read",
                "args": {"file_path": f"src/m{self.answered}.py"},
                "id": f"call_{len(self.received)}",
                "type": "tool_call",
            }
            message = AIMessage(content="", tool_calls=[call], usage_metadata=usage)
        else:
            message = AIMessage(content=FINAL_ANSWER, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=message)])


def assert_langchain_pairs(messages: Sequence[BaseMessage]) -> None:
    """Tool calls are answered right after their message; every result answers a call."""
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            assert message.tool_call_id in open_calls, f"orphan tool message {index}"
            open_calls.discard(message.tool_call_id)
            continue
        assert not open_calls, f"calls {open_calls} unanswered before message {index}"
        if isinstance(message, AIMessage):
            open_calls = {c["id"] for c in message.tool_calls if c["id"]}
    assert not open_calls, f"calls {open_calls} unanswered at the end"
