"""The provider-independent pieces of the wrappers: boundary marking, retry, native context.

Which host messages a call stores is the reconciler's (tests/test_reconcile.py and
tests/test_host_history_equivalence.py); the incremental payload is tested in
tests/providers/test_payload.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_servers import running_middleware

from mimo_ctx.errors import ContextOverflowError, InvalidRequestError
from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    Message,
    TextPart,
)
from mimo_ctx.middleware import RequestView
from mimo_ctx.providers._payload import mark_boundary
from mimo_ctx.providers._sync import RecoveringCall, native_context_parameter
from mimo_ctx.providers.anthropic import to_anthropic
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.store.base import RequestPrefix
from mimo_ctx.view import apply_send_rules

SID = "ses_sync"


def _view(messages: list[Message], boundary_id: str | None) -> RequestView:
    return RequestView(
        session_id=SID,
        agent="main",
        prefix=RequestPrefix(),
        messages=apply_send_rules(messages),
        tokens=0,
        boundary_id=boundary_id,
    )


@pytest.mark.parametrize(
    "marker",
    [CheckpointPart(covered_up_to="msg_w"), CompactionPart(summary="All done so far.")],
    ids=["checkpoint", "compaction"],
)
def test_r8_1_boundary_is_sent_as_one_text(marker: CheckpointPart | CompactionPart) -> None:
    """The view has the send rules applied; mark_boundary lets the converters see the
    boundary again, so it is sent as one text (OpenAI and Anthropic)."""
    boundary = Message(
        session_id=SID,
        role="user",
        time_created=1,
        parts=[marker, TextPart(text="## Checkpoint", synthetic=True), TextPart(text="body")],
    )
    later = Message(session_id=SID, role="user", time_created=2, parts=[TextPart(text="next")])
    view = _view([boundary, later], boundary.id)
    restored = [mark_boundary(view.messages[0]), view.messages[1]]
    assert restored[0].is_boundary
    assert apply_send_rules(restored) == view.messages  # same text once the rules apply
    header = to_openai_chat([boundary])[0]["content"]
    assert isinstance(header, str)
    assert to_openai_chat(restored)[0] == {"role": "user", "content": header}
    _, turns = to_anthropic(restored)
    assert turns[0]["content"][0] == {"type": "text", "text": header}
    assert mark_boundary(later) is later


@pytest.mark.parametrize(
    ("kwargs", "api", "found"),
    [
        ({"previous_response_id": "resp_1"}, "responses", "previous_response_id='resp_1'"),
        ({"conversation": "conv_1"}, "responses", "conversation='conv_1'"),
        ({"truncation": "auto"}, "responses", "truncation='auto'"),
        ({"truncation": "disabled"}, "responses", None),
        (
            {"extra_body": {"context_management": [{"type": "compaction"}]}},
            "responses",
            "context_management=...",
        ),
        ({"context_management": {"edits": []}}, "messages", "context_management=..."),
        (
            {"extra_headers": {"anthropic-beta": "x-1, context-management-2025-06-27"}},
            "messages",
            "anthropic-beta: context-management-2025-06-27",
        ),
        (
            {"extra_headers": {"anthropic-beta": "compact-2026-01-12"}},
            "messages",
            "anthropic-beta: compact-2026-01-12",
        ),
        ({"extra_headers": {"anthropic-beta": "files-api-2025-04-14"}}, "messages", None),
        ({"temperature": 0}, "chat", None),
    ],
)
def test_native_context_management_is_detected(
    kwargs: dict[str, object], api: str, found: str | None
) -> None:
    assert native_context_parameter(kwargs, api=api) == found


async def test_our_own_errors_are_never_taken_for_an_overflow(tmp_path: Path) -> None:
    """A validator error naming a call id "context_length_exceeded" propagates as it is:
    no rebuild, nothing sent."""
    async with running_middleware(tmp_path) as mw:
        await mw.open_session(SID)
        sent: list[object] = []

        def build(view: RequestView) -> object:
            raise InvalidRequestError("tool call 'context_length_exceeded' has no result")

        async def send(payload: object) -> object:
            sent.append(payload)
            return payload

        call = RecoveringCall(mw, SID, agent="main", build=build, send=send)
        with pytest.raises(InvalidRequestError):
            await call.run()
        assert sent == []
        assert not call.retried


async def test_a_second_overflow_of_one_call_is_raised(tmp_path: Path) -> None:
    async with running_middleware(tmp_path) as mw:
        await mw.open_session(SID)
        await mw.add_user_message(SID, "hi")
        errors = [RuntimeError("context_length_exceeded"), RuntimeError("prompt is too long")]

        async def send(payload: object) -> object:
            raise errors.pop(0)

        call = RecoveringCall(mw, SID, agent="main", build=lambda view: view, send=send)
        with pytest.raises(ContextOverflowError) as info:
            await call.run()
        assert str(info.value.__cause__) == "prompt is too long"
        assert errors == []
