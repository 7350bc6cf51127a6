"""Hypothesis strategies for the message model, shared by the test modules.

Import from a test module as ``from strategies import sessions, messages`` (pytest's
default import mode puts ``tests/`` on ``sys.path``).

Two families:

* Value strategies (:func:`parts`, :func:`messages`, one per part kind and tool
  state): arbitrary but valid models, for round-trip and serialisation properties.
* :func:`sessions`: plausible conversations, ordered as a store lists them
  (by ``(time_created, id)``, which here is also id order): user turns, assistant
  steps with reasoning, text and tool calls, tool results either in the calling
  ``ToolPart`` (OpenCode form) or split into ``role="tool"`` messages holding
  :class:`~mimo_ctx.messages.ToolResultPart` (provider form), sub-agent messages
  interleaved with the main line, and optionally an unfinished last step.

Conventions of the generated sessions (rely on them in assertions):

* Ids are valid ascending ids (``ids.timestamp_of`` works) and strictly increase
  along the list; ``time_created`` never decreases and equals the id's timestamp.
* Inline form: a finished call is a ``ToolPart`` in state ``completed`` or ``error``.
* Split form: the call is a ``ToolPart`` in state ``pending`` (the model asked for
  it; its outcome lives elsewhere) and its result is a ``ToolResultPart`` with the
  same ``call_id`` in a later ``role="tool"`` message of the same agent, before
  that agent's next assistant message. In split form one assistant step may be
  stored as two messages sharing a ``provider_message_id`` (reasoning and text in
  the first, tool calls in the second), as Anthropic-style importers produce.
* An unfinished last step (``unfinished=True``) has ``finish=None`` and its calls
  are ``ToolPart`` in state ``running`` without results.
* Every finished assistant message has ``finish`` set (``tool-calls`` when it made
  calls, else ``stop``) and a :class:`~mimo_ctx.messages.TokenUsage` (the two
  messages of one provider message carry the same usage).
* Sub-agent messages have ``agent`` of the form ``sub-<n>``; they start with a
  user message holding the sub-agent's prompt, and come right after the main
  agent's message holding the ``task`` call (split form: before its result).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import strategies as st

from mimo_ctx.messages import (
    MAIN_AGENT,
    CheckpointPart,
    CompactionPart,
    FilePart,
    Message,
    MessageFailure,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    SubtaskPart,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    ToolTime,
)

__all__ = [
    "TOOL_NAMES",
    "ToolResultForm",
    "ascending_ids",
    "checkpoint_parts",
    "compaction_parts",
    "file_parts",
    "json_objects",
    "json_values",
    "make_id",
    "message_errors",
    "messages",
    "opaque_parts",
    "parts",
    "reasoning_parts",
    "sessions",
    "subtask_parts",
    "text_parts",
    "texts",
    "token_usages",
    "tool_parts",
    "tool_result_parts",
    "tool_states",
    "tool_states_completed",
    "tool_states_error",
    "tool_states_pending",
    "tool_states_running",
    "tool_times",
]

ToolResultForm = Literal["inline", "split", "mixed"]

TOOL_NAMES: tuple[str, ...] = (
    "read",
    "bash",
    "grep",
    "edit",
    "write",
    "webfetch",
    "task",
    "memory",
    "actor",
    "question",
)
"""Tool names the generators use: some micro-compactable (R4.5), some stateful."""

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_MAX_TIMESTAMP_MS = 2**44 - 1
_EPOCH_MS = (1_600_000_000_000, 1_900_000_000_000)


def make_id(prefix: str, value: int, salt: int = 0) -> str:
    """Build an ascending id deterministically (no randomness, so Hypothesis can replay).

    Args:
        prefix: ``ses``, ``msg``, ``prt``...
        value: The time field, ``timestamp_ms * 4096 + counter``.
        salt: Chooses the 14-character base62 tail.
    """
    tail: list[str] = []
    for _ in range(14):
        salt, digit = divmod(salt, 62)
        tail.append(_BASE62[digit])
    return f"{prefix}_{value:014x}{''.join(reversed(tail))}"


def ascending_ids(prefix: str) -> st.SearchStrategy[str]:
    """Valid ascending ids of ``prefix`` with arbitrary timestamps."""
    return st.builds(
        make_id,
        st.just(prefix),
        st.integers(min_value=0, max_value=_MAX_TIMESTAMP_MS * 4096 + 4095),
        st.integers(min_value=0, max_value=62**14 - 1),
    )


def texts(max_size: int = 200) -> st.SearchStrategy[str]:
    """Text of any script (no lone surrogates: they cannot be stored as UTF-8)."""
    return st.one_of(
        st.text(max_size=max_size),
        st.sampled_from(["", "hello", "修复登录页面的 bug", "emoji 🎉👍🏽", "a\r\nb\n\tc"]),
    )


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """JSON-compatible values that survive a JSON round trip unchanged."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        texts(40),
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(texts(12), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def json_objects(max_leaves: int = 12) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects (``dict[str, Any]`` fields: tool input, metadata, opaque data)."""
    return st.dictionaries(texts(12), json_values(max_leaves), max_size=5)


_epoch_ms = st.integers(min_value=_EPOCH_MS[0], max_value=_EPOCH_MS[1])
_optional_ms = st.none() | _epoch_ms


def tool_times() -> st.SearchStrategy[ToolTime]:
    """Tool run times, ``compacted`` sometimes set (R4.5)."""
    return st.builds(ToolTime, start=_optional_ms, end=_optional_ms, compacted=_optional_ms)


def text_parts() -> st.SearchStrategy[TextPart]:
    """Text parts, sometimes synthetic or ignored (A10)."""
    return st.builds(
        TextPart,
        id=ascending_ids("prt"),
        text=texts(),
        synthetic=st.booleans(),
        ignored=st.booleans(),
    )


def reasoning_parts() -> st.SearchStrategy[ReasoningPart]:
    """Reasoning parts, with or without a signature."""
    return st.builds(
        ReasoningPart,
        id=ascending_ids("prt"),
        text=texts(),
        signature=st.none() | texts(40),
        redacted=st.booleans(),
    )


def file_parts() -> st.SearchStrategy[FilePart]:
    """File attachments, including ``data:`` URLs."""
    return st.builds(
        FilePart,
        id=ascending_ids("prt"),
        mime=st.sampled_from(["image/png", "text/plain", "application/pdf"]),
        url=st.one_of(
            st.just("data:image/png;base64,iVBORw0KGgo="),
            st.builds("file:///tmp/{}".format, st.text("abcxyz0189_", min_size=1, max_size=10)),
        ),
        filename=st.none() | texts(20),
    )


def tool_states_pending() -> st.SearchStrategy[ToolStatePending]:
    """Calls the model asked for (split form: the result lives elsewhere)."""
    return st.builds(ToolStatePending, input=json_objects())


def tool_states_running() -> st.SearchStrategy[ToolStateRunning]:
    """Running (or interrupted, after a crash) calls."""
    return st.builds(
        ToolStateRunning, input=json_objects(), title=st.none() | texts(30), time=tool_times()
    )


def tool_states_completed() -> st.SearchStrategy[ToolStateCompleted]:
    """Finished calls with output, metadata and sometimes attachments."""
    return st.builds(
        ToolStateCompleted,
        input=json_objects(),
        output=texts(),
        title=st.none() | texts(30),
        metadata=json_objects(6),
        attachments=st.lists(file_parts(), max_size=2),
        time=tool_times(),
    )


def tool_states_error() -> st.SearchStrategy[ToolStateError]:
    """Failed calls."""
    return st.builds(ToolStateError, input=json_objects(), error=texts(80), time=tool_times())


def tool_states() -> st.SearchStrategy[
    ToolStatePending | ToolStateRunning | ToolStateCompleted | ToolStateError
]:
    """Any tool state."""
    return st.one_of(
        tool_states_pending(), tool_states_running(), tool_states_completed(), tool_states_error()
    )


def tool_parts() -> st.SearchStrategy[ToolPart]:
    """Tool calls in any state."""
    return st.builds(
        ToolPart,
        id=ascending_ids("prt"),
        call_id=st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=24),
        tool=st.sampled_from(TOOL_NAMES),
        state=tool_states(),
    )


def tool_result_parts() -> st.SearchStrategy[ToolResultPart]:
    """Tool results stored apart from their call (provider form)."""
    return st.builds(
        ToolResultPart,
        id=ascending_ids("prt"),
        call_id=st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=24),
        tool=st.sampled_from(TOOL_NAMES),
        output=texts(),
        is_error=st.booleans(),
        time=tool_times(),
    )


def subtask_parts() -> st.SearchStrategy[SubtaskPart]:
    """Sub-agent (or command) requests."""
    return st.builds(
        SubtaskPart,
        id=ascending_ids("prt"),
        agent=st.sampled_from(["explore", "general", "sub-1"]),
        description=texts(40),
        prompt=texts(),
        command=st.none() | st.sampled_from(["/review", "/test"]),
    )


def checkpoint_parts() -> st.SearchStrategy[CheckpointPart]:
    """Rebuild boundary markers (R4.4)."""
    return st.builds(
        CheckpointPart,
        id=ascending_ids("prt"),
        covered_up_to=ascending_ids("msg"),
        digest_up_to=st.none() | ascending_ids("msg"),
        directory=texts(40),
        number=st.integers(min_value=0, max_value=1000),
    )


def compaction_parts() -> st.SearchStrategy[CompactionPart]:
    """Plain compaction markers (R1.4a)."""
    return st.builds(CompactionPart, id=ascending_ids("prt"), summary=texts(), auto=st.booleans())


def opaque_parts() -> st.SearchStrategy[OpaquePart]:
    """Framework parts carried through unchanged."""
    return st.builds(
        OpaquePart,
        id=ascending_ids("prt"),
        source=st.sampled_from(["pydantic-ai", "langchain"]),
        kind=texts(20),
        data=json_objects(),
    )


def parts() -> st.SearchStrategy[Part]:
    """A part of any kind."""
    return st.one_of(
        text_parts(),
        reasoning_parts(),
        tool_parts(),
        tool_result_parts(),
        file_parts(),
        subtask_parts(),
        checkpoint_parts(),
        compaction_parts(),
        opaque_parts(),
    )


def token_usages() -> st.SearchStrategy[TokenUsage]:
    """Provider usage, with and without a total."""
    counts = st.integers(min_value=0, max_value=2_000_000)
    return st.builds(
        TokenUsage,
        input=counts,
        output=counts,
        reasoning=counts,
        cache_read=counts,
        cache_write=counts,
        total=st.none() | counts,
    )


def message_errors() -> st.SearchStrategy[MessageFailure]:
    """Why an assistant message failed."""
    return st.builds(
        MessageFailure,
        name=st.sampled_from(["APIError", "AbortedError", "ProviderAuthError"]),
        message=texts(60),
        aborted=st.booleans(),
    )


def messages(
    *,
    roles: tuple[Role, ...] = ("user", "assistant", "tool"),
    part_strategy: st.SearchStrategy[Part] | None = None,
    max_parts: int = 5,
) -> st.SearchStrategy[Message]:
    """Arbitrary valid messages (any role, any parts, every optional field exercised).

    Args:
        roles: Roles to draw from.
        part_strategy: Parts to draw (default :func:`parts`, every kind).
        max_parts: Most parts per message.
    """
    return st.builds(
        Message,
        id=ascending_ids("msg"),
        session_id=ascending_ids("ses"),
        role=st.sampled_from(roles),
        agent=st.sampled_from([MAIN_AGENT, "sub-1", "act_explorer"]),
        time_created=_epoch_ms,
        time_completed=_optional_ms,
        finish=st.none() | st.sampled_from(["stop", "tool-calls", "length"]),
        error=st.none() | message_errors(),
        usage=st.none() | token_usages(),
        summary=st.booleans(),
        provider_message_id=st.none() | texts(20),
        model=st.none() | st.sampled_from(["gpt-5", "claude-sonnet-5"]),
        parts=st.lists(part_strategy if part_strategy is not None else parts(), max_size=max_parts),
        metadata=json_objects(6),
    )


# --------------------------------------------------------------------------- sessions


_SAMPLES: tuple[str, ...] = (
    "Let me look at the failing test first. ",
    "def handler(event):\n    return {'ok': True}\n",
    '{"status": "ok", "items": [1, 2, 3]}\n',
    "修复登录页面的错误，然后运行测试。",
    "Done 🎉 — all 42 tests pass.\n",
)


@functools.cache
def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    # Strategies are built once and reused: building (and validating) a fresh one
    # per draw dominated the cost of generating a session.
    return st.integers(min_value=low, max_value=high)


_bools = st.booleans()
_ticks = st.sampled_from([0, 0, 1, 7, 250, 4000])
_tool_name_lists = st.lists(st.sampled_from(TOOL_NAMES), min_size=1, max_size=3)


def _repeat(sample: str, times: int) -> str:
    return sample * times


@functools.cache
def _sized_text(max_chars: int) -> st.SearchStrategy[str]:
    """Cheap text of up to about ``max_chars`` characters.

    Drawing long random text is slow; long content here is a sample repeated, so
    sessions reach the token sizes the watermark rules care about (R2.3: tails of
    10 000 - 20 000 tokens) without slowing every test down.
    """
    longest = max(1, max_chars // max(len(x) for x in _SAMPLES))
    return st.one_of(
        st.text(max_size=min(30, max_chars)),
        st.builds(_repeat, st.sampled_from(_SAMPLES), st.integers(1, longest)),
    )


_tool_inputs: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.fixed_dictionaries({"command": st.sampled_from(["ls -la", "pytest -q", "git status"])}),
    st.fixed_dictionaries(
        {"filePath": st.sampled_from(["src/app.py", "README.md"])},
        optional={"offset": st.integers(0, 500), "limit": st.integers(1, 2000)},
    ),
    st.fixed_dictionaries({"pattern": st.text(max_size=12), "path": st.just(".")}),
    st.just(dict[str, Any]()),
)


@dataclass
class _Builder:
    """Mutable state of one generated session: clock, id counters, output."""

    draw: Callable[[st.SearchStrategy[Any]], Any]
    session_id: str
    now: int
    sub_agents: bool = True
    max_text: int = 2_000
    max_output: int = 20_000
    last_value: int = 0
    part_seq: int = 0
    call_seq: int = 0
    sub_seq: int = 0
    tokens: int = 0
    out: list[Message] = field(default_factory=list["Message"])

    def tick(self) -> int:
        # 0 ms steps are common on purpose: ids must order messages of one millisecond.
        self.now += self.draw(_ticks)
        return self.now

    def message_id(self) -> str:
        value = max(self.now * 4096, self.last_value + 1)
        self.last_value = value
        return make_id("msg", value, len(self.out))

    def part_id(self) -> str:
        self.part_seq += 1
        return make_id("prt", self.now * 4096, self.part_seq)

    def call_id(self) -> str:
        self.call_seq += 1
        return f"call_{self.call_seq}"

    def add(self, role: Role, parts: list[Part], **fields: Any) -> Message:
        self.tick()
        message = Message(
            id=self.message_id(),
            session_id=self.session_id,
            role=role,
            time_created=self.now,
            parts=parts,
            **fields,
        )
        self.out.append(message)
        return message

    def prose(self, max_chars: int) -> str:
        return self.draw(_sized_text(max_chars))

    def usage(self) -> TokenUsage:
        self.tokens += self.draw(_ints(50, 6000))
        return TokenUsage(input=self.tokens, output=self.draw(_ints(0, 800)))


def _user_parts(b: _Builder) -> list[Part]:
    result: list[Part] = [TextPart(id=b.part_id(), text=b.prose(b.max_text))]
    if b.draw(_ints(0, 5)) == 0:
        result.append(TextPart(id=b.part_id(), text="<reminder>", synthetic=True))
    if b.draw(_ints(0, 7)) == 0:
        result.append(
            FilePart(id=b.part_id(), mime="image/png", url="data:image/png;base64,iVBORw0KGgo=")
        )
    return result


def _sub_agent_block(b: _Builder) -> None:
    b.sub_seq += 1
    agent = f"sub-{b.sub_seq}"
    b.add("user", [TextPart(id=b.part_id(), text=b.prose(b.max_text))], agent=agent)
    for _ in range(b.draw(_ints(1, 2))):
        b.add(
            "assistant",
            [TextPart(id=b.part_id(), text=b.prose(b.max_text))],
            agent=agent,
            finish="stop",
            usage=b.usage(),
            time_completed=b.now,
        )


def _assistant_step(b: _Builder, *, split: bool, with_tools: bool, unfinished: bool) -> None:
    head: list[Part] = []
    if b.draw(_bools):
        head.append(ReasoningPart(id=b.part_id(), text=b.prose(b.max_text), signature="sig"))
    if b.draw(_bools) or not with_tools:
        head.append(TextPart(id=b.part_id(), text=b.prose(b.max_text)))
    if not with_tools:
        b.add("assistant", head, finish="stop", usage=b.usage(), time_completed=b.now)
        return

    names: list[str] = b.draw(_tool_name_lists)
    inputs: list[dict[str, Any]] = [b.draw(_tool_inputs) for _ in names]
    calls = [(b.call_id(), name, args) for name, args in zip(names, inputs, strict=True)]
    spawns_sub_agent = b.sub_agents and "task" in names and b.draw(_bools)

    if unfinished:
        running: list[Part] = [
            ToolPart(id=b.part_id(), call_id=c, tool=n, state=ToolStateRunning(input=a))
            for c, n, a in calls
        ]
        b.add("assistant", head + running)
        return

    if not split:
        done: list[Part] = []
        for c, n, a in calls:
            state: ToolStateCompleted | ToolStateError
            if b.draw(_ints(0, 4)) == 0:
                state = ToolStateError(input=a, error=b.draw(texts(60)))
            else:
                state = ToolStateCompleted(input=a, output=b.prose(b.max_output))
            done.append(ToolPart(id=b.part_id(), call_id=c, tool=n, state=state))
        step = b.add("assistant", head + done, finish="tool-calls", usage=b.usage())
        if spawns_sub_agent:
            # OpenCode creates the assistant message first; the sub-agent runs while
            # the call is open, so its messages sort after the calling message.
            _sub_agent_block(b)
        b.out[b.out.index(step)] = step.model_copy(update={"time_completed": b.now})
        return

    pending: list[Part] = [
        ToolPart(id=b.part_id(), call_id=c, tool=n, state=ToolStatePending(input=a))
        for c, n, a in calls
    ]
    if head and b.draw(_bools):
        # One provider message stored as two messages (R2.6 must not split them).
        # Both halves carry the provider's one usage, as in Claude Code transcripts.
        group = f"provider-{len(b.out)}"
        usage = b.usage()
        for chunk in (head, pending):
            b.add(
                "assistant",
                chunk,
                provider_message_id=group,
                finish="tool-calls",
                usage=usage,
                time_completed=b.now,
            )
    else:
        b.add(
            "assistant",
            head + pending,
            finish="tool-calls",
            usage=b.usage(),
            time_completed=b.now,
        )
    if spawns_sub_agent:
        _sub_agent_block(b)
    results: list[Part] = [
        ToolResultPart(
            id=b.part_id(),
            call_id=c,
            tool=n,
            output=b.prose(b.max_output),
            is_error=b.draw(_ints(0, 4)) == 0,
        )
        for c, n, _ in calls
    ]
    if b.draw(_bools):
        b.add("tool", results)  # all results in one message (Anthropic style)
    else:
        for r in results:
            b.add("tool", [r])  # one message per result (OpenAI style)


@st.composite
def sessions(
    draw: st.DrawFn,
    *,
    min_turns: int = 1,
    max_turns: int = 6,
    max_steps: int = 4,
    tool_results: ToolResultForm = "mixed",
    sub_agents: bool = True,
    unfinished: bool | None = None,
    max_text_chars: int = 2_000,
    max_output_chars: int = 20_000,
) -> list[Message]:
    """A plausible session, as the store lists it. See the module docstring for its shape.

    Args:
        draw: Supplied by Hypothesis.
        min_turns: Fewest user turns.
        max_turns: Most user turns.
        max_steps: Most assistant steps per turn (a step without tools ends the turn).
        tool_results: ``inline`` (OpenCode: result in the calling ``ToolPart``),
            ``split`` (provider form: ``ToolResultPart`` in ``role="tool"``
            messages), or ``mixed`` (each step draws its own form).
        sub_agents: Whether ``task`` calls may run sub-agent messages.
        unfinished: Whether the last step is left running; ``None`` draws it.
        max_text_chars: About the longest user, assistant or reasoning text.
        max_output_chars: About the longest tool output.
    """
    b = _Builder(
        draw=draw,
        session_id=make_id("ses", draw(_epoch_ms) * 4096, draw(_ints(0, 62**14 - 1))),
        now=draw(_epoch_ms),
        sub_agents=sub_agents,
        max_text=max_text_chars,
        max_output=max_output_chars,
    )
    turns = draw(_ints(min_turns, max_turns))
    leave_unfinished = draw(_bools) if unfinished is None else unfinished
    for turn in range(turns):
        b.add("user", _user_parts(b))
        steps = draw(_ints(1, max_steps))
        last_turn = turn == turns - 1
        for step in range(steps):
            last_step = step == steps - 1
            if tool_results == "mixed":
                split: bool = draw(_bools)
            else:
                split = tool_results == "split"
            stop_running = last_turn and last_step and leave_unfinished
            with_tools = stop_running or not last_step
            _assistant_step(b, split=split, with_tools=with_tools, unfinished=stop_running)
    return b.out
