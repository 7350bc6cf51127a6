"""The provider payload of a request view, built in O(new messages) while the view grows.

Private step of the client wrappers. A wrapper sends the view of
:meth:`~mimo_ctx.middleware.ContextMiddleware.prepare` converted to the
provider's JSON and checked with :func:`~mimo_ctx.providers.validate.validate_request`.
Converting and checking 5,000 messages every call would make each call cost
O(history), so :class:`PayloadBuilder` keeps what it built last time in
*batches*: each call converts only the view messages after the longest prefix
that is the same (the same objects) as last time, as one batch, and checks only
that batch's entries, continuing from where the check of the kept batches
stopped (:class:`~mimo_ctx.providers.validate.RequestValidator`).

Why a kept prefix stays right: a view message's payload depends on the message
and on the results later messages hold for its tool calls, and whenever a later
result changes what is sent for a call, the view gives a new object for the
calling message (SPEC A10: an answered call is sent as it is, an unanswered one
as an interrupted copy), so the prefix ends before it. The middleware's own view
reuses its message objects while it only grows, which is what makes the prefix
long. A batch whose first entry has the role of the entry before it (Anthropic
merges such turns) is converted together with the batch before it, so a merged
turn never spans two batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from mimo_ctx._util import follow_copy
from mimo_ctx.messages import CheckpointPart, CompactionPart, Message, Part, TextPart
from mimo_ctx.providers.validate import RequestFormat, RequestValidator, ValidatorMark
from mimo_ctx.view import CHECKPOINT_SUMMARY_HEADER, COMPACTION_SUMMARY_HEADER

__all__ = ["Convert", "PayloadBuilder", "Reuse", "SentList", "mark_boundary", "marked_view"]

Convert = Callable[[Sequence[Message], Message | None], list[Any]]
"""Converts a run of view messages; the second argument is the view message before the
run (None when the run starts the payload)."""

Reuse = Callable[[int, Any], Any]
"""Given the position of a freshly converted entry in the entries and the entry, the
object to keep in its place: an equal one the caller already holds, or the entry."""

_NO_MARK: Final = ValidatorMark(0, 0, (), None, -1, None)
"""The mark of a builder that checks nothing."""

_KEEP_MARKS: Final = 16
"""Batches whose validator state is kept (a rebuild reaching further back starts over)."""


def mark_boundary(message: Message) -> Message:
    """The view's boundary with its ``checkpoint`` (or ``compaction``) part back.

    The view has the send rules applied, so its boundary's marker part reads as a
    plain text; the converters send a boundary as one text only when they can tell
    it is one (SPEC R8.1). The send rules turn the part back into the same text.
    """
    if message.is_boundary or not message.parts:
        return message
    first = message.parts[0]
    marker: Part | None = None
    if isinstance(first, TextPart) and first.text == CHECKPOINT_SUMMARY_HEADER:
        marker = CheckpointPart(id=first.id, covered_up_to="")
    elif isinstance(first, TextPart) and first.text.startswith(COMPACTION_SUMMARY_HEADER):
        summary = first.text[len(COMPACTION_SUMMARY_HEADER) :].removeprefix("\n\n")
        marker = CompactionPart(id=first.id, summary=summary)
    if marker is None:
        return message
    return message.model_copy(update={"parts": [marker, *message.parts[1:]]})


def marked_view(messages: Sequence[Message], boundary_id: str | None) -> list[Message]:
    """The view's messages with the boundary's marker part back (:func:`mark_boundary`)."""
    return [mark_boundary(m) if m.id == boundary_id else m for m in messages]


@dataclass(slots=True)
class _Batch:
    start: int  # first view message of the batch
    end: int  # one past its last view message
    entries_end: int  # one past its last payload entry
    mark: ValidatorMark | None  # the validator after the batch (None: not kept)


class PayloadBuilder:
    """Builds and checks the payload of successive views of one session.

    Also what the framework integrations build their outgoing messages with (no
    format to check, entries are the framework's objects, no boundary marking).

    Args:
        format: The request format (what :class:`RequestValidator` checks), or None
            for entries that are not a provider payload.
        convert: Converts a run of view messages to entries.
        merges: True when two adjacent entries are merged by the converter
            (Anthropic turns of one role, pydantic-ai requests); None: never.
        mark: Put the boundary's marker part back before converting (:func:`mark_boundary`).
    """

    def __init__(
        self,
        format: RequestFormat | None,
        convert: Convert,
        *,
        merges: Callable[[Any, Any], bool] | None = None,
        mark: bool = True,
    ):
        self._convert = convert
        self._merges_fn = merges
        self._mark = mark
        self._messages: list[Message] = []  # the builder's own copy of the last view
        self._size = 0  # how many of them the last build covered (a failed one may add more)
        self._current = False  # the copy was extended to the view being built
        self._boundary: str | None = None
        self._key: object = None
        self._entries: list[Any] = []
        self._batches: list[_Batch] = []
        self._validator = RequestValidator(format) if format is not None else None
        self._start = self._validator.mark() if self._validator is not None else _NO_MARK
        self.converted = 0
        """View messages converted by the last :meth:`build` (for tests and benchmarks)."""
        self.kept = 0
        """Leading entries the last :meth:`build` left as the build before it made them."""
        self.builds = 0
        """Successful :meth:`build` calls so far (with :attr:`kept`, what a caller that
        mirrors the entries needs to know to follow them in O(new))."""

    def build(
        self,
        messages: Sequence[Message],
        boundary_id: str | None,
        *,
        key: object = None,
        convert: Convert | None = None,
        reuse: Reuse | None = None,
    ) -> list[Any]:
        """The entries of a view (its messages and boundary id); the builder's own list,
        valid until the next call (copy it, as the wrappers do, to keep it).

        ``key``: anything else the entries depend on; when it differs from the last
        call's, everything is converted again. ``convert``: this call's converter
        (a closure over what the call knows), instead of the builder's own.
        ``reuse``: applied to each entry this call converts (only those: O(new)),
        before it is checked and kept; the wrappers keep the host's own item when it
        equals the entry (see :mod:`mimo_ctx.providers._wrapper`).

        Raises:
            InvalidRequestError: The payload breaks the provider's rules.
        """
        self._current = False
        same = (
            0 if boundary_id != self._boundary or key != self._key else self._same_prefix(messages)
        )
        batches = self._batches
        while batches and batches[-1].end > same:
            batches.pop()
        while batches and batches[-1].mark is None:
            batches.pop()  # its validator state is gone: convert it again
        start = batches[-1].end if batches else 0
        while True:
            kept_entries = batches[-1].entries_end if batches else 0
            run = [
                mark_boundary(m) if self._mark and m.id == boundary_id else m
                for m in messages[start:]
            ]
            converter = convert if convert is not None else self._convert
            fresh = converter(run, messages[start - 1] if start else None) if run else []
            if not self._merges(kept_entries, fresh) or not batches:
                break
            start = batches.pop().start
        if reuse is not None:
            fresh = [reuse(kept_entries + i, entry) for i, entry in enumerate(fresh)]
        del self._entries[kept_entries:]
        mark = batches[-1].mark if batches else self._start
        assert mark is not None
        validator = self._validator
        if validator is not None:
            validator.reset(mark)
            try:
                validator.feed(fresh)
                validator.finish()
            except BaseException:
                self._forget()
                raise
        self._entries.extend(fresh)
        if run:
            after = validator.mark() if validator is not None else _NO_MARK
            batches.append(_Batch(start, len(messages), len(self._entries), after))
            if len(batches) > _KEEP_MARKS:
                batches[-_KEEP_MARKS - 1].mark = None
        if not self._current:
            self._messages = list(messages)
        self._size = len(messages)
        self._boundary = boundary_id
        self._key = key
        self.converted = len(run)
        self.kept = kept_entries
        self.builds += 1
        return self._entries

    def _merges(self, kept: int, fresh: list[Any]) -> bool:
        merges = self._merges_fn
        return (
            merges is not None
            and kept > 0
            and bool(fresh)
            and merges(self._entries[kept - 1], fresh[0])
        )

    def _same_prefix(self, messages: Sequence[Message]) -> int:
        """How many leading messages of ``messages`` are the ones (or equal to the ones)
        of the last build: O(new messages) for a view that only grew
        (:func:`~mimo_ctx._util.follow_copy`)."""
        same, self._current = follow_copy(self._messages, self._size, messages)
        return same

    def _forget(self) -> None:
        self._messages, self._entries, self._batches = [], [], []
        self._size = 0
        self._boundary = None
        if self._validator is not None:
            self._validator.reset(self._start)


class SentList:
    """The list a wrapped client hands its SDK: one list per session and format, kept
    and brought up to date in O(new messages) from the session's :class:`PayloadBuilder`.

    A new list per call would copy the whole history every call and, while the call
    runs, be one more whole-history list for every collection of the cycle collector
    to walk (on the SDK's time). An SDK reads the list, converting and serialising
    it, before its call first waits, and keeps none of it; so each call may change
    the list the last one sent. Whoever keeps a payload beyond its call copies it
    (the forked checkpoint writer's capture of the session's last request).
    """

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._head: list[Any] = []
        self._builds = -1  # the builder's build the list follows
        self._changed: int | None = None  # from here on a caller changed the list

    def update(self, head: Sequence[Any], entries: list[Any], builder: PayloadBuilder) -> list[Any]:
        """The list: ``head`` (the host's system items), then ``entries``, which
        ``builder`` has just built.

        Only the entries after those the builder kept (and after anything changed in
        place since) are replaced; a changed head, or a build of the builder this list
        did not follow, replaces everything.
        """
        items = self._items
        start = len(head)
        keep = start + builder.kept
        if self._changed is not None:
            keep = min(keep, self._changed)
        if builder.builds != self._builds + 1 or keep < start or head != self._head:
            del items[:]
            items.extend(head)
            keep = start
        del items[keep:]
        items.extend(entries[keep - start :])
        self._head = list(head)
        self._builds = builder.builds
        self._changed = None
        return items

    def last_replaced(self) -> None:
        """Say that the caller replaces the list's last entry in place (a marked copy)."""
        self._changed = len(self._items) - 1
