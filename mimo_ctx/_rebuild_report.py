"""What a rebuild reports (:class:`~mimo_ctx.rebuild.Rebuilder`), and the ``/rebuild`` command.

Private: every name here is public from :mod:`mimo_ctx.rebuild`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from mimo_ctx._util import now_ms
from mimo_ctx.events import ContextRebuilt, StatusChanged
from mimo_ctx.render import RenderedBody
from mimo_ctx.tracing import Attributes

__all__ = [
    "REBUILD_COMMAND",
    "REBUILD_OUTCOMES",
    "OverflowAnswer",
    "RebuildCommand",
    "RebuildOutcome",
    "RebuildReport",
    "Trigger",
    "cancelled_status",
    "describe_rebuild",
    "rebuild_command",
    "rebuilt_event",
    "report_attributes",
    "span_start",
]

Trigger = Literal["usage", "overflow", "manual"]
"""What started a rebuild: the trigger line, a provider overflow error, or ``/rebuild``."""

RebuildOutcome = Literal[
    "rebuilt",
    "writer-failed",
    "insert-failed",
    "memory-write-off",
    "checkpoint-off",
    "compacted",
    "already-recovered",
    "auto-disabled",
    "not-main-agent",
    "cancelled",
]
"""How a rebuild ended.

The first five are the original's (SPEC A3). Ours: ``compacted`` (a plain
compaction was inserted instead: sub-agents, and the fallback of the outcomes
that allow it), ``already-recovered`` (R1.4: another task or worker recovered
this usage first), ``auto-disabled`` (the loop guard stopped automatic rebuilds),
``not-main-agent`` (only the main agent is rebuilt, R3.1), ``cancelled`` (the
host's ``before_rebuild`` hook cancelled an automatic rebuild, :mod:`mimo_ctx.hooks`).
"""

REBUILD_OUTCOMES: Final[tuple[str, ...]] = RebuildOutcome.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What a rebuild did.

    Attributes:
        outcome: How it ended (see :data:`RebuildOutcome`).
        trigger: ``usage`` (trigger line), ``overflow`` (provider error) or ``manual``.
        boundary_id: The inserted boundary (or compaction) message, if any.
        watermark: The watermark the checkpoint covers.
        tokens_before: Estimated request tokens before the rebuild.
        tokens_after: Estimated request tokens after it.
        compacted_results: Tool results micro-compaction cleared.
        sections: Per-section figures of the rendered body.
        fallback: ``compaction`` when a plain compaction was inserted instead.
        over_line: The rebuilt request is still estimated above the trigger line:
            what stays live after the watermark (the user's own messages, an open
            tool round) leaves no room, so even the smallest body cannot fit. The
            next automatic rebuild would not help either; the loop guard sees it.
        cancel_reason: Why the host's ``before_rebuild`` hook cancelled it.
    """

    outcome: RebuildOutcome
    trigger: Trigger
    boundary_id: str | None = None
    watermark: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    compacted_results: int = 0
    sections: RenderedBody | None = None
    fallback: Literal["compaction"] | None = None
    over_line: bool = False
    cancel_reason: str | None = None


@dataclass(frozen=True, slots=True)
class OverflowAnswer:
    """What to do about a provider overflow (:meth:`Rebuilder.overflow`).

    Attributes:
        retry: Send the request again, prepared afresh.
        reason: Why not, when ``retry`` is false.
        report: The rebuild that ran for it, if one ran.
    """

    retry: bool
    reason: str = ""
    report: RebuildReport | None = None


REBUILD_COMMAND: Final = "/rebuild"
"""The manual rebuild command a user types; ``/rebuild <focus>`` gives it a focus."""


@dataclass(frozen=True, slots=True)
class RebuildCommand:
    """A ``/rebuild`` command typed by the user.

    Attributes:
        focus: The text after the command (what the rebuild should keep in view),
            or ``None`` when there is none.
    """

    focus: str | None = None


def rebuild_command(text: str) -> RebuildCommand | None:
    """Read ``/rebuild`` or ``/rebuild <focus>`` (the whole message); else ``None``.

    The command must open the message (surrounding whitespace aside) and stand as a
    word of its own: ``/rebuilding`` is not it. The focus keeps its lines.
    """
    stripped = text.strip()
    if not stripped.startswith(REBUILD_COMMAND):
        return None
    rest = stripped[len(REBUILD_COMMAND) :]
    if rest and not rest[0].isspace():
        return None
    return RebuildCommand(rest.strip() or None)


def describe_rebuild(report: RebuildReport) -> str:
    """One line saying how a rebuild ended, for a status or a command's reply.

    ``Context rebuild: rebuilt (52,950 -> 2,814 tokens)``; a cancelled one gives the
    host's reason.
    """
    text = f"Context rebuild: {report.outcome}"
    if report.cancel_reason is not None:
        return f"{text} ({report.cancel_reason})"
    if report.tokens_before is not None and report.tokens_after is not None:
        return f"{text} ({report.tokens_before:,} -> {report.tokens_after:,} tokens)"
    return text


def span_start(session_id: str, agent: str, trigger: Trigger) -> dict[str, str | bool]:
    """The ``mimo_ctx.rebuild`` span's attributes when it opens."""
    return {"mimo_ctx.session_id": session_id, "mimo_ctx.agent": agent, "mimo_ctx.trigger": trigger}


def report_attributes(report: RebuildReport) -> Attributes:
    """The ``mimo_ctx.rebuild`` span's outcome and figures (ids and numbers, no text)."""
    figures: dict[str, str | int | bool] = {
        "mimo_ctx.outcome": report.outcome,
        "mimo_ctx.compacted_results": report.compacted_results,
        "mimo_ctx.over_line": report.over_line,
        "mimo_ctx.cancelled": report.cancel_reason is not None,
    }
    optional = {
        "mimo_ctx.boundary_id": report.boundary_id,
        "mimo_ctx.tokens_before": report.tokens_before,
        "mimo_ctx.tokens_after": report.tokens_after,
        "mimo_ctx.fallback": report.fallback,
    }
    figures.update({key: value for key, value in optional.items() if value is not None})
    return figures


def rebuilt_event(session_id: str, report: RebuildReport, boundary_id: str) -> ContextRebuilt:
    """The event announcing a committed rebuild (or plain compaction) and its figures."""
    return ContextRebuilt(
        session_id=session_id,
        time=now_ms(),
        outcome=report.outcome,
        manual=report.trigger == "manual",
        boundary_id=boundary_id,
        watermark=report.watermark,
        tokens_before=report.tokens_before,
        tokens_after=report.tokens_after,
        compacted_results=report.compacted_results,
        over_line=report.over_line,
    )


def cancelled_status(session_id: str, reason: str) -> StatusChanged:
    """The status event saying the host's ``before_rebuild`` hook cancelled a rebuild."""
    return StatusChanged(
        session_id=session_id,
        time=now_ms(),
        status=f"Context rebuild cancelled by the host: {reason}",
    )
