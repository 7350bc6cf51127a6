"""The newest messages a writer run places its watermark on, kept current (private).

Each writer run places the watermark on the session's newest main-agent messages
(a page of :data:`~mimo_ctx.checkpoint._coordinator.WATERMARK_PAGE` at first, see
``WriterCoordinator._next_watermark``). Reading that page from the store parsed
every message of it again on each run: on the SQLite store 128 messages took
~3.8 ms on the store's thread, holding the GIL meanwhile -- the event loop's
longest stall during a writer run. The coordinator keeps the page it read and
brings it up to date from the store's change feed
(:meth:`~mimo_ctx.store.base.Store.changes_since`), which lists what was written
since (after the store's own writes, without reading the file at all): a run
parses only the messages written since the previous one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mimo_ctx.messages import Message, message_key

__all__ = ["NewestPage", "apply_changes", "page_of"]


@dataclass(slots=True)
class NewestPage:
    """An agent's newest on-branch messages, as the store held them at ``seq``.

    Attributes:
        size: How many of the newest messages the page keeps at most.
        seq: The change-feed position it is current to.
        messages: Every on-branch message of the agent from ``start`` on, ordered
            by ``(time_created, id)``: a suffix of the agent's history.
        start: The key from which on every message is held; ``None``: from the
            first message of the history.
    """

    size: int
    seq: int
    messages: list[Message]
    start: tuple[int, str] | None


def page_of(messages: Sequence[Message], seq: int, size: int) -> NewestPage:
    """The page of a store read of the newest ``size`` messages (read after ``seq``).

    Fewer than ``size`` messages means the read reached the history's first one.
    """
    listed = list(messages)
    start = None if len(listed) < size else message_key(listed[0])
    return NewestPage(size=size, seq=seq, messages=listed, start=start)


def apply_changes(page: NewestPage, changed: Sequence[Message], seq: int, *, agent: str) -> None:
    """Bring ``page`` to ``seq``: ``changed`` lists what was written after ``page.seq``.

    A message written again replaces the one held; one moved off the branch
    leaves; one older than ``start`` stays out (the page holds a suffix). Then the
    newest ``size`` are kept. A feed read older than the page (two runs
    refreshing at once) changes nothing: the page is newer than what it says.
    """
    if seq <= page.seq:
        return
    held = {m.id: m for m in page.messages}
    for message in changed:
        if message.agent != agent:
            continue
        held.pop(message.id, None)
        if not message.off_branch and (page.start is None or message_key(message) >= page.start):
            held[message.id] = message
    messages = sorted(held.values(), key=message_key)
    if len(messages) > page.size:
        messages = messages[-page.size :]
        page.start = message_key(messages[0])
    page.messages = messages
    page.seq = seq
