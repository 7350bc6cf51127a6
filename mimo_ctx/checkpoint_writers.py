"""The two built-in checkpoint writers (SPEC A3, A14).

:class:`OfflineCheckpointWriter` needs no model: it fills the A14 layout
deterministically from evidence in the messages (the user's requests verbatim,
standing instructions, the host's plan, what was done, files and why, errors with
their fixes, the assistant's own findings and decisions, the next action), folding
each run's new messages into the state the previous run left. It is the default when no model is
configured and the fallback when the model-backed writer fails.

:class:`LLMCheckpointWriter` asks a model, through any async completion callable,
for a checkpoint in the same layout (instructions in our own words), and checks
the answer's structure before accepting it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from mimo_ctx.checkpoint_doc import (
    CHECKPOINT_SECTIONS,
    parse_checkpoint,
    render_checkpoint,
)
from mimo_ctx.checkpoint_sections import render_sections, state_from_checkpoint, task_tree_lines
from mimo_ctx.checkpoint_state import (
    CheckpointState,
    checkpoint_digest,
    fold_messages,
    fold_notes,
)
from mimo_ctx.errors import MimoCtxError
from mimo_ctx.messages import (
    Message,
    ReasoningPart,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
)
from mimo_ctx.writer import CheckpointDraft, WriterRequest

__all__ = ["CompletionFn", "LLMCheckpointWriter", "OfflineCheckpointWriter", "task_tree_lines"]

CompletionFn = Callable[[str, str], Awaitable[str]]
"""``async (system_prompt, user_prompt) -> text``: any model call."""


class OfflineCheckpointWriter:
    """A deterministic writer that needs no model (the default).

    It keeps a :class:`~mimo_ctx.checkpoint_state.CheckpointState` beside
    ``checkpoint.md`` (``checkpoint.state.json``), folds into it the messages the
    request holds after the state's last message (rules:
    :mod:`mimo_ctx.checkpoint_evidence`, :mod:`mimo_ctx.checkpoint_state`) and
    renders the eleven sections from it (:mod:`mimo_ctx.checkpoint_sections`).
    A run therefore needs only the previous state and the new messages. When the
    state is missing or belongs to another ``checkpoint.md`` (an LLM writer wrote
    the last one), the previous checkpoint's section lines are carried forward
    instead and the request's messages are folded after them.
    """

    @property
    def name(self) -> str:
        """``offline``."""
        return "offline"

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        """Build the checkpoint from ``request`` (pure computation, no I/O)."""
        return self.build(request)

    def build(self, request: WriterRequest) -> CheckpointDraft:
        """Synchronous core of :meth:`write`."""
        previous_text = request.previous_checkpoint or ""
        state = CheckpointState.from_json(request.previous_state)
        if state is None or state.checkpoint_sha256 != checkpoint_digest(previous_text):
            state = state_from_checkpoint(previous_text)
        state = fold_notes(fold_messages(state, request.messages), request.notes)
        rendered = render_sections(state, tasks=request.tasks, budgets=request.budgets)
        topic = _topic(state)
        text = render_checkpoint(topic, rendered.bodies)
        saved = state.model_copy(update={"checkpoint_sha256": checkpoint_digest(text)})
        return CheckpointDraft(
            text=text,
            extra_files=rendered.extra_files,
            notes_folded=bool((request.notes or "").strip()),
            state=saved.to_json(),
        )


def _topic(state: CheckpointState) -> str:
    """The task-defining request's first line, else the carried topic or the plan's step."""
    if state.request is not None:
        first = next((line for line in state.request.text.splitlines() if line.strip()), "")
        return _fold(first, 100)
    if state.carried_topic:
        return state.carried_topic
    plan = next((i.text for i in state.plan if i.status == "in_progress"), None)
    return _fold(plan, 100) if plan else "(unknown)"


def _fold(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_SYSTEM_PROMPT: Final = """\
You maintain checkpoint.md, the durable memory of a long coding-agent session. \
The conversation will be cut at the point you are shown; everything before it \
survives only through what you write. Write for the agent that resumes the work.

Output exactly this layout and nothing else:
Topic: <one line naming what the session is about>

then these eleven sections, in this order, every one present, each heading \
followed by its italic line exactly as given, and (none) when a section is empty \
(the budget lines below are for you; do not copy them):
{sections}

Rules:
- Quote the user's request word for word in section 1; never paraphrase the user.
- Keep every section within its token budget (about four characters per token).
- Carry forward from the previous checkpoint whatever is still true; drop what is done \
or disproved.
- Copy ids, paths, ports and commands exactly.
- When a section would exceed its budget, move a coherent group of older items into a \
spill-over file and leave in the section one line of the form \
`- See checkpoint-<topic>.md (<N> items) - <summary>`. Put each spill-over file after \
the checkpoint as a block that starts with a line `=== FILE: checkpoint-<topic>.md ===`.
- Fold the session notes into the right sections; they are emptied after this.
"""

_FILE_MARK = re.compile(r"^=== FILE: (checkpoint-[A-Za-z0-9._-]+\.md) ===\s*$", re.MULTILINE)


def _render_history(messages: Sequence[Message], *, output_chars: int) -> str:
    lines: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, TextPart) and not part.ignored:
                lines.append(f"[{message.role}] {part.text}")
            elif isinstance(part, ReasoningPart) and not part.redacted:
                lines.append(f"[{message.role} thinking] {_fold(part.text, output_chars)}")
            elif isinstance(part, ToolPart):
                args = json.dumps(part.state.input, ensure_ascii=False, default=str)
                lines.append(f"[tool call {part.tool}] {_fold(args, output_chars)}")
                if isinstance(part.state, ToolStateCompleted):
                    lines.append(f"[tool result] {_fold(part.state.output, output_chars)}")
                elif isinstance(part.state, ToolStateError):
                    lines.append(f"[tool error] {_fold(part.state.error, output_chars)}")
                else:
                    lines.append("[tool interrupted]")
            elif isinstance(part, ToolResultPart):
                kind = "tool error" if part.is_error else "tool result"
                lines.append(f"[{kind} {part.tool}] {_fold(part.output, output_chars)}")
            elif isinstance(part, SubtaskPart):
                lines.append(f"[sub-task {part.agent}] {_fold(part.description, output_chars)}")
    return "\n".join(lines)


class LLMCheckpointWriter:
    """A writer backed by any model call.

    Args:
        complete: ``async (system_prompt, user_prompt) -> text``.
        tool_output_chars: Tool inputs and outputs are shortened to this many
            characters in the transcript the model reads, so that a long session
            still fits the writer's own context.
    """

    def __init__(self, complete: CompletionFn, *, tool_output_chars: int = 2000) -> None:
        self._complete = complete
        self._tool_output_chars = tool_output_chars

    @property
    def name(self) -> str:
        """``llm``."""
        return "llm"

    def prompts(self, request: WriterRequest) -> tuple[str, str]:
        """The system and user prompts sent for ``request``."""
        sections = "\n".join(
            f"{s.heading}\n{s.instruction}\n"
            f"(budget for this section: {request.budgets.get(s.number, s.budget)} tokens)"
            for s in CHECKPOINT_SECTIONS
        )
        system = _SYSTEM_PROMPT.format(sections=sections)
        parts = [
            f"Session: {request.session_id}",
            f"Checkpoint file: {request.checkpoint_path}",
            f"Project memory: {request.project_memory_path}",
            f"Task directory: {request.tasks_dir}",
            "",
            "## Previous checkpoint",
            request.previous_checkpoint or "(none)",
            "",
            "## Session notes",
            request.notes or "(none)",
            "",
            "## Tasks",
            "\n".join(task_tree_lines(request.tasks)) or "(none)",
            "",
            f"## Conversation up to and including message {request.watermark}",
            _render_history(request.messages, output_chars=self._tool_output_chars),
        ]
        return system, "\n".join(parts)

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        """Ask the model and validate its answer.

        Raises:
            MimoCtxError: The answer is empty or misses sections of the layout.
        """
        system, user = self.prompts(request)
        answer = await self._complete(system, user)
        return parse_llm_answer(answer, notes=request.notes)


def parse_llm_answer(answer: str, *, notes: str | None = None) -> CheckpointDraft:
    """Split a model's answer into ``checkpoint.md`` and spill-over files, and check it.

    Raises:
        MimoCtxError: The checkpoint is empty or lacks a section of the A14 layout.
    """
    answer = answer.strip()
    if answer.startswith("```"):
        answer = re.sub(r"^```[a-z]*\n|\n```$", "", answer)
    marks = list(_FILE_MARK.finditer(answer))
    text = answer[: marks[0].start()] if marks else answer
    extra: dict[str, str] = {}
    for index, mark in enumerate(marks):
        end = marks[index + 1].start() if index + 1 < len(marks) else len(answer)
        extra[mark.group(1)] = answer[mark.end() : end].strip() + "\n"
    parsed = parse_checkpoint(text)
    missing = [s.title for s in CHECKPOINT_SECTIONS if s.number not in parsed]
    if not text.strip() or missing:
        raise MimoCtxError(
            "the model's checkpoint lacks sections: " + ", ".join(missing or ["(empty answer)"])
        )
    return CheckpointDraft(text=text.rstrip() + "\n", extra_files=extra, notes_folded=bool(notes))
