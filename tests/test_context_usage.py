"""The ``/context``-style breakdown: ``mw.context_usage`` and ``mimo-ctx context``.

The parts add up to the view's token figure exactly; it is read-only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import main_transcripts
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx import (
    ContextMiddleware,
    InMemoryStore,
    Message,
    ModelLimits,
    RebuildConfig,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.cli._output import fmt_tokens
from mimo_ctx.context_usage import body_sections, break_down
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import ReasoningPart, Role, ToolStateError
from mimo_ctx.reminders import per_turn_reminder
from mimo_ctx.replay import stable_ids
from mimo_ctx.session import RequestPrefix
from mimo_ctx.store import SQLiteStore
from mimo_ctx.testing import filler_text
from mimo_ctx.tokens import estimate_message_tokens, estimate_text_tokens, js_json
from tests.cli.conftest import run_cli, write_chat_transcript

T0 = 1_700_000_000_000
LIMITS = ModelLimits(100_000, input_limit=100_000)  # trigger line 90,000

# --------------------------------------------------------------------------- pure


def test_body_sections_cut_at_level1_headings_outside_fences() -> None:
    body = (
        "The sections below are auto-loaded.\n\n"
        "# Tasks ledger\n- T1 open — x\n\n"
        "# Session notes\nFile: /m/notes.md\n```sh\n# a shell comment, not a heading\n```\n\n"
        '# Recent activity\n\n- read(path="a")\n\nThis session is continued.'
    )
    sections = body_sections(body)
    assert [h for h, _ in sections] == ["", "Tasks ledger", "Session notes", "Recent activity"]
    assert "# a shell comment" in sections[2][1]
    assert "\n".join(text for _, text in sections) == body


_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)


@st.composite
def _message(draw: st.DrawFn) -> Message:
    role: Role = draw(st.sampled_from(["user", "assistant", "tool"]))
    parts: list[Any] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["text", "reasoning", "tool", "error", "result", "reminder"]))
        if kind == "text":
            parts.append(TextPart(text=draw(_texts), synthetic=draw(st.booleans())))
        elif kind == "reasoning":
            parts.append(ReasoningPart(text=draw(_texts)))
        elif kind == "tool":
            cleared = draw(st.booleans())
            parts.append(
                ToolPart(
                    call_id="c",
                    tool=draw(st.sampled_from(["read", "bash"])),
                    state=ToolStateCompleted(
                        input={"path": draw(_texts)},
                        output=draw(_texts),
                        time=ToolTime(compacted=1 if cleared else None),
                    ),
                )
            )
        elif kind == "error":
            parts.append(
                ToolPart(call_id="e", tool="bash", state=ToolStateError(error=draw(_texts)))
            )
        elif kind == "result":
            parts.append(
                ToolResultPart(
                    call_id="r", tool="grep", output=draw(_texts), is_error=draw(st.booleans())
                )
            )
        else:
            parts.append(TextPart(text=per_turn_reminder("/m/s"), synthetic=True))
    return Message(session_id="s", role=role, time_created=T0, parts=parts)


@given(
    st.lists(_message(), max_size=8),
    _texts,
    st.lists(st.dictionaries(st.sampled_from(["name", "about"]), _texts, max_size=2), max_size=3),
)
def test_parts_add_up_to_the_total(
    messages: list[Message], system: str, tools: list[dict[str, object]]
) -> None:
    prefix = RequestPrefix(system=system, tools=tools)
    usage = break_down(
        messages,
        prefix,
        session_id="s",
        agent="main",
        boundary_id=None,
        window=1000,
        trigger_tokens=900,
    )
    expected = (
        estimate_text_tokens(system)
        + estimate_text_tokens(js_json(tools))
        + sum(estimate_message_tokens(m) for m in messages)
    )
    assert usage.total_tokens == expected
    assert sum(p.tokens for p in usage.parts) == expected
    assert all(p.tokens >= 0 for p in usage.parts)
    assert usage.room_before_trigger == 900 - expected


# --------------------------------------------------------------------------- the middleware


def _round(session_id: str, i: int, *, usage: int, finish: str = "tool-calls") -> Message:
    at = T0 + 10 + i
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=at,
        time_completed=at,
        finish=finish,
        usage=TokenUsage(input=usage),
        parts=[
            TextPart(text=f"step {i}"),
            ToolPart(
                call_id=f"c{i}",
                tool="read",
                state=ToolStateCompleted(
                    input={"path": f"f{i}.py"},
                    output=filler_text(1500, seed=i),
                    time=ToolTime(start=at, end=at),
                ),
            ),
        ],
    )


async def _session(mw: ContextMiddleware, *, rounds: int, last_usage: int) -> str:
    session = await mw.open_session(system="You are a coding agent.", tools=[{"name": "read"}])
    await mw.add_user_message(session.id, "Read every file and summarise it.")
    await mw.append(
        [
            _round(session.id, i, usage=last_usage if i == rounds - 1 else 1_000 + i)
            for i in range(rounds)
        ]
    )
    return session.id


def _part(usage: Any, name: str) -> Any:
    return next(p for p in usage.parts if p.name == name)


async def test_context_usage_total_is_the_views_figure_before_and_after_a_rebuild(
    tmp_path: Path,
) -> None:
    config = RebuildConfig(activity_max_lines=0)  # the tail stays live: cleared results
    async with ContextMiddleware(InMemoryStore(), tmp_path, model=LIMITS, config=config) as mw:
        sid = await _session(mw, rounds=30, last_usage=95_000)
        before = await mw.context_usage(sid)
        assert before.boundary_id is None
        assert before.last_usage == 95_000
        assert before.room_before_trigger == 90_000 - before.total_tokens
        assert _part(before, "tool results (live)").items == 30
        assert _part(before, "system prompt").tokens == estimate_text_tokens(
            "You are a coding agent."
        )
        assert _part(before, "tool definitions").items == 1

        view = await mw.prepare(sid)  # rebuilds: usage 95,000 >= 90,000
        assert view.rebuild is not None
        after = await mw.context_usage(sid)
        assert after.total_tokens == view.tokens
        assert sum(p.tokens for p in after.parts) == view.tokens
        assert after.boundary_id == view.boundary_id
        names = [p.name for p in after.parts]
        for name in (
            "boundary: summary line",
            "boundary: ## Checkpoint",
            "boundary: # Tasks ledger",
            "boundary: # Session checkpoint",
            "boundary: # Recent user input (verbatim)",
            "boundary: intro and closing",
            "boundary: ## Active Actors",
        ):
            assert name in names, name
        cleared = _part(after, "tool results (cleared)")
        assert cleared.items == view.rebuild.compacted_results
        assert cleared.tokens > 0
        assert after.share == pytest.approx(view.tokens / 100_000)


async def test_context_usage_is_read_only_over_the_trigger_line(tmp_path: Path) -> None:
    """No rebuild and no writer, however far over the line the session is."""
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path, model=LIMITS) as mw:
        sid = await _session(mw, rounds=30, last_usage=95_000)
        stored = await store.list_messages(sid, agent=None)
        _, seq = await store.changes_since(sid, 0)
        usage = await mw.context_usage(sid)
        assert usage.last_usage == 95_000
        assert not mw.writer_running(sid)
        assert await store.latest_boundary(sid) is None
        assert await store.get_watermark(sid) is None
        assert await store.list_messages(sid, agent=None) == stored
        assert (await store.changes_since(sid, 0))[1] == seq
        # The next prepare() still rebuilds: context_usage took nothing away.
        view = await mw.prepare(sid)
        assert view.rebuild is not None


async def test_context_usage_counts_the_per_turn_reminder(tmp_path: Path) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path, model=LIMITS) as mw:
        sid = await _session(mw, rounds=3, last_usage=2_000)
        notes = mw.layout.notes_path(sid)
        notes.parent.mkdir(parents=True, exist_ok=True)
        notes.write_text("a note\n", encoding="utf-8")
        usage = await mw.context_usage(sid)
        view = await mw.prepare(sid)
        reminders = _part(usage, "reminders")
        assert reminders.items == 1
        assert reminders.tokens > 50
        assert usage.total_tokens == view.tokens


# --------------------------------------------------------------------------- the command


def test_context_command_on_a_stored_session(tmp_path: Path) -> None:
    store = tmp_path / "demo.db"
    assert run_cli("demo", "--store", str(store), "--json").code == 0
    rendered = run_cli("render", "--store", str(store), "--json").json()
    run = run_cli("context", "--store", str(store), "--window", "50K", "--json")
    assert run.code == 0, run.err
    doc = run.json()
    assert doc["total_tokens"] == rendered["tokens"]
    assert sum(p["tokens"] for p in doc["parts"]) == doc["total_tokens"]
    assert doc["session_id"] == rendered["session_id"]
    assert doc["window"] == 50_000
    assert doc["trigger_tokens"] == 30_000
    assert doc["room_before_trigger"] == 30_000 - doc["total_tokens"]
    assert {"name", "tokens", "items", "share"} <= set(doc["parts"][0])
    names = [p["name"] for p in doc["parts"]]
    assert names[:2] == ["system prompt", "tool definitions"]
    assert "boundary: # Session checkpoint" in names
    # Read-only: the store is byte-identical afterwards... and render agrees again.
    before = store.read_bytes()
    run_cli("context", "--store", str(store), "--json")
    assert store.read_bytes() == before

    human = run_cli("context", "--store", str(store), "--window", "50K", "--plain")
    assert human.code == 0, human.err
    for text in ("What the next request is made of", "boundary: # Session checkpoint", "Room:"):
        assert text in human.out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--store", "missing.db"], "no store at"),
        (["--session", "ses_nope"], "no session 'ses_nope'"),
    ],
)
def test_context_command_errors_are_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    store = tmp_path / "demo.db"
    assert run_cli("demo", "--store", str(store), "--json").code == 0
    args = ["context", "--store", str(store), *argv]
    if argv[0] == "--store":
        args = ["context", "--store", str(tmp_path / argv[1])]
    run = run_cli(*args)
    assert run.code == 2
    assert message in run.err
    assert len(run.err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- imported sessions


def _synthetic(tmp_path: Path) -> Path:
    return write_chat_transcript(tmp_path / "chat.jsonl", rounds=40, output_tokens=1500)


_IMPORTED = [
    pytest.param(None, id="synthetic-chat"),
    *[pytest.param(p, id=p.name, marks=pytest.mark.transcripts) for p in main_transcripts()],
]


async def _stored(path: Path, store_file: Path, memory: Path) -> tuple[str, int, int]:
    """Import ``path`` into an SQLite store, rebuild it once (``/rebuild``); the views'
    token figures of ``prepare`` before and after, with the session id."""
    transcript = stable_ids(load_transcript(path))
    async with SQLiteStore(store_file) as store:
        await store.create_session(transcript.session)
        await store.append_messages(transcript.messages)
        # A window the transcript's own usage never reaches: prepare() never rebuilds.
        async with ContextMiddleware(store, memory, model=10_000_000) as mw:
            sid = transcript.session.id
            before = await mw.prepare(sid)
            assert before.rebuild is None
            assert (await mw.context_usage(sid)).total_tokens == before.tokens
            report = await mw.rebuild(sid)
            assert report.boundary_id is not None, report
            after = await mw.prepare(sid)
            assert after.rebuild is None
            assert after.boundary_id == report.boundary_id
    return sid, before.tokens, after.tokens


@pytest.mark.parametrize("path", _IMPORTED)
def test_context_command_total_is_the_views_figure_on_an_imported_session(
    path: Path | None, tmp_path: Path
) -> None:
    """Done-when: ``mimo-ctx context`` on a stored session prints the breakdown whose
    total is the view's token figure (the request ``prepare`` returns)."""
    source = path if path is not None else _synthetic(tmp_path)
    store_file, memory = tmp_path / "s.db", tmp_path / "memory"
    sid, _, tokens = anyio.run(_stored, source, store_file, memory)
    common = ["--store", str(store_file), "--session", sid, "--memory-root", str(memory)]
    run = run_cli("context", *common, "--window", "10M", "--json")
    assert run.code == 0, run.err
    doc = run.json()
    assert doc["total_tokens"] == tokens
    assert sum(p["tokens"] for p in doc["parts"]) == tokens
    assert doc["boundary_id"] is not None
    assert run_cli("render", *common, "--json").json()["tokens"] == tokens
    human = run_cli("context", *common, "--window", "10M", "--plain")
    assert human.code == 0, human.err
    assert f"Total: {fmt_tokens(tokens)} tokens" in " ".join(human.out.split())
