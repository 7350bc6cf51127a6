"""``mimo-ctx render``: what the next request of a stored session would carry.

Read-only by construction: ``prepare`` can start a checkpoint writer or rebuild
when the session's last usage crossed a threshold or the trigger line, and
``render`` must never change the store. So the view is computed by a separate
:class:`~mimo_ctx.middleware.ContextMiddleware` whose model window is
effectively unbounded (no trigger line is ever crossed) and whose checkpoints
are off (no writer starts). The request it returns is exactly what the session's
own middleware would send next *without* a rebuild: the frozen prefix, the
newest boundary, the collapsed tail with compacted results as placeholders, and
the per-turn reminder (in memory only). If the session is over its trigger
line, its own middleware would rebuild first; ``render`` shows the request as
it stands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import anyio

from mimo_ctx.cli._common import (
    PROVIDER_FORMATS,
    CliError,
    ProviderRequest,
    StoredSessionArguments,
    Streams,
    add_stored_session_arguments,
    provider_request,
)
from mimo_ctx.cli._output import Output, dump_json, fmt_tokens
from mimo_ctx.config import RebuildConfig
from mimo_ctx.digest import format_tool_call
from mimo_ctx.messages import (
    FilePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
)
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.store.sqlite import SQLiteStore
from mimo_ctx.tokens import estimate_message_tokens
from mimo_ctx.triggers import ModelLimits

__all__ = [
    "RenderFormat",
    "RenderResult",
    "add_parser",
    "default_memory_root",
    "message_text",
    "print_render",
    "render_session",
    "stored_session",
]

RenderFormat = Literal["text", "openai", "anthropic"]

_UNBOUNDED = ModelLimits(context_window=2**50, input_limit=2**50)
_PART_CHARS = 1500


def default_memory_root(store_path: Path) -> Path:
    """The memory root used beside a store when none is given: ``<dir>/<stem>-memory``."""
    return store_path.with_name(f"{store_path.stem}-memory")


@dataclass(frozen=True, slots=True)
class RenderResult:
    """The next request of a stored session."""

    store_path: str
    session_id: str
    view: RequestView
    format: RenderFormat
    request: ProviderRequest | None

    def to_json(self) -> dict[str, Any]:
        """``{"session_id", "tokens", "boundary_id", "request": {"format", "messages"}}``."""
        if self.request is not None:
            request = self.request.to_json()
        else:
            request = {
                "format": "text",
                "messages": [
                    {
                        "id": m.id,
                        "role": m.role,
                        "agent": m.agent,
                        "tokens": estimate_message_tokens(m),
                        "text": message_text(m),
                    }
                    for m in self.view.messages
                ],
            }
        return {
            "session_id": self.session_id,
            "store": self.store_path,
            "tokens": self.view.tokens,
            "boundary_id": self.view.boundary_id,
            "system": self.view.prefix.system,
            "tools": len(self.view.prefix.tools),
            "request": request,
        }


@contextlib.asynccontextmanager
async def stored_session(
    store_path: Path, session_id: str | None
) -> AsyncGenerator[tuple[SQLiteStore, str]]:
    """The SQLite store at ``store_path`` and one of its sessions (default: the newest).

    Raises:
        CliError: The store file or the session does not exist.
        StoreError: The file is not a mimo_ctx store.
    """
    if not await anyio.Path(store_path).is_file():
        raise CliError(f"no store at {store_path} (give the SQLite file `mimo-ctx demo` wrote)")
    # Read-only: nothing is ever written to the file (an empty file stays empty, a
    # read-only mount works).
    async with await SQLiteStore.open(store_path, read_only=True) as store:
        sessions = await store.list_sessions()
        if session_id is None:
            if not sessions:
                raise CliError(f"the store {store_path} holds no session")
            session_id = sessions[-1].id
        elif await store.get_session(session_id) is None:
            known = ", ".join(s.id for s in sessions[-5:]) or "none"
            raise CliError(f"no session {session_id!r} in {store_path} (newest sessions: {known})")
        yield store, session_id


async def render_session(
    store_path: Path,
    session_id: str | None,
    *,
    memory_root: Path | None = None,
    fmt: RenderFormat = "text",
    config: RebuildConfig | None = None,
) -> RenderResult:
    """Compute the next request of a stored session without changing the store.

    Args:
        store_path: An SQLite store written by mimo_ctx.
        session_id: The session; the newest one when ``None``.
        memory_root: The session's memory root (default: :func:`default_memory_root`).
        fmt: ``text``, or a provider payload (``openai``, ``anthropic``).
        config: The session's tuning (caps do not matter here; nothing is rebuilt).

    Raises:
        CliError: The store file or the session does not exist.
        StoreError: The file is not a mimo_ctx store.
    """
    root = memory_root if memory_root is not None else default_memory_root(store_path)
    # Read-only: no trigger line can be crossed and no writer can start.
    read_only = (config or RebuildConfig()).model_copy(
        update={"checkpoint_enabled": False, "trigger_ratio": 1.0}
    )
    async with (
        stored_session(store_path, session_id) as (store, chosen),
        ContextMiddleware(store, root, model=_UNBOUNDED, config=read_only) as mw,
    ):
        view = await mw.prepare(chosen)
    request = (
        None
        if fmt == "text"
        else provider_request(view.messages, system=view.prefix.system, fmt=fmt)
    )
    return RenderResult(
        store_path=str(store_path), session_id=chosen, view=view, format=fmt, request=request
    )


def _cut(text: str, full: bool) -> str:
    if full or len(text) <= _PART_CHARS:
        return text
    return f"{text[:_PART_CHARS]}\n… ({len(text) - _PART_CHARS:,} more characters; use --full)"


def message_text(message: Message, *, full: bool = True) -> str:
    """A message as plain text: text, reasoning, tool calls with their results, files."""
    chunks: list[str] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            chunks.append(_cut(part.text, full))
        elif isinstance(part, ReasoningPart):
            chunks.append(f"(reasoning) {_cut(part.text, full)}")
        elif isinstance(part, ToolPart):
            call = format_tool_call(part.tool, dict(part.state.input))
            if isinstance(part.state, ToolStateCompleted):
                chunks.append(f"-> {call}\n{_cut(part.state.output, full)}")
            elif isinstance(part.state, ToolStateError):
                chunks.append(f"-> {call}\nerror: {_cut(part.state.error, full)}")
            else:
                chunks.append(f"-> {call} ({part.state.status})")
        elif isinstance(part, ToolResultPart):
            label = "error" if part.is_error else "result"
            chunks.append(f"<- {label} of {part.tool} ({part.call_id})\n{_cut(part.output, full)}")
        elif isinstance(part, FilePart):
            chunks.append(f"[file {part.filename or part.url[:60]} ({part.mime})]")
        else:
            chunks.append(f"[{part.type}]")
    return "\n".join(chunks)


def print_render(result: RenderResult, out: Output, *, full: bool = False) -> None:
    """Human output of ``render``."""
    view = result.view
    out.heading(f"mimo-ctx render: next request of {result.session_id}")
    out.fields(
        [
            ("Store", result.store_path),
            ("Tokens", f"{fmt_tokens(view.tokens)} (estimated; prefix included)"),
            ("Boundary", view.boundary_id or "none (no rebuild yet)"),
            ("Messages", str(len(view.messages))),
            ("Tools", str(len(view.prefix.tools))),
        ]
    )
    if result.request is not None:
        out.heading(f"{result.request.format} payload")
        out.line(json.dumps(result.request.messages, indent=2, ensure_ascii=False))
        return
    if view.prefix.system:
        out.heading("system")
        out.line(_cut(view.prefix.system, full))
    for number, message in enumerate(view.messages):
        out.heading(
            f"[{number}] {message.role}"
            + (f" ({message.agent})" if message.agent != "main" else "")
            + f" {message.id} ~{fmt_tokens(estimate_message_tokens(message))} tokens"
        )
        out.line(message_text(message, full=full))


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Register ``mimo-ctx render`` on ``subparsers``."""
    render = subparsers.add_parser(
        "render",
        parents=[common],
        help="print what the next request of a stored session would carry",
        description="Print the next request of a session stored in an SQLite store, without "
        "changing the store (no writer starts, nothing is rebuilt).",
    )
    add_stored_session_arguments(render)
    render.add_argument(
        "--format",
        choices=("text", *PROVIDER_FORMATS),
        default="text",
        help="text (default), or the openai / anthropic payload",
    )
    render.add_argument("--full", action="store_true", help="do not shorten long parts (text)")
    render.set_defaults(run=_run)


async def _run(args: argparse.Namespace, streams: Streams) -> int:
    stored = StoredSessionArguments.of(args)
    result = await render_session(
        stored.store,
        stored.session,
        memory_root=stored.memory_root,
        fmt=cast(RenderFormat, args.format),
        config=stored.config,
    )
    if args.json:
        dump_json(result.to_json(), streams.out)
    else:
        print_render(result, Output(streams.out, plain=args.plain), full=args.full)
    return 0
