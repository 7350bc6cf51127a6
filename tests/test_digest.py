"""Tests of the tail digest and the collapse of digested messages (SPEC R7, A9)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.digest import (
    ACTIVITY_HEADING,
    INTERRUPTED_NOTE,
    DigestLine,
    build_tail_digest,
    collapse_checkpoint_tail,
    digest_lines,
    elide_path,
    format_tool_call,
    is_digested,
    is_path_argument,
    omitted_note,
    render_tail_digest,
    truncate,
)
from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    FilePart,
    Message,
    Part,
    ReasoningPart,
    Role,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    set_insert_seq,
)

# --------------------------------------------------------------------------- helpers


def _msg(index: int, role: Role, parts: Sequence[Part], *, time: int | None = None) -> Message:
    return Message(
        id=f"msg_{index:04d}",
        session_id="ses_test",
        role=role,
        time_created=time if time is not None else 1_000 + index,
        parts=list(parts),
    )


def _completed(tool: str, args: dict[str, Any], call_id: str = "c") -> ToolPart:
    return ToolPart(
        call_id=call_id, tool=tool, state=ToolStateCompleted(input=args, output="big output")
    )


def _boundary(index: int, covered: str, digest: str | None, *, time: int) -> Message:
    return _msg(
        index,
        "user",
        [
            CheckpointPart(covered_up_to=covered, digest_up_to=digest),
            TextPart(text="body", synthetic=True),
        ],
        time=time,
    )


# ------------------------------------------------------------------------ truncate (A9)


def test_a9_truncate_collapses_whitespace_and_strips() -> None:
    assert truncate("  a  b\n\n\tc  ", 10) == "a b c"
    assert truncate("", 5) == ""
    assert truncate(" \n ", 5) == ""


def test_a9_truncate_cuts_to_n_minus_one_plus_ellipsis() -> None:
    assert truncate("abcdef", 5) == "abcd…"
    assert truncate("abcde", 5) == "abcde"
    assert truncate("abcdef", 1) == "…"
    # Whitespace is collapsed before measuring.
    assert truncate("a    b", 3) == "a b"
    # A cut that ends on a space drops it (the original kept "abc …").
    assert truncate("abc def", 5) == "abc…"


def test_a9_truncate_never_splits_astral_characters() -> None:
    assert truncate("😀😀😀😀😀", 3) == "😀😀…"
    assert truncate("中文内容很长", 4) == "中文内…"


def test_a9_truncate_rejects_a_limit_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1, got 0"):
        truncate("abc", 0)


@settings(max_examples=300)
@given(text=st.text(), limit=st.integers(1, 300))
def test_a9_truncate_property(text: str, limit: int) -> None:
    out = truncate(text, limit)
    flat = " ".join(text.split())
    assert len(out) <= limit
    assert out == flat or (out.endswith("…") and flat.startswith(out[:-1]))
    assert truncate(out, limit) == out or out.endswith("…")


# ------------------------------------- cuts that keep what identifies a line (issue 14)

_WORDS = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=12), min_size=1, max_size=30)


def test_truncate_ends_on_a_near_word_boundary() -> None:
    text = "Now I have all the patterns. Let me check for project.ex to understand it"
    # The 60-character cut would fall inside "understand": it ends after "to".
    assert truncate(text, 60) == "Now I have all the patterns. Let me check for project.ex to…"
    # No space within reach (a quarter of the limit, at most WORD_REACH): the word is cut.
    assert truncate("a " + "x" * 30, 12) == "a xxxxxxxxx…"
    assert truncate("中文内容很长", 4) == "中文内…"


@settings(max_examples=300)
@given(words=_WORDS, limit=st.integers(1, 120))
def test_property_truncate_never_cuts_a_word_when_a_boundary_is_near(
    words: list[str], limit: int
) -> None:
    text = " ".join(words)
    out = truncate(text, limit)
    assert len(out) <= limit
    if out == text:
        return
    kept = out[:-1]
    assert out.endswith("…")
    assert text.startswith(kept)
    if kept and text[len(kept)] != " ":
        # Cut inside a word: only when no space lies within reach before the
        # full-length cut (a space at the very start is no place to end).
        reach = min(15, limit // 4)
        assert " " not in text[max(1, limit - 1 - reach) : limit - 1]


def test_elide_path_keeps_the_file_name_and_the_root() -> None:
    path = (
        "/home/USER/projects/spotter-worktrees/spotter-gqc/lib/spotter_web/live/pane_list_live.ex"
    )
    assert elide_path(path, 80) == (
        "/home/USER/projects/spotter-worktrees/…/lib/spotter_web/live/pane_list_live.ex"
    )
    assert elide_path(path, 40) == "/home/USER/projects/…/pane_list_live.ex"
    assert elide_path(path, 20) == "/…/pane_list_live.ex"
    # A name too long for its own room keeps its start and its extension.
    assert elide_path(path, 10) == "/hom…ve.ex"
    assert elide_path("src/app.py", 80) == "src/app.py"
    url = "https://hexdocs.pm/opentelemetry_api/OpenTelemetry.Tracer.html"
    assert elide_path(url, 50) == "https://hexdocs.pm/…/OpenTelemetry.Tracer.html"
    assert elide_path("C:\\Users\\me\\very\\long\\folder\\name\\file.txt", 24) == (
        "C:\\Users\\me\\…\\file.txt"
    )
    with pytest.raises(ValueError, match="at least 1"):
        elide_path("a/b", 0)


def test_path_arguments_are_recognised_by_key_or_shape() -> None:
    assert is_path_argument("file_path", "notes with spaces.md")
    assert is_path_argument("notebook_path", "x")
    assert is_path_argument("url", "https://example.org/a")
    assert is_path_argument("pattern", "src/**/*.py")
    assert not is_path_argument("command", "cd /repo && make test")
    assert not is_path_argument("content", "a/b c/d")


_COMPONENT = st.text(alphabet="abcdefghijklmnop_-.", min_size=1, max_size=14)


@settings(max_examples=300)
@given(parts=st.lists(_COMPONENT, min_size=2, max_size=12), limit=st.integers(1, 120))
def test_property_elide_path_bounds_name_head_and_tail(parts: list[str], limit: int) -> None:
    path = "/".join(parts)
    out = elide_path(path, limit)
    assert len(out) <= limit
    if len(path) <= limit:
        assert out == path
        return
    assert "…" in out
    name = parts[-1]
    if len(name) + 2 <= limit:
        # The file name is whole, after the elision; what comes before it is the
        # path's own start, what comes after "…" is its own end.
        assert out.endswith("/" + name)
        head, _, tail = out.partition("…")
        assert path.startswith(head)
        assert path.endswith(tail)
    else:
        assert out[-1] == name[-1] if limit > 1 else out == "…"


@settings(max_examples=200)
@given(
    dirs=st.lists(_COMPONENT, min_size=1, max_size=8),
    names=st.lists(_COMPONENT, min_size=2, max_size=6, unique=True),
    middles=st.lists(_COMPONENT, min_size=1, max_size=3),
)
def test_property_different_files_never_give_identical_lines(
    dirs: list[str], names: list[str], middles: list[str]
) -> None:
    """Long paths sharing their start and often their name still give distinct lines."""
    root = "/home/someone/projects/" + "/".join(dirs)
    paths = sorted(
        {f"{root}/{m}/deep/folder/{n}" for m in middles for n in names}
        | {f"{root}/{n}" for n in names}
    )
    parts = [_completed("Read", {"file_path": p}, f"c{i}") for i, p in enumerate(paths)]
    lines = [line.text for line in digest_lines([_msg(1, "assistant", parts)])]
    assert len(set(lines)) == len(paths)
    for line, path in zip(lines, paths, strict=True):
        assert path.rsplit("/", 1)[-1] in line


# ------------------------------------------------------------------ tool calls (A9)


def test_a9_tool_call_argument_formats() -> None:
    args: dict[str, Any] = {
        "path": "src/app.py",
        "limit": 50,
        "flag": True,
        "none": None,
        "options": {"a": [1, 2], "b": "é"},
        "quote": 'say "hi"\nnow',
    }
    assert format_tool_call("read", args) == (
        'read(path="src/app.py", limit=50, flag=true, none=null, '
        'options={"a":[1,2],"b":"é"}, quote="say \\"hi\\" now")'
    )
    assert format_tool_call("todo", {}) == "todo()"


def test_a9_tool_arguments_cut_to_80() -> None:
    long = "a" * 100
    assert format_tool_call("write", {"content": long}) == f'write(content="{"a" * 79}…")'
    numbers = list(range(100))
    rendered = format_tool_call("sum", {"xs": numbers})
    assert rendered == f"sum(xs={json.dumps(numbers, separators=(',', ':'))[:79]}…)"
    # Custom cut length.
    assert format_tool_call("w", {"c": "abcdef"}, arg_chars=4) == 'w(c="abc…")'


def test_a9_non_json_argument_does_not_fail() -> None:
    rendered = format_tool_call("odd", {"v": {1, 2}})
    assert rendered.startswith("odd(v=")


@settings(max_examples=300)
@given(
    key=st.text(alphabet="abcxyz_", min_size=1, max_size=8),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    ),
    limit=st.integers(1, 120),
)
def test_a9_property_each_argument_within_its_limit(key: str, value: Any, limit: int) -> None:
    rendered = format_tool_call("t", {key: value}, arg_chars=limit)
    prefix = f"t({key}="
    assert rendered.startswith(prefix)
    assert rendered.endswith(")")
    shown = rendered[len(prefix) : -1]
    assert "\n" not in shown
    if isinstance(value, str):
        # The text is cut, then escaped: the decoded text is within the limit.
        decoded = json.loads(shown)
        cut = elide_path if is_path_argument(key, value) else truncate
        assert decoded == cut(value, limit)
        assert len(decoded) <= limit
    else:
        assert len(shown) <= limit


# --------------------------------------------------------------- digest golden (R7.1, R7.2)


def _golden_tail() -> list[Message]:
    return [
        _msg(1, "user", [TextPart(text="please fix the tests")]),
        _msg(
            2,
            "assistant",
            [
                ReasoningPart(text="Thinking about it"),
                TextPart(text="I'll look at the   files.\n\nFirst the config."),
                _completed("read", {"path": "src/app.py", "limit": 50}, "c1"),
            ],
        ),
        _msg(3, "tool", [ToolResultPart(call_id="x", tool="read", output="never shown")]),
        _msg(
            4,
            "assistant",
            [
                ToolPart(
                    call_id="c2",
                    tool="bash",
                    state=ToolStateError(input={"command": "pytest -q"}, error="exit 1:\n3 failed"),
                ),
                TextPart(text="   "),
                TextPart(text="hidden", ignored=True),
                FilePart(mime="image/png", url="data:image/png;base64,AAAA"),
                SubtaskPart(agent="explore", description="look around"),
                SubtaskPart(agent="general", command="/review"),
            ],
        ),
        _msg(
            5,
            "assistant",
            [
                TextPart(text="Editing now."),
                ToolPart(
                    call_id="c3",
                    tool="edit",
                    state=ToolStateRunning(input={"path": "a.py", "old": "x", "new": "y"}),
                ),
                ToolPart(call_id="c4", tool="glob", state=ToolStatePending(input={"pattern": "*"})),
            ],
        ),
    ]


GOLDEN = "\n".join(
    [
        "# Recent activity",
        "",
        "Tool calls marked → interrupted did not finish before the rebuild; "
        "re-run them if you still need their results.",
        "",
        "- assistant: I'll look at the files. First the config.",
        '- read(path="src/app.py", limit=50)',
        '- bash(command="pytest -q") → error: exit 1: 3 failed',
        "- subtask: explore",
        "- subtask: /review",
        "- assistant: Editing now.",
        '- edit(path="a.py", old="x", new="y") → interrupted',
        '- glob(pattern="*") → interrupted',
    ]
)


def test_r7_2_golden_digest() -> None:
    assert render_tail_digest(_golden_tail()) == GOLDEN


def test_r7_2_golden_digest_without_interrupted_calls() -> None:
    tail = [
        _msg(1, "assistant", [TextPart(text="Done."), _completed("grep", {"pattern": "TODO"})]),
        _msg(2, "user", [TextPart(text="thanks")]),
    ]
    assert render_tail_digest(tail) == (
        '# Recent activity\n\n- assistant: Done.\n- grep(pattern="TODO")'
    )


def test_r7_2_text_cut_to_240_and_errors_to_80() -> None:
    tail = [
        _msg(
            1,
            "assistant",
            [
                TextPart(text="x" * 300),
                ToolPart(call_id="c", tool="bash", state=ToolStateError(input={}, error="e" * 100)),
            ],
        )
    ]
    lines = render_tail_digest(tail).split("\n")
    assert lines[2] == f"- assistant: {'x' * 239}…"
    assert lines[3] == f"- bash() → error: {'e' * 79}…"


def test_r7_1_user_and_boundary_messages_are_skipped() -> None:
    tail = [
        _boundary(1, "msg_0000", "msg_0000", time=1),
        _msg(2, "user", [TextPart(text="user words")]),
        _msg(3, "user", [CompactionPart(summary="old summary")]),
    ]
    assert render_tail_digest(tail) == ""
    digest = build_tail_digest(tail)
    assert not digest
    assert not digest.rendered
    assert digest.lines == ()


def test_r7_2_synthetic_assistant_text_is_listed() -> None:
    tail = [_msg(1, "assistant", [TextPart(text="note", synthetic=True)])]
    assert render_tail_digest(tail) == "# Recent activity\n\n- assistant: note"


def test_r7_2_split_result_completes_a_pending_call() -> None:
    tail = [
        _msg(
            1,
            "assistant",
            [
                ToolPart(call_id="ok", tool="read", state=ToolStatePending(input={"p": "a"})),
                ToolPart(call_id="bad", tool="read", state=ToolStatePending(input={"p": "b"})),
                ToolPart(call_id="open", tool="read", state=ToolStatePending(input={"p": "c"})),
            ],
        ),
        _msg(2, "tool", [ToolResultPart(call_id="ok", tool="read", output="text")]),
        _msg(
            3,
            "tool",
            [ToolResultPart(call_id="bad", tool="read", output="no such file", is_error=True)],
        ),
    ]
    assert [line.text for line in digest_lines(tail)] == [
        'read(p="a")',
        'read(p="b") → error: no such file',
        'read(p="c") → interrupted',
    ]


def test_r7_2_line_limit_keeps_the_newest_lines() -> None:
    tail = [_msg(i, "assistant", [TextPart(text=f"step {i}")]) for i in range(5)]
    digest = build_tail_digest(tail, max_lines=3)
    assert digest.text == (
        "# Recent activity\n\n"
        "(… 3 earlier activity lines omitted)\n"
        "- assistant: step 3\n"
        "- assistant: step 4"
    )
    assert digest.omitted == 3
    assert digest.lines == (DigestLine("assistant: step 3"), DigestLine("assistant: step 4"))
    one = build_tail_digest(tail, max_lines=1)
    assert one.text == "# Recent activity\n\n- assistant: step 4"
    assert one.omitted == 4
    assert build_tail_digest(tail, max_lines=0).text == ""
    assert build_tail_digest(tail, max_lines=5).omitted == 0
    assert omitted_note(1) == "(… 1 earlier activity line omitted)"


def test_r7_2_interrupted_note_only_for_kept_lines() -> None:
    tail = [
        _msg(0, "assistant", [ToolPart(call_id="c", tool="bash", state=ToolStatePending())]),
        *[_msg(i, "assistant", [TextPart(text=f"step {i}")]) for i in range(1, 4)],
    ]
    full = build_tail_digest(tail)
    assert full.has_interrupted
    assert INTERRUPTED_NOTE in full.text
    cut = build_tail_digest(tail, max_lines=3)
    assert not cut.has_interrupted
    assert INTERRUPTED_NOTE not in cut.text


def test_r7_2_bad_limits_are_errors() -> None:
    with pytest.raises(ValueError, match="max_lines"):
        build_tail_digest([], max_lines=-1)
    with pytest.raises(ValueError, match="text_chars=0"):
        digest_lines([], text_chars=0)


# ------------------------------------------------------------------- digest properties

_texts = st.text(
    alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs", "Cc"]),
    max_size=400,
)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
_states = st.one_of(
    st.builds(ToolStatePending, input=st.dictionaries(st.text(max_size=6), _json_values)),
    st.builds(ToolStateRunning, input=st.dictionaries(st.text(max_size=6), _json_values)),
    st.builds(
        ToolStateCompleted,
        input=st.dictionaries(st.text(max_size=6), _json_values),
        output=st.just("out"),
    ),
    st.builds(
        ToolStateError, input=st.dictionaries(st.text(max_size=6), _json_values), error=_texts
    ),
)
_parts = st.one_of(
    st.builds(TextPart, text=_texts, synthetic=st.booleans(), ignored=st.booleans()),
    st.builds(ReasoningPart, text=_texts),
    st.builds(SubtaskPart, agent=_texts, command=st.none() | _texts),
    st.builds(ToolPart, call_id=st.text(max_size=4), tool=st.just("tool"), state=_states),
    st.builds(ToolResultPart, call_id=st.text(max_size=4), tool=st.just("tool"), output=_texts),
)


@st.composite
def _tails(draw: st.DrawFn) -> list[Message]:
    roles: list[Role] = draw(
        st.lists(st.sampled_from(["user", "assistant", "assistant", "tool"]), max_size=12)
    )
    return [_msg(i, role, draw(st.lists(_parts, max_size=5))) for i, role in enumerate(roles)]


@settings(max_examples=200, deadline=None)
@given(
    tail=_tails(),
    max_lines=st.integers(0, 12),
    text_chars=st.integers(1, 300),
    arg_chars=st.integers(1, 100),
)
def test_r7_2_property_digest_limits(
    tail: list[Message], max_lines: int, text_chars: int, arg_chars: int
) -> None:
    digest = build_tail_digest(
        tail, max_lines=max_lines, text_chars=text_chars, arg_chars=arg_chars
    )
    every = digest_lines(tail, text_chars=text_chars, arg_chars=arg_chars)
    if not digest.text:
        assert not every or max_lines == 0
        return
    out = digest.text.split("\n")
    assert out[:2] == [ACTIVITY_HEADING, ""]
    body = out[2:]
    if body[0] == INTERRUPTED_NOTE:
        assert body[1] == ""
        body = body[2:]
    assert digest.has_interrupted == (INTERRUPTED_NOTE in out)
    # The list (omission note included) never exceeds max_lines.
    assert len(body) <= max_lines
    assert len(body) == min(len(every), max_lines)
    assert [f"- {line.text}" for line in digest.lines] == [b for b in body if b.startswith("- ")]
    # The newest lines are the ones kept.
    assert list(digest.lines) == every[len(every) - len(digest.lines) :]
    for line in body:
        if line.startswith("- assistant: "):
            assert len(line) <= len("- assistant: ") + text_chars
        if line.startswith("- subtask: "):
            assert len(line) <= len("- subtask: ") + text_chars


# -------------------------------------------------------------------- collapse (R7.3)


def _collapse_case() -> tuple[list[Message], Message]:
    boundary = _boundary(5, "msg_0001", "msg_0004", time=1_002)
    msgs = [
        _msg(0, "user", [TextPart(text="start")]),
        _msg(1, "assistant", [TextPart(text="covered")]),  # the watermark
        boundary,  # back-dated: lists right after the watermark
        _msg(2, "assistant", [_completed("read", {"path": "a"})]),
        _msg(3, "user", [TextPart(text="live user words")]),
        _msg(4, "assistant", [TextPart(text="digested")]),
        _msg(6, "assistant", [TextPart(text="after insert")]),
    ]
    return msgs, boundary


def test_r7_3_collapse_filters_by_id_range() -> None:
    msgs, _ = _collapse_case()
    out = collapse_checkpoint_tail(msgs)
    assert [m.id for m in out] == ["msg_0000", "msg_0001", "msg_0005", "msg_0003", "msg_0006"]


def test_r7_3_message_sorting_before_the_boundary_is_still_collapsed() -> None:
    # Made in the same millisecond as the boundary, listed before it: id decides.
    boundary = _boundary(5, "msg_0001", "msg_0004", time=1_002)
    msgs = [
        _msg(1, "assistant", [TextPart(text="covered")], time=1_001),
        _msg(4, "assistant", [TextPart(text="same ms")], time=1_002),
        boundary,
    ]
    assert [m.id for m in collapse_checkpoint_tail(msgs)] == ["msg_0001", "msg_0005"]


def test_r7_3_no_checkpoint_returns_the_same_list() -> None:
    msgs = [_msg(0, "user", [TextPart(text="hi")]), _msg(1, "assistant", [TextPart(text="yo")])]
    assert collapse_checkpoint_tail(msgs) is msgs
    compaction = [*msgs, _msg(2, "user", [CompactionPart(summary="s")])]
    assert collapse_checkpoint_tail(compaction) is compaction
    empty: list[Message] = []
    assert collapse_checkpoint_tail(empty) is empty


def test_r7_3_no_digest_up_to_returns_the_same_list() -> None:
    msgs = [
        _msg(1, "assistant", [TextPart(text="covered")]),
        _boundary(3, "msg_0001", None, time=1_002),
        _msg(2, "assistant", [TextPart(text="tail")]),
    ]
    assert collapse_checkpoint_tail(msgs) is msgs


def test_r7_3_nothing_to_remove_returns_the_same_list() -> None:
    msgs = [
        _msg(1, "assistant", [TextPart(text="covered")]),
        _boundary(4, "msg_0001", "msg_0003", time=1_002),
        _msg(2, "user", [TextPart(text="only user messages in range")]),
        _msg(5, "assistant", [TextPart(text="after")]),
    ]
    assert collapse_checkpoint_tail(msgs) is msgs


def test_r7_3_newest_checkpoint_in_list_order_wins() -> None:
    old = _boundary(3, "msg_0000", "msg_0002", time=1_001)
    new = _boundary(6, "msg_0004", "msg_0005", time=1_005)
    msgs = [
        _msg(0, "assistant", [TextPart(text="a")]),
        old,
        _msg(1, "assistant", [TextPart(text="b")]),
        _msg(2, "assistant", [TextPart(text="c")]),
        _msg(4, "assistant", [TextPart(text="d")]),
        new,
        _msg(5, "assistant", [TextPart(text="e")]),
    ]
    out = collapse_checkpoint_tail(msgs)
    # Only the newest boundary's range (msg_0004, msg_0005] is removed.
    assert [m.id for m in out] == [
        "msg_0000",
        "msg_0003",
        "msg_0001",
        "msg_0002",
        "msg_0004",
        "msg_0006",
    ]


def _written(message: Message, insert_seq: int) -> Message:
    set_insert_seq(message, insert_seq)
    return message


def test_r7_3_a_message_written_after_the_listing_is_not_digested() -> None:
    """R7.3 amended (issue 17 item 4): the id range alone is not what the rebuild
    listed. msg_0003 was made before the rebuild but written after it listed the
    tail (its write order is past ``digest_seq``): it stays, although its id lies in
    the digested range; msg_0002, listed and digested, goes."""
    boundary = Message(
        id="msg_0009",
        session_id="ses_test",
        role="user",
        time_created=1_002,
        parts=[CheckpointPart(covered_up_to="msg_0001", digest_up_to="msg_0004", digest_seq=4)],
    )
    listed = _written(_msg(2, "assistant", [TextPart(text="digested")]), 2)
    newest_listed = _written(_msg(4, "assistant", [TextPart(text="digested too")]), 4)
    late = _written(_msg(3, "assistant", [TextPart(text="written after the listing")]), 6)
    msgs = [_written(_msg(1, "assistant", [TextPart(text="covered")]), 1), boundary]
    msgs += [listed, late, newest_listed]
    part = boundary.checkpoint_part
    assert part is not None
    assert [is_digested(m, part) for m in msgs] == [False, False, True, False, True]
    assert [m.id for m in collapse_checkpoint_tail(msgs)] == ["msg_0001", "msg_0009", "msg_0003"]
    # Without write-order numbers (a part from before the rule, or messages no store
    # wrote), the id range decides, as it always did.
    legacy = part.model_copy(update={"digest_seq": None})
    assert is_digested(late, legacy)
    assert is_digested(_msg(3, "assistant", [TextPart(text="never stored")]), part)


@settings(max_examples=200)
@given(
    seqs=st.lists(st.integers(1, 40), min_size=1, max_size=12, unique=True),
    digest_seq=st.integers(0, 40),
)
def test_r7_3_nothing_written_after_the_listing_is_ever_collapsed(
    seqs: list[int], digest_seq: int
) -> None:
    """Whatever the ids: a message whose write order is past the boundary's
    ``digest_seq`` is kept by the collapse (it was never listed, so never digested)."""
    boundary = Message(
        id="msg_9999",
        session_id="ses_test",
        role="user",
        time_created=1_000,
        parts=[
            CheckpointPart(covered_up_to="msg_0000", digest_up_to="msg_9998", digest_seq=digest_seq)
        ],
    )
    msgs = [boundary] + [
        _written(_msg(i + 1, "assistant", [TextPart(text=f"m{i}")]), seq)
        for i, seq in enumerate(seqs)
    ]
    kept = {m.id for m in collapse_checkpoint_tail(msgs)}
    for message in msgs[1:]:
        assert (message.id in kept) == ((message.insert_seq or 0) > digest_seq)


def test_r7_3_collapse_is_idempotent_and_keeps_inputs() -> None:
    msgs, _ = _collapse_case()
    before = [m.model_dump() for m in msgs]
    once = collapse_checkpoint_tail(msgs)
    assert collapse_checkpoint_tail(once) is once
    assert [m.model_dump() for m in msgs] == before


def test_r7_3_orphan_results_of_collapsed_calls_are_dropped() -> None:
    # Mid-loop rebuild in provider form: the calls were digested (as
    # interrupted); their results arrived after the insert.
    boundary = _boundary(5, "msg_0001", "msg_0004", time=1_002)
    call = ToolPart(call_id="c1", tool="bash", state=ToolStatePending())
    other = ToolPart(call_id="c2", tool="bash", state=ToolStatePending())
    mixed = _msg(
        8,
        "tool",
        [
            ToolResultPart(call_id="c2", tool="bash", output="collapsed call"),
            ToolResultPart(call_id="c3", tool="bash", output="live call"),
        ],
    )
    msgs = [
        _msg(1, "assistant", [TextPart(text="covered")]),
        boundary,
        _msg(4, "assistant", [call, other]),
        _msg(6, "tool", [ToolResultPart(call_id="c1", tool="bash", output="late")]),
        _msg(7, "assistant", [ToolPart(call_id="c3", tool="bash", state=ToolStatePending())]),
        mixed,
    ]
    out = collapse_checkpoint_tail(msgs)
    assert [m.id for m in out] == ["msg_0001", "msg_0005", "msg_0007", "msg_0008"]
    kept_results = [p.call_id for m in out for p in m.parts if isinstance(p, ToolResultPart)]
    assert kept_results == ["c3"]
    # The mixed message was copied, not changed.
    assert len(mixed.parts) == 2
    assert collapse_checkpoint_tail(out) is out


_ROLES = ["user", "assistant", "tool"]


@st.composite
def _collapse_sessions(draw: st.DrawFn) -> list[Message]:
    """Ascending-id sessions in provider form with one or two boundaries placed
    at arbitrary list positions (back-dating can put them anywhere)."""
    count = draw(st.integers(1, 14))
    msgs: list[Message] = []
    open_calls: list[str] = []
    for i in range(count):
        role = draw(st.sampled_from(_ROLES))
        if role == "assistant":
            parts: list[Part] = [TextPart(text="a")]
            for _ in range(draw(st.integers(0, 2))):
                call_id = f"c{i}_{len(open_calls)}"
                open_calls.append(call_id)
                parts.append(ToolPart(call_id=call_id, tool="bash", state=ToolStatePending()))
        elif role == "tool" and open_calls:
            take = draw(st.integers(1, len(open_calls)))
            parts = [ToolResultPart(call_id=c, tool="bash", output="o") for c in open_calls[:take]]
            del open_calls[:take]
        else:
            role = "user"
            parts = [TextPart(text="u")]
        msgs.append(_msg(i * 2, role, parts))
    for extra in range(draw(st.integers(1, 2))):
        ids = sorted(m.id for m in msgs)
        covered = draw(st.sampled_from(ids))
        digest = draw(st.sampled_from([None, *ids]))
        boundary = _boundary(1_000 + extra, covered, digest, time=0)
        msgs.insert(draw(st.integers(0, len(msgs))), boundary)
    return msgs


@settings(max_examples=300, deadline=None)
@given(msgs=_collapse_sessions())
def test_r7_3_property_collapse(msgs: list[Message]) -> None:
    before = [m.model_dump() for m in msgs]
    out = collapse_checkpoint_tail(msgs)
    # Inputs are never modified.
    assert [m.model_dump() for m in msgs] == before
    # Idempotent; the second pass removes nothing and returns its input.
    assert collapse_checkpoint_tail(out) is out
    # User messages always stay, in order.
    assert [m for m in msgs if m.role == "user"] == [m for m in out if m.role == "user"]
    # Output is a subsequence of the input (by id), order kept.
    in_ids = [m.id for m in msgs]
    out_ids = [m.id for m in out]
    positions = [in_ids.index(i) for i in out_ids]
    assert positions == sorted(positions)
    boundary = next(
        (m for m in reversed(msgs) if m.role == "user" and m.checkpoint_part is not None), None
    )
    part = boundary.checkpoint_part if boundary is not None else None
    if part is None or part.digest_up_to is None:
        assert out is msgs
        return
    in_range = [
        m for m in msgs if part.covered_up_to < m.id <= part.digest_up_to and m.role != "user"
    ]
    if not in_range:
        assert out is msgs
    # The id-range rule: no non-user message in (covered, digest] survives.
    assert not [
        m for m in out if part.covered_up_to < m.id <= part.digest_up_to and m.role != "user"
    ]
    # No tool result in the output answers a call the collapse removed.
    removed_calls = {p.call_id for m in in_range for p in m.parts if isinstance(p, ToolPart)}
    kept_results = {p.call_id for m in out for p in m.parts if isinstance(p, ToolResultPart)}
    assert not removed_calls & kept_results
    # Whenever something was removed the result is a new list.
    if len(out) != len(msgs):
        assert out is not msgs
