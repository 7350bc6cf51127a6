"""The recent-activity digest's fast paths against the plain computation (issue 18).

The digest formats only the lines it keeps, collapses only the head of a long
text it cuts, escapes strings without building a JSON encoder and matches each
argument name once. Each must give byte for byte what the plain version gives:
the plain versions live here, as the reference, and Hypothesis draws the inputs.
"""

from __future__ import annotations

import json
import reprlib
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import strategies
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mimo_ctx import digest
from mimo_ctx._util import escape_html_headings, one_line
from mimo_ctx.digest import (
    ACTIVITY_HEADING,
    INTERRUPTED_NOTE,
    DigestLine,
    TailDigest,
    build_tail_digest,
    digest_lines,
    elide_path,
    is_path_argument,
    omitted_note,
    truncate,
)
from mimo_ctx.messages import (
    Message,
    Part,
    Role,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    user_input_text,
)

# --------------------------------------------------------------------------- reference


def _plain_truncate(text: str, limit: int) -> str:
    flat = one_line(text)
    if len(flat) <= limit:
        return flat
    kept = flat[: limit - 1]
    if kept and kept[-1] != " " and flat[limit - 1] != " ":
        reach = min(digest.WORD_REACH, limit // 4)
        space = kept.rfind(" ", len(kept) - reach) if reach else -1
        if space > 0:
            kept = kept[:space]
    return kept.rstrip(" ") + "…"


def _plain_is_path_argument(key: str, value: str) -> bool:
    if digest._PATH_KEY.search(key.strip()):  # pyright: ignore[reportPrivateUsage]
        return True
    return ("/" in value or "\\" in value) and not any(c.isspace() for c in value)


def _plain_shorten(key: str, value: str, limit: int) -> str:
    if _plain_is_path_argument(key, value):
        return elide_path(value, limit)
    return _plain_truncate(value, limit)


def _plain_call(tool: str, arguments: dict[str, Any], limit: int, widths: Mapping[str, int]) -> str:
    shown: list[str] = []
    for k, v in arguments.items():
        key = one_line(str(k))
        if isinstance(v, str):
            cut = _plain_shorten(key, v, widths.get(v, limit))
            shown.append(f"{key}={json.dumps(cut, ensure_ascii=False)}")
        else:
            try:
                value = json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            except (ValueError, TypeError, RecursionError):
                value = reprlib.repr(v)
            shown.append(f"{key}={_plain_truncate(value, limit)}")
    return f"{one_line(tool)}({', '.join(shown)})"


def _plain_widths(messages: Sequence[Message], limit: int) -> dict[str, int]:
    values: set[str] = set()
    for message in messages:
        if message.role != "assistant" or message.is_boundary:
            continue
        for part in message.parts:
            if isinstance(part, ToolPart):
                for key, value in part.state.input.items():
                    if (
                        isinstance(value, str)
                        and len(value) > limit
                        and _plain_is_path_argument(one_line(str(key)), value)
                    ):
                        values.add(value)
    widths: dict[str, int] = {}
    pending = sorted(values)
    width = limit
    while len(pending) > 1:
        groups: dict[str, list[str]] = {}
        for value in pending:
            groups.setdefault(elide_path(value, width), []).append(value)
        pending = [v for group in groups.values() if len(group) > 1 for v in group]
        if pending and width >= max(len(v) for v in pending):
            break
        width *= 2
        for value in pending:
            widths[value] = width
    return widths


def _plain_lines(
    messages: Sequence[Message], text_chars: int, arg_chars: int, quoted: Collection[str] | None
) -> list[DigestLine]:
    """Every line of every message, formatted eagerly (the digest as first written)."""
    results: dict[str, ToolResultPart] = {}
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                results.setdefault(part.call_id, part)
    widths = _plain_widths(messages, arg_chars)
    lines: list[DigestLine] = []
    for message in messages:
        if quoted is not None and message.role == "user":
            typed = user_input_text(message)
            if typed is not None:
                if message.id in quoted:
                    where = digest.USER_QUOTED_WHERE
                    lines.append(DigestLine(f"user message {message.id} (quoted under {where})"))
                else:
                    lines.append(DigestLine(f"user: {_plain_truncate(typed, text_chars)}"))
            continue
        if message.role != "assistant" or message.is_boundary:
            continue
        for part in message.parts:
            if isinstance(part, TextPart):
                if part.ignored or not part.text.strip():
                    continue
                lines.append(DigestLine(f"assistant: {_plain_truncate(part.text, text_chars)}"))
            elif isinstance(part, SubtaskPart):
                label = part.command or part.agent
                lines.append(DigestLine(f"subtask: {_plain_truncate(label, text_chars)}"))
            elif isinstance(part, ToolPart):
                call = _plain_call(part.tool, part.state.input, arg_chars, widths)
                state = part.state
                result = results.get(part.call_id)
                if isinstance(state, ToolStateError):
                    line = DigestLine(f"{call} → error: {_plain_truncate(state.error, arg_chars)}")
                elif isinstance(state, ToolStateCompleted):
                    line = DigestLine(call)
                elif result is None:
                    line = DigestLine(f"{call} → interrupted", interrupted=True)
                elif result.is_error:
                    line = DigestLine(
                        f"{call} → error: {_plain_truncate(result.output, arg_chars)}"
                    )
                else:
                    line = DigestLine(call)
                lines.append(line)
    return lines


def _plain_digest(
    messages: Sequence[Message],
    max_lines: int,
    text_chars: int,
    arg_chars: int,
    quoted: Collection[str] | None,
) -> TailDigest:
    every = _plain_lines(messages, text_chars, arg_chars, quoted)
    if not every or max_lines == 0:
        return TailDigest(text="", lines=(), omitted=len(every))
    omitted = 0
    kept = every
    if len(every) > max_lines:
        room = max_lines - 1 if max_lines > 1 else max_lines
        kept = every[len(every) - room :]
        omitted = len(every) - room
    out = [ACTIVITY_HEADING, ""]
    if any(line.interrupted for line in kept):
        out += [INTERRUPTED_NOTE, ""]
    if omitted and max_lines > 1:
        out.append(omitted_note(omitted))
    out += [f"- {escape_html_headings(line.text)}" for line in kept]
    return TailDigest(text="\n".join(out), lines=tuple(kept), omitted=omitted)


# --------------------------------------------------------------------------- inputs

_SPACES = " \t\n\r\x0b\x0c\x1c\x85\xa0\u2028\u3000"
_words = st.text(alphabet=st.sampled_from([*'ab/\\.é中😀"<h1>', *_SPACES]), max_size=40)


def _repeated(word: str, times: int) -> str:
    return word * times


def _gap(before: str, blanks: int, after: str) -> str:
    return before + " " * blanks + after


_long_words = st.builds(_repeated, _words, st.integers(min_value=1, max_value=30))
# Words, a long run of blanks, words: what a cut of the collapsed head must see past.
_gapped = st.builds(_gap, _words, st.integers(min_value=0, max_value=400), _words)
_text = st.one_of(_words, _long_words, _gapped, strategies.texts(120))
_path = st.builds(
    "/".join,
    st.lists(st.sampled_from(["src", "a", "very_long_directory_name", "x y", "é", ""]), max_size=8),
)
_arg_value = st.one_of(_text, _path, strategies.json_values(4))
_arg_key = st.sampled_from(["path", "file_path", " Paths ", "pattern", "cmd", "url", "x\ny", "k"])
_input = st.dictionaries(_arg_key, _arg_value, max_size=4)
_call_ids = st.sampled_from(["c1", "c2", "c3", "c4"])
_states = st.one_of(
    st.builds(ToolStatePending, input=_input),
    st.builds(ToolStateRunning, input=_input),
    st.builds(ToolStateCompleted, input=_input, output=_text),
    st.builds(ToolStateError, input=_input, error=_text),
)
_parts: st.SearchStrategy[Part] = st.one_of(
    st.builds(TextPart, text=_text, ignored=st.booleans(), synthetic=st.booleans()),
    st.builds(
        ToolPart, call_id=_call_ids, tool=st.sampled_from(["read", "b a\tsh"]), state=_states
    ),
    st.builds(
        ToolResultPart,
        call_id=_call_ids,
        tool=st.just("read"),
        output=_text,
        is_error=st.booleans(),
    ),
    st.builds(
        SubtaskPart,
        agent=st.sampled_from(["explore", "sub\nagent"]),
        description=_text,
        prompt=_text,
        command=st.none() | _text,
    ),
    strategies.parts(),
)


@st.composite
def _tails(draw: st.DrawFn) -> list[Message]:
    count = draw(st.integers(min_value=0, max_value=25))
    out: list[Message] = []
    for index in range(count):
        role: Role = draw(st.sampled_from(["user", "assistant", "assistant", "tool"]))
        out.append(
            Message(
                id=f"msg_{index:04d}",
                session_id="ses_1",
                role=role,
                agent=draw(st.sampled_from(["main", "main", "main", "sub-1"])),
                time_created=1_700_000_000_000 + index,
                parts=draw(st.lists(_parts, max_size=4)),
            )
        )
    return out


# --------------------------------------------------------------------------- tests


@settings(max_examples=400, deadline=None)
@given(text=_text, limit=st.integers(min_value=1, max_value=300))
@example(text="word " * 200, limit=5)
@example(text="a" * 1000 + " b", limit=1)
@example(text=" " * 900 + "x", limit=3)
@example(text="a" * 5 + " " * 200 + "b", limit=5)  # the head alone is exactly the limit
def test_truncate_as_the_plain_cut(text: str, limit: int) -> None:
    assert truncate(text, limit) == _plain_truncate(text, limit)


def test_the_whitespace_pattern_is_str_isspace_for_every_character() -> None:
    everything = [chr(c) for c in range(sys.maxunicode + 1)]
    spaces = "".join(c for c in everything if c.isspace())
    found = "".join(c for c in everything if digest._WHITESPACE.match(c))  # pyright: ignore[reportPrivateUsage]
    assert found == spaces


@settings(max_examples=300, deadline=None)
@given(key=st.one_of(_arg_key, st.text(max_size=12)), value=st.one_of(_text, _path))
def test_is_path_argument_as_the_plain_check(key: str, value: str) -> None:
    assert is_path_argument(key, value) == _plain_is_path_argument(key, value)


@settings(max_examples=200, deadline=None)
@given(value=st.text())
def test_strings_escape_as_json_dumps(value: str) -> None:
    assert digest.encode_basestring(value) == json.dumps(value, ensure_ascii=False)  # pyright: ignore[reportPrivateUsage]


@settings(max_examples=300, deadline=None)
@given(
    tail=_tails(),
    max_lines=st.integers(min_value=0, max_value=30),
    text_chars=st.integers(min_value=1, max_value=40),
    arg_chars=st.integers(min_value=1, max_value=24),
    quote=st.one_of(st.none(), st.sets(st.integers(min_value=0, max_value=25))),
)
def test_the_digest_formats_what_it_keeps_as_the_whole_list(
    tail: list[Message],
    max_lines: int,
    text_chars: int,
    arg_chars: int,
    quote: set[int] | None,
) -> None:
    quoted = None if quote is None else {f"msg_{i:04d}" for i in quote}
    expected = _plain_digest(tail, max_lines, text_chars, arg_chars, quoted)
    got = build_tail_digest(
        tail, max_lines=max_lines, text_chars=text_chars, arg_chars=arg_chars, quoted=quoted
    )
    assert got == expected
    every = digest_lines(tail, text_chars=text_chars, arg_chars=arg_chars, quoted=quoted)
    assert every == _plain_lines(tail, text_chars, arg_chars, quoted)


def _assistant(index: int, *parts: Part, role: Role = "assistant") -> Message:
    return Message(
        id=f"msg_{index:04d}",
        session_id="ses_1",
        role=role,
        time_created=1_700_000_000_000 + index,
        parts=list(parts),
    )


def _read(call_id: str, path: str, state: type[ToolStateCompleted | ToolStatePending]) -> ToolPart:
    if state is ToolStateCompleted:
        return ToolPart(
            call_id=call_id, tool="read", state=ToolStateCompleted(input={"path": path}, output="")
        )
    return ToolPart(call_id=call_id, tool="read", state=ToolStatePending(input={"path": path}))


@settings(max_examples=200, deadline=None)
@given(
    first=_tails(),
    steps=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10),  # messages the watermark passes
            _tails(),  # messages that arrive
            st.lists(st.integers(min_value=0, max_value=40), max_size=3),  # changed ones
            st.integers(min_value=1, max_value=40),  # text_chars
            st.integers(min_value=1, max_value=24),  # arg_chars
        ),
        min_size=1,
        max_size=4,
    ),
    replacement=st.lists(_parts, max_size=3),
    max_lines=st.integers(min_value=1, max_value=30),
)
# The same message under other cut lengths.
@example(
    first=[_assistant(1, TextPart(text="words enough to be cut at ten characters"))],
    steps=[(0, [], [], 40, 24), (0, [], [], 10, 24)],
    replacement=[],
    max_lines=10,
)
# A call that did not finish, then its result arrives: its line changes.
@example(
    first=[_assistant(1, _read("c1", "a.py", ToolStatePending))],
    steps=[
        (0, [], [], 40, 24),
        (
            0,
            [
                _assistant(
                    2,
                    ToolResultPart(call_id="c1", tool="read", output="no", is_error=True),
                    role="tool",
                )
            ],
            [],
            40,
            24,
        ),
    ],
    replacement=[],
    max_lines=10,
)
# A long path, then another one that elides to the same text: both are shown
# longer; once the other has left the tail, at the usual cut again.
@example(
    first=[_assistant(1, _read("c1", "src/very_long_directory_name/a/b.py", ToolStateCompleted))],
    steps=[
        (0, [], [], 40, 12),
        (
            0,
            [_assistant(2, _read("c2", "src/other_long_directory_nam/a/b.py", ToolStateCompleted))],
            [],
            40,
            12,
        ),
        (1, [], [], 40, 12),
    ],
    replacement=[],
    max_lines=10,
)
def test_lines_remembered_between_digests_as_the_plain_digest(
    first: list[Message],
    steps: list[tuple[int, list[Message], list[int], int, int]],
    replacement: list[Part],
    max_lines: int,
) -> None:
    # Rebuild after rebuild over one window's message objects: the watermark moves
    # on, new messages arrive, some are changed (a new object, as stores return
    # them), and the cut lengths may change. Each digest is the plain one.
    tail = first
    for passed, arrived, changed, text_chars, arg_chars in steps:
        tail = tail[passed:] + arrived
        for index in changed:
            if index < len(tail):
                tail[index] = tail[index].model_copy(update={"parts": replacement})
        got = build_tail_digest(
            tail, max_lines=max_lines, text_chars=text_chars, arg_chars=arg_chars
        )
        assert got == _plain_digest(tail, max_lines, text_chars, arg_chars, None)
