"""A second OS process driving its own ContextMiddleware on a shared SQLite file.

Run by ``test_concurrency.py`` as ``python _process_worker.py <args.json>``.
It opens the store file and memory root the test prepared, tells the test it
is ready, waits for the start signal, then at the same time (a) prepares the
session, which crosses the trigger line for the same usage in every worker, and
(b) appends messages of its own agent one write at a time. With ``barrier``
set, ``commit_rebuild`` waits until every worker has reached it, so the
workers are guaranteed to race on the same usage key. The outcome is printed
as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import anyio

from mimo_ctx.messages import Message, TextPart
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import SQLiteStore
from mimo_ctx.triggers import ModelLimits


async def _wait_for(path: Path, within: float) -> None:
    # A signal from another process: a file, polled (an anyio.Event cannot cross).
    with anyio.fail_after(within):
        while not await anyio.Path(path).exists():  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def main(args: dict[str, Any]) -> dict[str, Any]:
    index: int = args["index"]
    workers: int = args["workers"]
    sync = Path(args["sync_dir"])
    store = await SQLiteStore.open(args["db"])
    commits: list[bool] = []
    original_commit = store.commit_rebuild

    async def commit_rebuild(session_id: str, **kwargs: Any) -> bool:
        if args["barrier"]:
            (sync / f"commit-{index}").touch()
            for other in range(workers):
                await _wait_for(sync / f"commit-{other}", 60)
        result = await original_commit(session_id, **kwargs)
        commits.append(result)
        return result

    store.commit_rebuild = commit_rebuild
    report: dict[str, Any] = {"index": index}
    try:
        async with ContextMiddleware(
            store, args["memory_root"], model=ModelLimits(100_000, input_limit=100_000)
        ) as mw:
            session_id: str = args["session_id"]
            print("ready", flush=True)
            await _wait_for(sync / "go", 60)
            outcomes: list[str | None] = []
            appended: list[str] = []

            async def prepare() -> None:
                view = await mw.prepare(session_id)
                outcomes.append(view.rebuild.outcome if view.rebuild else None)
                report["boundary_id"] = view.boundary_id

            async def write() -> None:
                for i in range(args["appends"]):
                    message = Message(
                        session_id=session_id,
                        role="user",
                        agent=f"worker{index}",
                        time_created=time.time_ns() // 1_000_000,
                        parts=[TextPart(text=f"worker {index} note {i}")],
                    )
                    await mw.append([message])
                    appended.append(message.id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(prepare)
                tg.start_soon(write)
            report.update(outcomes=outcomes, appended=appended, commits=commits)
    except BaseException as exc:  # reported to the test, which fails with it
        report["error"] = "".join(traceback.format_exception(exc))
    finally:
        await store.aclose()
    return report


if __name__ == "__main__":
    arguments = json.loads(Path(sys.argv[1]).read_text())
    result = anyio.run(main, arguments)
    print(json.dumps(result), flush=True)
