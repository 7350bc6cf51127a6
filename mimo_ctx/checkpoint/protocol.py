"""The checkpoint-writer protocol: what a writer gets and what it returns (SPEC A3).

A writer turns a session's history up to the watermark into ``checkpoint.md``.
The built-in ones are the offline writer (no model) and the LLM writer
(:mod:`mimo_ctx.checkpoint.offline`, :mod:`mimo_ctx.checkpoint.llm`); a host may
bring its own by implementing :class:`CheckpointWriter`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from mimo_ctx.messages import Message
from mimo_ctx.session import Task

__all__ = ["CheckpointDraft", "CheckpointWriter", "WriterRequest"]


@dataclass(frozen=True, slots=True)
class WriterRequest:
    """Everything a checkpoint writer gets (SPEC A3).

    Attributes:
        session_id: The session.
        project_id: The session's project.
        watermark: Id of the last message the checkpoint must cover.
        messages: What the model sees, up to and including the watermark (SPEC A3
            as amended): the main agent's messages after the later of the previous
            watermark and the newest boundary's (that boundary included; before
            either, the history), uncollapsed (R7.4: the writer sees the whole
            tail). ``previous_checkpoint`` covers what came before.
        previous_checkpoint: The checkpoint on disk, to carry forward what is alive.
        notes: ``notes.md``, to fold in.
        tasks: The session's task registry.
        checkpoint_path: Where ``checkpoint.md`` goes.
        project_memory_path: The project's ``MEMORY.md``.
        notes_path: The session's ``notes.md``.
        tasks_dir: The session's task directory.
        budgets: Token budget per checkpoint section number (A14, R5.10).
        previous_state: The state the previous writer run saved beside the
            checkpoint (``checkpoint.state.json``), for writers that extend it.
        focus: What the user asked a manual rebuild to focus on (``/rebuild
            <focus>``): the checkpoint should keep it in view. ``None`` otherwise.
    """

    session_id: str
    project_id: str
    watermark: str
    messages: Sequence[Message]
    previous_checkpoint: str | None
    notes: str | None
    tasks: Sequence[Task]
    checkpoint_path: Path
    project_memory_path: Path
    notes_path: Path
    tasks_dir: Path
    budgets: Mapping[int, int]
    previous_state: str | None = None
    focus: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointDraft:
    """A writer's output.

    Attributes:
        text: The new ``checkpoint.md``.
        extra_files: Spill-over files (``checkpoint-<topic>.md`` -> content) written
            beside it.
        notes_folded: The writer folded ``notes.md`` in; it is emptied after success.
        state: Machine-readable state to keep beside the checkpoint
            (``checkpoint.state.json``) and hand to the next run as
            :attr:`WriterRequest.previous_state`; ``None`` keeps none.
    """

    text: str
    extra_files: Mapping[str, str] = field(default_factory=dict[str, str])
    notes_folded: bool = False
    state: str | None = None


@runtime_checkable
class CheckpointWriter(Protocol):
    """Writes ``checkpoint.md`` from a session's history."""

    @property
    def name(self) -> str:
        """A short name for events and logs (``llm``, ``offline``)."""
        ...

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        """Return the new checkpoint. Raising means the writer failed."""
        ...
