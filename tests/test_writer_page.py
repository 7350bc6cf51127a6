"""The writer's newest page, kept from run to run (mimo_ctx.checkpoint._page).

* Brought up to date from the change feed, the page is always a suffix of the
  agent's on-branch history as stored (appends, rewrites, messages leaving and
  rejoining the branch, other agents' writes), at most ``size`` long, and the
  newest ``size`` whenever the history has that many after its start.
* Through the coordinator: the watermark placed on the kept page is the whole
  history's, run after run, and a run after the first reads only the change feed,
  not the page again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import sessions
from writer_support import WRITER_CONFIG, whole_history_watermark

from mimo_ctx.checkpoint import OfflineCheckpointWriter
from mimo_ctx.checkpoint import _coordinator as coordinator_module
from mimo_ctx.checkpoint import _page as page_module
from mimo_ctx.checkpoint._coordinator import WriterCoordinator
from mimo_ctx.checkpoint._page import apply_changes, page_of
from mimo_ctx.events import EventBus
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart, message_key
from mimo_ctx.store import InMemoryStore, Session

# -- the pure part -----------------------------------------------------------------------

_Op = tuple[str, int, int]  # (kind, which message, how many / a tag)

_ops = st.lists(
    st.tuples(
        st.sampled_from(["append", "rewrite", "off", "on", "other"]),
        st.integers(min_value=0, max_value=10_000),
        st.integers(min_value=1, max_value=6),
    ),
    max_size=40,
)


class _History:
    """A store's messages of one session and its change feed, in memory."""

    def __init__(self) -> None:
        self.messages: dict[str, Message] = {}
        self.written: dict[str, int] = {}  # id -> seq of its last write
        self.seq = 0
        self._time = 1_000

    def write(self, message: Message) -> None:
        self.seq += 1
        self.messages[message.id] = message
        self.written.pop(message.id, None)
        self.written[message.id] = self.seq

    def new(self, agent: str, tag: int) -> Message:
        self._time += 1 + tag % 3
        return Message(
            session_id="ses_page",
            role="user",
            agent=agent,
            time_created=self._time,
            parts=[TextPart(text=f"m{self._time}")],
        )

    def on_branch(self, agent: str) -> list[Message]:
        chosen = [m for m in self.messages.values() if m.agent == agent and not m.off_branch]
        return sorted(chosen, key=message_key)

    def since(self, seq: int) -> list[Message]:
        return [self.messages[i] for i, at in self.written.items() if at > seq]

    def apply(self, op: _Op) -> None:
        kind, which, count = op
        known = sorted(self.messages)
        if kind == "append":
            for _ in range(count):
                self.write(self.new(MAIN_AGENT, which))
        elif kind == "other":
            self.write(self.new("sub_1", which))
        elif known:
            message = self.messages[known[which % len(known)]]
            if kind == "rewrite":
                text = TextPart(text=f"rewritten {which}")
                self.write(message.model_copy(update={"parts": [text]}))
            else:
                self.write(message.model_copy(update={"off_branch": kind == "off"}))


@settings(max_examples=300, deadline=None)
@given(
    first=_ops,
    batches=st.lists(_ops, min_size=1, max_size=6),
    size=st.integers(min_value=1, max_value=12),
)
def test_the_kept_page_is_the_newest_suffix_of_the_history(
    first: list[_Op], batches: list[list[_Op]], size: int
) -> None:
    history = _History()
    for op in first:
        history.apply(op)
    page = page_of(history.on_branch(MAIN_AGENT)[-size:], history.seq, size)
    for batch in batches:
        for op in batch:
            history.apply(op)
        apply_changes(page, history.since(page.seq), history.seq, agent=MAIN_AGENT)
        stored = history.on_branch(MAIN_AGENT)
        assert page.seq == history.seq
        assert len(page.messages) <= size
        if page.start is None:
            assert page.messages == stored  # from the first message on
        else:
            assert page.messages == [m for m in stored if message_key(m) >= page.start]
        # A suffix: the newest of the history, as stored now (rewrites included).
        assert page.messages == stored[len(stored) - len(page.messages) :]
        if len(page.messages) < size and page.start is None:
            assert len(stored) < size


def test_an_older_feed_read_leaves_a_newer_page_alone() -> None:
    history = _History()
    for tag in range(4):
        history.write(history.new(MAIN_AGENT, tag))
    page = page_of(history.on_branch(MAIN_AGENT), history.seq, 10)
    stale = history.since(0)
    history.write(
        history.messages[sorted(history.messages)[0]].model_copy(update={"off_branch": True})
    )
    apply_changes(page, history.since(page.seq), history.seq, agent=MAIN_AGENT)
    assert len(page.messages) == 3
    apply_changes(page, stale, history.seq - 1, agent=MAIN_AGENT)  # another run's, older
    assert len(page.messages) == 3
    assert page.seq == history.seq


# -- through the coordinator -------------------------------------------------------------


class _CountingStore(InMemoryStore):
    """Counts the message listings (the page reads), not the change-feed reads."""

    listings = 0

    async def list_messages(
        self,
        session_id: str,
        *,
        agent: str | None = MAIN_AGENT,
        since: tuple[int, str] | None = None,
        last: int | None = None,
        exclude_agent: str | None = None,
    ) -> list[Message]:
        self.listings += 1
        return await super().list_messages(
            session_id, agent=agent, since=since, last=last, exclude_agent=exclude_agent
        )


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    history=sessions(max_turns=10, max_output_chars=3_000),
    page=st.sampled_from([3, 5, 8, 16]),
    cuts=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=4),
)
async def test_run_after_run_the_kept_page_places_the_whole_historys_watermark(
    history: list[Message],
    page: int,
    cuts: list[float],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coordinator_module, "WATERMARK_PAGE", page)
    monkeypatch.setattr(coordinator_module, "WATERMARK_MARGIN", 3)
    store = InMemoryStore()
    session = Session(id=history[0].session_id, time_created=0)
    await store.create_session(session)
    coordinator = WriterCoordinator(
        store, MemoryLayout(tmp_path), WRITER_CONFIG, OfflineCheckpointWriter(), EventBus()
    )
    written = 0
    for cut in [*sorted(cuts), 1.0]:
        upto = max(written, round(cut * len(history)))
        await store.append_messages(history[written:upto])
        written = upto
        main = [m for m in history[:written] if m.agent == MAIN_AGENT]
        got = await coordinator._next_watermark(session.id)  # pyright: ignore[reportPrivateUsage]
        assert got == (whole_history_watermark(main) if main else None)


async def test_a_run_after_the_first_reads_the_change_feed_not_the_page(tmp_path: Path) -> None:
    store = _CountingStore()
    session = Session(time_created=0)
    await store.create_session(session)
    history = _History()
    for tag in range(300):
        history.write(history.new(MAIN_AGENT, tag))
    messages = [
        m.model_copy(update={"session_id": session.id}) for m in history.on_branch(MAIN_AGENT)
    ]
    await store.append_messages(messages[:200])
    coordinator = WriterCoordinator(
        store, MemoryLayout(tmp_path), WRITER_CONFIG, OfflineCheckpointWriter(), EventBus()
    )
    newest = coordinator._pages.newest  # pyright: ignore[reportPrivateUsage]
    page = await newest(session.id, 128)
    assert store.listings == 1
    assert [m.id for m in page.messages] == [m.id for m in messages[72:200]]
    await store.append_messages(messages[200:])
    page = await newest(session.id, 128)
    assert store.listings == 1  # only the feed was read
    assert [m.id for m in page.messages] == [m.id for m in messages[172:]]
    page = await newest(session.id, 512)  # larger than kept: read afresh
    assert store.listings == 2
    assert page.start is None
    assert len(page.messages) == 300


async def test_the_pages_of_the_least_recent_sessions_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(page_module, "PAGES_KEPT", 2)
    store = _CountingStore()
    sessions_ = [Session(time_created=0) for _ in range(3)]
    for session in sessions_:
        await store.create_session(session)
        history = _History()
        history.write(history.new(MAIN_AGENT, 0))
        message = history.on_branch(MAIN_AGENT)[0]
        await store.append_messages([message.model_copy(update={"session_id": session.id})])
    coordinator = WriterCoordinator(
        store, MemoryLayout(tmp_path), WRITER_CONFIG, OfflineCheckpointWriter(), EventBus()
    )
    newest = coordinator._pages.newest  # pyright: ignore[reportPrivateUsage]
    one, two, three = (s.id for s in sessions_)
    for session_id in (one, two, one):  # one is the most recent now
        await newest(session_id, 8)
    assert store.listings == 2
    await newest(three, 8)  # drops two, the least recent
    await newest(one, 8)
    assert store.listings == 3
    await newest(two, 8)
    assert store.listings == 4
