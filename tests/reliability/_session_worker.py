"""One worker process serving turns of a shared session, driven by a script (issue 17).

Run by ``_workers.py`` as ``python -m tests.reliability._session_worker <args.json>``
from the repository root. The worker opens its own store (an SQLite file or a
PostgreSQL schema shared with the other workers) and its own
:class:`ContextMiddleware` over the shared memory root, prints ``ready``, waits
for the test's ``go`` file, runs its script and prints one JSON line: what each
step saw (views, rebuild outcomes, ids written).

Interleavings across processes are made deterministic with file signals:
``{"op": "signal", "name": "x"}`` creates ``<sync>/x``, ``{"op": "wait", "name":
"x"}`` waits for it. A *hook* pauses a store call: before (or after) the ``nth``
call of a store method it creates its ``signal`` file and waits for its ``wait``
file, so a test can hold one worker inside a rebuild while another acts. With
``armed_by``, only calls made once that signal file exists count.

``clock_offset_ms`` shifts this process's wall clock (ids and message times), to
play a worker whose clock is behind.

Steps (``op``):

* ``prepare`` -- ``prepare()``; records the view. With ``timeout`` (seconds) it is
  cancelled after that long, as a host's turn timeout would (``cancelled``).
* ``record`` -- record a finished assistant message: one ``read`` round of
  ``tokens`` tokens, text ``step <tag>``, with the given ``usage`` (or the last
  view's tokens plus the round when ``usage`` is absent).
* ``build`` / ``append`` -- build such a message now (id and time from now) and
  append it at a later step (``name`` links them).
* ``user`` -- append a user message.
* ``rebuild`` -- ``/rebuild``.
* ``overflow`` -- ``on_error()`` with a provider overflow for the last view;
  records whether it said "retry" or raised ``ContextOverflowError``. With
  ``task_view`` the view is not passed: the task's last one stands for it.
* ``turns`` -- ``count`` model turns through :meth:`ContextMiddleware.turn`
  against a fake model that answers with a tool round and reports as usage the
  request's estimated tokens plus the round, overflowing above the window; a user
  message every ``user_every`` turns and a ``/rebuild`` every ``rebuild_every``.
* ``state`` -- the stored session state.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from mimo_ctx.config import RebuildConfig, WriterConfig
from mimo_ctx.errors import ContextOverflowError
from mimo_ctx.events import Event, UsagePending, WriterFailed, WriterFinished, WriterStarted
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import (
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.store import SQLiteStore, Store
from mimo_ctx.testing import FakeOverflowError, filler_text
from mimo_ctx.triggers import ModelLimits
from tests.reliability._process_worker import _wait_for  # pyright: ignore[reportPrivateUsage]

if TYPE_CHECKING:
    from mimo_ctx.store.postgres import PostgresWriterLease

WINDOW = 100_000
LIMITS = ModelLimits(WINDOW, input_limit=WINDOW)  # usable = 90 000 (R1.2)


def _shift_clock(offset_ms: int) -> None:
    """Move this process's wall clock by ``offset_ms`` (ids and message times read it)."""
    if not offset_ms:
        return
    real = time.time_ns
    time.time_ns = lambda: real() + offset_ms * 1_000_000


def assistant(session_id: str, tag: str, *, usage: int, tokens: int, seed: int) -> Message:
    """A finished assistant message with one completed ``read`` round."""
    now = time.time_ns() // 1_000_000
    return Message(
        session_id=session_id,
        role="assistant",
        time_created=now,
        time_completed=now,
        finish="tool-calls",
        usage=TokenUsage(input=usage),
        parts=[
            TextPart(text=f"step {tag}"),
            ToolPart(
                call_id=f"call_{tag}",
                tool="read",
                state=ToolStateCompleted(
                    input={"file_path": f"src/{tag}.py"},
                    output=filler_text(tokens, seed=seed),
                    time=ToolTime(start=now, end=now),
                ),
            ),
        ],
    )


def _hook(store: Store, hook: dict[str, Any], sync: Path) -> None:
    """Pause the ``nth`` call of ``hook["method"]`` on the ``store`` (see the module doc)."""
    method: str = hook["method"]
    original: Callable[..., Awaitable[Any]] = getattr(store, method)
    calls = [0]
    match: dict[str, Any] = hook.get("match", {})

    async def paused(*args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(k) != v for k, v in match.items()):
            return await original(*args, **kwargs)
        if "armed_by" in hook and not (sync / hook["armed_by"]).exists():
            return await original(*args, **kwargs)
        calls[0] += 1
        pause = calls[0] == hook.get("nth", 1)
        if pause and hook.get("when", "before") == "before":
            (sync / hook["signal"]).touch()
            await _wait_for(sync / hook["wait"], 120)
        result = await original(*args, **kwargs)
        if pause and hook.get("when") == "after":
            (sync / hook["signal"]).touch()
            await _wait_for(sync / hook["wait"], 120)
        return result

    setattr(store, method, paused)


def _view(view: RequestView) -> dict[str, Any]:
    return {
        "boundary_id": view.boundary_id,
        "outcome": view.rebuild.outcome if view.rebuild is not None else None,
        "ids": [m.id for m in view.messages],
        "tokens": view.tokens,
        # The newest write the view's window had seen: every message written up to
        # it was fed to the window (one session's writes commit in order).
        "newest": max((m.insert_seq or 0 for m in view.messages), default=0),
    }


async def _open_store(spec: dict[str, Any]) -> tuple[Store, PostgresWriterLease | None]:
    if spec["kind"] == "sqlite":
        return await SQLiteStore.open(spec["path"]), None
    from mimo_ctx.store.postgres import PostgresStore, PostgresWriterLease

    store = await PostgresStore.open(spec["dsn"], schema=spec["schema"])
    return store, PostgresWriterLease(store)


async def main(args: dict[str, Any]) -> dict[str, Any]:
    _shift_clock(int(args.get("clock_offset_ms", 0)))
    sync = Path(args["sync_dir"])
    index: int = args["index"]
    session_id: str = args["session_id"]
    store, lease = await _open_store(args["store"])
    for hook in args.get("hooks", []):
        _hook(store, hook, sync)
    writer = args.get("writer", {})
    config = RebuildConfig(
        writer=WriterConfig(
            # Absent: no early thresholds; null: the A3 schedule; else the list given.
            thresholds=(
                ()
                if "thresholds" not in writer
                else None
                if writer["thresholds"] is None
                else tuple(writer["thresholds"])
            ),
            lease_ttl=float(writer.get("lease_ttl", 5.0)),
        )
    )
    # writer_events: the writer runs seen; rebuild_runs: rebuilds this worker began
    # (UsagePending opens every rebuild attempt, committed or refused).
    report: dict[str, Any] = {"index": index, "steps": [], "writer_events": [], "rebuild_runs": 0}
    steps: list[dict[str, Any]] = report["steps"]

    def on_event(event: Event) -> None:
        if isinstance(event, WriterStarted | WriterFinished | WriterFailed):
            report["writer_events"].append(type(event).__name__)
        elif isinstance(event, UsagePending):
            report["rebuild_runs"] += 1

    built: dict[str, Message] = {}
    last: list[RequestView] = []
    try:
        async with (
            MemoryIndex(Path(args["index_path"])) as memory_index,
            ContextMiddleware(
                store,
                args["memory_root"],
                model=LIMITS,
                config=config,
                on_event=on_event,
                memory_index=memory_index,
                writer_lease=lease,
            ) as mw,
        ):
            print("ready", flush=True)
            await _wait_for(sync / "go", 120)
            for step in args["steps"]:
                op = step["op"]
                seen: dict[str, Any] = {"op": op}
                if op == "prepare":
                    # A host's turn timeout: cancelled after ``timeout`` seconds.
                    with anyio.move_on_after(float(step.get("timeout", "inf"))) as scope:
                        view = await mw.prepare(session_id)
                        last.append(view)
                        seen.update(_view(view))
                    seen["cancelled"] = scope.cancelled_caught
                elif op in ("record", "build"):
                    usage = step.get("usage")
                    tokens = int(step.get("tokens", 2000))
                    if usage is None:
                        usage = (last[-1].tokens if last else 0) + tokens
                    message = assistant(
                        session_id, step["tag"], usage=int(usage), tokens=tokens, seed=index
                    )
                    if op == "build":
                        built[step["name"]] = message
                    else:
                        await mw.record(message)
                    seen["id"] = message.id
                elif op == "append":
                    message = built[step["name"]]
                    await mw.record(message)
                    seen["id"] = message.id
                elif op == "user":
                    seen["id"] = (await mw.add_user_message(session_id, step["text"])).id
                elif op == "rebuild":
                    result = await mw.rebuild(session_id)
                    seen.update(outcome=result.outcome, boundary_id=result.boundary_id)
                elif op == "overflow":
                    error = FakeOverflowError(WINDOW + 1, WINDOW)
                    try:
                        if step.get("task_view"):
                            # The request this task was given last (on_error's default).
                            seen["retry"] = await mw.on_error(session_id, error)
                        else:
                            seen["retry"] = await mw.on_error(
                                session_id, error, view=last[-1] if last else None
                            )
                    except ContextOverflowError:
                        seen["retry"] = "raised"
                elif op == "turns":
                    seen["turns"] = await _turns(mw, session_id, index, step)
                elif op == "signal":
                    (sync / step["name"]).touch()
                elif op == "wait":
                    await _wait_for(sync / step["name"], 120)
                elif op == "state":
                    session = await store.get_session(session_id)
                    assert session is not None
                    seen["state"] = session.state.model_dump()
                else:
                    raise ValueError(f"unknown step {op!r}")
                steps.append(seen)
    except BaseException as exc:  # reported to the test, which fails with it
        report["error"] = "".join(traceback.format_exception(exc))
    finally:
        if lease is not None:
            await lease.aclose()
        await store.aclose()
    return report


def _fake_model(
    session_id: str, tag: str, tokens: int, seed: int, sent: list[dict[str, Any]]
) -> Callable[[RequestView], Awaitable[Message]]:
    """A model answering with one tool round; usage = the request plus the round."""

    async def call(view: RequestView) -> Message:
        sent.append(_view(view))
        if view.tokens > WINDOW:
            raise FakeOverflowError(view.tokens, WINDOW)
        return assistant(session_id, tag, usage=view.tokens + tokens, tokens=tokens, seed=seed)

    return call


async def _turns(
    mw: ContextMiddleware, session_id: str, index: int, step: dict[str, Any]
) -> list[dict[str, Any]]:
    """Model turns against a fake model (see the module docstring)."""
    count = int(step["count"])
    tokens = int(step.get("tokens", 3000))
    user_every = int(step.get("user_every", 0))
    rebuild_every = int(step.get("rebuild_every", 0))
    turns: list[dict[str, Any]] = []
    for turn in range(count):
        tag = f"w{index}-{turn}"
        if user_every and turn % user_every == user_every - 1:
            await mw.add_user_message(session_id, f"user says {tag}")
        if rebuild_every and turn % rebuild_every == rebuild_every - 1:
            result = await mw.rebuild(session_id)
            turns.append({"rebuild": result.outcome, "boundary_id": result.boundary_id})
        sent: list[dict[str, Any]] = []
        call = _fake_model(session_id, tag, tokens, index + turn, sent)

        try:
            reply = await mw.turn(session_id, call)
            turns.append({"tag": tag, "id": reply.id, "views": sent})
        except ContextOverflowError as exc:
            turns.append({"tag": tag, "overflow": str(exc), "views": sent})
        # Let the other workers in: turns of one session interleave.
        await anyio.sleep(float(step.get("pause", 0.0)))
    return turns


if __name__ == "__main__":
    arguments = json.loads(Path(sys.argv[1]).read_text())
    result = anyio.run(main, arguments)
    print(json.dumps(result), flush=True)
