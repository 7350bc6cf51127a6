"""The two built-in checkpoint writers (SPEC A3, A14).

:class:`OfflineCheckpointWriter` needs no model: it fills the A14 layout
deterministically from the history (the user's request verbatim, files touched,
failed calls, live resources, the last conclusions, the task tree), carrying
forward what the previous checkpoint knew. It is the default when no model is
configured and the fallback when the model-backed writer fails.

:class:`LLMCheckpointWriter` asks a model, through any async completion callable,
for a checkpoint in the same layout (instructions in our own words), and checks
the answer's structure before accepting it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from mimo_ctx.checkpoint_doc import (
    CHECKPOINT_SECTIONS,
    parse_checkpoint,
    render_checkpoint,
    spill_over,
    topic_of,
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
from mimo_ctx.store.base import Task
from mimo_ctx.writer import CheckpointDraft, WriterRequest

__all__ = ["CompletionFn", "LLMCheckpointWriter", "OfflineCheckpointWriter", "task_tree_lines"]

CompletionFn = Callable[[str, str], Awaitable[str]]
"""``async (system_prompt, user_prompt) -> text``: any model call."""

TASK_ICONS: Final[Mapping[str, str]] = {
    "open": "🔵",
    "in_progress": "🔄",
    "blocked": "🟡",
    "done": "✅",
    "abandoned": "❌",
    "dispatched": "📤",
    "human_review": "👀",
    "failed": "⛔",
}

_PATH_KEYS: Final = ("file_path", "filePath", "path", "filename", "notebook_path", "file")
_RESOURCE = re.compile(
    r"(https?://[^\s\"'<>]+|\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0):\d{2,5}\b|\bport\s+\d{2,5}\b)",
    re.IGNORECASE,
)
_DIRECTIVE = re.compile(
    r"\b(always|never|don't|do not|must|make sure|please|prefer|avoid|only use)\b", re.IGNORECASE
)


def _fold(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _user_texts(message: Message) -> str:
    return "\n".join(
        p.text
        for p in message.parts
        if isinstance(p, TextPart) and not p.synthetic and not p.ignored
    ).strip()


def _is_typed_user_message(message: Message) -> bool:
    return message.role == "user" and not message.is_boundary and bool(_user_texts(message))


def task_tree_lines(tasks: Sequence[Task]) -> list[str]:
    """Task ids with status icons, sub-tasks indented under their parent (A14 §4)."""

    def key(task: Task) -> list[int | str]:
        return [int(p) if p.isdigit() else p for p in re.split(r"[.T]", task.id) if p]

    children: dict[str | None, list[Task]] = {}
    known = {t.id for t in tasks}
    for task in sorted(tasks, key=key):
        parent = task.parent_id if task.parent_id in known else None
        children.setdefault(parent, []).append(task)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for task in children.get(parent, []):
            icon = TASK_ICONS.get(task.status, "")
            summary = f" — {_fold(task.summary, 120)}" if task.summary else ""
            lines.append(f"{'  ' * depth}- {icon}{task.id} {task.status}{summary}")
            walk(task.id, depth + 1)

    walk(None, 0)
    return lines


def _tool_calls(messages: Iterable[Message]) -> Iterable[tuple[str, dict[str, Any], str | None]]:
    """(tool, input, error) for every tool call; error is set for failed calls."""
    results: dict[str, ToolResultPart] = {}
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                results[part.call_id] = part
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolPart):
                error: str | None = None
                if isinstance(part.state, ToolStateError):
                    error = part.state.error
                elif not isinstance(part.state, ToolStateCompleted):
                    result = results.get(part.call_id)
                    if result is not None and result.is_error:
                        error = result.output
                yield part.tool, part.state.input, error


def _carry(previous: Mapping[int, list[str]], number: int) -> list[str]:
    return [line for line in previous.get(number, []) if line.strip()]


def _dedupe(lines: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for line in lines:
        if line not in seen:
            seen.add(line)
            out.append(line)
    return out


class OfflineCheckpointWriter:
    """A deterministic writer that needs no model (the default).

    What goes where (A14): §1 the newest typed user request, quoted verbatim; §2
    the next step (open task, else the last assistant's unfinished step); §3 user
    sentences that read as standing instructions; §4 the task tree; §5 the last
    assistant conclusions; §6 files named in tool inputs; §7 and §10 carried
    forward from the previous checkpoint; §8 failed tool calls; §9 URLs and ports
    seen in tool inputs; §11 ``notes.md`` folded in, plus earlier open notes.
    Sections over budget spill their oldest items to ``checkpoint-<topic>.md``.
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
        messages = list(request.messages)
        previous = parse_checkpoint(request.previous_checkpoint or "")
        users = [m for m in messages if _is_typed_user_message(m)]
        bodies: dict[int, list[str]] = {}

        if users:
            quoted = _user_texts(users[-1]).splitlines()
            bodies[1] = [f"> {line}" if line else ">" for line in quoted]
        else:
            bodies[1] = _carry(previous, 1)

        open_tasks = [t for t in request.tasks if t.status in ("in_progress", "open", "blocked")]
        last_assistant = next((m for m in reversed(messages) if m.role == "assistant"), None)
        if open_tasks:
            task = open_tasks[0]
            bodies[2] = [f"- Continue {task.id} ({task.status}): {_fold(task.summary, 200)}"]
        elif last_assistant is not None and last_assistant.finish == "tool-calls":
            calls = [p.tool for p in last_assistant.parts if isinstance(p, ToolPart)]
            bodies[2] = [f"- Review the results of {', '.join(calls) or 'the last tool calls'}"]
        else:
            bodies[2] = ["- Re-read the active intent and continue from the current work"]

        directives: list[str] = _carry(previous, 3)
        for message in users:
            for sentence in re.split(r"(?<=[.!?])\s+|\n", _user_texts(message)):
                if _DIRECTIVE.search(sentence) and len(sentence) <= 300:
                    directives.append(f"- {sentence.strip()}")
        bodies[3] = _dedupe(directives)

        bodies[4] = task_tree_lines(request.tasks)

        conclusions: list[str] = []
        for message in reversed(messages):
            if message.role != "assistant":
                continue
            text = " ".join(
                p.text for p in message.parts if isinstance(p, TextPart) and not p.ignored
            ).strip()
            if text:
                conclusions.append(f"- {_fold(text, 400)}")
            subtasks = [p for p in message.parts if isinstance(p, SubtaskPart)]
            conclusions.extend(
                f"- Sub-task for {p.agent}: {_fold(p.description, 200)}" for p in subtasks
            )
            if len(conclusions) >= 5:
                break
        bodies[5] = list(reversed(conclusions))

        files: dict[str, set[str]] = {}
        resources: list[str] = _carry(previous, 9)
        errors: list[str] = _carry(previous, 8)
        for tool, tool_input, error in _tool_calls(messages):
            for key in _PATH_KEYS:
                value = tool_input.get(key)
                if isinstance(value, str) and value and len(value) < 300:
                    files.setdefault(value, set()).add(tool)
            rendered = json.dumps(tool_input, ensure_ascii=False, default=str)
            resources.extend(f"- {match}" for match in _RESOURCE.findall(rendered))
            if error is not None:
                errors.append(f"- {tool}({_fold(rendered, 160)}) → {_fold(error, 200)}")
        carried_files = _carry(previous, 6)
        bodies[6] = _dedupe(
            carried_files
            + [f"- {path} ({', '.join(sorted(tools))})" for path, tools in files.items()]
        )
        bodies[7] = _carry(previous, 7)
        bodies[8] = _dedupe(errors)
        bodies[9] = _dedupe(resources)
        bodies[10] = _carry(previous, 10)
        notes = (request.notes or "").strip()
        bodies[11] = _carry(previous, 11) + (
            [
                f"- {line.strip()}" if not line.startswith("-") else line
                for line in notes.splitlines()
                if line.strip()
            ]
            if notes
            else []
        )

        extra: dict[str, str] = {}
        for section in CHECKPOINT_SECTIONS:
            budget = request.budgets.get(section.number, section.budget)
            kept, moved = spill_over(section.number, bodies.get(section.number, []), budget)
            bodies[section.number] = kept
            if moved is not None:
                extra[moved[0]] = moved[1]

        topic = topic_of(request.previous_checkpoint) or (
            _fold(_user_texts(users[0]).splitlines()[0], 100) if users else "(unknown)"
        )
        return CheckpointDraft(
            text=render_checkpoint(topic, bodies), extra_files=extra, notes_folded=bool(notes)
        )


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
