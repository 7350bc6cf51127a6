"""Tests of the watermark computation (SPEC R2.2-R2.6, A2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.boundary import (
    TAIL_MAX_TOKENS,
    TAIL_MIN_TEXT_BLOCK_MESSAGES,
    TAIL_MIN_TOKENS,
    BoundaryError,
    adjust_boundary_for_api_invariants,
    compute_boundary,
    has_text_blocks,
    message_token_counts,
)
from mimo_ctx.config import RebuildConfig, TailConfig
from mimo_ctx.errors import MimoCtxError
from mimo_ctx.messages import (
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStatePending,
)
from mimo_ctx.tokens import UNSERIALISABLE_PART_TOKENS, estimate_message_tokens

# --------------------------------------------------------------------------- helpers


def _msg(
    index: int,
    role: Role,
    parts: Sequence[Part],
    *,
    finish: str | None = None,
    pmid: str | None = None,
) -> Message:
    return Message(
        id=f"msg_{index:04d}",
        session_id="ses_test",
        role=role,
        time_created=1_000 + index,
        finish=finish,
        provider_message_id=pmid,
        parts=list(parts),
    )


def _text(text: str = "x") -> TextPart:
    return TextPart(text=text)


def _call(call_id: str, tool: str = "bash") -> ToolPart:
    return ToolPart(call_id=call_id, tool=tool, state=ToolStatePending(input={"cmd": "ls"}))


def _done_call(call_id: str) -> ToolPart:
    return ToolPart(
        call_id=call_id,
        tool="bash",
        state=ToolStateCompleted(input={"cmd": "ls"}, output="a.py"),
    )


def _result(call_id: str) -> ToolResultPart:
    return ToolResultPart(call_id=call_id, tool="bash", output="ok")


def _session(kinds: str, *, finish_at: int | None = None) -> list[Message]:
    """Messages from a kind string: u = user text, a = assistant text, t = assistant
    tool-only (not a text block). ``finish_at`` marks the completed assistant."""
    out: list[Message] = []
    for i, kind in enumerate(kinds):
        finish = "stop" if i == finish_at else None
        if kind == "u":
            out.append(_msg(i, "user", [_text()]))
        elif kind == "a":
            out.append(_msg(i, "assistant", [_text()], finish=finish))
        else:
            out.append(_msg(i, "assistant", [_done_call(f"c{i}")], finish=finish))
    return out


# ------------------------------------------------------------- compute_boundary (R2.3-R2.5)


def test_r2_3_constants() -> None:
    assert (TAIL_MIN_TOKENS, TAIL_MAX_TOKENS, TAIL_MIN_TEXT_BLOCK_MESSAGES) == (10000, 20000, 5)
    assert TailConfig() == TailConfig(
        min_tokens=TAIL_MIN_TOKENS,
        max_tokens=TAIL_MAX_TOKENS,
        min_text_block_messages=TAIL_MIN_TEXT_BLOCK_MESSAGES,
    )


def test_a2_empty_list_has_no_boundary() -> None:
    assert compute_boundary([]) is None
    assert compute_boundary([], token_counts=[]) is None


def test_a2_no_completed_assistant_returns_first_message() -> None:
    msgs = _session("uaua")  # no finish anywhere
    assert compute_boundary(msgs) == "msg_0000"
    # A user message's finish field never counts as a completed assistant.
    msgs[3] = msgs[3].model_copy(update={"finish": "stop"})
    assert compute_boundary(msgs) == "msg_0000"


def test_a2_completed_assistant_at_index_0_returns_first_message() -> None:
    msgs = _session("auuu", finish_at=0)
    assert compute_boundary(msgs, token_counts=[1, 1, 1, 1]) == "msg_0000"


def test_r2_4_soft_ceiling_natural_tail_already_over_max() -> None:
    # Last completed assistant at 5, tail starts at 4 and holds 15000 + 6000.
    msgs = _session("uauaua", finish_at=5)
    counts = [100, 100, 100, 100, 15000, 6000]
    assert compute_boundary(msgs, token_counts=counts) == "msg_0004"
    # Exactly at the ceiling is "already >= max" too.
    counts = [100, 100, 100, 100, 14000, 6000]
    assert compute_boundary(msgs, token_counts=counts) == "msg_0004"


def test_r2_3_tail_starts_before_last_completed_assistant() -> None:
    # Messages after the last completed assistant belong to the tail as well;
    # an unfinished assistant at the end is not "completed".
    msgs = _session("uauaua", finish_at=3)
    counts = [1, 1, 25000, 1, 1, 1]
    assert compute_boundary(msgs, token_counts=counts) == "msg_0002"


def test_r2_5_grows_to_the_token_floor() -> None:
    # 20 text messages of 1000 tokens: the floor (10000) is reached with 10
    # messages, which already hold >= 5 text blocks.
    msgs = _session("ua" * 10, finish_at=19)
    counts = [1000] * 20
    assert compute_boundary(msgs, token_counts=counts) == "msg_0010"


def test_r2_5_grows_until_five_text_block_messages() -> None:
    # 800 tokens each; only 10, 15, 20, 28 and 29 have text. The floor alone
    # would stop at 17 (13 * 800 = 10400); the 5th text block is message 10.
    kinds = ["t"] * 30
    for i in (10, 15, 20, 28, 29):
        kinds[i] = "a"
    msgs = _session("".join(kinds), finish_at=29)
    counts = [800] * 30
    assert compute_boundary(msgs, token_counts=counts) == "msg_0010"
    # With the text-block floor disabled the token floor decides.
    config = TailConfig(min_text_block_messages=0)
    assert compute_boundary(msgs, config, token_counts=counts) == "msg_0017"


def test_r2_5_reasoning_counts_as_text_block() -> None:
    msg = _msg(0, "assistant", [ReasoningPart(text="hmm")])
    assert has_text_blocks(msg)
    assert not has_text_blocks(_msg(1, "assistant", [_done_call("c")]))
    assert has_text_blocks(_msg(2, "user", [_text()]))


def test_r2_5_stops_at_the_ceiling() -> None:
    # No text blocks at all: growth only stops at the 20000 ceiling, which the
    # tail then exceeds (21000) because messages are never split.
    msgs = _session("t" * 20, finish_at=19)
    counts = [3000] * 20
    assert compute_boundary(msgs, token_counts=counts) == "msg_0013"


def test_r2_5_stops_at_the_first_message() -> None:
    msgs = _session("uaua", finish_at=3)
    assert compute_boundary(msgs, token_counts=[10, 10, 10, 10]) == "msg_0000"


def test_r2_5_config_from_rebuild_config() -> None:
    msgs = _session("ua" * 10, finish_at=19)
    counts = [1000] * 20
    config = RebuildConfig(tail=TailConfig(min_tokens=4000, max_tokens=8000))
    # 4000 tokens need 4 messages, 5 text blocks need 5: start at 15.
    assert compute_boundary(msgs, config, token_counts=counts) == "msg_0015"


def test_r2_2_default_estimate_is_cached_message_estimate() -> None:
    msgs = [
        _msg(0, "user", [_text("a" * 400)]),
        _msg(1, "assistant", [_text("b" * 4000)], finish="stop"),
    ]
    assert message_token_counts(msgs) == [estimate_message_tokens(m) for m in msgs]


def test_a2_unserialisable_part_counts_1000() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic  # JSON.stringify throws on cycles; so does ours
    bad = _msg(2, "user", [OpaquePart(source="test", kind="cyclic", data=cyclic)])
    assert estimate_message_tokens(bad) == UNSERIALISABLE_PART_TOKENS
    small = [_msg(i, "user", [_text("hi")]) for i in (0, 1)]
    tail = [_msg(3, "user", [_text("hi")]), _msg(4, "assistant", [_text("ok")], finish="stop")]
    msgs = [*small, bad, *tail]
    # The floor is exactly the natural tail plus 1000: growth stops at the
    # unserialisable message only if it counts the full 1000.
    natural = sum(estimate_message_tokens(m) for m in tail)
    config = TailConfig(min_tokens=natural + 1000, max_tokens=50000, min_text_block_messages=0)
    assert compute_boundary(msgs, config) == "msg_0002"
    counts = [estimate_message_tokens(m) for m in msgs]
    assert counts[2] == 1000
    counts[2] = 999
    assert compute_boundary(msgs, config, token_counts=counts) == "msg_0001"


def test_r2_2_custom_counter() -> None:
    class PerChar:
        def count(self, text: str) -> int:
            return len(text)

    msgs = _session("ua" * 5, finish_at=9)
    config = TailConfig(min_tokens=200, max_tokens=100000, min_text_block_messages=0)
    default = compute_boundary(msgs, config)
    per_char = compute_boundary(msgs, config, counter=PerChar())
    # Four times more tokens per message: the floor is met with fewer messages.
    assert default is not None
    assert per_char is not None
    assert per_char > default
    counts = message_token_counts(msgs, counter=PerChar())
    assert counts[0] == len(msgs[0].parts[0].model_dump_json(exclude_none=True))


def test_r2_2_token_counts_length_mismatch_is_a_clear_error() -> None:
    msgs = _session("ua", finish_at=1)
    with pytest.raises(BoundaryError, match="token_counts has 1 entries for 2 messages"):
        compute_boundary(msgs, token_counts=[1])
    assert issubclass(BoundaryError, MimoCtxError)
    assert issubclass(BoundaryError, ValueError)


def _reference_ok(
    index: int, start: int, counts: list[int], blocks: list[bool], tail: TailConfig
) -> bool:
    """Would the R2.5 loop stop with the tail starting at ``index``?"""
    total = sum(counts[index:])
    text_blocks = sum(blocks[index:])
    return (
        index == 0
        or total >= tail.max_tokens
        or (total >= tail.min_tokens and text_blocks >= tail.min_text_block_messages)
    )


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.sampled_from("uat"), min_size=1, max_size=40),
    counts_seed=st.lists(st.integers(0, 6000), min_size=40, max_size=40),
    finish_pick=st.integers(0, 39),
    tail=st.builds(
        TailConfig,
        min_tokens=st.integers(0, 30000),
        max_tokens=st.integers(0, 40000),
        min_text_block_messages=st.integers(0, 8),
    ),
)
def test_r2_5_property_matches_the_stop_rule(
    kinds: list[str], counts_seed: list[int], finish_pick: int, tail: TailConfig
) -> None:
    """R2.4/R2.5 restated: the result is the latest start at or before the natural
    start where the loop's stop condition holds (or the natural start when the
    natural tail is already at the ceiling)."""
    finish_at = finish_pick % len(kinds)
    if kinds[finish_at] == "u":
        finish_at = None  # then there may be no completed assistant
    msgs = _session("".join(kinds), finish_at=finish_at)
    counts = counts_seed[: len(kinds)]
    result = compute_boundary(msgs, tail, token_counts=counts)
    assert result is not None
    completed = [i for i, m in enumerate(msgs) if m.role == "assistant" and m.finish]
    if not completed or completed[-1] == 0:
        assert result == msgs[0].id
        return
    start = completed[-1] - 1
    index = [m.id for m in msgs].index(result)
    blocks = [has_text_blocks(m) for m in msgs]
    if sum(counts[start:]) >= tail.max_tokens:
        assert index == start
        return
    assert index <= start
    assert _reference_ok(index, start, counts, blocks, tail) or index == start
    for later in range(index + 1, start):
        assert not _reference_ok(later, start, counts, blocks, tail)


# ------------------------------------------------------ adjust_boundary_for_api_invariants (R2.6)


def test_r2_6_opencode_form_is_a_no_op() -> None:
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "assistant", [_done_call("c1")], finish="tool-calls"),
        _msg(2, "assistant", [_done_call("c2"), _text()], finish="stop"),
        _msg(3, "user", [_text()]),
    ]
    for message in msgs:
        assert adjust_boundary_for_api_invariants(msgs, message.id) == message.id


def test_r2_6_moves_before_a_call_whose_result_is_live() -> None:
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "assistant", [_call("c1")], finish="tool-calls"),
        _msg(2, "tool", [_result("c1")]),
        _msg(3, "assistant", [_text()], finish="stop"),
        _msg(4, "user", [_text()]),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0001") == "msg_0000"
    # Call and result on the same side: unchanged.
    assert adjust_boundary_for_api_invariants(msgs, "msg_0002") == "msg_0002"
    assert adjust_boundary_for_api_invariants(msgs, "msg_0000") == "msg_0000"
    assert adjust_boundary_for_api_invariants(msgs, "msg_0004") == "msg_0004"


def test_r2_6_parallel_results_in_several_tool_messages() -> None:
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "assistant", [_call("c1"), _call("c2")], finish="tool-calls"),
        _msg(2, "tool", [_result("c1")]),
        _msg(3, "tool", [_result("c2")]),
        _msg(4, "assistant", [_text()], finish="stop"),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0002") == "msg_0000"


def test_r2_6_does_not_split_a_provider_message_group() -> None:
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "assistant", [ReasoningPart(text="think")], pmid="resp_X"),
        _msg(2, "assistant", [_text()], pmid="resp_X"),
        _msg(3, "assistant", [_call("c1")], pmid="resp_X", finish="tool-calls"),
        _msg(4, "tool", [_result("c1")]),
        _msg(5, "user", [_text()]),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0001") == "msg_0000"
    assert adjust_boundary_for_api_invariants(msgs, "msg_0002") == "msg_0000"
    assert adjust_boundary_for_api_invariants(msgs, "msg_0003") == "msg_0000"
    assert adjust_boundary_for_api_invariants(msgs, "msg_0004") == "msg_0004"


def test_r2_6_group_with_interleaved_tool_results() -> None:
    # Claude Code stores parallel tool_use blocks of one response as separate
    # lines, with tool results between them: the whole stretch is one group.
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "assistant", [_call("c1")], pmid="resp_X"),
        _msg(2, "tool", [_result("c1")]),
        _msg(3, "assistant", [_call("c2")], pmid="resp_X", finish="tool-calls"),
        _msg(4, "tool", [_result("c2")]),
        _msg(5, "assistant", [_text()], finish="stop"),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0002") == "msg_0000"
    assert adjust_boundary_for_api_invariants(msgs, "msg_0004") == "msg_0004"


def test_r2_6_iterates_to_a_fixed_point() -> None:
    # Moving before the call (index 2) lands inside group X (1..2): move again.
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "assistant", [_text()], pmid="resp_X"),
        _msg(2, "assistant", [_call("c1")], pmid="resp_X", finish="tool-calls"),
        _msg(3, "tool", [_result("c1")]),
        _msg(4, "assistant", [_text()], finish="stop"),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0002") == "msg_0000"


def test_r2_6_moves_later_when_the_pair_starts_at_index_0() -> None:
    msgs = [
        _msg(0, "assistant", [_call("c1")], finish="tool-calls"),
        _msg(1, "tool", [_result("c1")]),
        _msg(2, "assistant", [_text()], finish="stop"),
        _msg(3, "user", [_text()]),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0000") == "msg_0001"


def test_r2_6_moves_later_when_the_group_starts_at_index_0() -> None:
    # Moving later can itself land inside another span: iterate forwards too.
    msgs = [
        _msg(0, "assistant", [_text()], pmid="resp_X"),
        _msg(1, "assistant", [_call("c1")], pmid="resp_X", finish="tool-calls"),
        _msg(2, "tool", [_result("c1")]),
        _msg(3, "user", [_text()]),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0000") == "msg_0002"


def test_r2_6_result_stored_before_its_call_is_still_a_pair() -> None:
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "tool", [_result("c1")]),
        _msg(2, "assistant", [_call("c1")]),
        _msg(3, "user", [_text()]),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0001") == "msg_0000"


def test_r2_6_orphan_result_is_ignored() -> None:
    msgs = [
        _msg(0, "user", [_text()]),
        _msg(1, "tool", [_result("gone")]),
        _msg(2, "user", [_text()]),
    ]
    assert adjust_boundary_for_api_invariants(msgs, "msg_0001") == "msg_0001"


def test_r2_6_unknown_boundary_is_a_clear_error() -> None:
    msgs = _session("ua", finish_at=1)
    with pytest.raises(BoundaryError, match="'msg_9999' is not among the 2 messages"):
        adjust_boundary_for_api_invariants(msgs, "msg_9999")
    with pytest.raises(ValueError, match="not among the 0 messages"):
        adjust_boundary_for_api_invariants([], "msg_0000")


# ---------------------------------------------------------------- R2.6 properties


@st.composite
def split_sessions(draw: st.DrawFn) -> list[Message]:
    """Provider-form sessions: results in ``tool`` messages, one response stored as
    several messages sharing a provider message id, results sometimes interleaved."""
    msgs: list[Message] = []
    call_counter = 0
    turns = draw(st.integers(1, 6))
    for turn in range(turns):
        # Sometimes start with the assistant, so that "nothing earlier to move
        # to" (the move-later branch) is exercised too.
        if turn > 0 or draw(st.booleans()):
            msgs.append(_msg(len(msgs), "user", [_text("question")]))
        rounds = draw(st.integers(1, 3))
        for round_ in range(rounds):
            pmid = draw(st.sampled_from([None, f"resp_{turn}_{round_}"]))
            pieces = draw(st.lists(st.sampled_from(["think", "text", "call"]), max_size=4))
            pending: list[str] = []
            last_round = round_ == rounds - 1
            for piece in pieces:
                if piece == "think":
                    parts: list[Part] = [ReasoningPart(text="hmm")]
                elif piece == "text":
                    parts = [_text("answer")]
                else:
                    call_counter += 1
                    call_id = f"call_{call_counter}"
                    parts = [_call(call_id)]
                    pending.append(call_id)
                msgs.append(_msg(len(msgs), "assistant", parts, pmid=pmid))
                if pending and draw(st.booleans()):
                    # Interleave a result between lines of one response.
                    msgs.append(_msg(len(msgs), "tool", [_result(pending.pop(0))]))
            finish = "stop" if last_round and not pending else "tool-calls"
            if msgs and msgs[-1].role == "assistant":
                msgs[-1] = msgs[-1].model_copy(update={"finish": finish})
            if pending and draw(st.booleans()):
                msgs.append(_msg(len(msgs), "tool", [_result(c) for c in pending]))
            else:
                for call_id in pending:
                    msgs.append(_msg(len(msgs), "tool", [_result(call_id)]))
    return msgs or [_msg(0, "user", [_text("question")])]


def _split_spans(msgs: list[Message]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    calls = {p.call_id: i for i, m in enumerate(msgs) for p in m.parts if isinstance(p, ToolPart)}
    for i, m in enumerate(msgs):
        for p in m.parts:
            if isinstance(p, ToolResultPart) and p.call_id in calls:
                low, high = sorted((calls[p.call_id], i))
                spans.append((low, high))
    groups: dict[str, list[int]] = {}
    for i, m in enumerate(msgs):
        if m.provider_message_id:
            groups.setdefault(m.provider_message_id, []).append(i)
    spans.extend((min(g), max(g)) for g in groups.values())
    return spans


def _splits(spans: list[tuple[int, int]], cut: int) -> bool:
    return any(first <= cut < last for first, last in spans)


def _naive_adjust(msgs: list[Message], cut: int) -> int:
    """The fixed-point iteration as the SPEC words it: earlier, else later."""
    spans = _split_spans(msgs)
    position = cut
    while position >= 0 and _splits(spans, position):
        position = min(first for first, last in spans if first <= position < last) - 1
    if position >= 0:
        return position
    position = cut
    while _splits(spans, position):
        position = max(last for first, last in spans if first <= position < last)
    return position


@settings(max_examples=300, deadline=None)
@given(msgs=split_sessions(), pick=st.integers(0, 10_000))
def test_r2_6_property_never_splits_pairs_or_groups(msgs: list[Message], pick: int) -> None:
    cut = pick % len(msgs)
    adjusted = adjust_boundary_for_api_invariants(msgs, msgs[cut].id)
    index = [m.id for m in msgs].index(adjusted)
    covered = {m.id for m in msgs[: index + 1]}
    # (a) no tool call on one side with its result on the other
    sides: dict[str, set[bool]] = {}
    for m in msgs:
        for p in m.parts:
            if isinstance(p, ToolPart | ToolResultPart):
                sides.setdefault(p.call_id, set()).add(m.id in covered)
    assert all(len(s) == 1 for s in sides.values())
    # (b) no provider message group on both sides
    groups: dict[str, set[bool]] = {}
    for m in msgs:
        if m.provider_message_id:
            groups.setdefault(m.provider_message_id, set()).add(m.id in covered)
    assert all(len(s) == 1 for s in groups.values())
    # Earlier when possible, and then the latest such position (minimal move).
    spans = _split_spans(msgs)
    valid_earlier = [w for w in range(cut + 1) if not _splits(spans, w)]
    if valid_earlier:
        assert index == max(valid_earlier)
    else:
        assert index > cut
    assert index == _naive_adjust(msgs, cut)


@settings(max_examples=200, deadline=None)
@given(msgs=split_sessions(), pick=st.integers(0, 10_000))
def test_r2_6_property_idempotent_and_identity_when_not_split(
    msgs: list[Message], pick: int
) -> None:
    cut = msgs[pick % len(msgs)].id
    once = adjust_boundary_for_api_invariants(msgs, cut)
    assert adjust_boundary_for_api_invariants(msgs, once) == once
    if not _splits(_split_spans(msgs), pick % len(msgs)):
        assert once == cut


@settings(max_examples=200, deadline=None)
@given(msgs=split_sessions())
def test_r2_6_property_end_to_end_with_compute_boundary(msgs: list[Message]) -> None:
    config = TailConfig(min_tokens=60, max_tokens=200, min_text_block_messages=2)
    boundary = compute_boundary(msgs, config)
    assert boundary is not None
    adjusted = adjust_boundary_for_api_invariants(msgs, boundary)
    index = [m.id for m in msgs].index(adjusted)
    assert not _splits(_split_spans(msgs), index)
