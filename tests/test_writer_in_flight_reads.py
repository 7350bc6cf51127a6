"""Turns taken while a checkpoint writer runs cost no store reads for the thresholds (A3).

While a writer of this middleware runs, nothing can start or be marked, so the
due thresholds are left for later. The session used to be read (a store round
trip and a parse) on every such turn only to find that out: over a long session
writer runs grow longer, so more and more turns paid for it.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from mimo_ctx.checkpoint import CheckpointDraft, OfflineCheckpointWriter, WriterRequest
from mimo_ctx.config import RebuildConfig, WriterConfig
from mimo_ctx.messages import Message
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.session import Session
from mimo_ctx.store import InMemoryStore
from mimo_ctx.testing import ScriptedModel, tool_round
from mimo_ctx.triggers import ModelLimits

LIMITS = ModelLimits(100_000, input_limit=100_000)  # the trigger line at 90k


class _CountingStore(InMemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.session_reads = 0

    async def get_session(self, session_id: str) -> Session | None:
        self.session_reads += 1
        return await super().get_session(session_id)


class _SlowWriter:
    def __init__(self) -> None:
        self.calls = 0
        self.started = anyio.Event()
        self.release = anyio.Event()

    @property
    def name(self) -> str:
        return "slow"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return OfflineCheckpointWriter().build(request)


async def test_a3_due_thresholds_wait_for_the_running_writer_without_reading_the_session(
    tmp_path: Path,
) -> None:
    store = _CountingStore()
    writer = _SlowWriter()
    model = ScriptedModel(
        [tool_round("read", 3_000, seed=i, file_path=f"src/m{i}.py") for i in range(30)]
    )
    config = RebuildConfig(writer=WriterConfig(thresholds=("30K", "45K", "60K")))
    async with ContextMiddleware(
        store, tmp_path / "mem", model=LIMITS, config=config, writer=writer
    ) as mw:
        session = await mw.open_session(system="agent", tools=[])
        await mw.add_user_message(session.id, "Refactor every module.")
        usage = 0
        while not mw.writer_running(session.id):
            usage = _usage(await mw.turn(session.id, model.complete))
            assert usage < 45_000, "the first threshold did not start the writer"
        with anyio.fail_after(5):  # the run has read what it needs and waits
            await writer.started.wait()
        # Past the next threshold while the first writer still runs, under the
        # trigger line (90k): every one of these turns has a threshold due.
        store.session_reads = 0
        while usage < 48_000:
            usage = _usage(await mw.turn(session.id, model.complete))
        assert store.session_reads == 0
        assert writer.calls == 1
        writer.release.set()
        assert (await mw.wait_for_writer(session.id, timeout=5)) == "finished"
        # Once it has finished, the threshold crossed meanwhile starts the next run.
        await mw.turn(session.id, model.complete)
        assert mw.writer_running(session.id)
        assert (await mw.wait_for_writer(session.id, timeout=5)) == "finished"
        assert writer.calls == 2


def _usage(reply: Message) -> int:
    assert reply.usage is not None
    return reply.usage.context_tokens
