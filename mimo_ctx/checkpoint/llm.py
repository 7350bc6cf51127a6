"""The model-backed checkpoint writer (SPEC A3, A14).

:class:`LLMCheckpointWriter` asks a model for a checkpoint in the A14 layout
(instructions in our own words) and checks the answer before accepting it
(:func:`parse_llm_answer`: every section present, not empty, each section
within its budget); the middleware falls back to the offline writer when it
fails, with a :class:`~mimo_ctx.events.WriterFailed` event saying why.

One line builds it from the client a host already has (the adapters live in
:mod:`mimo_ctx.providers.checkpoint_writer` and the integrations; this module
imports no SDK)::

    writer = LLMCheckpointWriter.from_openai(AsyncOpenAI(), model="gpt-5")
    writer = LLMCheckpointWriter.from_anthropic(AsyncAnthropic(), model="claude-sonnet-4-5")

or from any ``async (system, user) -> text`` function (:data:`CompletionFn`).

How a run asks the model, in order of preference:

* **Forked** (the original's way): when the writer's model is the session's own
  (same API, same model, same endpoint; :meth:`WriterModel.forks`), the request
  is the session's last request exactly as it was sent — frozen prefix, tools,
  the messages the model saw — followed by one user message asking for the
  checkpoint (the instructions, the previous checkpoint, the section budgets,
  notes and tasks). Everything before that message is what the provider's
  prompt cache already holds. The view is the *collapsed* one the model saw
  (SPEC R7.4 amended: the digest in the boundary stands for the folded tail;
  resending anything else would miss the cache).
* **Standalone**: the writer's own system prompt, and a user message with the
  previous checkpoint and the messages since the previous watermark, up to and
  including the new one, rendered as a transcript (tool inputs and outputs
  shortened). Bounded by what happened since the last checkpoint, never by the
  whole history.
* **Rolling**: when even that does not fit the writer model's window, the
  messages are cut into chunks that do, and the checkpoint is updated chunk by
  chunk, each answer the "previous checkpoint" of the next call.

The window is the writer model's :class:`~mimo_ctx.triggers.ModelLimits`
(``limits=``; by default the session model's), and the request never exceeds its
trigger line (SPEC R1.2), so there is room for the answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, runtime_checkable

from mimo_ctx._util import one_line
from mimo_ctx.checkpoint.document import CHECKPOINT_SECTIONS, missing_sections, parse_checkpoint
from mimo_ctx.checkpoint.protocol import CheckpointDraft, SentRequest, WriterRequest
from mimo_ctx.checkpoint.sections import task_tree_lines
from mimo_ctx.errors import CheckpointRejectedError, ConfigError, MimoCtxError
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
from mimo_ctx.tokens import estimate_text_tokens
from mimo_ctx.triggers import ModelLimits, usable_tokens

__all__ = [
    "BUDGET_SLACK",
    "CompletionFn",
    "LLMCheckpointWriter",
    "ModelAnswer",
    "WriterModel",
    "WriterPrompt",
    "chunk_transcript",
    "parse_llm_answer",
    "render_transcript",
]

CompletionFn = Callable[[str, str], Awaitable[str]]
"""``async (system_prompt, user_prompt) -> text``: any model call."""

BUDGET_SLACK: Final = 1.5
"""A section may exceed its token budget by this factor (plus 50 tokens) before the
answer is rejected: models count tokens loosely, and a bit over is still useful."""

_SLACK_TOKENS: Final = 50
_MIN_CHUNK_TOKENS: Final = 1000
_DEFAULT_OUTPUT: Final = 16_000


@dataclass(frozen=True, slots=True)
class WriterPrompt:
    """One model call of the writer.

    Attributes:
        system: The writer's instructions (the system prompt of a standalone call;
            a forked call cannot change the session's system prompt, so ``user``
            repeats them).
        user: The user message.
        fork: When set, send this request again exactly and append ``user`` as
            one more user message.
        max_output_tokens: The answer's token limit.
    """

    system: str
    user: str
    max_output_tokens: int
    fork: SentRequest | None = None


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    """A model's answer and what the provider reported it cost.

    Attributes:
        text: The answer's text (tool calls and thinking left out).
        input_tokens: Input tokens, cached ones included; ``None`` when not reported.
        cached_tokens: Input tokens served from the provider's prompt cache.
        output_tokens: Output tokens; ``None`` when not reported.
    """

    text: str
    input_tokens: int | None = None
    cached_tokens: int = 0
    output_tokens: int | None = None


@runtime_checkable
class WriterModel(Protocol):
    """A model the writer can call (the provider and integration adapters implement it)."""

    @property
    def name(self) -> str:
        """What the logs call it (``openai-chat:gpt-5``)."""
        ...

    def forks(self, sent: SentRequest) -> bool:
        """True when ``sent`` went to this very model (same API, model and endpoint)."""
        ...

    def can_fork(self) -> bool:
        """True when it can resend a session's request (a plain function cannot)."""
        ...

    async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
        """Send one call and return the answer."""
        ...


class _FunctionModel:
    """A :data:`CompletionFn` as a :class:`WriterModel`: standalone calls only, usage estimated."""

    def __init__(self, complete: CompletionFn) -> None:
        self._complete = complete

    @property
    def name(self) -> str:
        return "function"

    def forks(self, sent: SentRequest) -> bool:
        return False

    def can_fork(self) -> bool:
        return False

    async def complete(self, prompt: WriterPrompt) -> ModelAnswer:
        return ModelAnswer(text=await self._complete(prompt.system, prompt.user))


def _fold(text: str, limit: int) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_INSTRUCTIONS: Final = """\
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

_FORK_HEAD: Final = """\
[Checkpoint request from the context manager, not from the user. Do not call tools \
and do not continue the task: answer with the checkpoint only, as plain text.]
"""

_FORK_TAIL: Final = """\
Write the checkpoint now, as of the end of the conversation above."""

_FILE_MARK = re.compile(r"^=== FILE: (checkpoint-[A-Za-z0-9._-]+\.md) ===\s*$", re.MULTILINE)


def _message_text(message: Message, output_chars: int) -> str:
    lines: list[str] = []
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


def render_transcript(messages: Sequence[Message], *, output_chars: int = 2000) -> list[str]:
    """Each message as the transcript text a standalone writer call reads (pure).

    Tool inputs, outputs and thinking are shortened to ``output_chars``
    characters each; user and assistant text is kept whole. A rebuild boundary is
    one line (its content is the previous checkpoint, which the call carries
    itself). Messages with nothing to show are left out.
    """
    texts: list[str] = []
    for message in messages:
        if message.is_boundary:
            texts.append("[context rebuilt here: earlier messages are in the previous checkpoint]")
            continue
        text = _message_text(message, output_chars)
        if text:
            texts.append(text)
    return texts


def _cut(text: str, tokens: int) -> str:
    """``text`` within about ``tokens`` tokens: its head and tail around a cut notice."""
    chars = max(tokens, 1) * 4
    if len(text) <= chars:
        return text
    keep = max(chars - 80, 2)
    head, tail = text[: keep * 2 // 3], text[len(text) - keep // 3 :]
    return f"{head}\n[… {len(text) - len(head) - len(tail)} characters cut …]\n{tail}"


def _prefix_within(text: str, tokens: int) -> str:
    """The longest prefix of ``text`` estimated at no more than ``tokens`` tokens."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if estimate_text_tokens(text[:middle]) <= tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def chunk_transcript(texts: Sequence[str], room_tokens: int) -> list[list[str]]:
    """Pack transcript texts, in order, into chunks of at most ``room_tokens`` tokens (pure).

    A text larger than the room on its own is cut to fit (head and tail kept).
    Every chunk holds at least one text; no text is split across chunks.

    Raises:
        ValueError: ``room_tokens`` is not positive.
    """
    if room_tokens <= 0:
        raise ValueError(f"room_tokens must be positive, got {room_tokens}")
    chunks: list[list[str]] = []
    current: list[str] = []
    used = 0
    for original in texts:
        text = original
        if estimate_text_tokens(text) + 1 > room_tokens:
            text = _cut(text, room_tokens - 1)
            if estimate_text_tokens(text) + 1 > room_tokens:
                # Wide characters, or a room smaller than the cut notice: a plain prefix.
                text = _prefix_within(text, room_tokens - 1)
        cost = estimate_text_tokens(text) + 1
        if current and used + cost > room_tokens:
            chunks.append(current)
            current, used = [], 0
        current.append(text)
        used += cost
    if current:
        chunks.append(current)
    return chunks


class LLMCheckpointWriter:
    """A checkpoint writer backed by a model (see the module docs for how it asks).

    Args:
        complete: The model: a :class:`WriterModel` (what the ``from_*``
            constructors build) or any ``async (system_prompt, user_prompt) ->
            text`` function.
        limits: The writer model's window; an ``int`` is its context window.
            ``None``: the session model's (what the middleware runs with).
        fork: ``None`` (default): fork when the writer's model is the session's
            own; ``True``: fork from the session's last view whenever one is known
            (converted with the provider's converter when no wrapped client sent
            it); ``False``: never fork.
        max_output_tokens: The answer's token limit (lowered to the model's own).
        tool_output_chars: Tool inputs and outputs are shortened to this many
            characters in the transcript of a standalone call.
        budget_slack: How far a section may exceed its budget (see
            :data:`BUDGET_SLACK`).

    Raises:
        ConfigError: ``fork=True`` with a plain function, which cannot resend a
            request; or a non-positive limit.
    """

    def __init__(
        self,
        complete: CompletionFn | WriterModel,
        *,
        limits: ModelLimits | int | None = None,
        fork: bool | None = None,
        max_output_tokens: int = _DEFAULT_OUTPUT,
        tool_output_chars: int = 2000,
        budget_slack: float = BUDGET_SLACK,
    ) -> None:
        self._model: WriterModel = (
            complete if isinstance(complete, WriterModel) else _FunctionModel(complete)
        )
        if fork is True and not self._model.can_fork():
            raise ConfigError(
                "fork=True needs a model the writer can send a session's request to "
                "(LLMCheckpointWriter.from_openai / from_anthropic), not a plain function"
            )
        if max_output_tokens <= 0 or tool_output_chars <= 0 or budget_slack < 1:
            raise ConfigError(
                "max_output_tokens and tool_output_chars must be positive and "
                f"budget_slack at least 1, got {max_output_tokens}, {tool_output_chars}, "
                f"{budget_slack}"
            )
        self._limits = ModelLimits(context_window=limits) if isinstance(limits, int) else limits
        self._fork = fork
        self._max_output = max_output_tokens
        self._tool_output_chars = tool_output_chars
        self._slack = budget_slack

    # -- one-line construction (the adapters live where SDK code may live) ----------
    @classmethod
    def from_openai(
        cls,
        client: Any,
        *,
        model: str,
        api: Literal["chat", "responses"] = "chat",
        limits: ModelLimits | int | None = None,
        fork: bool | None = None,
        max_output_tokens: int = _DEFAULT_OUTPUT,
    ) -> LLMCheckpointWriter:
        """A writer on an ``openai.AsyncOpenAI`` client (Chat Completions or Responses).

        Args:
            client: The SDK client (a wrapped one works too: its own client is used,
                so the writer's calls never enter the session).
            model: The model name.
            api: ``"chat"`` (Chat Completions) or ``"responses"``.
            limits: The model's window (default: the session model's).
            fork: See the class docs.
            max_output_tokens: The answer's token limit.

        Raises:
            ImportError: The ``openai`` SDK is not installed (names the extra).
            ConfigError: ``client`` is not an async OpenAI client.
        """
        from mimo_ctx.providers.checkpoint_writer import OpenAIWriterModel

        return cls(
            OpenAIWriterModel(client, model=model, api=api),
            limits=limits,
            fork=fork,
            max_output_tokens=max_output_tokens,
        )

    @classmethod
    def from_anthropic(
        cls,
        client: Any,
        *,
        model: str,
        limits: ModelLimits | int | None = None,
        fork: bool | None = None,
        max_output_tokens: int = _DEFAULT_OUTPUT,
    ) -> LLMCheckpointWriter:
        """A writer on an ``anthropic.AsyncAnthropic`` client (Messages API).

        Args:
            client: The SDK client (or a wrapped one: its own client is used).
            model: The model name.
            limits: The model's window (default: the session model's).
            fork: See the class docs.
            max_output_tokens: The answer's token limit.

        Raises:
            ImportError: The ``anthropic`` SDK is not installed (names the extra).
            ConfigError: ``client`` is not an async Anthropic client.
        """
        from mimo_ctx.providers.checkpoint_writer import AnthropicWriterModel

        return cls(
            AnthropicWriterModel(client, model=model),
            limits=limits,
            fork=fork,
            max_output_tokens=max_output_tokens,
        )

    @classmethod
    def from_pydantic_ai(
        cls,
        model: Any,
        *,
        limits: ModelLimits | int | None = None,
        max_output_tokens: int = _DEFAULT_OUTPUT,
    ) -> LLMCheckpointWriter:
        """A writer on a pydantic-ai model (a ``Model`` or a name such as
        ``"openai:gpt-5"``); standalone calls only.

        Raises:
            ImportError: pydantic-ai is not installed (names the extra).
        """
        from mimo_ctx.integrations.pydantic_ai import PydanticAIWriterModel

        return cls(PydanticAIWriterModel(model), limits=limits, max_output_tokens=max_output_tokens)

    @classmethod
    def from_langchain(
        cls,
        chat_model: Any,
        *,
        limits: ModelLimits | int | None = None,
        max_output_tokens: int = _DEFAULT_OUTPUT,
    ) -> LLMCheckpointWriter:
        """A writer on a LangChain chat model (``BaseChatModel``); standalone calls only.

        Raises:
            ImportError: LangChain is not installed (names the extra).
        """
        from mimo_ctx.integrations.langchain import LangChainWriterModel

        return cls(
            LangChainWriterModel(chat_model), limits=limits, max_output_tokens=max_output_tokens
        )

    # -- the writer protocol -------------------------------------------------------
    @property
    def name(self) -> str:
        """``llm``."""
        return "llm"

    @property
    def model(self) -> WriterModel:
        """The model the writer calls."""
        return self._model

    async def aclose(self) -> None:
        """Release what the writer's model holds: an SDK client it made itself
        (a client passed to ``from_openai`` / ``from_anthropic`` stays the caller's)."""
        close = getattr(self._model, "aclose", None)
        if close is not None:
            await close()

    def prompts(self, request: WriterRequest) -> tuple[str, str]:
        """The system and user prompts of a standalone call for ``request`` (one chunk)."""
        system = self._instructions(request)
        return system, self._user(request, self._since(request), part=None)

    async def write(self, request: WriterRequest) -> CheckpointDraft:
        """Ask the model (forked, standalone or rolling) and validate its answer.

        Raises:
            CheckpointRejectedError: The answer is empty, misses sections of the
                layout or is over budget.
            MimoCtxError: The writer model's window cannot hold even one chunk.
        """
        budget = self._input_budget(request)
        output = self._output_tokens(request)
        system = self._instructions(request)
        fork = self._fork_of(request)
        if fork is not None:
            user = self._fork_message(request, system)
            if fork.tokens + estimate_text_tokens(user) <= budget:
                request.meter.forked = True
                prompt = WriterPrompt(system=system, user=user, max_output_tokens=output, fork=fork)
                return self._accept(await self._call(prompt, request), request)
        texts = self._since(request)
        whole = self._user(request, texts, part=None)
        if estimate_text_tokens(system) + estimate_text_tokens(whole) <= budget:
            prompt = WriterPrompt(system=system, user=whole, max_output_tokens=output)
            return self._accept(await self._call(prompt, request), request)
        return await self._rolling(request, system, texts, budget, output)

    # -- internals -----------------------------------------------------------------
    def _instructions(self, request: WriterRequest) -> str:
        sections = "\n".join(
            f"{s.heading}\n{s.instruction}\n"
            f"(budget for this section: {request.budgets.get(s.number, s.budget)} tokens)"
            for s in CHECKPOINT_SECTIONS
        )
        return _INSTRUCTIONS.format(sections=sections)

    def _context(self, request: WriterRequest, previous: str | None) -> list[str]:
        lines = [
            f"Session: {request.session_id}",
            f"Checkpoint file: {request.checkpoint_path}",
            f"Project memory: {request.project_memory_path}",
            f"Task directory: {request.tasks_dir}",
        ]
        lines += [
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
            previous or "(none)",
            "",
            "## Session notes",
            request.notes or "(none)",
            "",
            "## Tasks",
            "\n".join(task_tree_lines(request.tasks)) or "(none)",
        ]
        return lines

    def _user(
        self,
        request: WriterRequest,
        texts: Sequence[str],
        *,
        part: tuple[int, int] | None,
        previous: str | None = None,
    ) -> str:
        carried = request.previous_checkpoint if previous is None else previous
        lines = self._context(request, carried)
        if part is not None and part[0] < part[1]:
            heading = (
                f"## Conversation, part {part[0]} of {part[1]} (later parts follow in later "
                "calls: bring the checkpoint up to the end of this part)"
            )
        else:
            heading = f"## Conversation up to and including message {request.watermark}"
            if part is not None and part[1] > 1:
                heading += f", part {part[0]} of {part[1]}"
            if request.previous_watermark is not None:
                heading += (
                    f" (since message {request.previous_watermark}, "
                    "where the previous checkpoint ends)"
                )
        lines += ["", heading, "\n".join(texts) or "(no new messages)"]
        return "\n".join(lines)

    def _fork_message(self, request: WriterRequest, system: str) -> str:
        lines = [_FORK_HEAD, system, *self._context(request, request.previous_checkpoint)]
        return "\n".join([*lines, "", _FORK_TAIL])

    def _since(self, request: WriterRequest) -> list[str]:
        after = request.previous_watermark
        messages = [
            m
            for m in request.messages
            if m.id <= request.watermark and (after is None or m.id > after)
        ]
        return render_transcript(messages, output_chars=self._tool_output_chars)

    def _fork_of(self, request: WriterRequest) -> SentRequest | None:
        sent = request.last_request
        if self._fork is False or sent is None or not sent.messages:
            return None
        # The view must have been sent after the watermark message was written, or
        # the checkpoint would not cover it.
        if max(m.id for m in sent.messages) < request.watermark:
            return None
        if self._fork is None and not self._model.forks(sent):
            return None
        return sent

    def _window(self, request: WriterRequest) -> ModelLimits:
        limits = self._limits or request.model_limits
        if limits is None:
            raise MimoCtxError(
                "the LLM checkpoint writer needs its model's window: pass limits= "
                "(the middleware passes the session model's)"
            )
        return limits

    def _input_budget(self, request: WriterRequest) -> int:
        return usable_tokens(self._window(request))

    def _output_tokens(self, request: WriterRequest) -> int:
        limit = self._window(request).max_output_tokens
        return min(self._max_output, limit) if limit else self._max_output

    async def _call(self, prompt: WriterPrompt, request: WriterRequest) -> str:
        meter = request.meter
        estimate = estimate_text_tokens(prompt.user) + (
            prompt.fork.tokens if prompt.fork is not None else estimate_text_tokens(prompt.system)
        )
        meter.calls += 1
        meter.sent += estimate  # counted now: a call cut short still spent it
        answer = await self._model.complete(prompt)
        if answer.input_tokens is not None:
            meter.sent += answer.input_tokens - estimate
        meter.cached += answer.cached_tokens
        meter.output += (
            answer.output_tokens
            if answer.output_tokens is not None
            else estimate_text_tokens(answer.text)
        )
        return answer.text

    def _accept(self, answer: str, request: WriterRequest) -> CheckpointDraft:
        return parse_llm_answer(
            answer, notes=request.notes, budgets=request.budgets, slack=self._slack
        )

    async def _rolling(
        self,
        request: WriterRequest,
        system: str,
        texts: Sequence[str],
        budget: int,
        output: int,
    ) -> CheckpointDraft:
        # Room left for messages once the instructions, the context and the largest
        # checkpoint a previous chunk may hand on are counted.
        ceiling = int(sum(request.budgets.values()) * self._slack)
        carried = max(estimate_text_tokens(request.previous_checkpoint or ""), ceiling)
        overhead = estimate_text_tokens(system) + estimate_text_tokens(
            self._user(request, [], part=(1, 2), previous="")
        )
        room = budget - overhead - carried
        if room < _MIN_CHUNK_TOKENS:
            raise MimoCtxError(
                f"the writer model's window ({budget} tokens of input) leaves {room} tokens "
                "for messages after the instructions and the previous checkpoint; "
                "give the writer a model with a larger window"
            )
        chunks = chunk_transcript(texts, room)
        previous = request.previous_checkpoint
        draft: CheckpointDraft | None = None
        for number, chunk in enumerate(chunks, 1):
            user = self._user(request, chunk, part=(number, len(chunks)), previous=previous or "")
            prompt = WriterPrompt(system=system, user=user, max_output_tokens=output)
            draft = self._accept(await self._call(prompt, request), request)
            previous = draft.text
        assert draft is not None  # chunk_transcript gives at least one chunk for texts
        return draft


def parse_llm_answer(
    answer: str,
    *,
    notes: str | None = None,
    budgets: Mapping[int, int] | None = None,
    slack: float = BUDGET_SLACK,
) -> CheckpointDraft:
    """Split a model's answer into ``checkpoint.md`` and spill-over files, and check it.

    Args:
        answer: The model's text.
        notes: The notes the writer was asked to fold in.
        budgets: Token budget per section number; ``None`` checks no budget.
        slack: How far a section may exceed its budget (:data:`BUDGET_SLACK`).

    Raises:
        CheckpointRejectedError: The checkpoint is empty, lacks a section of the
            A14 layout, or a section is over its budget.
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
    parsed = parse_checkpoint(text)
    if not text.strip() or missing:
        raise CheckpointRejectedError(
            "the model's checkpoint lacks sections: " + ", ".join(missing or ["(empty answer)"])
        )
    over = [
        f"{s.number}. {s.title} ({used} tokens, budget {budgets[s.number]})"
        for s in CHECKPOINT_SECTIONS
        if budgets is not None
        and s.number in budgets
        and (used := estimate_text_tokens("\n".join(parsed[s.number])))
        > budgets[s.number] * slack + _SLACK_TOKENS
    ]
    if over:
        raise CheckpointRejectedError("the model's checkpoint is over budget: " + "; ".join(over))
    return CheckpointDraft(text=text.rstrip() + "\n", extra_files=extra, notes_folded=bool(notes))
