"""Host-history reconciliation: which messages a resent host list stores (issue 15, step 5).

A host (a wrapped client, a framework integration) resends its whole conversation
every call; the store must receive each host message exactly once. Random host
histories are driven through the reconciler (directly, and through the
integrations' layer over it) and compared with an oracle: every host message
that was ever sent (or recorded as an answer) is stored once, in the order it
first appeared. Written first against the two implementations this one replaced
(the wrappers' ``HistorySync`` and the integrations' ``SessionSync``): the three
agreed with the oracle on every case below before the old two were deleted.

Four kinds of histories:

* growing: the list only grows (answers and new user turns appended);
* repeated "continue": the same text typed again and again is stored each time;
* trimmed at the front: the host drops its oldest messages (nothing new is stored);
* edited: the host replaces a message (not the first: a list whose first message
  differs is another conversation) and drops what followed it (edit-and-resend);
  the edited message and what follows are stored, nothing is stored twice, and
  with the reconciler the session then holds exactly the host's list.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx._util import now_ms
from mimo_ctx.convert import MessageDraft
from mimo_ctx.integrations._sync import IntegrationSync, add_part, new_draft
from mimo_ctx.messages import Message, TextPart
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store import InMemoryStore

SID = "ses_equivalence"

Op = Literal["grow", "continue", "trim", "edit"]


@dataclass(eq=False)
class Item:
    """One host message; identity (not text) says whether it is the same message."""

    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class Script:
    """A host conversation: the operations between its calls."""

    ops: tuple[tuple[Op, int], ...]
    duplicates: bool


@dataclass
class Oracle:
    """Every host message sent or recorded, once, in the order it first appeared."""

    sent: list[Item] = field(default_factory=list[Item])

    def saw(self, *items: Item) -> None:
        for item in items:
            if all(item is not known for known in self.sent):
                self.sent.append(item)


Send = Callable[[list[Item], Item], Awaitable[None]]


async def _run(script: Script, send: Send) -> list[Item]:
    """Drive ``send`` through the script (each call sends the host list, then records
    the answer); return what the oracle expects stored."""
    oracle = Oracle()
    counter = itertools.count()

    def fresh(role: Literal["user", "assistant"], base: str) -> Item:
        return Item(role, f"{base} {next(counter)}")

    host: list[Item] = [fresh("user", "start")]
    answer = fresh("assistant", "answer")
    oracle.saw(*host)
    await send(list(host), answer)
    oracle.saw(answer)
    for op, amount in script.ops:
        if op == "trim" and len(host) > 2:
            host = host[min(amount, len(host) - 2) :]
        elif op == "edit" and any(item.role == "user" for item in host[1:]):
            # Not the first message: a list whose first message differs shares
            # nothing with the session (another conversation, refused).
            users = [i for i, item in enumerate(host) if item.role == "user" and i > 0]
            at = users[amount % len(users)]
            host = [*host[:at], fresh("user", "edited")]
            oracle.saw(*host)
            answer = fresh("assistant", "answer")
            await send(list(host), answer)
            oracle.saw(answer)
            continue
        text = "continue" if op == "continue" and script.duplicates else None
        turn = Item("user", text) if text is not None else fresh("user", "turn")
        host = [*host, answer, turn]
        oracle.saw(*host)
        answer = Item("assistant", "ok") if script.duplicates else fresh("assistant", "answer")
        await send(list(host), answer)
        oracle.saw(answer)
    return oracle.sent


def _message(item: Item) -> Message:
    return Message(
        session_id=SID, role=item.role, time_created=now_ms(), parts=[TextPart(text=item.text)]
    )


def _stored_texts(messages: Sequence[Message]) -> list[tuple[str, str]]:
    return [(m.role, "".join(p.text for p in m.parts if isinstance(p, TextPart))) for m in messages]


Stored = tuple[list[Item], list[Message]]


async def _with_middleware(
    tmp_path: Path, body: Callable[[ContextMiddleware], Awaitable[list[Item]]]
) -> Stored:
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path / "memory", model=100_000) as mw:
        await mw.open_session(SID)
        expected = await body(mw)
        stored = await store.list_messages(SID)
        # Off-branch messages (the edited scenario) are stored too: read them back.
        stored_ids = {m.id for m in stored}
        changed, _ = await store.changes_since(SID, 0)
        everything = stored + [m for m in changed if m.id not in stored_ids]
        everything.sort(key=lambda m: (m.time_created, m.id))
        return expected, everything


async def _integration_path(tmp_path: Path, script: Script) -> Stored:
    """The integrations' layer over the reconciler (origins, slots)."""

    async def body(mw: ContextMiddleware) -> list[Item]:
        sync = IntegrationSync(mw, SID, source="test")

        def draft(item: Item) -> MessageDraft:
            made = new_draft(item.role, "test", finish="stop" if item.role == "assistant" else None)
            add_part(made, TextPart(text=item.text), 0)
            return made

        async def send(host: list[Item], answer: Item) -> None:
            await sync.sync(
                host, key=lambda i: f"{i.role}:{i.text}", convert=lambda i, _: [draft(i)]
            )
            await sync.record(f"assistant:{answer.text}", draft(answer), answer)

        return await _run(script, send)

    return await _with_middleware(tmp_path, body)


async def _reconciler_path(tmp_path: Path, script: Script) -> Stored:
    """The one host-history reconciler (mimo_ctx.reconcile)."""

    async def body(mw: ContextMiddleware) -> list[Item]:
        history = mw.host_history(SID)

        def draft(item: Item, index: int) -> MessageDraft:
            return MessageDraft(item.role, [TextPart(text=item.text)], item=index)

        async def send(host: list[Item], answer: Item) -> None:
            done = await history.reconcile(
                host,
                fingerprint=lambda i: f"{i.role}:{i.text}",
                convert=lambda run: [draft(i, n) for n, i in enumerate(run)],
            )
            # What the session now holds is exactly what the host sent (its view).
            listed = await mw.store.list_messages(SID)
            if not any(op == "trim" for op, _ in script.ops):
                assert _stored_texts(listed) == [(i.role, i.text) for i in host]
            await history.record(
                _message(answer).model_copy(update={"finish": "stop"}),
                fingerprints=[f"assistant:{answer.text}"],
                after=done.head,
            )

        return await _run(script, send)

    return await _with_middleware(tmp_path, body)


PATHS = {"reconciler": _reconciler_path, "integration": _integration_path}


def _scripts(ops: Sequence[Op], *, duplicates: bool) -> st.SearchStrategy[Script]:
    steps = st.lists(st.tuples(st.sampled_from(list(ops)), st.integers(0, 5)), max_size=12)
    return steps.map(lambda chosen: Script(tuple(chosen), duplicates))


def _check(tmp_path: Path, script: Script) -> None:
    for name, path in PATHS.items():
        expected, stored = anyio.run(path, tmp_path / name, script)
        assert _stored_texts(stored) == [(i.role, i.text) for i in expected], name


@settings(max_examples=40)
@given(script=_scripts(["grow", "continue"], duplicates=True))
def test_growing_lists_and_repeated_continue_store_each_message_once(
    tmp_path_factory: pytest.TempPathFactory, script: Script
) -> None:
    _check(tmp_path_factory.mktemp("grow"), script)


@settings(max_examples=40)
@given(script=_scripts(["grow", "trim"], duplicates=False))
def test_a_list_trimmed_at_the_front_stores_nothing_again(
    tmp_path_factory: pytest.TempPathFactory, script: Script
) -> None:
    _check(tmp_path_factory.mktemp("trim"), script)


@settings(max_examples=40)
@given(script=_scripts(["grow", "edit"], duplicates=False))
def test_an_edited_list_stores_the_edit_and_what_follows_once(
    tmp_path_factory: pytest.TempPathFactory, script: Script
) -> None:
    _check(tmp_path_factory.mktemp("edit"), script)
