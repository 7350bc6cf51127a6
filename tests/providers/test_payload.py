"""The incremental payload builder (issue 16, build 4): built in O(new messages), equal to the
whole conversion every time.

Random sequences of views (growing, a suffix replaced by new objects, a last
message rewritten as a copy like the per-turn reminder, the boundary moving) are
built incrementally and compared with converting and validating the whole view.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.messages import (
    Message,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStatePending,
)
from mimo_ctx.providers._payload import Convert, PayloadBuilder, SentList, mark_boundary
from mimo_ctx.providers.anthropic import anthropic_turns
from mimo_ctx.providers.openai import to_openai_chat, to_openai_responses
from mimo_ctx.providers.validate import RequestFormat, RequestValidator, validate_request
from mimo_ctx.view import apply_send_rules

SID = "ses_payload"
FORMATS: dict[RequestFormat, tuple[Convert, Callable[[Any, Any], bool] | None]] = {
    "openai-chat": (lambda run, previous: to_openai_chat(run), None),
    "openai-responses": (lambda run, previous: to_openai_responses(run), None),
    "anthropic": (
        lambda run, previous: anthropic_turns(run, first=previous is None, shorthand=True),
        lambda a, b: a["role"] == b["role"],
    ),
}


def _turn(n: int, kind: str) -> list[Message]:
    if kind == "text":
        return [
            Message(session_id=SID, role="user", time_created=n, parts=[TextPart(text=f"u{n}")]),
            Message(
                session_id=SID,
                role="assistant",
                time_created=n,
                finish="stop",
                parts=[TextPart(text=f"a{n}")],
            ),
        ]
    if kind == "user":
        return [
            Message(session_id=SID, role="user", time_created=n, parts=[TextPart(text=f"w{n}")])
        ]
    call = ToolPart(call_id=f"c{n}", tool="read", state=ToolStatePending(input={"n": n}))
    return [
        Message(session_id=SID, role="user", time_created=n, parts=[TextPart(text=f"u{n}")]),
        Message(
            session_id=SID, role="assistant", time_created=n, finish="tool-calls", parts=[call]
        ),
        Message(
            session_id=SID,
            role="tool",
            time_created=n,
            parts=[ToolResultPart(call_id=f"c{n}", tool="read", output=f"r{n}")],
        ),
    ]


def _step(
    stored: list[Message], number: int, op: str, kind: str
) -> tuple[list[Message], list[Message]]:
    """The stored history after one step (``replace`` and ``unseen`` drop its second half
    first; ``copy_last`` sends an equal copy of the view's last message) and its view."""
    if op in ("replace", "unseen") and stored:
        stored = stored[: len(stored) // 2]
    stored = [*stored, *_turn(number, kind)]
    view = apply_send_rules(stored)
    if op == "copy_last" and view:
        view = [*view[:-1], view[-1].model_copy(update={"parts": list(view[-1].parts)})]
    return stored, view


steps = st.lists(
    st.tuples(
        st.sampled_from(["grow", "replace", "copy_last"]), st.sampled_from(["text", "tool", "user"])
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=60)
@given(steps=steps, fmt=st.sampled_from(sorted(FORMATS)))
def test_incremental_payload_equals_the_whole_conversion(
    steps: list[tuple[str, str]], fmt: RequestFormat
) -> None:
    convert, merges = FORMATS[fmt]
    builder = PayloadBuilder(fmt, convert, merges=merges)
    stored: list[Message] = []
    for number, (op, kind) in enumerate(steps):
        stored, view = _step(stored, number, op, kind)
        built = builder.build(view, None)
        assert built == convert(view, None)
        validate_request(built, format=fmt)
        assert builder.converted <= len(view)


sent_steps = st.lists(
    st.tuples(
        st.sampled_from(["grow", "replace", "copy_last", "fail", "unseen"]),
        st.sampled_from(["text", "tool", "user"]),
        st.sampled_from([0, 1, 2]),  # which head (host system items) the call has
        st.booleans(),  # the caller marks the last entry (the Anthropic breakpoint)
    ),
    min_size=1,
    max_size=12,
)
HEADS: list[list[dict[str, str]]] = [
    [],
    [{"role": "system", "content": "s1"}],
    [{"role": "system", "content": "s1"}, {"role": "system", "content": "s2"}],
]


@settings(max_examples=80)
@given(steps=sent_steps, fmt=st.sampled_from(sorted(FORMATS)))
def test_the_sent_list_is_one_list_equal_to_head_and_entries(
    steps: list[tuple[str, str, int, bool]], fmt: RequestFormat
) -> None:
    """Whatever the views, heads and in-place marks of successive calls (and builds that
    fail, or that the list does not follow, in between), the one list equals the head
    then the builder's entries."""
    convert, merges = FORMATS[fmt]
    builder = PayloadBuilder(fmt, convert, merges=merges)
    sent = SentList()
    stored: list[Message] = []
    first: list[Any] | None = None
    for number, (op, kind, head_of, mark) in enumerate(steps):
        if op == "fail":
            # A tool result without its call: the builder refuses it and starts over.
            orphan = ToolResultPart(call_id="nowhere", tool="read", output="x")
            broken = [
                *apply_send_rules(stored),
                Message(session_id=SID, role="tool", time_created=number, parts=[orphan]),
            ]
            with contextlib.suppress(InvalidRequestError):
                builder.build(broken, None)
            continue
        stored, view = _step(stored, number, op, kind)
        if op == "unseen":
            # Another build of the session's builder, on a history that parts from
            # the one the list holds; this call's view extends that one.
            builder.build(view, None)
            stored = [*stored, *_turn(number + 100, "text")]
            view = apply_send_rules(stored)
        head = HEADS[head_of]
        entries = builder.build(view, None)
        items = sent.update(head, entries, builder)
        assert items == [*head, *entries]
        first = items if first is None else first
        assert items is first
        if mark and items:
            sent.last_replaced()
            items[-1] = {"marked": number}


def test_a_grown_view_converts_only_what_is_new() -> None:
    convert, _ = FORMATS["openai-chat"]
    builder = PayloadBuilder("openai-chat", convert)
    stored = [m for n in range(50) for m in _turn(n, "tool")]
    builder.build(apply_send_rules(stored), None)
    assert builder.converted == 150
    grown = [*stored, *_turn(50, "text")]
    view = apply_send_rules(stored)
    view = [*view, *apply_send_rules(grown[150:])]
    builder.build(view, None)
    assert builder.converted == 2


def test_the_boundary_is_marked_and_a_new_boundary_converts_all() -> None:
    convert, _ = FORMATS["openai-chat"]
    builder = PayloadBuilder("openai-chat", convert)
    stored = [m for n in range(3) for m in _turn(n, "text")]
    view = apply_send_rules(stored)
    builder.build(view, None)
    builder.build(view, view[0].id)
    assert builder.converted == len(view)
    assert mark_boundary(view[1]) is view[1]


def test_an_invalid_payload_is_refused_and_the_builder_starts_over() -> None:
    def broken(run: Any, previous: Any) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": "nobody", "content": "x"}]

    builder = PayloadBuilder("openai-chat", broken)
    view = apply_send_rules(_turn(0, "text"))
    with pytest.raises(InvalidRequestError, match="nobody"):
        builder.build(view, None)
    with pytest.raises(InvalidRequestError, match="nobody"):
        builder.build(view, None)


@given(st.lists(st.integers(0, 3), max_size=12), st.integers(0, 12))
def test_validator_fed_in_pieces_equals_the_whole_check(kinds: list[int], cut: int) -> None:
    entries: list[dict[str, Any]] = []
    for n, kind in enumerate(kinds):
        if kind == 0:
            entries.append({"role": "user", "content": f"u{n}"})
        elif kind == 1:
            entries.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"c{n}",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                }
            )
        elif kind == 2:
            entries.append({"role": "tool", "tool_call_id": f"c{n - 1}", "content": "r"})
        else:
            entries.append({"role": "assistant", "content": "a"})
    try:
        validate_request(entries, format="openai-chat")
        whole = None
    except InvalidRequestError as exc:
        whole = str(exc)
    validator = RequestValidator("openai-chat")
    try:
        validator.feed(entries[:cut])
        mark = validator.mark()
        with contextlib.suppress(InvalidRequestError):  # a first pass, then back (a rebuilt batch)
            validator.feed(entries[cut:])
        validator.reset(mark)
        validator.feed(entries[cut:])
        validator.finish()
        pieces = None
    except InvalidRequestError as exc:
        pieces = str(exc)
    assert pieces == whole


def test_a_view_list_changed_in_place_after_a_build_is_seen() -> None:
    """The builder compares with its own copy of the last view, not the caller's list."""
    convert, _ = FORMATS["openai-chat"]
    builder = PayloadBuilder("openai-chat", convert)
    view = apply_send_rules([m for n in range(4) for m in _turn(n, "text")])
    builder.build(view, None)
    view[2] = view[2].model_copy(update={"parts": [TextPart(text="edited")]})
    assert builder.build(view, None) == convert(view, None)
    view.extend(apply_send_rules(_turn(4, "text")))
    assert builder.build(view, None) == convert(view, None)
    assert builder.converted == 2


def test_a_build_that_failed_after_growing_leaves_the_next_one_right() -> None:
    convert, _ = FORMATS["openai-chat"]
    failing = [True]

    def flaky(run: Any, previous: Any) -> list[Any]:
        if failing[0] and any(m.parts and getattr(m.parts[0], "text", "") == "u3" for m in run):
            raise InvalidRequestError("not now")
        return convert(run, previous)

    builder = PayloadBuilder("openai-chat", flaky)
    stored = [m for n in range(3) for m in _turn(n, "text")]
    view = apply_send_rules(stored)
    builder.build(view, None)
    grown = [*view, *apply_send_rules(_turn(3, "text"))]
    with pytest.raises(InvalidRequestError, match="not now"):
        builder.build(grown, None)
    failing[0] = False
    other = [*view, *apply_send_rules(_turn(9, "text"))]  # the host went another way
    assert builder.build(other, None) == convert(other, None)
    assert builder.converted == 2


def test_responses_shorthand_is_the_same_request() -> None:
    """One plain text per message goes as the API's shorthand; the rest is unchanged, and
    reading the shorthand back gives the same history."""
    from mimo_ctx.providers.openai import drafts_from_openai_responses

    view = apply_send_rules(
        [m for n, k in enumerate(["text", "tool", "text"]) for m in _turn(n, k)]
    )
    long = to_openai_responses(view)
    short = to_openai_responses(view, shorthand=True)
    assert short[0] == {"role": "user", "content": "u0"}
    assert short[1] == {"role": "assistant", "content": "a0"}
    assert [i for i in short if "type" in i] == [i for i in long if i.get("role") is None]
    validate_request(short, format="openai-responses")

    def texts(items: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
        return [
            (d.role, [getattr(p, "text", type(p).__name__) for p in d.parts])
            for d in drafts_from_openai_responses(items)[1]
        ]

    assert texts(short) == texts(long)


def test_reuse_sees_only_the_entries_a_build_converts() -> None:
    convert, _ = FORMATS["openai-chat"]
    builder = PayloadBuilder("openai-chat", convert)
    stored = [m for n in range(20) for m in _turn(n, "text")]
    seen: list[int] = []
    host: dict[int, Any] = {}

    def reuse(index: int, entry: Any) -> Any:
        seen.append(index)
        host[index] = dict(entry)  # an equal object of the caller's
        return host[index]

    first = builder.build(apply_send_rules(stored), None, reuse=reuse)
    assert seen == list(range(40))
    assert all(entry is host[i] for i, entry in enumerate(first))
    view = apply_send_rules(stored)
    seen.clear()
    grown = builder.build([*view, *apply_send_rules(_turn(20, "text"))], None, reuse=reuse)
    assert seen == [40, 41]  # the kept entries are not looked at again
    assert all(entry is host[i] for i, entry in enumerate(grown))
    assert grown == convert([*view, *apply_send_rules(_turn(20, "text"))], None)
