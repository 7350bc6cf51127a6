"""The incremental view equals the full recompute at every step (SPEC R7.3, A10, R8).

:class:`mimo_ctx.view.IncrementalView` keeps ``apply_send_rules(collapse(...))``
current while messages are appended, taken back and replaced. Random histories
draw call ids from a small pool, so results answer earlier pending calls (and
re-send them), answer nothing, repeat, arrive before their call or inside the
calling message; messages fail, are aborted, hold ignored text and compacted
results; boundaries digest a range of ids. After each operation the view, its
token sum and its last user message are exactly the full recompute's.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.digest import collapse_checkpoint_tail
from mimo_ctx.messages import (
    CheckpointPart,
    Message,
    MessageError,
    OpaquePart,
    Part,
    Role,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    ToolTime,
)
from mimo_ctx.tokens import estimate_message_tokens
from mimo_ctx.view import IncrementalView, apply_send_rules

_CALLS = [f"c{i}" for i in range(5)]
_call_ids = st.sampled_from(_CALLS)


def _tool_part(call: str, kind: str, compacted: bool) -> ToolPart:
    if kind == "pending":
        return ToolPart(call_id=call, tool="read", state=ToolStatePending(input={"p": call}))
    if kind == "running":
        return ToolPart(
            call_id=call,
            tool="read",
            state=ToolStateRunning(input={}, time=ToolTime(start=1)),
        )
    if kind == "error":
        return ToolPart(call_id=call, tool="bash", state=ToolStateError(input={}, error="boom"))
    return ToolPart(
        call_id=call,
        tool="read",
        state=ToolStateCompleted(
            input={"p": call},
            output="o" * 30,
            time=ToolTime(start=1, end=2, compacted=3 if compacted else None),
        ),
    )


_tool_parts = st.builds(
    _tool_part,
    _call_ids,
    st.sampled_from(["pending", "pending", "running", "completed", "error"]),
    st.booleans(),
)


def _result_part(call: str, error: bool, compacted: bool) -> ToolResultPart:
    return ToolResultPart(
        call_id=call,
        tool="read",
        output="r" * 20,
        is_error=error,
        time=ToolTime(start=1, end=2, compacted=5 if compacted else None),
    )


_result_parts = st.builds(_result_part, _call_ids, st.booleans(), st.booleans())
_text_parts = st.builds(
    TextPart,
    text=st.sampled_from(["", "hi", "a longer piece of text"]),
    ignored=st.booleans(),
    synthetic=st.booleans(),
)
_ROLES: list[Role] = ["user", "assistant", "assistant", "tool"]
_any_parts: st.SearchStrategy[Part] = st.one_of(
    _tool_parts, _result_parts, _text_parts, st.just(OpaquePart(source="t", kind="x"))
)


@st.composite
def _message(draw: st.DrawFn, index: int) -> Message:
    role = draw(st.sampled_from(_ROLES))
    parts: list[Part]
    if role == "assistant":
        parts = draw(st.lists(_any_parts, max_size=3))
    elif role == "tool":
        parts = draw(st.lists(_result_parts, min_size=1, max_size=2))
    else:
        parts = draw(st.lists(st.one_of(_text_parts, _result_parts), min_size=1, max_size=2))
    error = None
    if role == "assistant" and draw(st.integers(0, 5)) == 0:
        error = MessageError(name="x", aborted=draw(st.booleans()))
    return Message(
        id=f"msg_{index:04d}",
        session_id="ses_x",
        role=role,
        time_created=1000 + index,
        finish="tool-calls" if role == "assistant" else None,
        error=error,
        parts=parts or [TextPart(text="x")],
    )


def _boundary(covered: int | None, digest: int | None) -> Message:
    return Message(
        id="msg_9999",
        session_id="ses_x",
        role="user",
        time_created=999,
        parts=[
            CheckpointPart(
                covered_up_to=f"msg_{covered:04d}" if covered is not None else "msg_0000",
                digest_up_to=f"msg_{digest:04d}" if digest is not None else None,
            ),
            TextPart(text="body", synthetic=True),
        ],
    )


def _reference(boundary: Message | None, messages: list[Message]) -> tuple[list[Message], int]:
    ordered = [boundary, *messages] if boundary is not None else list(messages)
    sent = apply_send_rules(collapse_checkpoint_tail(ordered))
    return sent, sum(estimate_message_tokens(m) for m in sent)


_OPS = st.lists(
    st.tuples(st.sampled_from(["append", "append", "replace", "insert", "drop"]), st.integers()),
    min_size=1,
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), ops=_OPS, shape=st.sampled_from(["none", "plain", "digest"]))
def test_r8_incremental_view_equals_the_full_recompute(
    data: st.DataObject, ops: list[tuple[str, int]], shape: str
) -> None:
    boundary = None
    if shape == "plain":
        boundary = _boundary(None, None)
    elif shape == "digest":
        boundary = _boundary(data.draw(st.integers(0, 5)), data.draw(st.integers(3, 12)))
    counter = iter(range(1, 10_000))
    messages = [data.draw(_message(next(counter))) for _ in range(data.draw(st.integers(0, 6)))]
    engine = IncrementalView(boundary, messages, estimate_message_tokens)
    rebuilt = 0
    offset = boundary is not None
    for op, where in ops:
        at = where % (len(messages) + 1)
        if op == "append":
            new = [data.draw(_message(next(counter))) for _ in range(data.draw(st.integers(1, 3)))]
            messages.extend(new)
            ok = engine.extend(new)
        elif op == "drop" and messages:
            at = min(at, len(messages) - 1)
            del messages[at:]
            ok = engine.truncate(at + offset)
        elif op in ("replace", "insert") and messages:
            at = min(at, len(messages) - 1)
            fresh = data.draw(_message(next(counter)))
            if op == "replace":
                # An update: same place, new content (what update_messages writes).
                fresh = fresh.model_copy(update={"id": messages[at].id})
                messages[at] = fresh
            else:
                messages.insert(at, fresh)
            ok = engine.truncate(at + offset) and engine.extend(messages[at:])
        else:
            continue
        if not ok:
            rebuilt += 1
            engine = IncrementalView(boundary, messages, estimate_message_tokens)
        want, tokens = _reference(boundary, messages)
        assert [m.model_dump() for m in engine.messages] == [m.model_dump() for m in want]
        # The count is made when read: read it after some steps only, so that steps
        # also undo and re-send outputs nobody counted yet.
        if data.draw(st.booleans()):
            assert engine.tokens == tokens
        users = [i for i, m in enumerate(want) if m.role == "user"]
        assert engine.users[-1:] == users[-1:]
        assert engine.count == len(messages) + offset or rebuilt
    assert engine.tokens == _reference(boundary, messages)[1]
    if shape != "digest":
        # Only a digested message with tool calls can force a new build.
        assert rebuilt == 0


def test_r8_a_result_re_sends_its_pending_call_and_taking_it_back_restores_it() -> None:
    """A split result answers a pending call sent as interrupted earlier: the earlier
    message is sent again with its call as it is; truncating the result undoes it."""
    call = Message(
        id="msg_0001",
        session_id="ses_x",
        role="assistant",
        time_created=1,
        finish="tool-calls",
        parts=[_tool_part("c1", "pending", False)],
    )
    engine = IncrementalView(None, [call], estimate_message_tokens)
    interrupted = engine.messages[0]
    part = interrupted.parts[0]
    assert isinstance(part, ToolPart)
    assert isinstance(part.state, ToolStateError)
    result = Message(
        id="msg_0002",
        session_id="ses_x",
        role="tool",
        time_created=2,
        parts=[ToolResultPart(call_id="c1", tool="read", output="r")],
    )
    assert engine.extend([result])
    assert engine.messages[0] is call
    assert engine.tokens == _reference(None, [call, result])[1]
    assert engine.truncate(1)
    assert engine.messages == [interrupted]
    assert engine.tokens == estimate_message_tokens(interrupted)


def test_r8_a_call_answered_in_the_same_extension_is_counted_once() -> None:
    """A call and its split result taken in together: the call is not counted in its
    interrupted form first (nobody reads that count); taking the result back without
    a read in between gives the interrupted form's count."""
    call = Message(
        id="msg_0001",
        session_id="ses_x",
        role="assistant",
        time_created=1,
        finish="tool-calls",
        parts=[_tool_part("c1", "pending", False)],
    )
    result = Message(
        id="msg_0002",
        session_id="ses_x",
        role="tool",
        time_created=2,
        parts=[ToolResultPart(call_id="c1", tool="read", output="r")],
    )
    counted: list[Message] = []

    def estimate(message: Message) -> int:
        counted.append(message)
        return estimate_message_tokens(message)

    engine = IncrementalView(None, [], estimate)
    assert engine.extend([call, result])
    assert engine.messages == [call, result]
    assert engine.tokens == _reference(None, [call, result])[1]
    assert counted == [call, result]
    assert engine.truncate(1)
    interrupted = _reference(None, [call])[0]
    assert [m.model_dump() for m in engine.messages] == [m.model_dump() for m in interrupted]
    assert engine.extend([result])
    assert engine.truncate(1)
    assert engine.tokens == estimate_message_tokens(interrupted[0])


def test_r8_a_call_whose_answer_in_the_extension_is_not_sent_is_interrupted() -> None:
    """A pending call whose result comes in the same extension is sent as it is from
    the start; when that result is not sent after all (its message failed), the call
    is interrupted at the end of the extension, and a later answer re-sends it."""
    call = Message(
        id="msg_0001",
        session_id="ses_x",
        role="assistant",
        time_created=1,
        finish="tool-calls",
        parts=[_tool_part("c1", "pending", False), _tool_part("c2", "pending", False)],
    )
    failed = Message(
        id="msg_0002",
        session_id="ses_x",
        role="assistant",
        time_created=2,
        error=MessageError(name="x", aborted=False),
        parts=[ToolResultPart(call_id="c1", tool="read", output="r")],
    )
    answer = Message(
        id="msg_0003",
        session_id="ses_x",
        role="tool",
        time_created=3,
        parts=[
            ToolResultPart(call_id="c2", tool="read", output="r2"),
            ToolResultPart(call_id="c1", tool="read", output="r1"),
        ],
    )
    engine = IncrementalView(None, [], estimate_message_tokens)
    assert engine.extend([call, failed])
    want, tokens = _reference(None, [call, failed])
    assert [m.model_dump() for m in engine.messages] == [m.model_dump() for m in want]
    assert engine.tokens == tokens
    assert engine.extend([answer])
    assert engine.messages[0] is call
    assert engine.tokens == _reference(None, [call, failed, answer])[1]
    assert engine.truncate(0)
    # All three at once: c2 and c1 are answered by the last message.
    assert engine.extend([call, failed, answer])
    assert engine.messages[0] is call
    assert engine.truncate(2)
    want, tokens = _reference(None, [call, failed])
    assert [m.model_dump() for m in engine.messages] == [m.model_dump() for m in want]
    assert engine.tokens == tokens
