"""The report of a replay (:func:`mimo_ctx.replay.replay_transcript`): plain values.

Each type has a ``to_json`` giving the document ``mimo-ctx replay --json`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mimo_ctx.messages import Message
from mimo_ctx.tokens import estimate_message_tokens

__all__ = [
    "ReplayCompaction",
    "ReplayOverflow",
    "ReplayPoint",
    "ReplayRebuild",
    "ReplayReport",
    "ReplayRequest",
    "ReplayWriterRun",
]


@dataclass(frozen=True, slots=True)
class ReplayWriterRun:
    """One checkpoint-writer run during a replay.

    Attributes:
        at: Index (in the transcript's messages) of the message being replayed when
            the writer started.
        watermark: The imported id of the watermark it covers up to.
        writer: The writer's name (``offline``...).
        result: ``finished``, ``failed``, or ``running`` if it never ended.
        checkpoint_tokens: Estimated size of the checkpoint it wrote.
        failure: Why it failed (``error``, ``timeout``, ``invalid``), if it did.
        calls: Model calls a model-backed writer made (0 for the offline writer).
        tokens_sent: Input tokens those calls sent (cached included).
        tokens_cached: Of them, tokens the provider served from its prompt cache.
        tokens_output: Output tokens.
        forked: The run resent the session's own last request.
    """

    at: int
    watermark: str | None
    writer: str
    result: Literal["finished", "failed", "running"] = "running"
    checkpoint_tokens: int | None = None
    failure: str | None = None
    calls: int = 0
    tokens_sent: int = 0
    tokens_cached: int = 0
    tokens_output: int = 0
    forked: bool = False

    def to_json(self) -> dict[str, Any]:
        """The run as a JSON-ready mapping."""
        return {
            "at": self.at,
            "watermark": self.watermark,
            "writer": self.writer,
            "result": self.result,
            "checkpoint_tokens": self.checkpoint_tokens,
            "failure": self.failure,
            "calls": self.calls,
            "tokens_sent": self.tokens_sent,
            "tokens_cached": self.tokens_cached,
            "tokens_output": self.tokens_output,
            "forked": self.forked,
        }


@dataclass(frozen=True, slots=True)
class ReplayRebuild:
    """One rebuild (or fallback compaction) during a replay.

    Attributes:
        at: Index of the assistant message whose request the rebuild ran before.
        message_id: The imported id of that message.
        outcome: The rebuild's outcome (``rebuilt``, ``compacted``...).
        trigger: What started it (``usage``).
        watermark: The imported id of the watermark, if any.
        tokens_before: Estimated request tokens before the rebuild.
        tokens_after: Estimated tokens of the request actually prepared after it.
        compacted_results: Tool results micro-compaction cleared.
        user_words_retained: Share (0..1) of the user's newest typed words found
            verbatim in the rebuilt request (see :func:`user_words_retained`);
            ``None`` when the user had typed nothing yet.
    """

    at: int
    message_id: str
    outcome: str
    trigger: str
    watermark: str | None
    tokens_before: int | None
    tokens_after: int
    compacted_results: int
    user_words_retained: float | None

    def to_json(self) -> dict[str, Any]:
        """The rebuild as a JSON-ready mapping."""
        return {
            "at": self.at,
            "message_id": self.message_id,
            "outcome": self.outcome,
            "trigger": self.trigger,
            "watermark": self.watermark,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "compacted_results": self.compacted_results,
            "user_words_retained": self.user_words_retained,
        }


@dataclass(frozen=True, slots=True)
class ReplayCompaction:
    """A compaction the transcript's own agent performed (not replayed).

    Attributes:
        at: Index of the compaction summary in the transcript's messages.
        message_id: The imported id of the summary message.
        agent: The agent that was compacted.
        trigger: ``auto`` or ``manual`` when the transcript says so.
        tokens_before: The transcript's context size just before it, when known.
    """

    at: int
    message_id: str
    agent: str
    trigger: str | None
    tokens_before: int | None

    def to_json(self) -> dict[str, Any]:
        """The compaction as a JSON-ready mapping."""
        return {
            "at": self.at,
            "message_id": self.message_id,
            "agent": self.agent,
            "trigger": self.trigger,
            "tokens_before": self.tokens_before,
        }


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One main-agent request of a replay: the series ``--plot`` and the sparkline draw.

    Attributes:
        at: Index of the assistant message the request was prepared for.
        tokens: Estimated tokens of the request sent (after a rebuild, if one ran;
            after the recovery, if the provider overflowed).
        transcript_tokens: The transcript's own usage for that message (its
            provider's count of the context *it* sent), when it has one.
    """

    at: int
    tokens: int
    transcript_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The request as a JSON-ready mapping."""
        return {"at": self.at, "tokens": self.tokens, "transcript_tokens": self.transcript_tokens}


@dataclass(frozen=True, slots=True)
class ReplayOverflow:
    """A request the provider would have refused: larger than the model's input limit.

    The replay then does what a live loop does
    (:meth:`~mimo_ctx.middleware.ContextMiddleware.on_error`: rebuild once, retry).

    Attributes:
        at: Index of the assistant message the request was for.
        tokens: Estimated tokens of the refused request.
        recovered: The retried request fitted.
    """

    at: int
    tokens: int
    recovered: bool

    def to_json(self) -> dict[str, Any]:
        """The overflow as a JSON-ready mapping."""
        return {"at": self.at, "tokens": self.tokens, "recovered": self.recovered}


@dataclass(frozen=True, slots=True)
class ReplayPoint:
    """The manual rebuild a replay ran where it was asked to stop (``rebuild_at``).

    Attributes:
        at: Index of the first transcript message *not* replayed.
        outcome: The rebuild's outcome (``rebuilt``, ``compacted``...).
        boundary: The boundary message as stored, when one was inserted.
        request: The request prepared right after the rebuild, as it would be
            sent (:attr:`~mimo_ctx.view.RequestView.messages`).
        request_tokens: Its estimated tokens.
    """

    at: int
    outcome: str
    boundary: Message | None
    request: tuple[Message, ...]
    request_tokens: int

    def to_json(self) -> dict[str, Any]:
        """The point as a JSON-ready mapping (sizes, not the messages)."""
        return {
            "at": self.at,
            "outcome": self.outcome,
            "boundary_tokens": (
                estimate_message_tokens(self.boundary) if self.boundary is not None else None
            ),
            "request_tokens": self.request_tokens,
        }


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay saw.

    Attributes:
        window: The model window the replay assumed (tokens).
        trigger_tokens: The trigger line for that window (SPEC R1.2).
        turns: Main-agent requests prepared (one per assistant message).
        messages: Transcript messages replayed.
        writer_runs: Every checkpoint-writer run, in order.
        rebuilds: Every rebuild, in order.
        peak_request_tokens: The largest prepared request (estimated tokens).
        total_tokens_sent: Sum of the estimated tokens of every prepared request.
        transcript_compactions: The transcript's own compactions.
        transcript_usage_turns: Turns recorded with the transcript's own usage.
        estimated_usage_turns: Turns recorded with an estimated usage.
        format: The transcript's format.
        point: The manual rebuild at ``rebuild_at``, when one was asked for.
        session_id: The transcript's session id.
        writer_thresholds: The usage thresholds that start the writer (SPEC A3).
        input_limit: What the provider accepts: larger requests overflow.
        requests: Every main-agent request, in order.
        overflows: Every request the provider would have refused.
    """

    window: int
    trigger_tokens: int
    turns: int
    messages: int
    writer_runs: list[ReplayWriterRun] = field(default_factory=list[ReplayWriterRun])
    rebuilds: list[ReplayRebuild] = field(default_factory=list[ReplayRebuild])
    peak_request_tokens: int = 0
    total_tokens_sent: int = 0
    transcript_compactions: list[ReplayCompaction] = field(default_factory=list[ReplayCompaction])
    transcript_usage_turns: int = 0
    estimated_usage_turns: int = 0
    format: str = ""
    point: ReplayPoint | None = None
    session_id: str = ""
    writer_thresholds: list[int] = field(default_factory=list[int])
    input_limit: int = 0
    requests: list[ReplayRequest] = field(default_factory=list[ReplayRequest])
    overflows: list[ReplayOverflow] = field(default_factory=list[ReplayOverflow])

    def writer_tokens(self) -> dict[str, int]:
        """What the session's writer runs cost: model calls and tokens sent, cached, output."""
        runs = self.writer_runs
        return {
            "calls": sum(r.calls for r in runs),
            "sent": sum(r.tokens_sent for r in runs),
            "cached": sum(r.tokens_cached for r in runs),
            "output": sum(r.tokens_output for r in runs),
        }

    def to_json(self) -> dict[str, Any]:
        """The report as the JSON document ``mimo-ctx replay --json`` prints.

        ``writer_runs`` is the number of writer runs; ``writers`` lists them;
        ``writer_tokens`` sums their model calls and tokens (:meth:`writer_tokens`).
        """
        return {
            "window": self.window,
            "trigger_tokens": self.trigger_tokens,
            "turns": self.turns,
            "writer_runs": len(self.writer_runs),
            "writer_tokens": self.writer_tokens(),
            "peak_request_tokens": self.peak_request_tokens,
            "total_tokens_sent": self.total_tokens_sent,
            "rebuilds": [r.to_json() for r in self.rebuilds],
            "transcript_compactions": [c.to_json() for c in self.transcript_compactions],
            "writers": [w.to_json() for w in self.writer_runs],
            "messages": self.messages,
            "format": self.format,
            "usage": {
                "transcript_turns": self.transcript_usage_turns,
                "estimated_turns": self.estimated_usage_turns,
            },
            "session_id": self.session_id,
            "writer_thresholds": self.writer_thresholds,
            "input_limit": self.input_limit,
            "overflows": [o.to_json() for o in self.overflows],
            "requests": [r.to_json() for r in self.requests],
            **({"point": self.point.to_json()} if self.point is not None else {}),
        }
