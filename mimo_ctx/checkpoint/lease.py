"""The writer lease: one checkpoint writer per session across workers (SPEC A3).

A lease has an owner and an expiry; a holder that stops renewing loses it after
``ttl`` seconds, so a crashed worker never blocks a session for good. The writer
coordinator takes it before a writer starts, renews it while the writer runs and
writes the watermark through :meth:`WriterLease.set_watermark_if_held` (a fenced
write). :class:`InMemoryWriterLease` keeps leases in one process;
:class:`~mimo_ctx.store.postgres.PostgresWriterLease` in PostgreSQL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import anyio

from mimo_ctx.errors import StoreError
from mimo_ctx.store.base import Store

__all__ = ["InMemoryWriterLease", "LeaseHolder", "LeaseInfo", "WriterLease", "check_lease_ttl"]


@runtime_checkable
class LeaseInfo(Protocol):
    """Who holds a session's writer lease (what :meth:`WriterLease.holder` returns)."""

    @property
    def owner(self) -> str:
        """The holder's owner string."""
        ...

    @property
    def generation(self) -> int:
        """Grows each time the lease changes hands."""
        ...

    @property
    def expires_in(self) -> float:
        """Seconds until the lease lapses unless renewed."""
        ...


@runtime_checkable
class WriterLease(Protocol):
    """One checkpoint writer per session across workers (SPEC A3).

    A lease has an owner and an expiry; a holder that stops renewing loses it
    after ``ttl`` seconds, so a crashed worker never blocks a session for good.
    :class:`~mimo_ctx.store.postgres.PostgresWriterLease` keeps leases in
    PostgreSQL for workers on many machines; :class:`InMemoryWriterLease` keeps
    them in one process (several middlewares on one store, and tests).
    """

    async def acquire(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take the lease for ``ttl`` seconds; ``False`` when another owner holds it."""
        ...

    async def renew(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s live lease; ``False`` when it lapsed or was released."""
        ...

    async def release(self, session_id: str, owner: str) -> bool:
        """Give the lease up; ``False`` when ``owner`` did not hold a live lease."""
        ...

    async def holder(self, session_id: str) -> LeaseInfo | None:
        """The live holder of the session's lease, or ``None`` when it is free."""
        ...

    async def wait_released(
        self,
        session_id: str,
        timeout: float,  # noqa: ASYNC109 - a SPEC bound, the same as the implementations'
        *,
        generation: int | None = None,
    ) -> bool:
        """Wait until the lease held now (or ``generation``) is over; ``False`` on timeout."""
        ...

    async def set_watermark_if_held(self, session_id: str, owner: str, message_id: str) -> bool:
        """Persist the watermark only while ``owner`` holds a live lease (a fenced write)."""
        ...


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a session's writer lease (the :class:`LeaseInfo` of the built-in leases).

    Attributes:
        owner: The holder's owner string.
        generation: Grows by one each time the lease changes hands.
        expires_in: Seconds until the lease lapses unless renewed.
    """

    owner: str
    generation: int
    expires_in: float


@dataclass(slots=True)
class _MemoryLease:
    owner: str
    generation: int
    expires_at: float


def check_lease_ttl(ttl: float) -> None:
    """Refuse a lease duration that is not a finite number of seconds above zero.

    Raises:
        StoreError: ``ttl`` is zero, negative, infinite or NaN.
    """
    if not (ttl > 0 and math.isfinite(ttl)):
        raise StoreError(f"lease ttl must be a finite number of seconds > 0, got {ttl}")


class InMemoryWriterLease:
    """A :class:`WriterLease` kept in this process, on the event loop's clock.

    For several :class:`~mimo_ctx.middleware.ContextMiddleware` instances sharing
    one store in one process (each with its own coordinator), and for tests of
    the cross-worker rules without a database. It serves one event loop.

    Args:
        store: Where :meth:`set_watermark_if_held` writes the watermark.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._leases: dict[str, _MemoryLease] = {}
        self._changed: dict[str, anyio.Event] = {}

    def _live(self, session_id: str) -> _MemoryLease | None:
        lease = self._leases.get(session_id)
        if lease is None or lease.expires_at <= anyio.current_time():
            return None
        return lease

    def _notify(self, session_id: str) -> None:
        event = self._changed.pop(session_id, None)
        if event is not None:
            event.set()

    async def acquire(self, session_id: str, owner: str, ttl: float) -> bool:
        """Take the lease (or extend it when ``owner`` holds it); ``False`` when taken."""
        check_lease_ttl(ttl)
        now = anyio.current_time()
        live = self._live(session_id)
        if live is not None and live.owner != owner:
            return False
        if live is not None:
            live.expires_at = now + ttl
            return True
        previous = self._leases.get(session_id)
        generation = 1 if previous is None else previous.generation + 1
        self._leases[session_id] = _MemoryLease(owner, generation, now + ttl)
        self._notify(session_id)
        return True

    async def renew(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s live lease to ``ttl`` seconds from now."""
        check_lease_ttl(ttl)
        live = self._live(session_id)
        if live is None or live.owner != owner:
            return False
        live.expires_at = anyio.current_time() + ttl
        return True

    async def release(self, session_id: str, owner: str) -> bool:
        """Give the lease up and wake the waiters."""
        live = self._live(session_id)
        if live is None or live.owner != owner:
            return False
        live.expires_at = -math.inf
        self._notify(session_id)
        return True

    async def holder(self, session_id: str) -> LeaseHolder | None:
        """The live holder, or ``None``."""
        live = self._live(session_id)
        if live is None:
            return None
        return LeaseHolder(
            live.owner, live.generation, max(0.0, live.expires_at - anyio.current_time())
        )

    async def wait_released(
        self,
        session_id: str,
        timeout: float,  # noqa: ASYNC109 - the WriterLease signature
        *,
        generation: int | None = None,
    ) -> bool:
        """Wait until the lease held now (or ``generation``) is released, lapses or
        changes hands; ``False`` after ``timeout`` seconds."""
        deadline = anyio.current_time() + max(0.0, timeout)
        watched = generation
        while True:
            live = self._live(session_id)
            if live is None:
                return True
            if watched is None:
                watched = live.generation
            if live.generation != watched:
                return True
            now = anyio.current_time()
            if now >= deadline:
                return False
            event = self._changed.setdefault(session_id, anyio.Event())
            # Woken by a release or a takeover; a lapse is found by waking at the expiry.
            with anyio.move_on_after(min(live.expires_at, deadline) - now):
                await event.wait()

    async def set_watermark_if_held(self, session_id: str, owner: str, message_id: str) -> bool:
        """Write the watermark only while ``owner`` holds a live lease.

        Raises:
            StoreError: The session is unknown (from the store).
        """
        live = self._live(session_id)
        if live is None or live.owner != owner:
            return False
        await self._store.set_watermark(session_id, message_id)
        return True
