"""Which stored version a message object is, and what micro-compaction changed in a copy.

A store that keeps a change-feed number per message row (the SQLite store) stamps
every message it returns or has just written with that number: the *row version*
the object was read as (or written as). Micro-compaction (R4.5) copies a message
only to set ``time.compacted`` (and ``time.placeholder``) of some tool results; it
records on the copy the source's row version and the indexes of the parts it
marked. The store can then write the copy as that edit of the row (the few JSON
values set in place) instead of serialising the whole message again, and only
while the row is still that version: a row changed since has a newer number, and
is written in full.

Both live in the message's private attributes (never serialised). Any copy that
changes a message drops them (:meth:`mimo_ctx.messages.Message.model_copy`); a
copy without changes keeps them, since its JSON is the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from mimo_ctx.messages import Message

__all__ = ["forget_row_version", "marked_from", "row_version", "set_marked_from", "set_row_version"]

_ROW_VERSION: Final = "_row_version"
_MARKED_FROM: Final = "_marked_from"


def _private(message: Message) -> dict[str, Any]:
    private = message.__pydantic_private__
    if private is None:  # pragma: no cover - pydantic always makes it for Message
        private = {}
        object.__setattr__(message, "__pydantic_private__", private)
    return private


def row_version(message: Message) -> int | None:
    """The change-feed number of the stored row this object is (``None``: unknown)."""
    private = message.__pydantic_private__
    return private.get(_ROW_VERSION) if private is not None else None


def set_row_version(message: Message, version: int) -> None:
    """Record that ``message`` is the stored row at change-feed number ``version`` (stores)."""
    _private(message)[_ROW_VERSION] = version


def marked_from(message: Message) -> tuple[int, tuple[int, ...]] | None:
    """For a micro-compacted copy: its source's row version and the parts marked in it.

    ``None`` for any other message (a store then writes it in full).
    """
    private = message.__pydantic_private__
    return private.get(_MARKED_FROM) if private is not None else None


def set_marked_from(copy: Message, source: Message, indexes: Iterable[int]) -> None:
    """Record that ``copy`` is ``source`` with the results at ``indexes`` marked compacted.

    Nothing is recorded when the source's row version is unknown.
    """
    version = row_version(source)
    if version is not None:
        _private(copy)[_MARKED_FROM] = (version, tuple(sorted(indexes)))


def forget_row_version(private: dict[str, Any]) -> None:
    """Drop both records from a changed copy's private attributes (its JSON differs)."""
    private.pop(_ROW_VERSION, None)
    private.pop(_MARKED_FROM, None)
