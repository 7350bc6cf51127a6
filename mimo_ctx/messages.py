"""The message model: sessions hold messages, messages hold parts.

The shape follows the OpenCode data model the SPEC is written against (a tool
call and its result live in one ``tool`` part of an assistant message), extended
for data imported from provider formats, where a tool result is its own message:
such results are :class:`ToolResultPart` parts of a message with role ``tool``.

Unknown part types are **rejected** with a validation error naming the ``type``
(our choice: silently keeping data we cannot send correctly would break tool
pairing later). Integrations that must carry a framework's own part kinds through
unchanged wrap them in an explicit :class:`OpaquePart`.

Messages are treated as values: to change one, build a new one
(``message.model_copy(update=...)``) and hand it to the store. The per-message
token estimate is cached on the object (SPEC R2.2 hot path), and in-place
mutation of ``parts`` would leave that cache stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from mimo_ctx import ids
from mimo_ctx._marks import forget_row_version

__all__ = [
    "MAIN_AGENT",
    "CheckpointPart",
    "CompactionPart",
    "FilePart",
    "Message",
    "MessageError",
    "MessageFailure",
    "OpaquePart",
    "Part",
    "ReasoningPart",
    "Role",
    "SubtaskPart",
    "TextPart",
    "TokenUsage",
    "ToolPart",
    "ToolResultPart",
    "ToolState",
    "ToolStateCompleted",
    "ToolStateError",
    "ToolStatePending",
    "ToolStateRunning",
    "ToolTime",
    "message_key",
    "new_message_id",
    "new_part_id",
    "part_units",
    "set_insert_seq",
    "set_part_units",
    "stored_part_units",
    "user_input_text",
    "written_after",
]

MAIN_AGENT = "main"
"""Agent id of a session's top-level agent (only it is rebuilt, SPEC R1.4a)."""

Role = Literal["user", "assistant", "tool"]


def new_part_id() -> str:
    """Return a fresh ascending part id."""
    return ids.ascending("prt")


def new_message_id(*, newer_than: str | None = None) -> str:
    """Return a fresh ascending message id (after ``newer_than`` when given)."""
    return ids.ascending("msg", newer_than=newer_than)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Copy the model as pydantic's ``model_copy`` does (a shallow copy with ``update``
        applied, not validated).

        The shallow copy with an update is made here, directly: pydantic's goes
        through ``__copy__`` (about twice the time), and a rebuild copies four
        models for every tool result it clears.
        """
        if deep or not update:
            return super().model_copy(update=update, deep=deep)
        cls = type(self)
        copy = cls.__new__(cls)
        values = self.__dict__.copy()
        values.update(update)
        _set_slot(copy, "__dict__", values)
        _set_slot(copy, "__pydantic_fields_set__", self.__pydantic_fields_set__ | update.keys())
        # extra="forbid": no model here has extra fields.
        _set_slot(copy, "__pydantic_extra__", None)
        private = self.__pydantic_private__
        _set_slot(copy, "__pydantic_private__", None if private is None else dict(private))
        return copy


_set_slot: Final = object.__setattr__
"""Sets an instance attribute past pydantic's ``__setattr__`` (what its ``__copy__`` does)."""


class TokenUsage(_Model):
    """Token usage a provider reported for one assistant message.

    ``estimated`` marks a usage the middleware estimated because the provider
    reported none (some OpenAI-compatible servers): the request's estimated
    tokens as ``input``, the answer's as ``output``.
    """

    input: int = Field(default=0, ge=0)
    output: int = Field(default=0, ge=0)
    reasoning: int = Field(default=0, ge=0)
    cache_read: int = Field(default=0, ge=0)
    cache_write: int = Field(default=0, ge=0)
    total: int | None = Field(default=None, ge=0)
    estimated: bool = False

    @property
    def context_tokens(self) -> int:
        """Tokens this usage says the context held (SPEC R1.2).

        The provider's total when it gave one, else input + output + cache read +
        cache write (reasoning is part of output for every provider we support).
        """
        if self.total:
            return self.total
        return self.input + self.output + self.cache_read + self.cache_write


class TextPart(_Model):
    """Text. ``synthetic`` marks text the library (not a person) wrote; ``ignored``
    text is kept in storage but never sent to a model (SPEC A10)."""

    type: Literal["text"] = "text"
    id: str = Field(default_factory=new_part_id)
    text: str
    synthetic: bool = False
    ignored: bool = False


class ReasoningPart(_Model):
    """A reasoning (thinking) block; ``signature`` is kept for providers that need it."""

    type: Literal["reasoning"] = "reasoning"
    id: str = Field(default_factory=new_part_id)
    text: str
    signature: str | None = None
    redacted: bool = False
    # Provider data needed to send the block back unchanged, keyed by provider
    # (``openai``: the Responses reasoning item's id, summary, encrypted_content).
    # None by default so the token estimate of existing parts does not change.
    provider_data: dict[str, Any] | None = None


class ToolTime(_Model):
    """Times of a tool run in epoch ms; ``compacted`` is set by micro-compaction (R4.5).

    ``placeholder`` is the text a compacted result reads when sent, stored when the
    result is cleared with a configured text other than the default
    (:data:`~mimo_ctx.view.COMPACTED_PLACEHOLDER`, ``None`` here).
    """

    start: int | None = None
    end: int | None = None
    compacted: int | None = None
    placeholder: str | None = None


class ToolStatePending(_Model):
    """The model asked for the call; it has not started."""

    status: Literal["pending"] = "pending"
    input: dict[str, Any] = Field(default_factory=dict)


class ToolStateRunning(_Model):
    """The call is running (or was, when the process died: then it reads as interrupted)."""

    status: Literal["running"] = "running"
    input: dict[str, Any] = Field(default_factory=dict)
    title: str | None = None
    time: ToolTime = Field(default_factory=ToolTime)


class ToolStateCompleted(_Model):
    """The call finished; ``output`` stays in storage even after it is compacted."""

    status: Literal["completed"] = "completed"
    input: dict[str, Any] = Field(default_factory=dict)
    output: str
    title: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    attachments: list[FilePart] = Field(default_factory=list["FilePart"])
    time: ToolTime = Field(default_factory=ToolTime)


class ToolStateError(_Model):
    """The call failed with ``error``."""

    status: Literal["error"] = "error"
    input: dict[str, Any] = Field(default_factory=dict)
    error: str
    time: ToolTime = Field(default_factory=ToolTime)


ToolState = Annotated[
    ToolStatePending | ToolStateRunning | ToolStateCompleted | ToolStateError,
    Field(discriminator="status"),
]


class ToolPart(_Model):
    """A tool call and (when finished) its result, in one assistant message."""

    type: Literal["tool"] = "tool"
    id: str = Field(default_factory=new_part_id)
    call_id: str
    tool: str
    state: ToolState


class ToolResultPart(_Model):
    """A tool result stored apart from its call, in a message with role ``tool``.

    Provider transcripts (OpenAI ``tool`` messages, Anthropic ``tool_result``
    blocks) keep results out of the calling message; the watermark must then not
    separate the two (SPEC R2.6).
    """

    type: Literal["tool_result"] = "tool_result"
    id: str = Field(default_factory=new_part_id)
    call_id: str
    tool: str
    output: str
    is_error: bool = False
    time: ToolTime = Field(default_factory=ToolTime)
    # Images and files the result carried (mimo_ctx.convert.tool_result_content).
    # None rather than [] so the token estimate of a result without any is unchanged.
    attachments: list[FilePart] | None = None


class FilePart(_Model):
    """A file or image attachment, by URL (``data:`` URLs included)."""

    type: Literal["file"] = "file"
    id: str = Field(default_factory=new_part_id)
    mime: str
    url: str
    filename: str | None = None


class SubtaskPart(_Model):
    """A request to run a sub-agent (or a command) for a sub-task."""

    type: Literal["subtask"] = "subtask"
    id: str = Field(default_factory=new_part_id)
    agent: str
    description: str = ""
    prompt: str = ""
    command: str | None = None


class CheckpointPart(_Model):
    """Marks a rebuild boundary message (SPEC R4.4).

    ``covered_up_to`` is the watermark; ``digest_up_to`` is the newest id among the
    messages the recent-activity section digested, set only when that section was
    rendered (R7.3). ``digest_seq`` (ours, R7.3 amended) is the newest
    :attr:`Message.insert_seq` among them: a message written after the rebuild
    listed the tail has a higher one, so it is not taken as digested even when its
    id falls inside the range (it was built earlier, or on a lagging clock).
    ``kept_live`` (ours) holds the ids of the open tool round a mid-loop rebuild
    kept live: the round lists last (by time, then id), yet its id can fall inside
    the range and its write come before a digested message's (made on another
    worker, or its id drawn before an earlier-listed message's), so the range and
    the write order alone would take it as digested, and it would be neither sent
    nor listed.
    """

    type: Literal["checkpoint"] = "checkpoint"
    id: str = Field(default_factory=new_part_id)
    covered_up_to: str
    digest_up_to: str | None = None
    digest_seq: int | None = None
    kept_live: list[str] = Field(default_factory=list[str])
    directory: str = ""
    number: int = Field(default=0, ge=0)


class CompactionPart(_Model):
    """A plain compaction: ``summary`` replaces the history it covers (SPEC R1.4a).

    ``covered_up_to`` is the last message the summary covers (messages listed after
    it stay live); ``None`` for compactions imported from transcripts, which cover
    everything listed before them.
    """

    type: Literal["compaction"] = "compaction"
    id: str = Field(default_factory=new_part_id)
    summary: str
    auto: bool = True
    covered_up_to: str | None = None


class OpaquePart(_Model):
    """A part of a framework's own kind, carried through unchanged and never rendered.

    ``source`` names the framework (``pydantic-ai``, ``langchain``...), ``kind`` its
    part kind, ``data`` the framework's JSON form of the part.
    """

    type: Literal["opaque"] = "opaque"
    id: str = Field(default_factory=new_part_id)
    source: str
    kind: str
    data: dict[str, Any] = Field(default_factory=dict)


Part = Annotated[
    TextPart
    | ReasoningPart
    | ToolPart
    | ToolResultPart
    | FilePart
    | SubtaskPart
    | CheckpointPart
    | CompactionPart
    | OpaquePart,
    Field(discriminator="type"),
]


class MessageFailure(_Model):
    """Why an assistant message failed; ``aborted`` when the user cancelled it.

    A value stored with the message, not an exception (hence not ``...Error``).
    """

    name: str
    message: str = ""
    aborted: bool = False


MessageError = MessageFailure
"""Deprecated alias of :class:`MessageFailure` (its name read like an exception)."""


class Message(_Model):
    """One message of a session.

    Attributes:
        id: Ascending id; "newer" and "older" are always decided by ids (SPEC A1).
        session_id: The session the message belongs to.
        role: ``user``, ``assistant``, or ``tool`` (provider-format tool results).
        agent: ``main`` for the session's top-level agent, else the sub-agent's id.
        time_created: Creation time in epoch ms (a boundary is back-dated, R4.3).
        time_completed: When an assistant message finished, in epoch ms.
        finish: The provider's finish reason (``stop``, ``tool-calls``...); set means
            the message is complete.
        error: Set when the message failed.
        usage: Provider-reported token usage of an assistant message.
        summary: True for a compaction summary, whose usage never triggers (R1.2).
        provider_message_id: The provider's own message id; messages sharing one are
            a group the watermark must not split (R2.6).
        model: The model that produced an assistant message.
        parts: The content, in order.
        metadata: Free-form host data, stored and returned unchanged.
        off_branch: The host left this message behind: it regenerated the answer,
            or edited an earlier message and resent its conversation from there
            (:mod:`mimo_ctx.reconcile`). Kept in storage (``get_message``, the
            change feed, counts), never listed with the conversation and never sent.
    """

    id: str = Field(default_factory=new_message_id)
    session_id: str
    role: Role
    agent: str = MAIN_AGENT
    time_created: int = Field(ge=0)
    time_completed: int | None = None
    finish: str | None = None
    error: MessageFailure | None = None
    usage: TokenUsage | None = None
    summary: bool = False
    provider_message_id: str | None = None
    model: str | None = None
    parts: list[Part] = Field(default_factory=list["Part"])
    metadata: dict[str, Any] = Field(default_factory=dict)
    off_branch: bool = False

    _token_estimate: int | None = PrivateAttr(default=None)
    # What the estimate was summed from (see part_units); None when unknown.
    _part_units: tuple[int | None, ...] | None = PrivateAttr(default=None)
    _insert_seq: int | None = PrivateAttr(default=None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Message:
        """Copy the message; an ``update`` drops the cached token estimate (and its part units).

        The copy keeps :attr:`insert_seq` (a changed version of a stored message is
        still that message), unless the update gives it another id or session.
        """
        copy = super().model_copy(update=update, deep=deep)
        if update:
            # Into the private dict (the copy's own): pydantic's __setattr__ costs
            # about a microsecond each, and a rebuild copies every result it clears.
            private = _private_slots(copy)
            private["_token_estimate"] = None
            private["_part_units"] = None
            # No longer the stored row it was read as (mimo_ctx._marks).
            forget_row_version(private)
            if "id" in update or "session_id" in update:
                private["_insert_seq"] = None
        return copy

    @property
    def insert_seq(self) -> int | None:
        """The store's write-order number of this message: when it was first written.

        Every store numbers its writes from one store-wide sequence; this is the
        number the message's insertion got (an update keeps it). Within a session
        the numbers grow in commit order, whatever the clocks of the workers that
        wrote the messages, so they, not ids, say which of two stored messages was
        written later (SPEC R1.4, R7.3 as amended; see :func:`written_after`).
        ``None`` for a message no store has written or returned.
        """
        # The private slot read directly: ``self._insert_seq`` goes through
        # pydantic's ``__getattr__`` (a few µs), and every turn compares write
        # orders (R1.4) of the messages it takes in.
        private = self.__pydantic_private__
        return private.get("_insert_seq") if private is not None else None

    @property
    def is_boundary(self) -> bool:
        """True for a user message carrying a ``checkpoint`` or ``compaction`` part."""
        return self.role == "user" and any(
            p.type in ("checkpoint", "compaction") for p in self.parts
        )

    @property
    def checkpoint_part(self) -> CheckpointPart | None:
        """The message's checkpoint part, if any."""
        for p in self.parts:
            if isinstance(p, CheckpointPart):
                return p
        return None

    @property
    def covered_up_to(self) -> str | None:
        """The watermark a boundary covers (its checkpoint or compaction part), else ``None``."""
        for p in self.parts:
            if isinstance(p, CheckpointPart | CompactionPart):
                return p.covered_up_to
        return None


_NOT_USER_INPUT: Final = frozenset({"tool", "tool_result", "checkpoint", "compaction"})


def message_key(message: Message) -> tuple[int, str]:
    """The stores' listing order of a message: ``(time_created, id)`` (SPEC A1)."""
    return (message.time_created, message.id)


def user_input_text(message: Message) -> str | None:
    """The words the user typed in ``message``, or ``None`` when it holds none (SPEC R5.5).

    A main-agent user message without tool, tool-result, checkpoint or compaction
    parts; its text is its non-synthetic, non-ignored text parts joined by ``\\n``;
    a blank text is ``None``. This is what "Recent user input", the checkpoint's
    quotes and the activity list's user lines treat as the user's own words.
    """
    if message.role != "user" or message.agent != MAIN_AGENT:
        return None
    if any(p.type in _NOT_USER_INPUT for p in message.parts):
        return None
    text = "\n".join(
        p.text
        for p in message.parts
        if isinstance(p, TextPart) and not p.synthetic and not p.ignored
    )
    return text if text.strip() else None


def set_insert_seq(message: Message, seq: int) -> None:
    """Record where a store's write order put ``message`` (for store implementations).

    Stores call it on every message they return, and on the messages they were
    given once the write committed, so :attr:`Message.insert_seq` is set wherever a
    stored message is compared.
    """
    # Straight into the slot, as set_part_units does: pydantic's __setattr__ costs
    # more than the rest of a store's bookkeeping for the message.
    _private_slots(message)["_insert_seq"] = seq


def part_units(message: Message) -> tuple[int | None, ...] | None:
    """The length of each part's JSON behind the message's cached token estimate, if known.

    One entry per part: the UTF-16 length of the JSON the estimator counts
    (:func:`mimo_ctx.tokens.json_units`), ``None`` for a part that cannot be
    serialised. Known once the message was estimated here, or when a store read
    it from a row that kept them; a copy that changes one nested object of a part
    (micro-compaction marking a result) is estimated from them and the length
    change of that object alone. ``None`` when unknown.
    """
    private = message.__pydantic_private__
    return private.get("_part_units") if private is not None else None


def set_part_units(
    message: Message, units: tuple[int | None, ...] | str | None, *, estimate: int | None = None
) -> None:
    """Record the part lengths behind the cached estimate (estimators and stores).

    ``units`` is a tuple (see :func:`part_units`) or the text
    :func:`stored_part_units` made of one, as a store reads it back. With
    ``estimate``, that is cached too: the estimate summed from ``units``
    (:func:`mimo_ctx.tokens.units_tokens` of each).
    """
    if isinstance(units, str):
        units = _parse_units(units)
    # Straight into the slots: pydantic's __setattr__ costs about a microsecond,
    # and every estimate sets them.
    private = _private_slots(message)
    private["_part_units"] = units
    if estimate is not None:
        private["_token_estimate"] = estimate


def _private_slots(message: Message) -> dict[str, Any]:
    """The message's own dict of private attributes, to write without pydantic's setattr."""
    private = message.__pydantic_private__
    if private is None:  # pragma: no cover - pydantic always makes it here
        private = {}
        object.__setattr__(message, "__pydantic_private__", private)
    return private


def stored_part_units(message: Message) -> str | None:
    """The text a store keeps of :func:`part_units` (``None`` when unknown).

    Comma-separated lengths, ``x`` for a part that cannot be serialised, ``""``
    for a message without parts.
    """
    units = part_units(message)
    if units is None:
        return None
    return ",".join("x" if u is None else str(u) for u in units)


def _parse_units(text: str) -> tuple[int | None, ...] | None:
    """:func:`stored_part_units` read back; ``None`` (unknown) for text it never makes."""
    if not text:
        return ()
    try:
        if "x" not in text:
            return tuple(map(int, text.split(",")))
        return tuple(None if t == "x" else int(t) for t in text.split(","))
    except ValueError:
        return None


def written_after(a: Message, b: Message) -> bool:
    """True when the store wrote ``a`` after ``b``: the one "newer than" of stored messages.

    Decided by the store's write order (:attr:`Message.insert_seq`), never by ids
    or clocks: a worker whose clock lags makes ids that sort early, yet what it
    writes after a boundary is newer than that boundary (SPEC R1.4 as amended).
    Only when either message was never written does the id decide (ids ascend in
    creation order within one process, SPEC A1).
    """
    if a.insert_seq is not None and b.insert_seq is not None:
        return a.insert_seq > b.insert_seq
    return a.id > b.id
