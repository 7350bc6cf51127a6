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
* ``context --store PATH`` -- what that request is made of, part by part, with
  tokens, share of the window and the room before the trigger line (read-only).
* ``db upgrade --dsn URL`` -- create or upgrade the PostgreSQL store's schema
  (the migration step of a multi-worker deployment).

Human output uses ``rich`` when it is installed (the ``cli`` extra) and plain
text otherwise; ``--json`` prints exactly one JSON document on stdout.

Exit codes: 0 success; 2 a usage error or an input the command cannot use (a
corrupt or unknown file, a missing session, an invalid setting), reported as
one line on stderr, never a traceback; 1 an internal error (``--debug`` shows
its traceback); 130 interrupted.

Adding a subcommand: write a module ``mimo_ctx/cli/_<name>.py`` whose
``add_parser(subparsers, common)`` registers its parser with
``set_defaults(run=<async function taking the parsed arguments and the output
streams>)``, and add it to :data:`_COMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TextIO, cast

import anyio

from mimo_ctx import __version__
from mimo_ctx.cli import _context, _db, _demo, _inspect, _render, _replay
from mimo_ctx.cli._common import Parser, Runner, Streams
from mimo_ctx.errors import MimoCtxError

__all__ = ["build_parser", "main"]

_PROG = "mimo-ctx"

_COMMANDS = (_demo, _inspect, _replay, _render, _context, _db)
"""The subcommand modules, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The ``mimo-ctx`` argument parser."""
    parser = Parser(
        prog=_PROG,
        description="Context rebuild and budgeted injection for LLM agents: demo, "
        "inspect and replay real transcripts, render a stored session's next request.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--plain", action="store_true", help="plain text output even when rich is installed"
    )
    common.add_argument(
        "--debug", action="store_true", help="show the traceback of an internal error"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subparsers.required = True
    for command in _COMMANDS:
        command.add_parser(subparsers, common)
    return parser


def _joined_lines(text: str) -> str:
    """A multi-line message as one line (the exit-2 error is always one line)."""
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
        code = anyio.run(run, args, Streams(out, err))
        # Flushed here, not at interpreter exit: a reader gone by then is the same
        # broken pipe, answered the same way.
        out.flush()
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
            err.write(f"{_PROG}: error: {_joined_lines(str(error))}\n")
            return 2
        if getattr(args, "debug", False):
            raise
        err.write(
            f"{_PROG}: internal error: {type(error).__name__}: {_joined_lines(str(error))} "
            "(run with --debug for the traceback)\n"
        )
        return 1
    return code


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
