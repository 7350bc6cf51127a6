"""A scripted fake model, for tests, examples, benchmarks and ``mimo-ctx demo``.

:class:`ScriptedModel` answers a :class:`~mimo_ctx.middleware.RequestView` with
the next step of a script — a tool call with its (already executed) result, or
a final text — and reports provider-style usage: the request's estimated tokens
as input, the answer's as output. It records every request it received, so a
test can check exactly what was sent. It can raise a provider-shaped overflow
error when a request is larger than a limit, like a real provider.

Nothing here touches the network.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mimo_ctx._util import now_ms
from mimo_ctx.messages import (
    Message,
    SubtaskPart,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolStateError,
    ToolTime,
)
from mimo_ctx.middleware import RequestView
from mimo_ctx.tokens import estimate_message_tokens

__all__ = ["FakeOverflowError", "ScriptStep", "ScriptedModel", "filler_text"]

_WORDS = (
    *("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"),
    *("lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon"),
    *("phi", "chi", "psi", "omega"),
)


def filler_text(tokens: int, *, seed: int = 0) -> str:
    """Deterministic prose of about ``tokens`` estimated tokens (4 characters each)."""
    words: list[str] = []
    length = 0
    index = seed
    while length < tokens * 4:
        word = _WORDS[index % len(_WORDS)]
        words.append(word)
        length += len(word) + 1
        index += 7
    return " ".join(words)


class FakeOverflowError(Exception):
    """A provider-shaped context-overflow error (HTTP 400, Anthropic's wording)."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"prompt is too long: {tokens} tokens > {limit} maximum")
        self.status_code = 400
        self.body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": str(self)},
        }


@dataclass(frozen=True, slots=True)
class ScriptStep:
    """One answer of the script.

    Attributes:
        text: Assistant text (the final answer, or commentary before tool calls).
        tool: A tool to call; its result is ``output`` (or the call fails with
            ``error``).
        input: The tool call's arguments.
        output: The tool's result text.
        error: Makes the tool call fail with this message.
        subtask: Start a sub-agent with this description (a ``task``-style call).
    """

    text: str | None = None
    tool: str | None = None
    input: dict[str, Any] = field(default_factory=dict[str, Any])
    output: str = ""
    error: str | None = None
    subtask: str | None = None


@dataclass(slots=True)
class ScriptedModel:
    """Answers requests from a script and records them.

    Args:
        steps: The answers, in order; when they run out the model answers "Done.".
        overflow_above: Raise :class:`FakeOverflowError` for a request whose
            estimated tokens exceed this.
        model: The model name put on answers.
    """

    steps: Sequence[ScriptStep]
    overflow_above: int | None = None
    model: str = "scripted"
    requests: list[RequestView] = field(default_factory=list[RequestView])
    overflow_errors: int = 0
    _position: int = 0

    @property
    def done(self) -> bool:
        """All steps were answered."""
        return self._position >= len(self.steps)

    def _next_step(self) -> ScriptStep:
        if self.done:
            return ScriptStep(text="Done.")
        step = self.steps[self._position]
        self._position += 1
        return step

    async def complete(self, view: RequestView) -> Message:
        """Answer ``view`` with the next step (or raise an overflow error)."""
        self.requests.append(view)
        if self.overflow_above is not None and view.tokens > self.overflow_above:
            self.overflow_errors += 1
            raise FakeOverflowError(view.tokens, self.overflow_above)
        step = self._next_step()
        now = now_ms()
        parts: list[Any] = []
        if step.text:
            parts.append(TextPart(text=step.text))
        finish = "stop"
        if step.tool is not None:
            call_id = f"call_{self._position}"
            state: ToolStateCompleted | ToolStateError
            if step.error is not None:
                state = ToolStateError(
                    input=step.input, error=step.error, time=ToolTime(start=now, end=now)
                )
            else:
                state = ToolStateCompleted(
                    input=step.input, output=step.output, time=ToolTime(start=now, end=now)
                )
            parts.append(ToolPart(call_id=call_id, tool=step.tool, state=state))
            finish = "tool-calls"
        if step.subtask is not None:
            parts.append(SubtaskPart(agent="explore", description=step.subtask))
        message = Message(
            session_id=view.session_id,
            role="assistant",
            agent=view.agent,
            time_created=now,
            time_completed=now,
            finish=finish,
            model=self.model,
            parts=parts,
        )
        output = estimate_message_tokens(message)
        return message.model_copy(update={"usage": TokenUsage(input=view.tokens, output=output)})


def tool_round(tool: str, tokens: int, *, seed: int = 0, **arguments: Any) -> ScriptStep:
    """A step calling ``tool`` whose result is about ``tokens`` tokens long."""
    return ScriptStep(tool=tool, input=dict(arguments), output=filler_text(tokens, seed=seed))


def script(steps: Iterable[ScriptStep]) -> list[ScriptStep]:
    """Materialise a script (a convenience for generator expressions)."""
    return list(steps)
