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
  each recorded message is recorded without one and gets the middleware's
  estimate instead (as for a provider that reports none): the prepared request's
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
  writer takes milliseconds, so this changes nothing but the scheduling.) With
  a model-backed writer (``writer=``), each run's model calls and tokens sent,
  cached and output are reported, and summed for the session
  (:meth:`ReplayReport.writer_tokens`).
* **Clock.** Messages keep the transcript's creation times, and the middleware
  decides on the session's own clock (the per-turn reminder's memory check runs
  on message times, not the wall clock), so machine load changes nothing.
* **A transcript holding only a sub-agent's messages** (such as a Claude Code
  ``*_subagents_agent-*.jsonl`` file opened on its own) is replayed as that
  agent's own session: its messages are treated as the main agent's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from mimo_ctx._replay_report import (
    ReplayCompaction,
    ReplayOverflow,
    ReplayPoint,
    ReplayRebuild,
    ReplayReport,
    ReplayRequest,
    ReplayWriterRun,
)
from mimo_ctx.checkpoint import CheckpointWriter
from mimo_ctx.config import RebuildConfig
from mimo_ctx.errors import ContextOverflowError
from mimo_ctx.events import ContextRebuilt, Event, WriterFailed, WriterFinished, WriterStarted
from mimo_ctx.importers import ImportedTranscript
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    Message,
    ReasoningPart,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    new_message_id,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.rebuild import RebuildOutcome, RebuildReport
from mimo_ctx.store.in_memory import InMemoryStore
from mimo_ctx.tokens import TokenCounter, js_json
from mimo_ctx.triggers import ModelLimits, lacks_usage, usage_tokens
from mimo_ctx.typed_input import TypedInput, newest_words, run_share, typed_inputs

__all__ = [
    "USER_WORDS_BUDGET",
    "ReplayCompaction",
    "ReplayOverflow",
    "ReplayPoint",
    "ReplayRebuild",
    "ReplayReport",
    "ReplayRequest",
    "ReplayWriterRun",
    "read_typed_inputs",
    "replay_transcript",
    "replayable_messages",
    "request_text",
    "stable_ids",
    "transcript_compactions",
    "typed_before",
    "user_words_retained",
]

USER_WORDS_BUDGET: Final = 16000
"""Tokens of the user's newest typed text that ``user_words_retained`` looks at."""

_WRITER_SETTLE_SECONDS: Final = 600.0


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


async def read_typed_inputs(transcript: ImportedTranscript) -> list[TypedInput] | None:
    """What the user typed, read from the transcript's own file (:mod:`mimo_ctx.typed_input`).

    The importer's messages are not used: a message the importer lost must count
    as lost. ``None`` when the file cannot be read or its format has
    no typed-text rules (a transcript built in memory).
    """
    path = transcript.source
    try:
        data = await anyio.Path(path).read_bytes()
    except OSError:
        return None
    try:
        return typed_inputs(data, transcript.format)
    except ValueError:
        return None


def _source_line(message: Message) -> int | None:
    for value in message.metadata.values():
        if isinstance(value, dict):
            line = cast("dict[str, object]", value).get("line")
            if isinstance(line, int):
                return line
    return None


def typed_before(typed: Sequence[TypedInput], message: Message, turns: int) -> list[str]:
    """The texts of ``typed`` the user had typed before ``message``, oldest first.

    Placed by the source line when both sides know theirs (an imported Claude
    Code message records the line it came from), else by the count of assistant
    turns before: ``turns`` main-agent assistant messages were replayed before
    ``message``.
    """
    line = _source_line(message)
    return [
        t.text
        for t in typed
        if (t.line < line if line is not None and t.line is not None else t.turns_before <= turns)
    ]


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


def user_words_retained(
    typed: Sequence[str],
    request: Sequence[Message],
    *,
    budget_tokens: int = USER_WORDS_BUDGET,
) -> float | None:
    """Share of the user's newest typed words present verbatim in a request.

    The words are those of ``typed`` (what the user typed, oldest first, as
    :func:`read_typed_inputs` reads it from the transcript file), newest first,
    up to ``budget_tokens`` of text (4 characters a token). The share is that of
    their 8-word runs found word for word in the request's text
    (:func:`mimo_ctx.typed_input.run_share`: a text shorter than 8 words must
    appear whole; whitespace and surrounding quotes are not significant).

    Args:
        typed: The user's typed texts up to the request, oldest first.
        request: The messages of the request (what would be sent).
        budget_tokens: How much of the newest user text to look at.

    Returns:
        A fraction in ``[0, 1]``, or ``None`` when the user typed nothing.
    """
    return run_share(newest_words(typed, budget_tokens), request_text(request))


# --------------------------------------------------------------------------- #
# The replay driver
# --------------------------------------------------------------------------- #


@dataclass(slots=True)
class _Recorder:
    """Collects writer events, tagged with the transcript index being replayed."""

    live_to_imported: dict[str, str]
    at: int = 0
    runs: list[ReplayWriterRun] = field(default_factory=list[ReplayWriterRun])
    rebuilt: ContextRebuilt | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, ContextRebuilt):
            self.rebuilt = event
        elif isinstance(event, WriterStarted):
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
                    finished = isinstance(event, WriterFinished)
                    self.runs[position] = dataclasses.replace(
                        run,
                        result="finished" if finished else "failed",
                        checkpoint_tokens=event.checkpoint_tokens if finished else None,
                        failure=None if finished else event.reason,
                        calls=event.calls,
                        tokens_sent=event.tokens_sent,
                        tokens_cached=event.tokens_cached,
                        tokens_output=event.tokens_output,
                        forked=event.forked,
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
    typed: Sequence[TypedInput] | None = None,
    rebuild_at: int | None = None,
    writer: CheckpointWriter | None = None,
) -> ReplayReport:
    """Drive a whole transcript through the middleware, turn by turn.

    Runs on a fresh :class:`~mimo_ctx.store.in_memory.InMemoryStore` with the
    default offline checkpoint writer (nothing touches the network) or the one
    given. See the module docs for how usage, ids, compactions and writers are
    handled.

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
        typed: What the user typed, for ``user_words_retained``; read from the
            transcript's file (:func:`read_typed_inputs`) when ``None``.
        rebuild_at: Stop before the message at this index (it and later ones
            are not replayed), run a manual rebuild there (the ``/rebuild``
            command) and prepare the next request: the report's ``point``.
        writer: The checkpoint writer (default: the offline one). A model-backed
            writer's calls and tokens are in the report's writer runs.

    Returns:
        The replay report.
    """
    limits = window if isinstance(window, ModelLimits) else ModelLimits(context_window=window)
    if typed is None:
        typed = await read_typed_inputs(transcript)
    options = _Options(
        limits=limits,
        config=config,
        counter=counter,
        use_transcript_usage=use_transcript_usage,
        typed=typed,
        rebuild_at=rebuild_at,
        writer=writer,
    )
    if memory_root is None:
        root = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "mimo-ctx-replay-"))
        try:
            return await _replay(transcript, options, root)
        finally:
            await anyio.to_thread.run_sync(shutil.rmtree, root, True)
    return await _replay(transcript, options, Path(memory_root))


@dataclass(frozen=True, slots=True)
class _Options:
    limits: ModelLimits
    config: RebuildConfig | None
    counter: TokenCounter | None
    use_transcript_usage: bool
    typed: Sequence[TypedInput] | None
    rebuild_at: int | None
    writer: CheckpointWriter | None = None


def transcript_compactions(transcript: ImportedTranscript) -> list[ReplayCompaction]:
    """The compactions the transcript's own agent performed, as a replay reports them."""
    return [
        ReplayCompaction(
            at=c.index,
            message_id=c.message_id,
            agent=c.agent,
            trigger=c.trigger,
            tokens_before=c.tokens_before,
        )
        for c in transcript.compactions
    ]


async def _replay(transcript: ImportedTranscript, options: _Options, root: Path) -> ReplayReport:
    session = transcript.session
    session_id = session.id
    store = InMemoryStore()
    await store.create_session(session)
    live_to_imported: dict[str, str] = {}
    recorder = _Recorder(live_to_imported)
    first_own_compaction = min((c.index for c in transcript.compactions), default=None)
    compactions = transcript_compactions(transcript)

    turns = peak = total = 0
    transcript_turns = estimated_turns = 0
    rebuilds: list[ReplayRebuild] = []
    requests: list[ReplayRequest] = []
    overflows: list[ReplayOverflow] = []
    limits = options.limits
    input_limit = limits.input_limit if limits.input_limit is not None else limits.context_window
    point: ReplayPoint | None = None
    entry = functools.partial(_rebuild_entry, options=options, live_to_imported=live_to_imported)
    async with ContextMiddleware(
        store,
        root,
        model=options.limits,
        config=options.config,
        counter=options.counter,
        on_event=recorder,
        writer=options.writer,
    ) as middleware:
        for index, imported in replayable_messages(transcript):
            if options.rebuild_at is not None and index >= options.rebuild_at:
                break
            recorder.at = index
            message = imported.model_copy(update={"id": new_message_id()})
            live_to_imported[message.id] = imported.id
            is_turn = message.role == "assistant" and message.agent == MAIN_AGENT
            if not is_turn:
                await middleware.append([message])
                continue

            view = await middleware.prepare(session_id)
            await _settle(middleware, session_id)
            peak = max(peak, view.tokens)
            total += view.tokens
            if view.rebuild is not None:
                rebuilds.append(entry(index, imported, view, turns=turns, report=view.rebuild))
            if view.tokens > input_limit:
                # The provider would refuse this request: recover as a live loop does.
                refused = view.tokens
                recorder.rebuilt = None
                with contextlib.suppress(ContextOverflowError):
                    await middleware.on_error(session_id, _ProviderOverflow(refused, input_limit))
                await _settle(middleware, session_id)
                view = await middleware.prepare(session_id)
                await _settle(middleware, session_id)
                total += view.tokens
                event = recorder.rebuilt
                if event is not None:
                    report = RebuildReport(
                        outcome=cast("RebuildOutcome", event.outcome),
                        trigger="overflow",
                        boundary_id=event.boundary_id,
                        watermark=event.watermark,
                        tokens_before=event.tokens_before,
                        tokens_after=event.tokens_after,
                        compacted_results=event.compacted_results,
                    )
                    rebuilds.append(entry(index, imported, view, turns=turns, report=report))
                overflows.append(
                    ReplayOverflow(at=index, tokens=refused, recovered=view.tokens <= input_limit)
                )
            requests.append(
                ReplayRequest(
                    at=index, tokens=view.tokens, transcript_tokens=usage_tokens(imported)
                )
            )
            turns += 1

            own_usage_valid = (
                options.use_transcript_usage
                and not lacks_usage(message)
                and not rebuilds
                and (first_own_compaction is None or index < first_own_compaction)
            )
            if message.finish is not None:
                if own_usage_valid:
                    transcript_turns += 1
                else:
                    # Recorded without a usage: the middleware estimates it from the
                    # request just prepared, as for a provider that reports none.
                    estimated_turns += 1
                    message = message.model_copy(update={"usage": None})
            await middleware.record(message)
            await _settle(middleware, session_id)

        if options.rebuild_at is not None:
            report = await middleware.rebuild(session_id, manual=True)
            await _settle(middleware, session_id)
            view = await middleware.prepare(session_id)
            await _settle(middleware, session_id)
            boundary = await store.get_message(report.boundary_id) if report.boundary_id else None
            point = ReplayPoint(
                at=options.rebuild_at,
                outcome=report.outcome,
                boundary=boundary,
                request=tuple(view.messages),
                request_tokens=view.tokens,
            )

    return ReplayReport(
        window=options.limits.context_window,
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
        point=point,
        session_id=session_id,
        writer_thresholds=middleware.thresholds,
        input_limit=input_limit,
        requests=requests,
        overflows=overflows,
    )


class _ProviderOverflow(Exception):
    """What the replay's stand-in provider raises for a request over the input limit."""

    def __init__(self, tokens: int, limit: int) -> None:
        # Anthropic's wording: recognised as an overflow (SPEC A11).
        super().__init__(f"prompt is too long: {tokens} tokens > {limit} maximum")


def _rebuild_entry(
    index: int,
    imported: Message,
    view: RequestView,
    *,
    turns: int,
    report: RebuildReport,
    options: _Options,
    live_to_imported: Mapping[str, str],
) -> ReplayRebuild:
    """A rebuild as the replay reports it, ``view`` being the request prepared after it."""
    retained = (
        user_words_retained(typed_before(options.typed, imported, turns), view.messages)
        if options.typed is not None
        else None
    )
    watermark = report.watermark
    return ReplayRebuild(
        at=index,
        message_id=imported.id,
        outcome=report.outcome,
        trigger=report.trigger,
        watermark=live_to_imported.get(watermark, watermark) if watermark else None,
        tokens_before=report.tokens_before,
        tokens_after=view.tokens,
        compacted_results=report.compacted_results,
        user_words_retained=retained,
    )
