"""``mimo-ctx inspect``: what a rebuild would make of a real transcript.

The transcript is imported (with stable ids, :func:`~mimo_ctx.replay.stable_ids`),
put into an :class:`~mimo_ctx.store.in_memory.InMemoryStore`, and rebuilt once
through the middleware's own path (:meth:`ContextMiddleware.rebuild`): no
watermark exists yet, so the rebuild starts the offline checkpoint writer, which
computes the watermark (``compute_boundary`` then
``adjust_boundary_for_api_invariants``, SPEC R2), writes ``checkpoint.md`` and
sets the watermark; the rebuild then renders the body, inserts the boundary and
micro-compacts (R4). The request shown is what the next ``prepare`` returns,
converted to the provider's payload and checked with
:func:`~mimo_ctx.providers.validate.validate_request`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread

from mimo_ctx.cli._common import (
    PROVIDER_FORMATS,
    CliError,
    ProviderFormat,
    ProviderRequest,
    Streams,
    activity_digest,
    add_transcript_arguments,
    compacted_by_tool,
    load_cli_config,
    provider_request,
    read_transcript_argument,
    section_json,
    window_tokens,
)
from mimo_ctx.cli._output import Output, dump_json, fmt_tokens
from mimo_ctx.config import RebuildConfig
from mimo_ctx.importers import ImportedTranscript
from mimo_ctx.messages import MAIN_AGENT, Message, TextPart
from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.render import SectionFigure
from mimo_ctx.replay import ReplayCompaction, replayable_messages, transcript_compactions
from mimo_ctx.store.in_memory import InMemoryStore
from mimo_ctx.tokens import estimate_message_tokens
from mimo_ctx.view import apply_send_rules

__all__ = [
    "InspectResult",
    "add_parser",
    "inspect_transcript",
    "print_inspect",
    "resolve_at",
    "section_rows",
]

_DIGEST_LINES_SHOWN = 40
_DEFAULT_WINDOW = 200_000


@dataclass(frozen=True, slots=True)
class InspectResult:
    """Everything ``inspect`` shows (see :meth:`to_json` for the JSON document)."""

    path: str
    transcript_format: str
    counts: dict[str, int]
    window: int
    trigger_tokens: int
    at: int | None
    outcome: str
    watermark: str | None
    watermark_index: int | None
    sections: list[SectionFigure]
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    compacted: dict[str, int]
    digest: str
    request: ProviderRequest
    transcript_compactions: list[ReplayCompaction] = field(default_factory=list[ReplayCompaction])
    memory_root: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The document ``mimo-ctx inspect --json`` prints."""
        return {
            "watermark": self.watermark,
            "sections": [section_json(s) for s in self.sections],
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "request": self.request.to_json(),
            "outcome": self.outcome,
            "watermark_index": self.watermark_index,
            "at": self.at,
            "window": self.window,
            "trigger_tokens": self.trigger_tokens,
            "messages_before": self.messages_before,
            "messages_after": self.messages_after,
            "compacted_results": sum(self.compacted.values()),
            "compacted_by_tool": self.compacted,
            "activity_digest": self.digest,
            "transcript": {"path": self.path, "format": self.transcript_format, **self.counts},
            "transcript_compactions": [c.to_json() for c in self.transcript_compactions],
            "memory_root": self.memory_root,
        }


def resolve_at(transcript: ImportedTranscript, at: str) -> int:
    """The index of the message ``--at`` names.

    Accepted: ``#N`` (the N-th message, counting from 0 — the ``at`` figures of
    ``replay`` and ``inspect``), a message id as ``inspect``/``replay`` print it,
    or the transcript's own record id (a Claude Code ``uuid``).

    Raises:
        CliError: Nothing matches.
    """
    wanted = at.strip()
    if wanted.startswith("#") and wanted[1:].isdigit():
        index = int(wanted[1:])
        if index >= len(transcript.messages):
            raise CliError(
                f"--at {at}: the transcript has {len(transcript.messages)} messages "
                f"(#0 to #{len(transcript.messages) - 1})"
            )
        return index
    for index, message in enumerate(transcript.messages):
        if message.id == wanted or wanted in _source_ids(message):
            return index
    raise CliError(
        f"--at {at}: no such message in {transcript.source} "
        "(give #N, a message id printed by inspect/replay, or the transcript's own id)"
    )


def _source_ids(message: Message) -> list[str]:
    found: list[str] = []
    for value in message.metadata.values():
        if isinstance(value, dict):
            uuids = cast("dict[str, object]", value).get("uuids")
            if isinstance(uuids, list):
                found.extend(str(u) for u in cast("list[object]", uuids))
    return found


async def inspect_transcript(
    transcript: ImportedTranscript,
    *,
    window: int,
    at: int | None = None,
    fmt: ProviderFormat = "openai",
    config: RebuildConfig | None = None,
    memory_root: Path | None = None,
) -> InspectResult:
    """Rebuild the transcript (up to message ``at``) once and describe the result.

    Args:
        transcript: The imported transcript (ideally with stable ids).
        window: The model's context window in tokens.
        at: Consider only messages up to this index (inclusive).
        fmt: The provider payload to produce.
        config: Tuning.
        memory_root: Keep the checkpoint files here; a temporary directory
            (removed afterwards) when ``None``.
    """
    if memory_root is not None:
        return await _inspect(
            transcript,
            window=window,
            at=at,
            fmt=fmt,
            config=config,
            root=memory_root,
            keep=True,
        )
    root = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "mimo-ctx-inspect-"))
    try:
        return await _inspect(
            transcript, window=window, at=at, fmt=fmt, config=config, root=root, keep=False
        )
    finally:
        await anyio.to_thread.run_sync(shutil.rmtree, root, True)


async def _inspect(
    transcript: ImportedTranscript,
    *,
    window: int,
    at: int | None,
    fmt: ProviderFormat,
    config: RebuildConfig | None,
    root: Path,
    keep: bool,
) -> InspectResult:
    pairs = [(i, m) for i, m in replayable_messages(transcript) if at is None or i <= at]
    index_of = {m.id: i for i, m in pairs}
    messages = [m for _, m in pairs]
    session_id = transcript.session.id
    store = InMemoryStore()
    await store.create_session(transcript.session)
    if messages:
        await store.append_messages(messages)
    main = [m for m in messages if m.agent == MAIN_AGENT]
    before_view = apply_send_rules(main)
    async with ContextMiddleware(store, root, model=window, config=config) as middleware:
        report = await middleware.rebuild(session_id, manual=False)
        view = await middleware.prepare(session_id)
        while middleware.writer_running(session_id):
            await middleware.wait_for_writer(session_id, timeout=600)
        trigger = middleware.usable
    boundary = await store.get_message(report.boundary_id) if report.boundary_id else None
    everything = await store.list_messages(session_id, agent=None)
    request = provider_request(view.messages, system=view.prefix.system, fmt=fmt)
    return InspectResult(
        path=str(transcript.source),
        transcript_format=transcript.format,
        counts=transcript.counts(),
        window=window,
        trigger_tokens=trigger,
        at=at,
        outcome=report.outcome,
        watermark=report.watermark,
        watermark_index=index_of.get(report.watermark) if report.watermark else None,
        sections=list(report.sections.sections) if report.sections else [],
        tokens_before=(
            report.tokens_before
            if report.tokens_before is not None
            else sum(estimate_message_tokens(m) for m in before_view)
        ),
        tokens_after=view.tokens,
        messages_before=len(before_view),
        messages_after=len(view.messages),
        compacted=compacted_by_tool(everything),
        digest=activity_digest(boundary),
        request=request,
        transcript_compactions=transcript_compactions(transcript),
        memory_root=str(root) if keep else None,
    )


def _cap(figure: SectionFigure) -> str:
    if figure.unit == "tokens":
        return fmt_tokens(figure.cap)
    return f"{figure.cap:,} {'chars' if figure.unit == 'characters' else figure.unit}"


def section_rows(sections: list[SectionFigure]) -> list[list[str]]:
    """Table rows ``#, section, tokens, cap, use`` for section figures."""
    rows: list[list[str]] = []
    for number, figure in enumerate(sections, start=1):
        use = (
            f"{figure.tokens / figure.cap:.0%}"
            if figure.unit == "tokens" and figure.cap and figure.tokens
            else ""
        )
        rows.append(
            [
                str(number),
                figure.heading,
                fmt_tokens(figure.tokens) if figure.tokens else "-",
                _cap(figure),
                use,
            ]
        )
    return rows


def _count(messages: int) -> str:
    return f"{messages} message" if messages == 1 else f"{messages} messages"


def _first_words(message: Message, limit: int = 60) -> str:
    for part in message.parts:
        if isinstance(part, TextPart) and part.text.strip():
            text = " ".join(part.text.split())
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return f"({', '.join(p.type for p in message.parts) or 'empty'})"


def print_inspect(result: InspectResult, transcript: ImportedTranscript, out: Output) -> None:
    """Human output of ``inspect``."""
    counts = result.counts
    out.heading(f"mimo-ctx inspect: {result.path}")
    considered = (
        "all messages"
        if result.at is None
        else f"messages #0 to #{result.at} (--at {transcript.messages[result.at].id})"
    )
    out.fields(
        [
            (
                "Transcript",
                f"{result.transcript_format}, {_count(counts['messages'])} "
                f"({counts['user']} user, {counts['assistant']} assistant, "
                f"{counts['tool_calls']} tool calls, {counts['subagent_messages']} sub-agent), "
                f"{counts['compactions']} compaction(s) of its own",
            ),
            (
                "Window",
                f"{fmt_tokens(result.window)} tokens; trigger line "
                f"{fmt_tokens(result.trigger_tokens)}",
            ),
            ("Considered", considered),
            ("Outcome", result.outcome),
        ]
    )
    if result.watermark is not None and result.watermark_index is not None:
        watermark = transcript.messages[result.watermark_index]
        out.fields(
            [
                (
                    "Watermark",
                    f"{result.watermark} (#{result.watermark_index}, {watermark.role}: "
                    f"{_first_words(watermark)})",
                )
            ]
        )
    else:
        out.fields([("Watermark", "none (nothing to checkpoint yet)")])

    if result.sections:
        out.heading("Rebuilt body: sections (tokens vs caps)")
        out.table(
            ["#", "Section", "Tokens", "Cap", "Use"],
            section_rows(result.sections),
            align=["right", "left", "right", "right", "right"],
        )
    out.heading("Recent activity digest")
    if result.digest:
        lines = result.digest.splitlines()
        for line in lines[:_DIGEST_LINES_SHOWN]:
            out.line(line)
        if len(lines) > _DIGEST_LINES_SHOWN:
            out.line(f"… {len(lines) - _DIGEST_LINES_SHOWN} more lines (see --json)")
    else:
        out.line("(none)")
    out.heading("Request size")
    saved = ""
    if result.tokens_before:
        saved = f" ({result.tokens_after / result.tokens_before - 1:+.0%})"
    out.fields(
        [
            (
                "Before",
                f"{fmt_tokens(result.tokens_before)} tokens in {_count(result.messages_before)}",
            ),
            (
                "After",
                f"{fmt_tokens(result.tokens_after)} tokens in "
                f"{_count(result.messages_after)}{saved}",
            ),
            ("Payload", f"{result.request.format} (valid; print it with --json)"),
        ]
    )
    out.heading("Micro-compaction")
    if result.compacted:
        detail = ", ".join(f"{tool} {n}" for tool, n in result.compacted.items())
        out.line(f"{sum(result.compacted.values())} tool results cleared: {detail}")
    else:
        out.line("no tool results cleared")
    if result.memory_root:
        out.fields([("Memory root", result.memory_root)])


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Register ``mimo-ctx inspect`` on ``subparsers``."""
    inspect = subparsers.add_parser(
        "inspect",
        parents=[common],
        help="show what a rebuild makes of a transcript",
        description="Import a transcript, compute the watermark, write a checkpoint with the "
        "offline writer and rebuild once; show the watermark, the sections with tokens vs "
        "caps, the activity digest, the request before/after and the exact payload.",
    )
    add_transcript_arguments(inspect)
    inspect.add_argument(
        "--window",
        type=window_tokens,
        default=_DEFAULT_WINDOW,
        metavar="N",
        help="model context window in tokens (200000, 200K, 1M; default 200K)",
    )
    inspect.add_argument(
        "--at",
        metavar="MESSAGE_ID",
        help="consider only messages up to this one: #N (0-based position), a message id "
        "printed by inspect/replay, or the transcript's own id (Claude Code uuid)",
    )
    inspect.add_argument(
        "--format",
        choices=PROVIDER_FORMATS,
        default="openai",
        help="provider payload to produce (default openai)",
    )
    inspect.add_argument(
        "--memory-root", metavar="DIR", help="keep the checkpoint files in this directory"
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON document")
    inspect.set_defaults(run=_run)


async def _run(args: argparse.Namespace, streams: Streams) -> int:
    config = load_cli_config(cast("str | None", args.config))
    transcript = await read_transcript_argument(args, streams)
    at_arg = cast("str | None", args.at)
    at = resolve_at(transcript, at_arg) if at_arg is not None else None
    memory_arg = cast("str | None", args.memory_root)
    result = await inspect_transcript(
        transcript,
        window=cast(int, args.window),
        at=at,
        fmt=cast(ProviderFormat, args.format),
        config=config,
        memory_root=Path(memory_arg) if memory_arg else None,
    )
    if args.json:
        dump_json(result.to_json(), streams.out)
    else:
        print_inspect(result, transcript, Output(streams.out, plain=args.plain))
    return 0
