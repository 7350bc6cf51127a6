"""One agent-service worker, as an OS process, for tests/store/test_multiworker.py.

Run as ``python -m tests.store.multiworker_worker MODE CONFIG_JSON`` from the
repository root. Each worker has its own :class:`ContextMiddleware` over its own
:class:`PostgresStore` pool and :class:`PostgresWriterLease`, shares the memory
root with the other workers (the shared volume of a deployment) and keeps its
memory index on its own path (a per-worker cache).

Modes:

* ``prepare`` -- print ``ready``, wait for a line on stdin, run ``count``
  concurrent ``prepare()`` calls on the session, print one JSON line with each
  view's rebuild outcome and boundary id and the writer runs this worker started.
* ``hang`` -- ``prepare()`` the session with a writer that never finishes: the
  rebuild takes the writer lease and waits; the writer prints ``holding`` once it
  runs (lease held, renewed), then the parent kills the process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx.checkpoint import CheckpointDraft, WriterRequest
from mimo_ctx.config import RebuildConfig, WriterConfig
from mimo_ctx.events import Event, WriterStarted
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.store.postgres import PostgresStore, PostgresWriterLease
from mimo_ctx.triggers import ModelLimits

__all__ = ["LIMITS", "USABLE", "config", "main"]

# usable = 90000 tokens (R1.2: input limit 100k, ratio 0.90).
LIMITS = ModelLimits(100_000, input_limit=100_000)
USABLE = 90_000


def config(ttl: float) -> RebuildConfig:
    """No early writer thresholds: the trigger line is what starts the writer."""
    return RebuildConfig(writer=WriterConfig(thresholds=(), lease_ttl=ttl))


class _HangingWriter:
    """Says it runs, then never finishes (the process is killed meanwhile)."""

    @property
    def name(self) -> str:
        return "hanging"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        print("holding", flush=True)
        await anyio.sleep(3600)
        raise AssertionError("the worker should have been killed")


async def _prepare(cfg: dict[str, Any]) -> None:
    session_id = str(cfg["session_id"])
    started: list[str] = []

    def on_event(event: Event) -> None:
        if isinstance(event, WriterStarted):
            started.append(event.reason)

    async with (
        PostgresStore(str(cfg["dsn"]), schema=str(cfg["schema"]), max_size=10) as store,
        MemoryIndex(Path(str(cfg["index"]))) as index,
    ):
        lease = PostgresWriterLease(store)
        try:
            async with ContextMiddleware(
                store,
                Path(str(cfg["memory_root"])),
                model=LIMITS,
                config=config(float(cfg["ttl"])),
                on_event=on_event,
                memory_index=index,
                writer_lease=lease,
            ) as mw:
                print("ready", flush=True)
                await anyio.to_thread.run_sync(sys.stdin.readline)
                views: list[RequestView] = []

                async def one() -> None:
                    views.append(await mw.prepare(session_id))

                async with anyio.create_task_group() as tg:
                    for _ in range(int(cfg["count"])):
                        tg.start_soon(one)
        finally:
            await lease.aclose()
    print(
        json.dumps(
            {
                "views": [
                    {
                        "outcome": v.rebuild.outcome if v.rebuild is not None else None,
                        "boundary_id": v.boundary_id,
                    }
                    for v in views
                ],
                "writer_runs": started,
            }
        ),
        flush=True,
    )


async def _hang(cfg: dict[str, Any]) -> None:
    async with (
        PostgresStore(str(cfg["dsn"]), schema=str(cfg["schema"])) as store,
        MemoryIndex(Path(str(cfg["index"]))) as index,
    ):
        lease = PostgresWriterLease(store)
        async with ContextMiddleware(
            store,
            Path(str(cfg["memory_root"])),
            model=LIMITS,
            config=config(float(cfg["ttl"])),
            writer=_HangingWriter(),
            fallback_writer=False,
            memory_index=index,
            writer_lease=lease,
        ) as mw:
            await mw.prepare(str(cfg["session_id"]))
    raise AssertionError("the worker should have been killed")


def main(argv: list[str]) -> None:
    """Run one worker: ``MODE CONFIG_JSON``."""
    mode, raw = argv
    cfg: dict[str, Any] = json.loads(raw)
    anyio.run({"prepare": _prepare, "hang": _hang}[mode], cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
