"""The newest messages a writer run places its watermark on, kept current (private).

Each writer run places the watermark on the session's newest main-agent messages
(128 at first, more while the whole history could place it differently). Reading
that page from the store parsed every message of it again on each run, on the
store's thread and holding the GIL: 0.6-0.9 ms of CPU per run on the SQLite store
for messages of 0.7-20 KB, up to 3.5 ms. The coordinator keeps the page it read and
brings it up to date from the store's change feed
(:meth:`~mimo_ctx.store.base.Store.changes_since`), which lists what was written
since (after the store's own writes, without reading the file at all): a run
parses only the messages written since the previous one. The sessions that ran a
writer last keep theirs (:data:`PAGES_KEPT`), so memory does not grow with the
number of sessions a process ever served.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx._window import SEQ_PROBE
from mimo_ctx.messages import MAIN_AGENT, Message, message_key
from mimo_ctx.store.base import Store

__all__ = ["PAGES_KEPT", "KeptPages", "NewestPage", "apply_changes", "page_of"]

PAGES_KEPT: Final = 64
"""Sessions whose newest page is kept between writer runs (the least recent is dropped)."""


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


class KeptPages:
    """The main agent's newest page of the sessions that ran a writer last, over one store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pages: OrderedDict[str, NewestPage] = OrderedDict()

    async def newest(self, session_id: str, size: int) -> NewestPage:
        """The session's newest ``size`` (or more) main-agent messages, as stored now.

        The page kept from the last run when it is as large, brought up to date
        from the change feed; else read afresh (the feed position taken first:
        what is written meanwhile comes again from the feed next time, and
        replaces what the read got).
        """
        store, pages = self._store, self._pages
        page = pages.get(session_id)
        if page is not None and page.size >= size:
            pages.move_to_end(session_id)
            changed, seq = await store.changes_since(session_id, page.seq)
            apply_changes(page, changed, seq, agent=MAIN_AGENT)
            return page
        _, seq = await store.changes_since(session_id, SEQ_PROBE)
        listed = await store.list_messages(session_id, agent=MAIN_AGENT, last=size)
        page = page_of(listed, seq, size)
        pages[session_id] = page
        pages.move_to_end(session_id)
        while len(pages) > PAGES_KEPT:
            pages.popitem(last=False)
        return page
