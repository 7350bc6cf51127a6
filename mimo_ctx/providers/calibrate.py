"""Calibrating the token estimator against a provider's token-count endpoint (optional).

The default estimator counts four characters as a token (SPEC R2.2): it works
offline and costs nothing, but under-counts JSON and CJK text. Where a provider
offers an endpoint that counts a request's tokens (Anthropic
``messages.count_tokens``, OpenAI ``responses.input_tokens.count``), a host can
ask it once in a while, off the hot path, how the estimate compares::

    calibration = await calibrate_anthropic(raw_client, mw, session_id, model=MODEL)
    mw = ContextMiddleware(store, root, model=..., counter=calibration.counter())

The counter scales the estimate (it sizes the rebuild's sections against their
caps); the trigger line keeps reading the usage the provider reports. Nothing
here runs unless the host calls it, and it sends only a count request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mimo_ctx.messages import Message
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.providers._payload import marked_view
from mimo_ctx.providers._sync import sdk_client
from mimo_ctx.providers.anthropic import to_anthropic
from mimo_ctx.providers.openai import to_openai_responses
from mimo_ctx.tokens import estimate_text_tokens

__all__ = ["CalibratedEstimator", "Calibration", "calibrate_anthropic", "calibrate_openai"]


class CalibratedEstimator:
    """The default estimator times a measured ratio (a :class:`~mimo_ctx.tokens.TokenCounter`).

    Args:
        ratio: Provider tokens per estimated token (> 0).
    """

    def __init__(self, ratio: float) -> None:
        if not ratio > 0:
            raise ValueError(f"ratio must be positive, got {ratio!r}")
        self.ratio = ratio

    def count(self, text: str) -> int:
        """The estimate of ``text``, scaled."""
        return round(estimate_text_tokens(text) * self.ratio)


@dataclass(frozen=True, slots=True)
class Calibration:
    """One comparison of the estimate with the provider's count.

    Attributes:
        estimated: The request view's estimated tokens.
        counted: What the provider's endpoint counted for the same request.
    """

    estimated: int
    counted: int

    @property
    def ratio(self) -> float:
        """Provider tokens per estimated token."""
        return self.counted / self.estimated if self.estimated else 1.0

    def counter(self) -> CalibratedEstimator:
        """An estimator scaled by :attr:`ratio`, for ``ContextMiddleware(counter=...)``."""
        return CalibratedEstimator(self.ratio)


async def _next_request(
    middleware: ContextMiddleware, session_id: str, *, system: str
) -> tuple[RequestView, list[Message], dict[str, Any]]:
    """The session's next request: its view, the view's messages as the wrappers convert
    them, and its system prompt as the count call's keyword argument ``system``."""
    view = await middleware.prepare(session_id)
    extra: dict[str, Any] = {system: view.prefix.system} if view.prefix.system else {}
    return view, marked_view(view.messages, view.boundary_id), extra


async def calibrate_anthropic(
    client: Any, middleware: ContextMiddleware, session_id: str, *, model: str
) -> Calibration:
    """Count the session's next request with Anthropic's ``messages.count_tokens``.

    Args:
        client: An ``anthropic.AsyncAnthropic`` client (or a wrapped one).
        middleware: The middleware holding the session.
        session_id: The session.
        model: The model to count for.
    """
    view, messages, extra = await _next_request(middleware, session_id, system="system")
    _, turns = to_anthropic(messages)
    if view.prefix.tools:
        extra["tools"] = view.prefix.tools
    counted = await sdk_client(client).messages.count_tokens(model=model, messages=turns, **extra)
    return Calibration(view.tokens, int(counted.input_tokens))


async def calibrate_openai(
    client: Any, middleware: ContextMiddleware, session_id: str, *, model: str
) -> Calibration:
    """Count the session's next request with OpenAI's ``responses.input_tokens.count``.

    Args:
        client: An ``openai.AsyncOpenAI`` client (or a wrapped one).
        middleware: The middleware holding the session.
        session_id: The session.
        model: The model to count for.
    """
    view, messages, extra = await _next_request(middleware, session_id, system="instructions")
    items = to_openai_responses(messages)
    # Tools stored in the Responses shape (a name at the top) are counted; Chat
    # Completions tools are not a Responses parameter and are left out.
    tools = [t for t in view.prefix.tools if "name" in t]
    if tools:
        extra["tools"] = tools
    counted = await sdk_client(client).responses.input_tokens.count(
        model=model, input=items, **extra
    )
    return Calibration(view.tokens, int(counted.input_tokens))
