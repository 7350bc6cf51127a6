"""What the three stores share beyond the contract's checks (private).

:mod:`mimo_ctx.store.base` holds the public checks every store makes; this module
holds the small helpers the in-memory, SQLite and PostgreSQL stores would
otherwise each spell out.
"""

from __future__ import annotations

from collections.abc import Sequence

from mimo_ctx.errors import StoreError
from mimo_ctx.messages import Message

__all__ = ["reject_repeated_ids"]


def reject_repeated_ids(messages: Sequence[Message], what: str) -> None:
    """Refuse a batch that names one message id twice (``what`` names the call).

    Raises:
        StoreError: An id appears twice; the caller writes nothing.
    """
    seen: set[str] = set()
    for m in messages:
        if m.id in seen:
            raise StoreError(f"{what}: message id {m.id!r} appears twice; nothing written")
        seen.add(m.id)
