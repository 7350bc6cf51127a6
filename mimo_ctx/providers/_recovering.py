"""One overflow retry around a provider call (private step of the client wrappers).

Prepare, build the payload, send; when the provider reports a context overflow,
rebuild once (through the middleware) and send again; a second overflow is a
:class:`~mimo_ctx.errors.ContextOverflowError` chained to the provider's error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from mimo_ctx.errors import ContextOverflowError
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.overflow import is_context_overflow

__all__ = ["RecoveringCall"]

_R = TypeVar("_R")
_P = TypeVar("_P")


class RecoveringCall(Generic[_P, _R]):
    """Prepare, build, send; on a context overflow rebuild once and send again.

    Args:
        middleware: The middleware.
        session_id: The session.
        agent: The agent taking the turn.
        build: Turns a request view into the payload (and validates it).
        send: Sends a payload and returns the provider's answer.
        check: Looks at each answer before it is returned; raises (a
            :class:`~mimo_ctx.errors.ProviderReportedOverflow`) for an answer that
            reports an overflow, which is then recovered like an overflow error.
    """

    def __init__(
        self,
        middleware: ContextMiddleware,
        session_id: str,
        *,
        agent: str,
        build: Callable[[RequestView], _P],
        send: Callable[[_P], Awaitable[_R]],
        check: Callable[[_R], None] | None = None,
    ) -> None:
        self.middleware = middleware
        self.session_id = session_id
        self.agent = agent
        self._build = build
        self._send = send
        self._check = check
        self.retried = False
        self.view: RequestView | None = None

    async def payload(self) -> _P:
        """The request of the session's view, built (and validated) from a fresh prepare.

        Errors here (store, validator) are ours, not the provider's: they propagate as
        they are and are never taken for an overflow.
        """
        self.view = await self.middleware.prepare(self.session_id, agent=self.agent)
        return self._build(self.view)

    def checked(self, answer: _R) -> _R:
        """``answer``, once ``check`` found no overflow in it (see the class)."""
        if self._check is not None:
            self._check(answer)
        return answer

    async def run(self) -> _R:
        """Send the request (retrying once after a rebuild on an overflow).

        The coroutine of :func:`~mimo_ctx.providers._wrapper.managed_call` runs these
        same steps one at a time, the SDK's coroutine with none of ours around it (see
        there why).
        """
        payload = await self.payload()
        try:
            return self.checked(await self._send(payload))
        except Exception as exc:
            return await self.recover(exc)

    async def recover(self, error: Exception) -> _R:
        """Handle an overflow the provider reported: rebuild and send once more.

        Raises:
            ContextOverflowError: This call already retried, or the usage was
                already recovered (chained to ``error``).
            Exception: ``error`` itself when it is not an overflow.
        """
        if not is_context_overflow(error):
            raise error
        if self.retried:
            raise ContextOverflowError(
                f"session {self.session_id}: the request still overflows the context "
                "window after a rebuild; not retrying again"
            ) from error
        if not await self.middleware.on_error(
            self.session_id, error, agent=self.agent, view=self.view
        ):
            raise error
        self.retried = True
        payload = await self.payload()
        try:
            return self.checked(await self._send(payload))
        except Exception as again:
            if is_context_overflow(again):
                raise ContextOverflowError(
                    f"session {self.session_id}: the request still overflows the context "
                    "window after a rebuild; not retrying again"
                ) from again
            raise
