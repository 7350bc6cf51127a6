"""Which tool results a rebuild clears, how many stay, and what they read (SPEC R4.5).

The knobs: ``micro_compact_tools`` (names and glob patterns),
``micro_compact_exclude`` (never cleared), ``micro_compact_keep`` (the newest N
results of each agent stay) and ``micro_compact_placeholder`` (stored with each
result it clears, read by the send rules).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx import (
    ContextMiddleware,
    InMemoryStore,
    Message,
    ModelLimits,
    RebuildConfig,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.compaction import clearable_tool, micro_compact
from mimo_ctx.config import DEFAULT_MICRO_COMPACT_EXCLUDE, DEFAULT_MICRO_COMPACT_TOOLS, load_config
from mimo_ctx.errors import ConfigError
from mimo_ctx.messages import ToolResultPart
from mimo_ctx.testing import filler_text
from mimo_ctx.tokens import estimate_message_tokens
from mimo_ctx.view import COMPACTED_PLACEHOLDER, apply_send_rules

T0 = 1_700_000_000_000


def _tool(tool: str, *, t: int, agent: str = "main") -> Message:
    return Message(
        session_id="s",
        role="assistant",
        agent=agent,
        time_created=t,
        finish="tool-calls",
        parts=[
            ToolPart(
                call_id=f"c{t}",
                tool=tool,
                state=ToolStateCompleted(input={"x": 1}, output="big output"),
            )
        ],
    )


def _cleared(messages: list[Message]) -> list[str]:
    """The tools whose results the changed copies mark compacted."""
    out: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolPart) and isinstance(part.state, ToolStateCompleted):
                if part.state.time.compacted is not None:
                    out.append(part.tool)
            elif isinstance(part, ToolResultPart) and part.time.compacted is not None:
                out.append(part.tool)
    return out


# --------------------------------------------------------------------------- patterns


@pytest.mark.parametrize(
    ("name", "tools", "exclude", "expected"),
    [
        ("read", ("read",), (), True),
        ("Read", ("read",), (), True),
        ("run_shell", ("read",), (), False),
        ("run_shell", ("read", "run_*"), (), True),
        ("RUN_python", ("run_*",), (), True),
        ("mcp__github__get_file", ("mcp__*",), ("mcp__*__create_*",), True),
        ("mcp__github__create_issue", ("mcp__*",), ("mcp__*__create_*",), False),
        ("task", ("*",), DEFAULT_MICRO_COMPACT_EXCLUDE, False),
        ("Memory", ("*",), DEFAULT_MICRO_COMPACT_EXCLUDE, False),
        ("grep", ("*",), DEFAULT_MICRO_COMPACT_EXCLUDE, True),
        ("read", ("read",), ("read",), False),
        ("view_image", ("view_?mage",), (), True),
        ("bash", ("[ab]ash",), (), True),
    ],
)
def test_r4_5_clearable_tool_names_and_globs(
    name: str, tools: tuple[str, ...], exclude: tuple[str, ...], expected: bool
) -> None:
    assert clearable_tool(name, tools=tools, exclude=exclude) is expected


def test_r4_5_default_lists_are_the_originals() -> None:
    config = RebuildConfig()
    assert config.micro_compact_tools == DEFAULT_MICRO_COMPACT_TOOLS
    assert config.micro_compact_exclude == ("actor", "task", "question", "skill", "memory")
    assert config.micro_compact_keep == 0
    assert config.micro_compact_placeholder == COMPACTED_PLACEHOLDER
    # The default exclude list changes nothing for the default tool list.
    for tool in DEFAULT_MICRO_COMPACT_TOOLS:
        assert clearable_tool(
            tool, tools=DEFAULT_MICRO_COMPACT_TOOLS, exclude=DEFAULT_MICRO_COMPACT_EXCLUDE
        )


def test_r4_5_run_shell_is_cleared_once_a_pattern_names_it() -> None:
    messages = [_tool("run_shell", t=1), _tool("read", t=2), _tool("task", t=3)]
    default = micro_compact(messages, after_time=0, tools=DEFAULT_MICRO_COMPACT_TOOLS, now_ms=9)
    assert _cleared(default) == ["read"]
    patterned = micro_compact(
        messages,
        after_time=0,
        tools=("read", "run_*", "*"),
        exclude=DEFAULT_MICRO_COMPACT_EXCLUDE,
        now_ms=9,
    )
    assert _cleared(patterned) == ["run_shell", "read"]


# --------------------------------------------------------------------------- keep N


def test_keep_leaves_the_newest_results_of_each_agent() -> None:
    main = [_tool("read", t=10 + i) for i in range(5)]
    sub = [_tool("grep", t=20 + i, agent="explore") for i in range(3)]
    messages = [main[0], sub[0], main[1], main[2], sub[1], main[3], sub[2], main[4]]
    changed = micro_compact(
        messages, after_time=0, tools=DEFAULT_MICRO_COMPACT_TOOLS, now_ms=9, keep=2
    )
    assert [m.id for m in changed] == [main[0].id, sub[0].id, main[1].id, main[2].id]


def test_keep_counts_split_results_and_skips_the_skipped() -> None:
    results = Message(
        session_id="s",
        role="tool",
        time_created=50,
        parts=[ToolResultPart(call_id=f"c{i}", tool="grep", output="hits") for i in range(4)],
    )
    newest = _tool("read", t=60)
    (changed,) = micro_compact(
        [results, newest],
        after_time=0,
        tools=DEFAULT_MICRO_COMPACT_TOOLS,
        now_ms=3,
        keep=2,
        skip_ids={newest.id},
    )
    # The skipped message (the open round) does not use up the kept results.
    flags = [p.time.compacted for p in changed.parts if isinstance(p, ToolResultPart)]
    assert flags == [3, 3, None, None]


@given(
    st.lists(st.tuples(st.sampled_from(["main", "explore"]), st.booleans()), max_size=20),
    st.integers(min_value=0, max_value=6),
)
def test_keep_property_exactly_the_newest_n_clearable_stay(
    shape: list[tuple[str, bool]], keep: int
) -> None:
    messages = [
        _tool("read" if clearable else "task", t=i + 1, agent=agent)
        for i, (agent, clearable) in enumerate(shape)
    ]
    changed = {
        m.id for m in micro_compact(messages, after_time=0, tools=("read",), now_ms=5, keep=keep)
    }
    for agent in ("main", "explore"):
        candidates = [
            m.id
            for m, (a, clearable) in zip(messages, shape, strict=True)
            if a == agent and clearable
        ]
        cut = max(0, len(candidates) - keep)
        assert [c for c in candidates if c in changed] == candidates[:cut]
    assert all(m.id not in changed for m, (_, c) in zip(messages, shape, strict=True) if not c)


# --------------------------------------------------------------------------- placeholder


def test_placeholder_is_stored_with_the_result_and_sent() -> None:
    messages = [_tool("read", t=1)]
    (cleared,) = micro_compact(
        messages, after_time=0, tools=("read",), now_ms=9, placeholder="[gone: ask history]"
    )
    part = cleared.parts[0]
    assert isinstance(part, ToolPart)
    assert isinstance(part.state, ToolStateCompleted)
    assert part.state.time.placeholder == "[gone: ask history]"
    assert part.state.output == "big output"  # nothing deleted
    (sent,) = apply_send_rules([cleared])
    sent_part = sent.parts[0]
    assert isinstance(sent_part, ToolPart)
    assert isinstance(sent_part.state, ToolStateCompleted)
    assert sent_part.state.output == "[gone: ask history]"


def test_default_placeholder_is_not_stored_and_estimates_are_unchanged() -> None:
    messages = [_tool("read", t=1)]
    (default,) = micro_compact(messages, after_time=0, tools=("read",), now_ms=9)
    (explicit,) = micro_compact(
        messages, after_time=0, tools=("read",), now_ms=9, placeholder=COMPACTED_PLACEHOLDER
    )
    for cleared in (default, explicit):
        part = cleared.parts[0]
        assert isinstance(part, ToolPart)
        assert isinstance(part.state, ToolStateCompleted)
        assert part.state.time.placeholder is None
    assert default.parts == explicit.parts
    (sent,) = apply_send_rules([default])
    assert estimate_message_tokens(sent) == estimate_message_tokens(apply_send_rules([explicit])[0])


def test_split_result_placeholder_is_sent() -> None:
    call = Message(
        session_id="s",
        role="assistant",
        time_created=1,
        finish="tool-calls",
        parts=[ToolPart(call_id="c1", tool="grep", state=ToolStateCompleted(output=""))],
    )
    result = Message(
        session_id="s",
        role="tool",
        time_created=2,
        parts=[ToolResultPart(call_id="c1", tool="grep", output="hits " * 100)],
    )
    changed = micro_compact(
        [result], after_time=0, tools=("grep",), now_ms=3, placeholder="[cleared]"
    )
    sent = apply_send_rules([call, *changed])
    part = sent[-1].parts[0]
    assert isinstance(part, ToolResultPart)
    assert part.output == "[cleared]"


# --------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"micro_compact_tools": ["read", ""]}, "checkpoint.micro_compact_tools"),
        ({"micro_compact_tools": ["run_[abc"]}, "checkpoint.micro_compact_tools"),
        ({"micro_compact_tools": "read"}, "checkpoint.micro_compact_tools"),
        ({"micro_compact_exclude": [" "]}, "checkpoint.micro_compact_exclude"),
        ({"micro_compact_exclude": [1]}, "checkpoint.micro_compact_exclude"),
        ({"micro_compact_keep": -1}, "checkpoint.micro_compact_keep"),
        ({"micro_compact_keep": True}, "checkpoint.micro_compact_keep"),
        ({"micro_compact_placeholder": ""}, "checkpoint.micro_compact_placeholder"),
        ({"micro_compact_placeholder": "x" * 501}, "checkpoint.micro_compact_placeholder"),
        ({"micro_compact_placeholder": 5}, "checkpoint.micro_compact_placeholder"),
    ],
)
def test_bad_clearing_knobs_name_the_key(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"checkpoint": settings})
    assert key in str(info.value)


def test_clearing_knobs_load_from_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "mimo.toml"
    path.write_text(
        "[checkpoint]\n"
        'micro_compact_tools = ["read", "run_*"]\n'
        'micro_compact_exclude = ["run_tests"]\n'
        "micro_compact_keep = 3\n"
        'micro_compact_placeholder = "[cleared]"\n',
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.micro_compact_tools == ("read", "run_*")
    assert config.micro_compact_exclude == ("run_tests",)
    assert config.micro_compact_keep == 3
    assert config.micro_compact_placeholder == "[cleared]"


# --------------------------------------------------------------------------- end to end


async def _rebuilt_outputs(config: RebuildConfig, root: Path) -> list[str]:
    """Rebuild a session of ``run_shell`` and ``read`` rounds; the outputs sent after."""
    limits = ModelLimits(100_000, input_limit=100_000)
    async with ContextMiddleware(InMemoryStore(), root, model=limits, config=config) as mw:
        session = await mw.open_session(system="agent")
        await mw.add_user_message(session.id, "Run the tests and fix them. " + filler_text(50))
        rounds: list[Message] = []
        for i in range(24):
            at = T0 + 10 + i
            rounds.append(
                Message(
                    session_id=session.id,
                    role="assistant",
                    time_created=at,
                    time_completed=at,
                    finish="tool-calls" if i < 23 else "stop",
                    usage=TokenUsage(input=95_000 if i == 23 else 1_000 + i),
                    parts=[
                        TextPart(text=f"step {i}"),
                        ToolPart(
                            call_id=f"c{i}",
                            tool="run_shell" if i % 2 else "read",
                            state=ToolStateCompleted(
                                input={"i": i},
                                output=filler_text(900, seed=i),
                                time=ToolTime(start=at, end=at),
                            ),
                        ),
                    ],
                )
            )
        await mw.append(rounds)
        view = await mw.prepare(session.id)
        assert view.rebuild is not None
        assert view.rebuild.outcome == "rebuilt"
        watermark = await mw.store.get_message(view.rebuild.watermark or "")
        assert watermark is not None
        stored = await mw.store.list_messages(session.id)
    # Only results after the watermark are cleared (R4.5); those before it are hidden.
    after = [m for m in stored if m.time_created > watermark.time_created and not m.is_boundary]
    assert len(after) > 6
    outputs: list[str] = []
    for message in apply_send_rules(after):
        for part in message.parts:
            if isinstance(part, ToolPart) and isinstance(part.state, ToolStateCompleted):
                outputs.append(f"{part.tool}:{part.state.output[:40]}")
    return outputs


async def test_run_shell_results_are_cleared_by_a_pattern_end_to_end(tmp_path: Path) -> None:
    default = await _rebuilt_outputs(RebuildConfig(), tmp_path / "a")
    assert any(o.startswith("run_shell:") and COMPACTED_PLACEHOLDER not in o for o in default)
    assert all(o == f"read:{COMPACTED_PLACEHOLDER}" for o in default if o.startswith("read:"))

    config = load_config(
        {
            "checkpoint": {
                "micro_compact_tools": ["read", "run_*"],
                "micro_compact_placeholder": "[cleared by mimo_ctx]",
            }
        }
    )
    patterned = await _rebuilt_outputs(config, tmp_path / "b")
    assert len(patterned) == len(default)
    assert all(o.endswith(":[cleared by mimo_ctx]") for o in patterned)
