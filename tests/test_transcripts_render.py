"""The core algorithms on every real transcript (issue 3): watermark, body, caps.

For each shared transcript: import it, compute and adjust the watermark (R2),
write a checkpoint with the offline writer, give the session a project
``MEMORY.md``, global memory, notes, tasks and an actor, and render the rebuild
body (R5). Every section that has a source is present, every cap holds, and the
watermark never splits a tool call from its result.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import main_transcripts

from mimo_ctx.boundary import adjust_boundary_for_api_invariants, compute_boundary
from mimo_ctx.checkpoint import OfflineCheckpointWriter, WriterRequest, section_budgets
from mimo_ctx.importers import load_transcript
from mimo_ctx.memory import MemoryLayout, write_text_atomic
from mimo_ctx.messages import MAIN_AGENT, ToolPart, ToolResultPart
from mimo_ctx.render import render_rebuild_context
from mimo_ctx.store import Actor, InMemoryStore, Task

FILES = main_transcripts()
NOTICE_ALLOWANCE = 120  # a cap bounds a body; headings and one notice line come on top


@pytest.mark.skipif(not FILES, reason="real transcripts not found (see tests/conftest.py)")
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
async def test_r2_r5_every_transcript_renders_within_caps(path: Path, tmp_path: Path) -> None:
    transcript = load_transcript(path)
    store = InMemoryStore()
    session = transcript.session
    await store.create_session(session)
    await store.append_messages(transcript.messages)
    main = await store.list_messages(session.id, agent=MAIN_AGENT)
    assert main

    watermark_id = compute_boundary(main)
    assert watermark_id is not None
    watermark_id = adjust_boundary_for_api_invariants(main, watermark_id)
    covered = {m.id for m in main if m.id <= watermark_id}
    # R2.6: no call is covered while its split-off result is live.
    calls = {p.call_id for m in main if m.id in covered for p in m.parts if isinstance(p, ToolPart)}
    live_results = {
        p.call_id
        for m in main
        if m.id not in covered
        for p in m.parts
        if isinstance(p, ToolResultPart)
    }
    assert not calls & live_results

    layout = MemoryLayout(tmp_path / "mem")
    request = WriterRequest(
        session_id=session.id,
        project_id=session.project_id,
        watermark=watermark_id,
        messages=[m for m in main if m.id in covered],
        previous_checkpoint=None,
        notes="- the deploy port is 8443",
        tasks=[],
        checkpoint_path=layout.checkpoint_path(session.id),
        project_memory_path=layout.project_memory_path(session.project_id),
        notes_path=layout.notes_path(session.id),
        tasks_dir=layout.tasks_dir(session.id),
        budgets=section_budgets(),
    )
    draft = OfflineCheckpointWriter().build(request)
    await write_text_atomic(request.checkpoint_path, draft.text)
    await write_text_atomic(
        layout.project_memory_path(session.project_id),
        "# Project\n\n## Project context\n_What this is._\nA CLI tool.\n",
    )
    await write_text_atomic(layout.global_memory_path(), "# Global\n\n## Rules\n- be brief\n")
    await write_text_atomic(layout.notes_path(session.id), "- the deploy port is 8443\n")
    await store.upsert_task(
        Task(id="T1", session_id=session.id, summary="finish", time_created=1, time_updated=1)
    )
    await store.upsert_actor(
        Actor(
            id="act_1",
            session_id=session.id,
            agent="explore",
            description="index",
            status="running",
            time_created=1,
            time_last_activity=1,
        )
    )
    watermark = next(m for m in main if m.id == watermark_id)
    tail = [m for m in main if m.id > watermark_id and not m.is_boundary]
    body = await render_rebuild_context(
        store=store,
        layout=layout,
        session=session,
        agent=MAIN_AGENT,
        watermark=watermark,
        tail=tail,
    )
    assert body.text
    headings = [line for line in body.text.splitlines() if line.startswith("# ")]
    expected = [
        "# Tasks ledger",
        "# Session checkpoint",
        "# Active actors",
        "# Project durable knowledge",
        "# Global memory",
        "# Session notes",
        "# Memory keys index",
    ]
    has_user_text = any(
        m.role == "user" and any(p.type == "text" and not p.synthetic for p in m.parts)
        for m in main[-200:]
    )
    for heading in expected:
        assert heading in headings, heading
    assert ("# Recent user input (verbatim)" in headings) == has_user_text
    assert ("# Recent activity" in headings) == body.has_activity
    for figure in body.sections:
        if figure.unit == "tokens":
            assert figure.tokens <= figure.cap + NOTICE_ALLOWANCE, figure
        elif figure.unit == "lines":
            activity = list(body.text.split("# Recent activity", 1)[-1].splitlines())
            assert sum(line.startswith("- ") for line in activity) <= figure.cap
    ledger = body.text.split("# Tasks ledger\n", 1)[1].split("\n\n", 1)[0]
    assert len(ledger) <= 2000
