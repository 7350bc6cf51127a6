"""Malformed input: TranscriptError naming file and line (strict), skip and report
(lenient); never a raw exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.errors import MimoCtxError, TranscriptError
from mimo_ctx.importers import aload_transcript, detect_format, load_transcript

from .builders import assistant, user, write_jsonl


def _good_lines() -> list[dict[str, object]]:
    return [
        user("u1", None, 0, "hello"),
        assistant("a1", "u1", 1, [{"type": "text", "text": "hi"}], msg_id="m1"),
        user("u2", "a1", 2, "more"),
    ]


def _raises(path: Path, *, format: str | None = None, strict: bool = True) -> TranscriptError:
    with pytest.raises(TranscriptError) as info:
        load_transcript(path, format=format, strict=strict)
    return info.value


def test_truncated_line_strict_names_file_and_line(tmp_path: Path) -> None:
    truncated = json.dumps(assistant("a2", "u2", 3, [], msg_id="m2"))[:40]
    path = write_jsonl(tmp_path / "t.jsonl", [*_good_lines(), truncated])
    err = _raises(path)
    assert err.path == str(path)
    assert err.line == 4
    assert str(err).startswith(f"{path}:4: invalid JSON")


def test_truncated_line_lenient_skips_and_reports(tmp_path: Path) -> None:
    truncated = json.dumps(assistant("a2", "u2", 3, [], msg_id="m2"))[:40]
    path = write_jsonl(tmp_path / "t.jsonl", [*_good_lines(), truncated])
    result = load_transcript(path, strict=False)
    assert len(result.messages) == 3
    (skipped,) = result.skipped
    assert (skipped.path, skipped.line) == (str(path), 4)
    assert "invalid JSON" in skipped.reason
    assert result.counts()["skipped"] == 1


def test_garbage_line_in_the_middle(tmp_path: Path) -> None:
    lines: list[dict[str, object] | str] = [*_good_lines()]
    lines.insert(1, "this is not json at all")
    path = write_jsonl(tmp_path / "g.jsonl", lines)
    assert _raises(path).line == 2
    result = load_transcript(path, strict=False)
    assert [s.line for s in result.skipped] == [2]
    assert len(result.messages) == 3


def test_garbage_first_line_strict_and_lenient(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "g.jsonl", ["%%% garbage %%%", *_good_lines()])
    err = _raises(path)
    assert err.line == 1
    result = load_transcript(path, strict=False)
    assert result.format == "claude-code"
    assert [s.line for s in result.skipped] == [1]
    assert len(result.messages) == 3


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("content", [b"", b"   \n\n  \t\n"])
def test_empty_file_is_an_error_in_both_modes(
    tmp_path: Path, content: bytes, *, strict: bool
) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    err = _raises(path, strict=strict)
    assert err.line == 1
    assert "empty file" in str(err)
    assert str(path) in str(err)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("42", "wrong top-level type: expected a JSON object or array, got number"),
        ('"text"', "got string"),
        ("null", "got null"),
        ('{"hello": 1}', "unknown transcript format"),
        ("[1, 2, 3]", "unknown transcript format"),
    ],
)
def test_wrong_top_level_type(tmp_path: Path, document: str, expected: str) -> None:
    path = tmp_path / "doc.json"
    path.write_text(document)
    err = _raises(path)
    assert expected in str(err)
    assert err.line == 1
    assert err.path == str(path)
    assert _raises(path, strict=False).line == 1


@pytest.mark.parametrize("strict", [True, False])
def test_binary_file(tmp_path: Path, *, strict: bool) -> None:
    path = tmp_path / "image.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00" + bytes(range(256)))
    err = _raises(path, strict=strict)
    assert "binary" in str(err)
    assert err.line == 3  # the first NUL byte is after "\r\n" and "\x1a\n"
    assert err.path == str(path)


def test_non_utf8_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    good = [json.dumps(line).encode() for line in _good_lines()]
    path.write_bytes(b"\n".join([good[0], b'{"type": "user", "x": "caf\xe9"}', *good[1:]]) + b"\n")
    err = _raises(path)
    assert (err.line, "not UTF-8" in str(err)) == (2, True)
    result = load_transcript(path, strict=False)
    assert [s.line for s in result.skipped] == [2]
    assert len(result.messages) == 3


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ({"type": "user", "uuid": "u9", "parentUuid": "u2", "timestamp": "2026-01-01T00:00:09Z"},
         "has no 'message'"),
        ({**user("u9", "u2", 9, "x"), "timestamp": "yesterday"}, "not an ISO 8601 time"),
        ({k: v for k, v in user("u9", "u2", 9, "x").items() if k != "uuid"}, "has no 'uuid'"),
        ({**user("u9", "u2", 9, "x"), "isSidechain": "yes"}, "isSidechain must be a boolean"),
        ({**user("u9", "u2", 9, "x"), "message": {"role": "user", "content": 7}},
         "must be a string or an array"),
        ({**user("u9", "u2", 9, "x"), "message": {"role": "assistant", "content": "x"}},
         "message.role is 'assistant' in a user line"),
        (assistant("a9", "u2", 9, [{"type": "tool_use", "name": "Bash", "input": {}}], msg_id="m"),
         "message.content[0] has no 'id' field"),
        (assistant("a9", "u2", 9, [{"type": "tool_use", "id": "t", "name": "Bash", "input": [1]}],
                   msg_id="m"),
         "message.content[0].input must be an object, got array"),
        (assistant("a9", "u2", 9, [{"text": "no type"}], msg_id="m"), "has no 'type' field"),
        (assistant("a9", "u2", 9, [{"type": "tool_result", "tool_use_id": "t"}], msg_id="m"),
         "cannot be in a assistant message"),
        ({"uuid": "x"}, "the line has no 'type' field"),
        ([1, 2], "a line must be an object, got array"),
    ],
)  # fmt: skip
def test_malformed_records(tmp_path: Path, broken: object, reason: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [*_good_lines(), broken]) + "\n")
    err = _raises(path, format="claude-code")
    assert err.line == 4
    assert reason in str(err)
    result = load_transcript(path, strict=False, format="claude-code")
    assert [s.line for s in result.skipped] == [4]
    assert reason in result.skipped[0].reason
    assert len(result.messages) == 3


def test_sweagent_bad_history_item_names_its_line(tmp_path: Path) -> None:
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
        {"content": "no role here"},
        {"role": "assistant", "content": "done"},
    ]
    text = '{"environment": "e",\n "history": [\n' + ",\n".join(json.dumps(h) for h in history)
    path = tmp_path / "x.traj"
    path.write_text(text + "\n]}\n")
    err = _raises(path)
    assert err.line == 5
    assert "history[2] has no 'role' field" in str(err)
    result = load_transcript(path, strict=False)
    assert [(s.line, s.reason) for s in result.skipped] == [(5, "history[2] has no 'role' field")]
    assert [m.role for m in result.messages] == ["user", "assistant"]


def test_truncated_pretty_json_names_line(tmp_path: Path) -> None:
    doc = {"history": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    text = json.dumps(doc, indent=2)
    path = tmp_path / "cut.traj"
    path.write_text(text[: len(text) // 2])
    err = _raises(path)
    assert err.path == str(path)
    assert err.line is not None
    assert err.line > 1
    assert "invalid JSON" in str(err)


def test_unknown_format_name_and_unreadable_paths(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ok.jsonl", _good_lines())
    assert "unknown format 'yaml'" in str(_raises(path, format="yaml"))
    assert "cannot read" in str(_raises(tmp_path / "missing.jsonl"))
    assert "cannot read" in str(_raises(tmp_path))


def test_explicit_format_mismatch_is_a_transcript_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ok.jsonl", _good_lines())
    err = _raises(path, format="sweagent")
    assert isinstance(err, MimoCtxError)
    assert err.path == str(path)
    traj = tmp_path / "t.traj"
    traj.write_text(json.dumps({"history": []}, indent=2))
    err = _raises(traj, format="claude-code")
    assert err.line == 1


def test_detect_format(tmp_path: Path) -> None:
    cc = write_jsonl(tmp_path / "a.jsonl", _good_lines())
    traj = tmp_path / "b.traj"
    traj.write_text(json.dumps({"history": [], "trajectory": []}))
    chat = tmp_path / "c.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    wrapped = tmp_path / "d.json"
    wrapped.write_text(json.dumps({"model": "m", "messages": []}))
    responses = tmp_path / "e.json"
    responses.write_text(json.dumps([{"type": "function_call", "call_id": "c", "name": "f"}]))
    chat_lines = write_jsonl(tmp_path / "f.jsonl", [{"role": "user", "content": "x"}] * 2)
    assert [detect_format(p) for p in (cc, traj, chat, wrapped, responses, chat_lines)] == [
        "claude-code",
        "sweagent",
        "openai-chat",
        "openai-chat",
        "openai-responses",
        "openai-chat",
    ]


async def test_aload_transcript_off_the_loop(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ok.jsonl", _good_lines())
    result = await aload_transcript(path, session_id="ses_given")
    assert result.session.id == "ses_given"
    assert all(m.session_id == "ses_given" for m in result.messages)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(TranscriptError, match="empty file"):
        await aload_transcript(empty)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(
            ["type", "uuid", "parentUuid", "message", "role", "content", "history", "messages",
             "tool_calls", "id", "name", "input", "timestamp", "tool_call_id", "text"]
        ),
        inner,
        max_size=5,
    ),
    max_leaves=15,
)  # fmt: skip


def _only_clean_errors(path: Path) -> None:
    for strict in (True, False):
        error: TranscriptError | None = None
        try:
            result = load_transcript(path, strict=strict, subagents=[], base_time_ms=0)
        except TranscriptError as exc:
            error = exc
        else:
            msg_ids = [m.id for m in result.messages]
            assert msg_ids == sorted(msg_ids)
        if error is not None:
            assert error.path == str(path)
            # The catch-all at the boundary must never be what reports a problem.
            assert "cannot import the transcript" not in str(error)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_give_a_result_or_a_clean_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.jsonl"
        path.write_bytes(data)
        _only_clean_errors(path)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(_JSON, min_size=1, max_size=6), as_lines=st.booleans())
def test_arbitrary_json_gives_a_result_or_a_clean_error(
    values: list[object], *, as_lines: bool
) -> None:
    text = "\n".join(json.dumps(v) for v in values) if as_lines else json.dumps(values[0])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.json"
        path.write_text(text)
        _only_clean_errors(path)
