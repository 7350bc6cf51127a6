"""``mimo-ctx context``: what the next request of a stored session is made of.

The work is :meth:`~mimo_ctx.middleware.ContextMiddleware.context_usage` (read-only:
no writer starts, nothing is rebuilt or stored); this module opens the store, picks
the session and prints the breakdown: each part with its tokens, its share of the
window and a bar, then the total against the trigger line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final, cast

from mimo_ctx.cli._common import (
    StoredSessionArguments,
    Streams,
    add_stored_session_arguments,
    window_tokens,
)
from mimo_ctx.cli._output import Output, dump_json, fmt_tokens
from mimo_ctx.cli._render import default_memory_root, stored_session
from mimo_ctx.config import RebuildConfig
from mimo_ctx.context_usage import ContextUsage
from mimo_ctx.messages import MAIN_AGENT
from mimo_ctx.middleware import ContextMiddleware

__all__ = ["add_parser", "context_of", "print_context"]

DEFAULT_WINDOW: Final = 200_000
_BAR: Final = 24


async def context_of(
    store_path: Path,
    session_id: str | None,
    *,
    window: int = DEFAULT_WINDOW,
    agent: str = MAIN_AGENT,
    memory_root: Path | None = None,
    config: RebuildConfig | None = None,
) -> ContextUsage:
    """The breakdown of a stored session's next request (the store is not changed).

    Raises:
        CliError: The store file or the session does not exist.
        StoreError: The file is not a mimo_ctx store.
    """
    root = memory_root if memory_root is not None else default_memory_root(store_path)
    async with (
        stored_session(store_path, session_id) as (store, chosen),
        ContextMiddleware(store, root, model=window, config=config) as mw,
    ):
        return await mw.context_usage(chosen, agent=agent)


def _bar(share: float) -> str:
    cells = share * _BAR
    full = int(cells)
    return "█" * full + ("▌" if cells - full >= 0.5 else "")


def print_context(usage: ContextUsage, out: Output) -> None:
    """Human output of ``context``."""
    out.heading(f"mimo-ctx context: next request of {usage.session_id}")
    out.fields(
        [
            ("Agent", usage.agent),
            ("Boundary", usage.boundary_id or "none (no rebuild yet)"),
            ("Messages", str(usage.messages)),
            (
                "Last usage",
                "-"
                if usage.last_usage is None
                else f"{fmt_tokens(usage.last_usage)} tokens "
                "(the provider's count of the last answer)",
            ),
        ]
    )
    rows = [
        [p.name, fmt_tokens(p.tokens), f"{p.share:.1%}", str(p.items), _bar(p.share)]
        for p in usage.parts
        if p.tokens or p.items
    ]
    out.table(
        ["Part", "Tokens", "Window", "Items", ""],
        rows,
        align=["left", "right", "right", "right", "left"],
        title="What the next request is made of (estimated tokens)",
    )
    room = usage.room_before_trigger
    out.fields(
        [
            (
                "Total",
                f"{fmt_tokens(usage.total_tokens)} tokens, {usage.share:.1%} of the "
                f"{fmt_tokens(usage.window)}-token window",
            ),
            ("Trigger line", f"{fmt_tokens(usage.trigger_tokens)} tokens"),
            (
                "Room",
                f"{fmt_tokens(room)} tokens before the trigger line"
                if room >= 0
                else f"{fmt_tokens(-room)} tokens over the trigger line (a rebuild is due "
                "once the provider's usage says so)",
            ),
        ]
    )


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Register ``mimo-ctx context`` on ``subparsers``."""
    context = subparsers.add_parser(
        "context",
        parents=[common],
        help="what the next request of a stored session is made of, part by part",
        description="Break the next request of a session stored in an SQLite store down "
        "into its parts (system prompt, tools, the boundary's sections, messages, tool "
        "results live and cleared, reminders) with tokens, share of the window and the "
        "room left before the trigger line. Read-only.",
    )
    add_stored_session_arguments(context)
    context.add_argument(
        "--window",
        type=window_tokens,
        default=DEFAULT_WINDOW,
        metavar="N",
        help="the model's context window (default 200K): shares and the trigger line",
    )
    context.add_argument("--agent", default=MAIN_AGENT, help="the agent (default: main)")
    context.set_defaults(run=_run)


async def _run(args: argparse.Namespace, streams: Streams) -> int:
    stored = StoredSessionArguments.of(args)
    usage = await context_of(
        stored.store,
        stored.session,
        window=cast(int, args.window),
        agent=cast(str, args.agent),
        memory_root=stored.memory_root,
        config=stored.config,
    )
    if args.json:
        dump_json(usage.to_json(), streams.out)
    else:
        print_context(usage, Output(streams.out, plain=args.plain))
    return 0
