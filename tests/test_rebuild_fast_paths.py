"""The rebuild's fast paths against the straightforward computations they replace.

Each fast path (issue 18: a rebuild within a few times its floor) must render
byte for byte what the plain version renders; the plain versions live here, as
the reference, and Hypothesis draws the inputs.
"""

from __future__ import annotations

import codecs
import io
import itertools
import os
import re
import stat
import tempfile
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mimo_ctx import _render_files, _structure, memory, memory_index, render, sections
from mimo_ctx._util import one_line
from mimo_ctx.checkpoint import OfflineCheckpointWriter, WriterRequest, evidence
from mimo_ctx.checkpoint import _files as checkpoint_files
from mimo_ctx.checkpoint.document import section_budgets
from mimo_ctx.checkpoint.evidence import is_continuation
from mimo_ctx.checkpoint.state import CheckpointState
from mimo_ctx.config import RebuildConfig
from mimo_ctx.memory import MemoryLayout, is_hard_link
from mimo_ctx.messages import (
    Message,
    Part,
    TextPart,
    ToolPart,
    ToolStateCompleted,
    user_input_text,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.sections import (
    HEADING_RECENT_USER,
    RecentUserInput,
    _elide,  # pyright: ignore[reportPrivateUsage]
    neutralise_structure,
    recent_user_input,
    render_section,
)
from mimo_ctx.store import InMemoryStore, Session
from mimo_ctx.store.base import Actor
from mimo_ctx.tokens import estimate_text_tokens
from mimo_ctx.triggers import ModelLimits


def user_text(message: Message) -> str:
    text = user_input_text(message)
    assert text is not None
    return text


class _WordCounter:
    """A counter that is not the estimator (the non-additive paths)."""

    def count(self, text: str) -> int:
        return len(text.split()) + text.count("\n")


def _reference_recent_user_input(
    messages: Sequence[Message],
    *,
    budget: int,
    per_message_cap: int,
    count: Callable[[str], int],
    pinned: Collection[str],
    notes: Mapping[str, str] | None,
) -> RecentUserInput:
    """Section 4 as first written: every candidate formatted, then the walk."""
    if budget == 0:
        return RecentUserInput("", frozenset())
    entries: list[tuple[int, str]] = []
    for position, message in enumerate(messages):
        text = user_input_text(message)
        if text is None:
            continue
        if count(text) > per_message_cap:
            text = _elide(text, message.id, per_message_cap, count)
        note = (notes or {}).get(message.id)
        header = f"{one_line(message.id)} — {one_line(note)}" if note else one_line(message.id)
        entries.append((position, neutralise_structure(f"[user message {header}]\n{text}")))
    wanted = set(pinned)
    order = [e for e in entries if messages[e[0]].id in wanted]
    order += [e for e in reversed(entries) if messages[e[0]].id not in wanted]
    chosen: list[tuple[int, str]] = []
    used = 0
    for position, entry in order:
        cost = count(entry) + (1 if chosen else 0)
        if used + cost > budget:
            break
        chosen.append((position, entry))
        used += cost
    chosen.sort()
    while chosen and count("\n\n".join(e for _, e in chosen)) > budget:
        chosen.pop(0)
    if not chosen:
        return RecentUserInput("", frozenset())
    text = render_section(HEADING_RECENT_USER, "\n\n".join(e for _, e in chosen))
    return RecentUserInput(text, frozenset(messages[p].id for p, _ in chosen))


_LINES = st.sampled_from(
    [
        "plain words here",
        "# Recent activity",
        "## Heading two",
        "```python",
        "~~~",
        "===",
        "---",
        "<h1>title</h1>",
        "File: somewhere.md",
        "",
        "   ",
        "😀 wide ✓ text",
        "x" * 300,
    ]
)
_TEXT = st.lists(_LINES, max_size=8).map("\n".join)


@st.composite
def _messages(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for index in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "user", "user", "synthetic", "tool", "assistant"]))
        text = draw(_TEXT)
        parts: list[Part] = [TextPart(text=text, synthetic=kind == "synthetic")]
        if kind == "tool":
            parts.append(
                ToolPart(call_id=f"c{index}", tool="bash", state=ToolStateCompleted(output="o"))
            )
        out.append(
            Message(
                id=f"msg_{index:03d}",
                session_id="ses_a",
                role="assistant" if kind == "assistant" else "user",
                time_created=index,
                parts=parts,
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(
    messages=_messages(),
    budget=st.integers(0, 600),
    per_message_cap=st.integers(0, 200),
    pin=st.lists(st.integers(0, 11), max_size=3),
    note_on=st.lists(st.integers(0, 11), max_size=3),
    word_counter=st.booleans(),
)
def test_recent_user_input_formats_lazily_as_the_reference(
    messages: list[Message],
    budget: int,
    per_message_cap: int,
    pin: list[int],
    note_on: list[int],
    word_counter: bool,
) -> None:
    counter = _WordCounter() if word_counter else None
    count = counter.count if counter is not None else estimate_text_tokens
    pinned = {f"msg_{i:03d}" for i in pin}
    notes = {f"msg_{i:03d}": "the latest request; answered" for i in note_on} or None
    fast = recent_user_input(
        messages,
        budget=budget,
        per_message_cap=per_message_cap,
        counter=counter,
        pinned=pinned,
        notes=notes,
    )
    assert fast == _reference_recent_user_input(
        messages,
        budget=budget,
        per_message_cap=per_message_cap,
        count=count,
        pinned=pinned,
        notes=notes,
    )


def test_recent_user_input_formats_only_what_the_walk_reaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fifty candidates of ~250 tokens, a budget for two: the older ones are never
    # elided or neutralised (each was, before: most of the section's cost).
    messages = [
        Message(
            id=f"msg_{i:03d}",
            session_id="ses_a",
            role="user",
            time_created=i,
            parts=[TextPart(text=f"request {i} " + "word " * 200)],
        )
        for i in range(50)
    ]
    calls: list[str] = []
    real = sections.neutralise_structure

    def counting(text: str, *, under_text: bool = False) -> str:
        calls.append(text)
        return real(text, under_text=under_text)

    # The entries are neutralised in ``sections``, the section in ``_structure``.
    monkeypatch.setattr(sections, "neutralise_structure", counting)
    monkeypatch.setattr(_structure, "neutralise_structure", counting)
    rendered = recent_user_input(messages, budget=600, per_message_cap=2_000)
    assert rendered.quoted == {"msg_048", "msg_049"}
    # Three entries walked (the third does not fit), then the section itself.
    assert len(calls) == 4


_WORDY = st.lists(
    st.sampled_from(["ok", "please", "continue", "and", "go", "on", "fix", "the", "bug", "—", "'"]),
    max_size=12,
).map(" ".join)


@settings(max_examples=400, deadline=None)
@given(text=st.one_of(_WORDY, st.text(max_size=60)))
def test_is_continuation_reads_only_the_first_words(text: str) -> None:
    # The reference: every word of the text, as first written.
    words = [w.lower().strip("'’-") for w in evidence._WORD.findall(text)]  # pyright: ignore[reportPrivateUsage]
    if not words:
        expected = True
    elif len(words) > 6:
        expected = False
    elif all(w in evidence._ACK_WORDS for w in words):  # pyright: ignore[reportPrivateUsage]
        expected = True
    else:
        lead = 0
        while lead < len(words) - 1 and words[lead] in evidence._CONTINUE_LEADS:  # pyright: ignore[reportPrivateUsage]
            lead += 1
        expected = words[lead] in evidence._CONTINUE_HEADS  # pyright: ignore[reportPrivateUsage]
    assert evidence.is_continuation(text) is expected


@pytest.mark.parametrize(
    ("openers", "expected"),
    [
        ([], 0),  # the oldest of the later requests
        (["build the parser"], 0),  # the oldest is the request: one message read
        (["ok", "continue", "build the parser", "thanks"], 2),
        (["ok"] * 25 + ["build the parser"], None),  # past the lookahead
    ],
)
async def test_the_pinned_request_is_found_as_among_the_whole_lookahead(
    openers: list[str], expected: int | None
) -> None:
    store = InMemoryStore()
    session = Session(id="ses_pin", project_id="p", time_created=0)
    await store.create_session(session)
    texts = [*openers, *(f"later request {i} with words" for i in range(60))]
    users = [
        Message(
            id=f"msg_{i:04d}",
            session_id=session.id,
            role="user",
            time_created=i + 1,
            parts=[TextPart(text=text)],
        )
        for i, text in enumerate(texts)
    ]
    await store.append_messages(users)
    firsts: list[int | None] = []
    real = store.list_user_messages

    async def counting(session_id: str, **kwargs: Any) -> list[Message]:
        firsts.append(kwargs.get("first"))
        return await real(session_id, **kwargs)

    store.list_user_messages = counting
    _, pinned = await render._user_messages(store, session.id, RebuildConfig(), None)  # pyright: ignore[reportPrivateUsage]
    # The reference: the first typed, substantive one among the oldest twenty.
    reference = next(
        (m.id for m in users[: render.PIN_LOOKAHEAD] if not is_continuation(user_text(m))),
        None,
    )
    assert pinned == (frozenset({reference}) if reference is not None else frozenset())
    assert reference == (users[expected].id if expected is not None else None)
    if expected == 0:
        assert [f for f in firsts if f is not None] == [1]


_SEGMENT = st.text(
    alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", ".."))


@settings(max_examples=300, deadline=None)
@given(root=st.lists(_SEGMENT, min_size=1, max_size=3), rest=st.lists(_SEGMENT, max_size=4))
def test_memory_index_relative_paths_as_relpath(root: list[str], rest: list[str]) -> None:
    base = Path("/", *root)
    full = os.path.join(str(base), *rest) if rest else str(base) + "x"
    expected = Path(os.path.relpath(full, base)).as_posix()
    prefix = os.path.join(str(base), "")
    assert memory_index._relative(full, base, prefix) == expected  # pyright: ignore[reportPrivateUsage]


async def test_a_rebuild_reads_the_checkpoint_the_actors_and_the_watermark_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The index part's topic comes from the checkpoint the body read, and the
    # boundary's actors part and the body's ledger from one listing (each was
    # read twice per rebuild).
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path, model=ModelLimits(1_000_000)) as mw:
        session = await mw.open_session(system="sys")
        sid = session.id
        messages = [
            Message(
                session_id=sid,
                role="user" if i % 2 == 0 else "assistant",
                time_created=1_700_000_000_000 + i,
                finish=None if i % 2 == 0 else "stop",
                parts=[TextPart(text=f"turn {i} about the parser")],
            )
            for i in range(12)
        ]
        await mw.append(messages)
        await store.upsert_actor(
            Actor(
                id="act_1",
                session_id=sid,
                agent="explore",
                description="reads the grammar",
                status="running",
                time_created=1,
                time_last_activity=1,
            )
        )
        await store.set_watermark(sid, messages[5].id)
        checkpoint = MemoryLayout(tmp_path).checkpoint_path(sid)
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_text("Topic: the parser rewrite\n\n## Active intent\n- go\n")
        reads: list[str] = []
        real_read = memory.read_text_blocking

        def counting_read(path: str | os.PathLike[str], **kwargs: Any) -> str | None:
            reads.append(os.fspath(path))
            return real_read(path, **kwargs)

        listings: list[str] = []
        real_list = store.list_actors

        async def counting_list(session_id: str, **kwargs: Any) -> list[Actor]:
            listings.append(session_id)
            return await real_list(session_id, **kwargs)

        watermarks: list[str] = []
        real_watermark = store.get_watermark

        async def counting_watermark(session_id: str) -> str | None:
            watermarks.append(session_id)
            return await real_watermark(session_id)

        monkeypatch.setattr(_render_files, "read_text_blocking", counting_read)
        # The rebuild's own reads: the offline writer's checkpoint check (checkpoint/_files).
        monkeypatch.setattr(checkpoint_files, "read_text_blocking", counting_read)
        store.list_actors = counting_list
        store.get_watermark = counting_watermark
        report = await mw.rebuild(sid)
        assert report.outcome == "rebuilt"
        assert reads.count(str(checkpoint)) == 1
        assert len(listings) == 1
        # No writer was asked for or waited for: the watermark is read once.
        assert len(watermarks) == 1
        boundary = await store.get_message(report.boundary_id or "")
        assert boundary is not None
        text = "\n".join(p.text for p in boundary.parts if isinstance(p, TextPart))
        assert "Current topic: the parser rewrite" in text
        assert "act_1" in text


def _reference_scan(
    directory: Path, root_real: str, root: Path
) -> tuple[list[tuple[str, str, int, int]], int]:
    """The memory index's scan as first written: os.walk, lstat, stat, relpath."""
    base_real = os.path.realpath(directory)
    if not memory_index._inside(base_real, root_real) or not os.path.isdir(base_real):  # pyright: ignore[reportPrivateUsage]
        return [], 0
    seen: list[tuple[str, str, int, int]] = []
    skipped = 0
    for dirpath, _dirnames, filenames in os.walk(directory, followlinks=False):
        for name in filenames:
            if name.startswith(".") or os.path.splitext(name)[1].lower() not in {".md", ".txt"}:
                continue
            full = os.path.join(dirpath, name)
            real = full
            if os.path.islink(full):
                real = os.path.realpath(full)
                if not memory_index._inside(real, root_real):  # pyright: ignore[reportPrivateUsage]
                    skipped += 1
                    continue
            try:
                info = os.stat(real)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if is_hard_link(info):
                skipped += 1
                continue
            rel = Path(os.path.relpath(full, root)).as_posix()
            seen.append((rel, real, info.st_size, info.st_mtime_ns))
    return seen, skipped


_NAMES = st.sampled_from(
    ["a.md", "B.MD", "c.txt", "d.Txt", "e", "f.md.bak", ".hidden.md", "g.x.md", "h.", "i..md"]
)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.lists(
        st.tuples(
            st.sampled_from(["", "sub", "sub/deeper", "other"]),
            _NAMES,
            st.sampled_from(
                ["file", "file", "dir", "link-in", "link-out", "link-dir", "broken", "hard"]
            ),
            st.booleans(),
        ),
        max_size=14,
    )
)
def test_memory_index_scan_lists_as_os_walk_did(layout: list[tuple[str, str, str, bool]]) -> None:
    with tempfile.TemporaryDirectory() as base:
        root = Path(base, "root").resolve()
        outside = Path(base, "outside")
        outside.mkdir()
        (outside / "secret.md").write_text("x")
        scope_dir = root / "projects" / "p"
        (scope_dir / "sub" / "deeper").mkdir(parents=True)
        (scope_dir / "other").mkdir()
        target = root / "target.md"
        target.write_text("target")
        for number, (where, name, kind, hidden) in enumerate(layout):
            # A hidden name starts with the dot (".3a.md", ".3.hidden.md").
            path = scope_dir / where / f"{'.' if hidden else ''}{number}{name}"
            if kind == "file":
                path.write_text("y" * number)
            elif kind == "dir":
                path.mkdir()
                (path / "inner.md").write_text("z")
            elif kind == "link-in":
                path.symlink_to(target)
            elif kind == "link-out":
                path.symlink_to(outside / "secret.md")
            elif kind == "link-dir":
                path.symlink_to(scope_dir / "sub", target_is_directory=True)
            elif kind == "broken":
                path.symlink_to(root / "missing.md")
            else:
                path.write_text("h")
                os.link(path, scope_dir / where / f"{number}-again{name}")
        scope = memory_index._Scope("project", "p", scope_dir)  # pyright: ignore[reportPrivateUsage]
        seen, skipped = memory_index._scan(scope, str(root), root)  # pyright: ignore[reportPrivateUsage]
        got = [(s.path, s.real, s.size, s.mtime_ns) for s in seen]
        assert (got, skipped) == _reference_scan(scope.directory, str(root), root)


_STRUCTURE = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "plain words",
                "# Recent activity",
                "## Session checkpoint ##",
                "   # loose",
                "#",
                "#nospace",
                "## Project rules",
                "Recent user input",
                "===",
                "  ---  ",
                "- item",
                "```",
                "~~~~ info",
                "   ```py",
                "<h1>title",
                "<H2 class=x>",
                "<h3>",
                "File: x.md",
                "  File: y",
                "",
                "   ",
                "\u00a0",
                "a\rb",
                "c\r\nd",
                "e\x0bf\u2028g",
                "- # in a list",
                "> ## Checkpoint",
                "1. Recent activity",
                "- ",
                "<!-- note",
                "<div>",
                "  <pre>",
            ]
        ),
        st.text(alphabet="#=-`~<h12 \tFile:\n\r>*+.)!", max_size=12),
    ),
    max_size=12,
).map("\n".join)


@settings(max_examples=2000, deadline=None)
@given(text=_STRUCTURE)
@example(text="    <!-- deep")  # raw HTML four spaces deep: the scans missed it
def test_structure_fast_paths_as_line_by_line(text: str) -> None:
    for under_text in (False, True):
        slow = _structure._neutralise_lines(text, under_text=under_text) if text else text  # pyright: ignore[reportPrivateUsage]
        assert neutralise_structure(text, under_text=under_text) == slow
    assert _structure.strip_level1_headings(text) == _structure._strip_level1_lines(text)  # pyright: ignore[reportPrivateUsage]


# Lines that open, nest and close list items, fences and HTML blocks at several
# depths, so what a line reads from the lines above it (the items open, the fence,
# an HTML block, the title an underline makes) is exercised across long texts.
_CONTEXT_LINES = st.sampled_from(
    [
        "plain words",
        "# Recent activity",
        "## Session checkpoint ##",
        "   # loose",
        "#",
        "## Project rules",
        "Recent user input",
        "Session",
        "checkpoint",
        "===",
        "  ---  ",
        "-",
        "- item",
        "  - sub",
        "    - deep",
        "1. one",
        "   2) two",
        "> quote",
        ">#",
        "> - # x",
        "```",
        "~~~~ info",
        "   ```py",
        "    ```",
        "<h1>title",
        "x <h2>y",
        "File: x.md",
        "  File: y",
        "",
        "   ",
        "\u00a0",
        "- # in a list",
        "1. Recent activity",
        "<!-- note",
        "    <!-- deep",
        "<div>",
        "  <pre>",
        "      # deep hash",
        "- -> int",
        "- = x",
        "  text",
        "      text",
        "* a",
    ]
)
_CONTEXT = st.lists(
    st.one_of(_CONTEXT_LINES, st.text(alphabet="#=-`~<h12 File:>*+.)!", max_size=10)),
    max_size=40,
).map("\n".join)


@settings(max_examples=3000, deadline=None)
@given(text=_CONTEXT)
def test_neutralising_only_the_candidate_lines_as_line_by_line(text: str) -> None:
    # The pass that looks only at the lines a rule may change, against the pass over
    # every line: the same text, whatever the lines around each candidate hold.
    for under_text in (False, True):
        slow = _structure._neutralise_lines(text, under_text=under_text)  # pyright: ignore[reportPrivateUsage]
        fast = _structure._neutralise_candidates(text, under_text=under_text)  # pyright: ignore[reportPrivateUsage]
        assert fast == slow
        assert neutralise_structure(text, under_text=under_text) == (slow if text else text)


_BYTES = st.lists(
    st.one_of(
        st.binary(max_size=12),
        st.sampled_from([b"\r", b"\n", b"\r\n", b"\xef\xbb\xbf", b"\xe2\x82", b"\xac", b"\xff"]),
        st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass")),
    ),
    max_size=20,
).map(b"".join)


@settings(max_examples=1500, deadline=None)
@given(data=_BYTES, cuts=st.lists(st.integers(0, 200), max_size=4))
@example(data=b"\xef", cuts=[])  # a lone start of a byte-order mark is U+FFFD, not dropped
@example(data=b"\xef\xbb", cuts=[1])
def test_a_whole_file_decodes_as_the_incremental_decoder(data: bytes, cuts: list[int]) -> None:
    # The reference: a UTF-8 decoder fed in pieces, as bounded reads do, and one
    # leading byte-order mark dropped. Not CPython's incremental "utf-8-sig": at the
    # end of its input it drops bytes that start a mark (b"\xef" gives "").
    decoder = io.IncrementalNewlineDecoder(
        codecs.getincrementaldecoder("utf-8")(errors="replace"), translate=True
    )
    edges = [0, *sorted(c for c in cuts if c < len(data)), len(data)]
    pieces = [decoder.decode(data[a:b]) for a, b in itertools.pairwise(edges)]
    pieces.append(decoder.decode(b"", final=True))
    expected = "".join(pieces).removeprefix("\ufeff")
    assert memory._decode_whole(data) == expected  # pyright: ignore[reportPrivateUsage]


async def test_the_writer_state_is_read_and_parsed_once_per_body_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The offline writer's state file (it grows with the session) was read and
    # parsed on the event loop twice per body: for the checkpoint brought up to
    # now and again for the open work (the soak's tail grew with it). Now one
    # worker-thread call reads every file and parses the state once.
    session_id = "ses_state_once_000000000000000"
    store = InMemoryStore()
    session = Session(id=session_id, time_created=1_700_000_000_000)
    await store.create_session(session)
    layout = MemoryLayout(tmp_path / "mem")
    messages = [
        Message(
            session_id=session_id,
            role="user" if i % 2 == 0 else "assistant",
            time_created=1_700_000_000_000 + i,
            finish=None if i % 2 == 0 else "stop",
            parts=[TextPart(text=f"turn {i}: rename handler_{i}")],
        )
        for i in range(8)
    ]
    await store.append_messages(messages)
    watermark = messages[3]
    draft = OfflineCheckpointWriter().build(
        WriterRequest(
            session_id=session_id,
            project_id=session.project_id,
            watermark=watermark.id,
            messages=messages[:4],
            previous_checkpoint=None,
            notes=None,
            tasks=[],
            checkpoint_path=layout.checkpoint_path(session_id),
            project_memory_path=layout.project_memory_path(session.project_id),
            notes_path=layout.notes_path(session_id),
            tasks_dir=layout.tasks_dir(session_id),
            budgets=section_budgets(),
        )
    )
    assert draft.state is not None
    await memory.write_text_atomic(layout.checkpoint_path(session_id), draft.text)
    await memory.write_text_atomic(layout.checkpoint_state_path(session_id), draft.state)
    parses: list[bool] = []
    real_parse = CheckpointState.from_json.__func__  # pyright: ignore[reportFunctionMemberAccess]

    def counting_parse(cls: type[CheckpointState], text: str | None) -> CheckpointState | None:
        parses.append(threading.current_thread() is threading.main_thread())
        return real_parse(cls, text)

    monkeypatch.setattr(CheckpointState, "from_json", classmethod(counting_parse))
    sources = await render.gather_sources(
        store=store, layout=layout, session=session, tail=messages[4:]
    )
    assert parses == [False]  # once, in a worker thread
    # The state matched its checkpoint: the tail was folded in (the newest turn shows).
    assert "handler_7" in sources.checkpoint.text


async def test_reconciled_paths_is_reconcile_then_paths(tmp_path: Path) -> None:
    # One worker-thread call for the rebuild's memory keys index: the same paths
    # as the two calls it replaces, after every kind of change on disk.
    layout = MemoryLayout(tmp_path / "mem")
    session_id, project_id = "ses_paths_00000000000000000000", "proj"
    files = {
        layout.checkpoint_path(session_id): "Topic: x\n",
        layout.session_dir(session_id) / "topics" / "a.md": "# A\n",
        layout.session_dir(session_id) / "checkpoint-learning-1.md": "learnt\n",
        layout.project_memory_path(project_id): "# Memory\n",
        layout.project_dir(project_id) / "b.md": "# B\n",
        layout.project_dir(project_id) / "c.txt": "not listed\n",
        layout.global_memory_path(): "# Memory\n",
        layout.global_dir() / "d.md": "# D\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    async with memory_index.MemoryIndex() as one, memory_index.MemoryIndex() as two:
        for change in range(3):
            if change == 1:
                (layout.project_dir(project_id) / "b.md").unlink()
                (layout.session_dir(session_id) / "new.md").write_text("# New\n")
            if change == 2:
                (layout.global_dir() / "d.md").write_text("# D, longer now\n")
            await one.reconcile(layout, session_id=session_id, project_id=project_id)
            expected = await one.paths(session_id, project_id)
            got = await two.reconciled_paths(layout, session_id=session_id, project_id=project_id)
            assert got == expected
            assert f"sessions/{session_id}/checkpoint.md" not in got


_BREAKS_REFERENCE = re.compile("\r\n?|[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


@settings(max_examples=400)
@given(
    st.text(
        alphabet=st.one_of(
            st.sampled_from("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029 a#-é😀"), st.characters()
        ),
        max_size=60,
    )
)
def test_normalise_line_breaks_is_the_plain_substitution(text: str) -> None:
    # Texts without any other line break skip the regex (it tried every position:
    # a third of a millisecond per 40 KB section, several times per section).
    assert _structure.normalise_line_breaks(text) == _BREAKS_REFERENCE.sub("\n", text)
    assert _structure.normalise_line_breaks(text.encode("ascii", "ignore").decode()) == (
        _BREAKS_REFERENCE.sub("\n", text.encode("ascii", "ignore").decode())
    )


def test_a_bounded_read_of_a_cut_byte_order_mark_keeps_it_as_a_replacement(
    tmp_path: Path,
) -> None:
    # Two bytes that start a byte-order mark and end the file: the bounded read
    # (the file is longer than the one character asked for) answers what the whole
    # read does, U+FFFD, where CPython's incremental "utf-8-sig" decoder gave "".
    path = tmp_path / "MEMORY.md"
    path.write_bytes(b"\xef\xbb")
    whole = memory.read_text_blocking(path)
    assert whole == "\ufffd"
    assert memory.read_text_blocking(path, max_chars=1) == whole
