"""Properties of the framework converters over generated histories (SPEC A10, R2.6).

Whatever a stored history holds (inline and split tool results, reasoning, files,
sub-task requests, interrupted calls), the messages built for pydantic-ai and for
LangChain answer every tool call right after it, load back into the framework's
own types, and keep the conversation's tool calls and text in order.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from pydantic_ai.messages import ModelMessagesTypeAdapter
from strategies import sessions

from mimo_ctx.integrations.langchain import from_langchain_messages, to_langchain_messages
from mimo_ctx.integrations.pydantic_ai import from_model_messages, to_model_messages
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart, ToolPart, ToolResultPart
from mimo_ctx.view import apply_send_rules

from .fakes import assert_langchain_pairs, assert_pydantic_ai_pairs

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def main_line(session: list[Message]) -> list[Message]:
    return [m for m in session if m.agent == MAIN_AGENT]


def call_ids(messages: list[Message]) -> list[str]:
    return [p.call_id for m in messages for p in m.parts if isinstance(p, ToolPart)]


def user_texts(messages: list[Message]) -> list[str]:
    return [
        p.text
        for m in messages
        if m.role == "user"
        for p in m.parts
        if isinstance(p, TextPart) and p.text
    ]


@SETTINGS
@given(sessions(max_turns=4, max_text_chars=200, max_output_chars=200))
def test_a10_pydantic_ai_requests_are_valid_and_keep_the_conversation(
    session: list[Message],
) -> None:
    history = main_line(session)
    sent = to_model_messages(history)
    assert_pydantic_ai_pairs(sent)
    # pydantic-ai's own adapter takes them back.
    assert ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(sent))
    back = from_model_messages(sent, session_id="s")
    view = apply_send_rules(history)
    assert call_ids(back) == call_ids(view)
    answered = {p.call_id for m in back for p in m.parts if isinstance(p, ToolResultPart)}
    assert answered == set(call_ids(view))
    # User text survives (several texts of one message travel as one prompt).
    assert "".join(user_texts(back)) == "".join(user_texts(view))


@SETTINGS
@given(sessions(max_turns=4, max_text_chars=200, max_output_chars=200))
def test_a10_langchain_messages_are_valid_and_keep_the_conversation(
    session: list[Message],
) -> None:
    history = main_line(session)
    sent = to_langchain_messages(history)
    assert_langchain_pairs(sent)
    back = from_langchain_messages(sent, session_id="s")
    view = apply_send_rules(history)
    assert call_ids(back) == call_ids(view)
    answered = {p.call_id for m in back for p in m.parts if isinstance(p, ToolResultPart)}
    assert answered == set(call_ids(view))
    assert "".join(user_texts(back)) == "".join(user_texts(view))
