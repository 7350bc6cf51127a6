"""Versioned schema of :class:`~mimo_ctx.store.postgres.PostgresStore`.

The schema lives in its own PostgreSQL schema (namespace), ``mimo_ctx`` by
default, so it can share a database with an application's tables. Its version is
the single row of ``<schema>.schema_version``. :data:`MIGRATIONS` holds one list
of statements per version; version ``n`` is ``MIGRATIONS[n - 1]``. A migration is
append-only: a released version's statements never change, a new version adds a
new list.

Statements are templates: ``{s}`` stands for the quoted schema name and is filled
in by :func:`render`, so tests can give every store its own schema.

Text keys are ``COLLATE "C"``: ids are ordered by their bytes (SPEC A1 ids are
ASCII and sort by creation), whatever the database's default collation is.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["CHANGES_QUERY", "MIGRATIONS", "SCHEMA_VERSION", "quote_schema", "render"]

CHANGES_QUERY: Final = (
    # The session's messages written after $2 and the sequence's current value
    # on every row (one all-NULL message row when nothing changed).
    "SELECT m.token_estimate, m.payload, c.cur FROM"
    " (SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS cur FROM {s}.message_seq) AS c"
    " LEFT JOIN LATERAL (SELECT token_estimate, payload, seq FROM {s}.messages"
    " WHERE session_id = $1 AND seq > $2) AS m ON true ORDER BY m.seq"
)
"""The change-feed read; run by ``changes_since()`` after taking the session's lock."""

# changes_since(session_id, seq, lock class, lock key): one round trip. A VOLATILE
# function takes a fresh snapshot for each statement it runs, so the query sees
# every write that committed before the shared lock was granted; the lock is
# held until the calling statement's transaction ends. Under REPEATABLE READ or
# SERIALIZABLE the snapshot would predate the lock, so those are refused.
_CHANGES_FUNCTION: Final = (
    "CREATE FUNCTION {s}.changes_since(text, bigint, integer, integer)"
    " RETURNS TABLE (out_estimate integer, out_payload text, out_current bigint)"
    " LANGUAGE plpgsql VOLATILE AS $fn$ BEGIN"
    " IF current_setting('transaction_isolation') <> 'read committed' THEN"
    " RAISE EXCEPTION 'mimo_ctx reads the change feed at READ COMMITTED, not %',"
    " current_setting('transaction_isolation'); END IF;"
    " PERFORM pg_advisory_xact_lock_shared($3, $4);"
    f" RETURN QUERY {CHANGES_QUERY}; END $fn$"
)

_V1: Final[tuple[str, ...]] = (
    """CREATE TABLE {s}.sessions (
        id text COLLATE "C" PRIMARY KEY,
        time_created bigint NOT NULL,
        -- Kept apart from the payload: only set_watermark writes it, so replacing
        -- the session from an older copy never rolls it back (SPEC R2.1).
        watermark text,
        payload text NOT NULL
    )""",
    "CREATE INDEX sessions_by_time ON {s}.sessions (time_created, id)",
    # Numbers every message write for the change feed. Store-wide and only
    # increasing; see PostgresStore's docstring for why a reader never skips one.
    "CREATE SEQUENCE {s}.message_seq AS bigint",
    """CREATE TABLE {s}.messages (
        id text COLLATE "C" PRIMARY KEY,
        session_id text COLLATE "C" NOT NULL REFERENCES {s}.sessions (id),
        agent text COLLATE "C" NOT NULL,
        role text NOT NULL,
        time_created bigint NOT NULL,
        is_boundary boolean NOT NULL,
        is_finished_assistant boolean NOT NULL,
        token_estimate integer NOT NULL,
        seq bigint NOT NULL,
        -- Text, not jsonb: payloads come back byte-identical (key order kept).
        payload text NOT NULL
    )""",
    "CREATE INDEX messages_by_agent_time ON {s}.messages (session_id, agent, time_created, id)",
    "CREATE INDEX messages_by_time ON {s}.messages (session_id, time_created, id)",
    "CREATE INDEX messages_by_seq ON {s}.messages (session_id, seq)",
    # Partial indexes: the per-turn "newest X" lookups read one entry from the
    # end of a small b-tree.
    """CREATE INDEX messages_finished_by_agent ON {s}.messages (session_id, agent, id)
        WHERE is_finished_assistant""",
    "CREATE INDEX messages_finished ON {s}.messages (session_id, id) WHERE is_finished_assistant",
    "CREATE INDEX messages_boundaries ON {s}.messages (session_id, agent, id) WHERE is_boundary",
    # One row per committed rebuild: the primary key makes commit_rebuild once
    # per usage across tasks, processes and machines (SPEC R1.4).
    """CREATE TABLE {s}.rebuilds (
        session_id text COLLATE "C" NOT NULL REFERENCES {s}.sessions (id),
        usage_key text COLLATE "C" NOT NULL,
        boundary_id text COLLATE "C" NOT NULL,
        time_committed timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (session_id, usage_key)
    )""",
    """CREATE TABLE {s}.tasks (
        session_id text COLLATE "C" NOT NULL,
        id text COLLATE "C" NOT NULL,
        payload text NOT NULL,
        PRIMARY KEY (session_id, id)
    )""",
    """CREATE TABLE {s}.actors (
        id text COLLATE "C" PRIMARY KEY,
        session_id text COLLATE "C" NOT NULL,
        status text NOT NULL,
        background boolean NOT NULL,
        time_created bigint NOT NULL,
        payload text NOT NULL
    )""",
    "CREATE INDEX actors_by_session ON {s}.actors (session_id, time_created, id)",
    _CHANGES_FUNCTION,
    # Cross-worker writer leases (SPEC A3). A row is never deleted: a release
    # sets expires_at to -infinity, so the generation keeps counting up and a
    # waiter can tell "the holder it saw" from "a later holder".
    """CREATE TABLE {s}.writer_leases (
        session_id text COLLATE "C" PRIMARY KEY,
        owner text NOT NULL,
        generation bigint NOT NULL,
        acquired_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    )""",
)

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (_V1,)
"""Statements of each schema version, oldest first."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The schema version this mimo_ctx writes and reads."""

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")


def quote_schema(name: str) -> str:
    """Return ``name`` quoted as an SQL identifier, after checking it is a plain name.

    Only lower-case letters, digits and underscores (at most 40 characters, not
    starting with a digit) are accepted, so the name is safe to put in SQL text
    and leaves room for the derived NOTIFY channel name.

    Raises:
        ValueError: ``name`` is not such a name.
    """
    if not _SCHEMA_NAME.fullmatch(name):
        raise ValueError(
            f"PostgreSQL schema name {name!r} must be 1-40 characters of a-z, 0-9 and _, "
            "not starting with a digit"
        )
    return f'"{name}"'


def render(statement: str, schema: str) -> str:
    """Fill the quoted ``schema`` into a statement template."""
    return statement.replace("{s}", quote_schema(schema))
