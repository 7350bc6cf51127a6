"""``mimo-ctx replay``: drive a whole transcript through the middleware and report it.

The work is :func:`~mimo_ctx.replay.replay_transcript`; this module parses the
command line and prints the report (writer runs, rebuilds beside the
transcript's own compactions, the peak request and the tokens sent).
"""

from __future__ import annotations

import argparse
from typing import Any, cast

import anyio
import anyio.to_thread

from mimo_ctx.cli._common import (
    Streams,
    add_transcript_arguments,
    load_cli_config,
    load_transcript_file,
    window_tokens,
)
from mimo_ctx.cli._output import Output, dump_json, fmt_tokens
from mimo_ctx.replay import replay_transcript

__all__ = ["add_parser"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Register ``mimo-ctx replay`` on ``subparsers``."""
    replay = subparsers.add_parser(
        "replay",
        parents=[common],
        help="drive a whole transcript through the middleware turn by turn",
        description="Replay a transcript through the middleware (offline writer): report "
        "every writer run and rebuild, the peak request, the tokens sent and the share of "
        "the user's own words each rebuilt request keeps; side by side with the "
        "transcript's own compactions.",
    )
    add_transcript_arguments(replay)
    replay.add_argument(
        "--window",
        type=window_tokens,
        required=True,
        metavar="N",
        help="model context window in tokens (200000, 200K, 1M)",
    )
    replay.add_argument(
        "--estimate-usage",
        action="store_true",
        help="ignore the transcript's usage figures and estimate every turn",
    )
    replay.add_argument("--json", action="store_true", help="print one JSON document")
    replay.set_defaults(run=_run)


async def _run(args: argparse.Namespace, streams: Streams) -> int:
    config = load_cli_config(cast("str | None", args.config))
    transcript = await anyio.to_thread.run_sync(load_transcript_file, args.file)
    report = await replay_transcript(
        transcript,
        window=cast(int, args.window),
        config=config,
        use_transcript_usage=not args.estimate_usage,
    )
    if args.json:
        dump_json(report.to_json(), streams.out)
        return 0
    out = Output(streams.out, plain=args.plain)
    counts = transcript.counts()
    out.heading(f"mimo-ctx replay: {transcript.source}")
    out.fields(
        [
            (
                "Transcript",
                f"{transcript.format}, {counts['messages']} messages, "
                f"{counts['tool_calls']} tool calls, {counts['subagent_messages']} sub-agent "
                "messages",
            ),
            (
                "Window",
                f"{fmt_tokens(report.window)} tokens; trigger line "
                f"{fmt_tokens(report.trigger_tokens)}",
            ),
            (
                "Turns",
                f"{report.turns} main-agent requests; usage from the transcript for "
                f"{report.transcript_usage_turns}, estimated for {report.estimated_usage_turns}",
            ),
        ]
    )
    out.heading("Checkpoint writer runs")
    if report.writer_runs:
        out.table(
            ["At", "Writer", "Result", "Checkpoint", "Watermark"],
            [
                [
                    f"#{w.at}",
                    w.writer,
                    w.result,
                    fmt_tokens(w.checkpoint_tokens),
                    w.watermark or "-",
                ]
                for w in report.writer_runs
            ],
            align=["right", "left", "left", "right", "left"],
        )
    else:
        out.line("none (no usage threshold was crossed)")
    out.heading("Rebuilds (mimo_ctx) and the transcript's own compactions")
    rows: list[tuple[int, list[str]]] = []
    for r in report.rebuilds:
        kept = "-" if r.user_words_retained is None else f"{r.user_words_retained:.0%}"
        rows.append(
            (
                r.at,
                [
                    f"#{r.at}",
                    "mimo_ctx",
                    r.outcome,
                    fmt_tokens(r.tokens_before),
                    fmt_tokens(r.tokens_after),
                    kept,
                ],
            )
        )
    for c in report.transcript_compactions:
        rows.append(
            (
                c.at,
                [
                    f"#{c.at}",
                    "transcript",
                    f"compaction ({c.trigger or 'unknown'})",
                    fmt_tokens(c.tokens_before),
                    "-",
                    "-",
                ],
            )
        )
    if rows:
        out.table(
            ["At", "By", "What", "Tokens before", "After", "User words kept"],
            [row for _, row in sorted(rows, key=lambda item: item[0])],
            align=["right", "left", "left", "right", "right", "right"],
        )
        if report.transcript_compactions:
            out.line(
                "mimo_ctx sizes are estimates of the request it would send (4 characters a "
                "token; a system prompt the transcript did not record is not counted); the "
                "transcript's are its provider's own counts."
            )
    else:
        out.line("none: the session never reached the trigger line")
    out.heading("Summary")
    out.fields(
        [
            ("Peak request", f"{fmt_tokens(report.peak_request_tokens)} tokens (estimated)"),
            ("Tokens sent", f"{fmt_tokens(report.total_tokens_sent)} over {report.turns} requests"),
            ("Writer runs", str(len(report.writer_runs))),
            ("Rebuilds", str(len(report.rebuilds))),
        ]
    )
    return 0
