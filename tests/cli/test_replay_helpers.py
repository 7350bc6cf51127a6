"""Pure helpers of :mod:`mimo_ctx.replay` and :mod:`mimo_ctx.cli._output`.

``user_words_retained`` (issue 6 item 4's metric), ``stable_ids`` (SPEC A1
shape, deterministic), ``replayable_messages`` and the plain-text table.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import ids
from mimo_ctx.cli._output import Output, fmt_tokens
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart
from mimo_ctx.replay import (
    replayable_messages,
    stable_ids,
    typed_before,
    user_words_retained,
)
from mimo_ctx.typed_input import TypedInput
from tests.cli.conftest import transcripts_root, write_chat_transcript

_T = 1_700_000_000_000


def user(text: str, *, synthetic: bool = False, agent: str = MAIN_AGENT) -> Message:
    return Message(
        session_id="ses_x",
        role="user",
        agent=agent,
        time_created=_T,
        parts=[TextPart(text=text, synthetic=synthetic)],
    )


def assistant(text: str) -> Message:
    return Message(
        session_id="ses_x",
        role="assistant",
        time_created=_T,
        finish="stop",
        parts=[TextPart(text=text)],
    )


def test_no_typed_words_gives_none() -> None:
    assert user_words_retained([], []) is None
    assert user_words_retained(["   "], [assistant("hello there")]) is None


def test_all_words_present_verbatim() -> None:
    typed = ["please rename frobnicate to tidy everywhere in the repo", "and keep the alias"]
    request = [user(t) for t in typed]
    assert user_words_retained(typed, request) == 1.0


def test_nothing_present() -> None:
    typed = ["please rename frobnicate to tidy everywhere in the repo"]
    assert user_words_retained(typed, [assistant("something else entirely")]) == 0.0


def test_whitespace_and_quotes_are_not_significant_and_runs_are_eight_words() -> None:
    typed = ["alpha beta gamma delta epsilon zeta eta theta iota kappa"]  # 3 runs of 8
    # The first nine words, re-wrapped and quoted, inside other text: 2 runs.
    request = [assistant('noise\n"alpha  beta\ngamma delta epsilon zeta eta theta iota" more')]
    assert user_words_retained(typed, request) == pytest.approx(2 / 3)
    # Seven consecutive words are not a run: common phrases do not count.
    assert user_words_retained(typed, [assistant("alpha beta gamma delta epsilon zeta eta")]) == 0.0


def test_short_messages_must_appear_whole() -> None:
    typed = ["keep the alias"]
    assert user_words_retained(typed, [assistant("we keep the alias here")]) == 1.0
    assert user_words_retained(typed, [assistant("keep the aliases")]) == 0.0


def test_budget_takes_the_newest_words_first() -> None:
    old = "ancient words nobody repeats again in this request ever"
    text = " ".join(f"w{i}" for i in range(400))
    typed = [old, text]
    # A budget that fits the newest message with less than a word to spare:
    # the old one does not count.
    fits = -(-(len(text) + 1) // 4)
    assert user_words_retained(typed, [user(text)], budget_tokens=fits) == 1.0
    whole = user_words_retained(typed, [user(text)], budget_tokens=100_000)
    assert whole is not None
    assert whole < 1.0
    # A cut message keeps its newest words.
    cut = user_words_retained(
        typed, [user(" ".join(f"w{i}" for i in range(300, 400)))], budget_tokens=100
    )
    assert cut == 1.0


def test_typed_before_places_by_source_line_else_by_turns() -> None:
    typed = [
        TypedInput("first", 3, 0),
        TypedInput("queued", 10, 2),
        TypedInput("later", 20, 4),
    ]
    at_line = assistant("x").model_copy(update={"metadata": {"claude_code": {"line": 11}}})
    assert typed_before(typed, at_line, 0) == ["first", "queued"]
    unplaced = [TypedInput("a", None, 0), TypedInput("b", None, 1), TypedInput("c", None, 3)]
    assert typed_before(unplaced, assistant("x"), 1) == ["a", "b"]


_word = st.text(alphabet="abcdefghij", min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(st.lists(_word, min_size=1, max_size=12), min_size=1, max_size=6),
    keep=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_property_fraction_bounds_and_full_copy(
    messages: list[list[str]], keep: list[bool]
) -> None:
    typed = [" ".join(words) for words in messages]
    full = user_words_retained(typed, [user(t) for t in typed])
    assert full == 1.0
    subset = [user(t) for t, k in zip(typed, keep, strict=False) if k]
    part = user_words_retained(typed, subset)
    assert part is not None
    assert 0.0 <= part <= 1.0
    if not subset:
        assert part == 0.0


def test_stable_ids_are_deterministic_ascending_and_a1_shaped(tmp_path: Path) -> None:
    path = write_chat_transcript(tmp_path / "chat.json", rounds=5)
    first = stable_ids(load_transcript(path))
    second = stable_ids(load_transcript(path))
    assert [m.id for m in first.messages] == [m.id for m in second.messages]
    assert first.session.id == second.session.id
    message_ids = [m.id for m in first.messages]
    assert message_ids == sorted(message_ids)
    assert len(set(message_ids)) == len(message_ids)
    for message in first.messages:
        assert ids.timestamp_of(message.id) == message.time_created
        assert message.session_id == first.session.id
    assert ids.timestamp_of(first.session.id) == first.session.time_created


def test_stable_ids_remap_compactions_and_replayable_drops_them() -> None:
    path = transcripts_root() / "claude_code" / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found (set MIMO_CTX_TRANSCRIPTS)")
    transcript = stable_ids(load_transcript(path))
    assert transcript.compactions
    for compaction in transcript.compactions:
        assert transcript.messages[compaction.index].id == compaction.message_id
    kept = replayable_messages(transcript)
    indexes = {i for i, _ in kept}
    assert all(c.index not in indexes for c in transcript.compactions)
    assert len(kept) == len(transcript.messages) - len(transcript.compactions)


def test_replayable_relabels_a_subagent_only_transcript() -> None:
    path = (
        transcripts_root()
        / "claude_code"
        / ("258c7280-ae70-4798-800f-63464d01a85d_subagents_agent-a881341.jsonl")
    )
    if not path.is_file():
        pytest.skip(f"{path} not found (set MIMO_CTX_TRANSCRIPTS)")
    transcript = load_transcript(path)
    assert all(m.agent != MAIN_AGENT for m in transcript.messages)
    assert all(m.agent == MAIN_AGENT for _, m in replayable_messages(transcript))


def test_plain_table_and_fields_golden() -> None:
    stream = io.StringIO()
    out = Output(stream, plain=True)
    out.table(
        ["#", "Name", "Tokens"],
        [["1", "alpha", "1,234"], ["10", "be", "5"]],
        align=["right", "left", "right"],
    )
    out.fields([("A", "x"), ("Long", "y")])
    assert stream.getvalue() == (
        " #  Name   Tokens\n"
        "--  -----  ------\n"
        " 1  alpha   1,234\n"
        "10  be          5\n"
        "A:    x\n"
        "Long: y\n"
    )
    assert fmt_tokens(None) == "-"
    assert fmt_tokens(1234567) == "1,234,567"


def test_rich_output_is_never_markup() -> None:
    stream = io.StringIO()
    out = Output(stream)
    assert out.rich
    out.line("[bold]not bold[/bold] [Old tool result content cleared]")
    out.table(["a"], [["[red]x[/red]"]])
    text = stream.getvalue()
    assert "[bold]not bold[/bold]" in text
    assert "[Old tool result content cleared]" in text
    assert "[red]x[/red]" in text
