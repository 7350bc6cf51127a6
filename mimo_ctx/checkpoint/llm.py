"""The model-backed checkpoint writer (SPEC A3, A14).

:class:`LLMCheckpointWriter` asks a model, through any async completion callable,
for a checkpoint in the A14 layout (instructions in our own words), and checks the
answer's structure before accepting it (:func:`parse_llm_answer`); the middleware
falls back to the offline writer when it fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from mimo_ctx._util import one_line
from mimo_ctx.checkpoint.document import CHECKPOINT_SECTIONS, missing_sections
from mimo_ctx.checkpoint.protocol import CheckpointDraft, WriterRequest
from mimo_ctx.checkpoint.sections import task_tree_lines
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

__all__ = ["CompletionFn", "LLMCheckpointWriter", "parse_llm_answer"]

CompletionFn = Callable[[str, str], Awaitable[str]]
"""``async (system_prompt, user_prompt) -> text``: any model call."""


def _fold(text: str, limit: int) -> str:
    text = one_line(text)
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
            *(
                [
                    "## Focus of this checkpoint (the user's words, verbatim)",
                    request.focus,
                    "Keep what this asks for in view: give it room in §1 Active intent, "
                    "§2 Next concrete action and §5 Current work.",
                    "",
                ]
                if request.focus
                else []
            ),
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
    missing = missing_sections(text)
    if not text.strip() or missing:
        raise MimoCtxError(
            "the model's checkpoint lacks sections: " + ", ".join(missing or ["(empty answer)"])
        )
    return CheckpointDraft(text=text.rstrip() + "\n", extra_files=extra, notes_folded=bool(notes))
