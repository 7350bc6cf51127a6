"""The bound tools: history, memory, task, actor (issue 8; SPEC R4.5, R5.4, R5.5, R5.6, A16)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx.messages import Message, TextPart
from mimo_ctx.tools import SessionTools, render_message

from .conftest import T0, World, text_message

# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("history", {}, "needs an 'operation' argument"),
        ("history", {"operation": "fetch"}, "unknown operation 'fetch'"),
        ("history", {"operation": "around"}, "needs: message_id"),
        ("history", {"operation": "around", "message_id": "m", "before": -1}, "at least 0"),
        ("history", {"operation": "around", "message_id": "m", "after": "many"}, "integer"),
        ("history", {"operation": "get", "message_id": 5}, "must be a string"),
        ("history", {"operation": "search", "query": "x", "bogus": 1}, "unknown argument 'bogus'"),
        ("memory", {"operation": "search"}, "needs: query"),
        ("memory", {"operation": "search", "query": "x", "limit": 51}, "at most 50"),
        ("task", {"operation": "update", "task_id": "T1", "status": "finished"}, "one of: open"),
        ("task", {"operation": "update", "task_id": "T1"}, "needs status, summary or both"),
        ("actor", {"operation": "status"}, "needs: actor_id"),
        ("nosuch", {}, "no tool named 'nosuch'"),
        ("history", "{not json", "not valid JSON"),
        ("history", "[1, 2]", "must be a JSON object"),
    ],
)
async def test_bad_calls_return_clear_error_text(
    world: World, name: str, arguments: Any, expected: str
) -> None:
    """A bad call is answered with an ``Error:`` text naming the problem, never raised."""
    result = await world.tools_a.invoke(name, arguments)
    assert result.is_error
    assert result.text.startswith("Error: ")
    assert expected in result.text
    assert "Traceback" not in result.text


async def test_arguments_as_json_string_and_nulls(world: World) -> None:
    """OpenAI sends arguments as a JSON string; ``null`` means "not given" (strict mode)."""
    arguments = json.dumps({"operation": "list", "task_id": None, "status": None})
    text = await world.tools_a.call("task", arguments)
    assert text.startswith("Tasks of this session (3):")


# -- history -----------------------------------------------------------------------------------


async def test_r5_5_history_around_returns_full_text_and_neighbours(world: World) -> None:
    """``around`` shows the asked-for message in full, marked, with its neighbours."""
    target = world.a_messages[2]
    text = await world.tools_a.call(
        "history", {"operation": "around", "message_id": target.id, "before": 1, "after": 1}
    )
    assert f">>> message {target.id}" in text
    assert "fixed the semicolon" in text
    assert world.a_messages[1].id in text
    assert world.a_messages[3].id in text
    assert world.a_messages[0].id not in text
    assert world.a_messages[4].id not in text
    assert text.startswith("Messages 2-4 of 5")


async def test_r4_5_history_shows_compacted_tool_output(world: World) -> None:
    """A tool output cleared from the context by micro-compaction is still returned in full."""
    text = await world.tools_a.call(
        "history", {"operation": "get", "message_id": world.a_messages[1].id}
    )
    assert '[tool call bash call_id=call_1] input: {"cmd": "cat build.log"}' in text
    assert "ERROR line 42: missing semicolon" in text
    assert "cleared from the context by a rebuild" in text


async def test_history_message_id_alias_from_elision_line(world: World) -> None:
    """The elision line spells the argument ``messageID``; that spelling works too (A7)."""
    text = await world.tools_a.call(
        "history", {"operation": "around", "messageID": world.a_messages[0].id}
    )
    assert f">>> message {world.a_messages[0].id}" in text


async def test_r5_4_history_refuses_another_sessions_message(world: World) -> None:
    """An id of session B reads like a missing id from session A: nothing leaks."""
    other = world.b_messages[0].id
    for operation in ("around", "get"):
        result = await world.tools_a.invoke(
            "history", {"operation": operation, "message_id": other}
        )
        assert result.is_error
        assert f"there is no message {other!r} in this session" in result.text
        assert "platypus" not in result.text
    missing = await world.tools_a.invoke("history", {"operation": "get", "message_id": "msg_x"})
    assert missing.text.replace("'msg_x'", repr(other)) == result.text


async def test_history_search_newest_first_and_session_only(world: World) -> None:
    """Search matches every word first, newest first, and never sees session B."""
    text = await world.tools_a.call("history", {"operation": "search", "query": "the"})
    lines = text.splitlines()
    ids = [line.split()[1] for line in lines if line.startswith("- ")]
    by_id = {m.id: m for m in world.a_messages}
    assert ids == sorted(ids, reverse=True)
    assert all(i in by_id for i in ids)
    assert len(ids) == 3  # "fix the build", "fixed the semicolon", "now run the tests"
    none = await world.tools_a.call("history", {"operation": "search", "query": "platypus"})
    assert none == "No message of this session contains 'platypus'."
    both = await world.tools_a.call(
        "history", {"operation": "search", "query": "tests semicolon", "limit": 1}
    )
    assert "1 message(s)" in both


async def test_history_search_finds_tool_output(world: World) -> None:
    """Search reads tool outputs too, compacted ones included."""
    text = await world.tools_a.call("history", {"operation": "search", "query": "SEMICOLON"})
    assert world.a_messages[1].id in text
    assert "missing semicolon" in text


async def test_history_pages_a_huge_message(world: World) -> None:
    """A message over the page size is returned in pages with an offset to continue."""
    store, layout = world.store, world.layout
    huge = "".join(f"{i:05d}\n" for i in range(3000))  # 18000 characters
    message = text_message(world.a, "user", huge, t=T0 + 100)
    await store.append_messages([message])
    tools = SessionTools(store, layout, world.a, "proj", max_message_chars=10_000)
    try:
        first = await tools.call("history", {"operation": "get", "message_id": message.id})
        assert "offset=10000]" in first
        second = await tools.call(
            "history", {"operation": "get", "message_id": message.id, "offset": 10_000}
        )
        body_first = first.split("\n", 1)[1].rsplit("\n[…", 1)[0]
        body_second = second.split("\n", 2)[2]
        assert body_first + body_second == huge
        past = await tools.invoke(
            "history", {"operation": "get", "message_id": message.id, "offset": 99_999}
        )
        assert past.is_error
        assert "past the end" in past.text
    finally:
        await tools.aclose()


def test_render_message_every_part_kind() -> None:
    """Every part kind renders as readable text (no part is silently dropped)."""
    message = Message(
        session_id="s",
        role="user",
        time_created=T0,
        parts=[TextPart(text="hello"), TextPart(text="injected", synthetic=True)],
    )
    text = render_message(message)
    assert text.splitlines()[0].startswith(f"--- message {message.id} (user, agent=main, ")
    assert "hello" in text
    assert "[text, synthetic]\ninjected" in text


# -- tasks ---------------------------------------------------------------------------------------


async def test_a16_task_list_get_update_this_session_only(world: World) -> None:
    """Session A lists its own T1, T1.1, T2; B's T1 and T9 never appear."""
    listing = await world.tools_a.call("task", {"operation": "list"})
    assert listing.splitlines() == [
        "Tasks of this session (3):",
        "- T1 in_progress — fix the build",
        "  - T1.1 done — find the error",
        "- T2 open — task T2",
    ]
    details = await world.tools_a.call("task", {"operation": "get", "task_id": "T1"})
    assert "summary: fix the build" in details
    assert "subtasks: T1.1 (done)" in details
    assert "progress file: sessions/ses_a/tasks/T1/progress.md" in details
    missing = await world.tools_a.invoke("task", {"operation": "get", "task_id": "T9"})
    assert missing.is_error
    assert "no task 'T9' in this session" in missing.text

    updated = await world.tools_a.call(
        "task", {"operation": "update", "task_id": "T1", "status": "done", "summary": "built"}
    )
    assert updated == "Task T1 updated: status in_progress → done; summary → 'built'."
    stored = await world.store.get_task(world.a, "T1")
    assert stored is not None
    assert (stored.status, stored.summary, stored.time_updated) == ("done", "built", T0 + 61_000)
    theirs = await world.store.get_task(world.b, "T1")
    assert theirs is not None
    assert (theirs.status, theirs.summary) == ("open", "b's own T1")
    same = await world.tools_a.call(
        "task", {"operation": "update", "task_id": "T1", "summary": "built"}
    )
    assert same == "Task T1 unchanged (it already has that status and summary)."
    cannot = await world.tools_a.invoke(
        "task", {"operation": "update", "task_id": "T9", "status": "done"}
    )
    assert cannot.is_error
    t9 = await world.store.get_task(world.b, "T9")
    assert t9 is not None
    assert t9.status == "open"


# -- actors -------------------------------------------------------------------------------------


async def test_r5_4_actor_status_and_list_this_session_only(world: World) -> None:
    """Actor tools answer for session A's actors and refuse B's (isolation, R5.4)."""
    status = await world.tools_a.call("actor", {"operation": "status", "actor_id": "act_a"})
    assert status.splitlines()[0] == "Actor act_a: running"
    assert "last activity: 2025-06-15T15:06:41.000Z (1m ago)" in status
    other = await world.tools_a.invoke("actor", {"operation": "status", "actor_id": "act_b"})
    assert other.is_error
    assert "no actor 'act_b' in this session" in other.text
    listing = await world.tools_a.call("actor", {"operation": "list"})
    assert listing.splitlines() == [
        "Actors of this session (2, 1 active):",
        '- act_a — running, "actor act_a" (agent=explorer), last activity 1m ago',
        '- act_a_done — completed, "actor act_a_done" (agent=explorer), last activity 1m ago',
    ]
    b_view = await world.tools_b.call("actor", {"operation": "list"})
    assert "act_b" in b_view
    assert "act_a" not in b_view


# -- memory read --------------------------------------------------------------------------------


async def test_memory_read_with_line_numbers_and_paging(world: World) -> None:
    """``read`` gives numbered lines from ``offset`` and says where to continue."""
    text = await world.tools_a.call(
        "memory", {"operation": "read", "path": "projects/proj/MEMORY.md", "offset": 3, "limit": 2}
    )
    assert text.splitlines() == [
        "File: projects/proj/MEMORY.md (lines 3-4 of 5)",
        "3\t## Rules",
        "4\t- always run the linter",
        "[… 1 more lines; continue with offset=5]",
    ]


async def test_memory_read_accepted_spellings(world: World) -> None:
    """Root-relative, session-relative and absolute-inside-root paths all read the file."""
    expected = await world.tools_a.call(
        "memory", {"operation": "read", "path": "sessions/ses_a/notes.md"}
    )
    assert expected.startswith("File: sessions/ses_a/notes.md (lines 1-2 of 2)")
    for spelling in (
        "notes.md",
        "./sessions/ses_a/notes.md",
        str(world.layout.notes_path("ses_a")),
    ):
        text = await world.tools_a.call("memory", {"operation": "read", "path": spelling})
        assert text == expected, spelling
    listing = await world.tools_a.call("memory", {"operation": "read", "path": "sessions/ses_a"})
    assert listing == "Directory sessions/ses_a:\n- sessions/ses_a/notes.md"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../outside.md", "'..' is not allowed"),
        ("sessions/ses_a/../../../outside.md", "'..' is not allowed"),
        ("..\\outside.md", "'..' is not allowed"),
        ("/etc/passwd", "absolute paths outside the memory root"),
        ("C:\\Windows\\win.ini", "absolute paths outside the memory root"),
        ("sessions/ses_b/notes.md", "only this session's memory"),
        ("projects/other/MEMORY.md", "only this session's memory"),
        ("sessions/ses_a/link-out.md", "resolves outside the memory root"),
        ("sessions/ses_a/dir-out/secret.md", "resolves outside the memory root"),
        ("sessions/ses_a/link-to-b.md", "only this session's memory"),
        ("", "needs: path"),
        ("   ", "path is empty"),
    ],
)
async def test_r5_6_memory_read_refuses_escapes(
    world: World, tmp_path: Path, path: str, reason: str
) -> None:
    """``..``, absolute paths out of the root, symlinks out and other sessions are refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("top secret\n", encoding="utf-8")
    (tmp_path / "outside.md").write_text("top secret\n", encoding="utf-8")
    session_dir = world.layout.session_dir(world.a)
    os.symlink(outside / "secret.md", session_dir / "link-out.md")
    os.symlink(outside, session_dir / "dir-out")
    os.symlink(world.layout.notes_path(world.b), session_dir / "link-to-b.md")
    result = await world.tools_a.invoke("memory", {"operation": "read", "path": path})
    assert result.is_error, result.text
    assert reason in result.text
    assert "top secret" not in result.text
    assert "platypus" not in result.text


async def test_memory_read_missing_binary_and_past_end(world: World) -> None:
    """Missing files, binary files and offsets past the end get clear errors."""
    (world.layout.session_dir(world.a) / "blob.md").write_bytes(b"\x00\x01\x02binary")
    cases = {
        "sessions/ses_a/none.md": "no memory file",
        "none.md": "no memory file 'none.md'",
        "sessions/ses_a/blob.md": "is a binary file",
        # Another session's path is refused whether or not the file exists.
        "sessions/ses_b/none.md": "only this session's memory",
    }
    for path, reason in cases.items():
        result = await world.tools_a.invoke("memory", {"operation": "read", "path": path})
        assert result.is_error
        assert reason in result.text
    past = await world.tools_a.invoke(
        "memory", {"operation": "read", "path": "notes.md", "offset": 10}
    )
    assert past.is_error
    assert "past the end of sessions/ses_a/notes.md (2 lines)" in past.text


async def test_memory_read_invalid_utf8_is_replaced(world: World) -> None:
    """Invalid UTF-8 is shown with replacement characters, not refused."""
    (world.layout.session_dir(world.a) / "latin1.md").write_bytes(b"caf\xe9 au lait\n")
    text = await world.tools_a.call("memory", {"operation": "read", "path": "latin1.md"})
    assert "caf\ufffd au lait" in text


# -- memory search ------------------------------------------------------------------------------


async def test_r5_6_memory_search_scopes(world: World) -> None:
    """Search sees A's session, project ``proj`` and global memory, never B's or ``other``."""
    text = await world.tools_a.call("memory", {"operation": "search", "query": "vault"})
    assert "projects/proj/MEMORY.md:5: - the deploy key lives in vault" in text
    assert "No memory file" in await world.tools_a.call(
        "memory", {"operation": "search", "query": "platypus"}
    )
    b_text = await world.tools_b.call("memory", {"operation": "search", "query": "platypus"})
    assert "sessions/ses_b/notes.md:1:" in b_text
    assert "projects/other/MEMORY.md:2:" in b_text
    global_hit = await world.tools_b.call("memory", {"operation": "search", "query": "commits"})
    assert "global/MEMORY.md:2: prefer small commits" in global_hit


async def test_memory_search_sees_files_written_outside_the_tools(world: World) -> None:
    """A file written after the first search appears at the next one (reconcile, R5.6)."""
    assert "No memory file" in await world.tools_a.call(
        "memory", {"operation": "search", "query": "kumquat"}
    )
    path = world.layout.task_progress_path(world.a, "T1")
    path.parent.mkdir(parents=True)
    path.write_text("# Progress\n\nstep one\nkumquat found\n", encoding="utf-8")
    text = await world.tools_a.call("memory", {"operation": "search", "query": "kumquat"})
    assert "sessions/ses_a/tasks/T1/progress.md:4: kumquat found" in text


async def test_project_id_read_from_the_session(world: World) -> None:
    """Without a project id the tools read it from the stored session."""
    tools = SessionTools(world.store, world.layout, world.a)
    try:
        text = await tools.call("memory", {"operation": "search", "query": "linter"})
        assert "projects/proj/MEMORY.md:4:" in text
    finally:
        await tools.aclose()
    ghost = SessionTools(world.store, world.layout, "ses_ghost")
    try:
        result = await ghost.invoke("memory", {"operation": "search", "query": "x"})
        assert result.is_error
        assert "session ses_ghost is not in the store" in result.text
    finally:
        await ghost.aclose()


async def test_definitions_and_lookup(world: World) -> None:
    """The bound definitions are the four tools, in order, with their schemas."""
    names = [d.name for d in world.tools_a.definitions]
    assert names == ["history", "memory", "task", "actor"]
    assert world.tools_a.definition("task").parameters["required"] == ["operation"]
    with pytest.raises(KeyError, match="no tool named 'grep'"):
        world.tools_a.definition("grep")


async def test_golden_history_get_of_a_tool_call(world: World) -> None:
    """The rendering of a message with a compacted tool call (golden)."""
    message = world.a_messages[1]
    text = await world.tools_a.call("history", {"operation": "get", "message_id": message.id})
    assert text.replace(message.id, "<id>") == "\n".join(
        [
            "--- message <id> (assistant, agent=main, 2025-06-15T15:06:40.020Z, "
            "finish=tool-calls) ---",
            "let me look",
            '[tool call bash call_id=call_1] input: {"cmd": "cat build.log"}',
            "[tool result bash call_id=call_1 (cleared from the context by a rebuild; "
            "full output kept in storage)]",
            "ERROR line 42: missing semicolon",
        ]
    )
