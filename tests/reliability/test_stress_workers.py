"""Stress: 2 and 4 OS processes serving turns of one session, on SQLite and PostgreSQL
(issue 17, "Done when").

Every worker runs model turns through :meth:`ContextMiddleware.turn` against a fake
model that reports the request's estimated tokens plus its tool round as usage (and
overflows above the window), with a user message every 7 turns and a ``/rebuild``
every 29; the usage thresholds start checkpoint writers (the A3 schedule; on
PostgreSQL under the writer lease). The turns of the workers interleave freely. At
the end the test prepares once more and checks:

* **exactly one boundary per usage**: every automatic boundary recovers a usage
  written after the boundary before it (none recovers a usage already recovered),
  no two boundaries share a usage key, and the last usage, when over the trigger
  line, is recovered (an earlier one over the line may have been superseded by a
  newer usage before any worker prepared again);
* ``state.rebuilds`` equals the boundaries stored;
* **nothing lost**: every stored main-agent message appears in a request prepared
  after it was written, in the activity digest of a boundary, or (rarely, when no
  worker prepared between its write and the next rebuild) behind the watermark of
  a boundary whose checkpoint writer listed it (the watermark message was written
  after it); and no request leaves out a message its window had seen after its
  watermark unless its digest lists it;
* **no duplicate**: no request holds a message twice, or sends live a message its
  boundary's digest already lists.

``MIMO_CTX_STRESS_TURNS`` (turns per worker, default 100) and ``MIMO_CTX_STRESS_RUNS``
(runs per case, default 1) make it longer; ``MIMO_CTX_STRESS_REPORT=<file>`` appends
each run's figures as a JSON line.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Any

import anyio
import pytest

from mimo_ctx._window import message_key
from mimo_ctx.digest import is_digested
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart, written_after
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.sections import BODY_INTRO
from mimo_ctx.triggers import usage_tokens

from ._workers import USABLE, SharedStore, rebuild_keys, run_workers, seed_session
from .conftest import LIMITS

TURNS = int(os.environ.get("MIMO_CTX_STRESS_TURNS", "100"))
RUNS = int(os.environ.get("MIMO_CTX_STRESS_RUNS", "1"))
_STEP = re.compile(r"step ([\w-]+)")


def _tag(message: Message) -> str | None:
    for part in message.parts:
        if isinstance(part, TextPart):
            found = _STEP.match(part.text)
            if found:
                return found.group(1)
    return None


def _activity(boundary: Message) -> set[str]:
    """The step tags the boundary's recent-activity section lists."""
    body = next(
        (
            p.text
            for p in boundary.parts
            if isinstance(p, TextPart) and p.text.startswith(BODY_INTRO)
        ),
        "",
    )
    section = body.split("# Recent activity", 1)[1] if "# Recent activity" in body else ""
    return set(re.findall(r"- assistant: step ([\w-]+)", section))


async def _one_run(shared: SharedStore, workers: int) -> dict[str, Any]:
    session, _ = await seed_session(shared, final_usage=60_000)
    script: dict[str, Any] = {
        "writer": {"thresholds": None, "lease_ttl": 5.0},
        "steps": [
            {"op": "turns", "count": TURNS, "tokens": 4000, "user_every": 7, "rebuild_every": 29}
        ],
    }
    reports = await run_workers(shared, session.id, [script] * workers, within=600)
    store = shared.store
    async with ContextMiddleware(store, shared.memory_root, model=LIMITS) as mw:
        final = await mw.prepare(session.id)

    views: list[dict[str, Any]] = [
        {
            "ids": [m.id for m in final.messages],
            "boundary_id": final.boundary_id,
            "newest": max((m.insert_seq or 0 for m in final.messages), default=0),
        }
    ]
    outcomes: Counter[str] = Counter()
    overflows = 0
    retries = 0  # requests sent again after a provider overflow
    for report in reports:
        for turn in report["steps"][0]["turns"]:
            if "rebuild" in turn:
                outcomes[f"manual:{turn['rebuild']}"] += 1
                continue
            overflows += "overflow" in turn
            retries += max(0, len(turn["views"]) - 1)
            for view in turn["views"]:
                views.append(view)
                if view["outcome"] is not None:
                    outcomes[view["outcome"]] += 1

    stored = await store.list_messages(session.id, agent=None)
    main = [m for m in stored if m.agent == MAIN_AGENT]
    by_id = {m.id: m for m in stored}
    boundaries = sorted((m for m in main if m.is_boundary), key=lambda m: m.insert_seq or 0)
    keys = await rebuild_keys(shared, session.id)
    got = await store.get_session(session.id)
    assert got is not None

    # state.rebuilds equals the boundaries stored.
    assert got.state.rebuilds == len(boundaries)
    assert set(keys) == {b.id for b in boundaries}
    assert len(set(keys.values())) == len(keys)

    # Exactly one boundary per usage.
    automatic = 0
    for before, boundary in zip([None, *boundaries], boundaries, strict=False):
        key = keys[boundary.id]
        if key.startswith("manual:"):
            continue
        automatic += 1
        usage = by_id[key]
        assert usage.role == "assistant"
        if before is not None:
            assert written_after(usage, before), (
                f"boundary {boundary.id} recovers usage {key}, already recovered by {before.id}"
            )
    finished = [m for m in main if m.role == "assistant" and m.finish is not None]
    over = [m for m in finished if (usage_tokens(m) or 0) >= USABLE]
    # The last usage, if over the line, is recovered (earlier ones over the line
    # may have been superseded by a newer usage before any prepare saw them).
    newest = max(finished, key=lambda m: m.insert_seq or 0)
    if (usage_tokens(newest) or 0) >= USABLE:
        assert any(written_after(b, newest) for b in boundaries), (
            f"the last usage {newest.id}, over the line, was never recovered"
        )

    # Nothing lost: sent in a request after it was written, listed in a digest, or
    # behind the watermark of a boundary whose checkpoint writer listed it: the
    # watermark message was written after it (one session's writes commit in
    # order, and a writer picks its watermark among what it listed).
    sent = {i for v in views for i in v["ids"]}
    digested = {tag for b in boundaries for tag in _activity(b)}

    def checkpointed(message: Message) -> bool:
        for b in boundaries:
            watermark = by_id.get(b.covered_up_to or "")
            if (
                watermark is not None
                and written_after(watermark, message)
                and message_key(message) <= message_key(watermark)
            ):
                return True
        return False

    lost = [
        m.id
        for m in main
        if not m.is_boundary
        and m.id not in sent
        and (_tag(m) is None or _tag(m) not in digested)
        and not checkpointed(m)
    ]
    assert not lost, f"{len(lost)} stored messages never sent, digested or checkpointed: {lost}"
    behind_a_watermark_only = sum(
        1
        for m in main
        if not m.is_boundary and m.id not in sent and (_tag(m) is None or _tag(m) not in digested)
    )

    # Nothing hidden: a request holds every message its window had seen that lies
    # after its boundary's watermark, unless the boundary's digest lists it.
    hidden: list[str] = []
    for view in views:
        boundary = by_id.get(view["boundary_id"] or "")
        if boundary is None or boundary.covered_up_to not in by_id:
            continue
        start = message_key(by_id[boundary.covered_up_to])
        listed = _activity(boundary)
        ids = set(view["ids"])
        hidden += [
            m.id
            for m in main
            if not m.is_boundary
            and (m.insert_seq or 0) <= view["newest"]
            and message_key(m) > start
            and m.id not in ids
            and _tag(m) not in listed
        ]
    if hidden:
        first = by_id[hidden[0]]
        around = [
            (v["boundary_id"], v["newest"], len(v["ids"]))
            for v in views
            if hidden[0] not in v["ids"] and (first.insert_seq or 0) <= v["newest"]
        ]
        raise AssertionError(
            f"{len(hidden)} messages hidden from a request, not digested: {first!r} "
            f"seq {first.insert_seq}; views {around[:6]}; boundaries "
            f"{[(b.id, b.insert_seq, b.covered_up_to, b.checkpoint_part) for b in boundaries]}"
        )

    # No duplicate: a view holds a message once, and never sends live what its
    # boundary's digest lists.
    activity = {b.id: _activity(b) for b in boundaries}
    for view in views:
        ids = view["ids"]
        assert len(ids) == len(set(ids))
        listed = activity.get(view["boundary_id"] or "", set())
        for message_id in ids:
            message = by_id.get(message_id)
            if message is None or message.is_boundary or message.role == "user":
                continue
            assert _tag(message) not in listed, f"{message_id} sent live and in the digest"
            boundary = by_id.get(view["boundary_id"] or "")
            part = boundary.checkpoint_part if boundary is not None else None
            assert part is None or not is_digested(message, part)

    return {
        "store": shared.spec["kind"],
        "processes": workers,
        "turns": workers * TURNS,
        "usages": len(finished),
        "usages_over_the_line": len(over),
        "boundaries": len(boundaries),
        "automatic_boundaries": automatic,
        "manual_boundaries": len(boundaries) - automatic,
        "state_rebuilds": got.state.rebuilds,
        "views_checked": len(views),
        "messages_checked": len(main),
        "messages_behind_a_watermark_only": behind_a_watermark_only,
        "outcomes": dict(outcomes),
        "overflow_errors": overflows,
        "overflow_retries": retries,
        "writer_runs": sum(r["writer_events"].count("WriterStarted") for r in reports),
        "writers_failed": sum(r["writer_events"].count("WriterFailed") for r in reports),
        "rebuild_runs": sum(r["rebuild_runs"] for r in reports),
        "auto_rebuild_disabled": got.state.auto_rebuild_disabled,
    }


@pytest.mark.parametrize("workers", [2, 4])
async def test_workers_serving_one_session_keep_every_guarantee(
    shared: SharedStore, workers: int
) -> None:
    for _ in range(RUNS):
        figures = await _one_run(shared, workers)
        assert figures["boundaries"] >= 2  # the run really rebuilt, automatically too
        assert figures["automatic_boundaries"] >= 1
        path = os.environ.get("MIMO_CTX_STRESS_REPORT")
        if path:
            async with await anyio.open_file(path, "a", encoding="utf-8") as out:
                await out.write(json.dumps(figures) + "\n")
