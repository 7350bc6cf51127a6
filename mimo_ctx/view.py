"""The send rules: what of a stored history is actually sent to a model (SPEC A10, R8.1).

:func:`apply_send_rules` is the one place that decides how stored parts read on
the wire, so that every provider converter (OpenAI, Anthropic) and every
framework integration sends the same thing:

* text marked ``ignored`` is dropped; ``synthetic`` text is sent;
* a ``checkpoint`` part reads :data:`CHECKPOINT_SUMMARY_HEADER`; a ``compaction``
  part reads :data:`COMPACTION_SUMMARY_HEADER`, a blank line and its summary;
* a completed tool result marked compacted (``time.compacted``) reads
  :data:`COMPACTED_PLACEHOLDER` (or the text stored with it, ``time.placeholder``,
  when the configured placeholder differs) and loses its attachments (SPEC R4.5);
* a pending or running tool call becomes an error, :data:`INTERRUPTED_TOOL_ERROR`,
  so that every tool call sent has a result;
* an assistant message with an error is skipped, unless it was aborted by the
  user and has real content (non-blank text or a tool call);
* :class:`~mimo_ctx.messages.OpaquePart` (a framework's own part kind) is never
  sent; a sub-task request is sent as a short text (wording ours);
* a tool result stored apart from its call (:class:`ToolResultPart`, provider
  formats) is sent only when its call is sent earlier in the view and has no
  earlier result: a result whose call is hidden or skipped cannot be sent (the
  providers reject it);
* a message left without parts is dropped.

Our choice for the split storage of provider formats: when a pending or running
call is answered by a later :class:`ToolResultPart` in the view, that result is
the call's result and the call is left as it is (it is not interrupted).
Converters take the result of a call from such a part when there is one, else
from the call's own state (:func:`tool_results_by_call`).

The function is pure: it never mutates its input and builds new message
objects for the messages it changes. Messages it leaves unchanged are returned
as they are (messages are values; sharing them keeps their cached token
estimate, the hot-path cost of SPEC R2.2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from mimo_ctx.digest import is_digested
from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    Message,
    OpaquePart,
    Part,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
)

__all__ = [
    "CHECKPOINT_SUMMARY_HEADER",
    "COMPACTED_PLACEHOLDER",
    "COMPACTION_SUMMARY_HEADER",
    "INTERRUPTED_TOOL_ERROR",
    "IncrementalView",
    "apply_send_rules",
    "has_real_content",
    "subtask_text",
    "tool_results_by_call",
]

COMPACTED_PLACEHOLDER: Final = "[Old tool result content cleared]"
"""What a compacted tool result reads when sent (SPEC R4.5, A10)."""

INTERRUPTED_TOOL_ERROR: Final = "[Tool execution was interrupted]"
"""The error a pending or running tool call is sent with (SPEC A10)."""

CHECKPOINT_SUMMARY_HEADER: Final = "Summary of previous conversation from checkpoint files:"
"""The text a ``checkpoint`` part is sent as (SPEC R8.1, A10)."""

COMPACTION_SUMMARY_HEADER: Final = "Summary of previous conversation:"
"""The first line a ``compaction`` part is sent with, before its summary (SPEC A10)."""


def subtask_text(part: SubtaskPart) -> str:
    """The text a sub-task request is sent as (wording ours).

    Args:
        part: The sub-task part.

    Returns:
        One line naming the agent and what it was asked to do, then the prompt
        (when there is one) after a blank line.
    """
    what = part.description or (f"/{part.command}" if part.command else "")
    head = f"Subtask for agent {part.agent}" + (f": {what}" if what else "")
    return f"{head}\n\n{part.prompt}" if part.prompt else head


def has_real_content(message: Message) -> bool:
    """True when a message has non-blank, non-ignored text or a tool call (SPEC A10).

    This decides whether an aborted assistant message is still sent.
    """
    for part in message.parts:
        if isinstance(part, ToolPart):
            return True
        if isinstance(part, TextPart) and not part.ignored and part.text.strip():
            return True
    return False


def _is_sent(message: Message) -> bool:
    # A failed assistant message is skipped unless the user aborted it after it
    # produced something worth keeping (SPEC A10).
    if message.role != "assistant" or message.error is None:
        return True
    return message.error.aborted and has_real_content(message)


def _answered_later(messages: Sequence[Message], sent: Sequence[bool]) -> set[str]:
    """Call ids of sent tool calls that a later sent :class:`ToolResultPart` answers."""
    called: set[str] = set()
    answered: set[str] = set()
    for message, is_sent in zip(messages, sent, strict=True):
        if not is_sent:
            continue
        for part in message.parts:
            if isinstance(part, ToolPart) and message.role == "assistant":
                called.add(part.call_id)
            elif isinstance(part, ToolResultPart) and part.call_id in called:
                answered.add(part.call_id)
    return answered


def _send_tool_part(part: ToolPart, answered: set[str]) -> ToolPart:
    state = part.state
    if isinstance(state, ToolStatePending | ToolStateRunning):
        if part.call_id in answered:
            return part
        time = state.time if isinstance(state, ToolStateRunning) else None
        error = ToolStateError(input=state.input, error=INTERRUPTED_TOOL_ERROR)
        if time is not None:
            error = error.model_copy(update={"time": time})
        return part.model_copy(update={"state": error})
    if isinstance(state, ToolStateCompleted) and state.time.compacted is not None:
        placeholder = state.time.placeholder or COMPACTED_PLACEHOLDER
        if state.output != placeholder or state.attachments:
            cleared = state.model_copy(update={"output": placeholder, "attachments": []})
            return part.model_copy(update={"state": cleared})
    return part


def _send_parts(
    message: Message, answered: set[str], called: set[str], resolved: set[str]
) -> list[Part | None]:
    """Each part of a sent message as it is sent (``None``: left out), in order.

    ``called`` and ``resolved`` are the calls and results sent before this part
    (updated as the parts go by); ``answered`` the calls a later result answers.
    """
    parts: list[Part | None] = []
    for part in message.parts:
        new: Part | None
        if isinstance(part, TextPart):
            new = None if part.ignored else part
        elif isinstance(part, CheckpointPart):
            new = TextPart(id=part.id, text=CHECKPOINT_SUMMARY_HEADER, synthetic=True)
        elif isinstance(part, CompactionPart):
            text = COMPACTION_SUMMARY_HEADER
            if part.summary:
                text = f"{text}\n\n{part.summary}"
            new = TextPart(id=part.id, text=text, synthetic=True)
        elif isinstance(part, ToolPart):
            new = _send_tool_part(part, answered)
            if message.role == "assistant":
                called.add(part.call_id)
        elif isinstance(part, ToolResultPart):
            new = _send_tool_result(part, called, resolved)
        elif isinstance(part, SubtaskPart):
            new = TextPart(id=part.id, text=subtask_text(part), synthetic=True)
        elif isinstance(part, OpaquePart):
            new = None
        else:  # reasoning and file parts are sent as they are
            new = part
        parts.append(new)
    return parts


def _assemble(message: Message, sent: Sequence[Part | None]) -> Message | None:
    """The message as sent: itself when no part changed, ``None`` when none is left."""
    parts = [p for p in sent if p is not None]
    if not parts:
        return None
    if len(parts) == len(message.parts) and all(
        new is old for new, old in zip(parts, message.parts, strict=True)
    ):
        return message
    return message.model_copy(update={"parts": parts})


def apply_send_rules(messages: Sequence[Message]) -> list[Message]:
    """Return the messages as they are sent to a model (SPEC A10, R8.1).

    Args:
        messages: The history to send, oldest first (already cut at the newest
            boundary and collapsed, when the caller does that).

    Returns:
        A new list. Changed messages are new objects; the input is never mutated.
    """
    sent = [_is_sent(m) for m in messages]
    answered = _answered_later(messages, sent)
    called: set[str] = set()
    resolved: set[str] = set()
    out: list[Message] = []
    for message, is_sent in zip(messages, sent, strict=True):
        if not is_sent:
            continue
        built = _assemble(message, _send_parts(message, answered, called, resolved))
        if built is not None:
            out.append(built)
    return out


def _send_tool_result(
    part: ToolResultPart, called: set[str], resolved: set[str]
) -> ToolResultPart | None:
    # Only the first result of a call sent earlier in the view is sent: an orphan
    # (its call hidden or skipped) or a second result breaks the providers' rules.
    if part.call_id not in called or part.call_id in resolved:
        return None
    resolved.add(part.call_id)
    if part.time.compacted is not None and not part.is_error:
        placeholder = part.time.placeholder or COMPACTED_PLACEHOLDER
        if part.output != placeholder or part.attachments:
            return part.model_copy(update={"output": placeholder, "attachments": None})
    return part


def tool_results_by_call(view: Sequence[Message]) -> dict[str, ToolResultPart]:
    """Map call ids to the separately stored result sent for them.

    Args:
        view: Output of :func:`apply_send_rules` (where every kept
            :class:`ToolResultPart` answers a call sent earlier, once).

    Returns:
        ``call_id`` -> the :class:`ToolResultPart` that answers it. A call absent
        from the map takes its result from its own state.
    """
    found: dict[str, ToolResultPart] = {}
    for message in view:
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                found.setdefault(part.call_id, part)
    return found


# -- the view kept current ------------------------------------------------------------


@dataclass(slots=True)
class _Source:
    """What one input message contributed to an :class:`IncrementalView` (to undo it)."""

    message: Message
    sent: list[Part | None] | None = None  # its parts as sent; None: not sent
    position: int = -1  # its place in the output; -1: not in it
    tokens: int | None = None  # its output's estimate; None: not counted yet
    removed: bool = False  # dropped by the collapse (R7.3)
    called: list[str] = field(default_factory=list[str])
    resolved: list[str] = field(default_factory=list[str])
    answered: list[str] = field(default_factory=list[str])
    pending: list[str] = field(default_factory=list[str])
    # Pending calls sent as they are because a later message of the same
    # extension answers them (see IncrementalView._add_all), until that answer
    # is taken in; an assumption no answer took is undone when the extension ends.
    assumed: list[str] = field(default_factory=list[str])
    # Earlier outputs this message's results changed: (source index, previous
    # sent parts, previous output message, previous tokens); previous parts and
    # message ``None``: the earlier one was sent as it is on an assumption this
    # result took, and taking it back interrupts the call (built then, if ever).
    reemitted: list[tuple[int, list[Part | None] | None, Message | None, int | None]] = field(
        default_factory=list[tuple[int, list[Part | None] | None, Message | None, int | None]]
    )


class IncrementalView:
    """The collapsed, sent view of a growing history, kept current in O(changes).

    Equal at every step to ``apply_send_rules(collapse_checkpoint_tail([boundary,
    *messages]))`` (SPEC R7.3, A10) with its token sum, for the messages given so
    far: :meth:`extend` adds messages at the end and :meth:`truncate` takes the
    last ones back (an update or an insertion before the end is a truncation at
    that place and an extension with what follows). Each message costs its own
    parts, except that a result answering an earlier pending call re-sends that
    call's message (its call is no longer interrupted).

    The collapse's one non-local rule -- a kept tool result whose call was
    digested is dropped -- is resolved up front from the messages a build starts
    with; :meth:`extend` and :meth:`truncate` answer ``False`` when a digested
    message with tool calls would come or go, and the caller builds anew.

    Args:
        boundary: The newest boundary (sent first), or ``None``.
        messages: The live messages after it, in listing order (no boundaries).
        estimate: Token estimate of one sent message.
    """

    def __init__(
        self,
        boundary: Message | None,
        messages: Sequence[Message],
        estimate: Callable[[Message], int],
    ) -> None:
        self.boundary = boundary
        self.messages: list[Message] = []
        self.users: list[int] = []  # output positions of user messages
        self._tokens = 0  # the estimates of the outputs counted so far
        # Outputs not counted yet, by position: counted when `tokens` is read, so a
        # call sent as interrupted and sent again as it is (its result came in the
        # same extension) is counted once, in the form that is sent.
        self._uncounted: dict[int, _Source] = {}
        self._estimate = estimate
        self._sources: list[_Source] = []
        self._called: set[str] = set()
        self._resolved: set[str] = set()
        self._answered: set[str] = set()
        self._pending: dict[str, list[int]] = {}
        part = boundary.checkpoint_part if boundary is not None else None
        self._digest = part if part is not None and part.digest_up_to else None
        self._removed_calls: set[str] = set()
        for message in messages:
            if self._collapsed(message):
                self._removed_calls.update(_calls(message))
        self._add_all([boundary, *messages] if boundary is not None else messages)

    @property
    def tokens(self) -> int:
        """The estimated tokens of :attr:`messages`."""
        if self._uncounted:
            for position, source in self._uncounted.items():
                source.tokens = self._estimate(self.messages[position])
                self._tokens += source.tokens
            self._uncounted.clear()
        return self._tokens

    @property
    def count(self) -> int:
        """How many input messages (the boundary first, when there is one) are in."""
        return len(self._sources)

    def extend(self, messages: Sequence[Message]) -> bool:
        """Add messages at the end; ``False`` (nothing added) when a build is needed."""
        for message in messages:
            if self._collapsed(message) and not _calls(message) <= self._removed_calls:
                return False
        self._add_all(messages)
        return True

    def truncate(self, count: int) -> bool:
        """Keep the first ``count`` input messages; ``False`` when a build is needed."""
        if any(s.removed and _calls(s.message) for s in self._sources[count:]):
            return False
        while len(self._sources) > count:
            self._undo(self._sources.pop())
        return True

    # -- internals -------------------------------------------------------------
    def _collapsed(self, message: Message) -> bool:
        """Whether the collapse (R7.3) drops ``message`` (never the boundary: a user message)."""
        return self._digest is not None and is_digested(message, self._digest)

    def _add_all(self, messages: Sequence[Message]) -> None:
        """Take ``messages`` in, each pending call a later one answers sent as it is.

        A call and its split result taken in together (the provider wrappers'
        turn) would otherwise be sent as interrupted and sent again at once; the
        call is sent as it is from the start instead, and the result, when taken
        in, takes that over as the answer it gives (see :meth:`_reemit`). A call
        whose answer did not take (the result was not sent) is interrupted here.
        """
        ahead: list[set[str]] = [set()] * len(messages)
        later: set[str] = set()
        for index in range(len(messages) - 1, -1, -1):
            ahead[index] = later
            results = [p.call_id for p in messages[index].parts if isinstance(p, ToolResultPart)]
            if results:
                later = later | set(results)
        start = len(self._sources)
        for message, answers in zip(messages, ahead, strict=True):
            self._add(message, answers)
        for number in range(start, len(self._sources)):
            if self._sources[number].assumed:
                self._interrupt_assumed(number)

    def _interrupt_assumed(self, index: int) -> None:
        """Send input ``index``'s calls still assumed answered as interrupted."""
        source = self._sources[index]
        calls = set(source.assumed)
        source.assumed = []
        source.sent, built = self._with_calls_resent(source, calls)
        self._forget_tokens(source)
        self.messages[source.position] = built

    def _with_calls_resent(
        self, source: _Source, calls: set[str] | list[str]
    ) -> tuple[list[Part | None], Message]:
        """``source``'s sent parts and output with its parts of ``calls`` sent anew
        (as interrupted, unless answered now)."""
        assert source.sent is not None
        sent = list(source.sent)
        for number, part in enumerate(source.message.parts):
            if isinstance(part, ToolPart) and part.call_id in calls:
                sent[number] = _send_tool_part(part, self._answered)
        built = _assemble(source.message, sent)
        assert built is not None  # a message with a tool call always has a part left
        return sent, built

    def _add(self, message: Message, answers: set[str] | frozenset[str] = frozenset()) -> None:
        source = _Source(message)
        self._sources.append(source)
        if self._collapsed(message):
            source.removed = True
            return
        if message.role == "tool" and self._removed_calls:
            # A result whose call was digested would be an orphan (collapse rule).
            kept = [
                p
                for p in message.parts
                if not (isinstance(p, ToolResultPart) and p.call_id in self._removed_calls)
            ]
            if len(kept) != len(message.parts):
                if not kept:
                    return
                message = message.model_copy(update={"parts": kept})
                source.message = message
        if not _is_sent(message):
            return
        called, resolved, answered = self._called, self._resolved, self._answered
        new_calls: set[str] = set()
        new_results: set[str] = set()
        newly: list[str] = []
        mine: set[str] = set()
        for part in message.parts:
            if isinstance(part, ToolPart) and message.role == "assistant":
                if part.call_id not in called:
                    new_calls.add(part.call_id)
                mine.add(part.call_id)
            elif isinstance(part, ToolResultPart):
                if part.call_id not in resolved:
                    new_results.add(part.call_id)
                if (
                    (part.call_id in called or part.call_id in mine)
                    and part.call_id not in answered
                    and part.call_id not in newly
                ):
                    newly.append(part.call_id)
        answered.update(newly)
        source.answered = newly
        # Pending calls of this message a later message of the extension answers.
        assumed = [
            p.call_id
            for p in message.parts
            if isinstance(p, ToolPart)
            and p.call_id in answers
            and p.call_id not in answered
            and isinstance(p.state, ToolStatePending | ToolStateRunning)
            and message.role == "assistant"
        ]
        sent = _send_parts(
            message, answered.union(assumed) if assumed else answered, called, resolved
        )
        source.called = [c for c in new_calls if c in called]
        source.resolved = [c for c in new_results if c in resolved]
        for call in newly:
            for index in self._pending.get(call, ()):
                self._reemit(source, index, call)
        built = _assemble(message, sent)
        source.sent = sent
        if built is None:
            return
        source.position = len(self.messages)
        self.messages.append(built)
        self._uncounted[source.position] = source
        if message.role == "user":
            self.users.append(source.position)
        for part, out in zip(message.parts, sent, strict=True):
            if (
                isinstance(part, ToolPart)
                and (out is not part or part.call_id in assumed)
                and isinstance(part.state, ToolStatePending | ToolStateRunning)
            ):
                # Sent as interrupted (or as it is on an assumed answer): a later
                # result makes it a plain call again.
                self._pending.setdefault(part.call_id, []).append(len(self._sources) - 1)
                source.pending.append(part.call_id)
        source.assumed = list(dict.fromkeys(assumed))

    def _reemit(self, source: _Source, index: int, call: str) -> None:
        """Send earlier input ``index`` again with its pending ``call`` answered."""
        earlier = self._sources[index]
        assert earlier.sent is not None
        if call in earlier.assumed:
            # Sent as it is already: this result takes the assumption over, and
            # taking it back interrupts the call (see _undo).
            earlier.assumed.remove(call)
            source.reemitted.append((index, None, None, None))
            return
        sent = list(earlier.sent)
        for number, part in enumerate(earlier.message.parts):
            if isinstance(part, ToolPart) and part.call_id == call:
                sent[number] = _send_tool_part(part, self._answered)
        built = _assemble(earlier.message, sent)
        assert built is not None  # a message with a tool call always has a part left
        # Assumptions live only within the extension that made them, and a result
        # of that extension answers only calls assumed answered: an earlier input
        # sent as interrupted comes from an earlier extension.
        assert not earlier.assumed
        previous = self.messages[earlier.position]
        source.reemitted.append((index, earlier.sent, previous, earlier.tokens))
        earlier.sent = sent
        self._forget_tokens(earlier)
        self.messages[earlier.position] = built

    def _forget_tokens(self, source: _Source) -> None:
        """Take ``source``'s output out of the count: it is counted again when read."""
        if source.tokens is not None:
            self._tokens -= source.tokens
            source.tokens = None
        self._uncounted[source.position] = source

    def _undo(self, source: _Source) -> None:
        for call in source.pending:
            self._pending[call].pop()
            if not self._pending[call]:
                del self._pending[call]
        if source.position >= 0:
            self._forget_tokens(source)
            del self._uncounted[source.position]
            self.messages.pop()
            if self.users and self.users[-1] == source.position:
                self.users.pop()
        self._answered.difference_update(source.answered)
        for index, sent, previous, tokens in reversed(source.reemitted):
            earlier = self._sources[index]
            self._forget_tokens(earlier)
            if sent is None or previous is None:
                # Sent as it is on the answer this result gave: interrupt it again
                # (the call is no longer answered).
                earlier.sent, self.messages[earlier.position] = self._with_calls_resent(
                    earlier, source.answered
                )
                continue
            earlier.sent = sent
            self.messages[earlier.position] = previous
            if tokens is not None:  # its count from before, as it was
                del self._uncounted[earlier.position]
                earlier.tokens = tokens
                self._tokens += tokens
        self._called.difference_update(source.called)
        self._resolved.difference_update(source.resolved)


def _calls(message: Message) -> set[str]:
    return {p.call_id for p in message.parts if isinstance(p, ToolPart)}
