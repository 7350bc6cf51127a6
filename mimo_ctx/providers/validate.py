"""Checking an outgoing request against the provider's pairing rules, before it is sent.

:func:`validate_request` catches, in one O(n) pass and without any network call,
the mistakes that make a provider reject a request with a 400 (or, worse, make a
model see a call without its result): tool calls without results, results
without calls, duplicate call ids and, for Anthropic, broken turn alternation.
It raises :class:`~mimo_ctx.errors.InvalidRequestError` naming the offending
message index, role and call id.

Payload shapes accepted (our choice: the list alone, or the request body the list
sits in, so a wrapper can pass whatever it has):

* ``openai-chat``: the ``messages`` list, or a mapping with ``messages``;
* ``openai-responses``: the ``input`` list (or string), or a mapping with
  ``input``;
* ``anthropic``: the ``messages`` list, or a mapping with ``messages`` (and
  ``system``, which is not checked).

Rules checked:

* ``openai-chat``: every ``tool_calls`` id of an assistant message is answered by
  a ``tool`` message with that ``tool_call_id`` before the next non-``tool``
  message; no ``tool`` message without an open matching call (so no second
  answer); no call id used twice in the request;
* ``openai-responses``: every ``function_call`` has exactly one later
  ``function_call_output`` with its ``call_id``, every output has an earlier
  call; call ids are unique;
* ``anthropic``: roles are ``user`` and ``assistant`` (``system`` entries are
  skipped), the first is ``user`` and they alternate; content is not empty
  (except a final assistant turn) and text blocks are not blank; every
  ``tool_use`` of an assistant turn is answered by a ``tool_result`` block of the
  immediately following user turn, where ``tool_result`` blocks come before any
  other block; no ``tool_result`` without a matching ``tool_use`` in the turn
  before; ``tool_use`` ids are unique.

Not checked (the provider checks them and they do not break pairing): tool
schemas, model-specific limits, the position of thinking blocks, the contents
of an empty request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mimo_ctx.convert import opt_object
from mimo_ctx.errors import InvalidRequestError

__all__ = ["RequestFormat", "RequestValidator", "ValidatorMark", "validate_request"]

RequestFormat = Literal["openai-chat", "openai-responses", "anthropic"]


def _fail(fmt: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"invalid {fmt} request: {message}")


def _entries(payload: object, key: str, fmt: str) -> list[Any] | None:
    """The list to check: ``payload`` itself or ``payload[key]``; None for a string input."""
    body = opt_object(payload)
    if body is not None:
        if key not in body:
            raise _fail(fmt, f"the payload mapping has no {key!r} list")
        payload = body[key]
    if isinstance(payload, str):
        if fmt == "openai-responses":
            return None
        raise _fail(fmt, f"{key} must be a list, got a string")
    if isinstance(payload, bytes) or not isinstance(payload, Sequence):
        raise _fail(fmt, f"{key} must be a list, got {type(payload).__name__}")
    return list(payload)  # pyright: ignore[reportUnknownArgumentType]


def _entry(fmt: str, value: object, where: str) -> Mapping[str, Any]:
    found = opt_object(value)
    if found is None:
        raise _fail(fmt, f"{where} is not an object (got {type(value).__name__})")
    return found


def _blocks(fmt: str, content: object, where: str) -> list[Mapping[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, bytes) or not isinstance(content, Sequence):
        raise _fail(fmt, f"{where} content must be a string or a list of blocks")
    items: Sequence[Any] = content  # pyright: ignore[reportUnknownVariableType]
    return [_entry(fmt, b, f"{where} block {j}") for j, b in enumerate(items)]


@dataclass(frozen=True, slots=True)
class ValidatorMark:
    """Where a :class:`RequestValidator` stood (:meth:`RequestValidator.mark`)."""

    index: int
    seen: int
    open_calls: tuple[tuple[str, int], ...]
    previous: str | None
    previous_index: int
    empty_at: int | None


_Errors = Callable[[object], tuple[str, str]]
"""The two error messages of a call-id check, given the call id (made only on a failure)."""


class RequestValidator:
    """The checks of :func:`validate_request`, fed entry by entry.

    A payload built piece by piece (the wrappers extend the last payload while
    the view only grows) is checked piece by piece: :meth:`feed` the new entries,
    :meth:`finish` on what was fed; :meth:`mark` and :meth:`reset` step back to an
    earlier point when a piece is rebuilt. Feeding a whole payload and finishing
    is :func:`validate_request`.

    Args:
        format: ``"openai-chat"``, ``"openai-responses"`` or ``"anthropic"``.
    """

    def __init__(self, format: RequestFormat) -> None:
        if format not in ("openai-chat", "openai-responses", "anthropic"):
            raise InvalidRequestError(
                f"unknown request format {format!r} (expected openai-chat, openai-responses "
                "or anthropic)"
            )
        self.format: RequestFormat = format
        self._index = 0
        self._open: dict[str, int] = {}  # call id -> index of the entry that made it
        self._seen: dict[str, None] = {}  # call ids, in the order they were made
        self._previous: str | None = None
        self._previous_index = -1
        self._empty_at: int | None = None  # an empty assistant turn: only last is fine

    def mark(self) -> ValidatorMark:
        """Where the validator stands now."""
        return ValidatorMark(
            self._index,
            len(self._seen),
            tuple(self._open.items()),
            self._previous,
            self._previous_index,
            self._empty_at,
        )

    def reset(self, mark: ValidatorMark) -> None:
        """Go back to ``mark`` (entries fed after it are forgotten)."""
        seen = self._seen
        while len(seen) > mark.seen:
            # The newest first (a dict pops in reverse insertion order): O(entries
            # fed since the mark), not a copy of every call id of the payload.
            seen.popitem()
        self._index = mark.index
        self._open = dict(mark.open_calls)
        self._previous = mark.previous
        self._previous_index = mark.previous_index
        self._empty_at = mark.empty_at

    def feed(self, entries: Sequence[Any]) -> None:
        """Check the next entries.

        Raises:
            InvalidRequestError: A rule is broken (the message names the entry).
        """
        step = {
            "openai-chat": self._chat,
            "openai-responses": self._responses,
            "anthropic": self._anthropic,
        }[self.format]
        for raw in entries:
            step(raw, self._index)
            self._index += 1

    def finish(self) -> None:
        """Check that nothing fed is left open (every call answered).

        Raises:
            InvalidRequestError: A call has no result.
        """
        if not self._open:
            return
        call_id, at = next(iter(self._open.items()))
        if self.format == "openai-chat":
            raise _fail(
                self.format,
                f"tool call {call_id!r} of message {at} (assistant) has no tool message",
            )
        if self.format == "openai-responses":
            raise _fail(
                self.format,
                f"item {at} (function_call) call_id {call_id!r} has no later function_call_output",
            )
        raise _fail(
            self.format,
            f"tool_use {call_id!r} of message {at} (assistant) has no tool_result "
            "(no user message follows)",
        )

    def _call(self, call_id: object, i: int, errors: _Errors) -> None:
        """Entry ``i`` makes call ``call_id``: it must have an id, used by no call before.

        ``errors`` gives the two messages (no id, a reused id), made only on a failure.
        """
        if not isinstance(call_id, str) or not call_id:
            raise _fail(self.format, errors(call_id)[0])
        if call_id in self._seen:
            raise _fail(self.format, errors(call_id)[1])
        self._seen[call_id] = None
        self._open[call_id] = i

    def _answer(self, call_id: Any, errors: _Errors) -> None:
        """An entry answers call ``call_id``: an open one (``errors``: answered before, never
        made)."""
        if call_id in self._open:
            del self._open[call_id]
        elif call_id in self._seen:
            raise _fail(self.format, errors(call_id)[0])
        else:
            raise _fail(self.format, errors(call_id)[1])

    def _chat(self, raw: object, i: int) -> None:
        fmt = self.format
        message = _entry(fmt, raw, f"message {i}")
        role = message.get("role")
        if not isinstance(role, str):
            raise _fail(fmt, f"message {i} has no role")
        if role == "tool":
            self._answer(
                message.get("tool_call_id"),
                lambda call: (
                    f"message {i} (tool) answers call {call!r} a second time",
                    f"message {i} (tool) answers call {call!r}, which no earlier "
                    "assistant message made",
                ),
            )
            return
        if self._open:
            call_id, at = next(iter(self._open.items()))
            raise _fail(
                fmt,
                f"tool call {call_id!r} of message {at} (assistant) has no tool message "
                f"before message {i} ({role})",
            )
        if role != "assistant":
            return
        calls: object = message.get("tool_calls")
        if calls is None:
            return
        if isinstance(calls, str | bytes) or not isinstance(calls, Sequence):
            raise _fail(fmt, f"message {i} (assistant) tool_calls must be a list")
        call_list: Sequence[Any] = calls  # pyright: ignore[reportUnknownVariableType]
        for j, raw_call in enumerate(call_list):
            call = _entry(fmt, raw_call, f"message {i} (assistant) tool call {j}")
            self._call(
                call.get("id"),
                i,
                lambda call_id, j=j: (
                    f"message {i} (assistant) tool call {j} has no id",
                    f"message {i} (assistant) reuses tool call id {call_id!r}",
                ),
            )

    def _responses(self, raw: object, i: int) -> None:
        fmt = self.format
        item = _entry(fmt, raw, f"item {i}")
        kind = item.get("type")
        if kind == "function_call":
            self._call(
                item.get("call_id"),
                i,
                lambda call_id: (
                    f"item {i} (function_call) has no call_id",
                    f"item {i} (function_call) reuses call_id {call_id!r}",
                ),
            )
        elif kind == "function_call_output":
            self._answer(
                item.get("call_id"),
                lambda call_id: (
                    f"item {i} (function_call_output) answers call_id {call_id!r} twice",
                    f"item {i} (function_call_output) answers call_id {call_id!r}, which no "
                    "earlier function_call made",
                ),
            )

    def _anthropic(self, raw: object, i: int) -> None:
        fmt = self.format
        message = _entry(fmt, raw, f"message {i}")
        role = message.get("role")
        if role == "system":
            return
        if self._empty_at is not None:
            raise _fail(fmt, f"message {self._empty_at} (assistant) has empty content")
        if role not in ("user", "assistant"):
            raise _fail(fmt, f"message {i} has role {role!r} (expected user or assistant)")
        if self._previous is None and role != "user":
            raise _fail(fmt, f"the first message (message {i}) is {role}, not user")
        if role == self._previous:
            raise _fail(
                fmt, f"message {i} ({role}) follows message {self._previous_index} of the same role"
            )
        blocks = _blocks(fmt, message.get("content"), f"message {i} ({role})")
        if not blocks:
            if role != "assistant":
                raise _fail(fmt, f"message {i} ({role}) has empty content")
            self._empty_at = i  # fine only as the final turn
        if role == "user":
            _check_user_turn(fmt, i, blocks, self._open, self._previous_index)
        else:
            for j, block in enumerate(blocks):
                kind = block.get("type")
                if kind == "tool_result":
                    raise _fail(fmt, f"message {i} (assistant) block {j} is a tool_result")
                if kind == "tool_use":
                    self._call(
                        block.get("id"),
                        i,
                        lambda call_id, j=j: (
                            f"message {i} (assistant) block {j} tool_use has no id",
                            f"message {i} (assistant) reuses tool_use id {call_id!r}",
                        ),
                    )
                _check_text(fmt, i, role, j, block)
        self._previous, self._previous_index = role, i


def _check_text(fmt: str, i: int, role: str, j: int, block: Mapping[str, Any]) -> None:
    if block.get("type") == "text":
        text = block.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _fail(fmt, f"message {i} ({role}) block {j} is an empty or blank text block")


def _check_user_turn(
    fmt: str,
    i: int,
    blocks: list[Mapping[str, Any]],
    open_calls: dict[str, int],
    previous_index: int,
) -> None:
    results_done = False
    for j, block in enumerate(blocks):
        if block.get("type") != "tool_result":
            results_done = True
            _check_text(fmt, i, "user", j, block)
            continue
        call_id = block.get("tool_use_id")
        if results_done:
            raise _fail(
                fmt,
                f"message {i} (user) block {j}: tool_result {call_id!r} comes after a "
                "non-tool_result block (tool_result blocks must come first)",
            )
        if call_id not in open_calls:
            raise _fail(
                fmt,
                f"message {i} (user) block {j}: tool_result {call_id!r} answers no tool_use "
                f"of the message before (message {previous_index})",
            )
        del open_calls[call_id]
    if open_calls:
        call_id, at = next(iter(open_calls.items()))
        raise _fail(
            fmt,
            f"tool_use {call_id!r} of message {at} (assistant) has no tool_result in the "
            f"next message (message {i}, user)",
        )


def validate_request(payload: object, *, format: RequestFormat) -> None:
    """Check an outgoing request against the provider's rules (see the module docs).

    Args:
        payload: The message list (or the request mapping holding it).
        format: ``"openai-chat"``, ``"openai-responses"`` or ``"anthropic"``.

    Raises:
        InvalidRequestError: A rule is broken; the message names the message
            index, its role and the call id.
    """
    validator = RequestValidator(format)
    key = "input" if format == "openai-responses" else "messages"
    entries = _entries(payload, key, format)
    if entries is None:  # a Responses string input: one user message
        return
    validator.feed(entries)
    validator.finish()
