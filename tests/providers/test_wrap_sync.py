"""The provider-independent pieces of the wrappers: history sync, boundary marking, retry.

:class:`~mimo_ctx.providers._sync.HistorySync` is generic ("a host resends a list
of items every turn; store only what is new"), so it is tested here with plain
strings as host items; the matcher is a pure function with Hypothesis properties.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from fake_servers import running_middleware
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.errors import ContextOverflowError, InvalidRequestError
from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    Message,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStatePending,
)
from mimo_ctx.middleware import RequestView
from mimo_ctx.providers._sync import (
    HOST_METADATA_KEY,
    HistorySync,
    RecoveringCall,
    _Index,  # pyright: ignore[reportPrivateUsage]
    converter_input,
    fingerprint,
)
from mimo_ctx.providers.anthropic import to_anthropic
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.store.base import RequestPrefix
from mimo_ctx.view import apply_send_rules

SID = "ses_sync"
fps = st.lists(st.sampled_from([f"fp{i}" for i in range(6)]), max_size=12)


def _index(stored: Sequence[str]) -> _Index:
    index = _Index()
    for position, fp in enumerate(stored):
        index.add(fp, (f"msg{position}",))
    return index


@given(stored=fps, new=st.lists(st.sampled_from(["n1", "n2", "n3"]), max_size=5))
def test_a_grown_list_stores_exactly_its_tail(stored: list[str], new: list[str]) -> None:
    matched = _index(stored).match([*stored, *new])
    assert matched[: len(stored)] == list(range(len(stored)))
    assert matched[len(stored) :] == [None] * len(new)


@given(stored=fps, host=fps)
def test_each_stored_occurrence_matches_at_most_one_host_item(
    stored: list[str], host: list[str]
) -> None:
    """Duplicates ("continue" typed twice) are new once the stored ones are used up."""
    matched = _index(stored).match(host)
    taken = [m for m in matched if m is not None]
    assert len(taken) == len(set(taken))
    for position, entry in enumerate(matched):
        if entry is not None:
            assert stored[entry] == host[position]
    new = Counter(h for h, m in zip(host, matched, strict=True) if m is None)
    expected = Counter(host) - Counter(stored)
    assert new == expected


@given(stored=fps, data=st.data())
def test_a_trimmed_or_reordered_list_stores_nothing(stored: list[str], data: st.DataObject) -> None:
    host = data.draw(st.permutations(stored))
    cut = data.draw(st.integers(0, len(host)))
    assert None not in _index(stored).match(host[cut:])


def _convert(session_id: str) -> object:
    def convert(items: Sequence[str]) -> list[Message]:
        return [
            Message(session_id=session_id, role="user", time_created=1, parts=[TextPart(text=i)])
            for i in items
        ]

    return convert


async def test_history_sync_is_generic_and_survives_a_new_instance(tmp_path: Path) -> None:
    async with running_middleware(tmp_path) as mw:
        await mw.open_session(SID)
        sync = HistorySync(mw)
        items = ["hello", "continue"]
        keys = [fingerprint("user", i) for i in items]
        added = await sync.sync(SID, items, fingerprints=keys, convert=_convert(SID))  # type: ignore[arg-type]
        # One run of new items: converted together, its fingerprints on its first message.
        assert [m.metadata.get(HOST_METADATA_KEY) for m in added] == [keys, None]
        items += ["continue"]
        keys += [fingerprint("user", "continue")]
        added = await sync.sync(SID, items, fingerprints=keys, convert=_convert(SID))  # type: ignore[arg-type]
        assert [p.text for m in added for p in m.parts if isinstance(p, TextPart)] == ["continue"]
        assert await sync.stored_ids(SID, keys[1]) == [
            tuple(m.id for m in (await mw.store.list_messages(SID))[:2]),
            (added[0].id,),
        ]
        with pytest.raises(InvalidRequestError, match="fingerprints"):
            await sync.sync(SID, items, fingerprints=keys[:1], convert=_convert(SID))  # type: ignore[arg-type]
    async with running_middleware(tmp_path, mw.store) as other:
        again = await HistorySync(other).sync(
            SID,
            items,
            fingerprints=keys,
            convert=_convert(SID),  # type: ignore[arg-type]
        )
        assert again == []


async def test_results_stored_apart_get_their_tool_name(tmp_path: Path) -> None:
    """Micro-compaction selects results by tool name (SPEC R4.5)."""
    async with running_middleware(tmp_path) as mw:
        await mw.open_session(SID)
        sync = HistorySync(mw)
        call = Message(
            session_id=SID,
            role="assistant",
            time_created=1,
            finish="tool-calls",
            parts=[ToolPart(call_id="c1", tool="bash", state=ToolStatePending())],
        )
        await sync.record(call, fingerprints=["calls:c1"])

        def convert(items: Sequence[str]) -> list[Message]:
            return [
                Message(
                    session_id=SID,
                    role="tool",
                    time_created=2,
                    parts=[ToolResultPart(call_id=i, tool="", output="out")],
                )
                for i in items
            ]

        added = await sync.sync(SID, ["c1"], fingerprints=["result:c1"], convert=convert)
        result = added[0].parts[0]
        assert isinstance(result, ToolResultPart)
        assert result.tool == "bash"


def _view(messages: list[Message], boundary_id: str | None) -> RequestView:
    return RequestView(
        session_id=SID,
        agent="main",
        prefix=RequestPrefix(),
        messages=apply_send_rules(messages),
        tokens=0,
        boundary_id=boundary_id,
    )


@pytest.mark.parametrize(
    "marker",
    [CheckpointPart(covered_up_to="msg_w"), CompactionPart(summary="All done so far.")],
    ids=["checkpoint", "compaction"],
)
def test_r8_1_boundary_is_sent_as_one_text(marker: CheckpointPart | CompactionPart) -> None:
    """The view has the send rules applied; converter_input lets the converters see
    the boundary again, so it is sent as one text (OpenAI and Anthropic)."""
    boundary = Message(
        session_id=SID,
        role="user",
        time_created=1,
        parts=[marker, TextPart(text="## Checkpoint", synthetic=True), TextPart(text="body")],
    )
    later = Message(session_id=SID, role="user", time_created=2, parts=[TextPart(text="next")])
    view = _view([boundary, later], boundary.id)
    restored = converter_input(view)
    assert restored[0].is_boundary
    assert apply_send_rules(restored) == view.messages  # same text once the rules apply
    header = to_openai_chat([boundary])[0]["content"]
    assert isinstance(header, str)
    assert to_openai_chat(restored)[0] == {"role": "user", "content": header}
    _, turns = to_anthropic(restored)
    assert turns[0]["content"][0] == {"type": "text", "text": header}
    assert converter_input(_view([later], None)) == [later]


async def test_our_own_errors_are_never_taken_for_an_overflow(tmp_path: Path) -> None:
    """A validator error naming a call id "context_length_exceeded" propagates as it is:
    no rebuild, nothing sent."""
    async with running_middleware(tmp_path) as mw:
        await mw.open_session(SID)
        sent: list[object] = []

        def build(view: RequestView) -> object:
            raise InvalidRequestError("tool call 'context_length_exceeded' has no result")

        async def send(payload: object) -> object:
            sent.append(payload)
            return payload

        call = RecoveringCall(mw, SID, agent="main", build=build, send=send)
        with pytest.raises(InvalidRequestError):
            await call.run()
        assert sent == []
        assert not call.retried


async def test_a_second_overflow_of_one_call_is_raised(tmp_path: Path) -> None:
    async with running_middleware(tmp_path) as mw:
        await mw.open_session(SID)
        await mw.add_user_message(SID, "hi")
        errors = [RuntimeError("context_length_exceeded"), RuntimeError("prompt is too long")]

        async def send(payload: object) -> object:
            raise errors.pop(0)

        call = RecoveringCall(mw, SID, agent="main", build=lambda view: view, send=send)
        with pytest.raises(ContextOverflowError) as info:
            await call.run()
        assert str(info.value.__cause__) == "prompt is too long"
        assert errors == []
