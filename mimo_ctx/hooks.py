"""Rebuild hooks: the host's say before a rebuild, and its view of the outcome after.

``ContextMiddleware(before_rebuild=..., after_rebuild=...)`` takes two async
callables:

* ``before_rebuild(context)`` runs when a rebuild of the main agent is about to
  start, with a :class:`RebuildContext` (session, trigger, the usage that crossed
  the line, the focus text). It returns ``None`` (go ahead), a
  :class:`HostSection` (go ahead, and put this section of the host's own — its
  open pull request, the ticket being worked on — into the body, capped by
  ``checkpoint.push_caps.host_section``), or :class:`CancelRebuild` (do not
  rebuild now, with a reason). A cancellation is honoured for **automatic**
  rebuilds only (the trigger line): a manual ``/rebuild`` is what the user asked
  for, and a provider overflow cannot be answered by waiting, so those go ahead
  (with the section, if one came). The bounds stay: the loop guard still stops
  futile automatic rebuilds, and a request that overflows is rebuilt on the
  overflow path whatever the hook says.
* ``after_rebuild(context, report)`` runs after every rebuild attempt of the main
  agent with its :class:`~mimo_ctx.rebuild.RebuildReport` (``cancelled`` ones
  too).

Both run while the session's lock is held, each for at most
``checkpoint.hook_timeout`` seconds: a hook must not call the middleware for the
same session (that call would wait for the lock). A hook that raises, times out
or returns something else is logged and ignored — the rebuild goes on as if
there were no hook; the host's failure never stops the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast

import anyio

from mimo_ctx.sections import is_our_heading

if TYPE_CHECKING:
    from mimo_ctx.rebuild import RebuildReport, Trigger

__all__ = [
    "HOST_HEADING_CHARS",
    "AfterRebuild",
    "BeforeRebuild",
    "CancelRebuild",
    "HostSection",
    "RebuildContext",
    "run_after_rebuild",
    "run_before_rebuild",
]

_log = logging.getLogger("mimo_ctx")

HOST_HEADING_CHARS: Final = 80
"""The longest heading a :class:`HostSection` may have."""


@dataclass(frozen=True, slots=True)
class RebuildContext:
    """What a rebuild hook is told about the rebuild.

    Attributes:
        session_id: The session.
        trigger: ``usage`` (the trigger line), ``overflow`` or ``manual``.
        usage: The provider usage that crossed the line (``None`` for a manual
            rebuild without one).
        trigger_tokens: The trigger line.
        focus: The focus text of a manual rebuild, if any.
    """

    session_id: str
    trigger: Trigger
    usage: int | None
    trigger_tokens: int
    focus: str | None = None


@dataclass(frozen=True, slots=True)
class HostSection:
    """A section of the host's own for the rebuild body.

    Attributes:
        heading: Its level-1 heading, without ``#``: one line of at most
            :data:`HOST_HEADING_CHARS` characters, not one of the body's own.
        text: Its content (capped by ``push_caps.host_section``; headings in it are
            neutralised like every body section's).

    Raises:
        ValueError: The heading is empty, too long, several lines, starts with
            ``#`` or is one of the body's own headings.
    """

    heading: str
    text: str

    def __post_init__(self) -> None:
        heading = self.heading.strip()
        if not heading:
            raise ValueError("HostSection.heading: expected a heading, got an empty one")
        if len(heading) > HOST_HEADING_CHARS:
            raise ValueError(
                f"HostSection.heading: at most {HOST_HEADING_CHARS} characters, got {len(heading)}"
            )
        if heading != " ".join(heading.split()) or heading.startswith("#"):
            raise ValueError(
                f"HostSection.heading: one line of text without a leading '#', got {heading!r}"
            )
        if is_our_heading(heading):
            raise ValueError(f"HostSection.heading: {heading!r} is one of the body's own headings")


@dataclass(frozen=True, slots=True)
class CancelRebuild:
    """Do not run this automatic rebuild (see the module docs for the bounds).

    Attributes:
        reason: Why; reported as the rebuild's ``cancel_reason`` and in a status event.
    """

    reason: str


BeforeRebuild = Callable[[RebuildContext], Awaitable[HostSection | CancelRebuild | None]]
"""``async def before_rebuild(context) -> HostSection | CancelRebuild | None``."""

AfterRebuild = Callable[[RebuildContext, "RebuildReport"], Awaitable[None]]
"""``async def after_rebuild(context, report) -> None``."""


async def run_before_rebuild(
    hook: BeforeRebuild | None, context: RebuildContext, *, limit: float
) -> HostSection | CancelRebuild | None:
    """Run the host's ``before_rebuild``; its failure, a timeout or a wrong answer is ``None``."""
    if hook is None:
        return None
    answer: object = None
    try:
        with anyio.fail_after(limit):
            answer = cast(object, await hook(context))
    except TimeoutError:
        _log.warning(
            "mimo_ctx: before_rebuild hook of session %s took longer than %s s; ignored",
            context.session_id,
            limit,
        )
        return None
    except Exception:
        _log.warning(
            "mimo_ctx: before_rebuild hook of session %s failed; ignored",
            context.session_id,
            exc_info=True,
        )
        return None
    if answer is None or isinstance(answer, HostSection | CancelRebuild):
        return answer
    _log.warning(
        "mimo_ctx: before_rebuild hook of session %s returned %s, not a HostSection, "
        "CancelRebuild or None; ignored",
        context.session_id,
        type(answer).__name__,
    )
    return None


async def run_after_rebuild(
    hook: AfterRebuild | None, context: RebuildContext, report: RebuildReport, *, limit: float
) -> None:
    """Run the host's ``after_rebuild``; its failure or a timeout is logged, never raised."""
    if hook is None:
        return
    try:
        with anyio.fail_after(limit):
            await hook(context, report)
    except TimeoutError:
        _log.warning(
            "mimo_ctx: after_rebuild hook of session %s took longer than %s s; ignored",
            context.session_id,
            limit,
        )
    except Exception:
        _log.warning(
            "mimo_ctx: after_rebuild hook of session %s failed; ignored",
            context.session_id,
            exc_info=True,
        )
