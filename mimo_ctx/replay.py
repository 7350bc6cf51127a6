"""Replay a real transcript through :class:`~mimo_ctx.middleware.ContextMiddleware`.

:func:`replay_transcript` answers "what would mimo_ctx have done in this
session?": it walks an imported transcript's messages in order and feeds them to
the middleware as a live agent loop would — user messages, tool results and
sub-agent messages are appended as they come; before each assistant message of
the main agent it calls :meth:`~mimo_ctx.middleware.ContextMiddleware.prepare`
(which starts checkpoint writers and rebuilds when the trigger line is crossed)
and then records that assistant message with a usage. It reports every writer
run and rebuild, the request sizes, and how much of the user's own words each
rebuilt request still carries verbatim. ``mimo-ctx replay`` prints this report;
benchmarks can call the function directly.

How the replay is made faithful and deterministic (our choices):

* **Usage.** A transcript's usage describes the *transcript's own* context:
  Claude Code reports the cumulative context size (input + cache), system prompt
  and tools included. It is used as long as neither side has compacted — until
  our first rebuild, or the transcript's own first compaction, whichever comes
  first; from then on that figure describes a context we no longer send, and
  each recorded message gets an estimate instead: the prepared request's
  estimated tokens as input plus the message's own estimate as output.
  Messages without usage (SWE-agent, OpenAI chat) always get the estimate.
* **Ids.** Messages are appended with fresh ascending ids, made when they are
  appended, as in a live session. The imported ids are in the past, and the
  boundary a rebuild inserts gets an id made *now* (SPEC R4.3): had the later
  transcript messages kept their old ids, every one of them would sort before
  that boundary, and the once-per-usage rule (R1.4, decided by ids) would count
  every later usage as already recovered. Creation times are the transcript's.
  The report maps ids back to the imported ones.
* **The transcript's own compactions** (Claude Code ``isCompactSummary``) are
  not replayed: they are the other agent's answer to its own context pressure.
  They are reported side by side (:attr:`ReplayReport.transcript_compactions`).
* **Writers.** Checkpoint writers run in the middleware's task group, as in
  production; after every ``prepare`` and ``record`` the replay waits until the
  session's writer is idle, so a writer always finishes before the next turn
  and two replays of one transcript give the same report. (The default offline
  writer takes milliseconds, so this changes nothing but the scheduling.)
* **A transcript holding only a sub-agent's messages** (such as a Claude Code
  ``*_subagents_agent-*.jsonl`` file opened on its own) is replayed as that
  agent's own session: its messages are treated as the main agent's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import anyio.lowlevel
import anyio.to_thread

from mimo_ctx.config import RebuildConfig
from mimo_ctx.events import Event, WriterFailed, WriterFinished, WriterStarted
from mimo_ctx.importers import ImportedTranscript
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    Message,
    ReasoningPart,
    SubtaskPart,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    new_message_id,
)
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.store.in_memory import InMemoryStore
from mimo_ctx.tokens import TokenCounter, estimate_message_tokens, js_json
from mimo_ctx.triggers import ModelLimits

__all__ = [
    "USER_WORDS_BUDGET",
    "ReplayCompaction",
    "ReplayRebuild",
    "ReplayReport",
    "ReplayWriterRun",
    "replay_transcript",
    "replayable_messages",
    "request_text",
    "stable_ids",
    "typed_user_text",
    "user_words_retained",
]

USER_WORDS_BUDGET: Final = 16000
"""Tokens of the user's newest typed text that ``user_words_retained`` looks at."""

_SHINGLE: Final = 5
# A user word counts as retained when it lies in a run of at least this many
# consecutive words found verbatim in the request: single common words ("the")
# are present in any request and would say nothing.

_WRITER_SETTLE_SECONDS: Final = 600.0


# --------------------------------------------------------------------------- #
# Report types
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class ReplayWriterRun:
    """One checkpoint-writer run during a replay.

    Attributes:
        at: Index (in the transcript's messages) of the message being replayed when
            the writer started.
        watermark: The imported id of the watermark it covers up to.
        writer: The writer's name (``offline``...).
        result: ``finished``, ``failed``, or ``running`` if it never ended.
        checkpoint_tokens: Estimated size of the checkpoint it wrote.
    """

    at: int
    watermark: str | None
    writer: str
    result: Literal["finished", "failed", "running"] = "running"
    checkpoint_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as a JSON-ready mapping."""
        return {
            "at": self.at,
            "watermark": self.watermark,
            "writer": self.writer,
            "result": self.result,
            "checkpoint_tokens": self.checkpoint_tokens,
        }


@dataclass(frozen=True, slots=True)
class ReplayRebuild:
    """One rebuild (or fallback compaction) during a replay.

    Attributes:
        at: Index of the assistant message whose request the rebuild ran before.
        message_id: The imported id of that message.
        outcome: The rebuild's outcome (``rebuilt``, ``compacted``...).
        trigger: What started it (``usage``).
        watermark: The imported id of the watermark, if any.
        tokens_before: Estimated request tokens before the rebuild.
        tokens_after: Estimated tokens of the request actually prepared after it.
        compacted_results: Tool results micro-compaction cleared.
        user_words_retained: Share (0..1) of the user's newest typed words found
            verbatim in the rebuilt request (see :func:`user_words_retained`);
            ``None`` when the user had typed nothing yet.
    """

    at: int
    message_id: str
    outcome: str
    trigger: str
    watermark: str | None
    tokens_before: int | None
    tokens_after: int
    compacted_results: int
    user_words_retained: float | None

    def to_json(self) -> dict[str, Any]:
        """The rebuild as a JSON-ready mapping."""
        return {
            "at": self.at,
            "message_id": self.message_id,
            "outcome": self.outcome,
            "trigger": self.trigger,
            "watermark": self.watermark,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "compacted_results": self.compacted_results,
            "user_words_retained": self.user_words_retained,
        }


@dataclass(frozen=True, slots=True)
class ReplayCompaction:
    """A compaction the transcript's own agent performed (not replayed).

    Attributes:
        at: Index of the compaction summary in the transcript's messages.
        message_id: The imported id of the summary message.
        agent: The agent that was compacted.
        trigger: ``auto`` or ``manual`` when the transcript says so.
        tokens_before: The transcript's context size just before it, when known.
    """

    at: int
    message_id: str
    agent: str
    trigger: str | None
    tokens_before: int | None

    def to_json(self) -> dict[str, Any]:
        """The compaction as a JSON-ready mapping."""
        return {
            "at": self.at,
            "message_id": self.message_id,
            "agent": self.agent,
            "trigger": self.trigger,
            "tokens_before": self.tokens_before,
        }


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay saw.

    Attributes:
        window: The model window the replay assumed (tokens).
        trigger_tokens: The trigger line for that window (SPEC R1.2).
        turns: Main-agent requests prepared (one per assistant message).
        messages: Transcript messages replayed.
        writer_runs: Every checkpoint-writer run, in order.
        rebuilds: Every rebuild, in order.
        peak_request_tokens: The largest prepared request (estimated tokens).
        total_tokens_sent: Sum of the estimated tokens of every prepared request.
        transcript_compactions: The transcript's own compactions.
        transcript_usage_turns: Turns recorded with the transcript's own usage.
        estimated_usage_turns: Turns recorded with an estimated usage.
        format: The transcript's format.
    """

    window: int
    trigger_tokens: int
    turns: int
    messages: int
    writer_runs: list[ReplayWriterRun] = field(default_factory=list[ReplayWriterRun])
    rebuilds: list[ReplayRebuild] = field(default_factory=list[ReplayRebuild])
    peak_request_tokens: int = 0
    total_tokens_sent: int = 0
    transcript_compactions: list[ReplayCompaction] = field(default_factory=list[ReplayCompaction])
    transcript_usage_turns: int = 0
    estimated_usage_turns: int = 0
    format: str = ""

    def to_json(self) -> dict[str, Any]:
        """The report as the JSON document ``mimo-ctx replay --json`` prints.

        ``writer_runs`` is the number of writer runs; ``writers`` lists them.
        """
        return {
            "window": self.window,
            "trigger_tokens": self.trigger_tokens,
            "turns": self.turns,
            "writer_runs": len(self.writer_runs),
            "peak_request_tokens": self.peak_request_tokens,
            "total_tokens_sent": self.total_tokens_sent,
            "rebuilds": [r.to_json() for r in self.rebuilds],
            "transcript_compactions": [c.to_json() for c in self.transcript_compactions],
            "writers": [w.to_json() for w in self.writer_runs],
            "messages": self.messages,
            "format": self.format,
            "usage": {
                "transcript_turns": self.transcript_usage_turns,
                "estimated_turns": self.estimated_usage_turns,
            },
        }


# --------------------------------------------------------------------------- #
# Text helpers (pure)
# --------------------------------------------------------------------------- #


def replayable_messages(transcript: ImportedTranscript) -> list[tuple[int, Message]]:
    """The transcript's messages a replay (or ``mimo-ctx inspect``) feeds to the middleware.

    Returns ``(index in transcript.messages, message)`` pairs, in order, without
    the transcript's own compaction summaries (see the module docs). When no
    message belongs to the main agent, the messages are relabelled as the main
    agent's, so a sub-agent's transcript can be inspected on its own.
    """
    messages = transcript.messages
    relabel = bool(messages) and all(m.agent != MAIN_AGENT for m in messages)
    out: list[tuple[int, Message]] = []
    for index, message in enumerate(messages):
        if message.is_boundary:
            continue
        out.append(
            (index, message.model_copy(update={"agent": MAIN_AGENT}) if relabel else message)
        )
    return out


_BASE62: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _stable_id(prefix: str, value: int, *seed: object) -> str:
    digest = int.from_bytes(hashlib.sha256("\0".join(map(str, seed)).encode()).digest(), "big")
    tail = ""
    for _ in range(14):
        digest, digit = divmod(digest, 62)
        tail += _BASE62[digit]
    return f"{prefix}_{value:014x}{tail}"


def stable_ids(transcript: ImportedTranscript) -> ImportedTranscript:
    """The transcript with ids that are the same every time the file is imported.

    :func:`~mimo_ctx.importers.load_transcript` makes ids with a random tail
    (SPEC A1), so two imports of one file disagree. This rebuilds the session id
    and every message id from the transcript's times, positions and file name, in
    the A1 shape (ascending in message order), so ``mimo-ctx`` output can be
    diffed between runs and ``inspect --at`` accepts an id printed earlier. The
    compaction records are remapped; nothing else refers to message ids.
    """
    name = transcript.source.name
    session = transcript.session.model_copy(
        update={
            "id": _stable_id("ses", transcript.session.time_created * 4096, name, transcript.format)
        }
    )
    mapping: dict[str, str] = {}
    messages: list[Message] = []
    previous = -1
    for index, message in enumerate(transcript.messages):
        value = max(previous + 1, message.time_created * 4096)
        previous = value
        new_id = _stable_id("msg", value, name, index)
        mapping[message.id] = new_id
        messages.append(message.model_copy(update={"id": new_id, "session_id": session.id}))
    compactions = [
        dataclasses.replace(c, message_id=mapping.get(c.message_id, c.message_id))
        for c in transcript.compactions
    ]
    return dataclasses.replace(
        transcript, session=session, messages=messages, compactions=compactions
    )


def _is_typed_user_message(message: Message) -> bool:
    return (
        message.role == "user"
        and message.agent == MAIN_AGENT
        and not message.is_boundary
        and not any(isinstance(p, ToolResultPart | ToolPart) for p in message.parts)
    )


def typed_user_text(message: Message) -> str:
    """The text a person typed in ``message``: non-synthetic, non-ignored text parts.

    ``""`` for anything that is not a main-agent user message of its own (tool
    results, boundaries, synthetic notices).
    """
    if not _is_typed_user_message(message):
        return ""
    return "\n".join(
        p.text
        for p in message.parts
        if isinstance(p, TextPart) and not p.synthetic and not p.ignored
    )


def _part_texts(message: Message) -> Iterable[str]:
    for part in message.parts:
        if isinstance(part, TextPart | ReasoningPart):
            yield part.text
        elif isinstance(part, ToolPart):
            yield js_json(part.state.input)
            if isinstance(part.state, ToolStateCompleted):
                yield part.state.output
            elif isinstance(part.state, ToolStateError):
                yield part.state.error
        elif isinstance(part, ToolResultPart):
            yield part.output
        elif isinstance(part, SubtaskPart):
            yield part.description
            yield part.prompt
        elif isinstance(part, CompactionPart):
            yield part.summary


def request_text(messages: Sequence[Message]) -> str:
    """Every text a model would read in ``messages`` (text, reasoning, tool calls and results)."""
    return "\n".join(text for m in messages for text in _part_texts(m))


def _newest_user_words(history: Sequence[Message], budget_tokens: int) -> list[list[str]]:
    """Words of the newest typed user messages, up to ``budget_tokens`` of text.

    Returns one word list per message, newest message first; the oldest one
    taken may be cut to its newest words.
    """
    budget_chars = budget_tokens * 4
    taken: list[list[str]] = []
    for message in reversed(history):
        if budget_chars <= 0:
            break
        words = typed_user_text(message).split()
        if not words:
            continue
        size = sum(len(w) + 1 for w in words)
        if size > budget_chars:
            kept: list[str] = []
            for word in reversed(words):
                budget_chars -= len(word) + 1
                if budget_chars < 0:
                    break
                kept.append(word)
            words = kept[::-1]
            budget_chars = 0
        else:
            budget_chars -= size
        if words:
            taken.append(words)
    return taken


def user_words_retained(
    history: Sequence[Message],
    request: Sequence[Message],
    *,
    budget_tokens: int = USER_WORDS_BUDGET,
) -> float | None:
    """Share of the user's newest typed words present verbatim in a request.

    The words are those of the typed user messages of ``history`` (non-synthetic
    text of main-agent user messages), newest first, up to ``budget_tokens`` of
    text (4 characters a token) — whatever lies between those messages does not
    count. A word is present when it lies in a run of at least five consecutive
    words of its message that appears, word for word, in the request's text (a
    message shorter than five words must appear whole). Whitespace is not
    significant.

    Args:
        history: The session's messages up to the request, oldest first.
        request: The messages of the request (what would be sent).
        budget_tokens: How much of the newest user text to look at.

    Returns:
        A fraction in ``[0, 1]``, or ``None`` when the user typed nothing.
    """
    messages = _newest_user_words(history, budget_tokens)
    total = sum(len(words) for words in messages)
    if total == 0:
        return None
    request_words = request_text(request).split()
    shingles = {
        tuple(request_words[i : i + _SHINGLE]) for i in range(len(request_words) - _SHINGLE + 1)
    }
    joined: str | None = None
    present = 0
    for words in messages:
        if len(words) < _SHINGLE:
            if joined is None:
                joined = f" {' '.join(request_words)} "
            if f" {' '.join(words)} " in joined:
                present += len(words)
            continue
        covered = [False] * len(words)
        for start in range(len(words) - _SHINGLE + 1):
            if tuple(words[start : start + _SHINGLE]) in shingles:
                for i in range(start, start + _SHINGLE):
                    covered[i] = True
        present += sum(covered)
    return present / total


# --------------------------------------------------------------------------- #
# The replay driver
# --------------------------------------------------------------------------- #


@dataclass(slots=True)
class _Recorder:
    """Collects writer events, tagged with the transcript index being replayed."""

    live_to_imported: dict[str, str]
    at: int = 0
    runs: list[ReplayWriterRun] = field(default_factory=list[ReplayWriterRun])

    def __call__(self, event: Event) -> None:
        if isinstance(event, WriterStarted):
            self.runs.append(
                ReplayWriterRun(
                    at=self.at,
                    watermark=self.live_to_imported.get(event.watermark, event.watermark),
                    writer=event.writer,
                )
            )
        elif isinstance(event, WriterFinished | WriterFailed):
            for position in range(len(self.runs) - 1, -1, -1):
                run = self.runs[position]
                if run.result == "running" and run.writer == event.writer:
                    self.runs[position] = ReplayWriterRun(
                        at=run.at,
                        watermark=run.watermark,
                        writer=run.writer,
                        result="finished" if isinstance(event, WriterFinished) else "failed",
                        checkpoint_tokens=(
                            event.checkpoint_tokens if isinstance(event, WriterFinished) else None
                        ),
                    )
                    break


async def _settle(middleware: ContextMiddleware, session_id: str) -> None:
    """Wait until the session's checkpoint writer (if any) is idle."""
    await anyio.lowlevel.checkpoint()
    while middleware.writer_running(session_id):
        await middleware.wait_for_writer(session_id, timeout=_WRITER_SETTLE_SECONDS)
        await anyio.lowlevel.checkpoint()


async def replay_transcript(
    transcript: ImportedTranscript,
    *,
    window: int | ModelLimits,
    config: RebuildConfig | None = None,
    memory_root: str | os.PathLike[str] | None = None,
    counter: TokenCounter | None = None,
    use_transcript_usage: bool = True,
) -> ReplayReport:
    """Drive a whole transcript through the middleware, turn by turn.

    Runs on a fresh :class:`~mimo_ctx.store.in_memory.InMemoryStore` with the
    default offline checkpoint writer; nothing touches the network. See the
    module docs for how usage, ids, compactions and writers are handled.

    Args:
        transcript: An imported transcript (:func:`~mimo_ctx.importers.load_transcript`).
        window: The model's context window in tokens, or its full limits.
        config: Tuning; defaults follow the SPEC.
        memory_root: Where checkpoint files go; a temporary directory (removed
            afterwards) when ``None``.
        counter: Token counter for the body's section caps.
        use_transcript_usage: Record the transcript's own usage where it has one
            (until the first compaction on either side); ``False`` always
            estimates.

    Returns:
        The replay report.
    """
    limits = window if isinstance(window, ModelLimits) else ModelLimits(context_window=window)
    if memory_root is None:
        root = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "mimo-ctx-replay-"))
        try:
            return await _replay(
                transcript,
                limits=limits,
                config=config,
                root=root,
                counter=counter,
                use_transcript_usage=use_transcript_usage,
            )
        finally:
            await anyio.to_thread.run_sync(shutil.rmtree, root, True)
    return await _replay(
        transcript,
        limits=limits,
        config=config,
        root=Path(memory_root),
        counter=counter,
        use_transcript_usage=use_transcript_usage,
    )


async def _replay(
    transcript: ImportedTranscript,
    *,
    limits: ModelLimits,
    config: RebuildConfig | None,
    root: Path,
    counter: TokenCounter | None,
    use_transcript_usage: bool,
) -> ReplayReport:
    session = transcript.session
    session_id = session.id
    store = InMemoryStore()
    await store.create_session(session)
    live_to_imported: dict[str, str] = {}
    recorder = _Recorder(live_to_imported)
    first_own_compaction = min((c.index for c in transcript.compactions), default=None)
    compactions = [
        ReplayCompaction(
            at=c.index,
            message_id=c.message_id,
            agent=c.agent,
            trigger=c.trigger,
            tokens_before=c.tokens_before,
        )
        for c in transcript.compactions
    ]

    turns = peak = total = 0
    transcript_turns = estimated_turns = 0
    rebuilds: list[ReplayRebuild] = []
    history: list[Message] = []
    async with ContextMiddleware(
        store, root, model=limits, config=config, counter=counter, on_event=recorder
    ) as middleware:
        for index, imported in replayable_messages(transcript):
            recorder.at = index
            message = imported.model_copy(update={"id": new_message_id()})
            live_to_imported[message.id] = imported.id
            is_turn = message.role == "assistant" and message.agent == MAIN_AGENT
            if not is_turn:
                await middleware.append([message])
                if message.agent == MAIN_AGENT:
                    history.append(message)
                continue

            view = await middleware.prepare(session_id)
            await _settle(middleware, session_id)
            turns += 1
            peak = max(peak, view.tokens)
            total += view.tokens
            report = view.rebuild
            if report is not None:
                rebuilds.append(
                    ReplayRebuild(
                        at=index,
                        message_id=imported.id,
                        outcome=report.outcome,
                        trigger=report.trigger,
                        watermark=(
                            live_to_imported.get(report.watermark, report.watermark)
                            if report.watermark is not None
                            else None
                        ),
                        tokens_before=report.tokens_before,
                        tokens_after=view.tokens,
                        compacted_results=report.compacted_results,
                        user_words_retained=user_words_retained(history, view.messages),
                    )
                )

            own_usage_valid = (
                use_transcript_usage
                and message.usage is not None
                and not rebuilds
                and (first_own_compaction is None or index < first_own_compaction)
            )
            if message.finish is not None:
                if own_usage_valid:
                    transcript_turns += 1
                else:
                    estimated_turns += 1
                    usage = TokenUsage(input=view.tokens, output=estimate_message_tokens(message))
                    message = message.model_copy(update={"usage": usage})
            await middleware.record(message)
            history.append(message)
            await _settle(middleware, session_id)

    return ReplayReport(
        window=limits.context_window,
        trigger_tokens=middleware.usable,
        turns=turns,
        messages=len(transcript.messages),
        writer_runs=recorder.runs,
        rebuilds=rebuilds,
        peak_request_tokens=peak,
        total_tokens_sent=total,
        transcript_compactions=compactions,
        transcript_usage_turns=transcript_turns,
        estimated_usage_turns=estimated_turns,
        format=transcript.format,
    )
