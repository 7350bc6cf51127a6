"""``mimo-ctx replay``: drive a whole transcript through the middleware and report it.

The work is :func:`~mimo_ctx.replay.replay_transcript`; this module parses the
command line and prints the report (writer runs, rebuilds beside the
transcript's own compactions, the peak request and the tokens sent).
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any, Final, cast

import anyio
import anyio.to_thread

from mimo_ctx.checkpoint import LLMCheckpointWriter
from mimo_ctx.cli._common import (
    CliError,
    Streams,
    add_transcript_arguments,
    load_cli_config,
    read_transcript_argument,
    window_tokens,
)
from mimo_ctx.cli._output import Output, dump_json, fmt_tokens
from mimo_ctx.errors import ConfigError
from mimo_ctx.plot import PLOT_FORMATS, marker_line, save_replay_plot, sparkline
from mimo_ctx.replay import ReplayReport, replay_transcript

__all__ = ["add_parser"]

SPARK_WIDTH: Final = 72
"""Characters of the terminal sparkline (a longer replay is drawn in buckets)."""


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Register ``mimo-ctx replay`` on ``subparsers``."""
    replay = subparsers.add_parser(
        "replay",
        parents=[common],
        help="drive a whole transcript through the middleware turn by turn",
        description="Replay a transcript through the middleware (offline writer unless "
        "--writer names a model): report "
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
    replay.add_argument(
        "--plot",
        metavar="OUT",
        help="also draw the replay as a chart, OUT.png or OUT.svg (the plot extra: matplotlib)",
    )
    replay.add_argument(
        "--writer",
        default="offline",
        metavar="WRITER",
        help="the checkpoint writer: offline (default), or a model writer openai:MODEL, "
        "openai-responses:MODEL or anthropic:MODEL (key and base URL from the SDK's "
        "environment variables); its calls and tokens are reported",
    )
    replay.add_argument(
        "--writer-window",
        type=window_tokens,
        metavar="N",
        help="the writer model's context window (default: --window)",
    )
    replay.add_argument("--json", action="store_true", help="print one JSON document")
    replay.set_defaults(run=_run)


def _writer(spec: str, window: int | None) -> LLMCheckpointWriter | None:
    """``--writer``: ``None`` for the offline writer, else the model writer it names."""
    if spec == "offline":
        return None
    try:
        from mimo_ctx.providers.checkpoint_writer import writer_from_spec

        return writer_from_spec(spec, limits=window)
    except (ConfigError, ImportError) as exc:
        raise CliError(f"--writer {spec}: {exc}") from None


def _plot_target(value: str | None) -> Path | None:
    """The ``--plot`` file, checked before the replay runs (it may take minutes)."""
    if value is None:
        return None
    target = Path(value)
    if target.suffix.lower() not in PLOT_FORMATS:
        raise CliError(f"--plot {value}: the chart is written as .png or .svg")
    if not target.parent.is_dir():
        raise CliError(f"--plot {value}: no such directory {target.parent}")
    try:
        importlib.import_module("matplotlib.figure")
    except ImportError:
        raise CliError('--plot needs matplotlib: pip install "mimo-ctx[plot]"') from None
    return target


def _writer_cost(report: ReplayReport) -> list[tuple[str, str]]:
    """The summary line of a model writer's cost (none for the offline writer)."""
    cost = report.writer_tokens()
    if not cost["calls"]:
        return []
    return [
        (
            "Writer tokens",
            f"{fmt_tokens(cost['sent'])} sent ({fmt_tokens(cost['cached'])} cached), "
            f"{fmt_tokens(cost['output'])} output, over {cost['calls']} model calls",
        )
    ]


def _sparkline_rows(report: ReplayReport) -> list[str]:
    """The requests as a sparkline (full block = the window) and a line of markers."""
    series = [r.tokens for r in report.requests]
    position = {r.at: i for i, r in enumerate(report.requests)}

    def spot(at: int) -> int:
        # A marker sits on the first request at or after its transcript position.
        later = [i for a, i in position.items() if a >= at]
        return min(later) if later else len(series) - 1

    marks: list[tuple[int, str]] = [(spot(w.at), "w") for w in report.writer_runs]
    marks += [(spot(c.at), "C") for c in report.transcript_compactions]
    marks += [(spot(r.at), "R") for r in report.rebuilds]
    marks += [(spot(o.at), "O") for o in report.overflows]
    return [
        sparkline(series, top=report.window, width=SPARK_WIDTH),
        marker_line(len(series), marks, width=SPARK_WIDTH),
    ]


async def _run(args: argparse.Namespace, streams: Streams) -> int:
    config = load_cli_config(cast("str | None", args.config))
    plot = _plot_target(cast("str | None", args.plot))
    writer = _writer(cast(str, args.writer), cast("int | None", args.writer_window))
    transcript = await read_transcript_argument(args, streams)
    try:
        report = await replay_transcript(
            transcript,
            window=cast(int, args.window),
            config=config,
            use_transcript_usage=not args.estimate_usage,
            writer=writer,
        )
    finally:
        if writer is not None:
            await writer.aclose()
    if plot is not None:
        title = transcript.source.name
        await anyio.to_thread.run_sync(lambda: save_replay_plot(report, plot, title=title))
    if args.json:
        document = report.to_json()
        if plot is not None:
            document["plot"] = str(plot)
        dump_json(document, streams.out)
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
    if report.overflows:
        out.heading("Provider overflows (requests over the input limit)")
        out.table(
            ["At", "Tokens", "Recovered"],
            [
                [f"#{o.at}", fmt_tokens(o.tokens), "yes" if o.recovered else "no"]
                for o in report.overflows
            ],
            align=["right", "right", "left"],
        )
    out.heading(
        f"Tokens sent per request (a full block is the window, {fmt_tokens(report.window)})"
    )
    for row in _sparkline_rows(report):
        out.line(row)
    out.line("w writer run · R rebuild · O provider overflow · C the transcript's own compaction")
    out.heading("Summary")
    out.fields(
        [
            ("Peak request", f"{fmt_tokens(report.peak_request_tokens)} tokens (estimated)"),
            ("Tokens sent", f"{fmt_tokens(report.total_tokens_sent)} over {report.turns} requests"),
            ("Writer runs", str(len(report.writer_runs))),
            *_writer_cost(report),
            ("Rebuilds", str(len(report.rebuilds))),
            ("Provider overflows", str(len(report.overflows))),
            *([("Plot", str(plot))] if plot is not None else []),
        ]
    )
    return 0
