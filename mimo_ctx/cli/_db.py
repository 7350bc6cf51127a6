"""``mimo-ctx db upgrade``: create or upgrade the schema of a PostgreSQL store.

asyncpg is optional (the ``postgres`` extra): the store module is imported only
when the command runs, and a missing driver is reported as one line.
"""

from __future__ import annotations

import argparse
from typing import Any, cast

from mimo_ctx.cli._common import CliError, Parser, Streams
from mimo_ctx.cli._output import Output, dump_json
from mimo_ctx.store import is_postgres_url

__all__ = ["add_parser"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Register ``mimo-ctx db`` and its actions on ``subparsers``."""
    db = subparsers.add_parser(
        "db",
        help="manage the schema of a PostgreSQL store",
        description="Manage the schema of a PostgreSQL store (several workers share one).",
    )
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", parser_class=Parser)
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
    upgrade.set_defaults(run=_run_upgrade)


async def _run_upgrade(args: argparse.Namespace, streams: Streams) -> int:
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
