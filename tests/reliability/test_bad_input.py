"""Bad input (issue 10 §3): binary and invalid-UTF-8 memory files, 100 MB files,
absurd configurations, malformed transcripts, 10 MB tool outputs, deeply nested
and non-string tool arguments, empty sessions, sessions with only sub-agents.

Each case has a defined result: a clear :class:`~mimo_ctx.errors.MimoCtxError`
naming the problem, or a documented degradation -- never a raw traceback, never
a silently lost message.
"""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mimo_ctx._render_files import MAX_FILE_CHARS
from mimo_ctx.config import load_config
from mimo_ctx.digest import build_tail_digest
from mimo_ctx.errors import (
    ConfigError,
    ContextOverflowError,
    InvalidRequestError,
    MimoCtxError,
    StoreError,
    TranscriptError,
)
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import (
    Message,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStatePending,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers.anthropic import to_anthropic
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.store import InMemoryStore, SQLiteStore, Store
from mimo_ctx.testing import FakeOverflowError, ScriptedModel, ScriptStep
from mimo_ctx.tokens import UNSERIALISABLE_PART_TOKENS, estimate_message_tokens
from mimo_ctx.triggers import ModelLimits

from .conftest import (
    LIMITS,
    SYSTEM,
    assistant_with_tool,
    body_text,
    boundaries,
    fill_to_trigger,
    now_ms,
    user,
)
from .test_faults import cross_line, prime_checkpoint

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _drop_big_files(tmp_path: Path) -> Iterator[None]:
    """pytest keeps recent temporary directories: do not keep 100 MiB files in them."""
    yield
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size > MiB:
            path.unlink()


def request_is_valid(view_messages: list[Message], system: str) -> None:
    """The request can be sent: valid for the provider, JSON-encodable as UTF-8."""
    payload = to_openai_chat(view_messages, system=system)
    validate_request(payload, format="openai-chat")
    json.dumps(payload, ensure_ascii=False).encode("utf-8")


# --------------------------------------------------------------------------- memory files


@pytest.mark.parametrize("which", ["notes", "project", "global", "checkpoint"])
async def test_binary_memory_file_is_left_out(store: Store, tmp_path: Path, which: str) -> None:
    """A binary file (NUL bytes) is not text: its section is left out, the rest of
    the body is rendered and the request stays valid. Nothing on disk changes."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        target = {
            "notes": mw.layout.notes_path(session.id),
            "project": mw.layout.project_memory_path(session.project_id),
            "global": mw.layout.global_memory_path(),
            "checkpoint": mw.layout.checkpoint_path(session.id),
        }[which]
        target.parent.mkdir(parents=True, exist_ok=True)
        blob = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 64
        target.write_bytes(blob)
        await cross_line(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        body = body_text(view.messages[0])
        assert f"File: {target}" not in body
        assert "\x00" not in body
        assert "Refactor every module. Never touch tests." in body
        request_is_valid(view.messages, SYSTEM)
        assert target.read_bytes() == blob


@pytest.mark.parametrize("which", ["notes", "project", "checkpoint"])
async def test_invalid_utf8_memory_file_is_read_with_replacements(
    store: Store, tmp_path: Path, which: str
) -> None:
    """Invalid UTF-8 bytes become U+FFFD; the section is shown, the request encodes."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        target = {
            "notes": mw.layout.notes_path(session.id),
            "project": mw.layout.project_memory_path(session.project_id),
            "checkpoint": mw.layout.checkpoint_path(session.id),
        }[which]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(
            b"Topic: caf\xe9 latin-1\n\n## Rules\n"
            b"- keep the caf\xe9 \xff\xfe\xed\xa0\x80 marker ZQX\n"
        )
        await cross_line(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        body = body_text(view.messages[0])
        # Notes are folded into the checkpoint's Open notes by the writer run that
        # brings the offline checkpoint up to now before the rebuild (A14).
        shown = mw.layout.checkpoint_path(session.id) if which == "notes" else target
        assert f"File: {shown}" in body
        assert "caf\ufffd" in body
        assert "marker ZQX" in body
        request_is_valid(view.messages, SYSTEM)


def _write_big(path: Path, size: int, *, head: str = "") -> None:
    """A markdown file of ``size`` bytes: ``head``, then 80-character lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (
        "- lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod " + "x" * 80
    )[:79] + "\n"
    chunk = (line * 13_000).encode()
    with path.open("wb") as handle:
        handle.write(head.encode())
        written = len(head)
        while written < size:
            handle.write(chunk)
            written += len(chunk)


PEAK_BOUND = 96 * MiB
"""Peak Python allocation allowed for a rebuild with one 100 MiB memory file: the
body reads at most MAX_FILE_CHARS (8M) characters of it and the memory index at
most MAX_FILE_BYTES (16 MiB), so the peak is a constant, below the file's size."""


async def _rebuild_peak(mw: ContextMiddleware, session_id: str) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        view = await mw.prepare(session_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, view


@pytest.mark.parametrize("which", ["notes", "project"])
async def test_100mb_memory_file_read_with_bounded_memory(tmp_path: Path, which: str) -> None:
    """A 100 MiB notes.md or MEMORY.md: at most MAX_FILE_CHARS characters are read,
    the section stays within its cap, and the rebuild's peak allocation is bounded
    (well under the file's size), whatever the file's size."""
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        target = (
            mw.layout.notes_path(session.id)
            if which == "notes"
            else mw.layout.project_memory_path(session.project_id)
        )
        head = (
            "" if which == "notes" else "# Memory\n\n## Rules\n_The rules._\n- rule one\n\n## Log\n"
        )
        _write_big(target, 100 * MiB, head=head)
        await cross_line(mw, session.id)
        peak, view = await _rebuild_peak(mw, session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        key = "notes" if which == "notes" else "memory"
        figure = next(f for f in view.rebuild.sections.sections if f.key == key)
        cap = getattr(mw.config.push_caps, key)
        assert 0 < figure.tokens <= cap + 100  # heading, File: line and notice
        assert peak < PEAK_BOUND, f"peak {peak / MiB:.1f} MiB"
        assert 100 * MiB > MAX_FILE_CHARS


async def test_100mb_checkpoint_read_with_bounded_memory(tmp_path: Path) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await prime_checkpoint(mw, session.id)
        checkpoint = mw.layout.checkpoint_path(session.id)
        head = checkpoint.read_text() + "\n## 12. Giant appendix\n_Grown without bound._\n"
        _write_big(checkpoint, 100 * MiB, head=head)
        await cross_line(mw, session.id)
        peak, view = await _rebuild_peak(mw, session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        figure = next(f for f in view.rebuild.sections.sections if f.key == "checkpoint")
        assert 0 < figure.tokens <= mw.config.push_caps.checkpoint + 100
        assert peak < PEAK_BOUND, f"peak {peak / MiB:.1f} MiB"


async def test_writer_reads_huge_notes_with_bounded_memory(tmp_path: Path) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=80_000)
        notes = mw.layout.notes_path(session.id)
        _write_big(notes, 24 * MiB)
        tracemalloc.start()
        try:
            assert await mw.start_writer(session.id, reason="big notes") == "started"
            assert await mw.wait_for_writer(session.id, timeout=120) == "finished"
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < PEAK_BOUND, f"peak {peak / MiB:.1f} MiB"
        # Whatever was not folded into the checkpoint is still in notes.md.
        assert (
            notes.stat().st_size > 0
            or mw.layout.session_dir(session.id).joinpath("checkpoint-open-notes.md").stat().st_size
            > 20 * MiB
        )


# --------------------------------------------------------------------------- configuration


BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    ({"push_caps": {"memory": -1}}, "checkpoint.push_caps.memory"),
    ({"push_caps": {"notes": "lots"}}, "checkpoint.push_caps.notes"),
    ({"push_caps": {"checkpoint": 1.5}}, "checkpoint.push_caps.checkpoint"),
    ({"push_caps": {"memory_titles": None}}, "checkpoint.push_caps.memory_titles"),
    ({"push_caps": {"global": True}}, "checkpoint.push_caps.global"),
    ({"push_caps": {"colour": 3}}, "checkpoint.push_caps.colour: unknown key"),
    ({"push_caps": "all"}, "checkpoint.push_caps"),
    ({"trigger_ratio": 0}, "checkpoint.trigger_ratio"),
    ({"trigger_ratio": 1e308}, "checkpoint.trigger_ratio"),
    ({"trigger_ratio": float("nan")}, "checkpoint.trigger_ratio"),
    ({"max_context": "-5"}, "checkpoint.max_context"),
    ({"max_context": "150%"}, "checkpoint.max_context"),
    ({"max_context": float("inf")}, "checkpoint.max_context"),
    ({"writer": {"thresholds": ["40%", "abc"]}}, "checkpoint.writer.thresholds"),
    ({"writer": {"wait_with_watermark": -1}}, "checkpoint.writer.wait_with_watermark"),
    ({"writer": {"ensure_wait_auto": float("nan")}}, "checkpoint.writer.ensure_wait_auto"),
    ({"micro_compact_tools": "read"}, "checkpoint.micro_compact_tools"),
    ({"micro_compact_tools": [1, 2]}, "checkpoint.micro_compact_tools.0"),
    ({"activity_arg_chars": 1}, "checkpoint.activity_arg_chars"),
    ({"total_cap": -1}, "checkpoint.total_cap"),
    ({"recent_user_window": -3}, "checkpoint.recent_user_window"),
    ({"min_freed_fraction": 2}, "checkpoint.min_freed_fraction"),
    ({"tail": {"min_tokens": -10}}, "checkpoint.tail.min_tokens"),
]


@pytest.mark.parametrize(("settings", "key"), BAD_CONFIGS, ids=[k for _, k in BAD_CONFIGS])
def test_r9_1_absurd_config_names_the_key(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"checkpoint": settings})
    assert key in str(info.value)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ([], "must be a mapping"),
        ({"checkpoint": [], "x": 1}, "x: unknown key"),
        ("does-not-exist.toml", "cannot read config file"),
    ],
)
def test_r9_1_absurd_config_sources(source: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(source)


def test_r9_1_config_file_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "mimo.toml"
    path.write_bytes(b"\xff\xfe[checkpoint\n")
    with pytest.raises(ConfigError, match="cannot parse config file"):
        load_config(path)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (-5, "context_window"),
        (0, "context_window"),
        ("200k", "context_window"),
        (None, "context_window"),
        (1.5, "context_window"),
        (True, "context_window"),
        (float("nan"), "context_window"),
        (float("inf"), "context_window"),
    ],
)
def test_absurd_model_limits_name_the_field(tmp_path: Path, model: Any, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=model)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"input_limit": "x"}, "input_limit"),
        ({"input_limit": -1}, "input_limit"),
        ({"max_output_tokens": -1}, "max_output_tokens"),
        ({"max_output_tokens": 2.5}, "max_output_tokens"),
    ],
)
def test_absurd_model_limit_fields(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ModelLimits(100_000, **kwargs)


async def test_huge_config_values_work_on_sqlite(sqlite_store: SQLiteStore, tmp_path: Path) -> None:
    """Caps and windows far beyond SQLite's 64-bit integers mean "no limit"."""
    config = load_config(
        {
            "checkpoint": {
                "recent_user_window": 10**20,
                "activity_max_lines": 10**20,
                "total_cap": 10**30,
                "push_caps": {"checkpoint": 10**40, "recent_user": 10**40, "notes": 10**40},
            }
        }
    )
    async with ContextMiddleware(sqlite_store, tmp_path / "mem", model=LIMITS, config=config) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"


async def test_absurd_timestamp_is_a_store_error(sqlite_store: SQLiteStore, tmp_path: Path) -> None:
    async with ContextMiddleware(sqlite_store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        with pytest.raises(StoreError, match="too large"):
            await mw.append([user(session.id, "from the far future", at=10**30)])
        assert await sqlite_store.count_messages(session.id) == 0


# --------------------------------------------------------------------------- transcripts


def _deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


MALFORMED_TRANSCRIPTS: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("blank", b"\n\n   \n"),
    ("binary", b"\x00\x01\x02\xff" * 1000),
    ("not-utf8", b'{"role": "user", "content": "caf\xe9"}\n'),
    (
        "truncated-jsonl",
        b'{"type": "user", "message": {"role": "user", "content": "hi"}}\n{"type": "ass',
    ),
    ("json-scalar", b"42\n"),
    ("array-of-numbers", b"[1, 2, 3]"),
    ("deep-nesting", _deep_json(100_000).encode()),
    ("deep-nesting-line", b'{"role": "user", "content": ' + _deep_json(50_000).encode() + b"}\n"),
    ("ten-mb-line", b'{"role": "user", "content": "' + b"a" * (10 * MiB) + b"\n"),
    ("nan", b'{"messages": [{"role": "user", "content": NaN}]}'),
]


@pytest.mark.parametrize(
    ("name", "data"), MALFORMED_TRANSCRIPTS, ids=[n for n, _ in MALFORMED_TRANSCRIPTS]
)
def test_malformed_transcript_is_a_transcript_error(tmp_path: Path, name: str, data: bytes) -> None:
    """Strict import: a TranscriptError naming the file (never a raw error)."""
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(data)
    with pytest.raises(TranscriptError) as info:
        load_transcript(path)
    assert str(path) in str(info.value)


def test_malformed_lines_skipped_in_lenient_mode_and_listed(tmp_path: Path) -> None:
    """Lenient import keeps the good records and lists every skipped line."""
    good = {"role": "user", "content": "keep me"}
    lines = [
        json.dumps(good).encode(),
        b'{"role": "user", "content": "caf\xe9"}',
        b"\x00\x00",
        _deep_json(10_000).encode(),
        b'{"role": "assistant", "content": "and me"}',
    ]
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    imported = load_transcript(path, strict=False)
    texts = [p.model_dump().get("text") for m in imported.messages for p in m.parts]
    assert "keep me" in texts
    assert "and me" in texts
    assert len(imported.skipped) == 3
    assert sorted(s.line for s in imported.skipped if s.line is not None) == [2, 3, 4]


# --------------------------------------------------------------------------- tool calls


async def test_ten_mb_tool_output_in_a_turn_is_rebuilt_by_usage(
    store: Store, tmp_path: Path
) -> None:
    """A tool call answered in the same assistant message with 10 MB: the provider's
    usage crosses the line, the next prepare() rebuilds (micro-compaction clears the
    result in requests), no request ever exceeds the window, the stored result keeps
    all 10 MB."""
    output = "0123456789abcdef" * (10 * MiB // 16)
    model = ScriptedModel(
        [ScriptStep(tool="bash", input={"command": "cat big.log"}, output=output)]
        + [ScriptStep(text=f"step {i}") for i in range(3)],
        overflow_above=LIMITS.context_window,
    )
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await mw.add_user_message(session.id, "Read the log and summarise it.")
        for _ in range(4):
            await mw.turn(session.id, model.complete)
        assert len(boundaries(await store.list_messages(session.id, agent=None))) == 1
        assert all(r.tokens < LIMITS.context_window for r in model.requests)
        stored = await store.list_messages(session.id, agent=None)
        (big,) = [p for m in stored for p in m.parts if isinstance(p, ToolPart)]
        assert isinstance(big.state, ToolStateCompleted)
        assert big.state.output == output
        request_is_valid(model.requests[-1].messages, SYSTEM)


async def test_ten_mb_tool_result_message_overflow_recovers(store: Store, tmp_path: Path) -> None:
    """A 10 MB result in its own ``tool`` message (OpenAI/Anthropic shape): the usage
    never saw it, so the provider overflows; the middleware rebuilds once and the
    retry fits. Nothing is deleted: the stored result keeps all 10 MB."""
    output = "0123456789abcdef" * (10 * MiB // 16)
    model = ScriptedModel(
        [ScriptStep(text=f"step {i}") for i in range(3)], overflow_above=LIMITS.context_window
    )
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=60_000)
        last = await store.latest_finished_assistant(session.id)
        assert last is not None
        at = last.time_created + 1
        call = Message(
            session_id=session.id,
            role="assistant",
            time_created=at,
            finish="tool-calls",
            usage=TokenUsage(input=61_000),
            parts=[
                ToolPart(
                    call_id="c_big",
                    tool="bash",
                    state=ToolStatePending(input={"command": "cat big.log"}),
                )
            ],
        )
        result = Message(
            session_id=session.id,
            role="tool",
            time_created=at + 1,
            parts=[ToolResultPart(call_id="c_big", tool="bash", output=output)],
        )
        await mw.append([call, result])
        await mw.turn(session.id, model.complete)
        assert model.overflow_errors == 1
        assert model.requests[-1].tokens < LIMITS.context_window
        assert len(boundaries(await store.list_messages(session.id, agent=None))) == 1
        stored = await store.get_message(result.id)
        assert stored is not None
        (part,) = stored.parts
        assert isinstance(part, ToolResultPart)
        assert part.output == output
        request_is_valid(model.requests[-1].messages, SYSTEM)


def _deep(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


WEIRD_ARGUMENTS: dict[str, dict[str, Any]] = {
    "deep-100": {"a": _deep(100)},
    "deep-240": {"a": _deep(240)},
    "deep-5000": {"a": _deep(5000)},
    "numbers-and-null": {"n": 1, "f": -1.5e300, "b": False, "none": None, "l": [1, [2, [3]]]},
    "nan-inf": {"nan": float("nan"), "inf": float("-inf")},
    "set-and-tuple": {"s": {1, 2}, "t": (1, "x")},
    "bytes": {"raw": b"\xff\xfe\x00"},
    "huge-key": {"k" * 100_000: "v"},
    "control-chars": {"cmd": "echo \x00\x1b[31m\u2028\ud800"},
}


@pytest.mark.parametrize("name", list(WEIRD_ARGUMENTS))
def test_r2_2_a9_estimator_and_digest_survive_weird_arguments(name: str) -> None:
    """The token estimate (A2: 1000 tokens for an unserialisable part) and the digest
    line (A9: arguments cut to 80 characters) never raise."""
    message = assistant_with_tool("ses_x", at=1, usage=10, arguments=WEIRD_ARGUMENTS[name])
    assert estimate_message_tokens(message) >= 1
    digest = build_tail_digest([message], max_lines=200, text_chars=240, arg_chars=80)
    (line,) = digest.text.splitlines()[2:]
    assert line.startswith("- read(")
    # Values are cut to 80 characters; keys are shown whole (A9), so only the
    # 100 000-character key makes a long line (the body's total cap still bounds it).
    assert len(line) < 1000 or name == "huge-key"


@pytest.mark.parametrize("name", list(WEIRD_ARGUMENTS))
async def test_weird_arguments_rebuild_or_clear_store_error(
    store: Store, tmp_path: Path, name: str
) -> None:
    """Stored and rebuilt as they are -- or, where the SQLite store cannot represent
    them as JSON (bytes that are not UTF-8, nesting beyond ~250 levels), refused with
    a StoreError naming the message; the session stays readable either way."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id)
        last = await store.latest_finished_assistant(session.id)
        assert last is not None
        odd = assistant_with_tool(
            session.id, at=last.time_created + 1, usage=95_000, arguments=WEIRD_ARGUMENTS[name]
        )
        refused: StoreError | None = None
        try:
            await mw.append([odd])
        except StoreError as exc:
            refused = exc
        if refused is not None:
            assert isinstance(store, SQLiteStore)
            assert odd.id in str(refused)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        assert len(await store.list_messages(session.id, agent=None)) >= 26


def test_deep_arguments_give_a_clear_provider_error() -> None:
    """OpenAI needs the arguments as JSON text: too deep is a clear InvalidRequestError.
    Anthropic takes the object as it is: converted, or a clear error -- never raw."""
    messages = [
        user("ses_x", "go", at=1),
        assistant_with_tool("ses_x", at=2, usage=10, arguments={"a": _deep(5000)}),
    ]
    with pytest.raises(InvalidRequestError, match="not JSON-serialisable"):
        to_openai_chat(messages, system=SYSTEM)
    with contextlib.suppress(MimoCtxError):
        to_anthropic(messages, system=SYSTEM)


# --------------------------------------------------------------------------- empty and odd sessions


async def test_empty_session(store: Store, tmp_path: Path) -> None:
    """No messages: prepare() sends nothing but the prefix, a manual rebuild reports
    that there is nothing to cover, an overflow is a clear ContextOverflowError."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        view = await mw.prepare(session.id)
        assert view.messages == []
        assert view.rebuild is None
        report = await mw.rebuild(session.id)
        assert report.boundary_id is None
        assert report.outcome == "writer-failed"
        with pytest.raises(ContextOverflowError, match="could not run"):
            await mw.on_error(session.id, FakeOverflowError(200_000, 100_000))
        assert await store.count_messages(session.id) == 0


async def test_unknown_session_is_a_clear_error(store: Store, tmp_path: Path) -> None:
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        with pytest.raises(MimoCtxError, match="unknown session"):
            await mw.prepare("ses_nobody")
        with pytest.raises(MimoCtxError, match="unknown session"):
            await mw.rebuild("ses_nobody")


async def test_session_with_only_sub_agent_messages(store: Store, tmp_path: Path) -> None:
    """Only a sub-agent worked: the main agent has nothing to send or rebuild; the
    sub-agent crossing the line gets a plain compaction (R1.4a); nothing is lost."""
    async with ContextMiddleware(store, tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, agent="explore")
        count = await store.count_messages(session.id)
        view = await mw.prepare(session.id)
        assert view.messages == []
        assert view.rebuild is None
        report = await mw.rebuild(session.id)
        assert report.boundary_id is None
        sub = await mw.prepare(session.id, agent="explore")
        assert sub.rebuild is not None
        assert (sub.rebuild.outcome, sub.rebuild.fallback) == ("compacted", "compaction")
        assert sub.messages[0].id == sub.rebuild.boundary_id
        request_is_valid(sub.messages, SYSTEM)
        assert await store.latest_boundary(session.id) is None
        assert await store.count_messages(session.id) == count + 1


def test_unserialisable_part_counts_a_fixed_estimate() -> None:
    """A2: a part whose JSON serialisation fails counts 1000 tokens."""
    message = assistant_with_tool("ses_x", at=now_ms(), usage=1, arguments={"a": _deep(5000)})
    assert estimate_message_tokens(message) == UNSERIALISABLE_PART_TOKENS


async def test_writer_keeps_invalid_utf8_notes_byte_for_byte(tmp_path: Path) -> None:
    """notes.md with invalid UTF-8: folding reads it with U+FFFD, so the file is kept
    whole, its original bytes unchanged (nothing is lost; folding twice is harmless)."""
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=80_000)
        notes = mw.layout.notes_path(session.id)
        notes.parent.mkdir(parents=True, exist_ok=True)
        blob = b"- keep the caf\xe9 \xff\xfe marker ZQX\n- second note\n"
        notes.write_bytes(blob)
        assert await mw.start_writer(session.id, reason="notes") == "started"
        assert await mw.wait_for_writer(session.id, timeout=60) == "finished"
        assert "marker ZQX" in mw.layout.checkpoint_path(session.id).read_text("utf-8")
        assert notes.read_bytes() == blob


async def test_writer_keeps_the_unfolded_rest_of_notes_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the part of notes.md the writer read is removed; the rest, invalid bytes
    included, stays exactly as it was."""
    from mimo_ctx.checkpoint import _coordinator

    monkeypatch.setattr(_coordinator, "WRITER_MAX_CHARS", 32)
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=LIMITS) as mw:
        session = await mw.open_session(system=SYSTEM)
        await fill_to_trigger(mw, session.id, final_usage=80_000)
        notes = mw.layout.notes_path(session.id)
        notes.parent.mkdir(parents=True, exist_ok=True)
        head = b"- the first note, plain ascii\n"
        rest = b"- a later note with caf\xe9 \xff bytes\n"
        assert len(head) < 32 < len(head + rest)
        notes.write_bytes(head + rest)
        assert await mw.start_writer(session.id, reason="notes") == "started"
        assert await mw.wait_for_writer(session.id, timeout=60) == "finished"
        remaining = notes.read_bytes()
        assert rest[-12:] in remaining
        assert (head + rest).endswith(remaining)
        assert b"\xe9 \xff" in remaining
