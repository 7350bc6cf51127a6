"""The rebuild body's fast paths against the plain computations they replace (issue 18).

Each must give byte for byte what the plain version gives (or raise the same
error): the plain versions live here, as the reference, and Hypothesis draws the
inputs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mimo_ctx import _user_pages, render
from mimo_ctx._util import escape_path
from mimo_ctx.config import PushCaps, RebuildConfig
from mimo_ctx.errors import PathEscapeError
from mimo_ctx.messages import CheckpointPart, Message, Part, TextPart, message_key
from mimo_ctx.sections import (
    HEADING_MEMORY_KEYS,
    render_memory_keys_index,
    render_section,
)
from mimo_ctx.store import InMemoryStore, Session
from mimo_ctx.store._reads import RebuildReadRequest, read_one_by_one
from mimo_ctx.tokens import TokenCounter, count_with


class _WordCounter:
    """A counter that is not the estimator."""

    def count(self, text: str) -> int:
        return len(text.split()) + text.count("\n")


def _plain_keys_index(paths: Sequence[str], budget: int, counter: TokenCounter | None) -> str:
    """Section 8 as first written: every path checked and formatted, then the fit."""
    seen: set[str] = set()
    lines: list[str] = []
    for path in paths:
        parts = path.replace("\\", "/").split("/")
        if not path or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
            raise PathEscapeError(f"memory key path must be relative to the memory root: {path!r}")
        if ".." in parts:
            raise PathEscapeError(f"memory key path escapes the memory root: {path!r}")
        if path not in seen:
            seen.add(path)
            lines.append(f"- {escape_path(path)}")
    count = count_with(counter)
    kept: list[str] = []
    for line in lines:
        if count("\n".join([*kept, line])) > budget:
            break
        kept.append(line)
    return render_section(HEADING_MEMORY_KEYS, "\n".join(kept)) if kept else ""


def _outcome(render: object) -> tuple[str, str]:
    assert callable(render)
    try:
        return "ok", str(render())
    except PathEscapeError as exc:
        return "error", str(exc)


_COMPONENTS = st.sampled_from(
    ["a", "b.md", "..", ".", "...", "..x", "x..", "C:", "é", "😀", "a\nb", "<h1>", ""]
)


def _joined(parts: list[str], separator: str) -> str:
    return separator.join(parts)


_PATHS = st.one_of(
    st.builds(_joined, st.lists(_COMPONENTS, min_size=1, max_size=4), st.sampled_from(["/", "\\"])),
    st.text(alphabet=st.sampled_from("ab./\\:C\n"), max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(
    paths=st.lists(_PATHS, max_size=30),
    budget=st.integers(min_value=0, max_value=60),
    words=st.booleans(),
)
@example(paths=["a/..\n"], budget=50, words=False)  # not a ".." component
@example(paths=["ok.md", "x/../y"], budget=0, words=False)  # checked past the budget
def test_memory_keys_index_as_every_line_formatted(
    paths: list[str], budget: int, words: bool
) -> None:
    counter = _WordCounter() if words else None
    expected = _outcome(lambda: _plain_keys_index(paths, budget, counter))
    got = _outcome(lambda: render_memory_keys_index(paths, budget=budget, counter=counter))
    assert got == expected


# --------------------------------------------------------------------------- user pages

_USER_TEXTS = st.sampled_from(["ok", "continue", "build the parser", "", "x " * 900, "fix it"])


@st.composite
def _histories(draw: st.DrawFn) -> list[Message]:
    """Main-agent messages with user turns, boundaries and ties in creation time."""
    out: list[Message] = []
    clock = 1_000
    for number in range(draw(st.integers(min_value=0, max_value=40))):
        clock += draw(st.sampled_from([0, 1, 5]))
        kind = draw(st.sampled_from(["user", "user", "assistant", "boundary", "synthetic"]))
        parts: list[Part]
        if kind == "boundary":
            parts = [CheckpointPart(covered_up_to="msg_0000", directory="d", number=1)]
        elif kind == "synthetic":
            parts = [TextPart(text="reminder", synthetic=True)]
        else:
            parts = [TextPart(text=draw(_USER_TEXTS))]
        out.append(
            Message(
                id=f"msg_{draw(st.integers(min_value=0, max_value=9999)):04d}_{number:03d}",
                session_id="ses_pages",
                role="assistant" if kind == "assistant" else "user",
                time_created=clock,
                parts=parts,
            )
        )
    return out


async def _pages_run(
    history: list[Message], cut: int | None, window: int, cap: int, page: int
) -> None:
    store = InMemoryStore()
    await store.create_session(Session(id="ses_pages", project_id="p", time_created=0))
    await store.append_messages(history)
    listed = sorted(history, key=message_key)
    after = None if cut is None else message_key(listed[cut % len(listed)]) if listed else None
    users = [
        m
        for m in listed
        if m.role == "user" and not m.is_boundary and (after is None or message_key(m) > after)
    ]
    config = RebuildConfig(
        recent_user_window=window, push_caps=PushCaps(recent_user=cap, recent_user_per_msg=400)
    )
    read: list[int] = []
    real = store.list_user_messages

    async def counting(session_id: str, **kwargs: Any) -> list[Message]:
        got = await real(session_id, **kwargs)
        read.append(len(got))
        return got

    store.list_user_messages = counting
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render, "USER_PAGE", page)
        patch.setattr(_user_pages, "USER_PAGE", page)
        plain = await render._user_messages(store, "ses_pages", config, None)  # pyright: ignore[reportPrivateUsage]
        from_store = sum(read)
        read.clear()
        live = render.LiveUsers(after=after, messages=users)
        held = await render._user_messages(store, "ses_pages", config, None, live)  # pyright: ignore[reportPrivateUsage]
        calls = len(read)
        # The first reads made beforehand, with the rebuild's other reads.
        first = _user_pages.first_user_reads(live, config)
        request = RebuildReadRequest("ses_pages", (0, ""), users=first)
        known = (await read_one_by_one(store, request)).users
        read.clear()
        prefetched = await render._user_messages(  # pyright: ignore[reportPrivateUsage]
            store, "ses_pages", config, None, live, known=known
        )
    assert [m.id for m in held[0]] == [m.id for m in plain[0]]
    assert held[1] == plain[1]
    assert sum(read) <= from_store  # what the window holds is not read again
    assert [m.id for m in prefetched[0]] == [m.id for m in plain[0]]
    assert prefetched[1] == plain[1]
    assert len(read) == calls - len(first)  # none of them is made again


@settings(max_examples=300, deadline=None)
@given(
    history=_histories(),
    cut=st.none() | st.integers(min_value=0, max_value=60),
    window=st.integers(min_value=0, max_value=30),
    cap=st.sampled_from([0, 50, 400, 3000]),
    page=st.integers(min_value=1, max_value=6),
)
def test_user_pages_from_the_window_as_from_the_store(
    history: list[Message], cut: int | None, window: int, cap: int, page: int
) -> None:
    anyio.run(_pages_run, history, cut, window, cap, page)
