"""Pieces the ``mimo-ctx`` subcommands share: parsing, errors, provider payloads, body parsing."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO, cast

import anyio
import anyio.to_thread

from mimo_ctx.config import RebuildConfig, load_config, parse_token_amount
from mimo_ctx.errors import CliError, MimoCtxError, TranscriptError
from mimo_ctx.importers import ImportedTranscript, load_transcript
from mimo_ctx.messages import Message, TextPart, ToolPart, ToolResultPart, ToolStateCompleted
from mimo_ctx.providers.anthropic import to_anthropic
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.reminders import closing_line
from mimo_ctx.render import SectionFigure
from mimo_ctx.replay import stable_ids
from mimo_ctx.sections import HEADING_RECENT_ACTIVITY

__all__ = [
    "PROVIDER_FORMATS",
    "CliError",
    "Parser",
    "ProviderFormat",
    "ProviderRequest",
    "Runner",
    "StoredSessionArguments",
    "Streams",
    "activity_digest",
    "add_stored_session_arguments",
    "add_transcript_arguments",
    "compacted_by_tool",
    "load_cli_config",
    "load_transcript_file",
    "provider_request",
    "read_transcript_argument",
    "section_json",
    "window_tokens",
]

ProviderFormat = Literal["openai", "anthropic"]
PROVIDER_FORMATS: tuple[ProviderFormat, ...] = ("openai", "anthropic")


@dataclass(frozen=True, slots=True)
class Streams:
    """Where a command writes: ``out`` for results, ``err`` for diagnostics."""

    out: TextIO
    err: TextIO


Runner = Callable[[argparse.Namespace, Streams], Awaitable[int]]
"""What a subcommand's parser sets as ``run=``: the parsed arguments and streams to an exit code."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit code 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def window_tokens(value: str) -> int:
    """``--window``: a positive token count such as ``200000``, ``200K`` or ``1M``."""
    try:
        tokens = parse_token_amount(value)
    except (MimoCtxError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"expected a token count such as 200000, 200K or 1M, got {value!r}"
        ) from exc
    if tokens <= 0:
        raise argparse.ArgumentTypeError(f"the window must be positive, got {value!r}")
    return tokens


def add_transcript_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``FILE`` and ``--config`` arguments of the commands that read a transcript."""
    parser.add_argument(
        "file",
        metavar="FILE",
        help="a transcript (Claude Code JSONL, OpenAI chat or Responses JSON, SWE-agent .traj)",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="settings file (.toml or .json, `checkpoint` table)"
    )
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="skip malformed lines (listed on stderr) instead of refusing the file: a live "
        "transcript whose last line is still being written",
    )


def load_transcript_file(path_arg: str, *, strict: bool = True) -> ImportedTranscript:
    """Import a transcript file with stable ids (blocking: call it in a worker thread).

    Args:
        path_arg: The file.
        strict: Refuse the file at its first malformed line; ``False`` skips such
            lines and lists them in the transcript's ``skipped``.

    Raises:
        CliError: The path does not exist or is a directory.
        TranscriptError: ``strict`` and a line is malformed (file and line named).
    """
    path = Path(path_arg)
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: a directory, not a transcript file")
    return stable_ids(load_transcript(path, strict=strict))


async def read_transcript_argument(
    args: argparse.Namespace, streams: Streams
) -> ImportedTranscript:
    """The ``FILE`` of a transcript command, read as ``--lenient`` says.

    Skipped lines are listed on stderr, one line each (``FILE:LINE: skipped: why``),
    so the command's own output (its JSON document too) is unchanged.
    """
    strict = not bool(args.lenient)
    try:
        transcript = await anyio.to_thread.run_sync(
            lambda: load_transcript_file(cast(str, args.file), strict=strict)
        )
    except TranscriptError as exc:
        if not strict or exc.line is None:
            raise
        raise CliError(f"{exc} (--lenient skips malformed lines)") from exc
    for skipped in transcript.skipped:
        where = f"{skipped.path}:{skipped.line}" if skipped.line is not None else skipped.path
        streams.err.write(f"{where}: skipped: {skipped.reason}\n")
    return transcript


def load_cli_config(path: str | None) -> RebuildConfig:
    """The settings: ``pyproject.toml``, the ``--config`` file, ``MIMO_CTX_*`` variables."""
    return load_config(Path(path) if path else None)


def add_stored_session_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of the commands that read a session in an SQLite store.

    ``--store``, ``--session``, ``--memory-root``, ``--config`` and ``--json``; read
    them back with :meth:`StoredSessionArguments.of`.
    """
    parser.add_argument("--store", metavar="PATH", required=True, help="the SQLite store file")
    parser.add_argument(
        "--session", metavar="ID", help="the session (default: the newest session in the store)"
    )
    parser.add_argument(
        "--memory-root",
        metavar="DIR",
        help="the session's memory root (default: <dir>/<stem>-memory beside the store)",
    )
    parser.add_argument("--config", metavar="FILE", help="settings file (.toml or .json)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


@dataclass(frozen=True, slots=True)
class StoredSessionArguments:
    """What :func:`add_stored_session_arguments` parsed.

    Attributes:
        store: The SQLite store file.
        session: The session id (``None``: the newest session in the store).
        memory_root: The memory root (``None``: the default beside the store).
        config: The settings (see :func:`load_cli_config`).
    """

    store: Path
    session: str | None
    memory_root: Path | None
    config: RebuildConfig

    @classmethod
    def of(cls, args: argparse.Namespace) -> StoredSessionArguments:
        """Read the arguments back; loads the ``--config`` settings."""
        memory_root = cast("str | None", args.memory_root)
        return cls(
            store=Path(cast(str, args.store)),
            session=cast("str | None", args.session),
            memory_root=Path(memory_root) if memory_root else None,
            config=load_cli_config(cast("str | None", args.config)),
        )


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """The exact payload a provider would get.

    Attributes:
        format: ``openai`` (Chat Completions) or ``anthropic`` (Messages).
        messages: ``openai``: the ``messages`` list, the system message first when
            the session has a system prompt. ``anthropic``: ``{"system": ...,
            "messages": [...]}`` (``system`` is ``None`` without a system prompt).
    """

    format: ProviderFormat
    messages: list[dict[str, Any]] | dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """``{"format", "messages"}``."""
        return {"format": self.format, "messages": self.messages}


def provider_request(
    messages: Sequence[Message], *, system: str, fmt: ProviderFormat
) -> ProviderRequest:
    """Convert a prepared view to a provider payload and check it before it is shown.

    Raises:
        InvalidRequestError: The payload breaks the provider's pairing rules.
    """
    if fmt == "openai":
        chat = to_openai_chat(messages, system=system or None)
        validate_request(chat, format="openai-chat")
        return ProviderRequest("openai", chat)
    system_out, turns = to_anthropic(messages, system=system or None)
    body: dict[str, Any] = {"system": system_out, "messages": turns}
    validate_request(body, format="anthropic")
    return ProviderRequest("anthropic", body)


def section_json(figure: SectionFigure) -> dict[str, Any]:
    """A section figure as ``{"heading", "tokens", "cap", "key", "unit", "file"}``."""
    return {
        "heading": figure.heading,
        "tokens": figure.tokens,
        "cap": figure.cap,
        "key": figure.key,
        "unit": figure.unit,
        "file": figure.file,
    }


def activity_digest(boundary: Message | None) -> str:
    """The ``# Recent activity`` section of a rebuild boundary's body (``""`` if none)."""
    if boundary is None:
        return ""
    heading = f"# {HEADING_RECENT_ACTIVITY}\n"
    for part in boundary.parts:
        if not isinstance(part, TextPart):
            continue
        text = part.text
        start = text.find(heading)
        if start < 0 or (start > 0 and text[start - 1] != "\n"):
            continue
        end = text.find(closing_line(True), start)
        section = text[start:end] if end >= 0 else text[start:]
        return section.strip()
    return ""


def compacted_by_tool(messages: Sequence[Message]) -> dict[str, int]:
    """How many tool results are marked compacted, per tool name (SPEC R4.5)."""
    counts: Counter[str] = Counter()
    for message in messages:
        for part in message.parts:
            if (
                isinstance(part, ToolPart)
                and isinstance(part.state, ToolStateCompleted)
                and part.state.time.compacted is not None
            ) or (isinstance(part, ToolResultPart) and part.time.compacted is not None):
                counts[part.tool] += 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
