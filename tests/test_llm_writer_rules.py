"""The model-backed checkpoint writer's own rules, with a scripted model (no SDK).

How a run asks (forked, standalone, rolling), what it reads (the messages since
the previous watermark, never the whole history), what it accepts (every
section, within budget) and what it reports (the cost meter). The SDK adapters
and the middleware around them are tested in ``tests/providers/test_llm_writer_sdks.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.checkpoint import (
    LLMCheckpointWriter,
    ModelAnswer,
    SentRequest,
    WriterPrompt,
    WriterRequest,
    section_budgets,
)
from mimo_ctx.checkpoint.document import render_checkpoint
from mimo_ctx.checkpoint.llm import chunk_transcript, parse_llm_answer
from mimo_ctx.errors import CheckpointRejectedError, ConfigError, MimoCtxError
from mimo_ctx.messages import Message, Role, TextPart
from mimo_ctx.session import RequestPrefix
from mimo_ctx.tokens import estimate_text_tokens
from mimo_ctx.triggers import ModelLimits

GOOD = render_checkpoint("Parser", {1: ['- "split the parser"'], 7: ["- parse.py is the entry"]})


def _message(text: str, role: Role = "user") -> Message:
    return Message(session_id="ses_w", role=role, time_created=1, parts=[TextPart(text=text)])


def _request(messages: Sequence[Message], **extra: Any) -> WriterRequest:
    values: dict[str, Any] = {
        "session_id": "ses_w",
        "project_id": "default",
        "watermark": messages[-1].id,
        "messages": messages,
        "previous_checkpoint": None,
        "notes": None,
        "tasks": [],
        "checkpoint_path": Path("/m/checkpoint.md"),
        "project_memory_path": Path("/m/MEMORY.md"),
        "notes_path": Path("/m/notes.md"),
        "tasks_dir": Path("/m/tasks"),
        "budgets": section_budgets(),
        "model_limits": ModelLimits(200_000),
        **extra,
    }
    return WriterRequest(**values)


@dataclass
class Scripted:
    """A writer model that records its prompts and answers from a list."""

    answers: list[str] = field(default_factory=lambda: [GOOD])
    same_model: bool = True
    prompts: list[WriterPrompt] = field(default_factory=list[WriterPrompt])
    report: bool = True

    @property
    def name(self) -> str:
        return "scripted"

    def forks(self, sent: SentRequest) -> bool:
        return self.same_model

    def can_fork(self) -> bool:
        return True

    async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
        self.prompts.append(prompt)
        text = self.answers[min(len(self.prompts), len(self.answers)) - 1]
        if not self.report:
            return ModelAnswer(text=text)
        return ModelAnswer(text=text, input_tokens=1234, cached_tokens=1000, output_tokens=56)


def _sent(messages: Sequence[Message], tokens: int = 5_000) -> SentRequest:
    return SentRequest(prefix=RequestPrefix(system="sys"), messages=messages, tokens=tokens)


# --------------------------------------------------------------------------- choosing the call


def test_forked_when_the_model_is_the_sessions_own() -> None:
    history = [_message("do the thing"), _message("done", "assistant")]
    model = Scripted()
    request = _request(history, last_request=_sent(history), previous_checkpoint="OLD CHECKPOINT")
    draft = anyio.run(LLMCheckpointWriter(model).write, request)
    assert draft.text.startswith("Topic: Parser")
    (prompt,) = model.prompts
    assert prompt.fork is request.last_request
    # One user message carries everything: the instructions (the session's system
    # prompt cannot change), the previous checkpoint and the section budgets.
    assert "You maintain checkpoint.md" in prompt.user
    assert "OLD CHECKPOINT" in prompt.user
    assert "(budget for this section: 3000 tokens)" in prompt.user
    assert "do the thing" not in prompt.user  # the conversation is the fork's, not re-rendered
    assert request.meter.forked
    assert (request.meter.calls, request.meter.sent, request.meter.cached) == (1, 1234, 1000)
    assert request.meter.output == 56


@pytest.mark.parametrize(
    "case", ["other-model", "fork-off", "no-last-request", "view-older", "too-large"]
)
def test_standalone_when_the_fork_cannot_serve(case: str) -> None:
    history = [_message("first"), _message("second", "assistant"), _message("third")]
    sent = _sent(history)
    if case == "view-older":
        sent = _sent(history[:1])  # prepared before the watermark message was written
    if case == "too-large":
        sent = _sent(history, tokens=190_000)  # over the writer window's trigger line
    model = Scripted(same_model=case != "other-model")
    writer = LLMCheckpointWriter(model, fork=False if case == "fork-off" else None)
    last = None if case == "no-last-request" else sent
    request = _request(history, last_request=last)
    anyio.run(writer.write, request)
    (prompt,) = model.prompts
    assert prompt.fork is None
    assert prompt.system.startswith("You maintain checkpoint.md")
    assert "[assistant] second" in prompt.user
    assert not request.meter.forked


def test_fork_true_forks_another_model_and_refuses_a_plain_function() -> None:
    history = [_message("go")]
    model = Scripted(same_model=False)
    request = _request(history, last_request=_sent(history))
    anyio.run(LLMCheckpointWriter(model, fork=True).write, request)
    assert model.prompts[0].fork is not None

    async def complete(system: str, user: str) -> str:
        return GOOD

    with pytest.raises(ConfigError, match="fork=True"):
        LLMCheckpointWriter(complete, fork=True)


def test_standalone_reads_only_the_messages_since_the_previous_watermark() -> None:
    """The previous checkpoint carries what came before: the history before the
    previous watermark is not sent again, however long it is."""
    old = [_message(f"old message {i}") for i in range(500)]
    new = [_message("new request"), _message("new answer", "assistant")]
    model = Scripted()
    request = _request(
        [*old, *new], previous_watermark=old[-1].id, previous_checkpoint="CARRIED FORWARD"
    )
    anyio.run(LLMCheckpointWriter(model).write, request)
    (prompt,) = model.prompts
    assert "old message" not in prompt.user
    assert "[user] new request" in prompt.user
    assert "CARRIED FORWARD" in prompt.user
    assert f"since message {old[-1].id}" in prompt.user


def test_a_function_model_is_standalone_with_estimated_usage() -> None:
    seen: list[tuple[str, str]] = []

    async def complete(system: str, user: str) -> str:
        seen.append((system, user))
        return GOOD

    history = [_message("hello")]
    request = _request(history, last_request=_sent(history), focus="keep the CLI stable")
    anyio.run(LLMCheckpointWriter(complete).write, request)
    ((system, user),) = seen
    assert "## Focus of this checkpoint (the user's words, verbatim)" in user
    assert "keep the CLI stable" in user
    meter = request.meter
    assert meter.calls == 1
    assert meter.sent == estimate_text_tokens(system) + estimate_text_tokens(user)
    assert meter.output == estimate_text_tokens(GOOD)
    assert meter.cached == 0


def test_rolling_update_over_chunks_within_the_window() -> None:
    history = [_message(f"message {i}: " + "word " * 2000) for i in range(40)]
    answers = [render_checkpoint("Parser", {7: [f"- learned in chunk {n}"]}) for n in range(1, 20)]
    model = Scripted(answers=answers)
    limits = ModelLimits(48_000, max_output_tokens=4_000)
    request = _request(history, model_limits=limits)
    draft = anyio.run(LLMCheckpointWriter(model).write, request)
    prompts = model.prompts
    assert len(prompts) >= 3
    line = 48_000 - 4_000  # the writer model's trigger line
    for prompt in prompts:
        assert estimate_text_tokens(prompt.system) + estimate_text_tokens(prompt.user) <= line
        assert prompt.max_output_tokens == 4_000
    for number, later in enumerate(prompts[1:], 1):
        # Each answer is the next call's previous checkpoint.
        assert f"learned in chunk {number}" in later.user
    assert f"learned in chunk {len(prompts)}" in draft.text
    assert "part 1 of" in prompts[0].user
    every = "\n".join(p.user for p in prompts)
    assert all(f"message {i}:" in every for i in range(40))  # nothing left out
    assert request.meter.calls == len(prompts)


def test_a_window_too_small_for_one_chunk_is_a_clear_error() -> None:
    history = [_message("word " * 50_000)]
    request = _request(history, model_limits=ModelLimits(8_000))
    with pytest.raises(MimoCtxError, match="larger window"):
        anyio.run(LLMCheckpointWriter(Scripted()).write, request)


def test_the_meter_counts_a_call_that_never_answered() -> None:
    """A call cut short (the run timeout cancels it) still shows what was sent."""

    class Hanging(Scripted):
        async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
            await anyio.sleep(60)
            raise AssertionError("not reached")

    history = [_message("hello")]
    request = _request(history)

    async def run() -> None:
        with anyio.move_on_after(0.05):
            await LLMCheckpointWriter(Hanging()).write(request)

    anyio.run(run)
    assert request.meter.calls == 1
    assert request.meter.sent > 0
    assert request.meter.output == 0


# --------------------------------------------------------------------------- the answer


def test_an_answer_over_budget_is_rejected() -> None:
    huge = render_checkpoint("Parser", {11: ["- " + "note " * 2000]})
    with pytest.raises(CheckpointRejectedError, match=r"over budget: 11\. Open notes"):
        parse_llm_answer(huge, budgets=section_budgets())
    # A little over is accepted: models count loosely.
    near = render_checkpoint("Parser", {11: ["- " + "note " * 700]})
    assert parse_llm_answer(near, budgets=section_budgets()).text.startswith("Topic: Parser")


def test_spill_over_files_are_split_off() -> None:
    answer = GOOD + "\n=== FILE: checkpoint-decisions.md ===\n# Decisions\n- one\n"
    draft = parse_llm_answer(answer, notes="a note")
    assert draft.extra_files == {"checkpoint-decisions.md": "# Decisions\n- one\n"}
    assert draft.notes_folded
    assert "=== FILE" not in draft.text


@given(
    texts=st.lists(st.text(min_size=0, max_size=3000), max_size=30),
    room=st.integers(min_value=1, max_value=800),
)
def test_chunks_keep_order_and_fit_the_room(texts: list[str], room: int) -> None:
    chunks = chunk_transcript(texts, room)
    flat = [t for chunk in chunks for t in chunk]
    assert len(flat) == len(texts)
    for chunk in chunks:
        assert chunk
        assert sum(estimate_text_tokens(t) + 1 for t in chunk) <= room
    for original, packed in zip(texts, flat, strict=True):
        if estimate_text_tokens(original) + 1 <= room:
            assert packed == original
        else:
            assert estimate_text_tokens(packed) + 1 <= room


def test_chunk_room_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        chunk_transcript(["x"], 0)
