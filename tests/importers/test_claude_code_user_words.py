"""Issue 14 findings 1 and 7: the Claude Code importer keeps every word the user typed
and keeps the CLI's own text out of them (decisions in ``mimo_ctx.importers.claude_code``).

Each test here failed before the fix: queued messages were not imported at all, a
slash command was one synthetic part (its arguments lost to "Recent user input"),
machine blocks inside a typed text were quoted as the user's words, and terminal
colour codes were kept in sent text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.importers import load_transcript
from mimo_ctx.importers._machine_text import split_machine_text, user_text_parts
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart

from .builders import assistant, iso, tool_result, tool_use, user, write_jsonl


def _typed(message: Message) -> str:
    return "\n".join(
        p.text
        for p in message.parts
        if isinstance(p, TextPart) and not p.synthetic and not p.ignored
    )


def _kinds(message: Message) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for p in message.parts:
        if isinstance(p, TextPart):
            kind = "ignored" if p.ignored else "synthetic" if p.synthetic else "typed"
            out.append((kind, p.text))
    return out


def _queued(at: float, content: Any, operation: str = "enqueue") -> dict[str, Any]:
    line: dict[str, Any] = {
        "type": "queue-operation",
        "operation": operation,
        "timestamp": iso(at),
        "sessionId": "s-1",
    }
    if content is not None:
        line["content"] = content
    return line


def _loop(extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user request, two tool rounds (t=1..4), a final answer at t=5; ``extra`` lines
    are placed after the first tool round."""
    return [
        user("u1", None, 0, "Implement the epic"),
        assistant("a1", "u1", 1, [tool_use("t1", command="make")], msg_id="m1"),
        user("r1", "a1", 2, [tool_result("t1", "built")]),
        *extra,
        assistant("a2", "r1", 3, [tool_use("t2", command="make test")], msg_id="m2"),
        user("r2", "a2", 4, [tool_result("t2", "ok")]),
        assistant("a3", "r2", 5, [{"type": "text", "text": "done"}], msg_id="m3"),
    ]


def test_queued_message_typed_while_busy_is_a_user_message(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "q.jsonl",
        _loop([_queued(2.5, "new beads were added. tackle them"), _queued(2.7, None, "remove")]),
    )
    messages = load_transcript(path).messages
    users = [m for m in messages if m.role == "user"]
    assert [_typed(m) for m in users] == ["Implement the epic", "new beads were added. tackle them"]
    queued = users[1]
    assert queued.agent == MAIN_AGENT
    assert queued.metadata["claude_code"]["queued"] is True
    assert queued.metadata["claude_code"]["line"] == 4
    # Placed where it was typed: after the first tool round, before the next call.
    roles = [(m.role, _typed(m) or None) for m in messages]
    assert roles[2] == ("user", "new beads were added. tackle them")
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant", "assistant"]


def test_queued_message_delivered_as_its_own_turn_is_not_doubled(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "q.jsonl",
        [
            *_loop([_queued(2.5, "/mcp"), _queued(2.6, "check again")]),
            user("u9", "a3", 6, "<command-name>/mcp</command-name><command-args></command-args>"),
            user("u10", "u9", 7, "check again"),
        ],
    )
    users = [m for m in load_transcript(path).messages if m.role == "user"]
    assert [_typed(m) for m in users] == ["Implement the epic", "/mcp", "check again"]
    assert not any(m.metadata["claude_code"].get("queued") for m in users)


def test_queued_machine_text_and_attachment_records(tmp_path: Path) -> None:
    notification = "<task-notification><task-id>b1</task-id></task-notification>\nRead the file"
    attachment = {
        "type": "attachment",
        "uuid": "att1",
        "parentUuid": "r1",
        "timestamp": iso(2.8),
        "attachment": {"type": "queued_command", "prompt": "also run credo"},
    }
    path = write_jsonl(
        tmp_path / "q.jsonl",
        _loop([_queued(2.4, notification), _queued(2.5, "also run credo"), attachment]),
    )
    users = [m for m in load_transcript(path).messages if m.role == "user"]
    # The CLI's own notification is no typed message; the enqueue and its
    # attachment are one message.
    assert [_typed(m) for m in users] == ["Implement the epic", "also run credo"]


def test_slash_command_keeps_its_arguments_as_typed(tmp_path: Path) -> None:
    wrapper = (
        "<command-message>orchestrator is running…</command-message>\n"
        "<command-name>/orchestrator</command-name>\n"
        "<command-args>create TODO app by Next.js</command-args>"
    )
    path = write_jsonl(tmp_path / "c.jsonl", [user("u1", None, 0, wrapper)])
    result = load_transcript(path)
    [message] = result.messages
    assert _kinds(message) == [
        ("typed", "/orchestrator create TODO app by Next.js"),
        ("ignored", wrapper),
    ]
    assert result.session.title == "/orchestrator create TODO app by Next.js"


def test_machine_blocks_and_colour_codes_stay_out_of_typed_words(tmp_path: Path) -> None:
    typed_with_reminder = (
        "fix the login bug<system-reminder>The user opened a file.</system-reminder>"
    )
    stdout = "<local-command-stdout>\x1b[2mCompacted (ctrl+o)\x1b[22m</local-command-stdout>"
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            user("u1", None, 0, typed_with_reminder),
            user("u2", "u1", 1, stdout),
            user("u3", "u2", 2, [{"type": "text", "text": "[Request interrupted by user]"}]),
            user("u4", "u3", 3, "colours \x1b[31mred\x1b[0m please"),
        ],
    )
    messages = load_transcript(path).messages
    assert _kinds(messages[0]) == [
        ("typed", "fix the login bug"),
        ("synthetic", "<system-reminder>The user opened a file.</system-reminder>"),
        ("ignored", typed_with_reminder),
    ]
    # Sent without escape sequences; the original stays stored (ignored).
    assert _kinds(messages[1]) == [
        ("synthetic", "<local-command-stdout>Compacted (ctrl+o)</local-command-stdout>"),
        ("ignored", stdout),
    ]
    assert _kinds(messages[2]) == [("synthetic", "[Request interrupted by user]")]
    original = messages[3].parts[1]
    assert isinstance(original, TextPart)
    assert _kinds(messages[3]) == [("typed", "colours red please"), ("ignored", original.text)]
    for m in messages:
        for p in m.parts:
            if isinstance(p, TextPart) and not p.ignored:
                assert "\x1b" not in p.text


_TAGS = ("system-reminder", "local-command-stdout")
_plain = st.text(alphabet="abc xyz\n.", max_size=20)


def _tagged(tag: str, body: str) -> str:
    return f"<{tag}>{body}</{tag}>"


_block = st.builds(_tagged, st.sampled_from(_TAGS), st.text("qrs \n", max_size=10))
_ansi = st.sampled_from(["\x1b[31m", "\x1b[0m", "\x1b]0;title\x07"])


@settings(max_examples=200)
@given(st.lists(st.one_of(_plain, _block, _ansi), max_size=8))
def test_property_split_loses_nothing_and_types_no_machine_text(pieces: list[str]) -> None:
    raw = "".join(pieces)
    typed, machine = split_machine_text(raw, _TAGS)
    parts = user_text_parts(raw, typed, machine)
    sent = [p for p in parts if not p.ignored]
    # Nothing lost: the stored parts hold the original text, whole.
    assert raw in [p.text for p in parts] or (len(parts) == 1 and parts[0].text == raw)
    for p in sent:
        assert "\x1b" not in p.text
        if not p.synthetic:
            for tag in _TAGS:
                assert f"<{tag}>" not in p.text
    # A text with no machine block and no escape code is one plain part.
    if not machine and "\x1b" not in raw:
        assert parts == [TextPart(id=parts[0].id, text=raw)]


def test_long_title_is_not_cut_inside_a_word(tmp_path: Path) -> None:
    """The session title (first typed line) ends on a word boundary (finding 7)."""
    text = "Work on bead spotter-4te. Run bd show spotter-4te to see the issue details and bd ready"
    path = write_jsonl(tmp_path / "t.jsonl", [user("u1", None, 0, text)])
    title = load_transcript(path).session.title
    assert (
        title == "Work on bead spotter-4te. Run bd show spotter-4te to see the issue details and…"
    )
    assert len(title) <= 80
