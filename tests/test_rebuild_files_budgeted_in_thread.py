"""The memory files are budgeted in the worker thread that reads them (issue 18).

:func:`mimo_ctx._render_files.budget_files` budgets each file for its section at
its cap right after the read, off the event loop; :func:`mimo_ctx.render.assemble_body`
then finds those reads in the cache. The body must be byte for byte the one the
loop renders alone (every read made there, from a cold cache), and the loop must
make no budgeted read of its own when the checkpoint quotes no user message.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import _budget_cache, budget, render
from mimo_ctx.config import PushCaps, RebuildConfig
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import Message, TextPart, new_message_id
from mimo_ctx.store import InMemoryStore, Session

SESSION = "ses_thread_budget_00000000000000"
PROJECT = "proj"
USERS = (new_message_id(), new_message_id())

_LINES = st.sampled_from(
    [
        "## Current intent",
        "## Files",
        "## Rules",
        "_What this holds._",
        "- See topic-a.md (3 items) - more",
        "- an entry with words",
        "- 中文的词 😀 条目",
        "Topic: the session's topic",
        "```",
        "",
        "plain text line é",
        "- Request (user message {quoted}):",
        "  > the words the user typed",
        '- asked (user message {other}): "other words"',
    ]
)


def _file(lines: list[str], repeat: int, quoted: str, other: str) -> str:
    return "\n".join(lines * repeat).replace("{quoted}", quoted).replace("{other}", other)


def _user(index: int, text: str) -> Message:
    return Message(
        id=USERS[index],
        session_id=SESSION,
        role="user",
        time_created=1_700_000_000_000 + index,
        parts=[TextPart(text=text)],
    )


async def _sources(root: Path, files: dict[str, str], caps: PushCaps) -> render.RebuildSources:
    layout = MemoryLayout(root)
    paths = {
        "checkpoint": layout.checkpoint_path(SESSION),
        "project": layout.project_memory_path(PROJECT),
        "global": layout.global_memory_path(),
        "notes": layout.notes_path(SESSION),
    }
    for key, text in files.items():
        paths[key].parent.mkdir(parents=True, exist_ok=True)
        paths[key].write_text(text, encoding="utf-8")
    store = InMemoryStore()
    session = Session(id=SESSION, project_id=PROJECT, time_created=1_700_000_000_000)
    await store.create_session(session)
    await store.append_messages([_user(0, "fix the parser please"), _user(1, "and the tests")])
    return await render.gather_sources(
        store=store, layout=layout, session=session, tail=[], config=RebuildConfig(push_caps=caps)
    )


@settings(max_examples=60, deadline=None)
@given(
    contents=st.lists(
        st.tuples(st.lists(_LINES, max_size=12), st.integers(1, 40)), min_size=4, max_size=4
    ),
    caps=st.tuples(st.integers(0, 400), st.integers(0, 400), st.integers(0, 400)),
    max_tokens=st.none() | st.integers(50, 3000),
)
def test_the_body_is_the_one_rendered_on_the_loop_alone(
    contents: list[tuple[list[str], int]], caps: tuple[int, int, int], max_tokens: int | None
) -> None:
    push_caps = PushCaps.model_validate(
        {"checkpoint": caps[0], "memory": caps[1], "global": caps[2], "notes": caps[1]}
    )
    config = RebuildConfig(push_caps=push_caps)

    async def run() -> None:
        with tempfile.TemporaryDirectory() as root:
            # One user message the checkpoint may quote is under "Recent user
            # input" when its cap holds it, the other one too or not.
            quoted, other = USERS
            files = {
                key: _file(lines, repeat, quoted, other)
                for key, (lines, repeat) in zip(
                    ("checkpoint", "project", "global", "notes"), contents, strict=True
                )
            }
            sources = await _sources(Path(root), files, push_caps)
            fast = render.assemble_body(sources, config=config, max_tokens=max_tokens)
            _budget_cache._cache.clear()  # pyright: ignore[reportPrivateUsage]
            plain = render.assemble_body(
                dataclasses.replace(sources, checkpoint_shown=None, checkpoint_quotes=True),
                config=config,
                max_tokens=max_tokens,
            )
            assert fast == plain

    anyio.run(run)


async def test_the_loop_makes_no_budgeted_read_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A megabyte file was parsed and measured on the event loop, in a core that had
    # not read it: the loop stalled tens of milliseconds per rebuild on it.
    threads: list[bool] = []
    real = budget.read_budgeted_section_aware

    def recording(text: str, limit: int, **kwargs: object) -> str:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(text, limit, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(_budget_cache, "read_budgeted_section_aware", recording)
    section = "\n".join(f"- entry {i} with a few words in it" for i in range(400))
    text = f"Topic: t\n\n## Current intent\n_intent_\n{section}\n## Files\n{section}\n"
    files = {"checkpoint": text, "project": text, "global": text, "notes": section}
    sources = await _sources(tmp_path, files, PushCaps())
    assert sources.checkpoint_shown == text.removeprefix("Topic: t\n")
    assert threads == [False, False, False]  # checkpoint, project and global memory
    body = render.assemble_body(sources, config=RebuildConfig())
    assert threads == [False, False, False]
    assert "entry 1 with" in body.text


async def test_a_checkpoint_quoting_the_user_is_budgeted_on_the_loop(tmp_path: Path) -> None:
    # Its text depends on which user messages "Recent user input" holds, which the
    # thread does not know: the thread leaves it, the loop renders the pointers.
    quoted = USERS[1]
    checkpoint = (
        f"Topic: t\n\n## Current intent\n_intent_\n- Request (user message {quoted}):\n"
        "  > and the tests\n- more\n"
    )
    sources = await _sources(tmp_path, {"checkpoint": checkpoint}, PushCaps())
    body = render.assemble_body(sources, config=RebuildConfig())
    assert f"(user message {quoted}): quoted under Recent user input" in body.text
