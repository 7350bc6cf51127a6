"""The wrappers hand their SDK one list per session, brought up to date in O(new) (issue 16).

A new list per call would copy the whole history every call and, while the SDK
works, be one more whole-history list for every collection to walk. The real SDKs
over ``httpx2.MockTransport``: each request body is still exactly the managed view
(the Anthropic conversation breakpoint on the last turn only, however it moves),
and what a forked checkpoint writer keeps of a request stays as it was sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from fake_servers import LIMITS, MESSAGES, FakeProvider, Reply, anthropic_client

from mimo_ctx import CheckpointDraft, ContextMiddleware, OfflineCheckpointWriter, WriterRequest
from mimo_ctx.providers import wrap_anthropic
from mimo_ctx.store import InMemoryStore

SID = "ses_sent_list"


class _KeepingWriter(OfflineCheckpointWriter):
    """The offline writer; ``requests`` keeps what each run was given."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[WriterRequest] = []

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        self.requests.append(request)
        return await super().write(request)


def _markers(body: dict[str, Any]) -> list[int]:
    """The turns of a request body that carry a ``cache_control`` marker."""
    out: list[int] = []
    for index, turn in enumerate(body["messages"]):
        content = turn["content"]
        blocks = cast("list[dict[str, Any]]", content) if isinstance(content, list) else []
        if any("cache_control" in block for block in blocks):
            out.append(index)
    return out


async def test_one_list_every_call_and_every_body_is_the_view(tmp_path: Path) -> None:
    fake = FakeProvider()
    raw = anthropic_client(fake)
    seen: list[list[Any]] = []
    create: Any = raw.messages.create

    async def spy(**kwargs: Any) -> Any:
        seen.append(kwargs["messages"])
        return await create(**kwargs)

    raw.messages.create = spy  # type: ignore[method-assign]
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        client: Any = wrap_anthropic(raw, mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Read a.py."}]
        for turn in range(4):
            fake.add(Reply(text=f"Answer {turn}."))
            reply = await client.messages.create(model="m", max_tokens=64, messages=host)
            host += [
                {"role": "assistant", "content": reply.content[0].text},
                {"role": "user", "content": f"Next {turn}."},
            ]
    assert all(sent is seen[0] for sent in seen)
    bodies = fake.bodies(MESSAGES)
    for number, body in enumerate(bodies):
        assert len(body["messages"]) == 2 * number + 1
        assert _markers(body) == [2 * number]  # the last turn only
        texts = [
            turn["content"] if isinstance(turn["content"], str) else turn["content"][0]["text"]
            for turn in body["messages"]
        ]
        expected = ["Read a.py."]
        for earlier in range(number):
            expected += [f"Answer {earlier}.", f"Next {earlier}."]
        assert texts == expected


async def test_a_forked_writer_keeps_the_request_as_it_was_sent(tmp_path: Path) -> None:
    fake = FakeProvider()
    writer = _KeepingWriter()
    async with ContextMiddleware(
        InMemoryStore(), tmp_path / "mem", model=LIMITS, writer=writer
    ) as mw:
        client: Any = wrap_anthropic(anthropic_client(fake), mw, session_id=SID)
        host: list[Any] = [{"role": "user", "content": "Read a.py."}]
        fake.add(Reply(text="Reading."))
        reply = await client.messages.create(model="m", max_tokens=64, messages=host)
        assert await mw.start_writer(SID) == "started"
        assert await mw.wait_for_writer(SID, timeout=30) == "finished"
        (request,) = writer.requests
        assert request.last_request is not None
        assert request.last_request.payload is not None
        kept = request.last_request.payload["messages"]
        (first,) = fake.bodies(MESSAGES)
        assert kept == first["messages"]
        host += [
            {"role": "assistant", "content": reply.content[0].text},
            {"role": "user", "content": "Now b.py."},
        ]
        fake.add(Reply(text="Reading b."))
        await client.messages.create(model="m", max_tokens=64, messages=host)
        assert kept == first["messages"]
        assert len(fake.bodies(MESSAGES)[1]["messages"]) == 3
