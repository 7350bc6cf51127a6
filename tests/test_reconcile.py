"""The host-history reconciler (issue 16, build 1, 2, 4): the conversation rule, workers.

Plain strings and small tuples stand for host messages here; the provider
wrappers and integrations plug their formats in (their end-to-end tests use the
real SDKs).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from mimo_ctx._util import now_ms
from mimo_ctx.convert import MessageDraft
from mimo_ctx.errors import ConversationMismatchError, InvalidRequestError
from mimo_ctx.messages import (
    Message,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStatePending,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.reconcile import HostHistory, Reconciled
from mimo_ctx.store import InMemoryStore, SQLiteStore, Store
from mimo_ctx.store.base import HostIndex

SID = "ses_reconcile"
Item = tuple[str, str]  # (role, text)


def _fp(item: Item) -> str | None:
    return None if item[0] == "system" else f"{item[0]}:{item[1]}"


def _convert(run: Sequence[Item]) -> list[MessageDraft]:
    return [
        MessageDraft("user" if r == "user" else "assistant", [TextPart(text=t)], item=i)
        for i, (r, t) in enumerate(run)
    ]


@asynccontextmanager
async def _middleware(
    tmp_path: Path, store: Store | None = None
) -> AsyncGenerator[ContextMiddleware]:
    async with ContextMiddleware(
        store or InMemoryStore(), tmp_path / "memory", model=100_000
    ) as mw:
        await mw.open_session(SID)
        yield mw


async def _send(history: HostHistory, host: list[Item]) -> Reconciled:
    return await history.reconcile(host, fingerprint=_fp, convert=_convert)


async def _answer(history: HostHistory, text: str, after: str | None) -> Message:
    message = Message(
        session_id=SID,
        role="assistant",
        time_created=now_ms(),
        finish="stop",
        parts=[TextPart(text=text)],
    )
    return await history.record(message, fingerprints=[f"assistant:{text}"], after=after)


def _texts(messages: Sequence[Message]) -> list[str]:
    return ["".join(p.text for p in m.parts if isinstance(p, TextPart)) for m in messages]


async def test_regenerate_drops_the_old_answer_from_the_conversation(tmp_path: Path) -> None:
    """The host drops its last answer and asks again: the session follows it; storage keeps
    the dropped answer; going back to it brings it back."""
    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        first = await _send(history, [("system", "s"), ("user", "hi")])
        one = await _answer(history, "answer one", first.head)
        again = await _send(history, [("system", "s"), ("user", "hi")])  # regenerate
        assert again.dropped == [one.id]
        assert _texts(await mw.store.list_messages(SID)) == ["hi"]
        two = await _answer(history, "answer two", again.head)
        assert _texts(await mw.store.list_messages(SID)) == ["hi", "answer two"]
        back = await _send(history, [("user", "hi"), ("assistant", "answer one"), ("user", "go")])
        assert (back.dropped, back.restored) == ([two.id], [one.id])
        assert _texts(await mw.store.list_messages(SID)) == ["hi", "answer one", "go"]
        assert await mw.store.count_messages(SID) == 4  # nothing deleted
        view = await mw.prepare(SID)
        assert _texts(view.messages) == ["hi", "answer one", "go"]


async def test_edit_and_resend_sends_exactly_the_host_list(tmp_path: Path) -> None:
    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        done = await _send(history, [("user", "a")])
        await _answer(history, "x", done.head)
        done = await _send(history, [("user", "a"), ("assistant", "x"), ("user", "b")])
        await _answer(history, "y", done.head)
        edited = [("user", "a"), ("assistant", "x"), ("user", "b, edited")]
        done = await _send(history, edited)
        assert len(done.dropped) == 2
        view = await mw.prepare(SID)
        assert _texts(view.messages) == ["a", "x", "b, edited"]


async def test_a_conversation_that_shares_nothing_is_refused_naming_the_session(
    tmp_path: Path,
) -> None:
    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        done = await _send(history, [("user", "Alice: my password hint is BLUE-42")])
        await _answer(history, "noted", done.head)
        with pytest.raises(ConversationMismatchError, match=SID) as info:
            await _send(history, [("user", "Bob: hello")])
        assert info.value.session_id == SID
        # An edited first message is another conversation too; nothing was stored.
        with pytest.raises(ConversationMismatchError):
            await _send(history, [("user", "Alice: my hint is RED"), ("assistant", "noted")])
        assert _texts(await mw.store.list_messages(SID)) == [
            "Alice: my password hint is BLUE-42",
            "noted",
        ]


async def test_a_trimmed_front_with_repeated_continue_stores_the_new_continue(
    tmp_path: Path,
) -> None:
    """Both old paths missed this one: a 'continue' typed again after the host trimmed
    its front matched an earlier stored 'continue' and was never stored."""
    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        host: list[Item] = [
            ("user", "a"),
            ("user", "continue"),
            ("user", "b"),
            ("user", "continue"),
        ]
        await _send(history, host)
        trimmed = [*host[2:], ("user", "continue")]
        done = await _send(history, trimmed)
        assert _texts(done.appended) == ["continue"]
        assert _texts(await mw.store.list_messages(SID)) == [
            "a", "continue", "b", "continue", "continue"
        ]  # fmt: skip


async def test_a_call_fingerprints_only_the_messages_it_has_not_seen(tmp_path: Path) -> None:
    seen: list[Item] = []

    def counting(item: Item) -> str | None:
        seen.append(item)
        return _fp(item)

    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        host: list[Item] = [("user", f"m{i}") for i in range(200)]
        await history.reconcile(host, fingerprint=counting, convert=_convert)
        assert len(seen) == 200
        seen.clear()
        host = [*host, ("user", "new")]  # a new list, the same items
        done = await history.reconcile(host, fingerprint=counting, convert=_convert)
        assert seen == [("user", "new")]
        assert _texts(done.appended) == ["new"]


async def test_a_host_list_grown_in_place_fingerprints_only_what_is_new(tmp_path: Path) -> None:
    """A host that appends to one list object: each call fingerprints the new items only, and
    an item replaced in place is still seen (the reconciler compares with its own copy)."""
    seen: list[Item] = []

    def counting(item: Item) -> str | None:
        seen.append(item)
        return _fp(item)

    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        host: list[Item] = [("user", f"m{i}") for i in range(100)]
        await history.reconcile(host, fingerprint=counting, convert=_convert)
        for turn in range(3):
            seen.clear()
            host.append(("user", f"more {turn}"))
            done = await history.reconcile(host, fingerprint=counting, convert=_convert)
            assert seen == [("user", f"more {turn}")]
            assert _texts(done.appended) == [f"more {turn}"]
        host[50] = ("user", "edited")  # the same list, one item replaced
        seen.clear()
        done = await history.reconcile(host, fingerprint=counting, convert=_convert)
        assert seen[0] == ("user", "edited")
        assert done.unchanged == 50
        assert "edited" in _texts(done.appended)


async def test_a_call_that_failed_leaves_the_next_call_right(tmp_path: Path) -> None:
    def strict(run: Sequence[Item]) -> list[MessageDraft]:
        if any(text == "bad" for _, text in run):
            raise InvalidRequestError("a bad message")
        return _convert(run)

    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        host: list[Item] = [("user", "a"), ("assistant", "b")]
        await history.reconcile(host, fingerprint=_fp, convert=strict)
        with pytest.raises(InvalidRequestError, match="bad"):
            await history.reconcile([*host, ("user", "bad")], fingerprint=_fp, convert=strict)
        done = await history.reconcile([*host, ("user", "good")], fingerprint=_fp, convert=strict)
        assert done.unchanged == 2
        assert _texts(done.appended) == ["good"]
        assert _texts(await mw.store.list_messages(SID)) == ["a", "b", "good"]


async def test_two_middlewares_on_one_store_serve_alternate_turns(tmp_path: Path) -> None:
    """Any worker serves any turn: what is stored is read from the store's host index."""
    store = await SQLiteStore.open(tmp_path / "shared.db")
    try:
        async with (
            _middleware(tmp_path / "a", store) as first,
            _middleware(tmp_path / "b", store) as second,
        ):
            host: list[Item] = []
            for turn in range(20):
                mw = first if turn % 2 == 0 else second
                history = mw.host_history(SID)
                host = [*host, ("user", f"turn {turn}")]
                done = await _send(history, host)
                await _answer(history, f"answer {turn}", done.head)
                host = [*host, ("assistant", f"answer {turn}")]
            listed = _texts(await store.list_messages(SID))
            assert listed == [t for _, t in host]
            assert await store.count_messages(SID) == len(host)
    finally:
        await store.aclose()


async def test_a_worker_reads_the_host_index_only_when_it_must(tmp_path: Path) -> None:
    """The common turn of one worker decides on what it knows: its commit moves the
    head only from the head the store still has, so no read of the index first (one
    store round trip fewer per reconcile and per answer)."""
    store = await SQLiteStore.open(tmp_path / "index.db")
    reads: list[int] = []
    host_index = store.host_index

    async def counted(session_id: str, *, agent: str, since: int = 0) -> HostIndex:
        reads.append(since)
        return await host_index(session_id, agent=agent, since=since)

    store.host_index = counted  # type: ignore[method-assign]
    try:
        async with _middleware(tmp_path, store) as mw:
            history = mw.host_history(SID)
            host: list[Item] = []
            for turn in range(5):
                host = [*host, ("user", f"turn {turn}")]
                done = await _send(history, host)
                await _answer(history, f"answer {turn}", done.head)
                host = [*host, ("assistant", f"answer {turn}")]
            assert len(reads) == 1  # the first call loads the index
            # A list that moves no head (resent as it is) is decided on a fresh read.
            await _send(history, host)
            assert len(reads) == 2
            assert _texts(await store.list_messages(SID)) == [t for _, t in host]
    finally:
        await store.aclose()


async def test_a_list_resent_after_another_worker_answered_it_follows_the_host(
    tmp_path: Path,
) -> None:
    """Worker A knows the conversation up to the host's last message; worker B answered
    that list meanwhile. The host sends A the same list again: A must see B's answer in
    the store (nothing for its head to be checked against) and leave it off the
    conversation, as the host did."""
    store = await SQLiteStore.open(tmp_path / "shared.db")
    try:
        async with (
            _middleware(tmp_path / "a", store) as first,
            _middleware(tmp_path / "b", store) as second,
        ):
            a, b = first.host_history(SID), second.host_history(SID)
            host: list[Item] = [("user", "q")]
            await _send(a, host)
            done = await _send(b, host)
            await _answer(b, "from b", done.head)
            again = await _send(a, host)
            assert again.dropped  # B's answer left the conversation
            assert _texts(await store.list_messages(SID)) == ["q"]
            assert await store.count_messages(SID) == 2  # storage keeps it
    finally:
        await store.aclose()


async def test_concurrent_answers_of_one_request_keep_the_second_off_the_conversation(
    tmp_path: Path,
) -> None:
    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        done = await _send(history, [("user", "q")])
        answers: list[Message] = []

        async def answer(text: str) -> None:
            answers.append(await _answer(history, text, done.head))

        async with anyio.create_task_group() as tg:
            tg.start_soon(answer, "one")
            tg.start_soon(answer, "two")
        assert sorted(a.off_branch for a in answers) == [False, True]
        kept = next(a for a in answers if not a.off_branch)
        other = next(a for a in answers if a.off_branch)
        assert _texts(await mw.store.list_messages(SID)) == ["q", _texts([kept])[0]]
        # The host keeps the other answer: the session follows it.
        await _send(history, [("user", "q"), ("assistant", _texts([other])[0]), ("user", "ok")])
        assert _texts(await mw.store.list_messages(SID)) == ["q", _texts([other])[0], "ok"]


async def test_results_stored_apart_get_the_tool_name_of_their_call(tmp_path: Path) -> None:
    """Micro-compaction selects results by tool name (SPEC R4.5), also when another
    worker stored the call."""
    store = InMemoryStore()
    async with _middleware(tmp_path / "a", store) as first:
        history = first.host_history(SID)
        done = await _send(history, [("user", "run it")])
        call = Message(
            session_id=SID,
            role="assistant",
            time_created=0,
            finish="tool-calls",
            parts=[ToolPart(call_id="c1", tool="bash", state=ToolStatePending())],
        )
        await history.record(call, fingerprints=["calls:c1"], after=done.head)

    def convert(run: Sequence[Item]) -> list[MessageDraft]:
        return [
            MessageDraft("tool", [ToolResultPart(call_id="c1", tool="", output="ok")], item=i)
            for i, _ in enumerate(run)
        ]

    def fingerprint(item: Item) -> str:
        return "calls:c1" if item[0] == "call" else _fp(item) or ""

    async with _middleware(tmp_path / "b", store) as second:
        done = await second.host_history(SID).reconcile(
            [("user", "run it"), ("call", "c1"), ("tool", "c1")],
            fingerprint=fingerprint,
            convert=convert,
        )
        result = done.appended[0].parts[0]
        assert isinstance(result, ToolResultPart)
        assert result.tool == "bash"


async def test_closing_a_session_releases_its_state_and_a_later_call_reloads_it(
    tmp_path: Path,
) -> None:
    async with _middleware(tmp_path) as mw:
        history = mw.host_history(SID)
        done = await _send(history, [("user", "a")])
        await _answer(history, "b", done.head)
        await mw.prepare(SID)
        await mw.close_session(SID)
        fresh = mw.host_history(SID)
        assert fresh is not history
        done = await _send(fresh, [("user", "a"), ("assistant", "b"), ("user", "c")])
        assert _texts(done.appended) == ["c"]
        assert _texts((await mw.prepare(SID)).messages) == ["a", "b", "c"]
