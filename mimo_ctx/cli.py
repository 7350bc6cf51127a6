"""The ``mimo-ctx`` command.

Subcommands:

* ``demo`` -- a scripted agent session on the embedded SQLite store, offline:
  writers start, the trigger line fires, the boundary is inserted.
* ``inspect FILE`` -- import a real transcript and show what one rebuild makes
  of it (watermark, sections, digest, request before/after, the exact payload).
* ``replay FILE --window N`` -- drive a whole transcript through the middleware
  turn by turn and report every writer run and rebuild.
* ``render --store PATH`` -- print what the next request of a stored session
  would carry, without changing the store.
* ``db upgrade --dsn URL`` -- create or upgrade the PostgreSQL store's schema
  (the migration step of a multi-worker deployment).

Human output uses ``rich`` when it is installed (the ``cli`` extra) and plain
text otherwise; ``--json`` prints exactly one JSON document on stdout.

Exit codes: 0 success; 2 a usage error or an input the command cannot use (a
corrupt or unknown file, a missing session, an invalid setting), reported as
one line on stderr, never a traceback; 1 an internal error (``--debug`` shows
its traceback); 130 interrupted.

Adding a subcommand: write ``_add_<name>(subparsers, common)`` registering its
parser with ``set_defaults(run=<async function taking the parsed arguments and
the output streams>)`` and call it from :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TextIO, cast

import anyio
import anyio.to_thread

from mimo_ctx._cli_common import PROVIDER_FORMATS, CliError, ProviderFormat, load_cli_config
from mimo_ctx._cli_output import Output, dump_json, fmt_tokens
from mimo_ctx.config import parse_token_amount
from mimo_ctx.errors import MimoCtxError

__all__ = ["build_parser", "main"]

_PROG = "mimo-ctx"
_DEFAULT_INSPECT_WINDOW = 200_000


@dataclass(frozen=True, slots=True)
class Streams:
    """Where a command writes: ``out`` for results, ``err`` for diagnostics."""

    out: TextIO
    err: TextIO


Runner = Callable[[argparse.Namespace, Streams], Awaitable[int]]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit code 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _window(value: str) -> int:
    try:
        tokens = parse_token_amount(value)
    except (MimoCtxError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"expected a token count such as 200000, 200K or 1M, got {value!r}"
        ) from exc
    if tokens <= 0:
        raise argparse.ArgumentTypeError(f"the window must be positive, got {value!r}")
    return tokens


def build_parser() -> argparse.ArgumentParser:
    """The ``mimo-ctx`` argument parser."""
    parser = _Parser(
        prog=_PROG,
        description="Context rebuild and budgeted injection for LLM agents: demo, "
        "inspect and replay real transcripts, render a stored session's next request.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--plain", action="store_true", help="plain text output even when rich is installed"
    )
    common.add_argument(
        "--debug", action="store_true", help="show the traceback of an internal error"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    _add_demo(subparsers, common)
    _add_inspect(subparsers, common)
    _add_replay(subparsers, common)
    _add_render(subparsers, common)
    _add_db(subparsers, common)
    _add_bench(subparsers, common)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mimo-ctx")
    except PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------- #
# demo
# --------------------------------------------------------------------------- #


def _add_demo(subparsers: Any, common: argparse.ArgumentParser) -> None:
    demo = subparsers.add_parser(
        "demo",
        parents=[common],
        help="run a scripted agent session offline and show a rebuild",
        description="Run a scripted agent session (no network, no API key) on the embedded "
        "SQLite store: usage thresholds start the checkpoint writer, the trigger line "
        "fires and the rebuild boundary is inserted.",
    )
    demo.add_argument(
        "--store",
        metavar="PATH",
        help="keep the session in this SQLite file (default: a temporary directory)",
    )
    demo.add_argument(
        "--memory-root",
        metavar="DIR",
        help="memory files directory (default with --store: <dir>/<stem>-memory beside it)",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON document")
    demo.set_defaults(run=_run_demo)


async def _run_demo(args: argparse.Namespace, streams: Streams) -> int:
    from mimo_ctx._cli_demo import print_demo, run_demo
    from mimo_ctx._cli_render import default_memory_root

    store_arg = cast("str | None", args.store)
    memory_arg = cast("str | None", args.memory_root)
    if store_arg is not None:
        store_path = Path(store_arg)
        if await anyio.Path(store_path).is_dir():
            raise CliError(f"--store {store_path}: a directory; give a file path such as demo.db")
        memory_root = Path(memory_arg) if memory_arg else default_memory_root(store_path)
        result = await run_demo(store_path, memory_root, kept=True)
    else:
        directory = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "mimo-ctx-demo-"))
        try:
            memory_root = Path(memory_arg) if memory_arg else directory / "memory"
            result = await run_demo(
                directory / "demo.db", memory_root, memory_kept=memory_arg is not None
            )
        finally:
            await anyio.to_thread.run_sync(partial(shutil.rmtree, directory, ignore_errors=True))
    if args.json:
        dump_json(result.to_json(), streams.out)
    else:
        print_demo(result, Output(streams.out, plain=args.plain))
    return 0


# --------------------------------------------------------------------------- #
# inspect / replay
# --------------------------------------------------------------------------- #


def _add_transcript_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        metavar="FILE",
        help="a transcript (Claude Code JSONL, OpenAI chat or Responses JSON, SWE-agent .traj)",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="settings file (.toml or .json, `checkpoint` table)"
    )


def _add_inspect(subparsers: Any, common: argparse.ArgumentParser) -> None:
    inspect = subparsers.add_parser(
        "inspect",
        parents=[common],
        help="show what a rebuild makes of a transcript",
        description="Import a transcript, compute the watermark, write a checkpoint with the "
        "offline writer and rebuild once; show the watermark, the sections with tokens vs "
        "caps, the activity digest, the request before/after and the exact payload.",
    )
    _add_transcript_arguments(inspect)
    inspect.add_argument(
        "--window",
        type=_window,
        default=_DEFAULT_INSPECT_WINDOW,
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
    inspect.set_defaults(run=_run_inspect)


def _load(path_arg: str) -> Any:
    from mimo_ctx.importers import load_transcript
    from mimo_ctx.replay import stable_ids

    path = Path(path_arg)
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: a directory, not a transcript file")
    return stable_ids(load_transcript(path))


async def _run_inspect(args: argparse.Namespace, streams: Streams) -> int:
    from mimo_ctx._cli_inspect import inspect_transcript, print_inspect, resolve_at
    from mimo_ctx.importers import ImportedTranscript

    config = load_cli_config(cast("str | None", args.config))
    transcript = cast(ImportedTranscript, await anyio.to_thread.run_sync(_load, args.file))
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


def _add_replay(subparsers: Any, common: argparse.ArgumentParser) -> None:
    replay = subparsers.add_parser(
        "replay",
        parents=[common],
        help="drive a whole transcript through the middleware turn by turn",
        description="Replay a transcript through the middleware (offline writer): report "
        "every writer run and rebuild, the peak request, the tokens sent and the share of "
        "the user's own words each rebuilt request keeps; side by side with the "
        "transcript's own compactions.",
    )
    _add_transcript_arguments(replay)
    replay.add_argument(
        "--window",
        type=_window,
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
    replay.set_defaults(run=_run_replay)


async def _run_replay(args: argparse.Namespace, streams: Streams) -> int:
    from mimo_ctx.importers import ImportedTranscript
    from mimo_ctx.replay import replay_transcript

    config = load_cli_config(cast("str | None", args.config))
    transcript = cast(ImportedTranscript, await anyio.to_thread.run_sync(_load, args.file))
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


# --------------------------------------------------------------------------- #
# render
# --------------------------------------------------------------------------- #


def _add_render(subparsers: Any, common: argparse.ArgumentParser) -> None:
    render = subparsers.add_parser(
        "render",
        parents=[common],
        help="print what the next request of a stored session would carry",
        description="Print the next request of a session stored in an SQLite store, without "
        "changing the store (no writer starts, nothing is rebuilt).",
    )
    render.add_argument("--store", metavar="PATH", required=True, help="the SQLite store file")
    render.add_argument(
        "--session", metavar="ID", help="the session (default: the newest session in the store)"
    )
    render.add_argument(
        "--format",
        choices=("text", *PROVIDER_FORMATS),
        default="text",
        help="text (default), or the openai / anthropic payload",
    )
    render.add_argument(
        "--memory-root",
        metavar="DIR",
        help="the session's memory root (default: <dir>/<stem>-memory beside the store)",
    )
    render.add_argument("--full", action="store_true", help="do not shorten long parts (text)")
    render.add_argument("--config", metavar="FILE", help="settings file (.toml or .json)")
    render.add_argument("--json", action="store_true", help="print one JSON document")
    render.set_defaults(run=_run_render)


async def _run_render(args: argparse.Namespace, streams: Streams) -> int:
    from mimo_ctx._cli_render import RenderFormat, print_render, render_session

    config = load_cli_config(cast("str | None", args.config))
    memory_arg = cast("str | None", args.memory_root)
    result = await render_session(
        Path(cast(str, args.store)),
        cast("str | None", args.session),
        memory_root=Path(memory_arg) if memory_arg else None,
        fmt=cast(RenderFormat, args.format),
        config=config,
    )
    if args.json:
        dump_json(result.to_json(), streams.out)
    else:
        print_render(result, Output(streams.out, plain=args.plain), full=args.full)
    return 0


# --------------------------------------------------------------------------- #
# db
# --------------------------------------------------------------------------- #


def _add_bench(subparsers: Any, common: argparse.ArgumentParser) -> None:
    from mimo_ctx.bench import add_arguments

    bench = subparsers.add_parser(
        "bench",
        parents=[common],
        help="run the benchmarks (needs a source checkout)",
        description="Run the benchmarks of benchmarks/ and print their tables (issue 9).",
    )
    add_arguments(bench)
    bench.set_defaults(run=_run_bench)


async def _run_bench(args: argparse.Namespace, streams: Streams) -> int:
    from mimo_ctx.bench import run_command

    # Each benchmark runs its own event loop: run them in a worker thread.
    return await anyio.to_thread.run_sync(
        partial(run_command, args, out=streams.out, err=streams.err)
    )


def _add_db(subparsers: Any, common: argparse.ArgumentParser) -> None:
    db = subparsers.add_parser(
        "db",
        help="manage the schema of a PostgreSQL store",
        description="Manage the schema of a PostgreSQL store (several workers share one).",
    )
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", parser_class=_Parser)
    actions.required = True
    upgrade = actions.add_parser(
        "upgrade",
        parents=[common],
        help="create or upgrade the store schema",
        description="Create the store's tables, or bring them to this version's schema. "
        "Each version's migration runs in one transaction; running it again, or from several "
        'workers at once, is safe. Needs asyncpg (pip install "mimo-ctx[postgres]").',
    )
    upgrade.add_argument(
        "--dsn",
        required=True,
        metavar="URL",
        help="postgresql://user@host:5432/db (the password may come from PGPASSWORD or "
        "~/.pgpass instead of the URL)",
    )
    upgrade.add_argument(
        "--schema",
        default="mimo_ctx",
        metavar="NAME",
        help="PostgreSQL schema (namespace) of the store's tables (default mimo_ctx)",
    )
    upgrade.add_argument("--json", action="store_true", help="print one JSON document")
    upgrade.set_defaults(run=_run_db_upgrade)


async def _run_db_upgrade(args: argparse.Namespace, streams: Streams) -> int:
    from mimo_ctx.store import is_postgres_url

    dsn = cast(str, args.dsn)
    schema = cast(str, args.schema)
    if not is_postgres_url(dsn):
        # Never echo the value: it may hold a password.
        raise CliError("--dsn: expected a postgresql:// (or postgres://) URL")
    try:
        from mimo_ctx.store.postgres import SCHEMA_VERSION, upgrade
    except ImportError as exc:
        raise CliError(str(exc)) from None
    version = await upgrade(dsn.strip(), schema=schema)
    if args.json:
        dump_json({"schema": schema, "version": version, "supported": SCHEMA_VERSION}, streams.out)
    else:
        Output(streams.out, plain=args.plain).line(
            f"mimo-ctx db upgrade: schema {schema!r} is at store schema version {version} "
            "(up to date)"
        )
    return 0


# --------------------------------------------------------------------------- #
# entry point
# --------------------------------------------------------------------------- #


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the command; returns the exit code.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        stdout: Where results go (default: ``sys.stdout``).
        stderr: Where errors go (default: ``sys.stderr``).
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parser = build_parser()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 2
    run = cast(Runner, args.run)
    try:
        return anyio.run(run, args, Streams(out, err))
    except KeyboardInterrupt:
        err.write(f"{_PROG}: interrupted\n")
        return 130
    except Exception as exc:
        error = _leaf(exc)
        if isinstance(error, BrokenPipeError):
            # The reader went away (``mimo-ctx ... | head``): stop quietly, like
            # a process killed by SIGPIPE, without a second error at exit.
            _silence(out)
            return 141
        if isinstance(error, MimoCtxError | OSError):
            err.write(f"{_PROG}: error: {_one_line(str(error))}\n")
            return 2
        if getattr(args, "debug", False):
            raise
        err.write(
            f"{_PROG}: internal error: {type(error).__name__}: {_one_line(str(error))} "
            "(run with --debug for the traceback)\n"
        )
        return 1


def _silence(stream: TextIO) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):
        pass


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups raised by task groups."""
    current: BaseException = exc
    while isinstance(current, BaseExceptionGroup):
        inner = cast("tuple[BaseException, ...]", current.exceptions)
        if len(inner) != 1:
            break
        current = inner[0]
    return cast(BaseException, current)


if __name__ == "__main__":
    sys.exit(main())
