"""Large memory files: the read and the body's checks against the plain computations.

A rebuild reads each memory file once (issue 18: a 1 MB file costs about one pass
over it). These properties pin the shortcuts that keep it so to what the
straightforward code computes: the whole file read in one buffer from its
measured size (also when it grew after it was measured), a blank test that does
not copy the text, the checkpoint's Topic line dropped by slices; and the
assembled body is counted once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import _render_files, memory
from mimo_ctx._render_files import MemoryFile
from mimo_ctx.render import RebuildSources, assemble_body
from mimo_ctx.tokens import estimate_text_tokens

_SPACES = st.text(alphabet=st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x85\xa0\u2028\u3000a_")))


@settings(max_examples=500, deadline=None)
@given(text=_SPACES)
def test_a_memory_file_is_blank_exactly_when_strip_leaves_nothing(text: str) -> None:
    assert MemoryFile("m.md", text).blank == (not text.strip())


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 40_000),
    measured=st.integers(0, 40_000),
    limit=st.one_of(st.none(), st.integers(1, 50_000)),
)
def test_the_whole_read_returns_the_file_whatever_size_was_measured(
    tmp_path_factory: pytest.TempPathFactory, size: int, measured: int, limit: int | None
) -> None:
    # ``measured`` below the size: the file grew after its fstat (read on to the
    # end); above it: it shrank. Either way the bytes from the start to the end of
    # the file, at most ``limit`` of them, after a sniff read moved the offset.
    data = bytes((i * 7919) % 251 for i in range(size))
    path = tmp_path_factory.mktemp("whole") / "m.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 8192)
        got = memory._read_whole(fd, limit, measured)  # pyright: ignore[reportPrivateUsage]
    finally:
        os.close(fd)
    assert got == (data if limit is None else data[:limit])


def test_a_large_file_reads_as_its_decoded_bytes(tmp_path: Path) -> None:
    # Above and below the sniff size, with line endings to normalise and
    # characters of every width: what reading the bytes and decoding them gives.
    line = "- entry é 中 😀 \r\n"
    for repeat in (1, 8192 // len(line.encode()), 70_000):
        text = line * repeat
        path = tmp_path / f"m{repeat}.md"
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        expected = text.replace("\r\n", "\n")
        assert memory.read_text_blocking(path, max_chars=8_000_000) == expected
        assert memory.read_text_blocking(path) == expected


_TOPIC_TEXTS = st.lists(
    st.sampled_from(
        ["Topic: a", "Topic:", " Topic: b", "Topic: 😀 é", "x", "", "\r", "## Topic: c"]
    ),
    max_size=8,
).map("\n".join)


@settings(max_examples=400, deadline=None)
@given(text=_TOPIC_TEXTS)
def test_the_checkpoint_loses_its_first_topic_line_as_by_the_substitution(text: str) -> None:
    want = _render_files._TOPIC_LINE.sub("", text, count=1)  # pyright: ignore[reportPrivateUsage]
    assert _render_files.without_topic(text) == want


class _Recording:
    """The estimator, remembering every text it counted."""

    def __init__(self) -> None:
        self.counted: list[str] = []

    def count(self, text: str) -> int:
        self.counted.append(text)
        return estimate_text_tokens(text)


def test_the_assembled_body_is_counted_once() -> None:
    # The body fits its bound: it is counted once for the fit and the figure (it
    # was counted three times: once per pass of the shrink loop, once for the figure).
    checkpoint = "Topic: t\n\n## 1. Active intent\n_Why._\n" + "- a line of work\n" * 400
    sources = RebuildSources(
        session_id="ses_1",
        checkpoint=MemoryFile("checkpoint.md", checkpoint),
        project=MemoryFile("MEMORY.md", "# Memory\n\n## Rules\n- keep it short\n"),
    )
    counter = _Recording()
    rendered = assemble_body(sources, max_tokens=1_000_000, counter=counter)
    assert rendered.text
    assert counter.counted.count(rendered.text) == 1
    assert rendered.tokens == estimate_text_tokens(rendered.text)
