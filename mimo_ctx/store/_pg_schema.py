"""Versioned schema of :class:`~mimo_ctx.store.postgres.PostgresStore` and its statements.

The schema lives in its own PostgreSQL schema (namespace), ``mimo_ctx`` by
default, so it can share a database with an application's tables. Its version is
the single row of ``<schema>.schema_version``. :data:`MIGRATIONS` holds one list
of statements per version; version ``n`` is ``MIGRATIONS[n - 1]``. A migration is
append-only: a released version's statements never change, a new version adds a
new list.

Statements are templates: ``{s}`` stands for the quoted schema name and is filled
in by :func:`render`, so tests can give every store its own schema.

:class:`Statements` renders every statement of the store for one schema;
:func:`upgrade` creates or upgrades the schema (``mimo-ctx db upgrade``).

Text keys are ``COLLATE "C"``: ids are ordered by their bytes (SPEC A1 ids are
ASCII and sort by creation), whatever the database's default collation is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import anyio

from mimo_ctx.errors import StoreError
from mimo_ctx.session import ACTIVE_ACTOR_STATUSES
from mimo_ctx.store._pg_driver import (
    DB_ERRORS,
    MIGRATION_LOCK_CLASS,
    Connection,
    connect,
    lock_key,
    quiet_rollback,
    redact,
)

__all__ = [
    "CHANGES_QUERY",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Statements",
    "quote_schema",
    "render",
    "stored_version",
    "upgrade",
]

_CHANGES_QUERY_V1: Final = (
    # The session's messages written after $2 and the sequence's current value
    # on every row (one all-NULL message row when nothing changed).
    "SELECT m.token_estimate, m.payload, c.cur FROM"
    " (SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS cur FROM {s}.message_seq) AS c"
    " LEFT JOIN LATERAL (SELECT token_estimate, payload, seq FROM {s}.messages"
    " WHERE session_id = $1 AND seq > $2) AS m ON true ORDER BY m.seq"
)

_CHANGES_QUERY_V3: Final = (
    # As version 1's, with each message's insert_seq (its place in the write order).
    "SELECT m.token_estimate, m.payload, c.cur, m.insert_seq FROM"
    " (SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS cur FROM {s}.message_seq) AS c"
    " LEFT JOIN LATERAL (SELECT token_estimate, payload, seq, insert_seq FROM {s}.messages"
    " WHERE session_id = $1 AND seq > $2) AS m ON true ORDER BY m.seq"
)

CHANGES_QUERY: Final = (
    # As version 3's, with the part lengths each estimate was summed from.
    "SELECT m.token_estimate, m.payload, c.cur, m.insert_seq, m.part_units FROM"
    " (SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS cur FROM {s}.message_seq) AS c"
    " LEFT JOIN LATERAL (SELECT token_estimate, payload, seq, insert_seq, part_units"
    " FROM {s}.messages WHERE session_id = $1 AND seq > $2) AS m ON true ORDER BY m.seq"
)
"""The change-feed read; run by ``changes_since()`` after taking the session's lock."""


# changes_since(session_id, seq, lock class, lock key): one round trip. A VOLATILE
# function takes a fresh snapshot for each statement it runs, so the query sees
# every write that committed before the shared lock was granted; the lock is
# held until the calling statement's transaction ends. Under REPEATABLE READ or
# SERIALIZABLE the snapshot would predate the lock, so those are refused.
def _changes_function(returns: str, query: str) -> str:
    return (
        "CREATE FUNCTION {s}.changes_since(text, bigint, integer, integer)"
        f" RETURNS TABLE ({returns})"
        " LANGUAGE plpgsql VOLATILE AS $fn$ BEGIN"
        " IF current_setting('transaction_isolation') <> 'read committed' THEN"
        " RAISE EXCEPTION 'mimo_ctx reads the change feed at READ COMMITTED, not %',"
        " current_setting('transaction_isolation'); END IF;"
        " PERFORM pg_advisory_xact_lock_shared($3, $4);"
        f" RETURN QUERY {query}; END $fn$"
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
    _changes_function(
        "out_estimate integer, out_payload text, out_current bigint", _CHANGES_QUERY_V1
    ),
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

_V2: Final[tuple[str, ...]] = (
    # The main history's user messages, for the rebuild's "Recent user input" over
    # the whole history without reading every message.
    """CREATE INDEX messages_user ON {s}.messages (session_id, agent, time_created, id)
        WHERE role = 'user' AND NOT is_boundary""",
)

_V3: Final[tuple[str, ...]] = (
    # The write order of insertions decides "newer than" (R1.4 as amended), not
    # ids, which come from the writing worker's clock. An update keeps it.
    "ALTER TABLE {s}.messages ADD COLUMN insert_seq bigint",
    # Rows written before: their insertion order was not kept; ids were the rule
    # then, so rank them by id (1..n, below every value the sequence hands out).
    """UPDATE {s}.messages AS m SET insert_seq = r.n
        FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {s}.messages) AS r
        WHERE m.id = r.id""",
    "ALTER TABLE {s}.messages ALTER COLUMN insert_seq SET NOT NULL",
    """SELECT setval('{s}.message_seq', c.n) FROM (SELECT count(*) AS n FROM {s}.messages) AS c
        WHERE c.n > (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {s}.message_seq)""",
    "DROP INDEX {s}.messages_finished_by_agent",
    "DROP INDEX {s}.messages_finished",
    "DROP INDEX {s}.messages_boundaries",
    """CREATE INDEX messages_finished_by_agent ON {s}.messages (session_id, agent, insert_seq)
        WHERE is_finished_assistant""",
    """CREATE INDEX messages_finished ON {s}.messages (session_id, insert_seq)
        WHERE is_finished_assistant""",
    """CREATE INDEX messages_boundaries ON {s}.messages (session_id, agent, insert_seq)
        WHERE is_boundary""",
    "DROP FUNCTION {s}.changes_since(text, bigint, integer, integer)",
    _changes_function(
        "out_estimate integer, out_payload text, out_current bigint, out_insert_seq bigint",
        _CHANGES_QUERY_V3,
    ),
    # The session's state, apart from the payload like the watermark: only
    # update_session_state and commit_rebuild write it, under the session's lock,
    # so replacing the session from an older copy never rolls it back. NULL: the
    # payload's state (sessions written before).
    "ALTER TABLE {s}.sessions ADD COLUMN state text",
)

_V4: Final[tuple[str, ...]] = (
    # Messages the host left behind (mimo_ctx.reconcile): kept, never listed.
    "ALTER TABLE {s}.messages ADD COLUMN off_branch boolean NOT NULL DEFAULT false",
    # The host index: one row per host message and the conversation before it.
    # The primary key is what keeps two workers from storing one host message twice.
    """CREATE TABLE {s}.host_nodes (
        session_id text COLLATE "C" NOT NULL REFERENCES {s}.sessions (id),
        agent text COLLATE "C" NOT NULL,
        chain text COLLATE "C" NOT NULL,
        parent text COLLATE "C" NOT NULL,
        fingerprint text NOT NULL,
        depth integer NOT NULL,
        message_ids text NOT NULL,
        seq bigint NOT NULL,
        PRIMARY KEY (session_id, agent, chain)
    )""",
    "CREATE INDEX host_nodes_by_seq ON {s}.host_nodes (session_id, agent, seq)",
    """CREATE TABLE {s}.host_heads (
        session_id text COLLATE "C" NOT NULL REFERENCES {s}.sessions (id),
        agent text COLLATE "C" NOT NULL,
        head text NOT NULL,
        PRIMARY KEY (session_id, agent)
    )""",
)

_V5: Final[tuple[str, ...]] = (
    # The part lengths each row's token_estimate was summed from
    # (mimo_ctx.messages.stored_part_units), so a message read back and changed in
    # one nested object (a rebuild marking a result) is estimated without
    # serialising it again. NULL: unknown (rows written before). The change feed
    # returns them too.
    "ALTER TABLE {s}.messages ADD COLUMN part_units text",
    "DROP FUNCTION {s}.changes_since(text, bigint, integer, integer)",
    _changes_function(
        "out_estimate integer, out_payload text, out_current bigint, out_insert_seq bigint,"
        " out_part_units text",
        CHANGES_QUERY,
    ),
)

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (_V1, _V2, _V3, _V4, _V5)
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


# Rows of messages, one column array each, numbered in batch order. The CTE is
# materialised (it calls a volatile function), so each row draws its sequence
# value exactly once, in batch order.
_UNNEST_MESSAGES: Final = """WITH u AS (
    SELECT v.*, nextval('{s}.message_seq') AS seq FROM (
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                             $6::boolean[], $7::boolean[], $8::integer[], $9::text[],
                             $10::boolean[], $11::text[])
            WITH ORDINALITY AS w(id, session_id, agent, role, time_created, is_boundary,
                                 is_finished_assistant, token_estimate, payload, off_branch,
                                 part_units, ord)
        ORDER BY ord
    ) AS v
)"""


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement of the store, rendered for one schema."""

    latest_boundary: str
    latest_finished: str
    latest_finished_by_agent: str
    newer_boundary: str
    changes: str
    changes_call: str
    get_message: str
    insert_messages: str
    update_messages: str
    upsert_messages: str
    message_sessions: str
    check_new: str
    check_upsert: str
    insert_session: str
    get_session: str
    get_state: str
    set_state: str
    update_session: str
    list_sessions: str
    get_watermark: str
    set_watermark: str
    claim_rebuild: str
    upsert_task: str
    get_task: str
    list_tasks: str
    upsert_actor: str
    get_actor: str
    list_actors: str
    list_active_actors: str
    count_all: str
    count_agent: str
    host_nodes: str
    host_head: str
    insert_host_nodes: str
    session_exists: str
    current_seq: str
    move_head: str

    @classmethod
    def for_schema(cls, schema: str) -> Statements:
        cols = "token_estimate, payload, insert_seq, part_units"
        active = ", ".join(f"'{s}'" for s in sorted(ACTIVE_ACTOR_STATUSES))
        statements = {
            # "Newest" is the write order of insertions (R1.4 as amended), not ids.
            "latest_boundary": f"SELECT {cols} FROM {{s}}.messages WHERE session_id = $1"
            " AND agent = $2 AND is_boundary ORDER BY insert_seq DESC LIMIT 1",
            "latest_finished": f"SELECT {cols} FROM {{s}}.messages WHERE session_id = $1"
            " AND is_finished_assistant ORDER BY insert_seq DESC LIMIT 1",
            "latest_finished_by_agent": f"SELECT {cols} FROM {{s}}.messages"
            " WHERE session_id = $1 AND agent = $2 AND is_finished_assistant"
            " ORDER BY insert_seq DESC LIMIT 1",
            # A boundary of agent $3 inserted after the usage message $2 (R1.4).
            "newer_boundary": "SELECT EXISTS (SELECT 1 FROM {s}.messages AS u"
            " JOIN {s}.messages AS b ON b.session_id = u.session_id AND b.agent = $3"
            " AND b.is_boundary AND b.insert_seq > u.insert_seq"
            " WHERE u.id = $2 AND u.session_id = $1)",
            "changes": CHANGES_QUERY,
            "changes_call": "SELECT out_estimate, out_payload, out_current, out_insert_seq,"
            " out_part_units FROM {s}.changes_since($1, $2, $3, $4)",
            "get_message": f"SELECT {cols} FROM {{s}}.messages WHERE id = $1",
            "insert_messages": _UNNEST_MESSAGES
            + " INSERT INTO {s}.messages (id, session_id, agent, role, time_created,"
            " is_boundary, is_finished_assistant, token_estimate, payload, off_branch,"
            " part_units, seq, insert_seq) SELECT id, session_id, agent, role, time_created,"
            " is_boundary, is_finished_assistant, token_estimate, payload, off_branch,"
            " part_units, seq, seq FROM u"
            " ORDER BY ord ON CONFLICT (id) DO NOTHING RETURNING id, insert_seq",
            "update_messages": _UNNEST_MESSAGES
            + " UPDATE {s}.messages AS m SET agent = u.agent, role = u.role,"
            " time_created = u.time_created, is_boundary = u.is_boundary,"
            " is_finished_assistant = u.is_finished_assistant,"
            " token_estimate = u.token_estimate, payload = u.payload,"
            " off_branch = u.off_branch, part_units = u.part_units, seq = u.seq"
            " FROM u WHERE m.id = u.id AND m.session_id = u.session_id"
            " RETURNING m.id, m.insert_seq",
            # insert_seq is left alone on a replace, as an update leaves it.
            "upsert_messages": _UNNEST_MESSAGES
            + " INSERT INTO {s}.messages AS m (id, session_id, agent, role, time_created,"
            " is_boundary, is_finished_assistant, token_estimate, payload, part_units, seq,"
            " insert_seq) SELECT id, session_id, agent, role, time_created, is_boundary,"
            " is_finished_assistant, token_estimate, payload, part_units, seq, seq FROM u"
            " ORDER BY ord"
            " ON CONFLICT (id) DO UPDATE SET agent = excluded.agent, role = excluded.role,"
            " time_created = excluded.time_created, is_boundary = excluded.is_boundary,"
            " is_finished_assistant = excluded.is_finished_assistant,"
            " token_estimate = excluded.token_estimate, payload = excluded.payload,"
            " part_units = excluded.part_units, seq = excluded.seq"
            " WHERE m.session_id = excluded.session_id"
            " RETURNING m.id, m.insert_seq",
            "message_sessions": "SELECT id, session_id FROM {s}.messages"
            " WHERE id = ANY($1::text[])",
            # (first unknown session, first id of the batch stored for another session)
            "check_upsert": "SELECT (SELECT min(s) FROM unnest($1::text[]) AS s WHERE NOT"
            " EXISTS (SELECT 1 FROM {s}.sessions WHERE id = s)), (SELECT w.id FROM"
            " unnest($2::text[], $3::text[]) WITH ORDINALITY AS w (id, session_id, ord)"
            " JOIN {s}.messages AS m ON m.id = w.id WHERE m.session_id <> w.session_id"
            " ORDER BY w.ord LIMIT 1)",
            # (first unknown session, first id of the batch already stored)
            "check_new": "SELECT (SELECT min(s) FROM unnest($1::text[]) AS s WHERE NOT EXISTS"
            " (SELECT 1 FROM {s}.sessions WHERE id = s)), (SELECT w.id FROM unnest($2::text[])"
            " WITH ORDINALITY AS w (id, ord) JOIN {s}.messages AS m ON m.id = w.id"
            " ORDER BY w.ord LIMIT 1)",
            "insert_session": "INSERT INTO {s}.sessions (id, time_created, watermark, payload)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING",
            "get_session": "SELECT watermark, payload, state FROM {s}.sessions WHERE id = $1",
            "get_state": "SELECT state, payload FROM {s}.sessions WHERE id = $1",
            "set_state": "UPDATE {s}.sessions SET state = $2 WHERE id = $1",
            # The watermark and state columns are left alone: only set_watermark
            # moves the watermark (R2.1), only the state writes change the state;
            # the state column is pinned to the state as stored (the old payload's,
            # when no state write happened yet) before the payload is replaced.
            "update_session": "UPDATE {s}.sessions SET time_created = $2, payload = $3,"
            " state = COALESCE(state, (payload::json -> 'state')::text) WHERE id = $1",
            "list_sessions": "SELECT watermark, payload, state FROM {s}.sessions"
            " ORDER BY time_created, id",
            "get_watermark": "SELECT watermark FROM {s}.sessions WHERE id = $1",
            "set_watermark": "UPDATE {s}.sessions SET watermark = $2 WHERE id = $1",
            # (session exists, key claimed by this transaction)
            "claim_rebuild": "WITH ins AS (INSERT INTO {s}.rebuilds (session_id, usage_key,"
            " boundary_id) SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM {s}.sessions"
            " WHERE id = $1) ON CONFLICT (session_id, usage_key) DO NOTHING RETURNING 1)"
            " SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = $1),"
            " EXISTS (SELECT 1 FROM ins)",
            "upsert_task": "INSERT INTO {s}.tasks (session_id, id, payload) VALUES ($1, $2, $3)"
            " ON CONFLICT (session_id, id) DO UPDATE SET payload = EXCLUDED.payload",
            "get_task": "SELECT payload FROM {s}.tasks WHERE session_id = $1 AND id = $2",
            "list_tasks": "SELECT payload FROM {s}.tasks WHERE session_id = $1",
            # An actor never moves between sessions (R5.4): the conditional update
            # makes that check and the write one atomic statement.
            "upsert_actor": "INSERT INTO {s}.actors AS a (id, session_id, status, background,"
            " time_created, payload) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO UPDATE"
            " SET status = EXCLUDED.status, background = EXCLUDED.background,"
            " time_created = EXCLUDED.time_created, payload = EXCLUDED.payload"
            " WHERE a.session_id = EXCLUDED.session_id RETURNING id",
            "get_actor": "SELECT payload FROM {s}.actors WHERE id = $1 AND session_id = $2",
            "list_actors": "SELECT payload FROM {s}.actors WHERE session_id = $1"
            " ORDER BY time_created, id",
            "list_active_actors": "SELECT payload FROM {s}.actors WHERE session_id = $1"
            f" AND background AND status IN ({active}) ORDER BY time_created, id",
            "count_all": "SELECT count(*) FROM {s}.messages WHERE session_id = $1",
            "count_agent": "SELECT count(*) FROM {s}.messages WHERE session_id = $1 AND agent = $2",
            "host_nodes": "SELECT chain, parent, fingerprint, depth, message_ids, seq"
            " FROM {s}.host_nodes WHERE session_id = $1 AND agent = $2 AND seq > $3 ORDER BY seq",
            "host_head": "SELECT head FROM {s}.host_heads WHERE session_id = $1 AND agent = $2",
            # The primary key decides which of two workers stores a host message:
            # the losers insert nothing (fewer rows returned) and roll back.
            "insert_host_nodes": "INSERT INTO {s}.host_nodes (session_id, agent, chain, parent,"
            " fingerprint, depth, message_ids, seq) SELECT $1, $2, w.chain, w.parent,"
            " w.fingerprint, w.depth, w.message_ids, nextval('{s}.message_seq') FROM"
            " unnest($3::text[], $4::text[], $5::text[], $6::integer[], $7::text[])"
            " WITH ORDINALITY AS w (chain, parent, fingerprint, depth, message_ids, ord)"
            " ORDER BY w.ord ON CONFLICT DO NOTHING RETURNING chain",
            "session_exists": "SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = $1)",
            "current_seq": "SELECT CASE WHEN is_called THEN last_value ELSE 0 END"
            " FROM {s}.message_seq",
            "move_head": "INSERT INTO {s}.host_heads (session_id, agent, head) VALUES ($1, $2, $3)"
            " ON CONFLICT (session_id, agent) DO UPDATE SET head = EXCLUDED.head",
        }
        return cls(**{name: render(sql, schema) for name, sql in statements.items()})


async def stored_version(conn: Connection, schema: str) -> int:
    """The schema version in the database; 0 when there is no version table."""
    table = f"{quote_schema(schema)}.schema_version"
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
    if not exists:
        return 0
    version = await conn.fetchval(f"SELECT version FROM {table}")
    return 0 if version is None else int(version)


async def _upgrade_on(conn: Connection, schema: str, where: str) -> int:
    """Run the pending migrations in one transaction; roll back on any error."""
    await conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
    try:
        await _migrate(conn, schema, where)
        await conn.execute("COMMIT")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await quiet_rollback(conn)
        raise
    return SCHEMA_VERSION


async def _migrate(conn: Connection, schema: str, where: str) -> None:
    """The body of :func:`_upgrade_on`, inside its transaction."""
    quoted = quote_schema(schema)
    # Two workers upgrading at once: the second waits, then finds it done.
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, $2)", MIGRATION_LOCK_CLASS, lock_key(schema, "")
    )
    # Checked before CREATE: CREATE SCHEMA IF NOT EXISTS needs the CREATE
    # privilege on the database even when the schema is there.
    if not await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema
    ):
        await conn.execute(f"CREATE SCHEMA {quoted}")
    version = await stored_version(conn, schema)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} has store schema version {version}; this mimo_ctx supports up to "
            f"{SCHEMA_VERSION}. Upgrade mimo_ctx to use it"
        )
    if version == 0:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", schema
        )
        if tables:
            names = [str(r[0]) for r in tables]
            raise StoreError(
                f"{where}: schema {schema!r} holds tables {names} but is not a mimo_ctx "
                "store; choose another schema. Nothing was changed"
            )
        await conn.execute(
            f"CREATE TABLE {quoted}.schema_version (one boolean PRIMARY KEY DEFAULT true"
            " CHECK (one), version integer NOT NULL,"
            " time_upgraded timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        await conn.execute(f"INSERT INTO {quoted}.schema_version (version) VALUES (0)")
    for number in range(version + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[number - 1]:
            await conn.execute(render(statement, schema))
        await conn.execute(
            f"UPDATE {quoted}.schema_version SET version = $1, time_upgraded = clock_timestamp()",
            number,
        )


async def upgrade(dsn: str, *, schema: str = "mimo_ctx") -> int:
    """Create or upgrade the store schema in a PostgreSQL database.

    Safe to run from several workers at once (they take turns) and again and
    again (an up-to-date schema is left alone). Each version's migration runs in
    one transaction with the version bump, so a failed upgrade changes nothing.
    This is what ``mimo-ctx db upgrade --dsn ...`` runs.

    Args:
        dsn: A libpq connection string or URI
            (``postgresql://user:password@host:5432/db``).
        schema: The PostgreSQL schema (namespace) holding the store's tables.

    Returns:
        The schema version now in the database (:data:`SCHEMA_VERSION`).

    Raises:
        StoreError: The database cannot be reached, the schema holds tables that
            are not a mimo_ctx store, or it has a newer version than this code.
    """
    where = f"PostgreSQL {redact(dsn)} (schema {schema})"
    try:
        quote_schema(schema)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    try:
        conn = await connect(dsn, timeout=30)
    except (*DB_ERRORS, ValueError) as exc:
        raise StoreError(f"cannot connect to {where}: {exc}") from exc
    try:
        return await _upgrade_on(conn, schema, where)
    except DB_ERRORS as exc:
        raise StoreError(f"upgrading {where} failed: {exc}") from exc
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()
