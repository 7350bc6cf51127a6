"""The checkpoint-writer protocol: what a writer gets and what it returns (SPEC A3).

A writer turns a session's history up to the watermark into ``checkpoint.md``.
The built-in ones are the offline writer (no model) and the LLM writer
(:mod:`mimo_ctx.checkpoint.offline`, :mod:`mimo_ctx.checkpoint.llm`); a host may
bring its own by implementing :class:`CheckpointWriter`.

Besides the history, a writer gets the request the session's main agent last
sent (:class:`SentRequest`): a model-backed writer that uses the session's own
model sends that request again, byte for byte, with one more user message, so
the provider's prompt cache serves everything before it (the original's writer
is such a fork of the session). What a run costs goes on the request's
:class:`WriterMeter`, which the writer events report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from mimo_ctx.messages import Message
from mimo_ctx.session import RequestPrefix, Task
from mimo_ctx.triggers import ModelLimits

__all__ = [
    "CheckpointDraft",
    "CheckpointWriter",
    "SentApi",
    "SentRequest",
    "WriterMeter",
    "WriterRequest",
]

SentApi = Literal["openai-chat", "openai-responses", "anthropic"]
"""The provider API a wrapped client sent a request through."""


@dataclass(frozen=True, slots=True)
class SentRequest:
    """The request the session's main agent last sent: where a forked writer starts.

    The middleware keeps the newest one per session in memory (until the session
    is closed); a wrapped client adds the provider payload it sent for the view.

    Attributes:
        prefix: The session's frozen prefix (system prompt and tools).
        messages: The view's messages as :meth:`~mimo_ctx.middleware.ContextMiddleware.prepare`
            returned them (send rules applied, per-turn reminder included).
        tokens: Their estimated tokens, prefix included.
        boundary_id: The newest boundary the view starts at, if any.
        api: The provider API the payload was sent through, when a wrapped client
            sent it; ``None`` when the host sent the view itself.
        payload: The keyword arguments the wrapped client passed to the SDK
            (``model``, ``system``, ``tools``, ``messages`` / ``input``...), exactly.
        origin: The base URL of the client that sent it.
    """

    prefix: RequestPrefix
    messages: Sequence[Message]
    tokens: int
    boundary_id: str | None = None
    api: SentApi | None = None
    payload: Mapping[str, Any] | None = None
    origin: str | None = None


@dataclass(slots=True)
class WriterMeter:
    """What one writer run cost, filled in by the writer as its model calls go.

    Input a call sent counts as soon as it is sent (the writer's own estimate),
    and is replaced by what the provider reports when the answer comes, so a run
    cut short by its time limit still shows what it spent.

    Attributes:
        calls: Model calls made.
        sent: Input tokens sent (the provider's figure, cached tokens included,
            else the estimate).
        cached: Input tokens the provider reported it served from its prompt cache.
        output: Output tokens (the provider's figure, else the estimate).
        forked: The run sent the session's own last request plus one message.
    """

    calls: int = 0
    sent: int = 0
    cached: int = 0
    output: int = 0
    forked: bool = False


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
        previous_watermark: The watermark the previous checkpoint covers up to:
            a writer that carries ``previous_checkpoint`` forward only needs the
            messages after it.
        last_request: The request the main agent last sent, when this process
            sent one (a forked model writer resends it).
        focus: What the user asked a manual rebuild to focus on (``/rebuild
            <focus>``): the checkpoint should keep it in view. ``None`` otherwise.
        model_limits: The session model's window (a model writer on the same model
            uses it when it was given no window of its own).
        meter: Where the writer notes what its model calls cost.
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
    previous_watermark: str | None = None
    last_request: SentRequest | None = None
    focus: str | None = None
    model_limits: ModelLimits | None = None
    meter: WriterMeter = field(default_factory=WriterMeter)


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
