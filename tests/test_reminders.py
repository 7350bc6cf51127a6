"""Tests of closing lines and reminders (SPEC R5.7, R5.8, R8.3, A12)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx.messages import Message, Part, Role, TextPart, ToolPart, ToolStatePending
from mimo_ctx.reminders import (
    AUTONOMOUS_LOOP_REMINDER,
    CLOSING_ANSWER_USER,
    CLOSING_NOTHING_OPEN,
    CLOSING_WITH_ACTIVITY,
    CLOSING_WITHOUT_ACTIVITY,
    PER_TURN_MARKER,
    LastMessageInfo,
    OpenWork,
    append_per_turn_reminder,
    closing_line,
    closing_text,
    compute_last_message_info,
    has_per_turn_reminder,
    next_step_reminder,
    per_turn_reminder,
    per_turn_reminder_part,
    progress_check_reminder,
    reminder_for,
    with_per_turn_reminder,
)
from mimo_ctx.tokens import estimate_text_tokens


def _msg(
    index: int, role: Role, parts: Sequence[Part] = (), *, finish: str | None = None
) -> Message:
    return Message(
        id=f"msg_{index:04d}",
        session_id="ses_test",
        role=role,
        time_created=1_000 + index,
        finish=finish,
        parts=list(parts) or [TextPart(text="x")],
    )


def _call() -> ToolPart:
    return ToolPart(call_id="c", tool="bash", state=ToolStatePending())


# ---------------------------------------------------------------- R5.7 closing lines


def test_r5_7_closing_lines_verbatim() -> None:
    assert CLOSING_WITH_ACTIVITY == (
        "This session is continued from a checkpoint. The blocks above cover earlier "
        "history and the recent activity list. Resume the last task from that list and "
        "any live messages after it. Do not recap this dump."
    )
    assert CLOSING_WITHOUT_ACTIVITY == (
        "This session is continued from a checkpoint. The blocks above cover earlier "
        "history. Resume the last task from the most recent live messages. Do not recap "
        "this dump."
    )
    assert closing_line(True) == CLOSING_WITH_ACTIVITY
    assert closing_line(False) == CLOSING_WITHOUT_ACTIVITY


# ---------------------------------------------------------------- R5.8 reminders


def test_r5_8_autonomous_loop_reminder_verbatim() -> None:
    assert AUTONOMOUS_LOOP_REMINDER == (
        "<system-reminder>\n"
        "You are mid-loop in an autonomous task. Continue your work loop:\n"
        "respond to the tool results below and proceed to the next iteration.\n"
        "</system-reminder>"
    )


def test_r5_8_progress_reminder_names_the_file() -> None:
    reminder = progress_check_reminder("/m/sessions/s/tasks/T1/progress.md")
    assert reminder.startswith("<system-reminder>\n")
    assert reminder.endswith("\n</system-reminder>")
    assert "/m/sessions/s/tasks/T1/progress.md" in reminder
    assert "spec" in reminder
    assert "truly done" in reminder


def test_r5_8_compute_last_message_info() -> None:
    assert compute_last_message_info([]) is None
    msgs = [_msg(0, "user"), _msg(1, "assistant", [_call()], finish="tool-calls")]
    assert compute_last_message_info(msgs) == LastMessageInfo(
        role="assistant", finish="tool-calls", message_id="msg_0001", has_tool_calls=True
    )
    assert compute_last_message_info(msgs[:1]) == LastMessageInfo(
        role="user", finish=None, message_id="msg_0000", has_tool_calls=False
    )


def test_r5_8_reminder_for_each_shape() -> None:
    def info_of(message: Message) -> LastMessageInfo | None:
        return compute_last_message_info([message])

    # assistant with finish tool-calls -> autonomous loop
    assert reminder_for(info_of(_msg(0, "assistant", finish="tool-calls"))) == (
        AUTONOMOUS_LOOP_REMINDER
    )
    # provider spellings of the same finish reason
    for finish in ("tool_calls", "tool_use"):
        assert reminder_for(info_of(_msg(0, "assistant", finish=finish))) == (
            AUTONOMOUS_LOOP_REMINDER
        )
    # assistant that finished otherwise -> what is open decides (issue 14 finding 6)
    progress = OpenWork(next_item="task T1", progress_file="/m/T1/progress.md")
    for finish in ("stop", "length", "end_turn"):
        info = info_of(_msg(0, "assistant", finish=finish))
        assert reminder_for(info, progress) == progress_check_reminder("/m/T1/progress.md")
        assert reminder_for(info, OpenWork(next_item="plan item: tests")) == (
            next_step_reminder("plan item: tests")
        )
        assert reminder_for(info, OpenWork()) == ""
        assert reminder_for(info) == ""  # nothing known: no file named that may not exist
    # last message is a user message -> nothing
    assert reminder_for(info_of(_msg(0, "user"))) == ""
    assert reminder_for(None) == ""
    # ours: provider-form tool results waiting for the model -> mid-loop
    assert reminder_for(info_of(_msg(0, "tool"))) == AUTONOMOUS_LOOP_REMINDER
    # ours: cut off while calling tools (no finish) -> mid-loop; without calls -> as finished
    assert reminder_for(info_of(_msg(0, "assistant", [_call()]))) == AUTONOMOUS_LOOP_REMINDER
    assert reminder_for(info_of(_msg(0, "assistant")), progress) == (
        progress_check_reminder("/m/T1/progress.md")
    )


def test_r5_7_r5_8_closing_text() -> None:
    loop = LastMessageInfo(role="assistant", finish="tool-calls")
    done = LastMessageInfo(role="assistant", finish="stop")
    assert closing_text(True, loop) == f"{CLOSING_WITH_ACTIVITY}\n\n{AUTONOMOUS_LOOP_REMINDER}"
    # A mid-loop rebuild still says continue, whatever else is open.
    assert closing_text(True, loop, OpenWork()) == (
        f"{CLOSING_WITH_ACTIVITY}\n\n{AUTONOMOUS_LOOP_REMINDER}"
    )
    open_task = OpenWork(next_item="task T2", progress_file="/m/T2/progress.md")
    assert closing_text(False, done, open_task) == (
        f"{CLOSING_WITHOUT_ACTIVITY}\n\n{progress_check_reminder('/m/T2/progress.md')}"
    )
    assert closing_text(False, None) == CLOSING_WITHOUT_ACTIVITY


def test_finished_turn_with_nothing_open_does_not_say_resume() -> None:
    # Issue 14 findings 4 and 6: an idle or manual rebuild after an answered request
    # ended with "Resume the last task" and a reminder naming a missing progress.md.
    done = LastMessageInfo(role="assistant", finish="stop")
    text = closing_text(True, done, OpenWork())
    assert text == CLOSING_NOTHING_OPEN.format(" and the recent activity list")
    assert "Resume" not in text
    assert "progress.md" not in text
    assert "do not redo finished work" in text


def test_an_unanswered_user_message_is_named_in_the_closing() -> None:
    user = LastMessageInfo(role="user")
    assert closing_text(True, user) == CLOSING_ANSWER_USER.format(" and the recent activity list")
    assert closing_text(False, user, OpenWork()) == CLOSING_ANSWER_USER.format("")


def test_an_agent_acting_through_text_is_mid_loop_not_asked_to_answer_the_user() -> None:
    # SWE-agent writes its action as a code block and gets the output as a user
    # message nobody typed: the closing said "the user's latest message … answer it".
    task = _msg(1, "user", [TextPart(text="Fix the crash")])
    act = _msg(
        2, "assistant", [TextPart(text="Reproduce it.\n```\npython r.py\n```")], finish="stop"
    )
    output = _msg(3, "user", [TextPart(text="Traceback …", synthetic=True)])
    again = _msg(4, "assistant", [TextPart(text="Fix it.\n```\nedit 3:4\n```")], finish="stop")
    for tail in ([task, act, output], [task, act, output, again]):
        info = compute_last_message_info(tail)
        assert info is not None
        assert info.mid_loop, tail[-1].id
        assert closing_text(True, info, OpenWork()) == (
            f"{CLOSING_WITH_ACTIVITY}\n\n{AUTONOMOUS_LOOP_REMINDER}"
        )
    # The same text with no earlier command answered is an ordinary finished turn, and
    # a typed reply is the user's.
    info = compute_last_message_info([task, act])
    assert info is not None
    assert not info.mid_loop
    info = compute_last_message_info([task, act, _msg(3, "user", [TextPart(text="thanks")])])
    assert info is not None
    assert not info.mid_loop


# ---------------------------------------------------------------- R8.3 per-turn reminder

MEMORY_DIR = "/home/me/.mimo/sessions/ses_0196f3a1b2c3d4Ab3dE9fGh1Jk2Lm"

PER_TURN_GOLDEN = f"""\
<system-reminder data-mimo-ctx="per-turn">
Session memory directory: {MEMORY_DIR}
Memory, tasks and actors outlive the context window. Look things up with tools:
- search memory: memory(operation="search", query="<keywords>")
- read a memory file: memory(operation="read", path="<file>.md")
- list tasks: task(operation="list")
- check an actor: actor(operation="status", actor_id="<id>")
Do not ask the user for facts, decisions or results that memory may already hold;
search it first.
</system-reminder>"""


def test_r8_3_per_turn_reminder_golden() -> None:
    text = per_turn_reminder(MEMORY_DIR)
    assert text == PER_TURN_GOLDEN
    assert text.startswith(PER_TURN_MARKER + "\n")
    # About 120 tokens (A12): well under 200 with a long directory name.
    assert 80 <= estimate_text_tokens(text) <= 200


def test_a12_marker_detection() -> None:
    assert has_per_turn_reminder(per_turn_reminder("/m"))
    assert has_per_turn_reminder("before\n" + per_turn_reminder("/m"))
    assert not has_per_turn_reminder("<system-reminder>\nsomething else\n</system-reminder>")


def test_r8_3_appends_to_last_user_message_without_mutating() -> None:
    msgs = [
        _msg(0, "user", [TextPart(text="first")]),
        _msg(1, "assistant"),
        _msg(2, "user", [TextPart(text="second")]),
        _msg(3, "assistant", finish="tool-calls"),
        _msg(4, "tool"),
    ]
    snapshot = [m.model_dump() for m in msgs]
    out = append_per_turn_reminder(msgs, MEMORY_DIR)
    assert out is not msgs
    assert [m.model_dump() for m in msgs] == snapshot
    assert [m.id for m in out] == [m.id for m in msgs]
    assert all(a is b for i, (a, b) in enumerate(zip(out, msgs, strict=True)) if i != 2)
    changed = out[2]
    assert changed is not msgs[2]
    assert len(changed.parts) == 2
    added = changed.parts[-1]
    assert isinstance(added, TextPart)
    assert added.synthetic
    assert added.text == per_turn_reminder(MEMORY_DIR)
    assert changed.parts[0] is msgs[2].parts[0]


def test_a12_never_duplicated() -> None:
    msgs = [_msg(0, "user", [TextPart(text="hi")])]
    once = append_per_turn_reminder(msgs, MEMORY_DIR)
    twice = append_per_turn_reminder(once, MEMORY_DIR)
    assert twice is not once
    assert twice[0] is once[0]
    texts = [p.text for p in twice[0].parts if isinstance(p, TextPart)]
    assert sum(has_per_turn_reminder(t) for t in texts) == 1


def test_r8_3_one_reminder_part_serves_every_copy() -> None:
    """The part made once per session is appended to each new user message's copy;
    the messages stay as they were, and one already holding the marker is returned."""
    part = per_turn_reminder_part(MEMORY_DIR)
    assert part.synthetic
    assert part.text == per_turn_reminder(MEMORY_DIR)
    first, second = _msg(0, "user", [TextPart(text="a")]), _msg(2, "user", [TextPart(text="b")])
    snapshot = [first.model_dump(), second.model_dump()]
    copies = [with_per_turn_reminder(m, part) for m in (first, second)]
    assert [c.parts[-1] for c in copies] == [part, part]
    assert [c.parts[:-1] for c in copies] == [first.parts, second.parts]
    assert [first.model_dump(), second.model_dump()] == snapshot
    assert with_per_turn_reminder(copies[0], part) is copies[0]
    held = _msg(4, "user", [TextPart(text="x\n" + per_turn_reminder("/elsewhere"))])
    assert with_per_turn_reminder(held, part) is held


def test_r8_3_no_user_message_changes_nothing() -> None:
    msgs = [_msg(0, "assistant", finish="stop")]
    out = append_per_turn_reminder(msgs, MEMORY_DIR)
    assert out == msgs
    assert out[0] is msgs[0]
    assert append_per_turn_reminder([], MEMORY_DIR) == []


@settings(max_examples=200)
@given(roles=st.lists(st.sampled_from(["user", "assistant", "tool"]), max_size=8))
def test_r8_3_property_exactly_one_reminder_on_the_last_user_message(roles: list[Role]) -> None:
    msgs = [_msg(i, role) for i, role in enumerate(roles)]
    out = append_per_turn_reminder(append_per_turn_reminder(msgs, "/m"), "/m")
    marked = [
        i
        for i, m in enumerate(out)
        for p in m.parts
        if isinstance(p, TextPart) and has_per_turn_reminder(p.text)
    ]
    users = [i for i, r in enumerate(roles) if r == "user"]
    assert marked == users[-1:]
    assert not any(
        has_per_turn_reminder(p.text) for m in msgs for p in m.parts if isinstance(p, TextPart)
    )
