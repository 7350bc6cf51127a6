"""The rebuild body's user words and order (issue 14 findings 2, 4, 6; render split).

``gather_sources`` reads, ``assemble_body`` is pure: the budget property below runs
without a store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import make_id

from mimo_ctx.checkpoint import OfflineCheckpointWriter, WriterRequest
from mimo_ctx.checkpoint.document import section_budgets
from mimo_ctx.config import RebuildConfig
from mimo_ctx.memory import MemoryLayout, write_text_atomic
from mimo_ctx.messages import (
    Message,
    Role,
    TextPart,
    ToolPart,
    ToolStateCompleted,
    ToolStateError,
)
from mimo_ctx.reminders import (
    AUTONOMOUS_LOOP_REMINDER,
    CLOSING_NOTHING_OPEN,
    next_step_reminder,
    progress_check_reminder,
)
from mimo_ctx.render import (
    MemoryFile,
    RebuildSources,
    assemble_body,
    render_rebuild_context,
)
from mimo_ctx.store import InMemoryStore, Session, Task

T0 = 1_700_000_000_000


class _Session:
    def __init__(self, session_id: str = "ses_render_test_0000000000000") -> None:
        self.id = session_id
        self.messages: list[Message] = []

    def add(self, role: Role, *parts: Any, finish: str | None = None) -> Message:
        n = len(self.messages) + 1
        message = Message(
            id=make_id("msg", (T0 + n) * 4096),
            session_id=self.id,
            role=role,
            time_created=T0 + n,
            finish=finish,
            parts=list(parts),
        )
        self.messages.append(message)
        return message

    def user(self, text: str) -> Message:
        return self.add("user", TextPart(text=text))

    def say(self, text: str, finish: str = "stop") -> Message:
        return self.add("assistant", TextPart(text=text), finish=finish)

    def call(self, tool: str, arguments: dict[str, Any], output: str = "ok") -> Message:
        state = ToolStateCompleted(input=arguments, output=output)
        return self.add(
            "assistant", ToolPart(call_id=f"c{len(self.messages)}", tool=tool, state=state),
            finish="tool-calls",
        )  # fmt: skip


async def _render(
    s: _Session, tmp_path: Path, watermark: Message, *, tasks: list[Task] | None = None,
    config: RebuildConfig | None = None,
) -> str:  # fmt: skip
    store = InMemoryStore()
    session = Session(id=s.id, time_created=T0)
    await store.create_session(session)
    await store.append_messages(s.messages)
    for task in tasks or []:
        await store.upsert_task(task)
    layout = MemoryLayout(tmp_path / "mem")
    covered = [m for m in s.messages if m.id <= watermark.id]
    draft = OfflineCheckpointWriter().build(
        WriterRequest(
            session_id=s.id, project_id="default", watermark=watermark.id, messages=covered,
            previous_checkpoint=None, notes=None, tasks=tasks or [],
            checkpoint_path=layout.checkpoint_path(s.id),
            project_memory_path=layout.project_memory_path("default"),
            notes_path=layout.notes_path(s.id), tasks_dir=layout.tasks_dir(s.id),
            budgets=section_budgets(),
        )
    )  # fmt: skip
    await write_text_atomic(layout.checkpoint_path(s.id), draft.text)
    assert draft.state is not None
    await write_text_atomic(layout.checkpoint_state_path(s.id), draft.state)
    tail = [m for m in s.messages if m.id > watermark.id]
    body = await render_rebuild_context(
        store=store, layout=layout, session=session, agent="main", watermark=watermark,
        tail=tail, config=config,
    )  # fmt: skip
    return body.text


async def test_recent_user_input_reaches_past_the_newest_200_messages(tmp_path: Path) -> None:
    # Finding 2: a 3,000-turn session lost 13 of 15 follow-up instructions while the
    # section used 35 of its 16,000 tokens (only the newest 200 messages were read).
    s = _Session()
    s.user("Port the billing service to the new queue API")
    follow_ups = [f"follow-up {i}: also rename handler_{i} to consumer_{i}" for i in range(15)]
    for i in range(3000):
        if i % 200 == 0:
            s.user(follow_ups[i // 200])
        s.call("Read", {"file_path": f"/r/f{i}.py"})
    watermark = s.messages[-10]
    text = await _render(s, tmp_path, watermark)
    recent = text.split("# Recent user input (verbatim)")[1].split("\n# ")[0]
    assert "Port the billing service to the new queue API" in recent
    assert all(f in recent for f in follow_ups), [f for f in follow_ups if f not in recent]


async def test_each_user_message_appears_once_in_the_body(tmp_path: Path) -> None:
    # Finding 2: the first request was repeated up to 4 times across sections.
    s = _Session()
    request = "Implement the annotation lifecycle with open and closed states"
    s.user(request)
    s.say("The `Annotation` resource needs a `state` attribute. Let me add it.")
    s.call("Edit", {"file_path": "/r/lib/annotation.ex"})
    latest = "new beads for the epic were added, tackle them one by one"
    s.user(latest)
    s.call("Read", {"file_path": "/r/lib/review.ex"})
    watermark = s.messages[-1]
    question = "did you push the branch to origin already?"
    s.user(question)
    s.say("Yes, pushed to origin/feat.")
    text = await _render(s, tmp_path, watermark)
    for words in (request, latest, question):
        assert text.count(words) == 1, (words, text)
    assert "quoted under Recent user input" in text  # the checkpoint's §1 points there


async def test_activity_list_shows_where_the_user_spoke_and_what_is_open(tmp_path: Path) -> None:
    # Findings 4 and 6: an idle or manual rebuild ended on an answered question, with a
    # closing line telling the model to act on it and a reminder about progress.md.
    s = _Session()
    s.user("Ship the release notes")
    s.call("Write", {"file_path": "/r/NOTES.md", "content": "x"})
    watermark = s.messages[-1]
    question = s.user("did you push?")
    s.call("Bash", {"command": "git status"}, "nothing to commit")
    s.say("Yes, everything is pushed.")
    text = await _render(s, tmp_path, watermark)
    activity = text.split("# Recent activity")[1]
    marker = f"- user message {question.id} (quoted under Recent user input)"
    assert marker in activity
    assert activity.index(marker) < activity.index("- assistant: Yes, everything is pushed.")
    assert f"[user message {question.id} — the latest request; answered]" in text
    assert text.rstrip().endswith(CLOSING_NOTHING_OPEN.format(" and the recent activity list"))
    assert "Resume the last task" not in text
    assert "progress.md" not in text


async def test_an_unanswered_request_is_labelled_and_a_mid_loop_rebuild_says_continue(
    tmp_path: Path,
) -> None:
    s = _Session()
    s.user("Fix the parser")
    s.say("Looking.")
    watermark = s.messages[-1]
    pending = s.user("also handle tabs")
    text = await _render(s, tmp_path, watermark)
    assert f"[user message {pending.id} — the latest request; not answered yet]" in text
    assert "is not answered yet: answer it" in text
    s.call("Read", {"file_path": "/r/parser.py"})
    text = await _render(s, tmp_path, watermark)
    assert f"[user message {pending.id} — the latest request; being worked on]" in text
    assert text.rstrip().endswith(AUTONOMOUS_LOOP_REMINDER)


async def test_reminders_name_only_files_that_exist_and_open_work(tmp_path: Path) -> None:
    # Finding 6: the progress.md reminder was given in sessions with no such file.
    s = _Session()
    s.user("Write the importer")
    todos = [{"content": "Parse", "status": "completed"}, {"content": "Test", "status": "pending"}]
    s.call("TodoWrite", {"todos": todos})
    watermark = s.messages[-1]
    s.say("Parsing works.")
    text = await _render(s, tmp_path, watermark)
    assert next_step_reminder("plan item: Test") in text
    assert "progress.md" not in text
    done = [{"content": "Parse", "status": "completed"}, {"content": "Test", "status": "completed"}]
    s.call("TodoWrite", {"todos": done})
    s.say("All done.")
    text = await _render(s, tmp_path, watermark)
    assert text.rstrip().endswith(CLOSING_NOTHING_OPEN.format(" and the recent activity list"))

    s2 = _Session("ses_render_test_0000000000001")
    task = Task(id="T1", session_id=s2.id, status="in_progress", summary="importer",
                time_created=T0, time_updated=T0)  # fmt: skip
    s2.user("Write the importer")
    s2.say("Started.")
    watermark = s2.messages[-1]
    s2.say("Paused here.")
    text = await _render(s2, tmp_path / "a", watermark, tasks=[task])
    assert "progress.md" not in text
    assert next_step_reminder("task T1 (in_progress): importer") in text
    progress = MemoryLayout(tmp_path / "b" / "mem").task_progress_path(s2.id, "T1")
    await write_text_atomic(progress, "## Status\n- parsing\n")
    text = await _render(s2, tmp_path / "b", watermark, tasks=[task])
    assert progress_check_reminder(str(progress)) in text


# -- the pure half --------------------------------------------------------------------------

_TEXTS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=400)


@st.composite
def sources(draw: st.DrawFn) -> RebuildSources:
    s = _Session()
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "say", "call"]))
        if kind == "user":
            s.user(draw(_TEXTS) or "x")
        elif kind == "say":
            s.say(draw(_TEXTS) or "y", draw(st.sampled_from(["stop", "tool-calls"])))
        else:
            s.call("Bash", {"command": draw(_TEXTS)})
    users = [m for m in s.messages if m.role == "user"]
    cut = draw(st.integers(0, len(s.messages)))
    memory = "# M\n\n## Rules\n_r_\n" + draw(_TEXTS) * draw(st.integers(0, 50))
    return RebuildSources(
        session_id=s.id,
        tasks=[
            Task(id=f"T{i}", session_id=s.id, summary=draw(_TEXTS), time_created=0, time_updated=0)
            for i in range(draw(st.integers(0, 3)))
        ],
        user_messages=users,
        pinned=frozenset(m.id for m in users[:1]),
        checkpoint=MemoryFile("/m/checkpoint.md", draw(st.sampled_from(["", memory]))),
        project=MemoryFile("/m/MEMORY.md", memory),
        notes=MemoryFile("/m/notes.md", draw(_TEXTS)),
        tail=s.messages[cut:],
        reminder_tail=s.messages[cut:],
    )  # fmt: skip


@settings(max_examples=120)
@given(sources(), st.integers(0, 6000))
def test_r5_9_assembled_body_fits_its_bound_without_a_store(
    gathered: RebuildSources, max_tokens: int
) -> None:
    config = RebuildConfig()
    free = assemble_body(gathered, config=config)
    floor = assemble_body(gathered, config=config, max_tokens=0)
    bounded = assemble_body(gathered, config=config, max_tokens=max_tokens)
    assert bounded == assemble_body(gathered, config=config, max_tokens=max_tokens)
    assert bounded.tokens <= free.tokens
    if max_tokens >= floor.tokens:
        assert bounded.tokens <= max_tokens


async def test_a_rebuild_brings_the_offline_checkpoint_up_to_now(tmp_path: Path) -> None:
    # The checkpoint a rebuild shows was the one of the last usage threshold: its next
    # action and files were long stale, and what came after lived only in the activity
    # list. The offline writer's own checkpoint is now extended first.
    from mimo_ctx.middleware import ContextMiddleware

    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path / "mem", model=200_000) as mw:
        session = await mw.open_session()
        s = _Session(session.id)
        s.user("Build the exporter")
        for i in range(30):
            s.call("Write", {"file_path": f"/r/early_{i}.py", "content": "x" * 4000})
        await mw.append(s.messages)
        await mw.start_writer(session.id)
        assert await mw.wait_for_writer(session.id, timeout=30) == "finished"
        first = await store.get_watermark(session.id)
        later = len(s.messages)
        for i in range(30):
            s.call("Write", {"file_path": f"/r/late_{i}.py", "content": "y" * 4000})
        s.say("The exporter writes `late_0.py` first because the others import it.")
        await mw.append(s.messages[later:])
        report = await mw.rebuild(session.id)
        assert report.outcome == "rebuilt"
        assert report.watermark is not None
        assert first is not None
        assert report.watermark > first
        checkpoint = (tmp_path / "mem" / "sessions" / session.id / "checkpoint.md").read_text()
        assert "late_0.py" in checkpoint


async def test_the_offline_checkpoint_in_the_body_is_current_to_the_newest_message(
    tmp_path: Path,
) -> None:
    # The writer's watermark lies a tail's length behind: its next action, open errors
    # and latest words were those of that point, so a resumed model redid finished work
    # ("Carry on: add the missing config" after the tail had added it and moved on).
    s = _Session()
    s.user("Add the review page and its tests")
    s.say("The test config is missing `secret_key_base`. Let me add it to config/test.exs.")
    s.add(
        "assistant",
        ToolPart(
            call_id="fail1",
            tool="Bash",
            state=ToolStateError(input={"command": "mix test"}, error="1 test, 1 failure"),
        ),
        finish="tool-calls",
    )
    watermark = s.messages[-1]
    s.call("Edit", {"file_path": "/r/config/test.exs", "old_string": "a", "new_string": "b"})
    s.call("Bash", {"command": "mix test"}, "5 tests, 0 failures")
    s.say("Now let me add the close button to `ProjectReviewLive`.", finish="tool-calls")
    s.call("Read", {"file_path": "/r/lib/review_live.ex"})
    text = await _render(s, tmp_path, watermark)
    checkpoint = text.split("# Session checkpoint")[1].split("\n# ")[0]
    nxt = checkpoint.split("## 2. Next concrete action")[1].split("\n## ")[0]
    assert "close button to `ProjectReviewLive`" in nxt, nxt
    assert "secret_key_base" not in nxt
    errors = checkpoint.split("## 8. Errors and fixes")[1].split("\n## ")[0]
    assert "→ fixed" in errors, errors
    assert "unresolved" not in errors, errors
    assert "review_live.ex" in checkpoint.split("## 6.")[1].split("\n## ")[0]
