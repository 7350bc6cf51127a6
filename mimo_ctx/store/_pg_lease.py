"""The PostgreSQL writer lease: one checkpoint writer per session across workers (SPEC A3)."""

from __future__ import annotations

from typing import Any

import anyio

from mimo_ctx.checkpoint.lease import LeaseHolder, check_lease_ttl
from mimo_ctx.errors import StoreError
from mimo_ctx.store._pg_base import PostgresBase
from mimo_ctx.store._pg_driver import DB_ERRORS, Connection, close_or_terminate, connect
from mimo_ctx.store._pg_schema import render

__all__ = ["PostgresWriterLease"]


class PostgresWriterLease:
    """One checkpoint writer per session across workers (SPEC A3), kept in PostgreSQL.

    A lease is a row of ``writer_leases`` with an owner and an expiry, both set by
    single atomic statements using the database's clock (workers' clocks may
    disagree). A worker that crashes stops renewing, its lease lapses after
    ``ttl`` seconds and another worker can take it. Releasing a lease sends a
    ``NOTIFY``, so :meth:`wait_released` returns at once; it also polls with
    backoff (up to ``max_poll_interval``) and wakes at the lease's expiry, so
    it needs no notification to be correct.

    ``owner`` strings must be unique per holder (for example
    ``f"{hostname}:{pid}:{uuid4()}"``): the same owner acquiring again just
    extends its lease.
    """

    def __init__(
        self,
        store: PostgresBase,
        *,
        listen: bool = True,
        min_poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
    ) -> None:
        """Use ``store``'s database, schema and pool.

        Args:
            store: The :class:`~mimo_ctx.store.postgres.PostgresStore` whose database
                holds the leases.
            listen: Learn of releases through ``LISTEN`` on one extra connection;
                without it, through polling alone.
            min_poll_interval: First polling delay in seconds; doubled each poll.
            max_poll_interval: Longest polling delay in seconds.
        """
        if not 0 < min_poll_interval <= max_poll_interval:
            raise StoreError(
                "poll intervals must satisfy 0 < min_poll_interval <= max_poll_interval, got "
                f"{min_poll_interval} and {max_poll_interval}"
            )
        self._store = store
        self._listen = listen
        self._min_poll = min_poll_interval
        self._max_poll = max_poll_interval
        self._channel = f"{store.schema}_writer_lease"
        self._listener: Connection | None = None
        self._listener_lock = anyio.Lock()
        self._waiters: dict[str, set[anyio.Event]] = {}
        self._closed = False
        s = store.schema
        self._sql_acquire = render(
            "INSERT INTO {s}.writer_leases AS l (session_id, owner, generation, acquired_at,"
            " expires_at) VALUES ($1, $2, 1, clock_timestamp(),"
            " clock_timestamp() + make_interval(secs => $3))"
            " ON CONFLICT (session_id) DO UPDATE SET"
            # The same live owner extends its lease; anyone else starts a new one.
            " generation = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > clock_timestamp()"
            " THEN l.generation ELSE l.generation + 1 END,"
            " acquired_at = CASE WHEN l.owner = EXCLUDED.owner"
            " AND l.expires_at > clock_timestamp() THEN l.acquired_at ELSE clock_timestamp() END,"
            " owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at"
            " WHERE l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner"
            " RETURNING generation",
            s,
        )
        self._sql_renew = render(
            "UPDATE {s}.writer_leases SET expires_at = clock_timestamp()"
            " + make_interval(secs => $3) WHERE session_id = $1 AND owner = $2"
            " AND expires_at > clock_timestamp() RETURNING generation",
            s,
        )
        # -infinity rather than a delete: the generation keeps counting (see
        # wait_released). pg_notify is delivered when the statement commits.
        self._sql_release = render(
            "WITH r AS (UPDATE {s}.writer_leases SET expires_at = '-infinity'"
            " WHERE session_id = $1 AND owner = $2 AND expires_at > clock_timestamp()"
            " RETURNING session_id) SELECT pg_notify($3, session_id) FROM r",
            s,
        )
        self._sql_state = render(
            "SELECT owner, generation, CASE WHEN expires_at > clock_timestamp()"
            " THEN extract(epoch FROM expires_at - clock_timestamp())::float8 ELSE 0 END"
            " FROM {s}.writer_leases WHERE session_id = $1",
            s,
        )
        # FOR SHARE holds off a takeover until this statement commits, so the
        # watermark is only written by a holder whose lease is live throughout.
        self._sql_fenced_watermark = render(
            "WITH held AS (SELECT 1 FROM {s}.writer_leases WHERE session_id = $1"
            " AND owner = $2 AND expires_at > clock_timestamp() FOR SHARE),"
            " w AS (UPDATE {s}.sessions SET watermark = $3 WHERE id = $1"
            " AND EXISTS (SELECT 1 FROM held) RETURNING 1)"
            " SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = $1), EXISTS (SELECT 1 FROM w)",
            s,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the PostgreSQL writer lease is closed")

    async def acquire(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take the session's writer lease for ``ttl`` seconds if nobody holds it.

        Returns:
            ``True`` when ``owner`` now holds the lease (taken, taken over after
            the previous holder's expiry, or extended because ``owner`` held it);
            ``False`` when another owner holds a live lease.
        """
        self._check_open()
        check_lease_ttl(ttl)
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            generation = await conn.fetchval(self._sql_acquire, session_id, owner, float(ttl))
        return generation is not None

    async def renew(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s live lease to ``ttl`` seconds from now.

        Returns:
            ``False`` when ``owner`` no longer holds a live lease: it lapsed or was
            released. The holder must then stop writing (another worker may have
            taken over).
        """
        self._check_open()
        check_lease_ttl(ttl)
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            generation = await conn.fetchval(self._sql_renew, session_id, owner, float(ttl))
        return generation is not None

    async def release(self, session_id: str, owner: str) -> bool:
        """Give the lease up and wake the waiters.

        Returns:
            ``True`` when ``owner`` held a live lease; ``False`` (nothing changed)
            otherwise.
        """
        self._check_open()
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            rows = await conn.fetch(self._sql_release, session_id, owner, self._channel)
        return bool(rows)

    async def holder(self, session_id: str) -> LeaseHolder | None:
        """The live holder of the session's lease, or ``None`` when it is free."""
        self._check_open()
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            row = await conn.fetchrow(self._sql_state, session_id)
        if row is None or float(row[2]) <= 0:
            return None
        return LeaseHolder(owner=str(row[0]), generation=int(row[1]), expires_in=float(row[2]))

    async def set_watermark_if_held(self, session_id: str, owner: str, message_id: str) -> bool:
        """Persist the watermark only while ``owner`` holds a live lease (a fenced write).

        A writer that stalled past its lease's expiry cannot then overwrite the
        watermark of the worker that took over.

        Returns:
            ``True`` when written; ``False`` (nothing written) when ``owner`` does
            not hold a live lease.

        Raises:
            StoreError: The session is unknown.
        """
        self._check_open()
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            row = await conn.fetchrow(self._sql_fenced_watermark, session_id, owner, message_id)
        if row is None or not row[0]:
            raise StoreError(f"unknown session {session_id!r}")
        return bool(row[1])

    async def wait_released(
        self,
        session_id: str,
        timeout: float,  # noqa: ASYNC109 - a bound the caller gets from SPEC A3, not a cancel
        *,
        generation: int | None = None,
    ) -> bool:
        """Wait until the lease held now (or the given ``generation``) is over.

        Over means released, lapsed, or taken by a later holder: the writer run
        the caller waits for has ended either way.

        Args:
            session_id: The session.
            timeout: Seconds to wait at most.
            generation: The holder to wait for (from :meth:`holder`); by default
                whoever holds the lease when the call starts.

        Returns:
            ``True`` when the lease is over (at once if nobody held it), ``False``
            on timeout.
        """
        self._check_open()
        deadline = anyio.current_time() + max(0.0, timeout)
        event = anyio.Event()
        waiters = self._waiters.setdefault(session_id, set())
        waiters.add(event)
        try:
            # Listening before the first look: a release after it is heard.
            await self._ensure_listener()
            state = await self._state(session_id)
            if state is None:
                return True
            watched = state[0] if generation is None else generation
            delay = self._min_poll
            while True:
                if state is None or state[0] != watched:
                    return True
                now = anyio.current_time()
                if now >= deadline:
                    return False
                # Wake at the latest at the expiry, the next poll or the deadline.
                with anyio.move_on_after(min(delay, state[1] + 0.001, deadline - now)):
                    await event.wait()
                if event.is_set():
                    waiters.discard(event)
                    event = anyio.Event()
                    waiters.add(event)
                else:
                    delay = min(delay * 2, self._max_poll)
                state = await self._state(session_id)
        finally:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(session_id, None)

    async def _state(self, session_id: str) -> tuple[int, float] | None:
        """(generation, seconds left) of the live lease, or ``None`` when there is none."""
        async with self._store._connection() as conn:  # pyright: ignore[reportPrivateUsage]
            row = await conn.fetchrow(self._sql_state, session_id)
        if row is None or float(row[2]) <= 0:
            return None
        return int(row[1]), float(row[2])

    async def _ensure_listener(self) -> None:
        if not self._listen:
            return
        async with self._listener_lock:
            self._check_open()
            if self._listener is not None and not self._listener.is_closed():
                return
            self._listener = None
            where = self._store._where  # pyright: ignore[reportPrivateUsage]
            try:
                conn = await connect(self._store.dsn, timeout=30)
            except (*DB_ERRORS, ValueError) as exc:
                raise StoreError(f"cannot connect to {where}: {exc}") from exc
            try:
                await conn.add_listener(self._channel, self._notified)
            except DB_ERRORS as exc:
                conn.terminate()
                raise StoreError(f"{where}: LISTEN failed: {exc}") from exc
            # A lost connection is replaced at the next wait; polling covers the gap.
            conn.add_termination_listener(self._listener_lost)
            self._listener = conn

    def _listener_lost(self, _conn: Any) -> None:
        self._listener = None

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for event in self._waiters.get(payload, ()):
            event.set()

    async def aclose(self) -> None:
        """Close the listening connection (the store's pool stays open). Idempotent."""
        self._closed = True
        conn, self._listener = self._listener, None
        if conn is None or conn.is_closed():
            return
        await close_or_terminate(conn, 10)
