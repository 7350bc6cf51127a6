"""Sessions as one process sees them: opening one, and what is kept per session.

Private step of :class:`~mimo_ctx.middleware.ContextMiddleware`.
:func:`open_session` returns a stored session or creates it with its frozen
prefix. :class:`SessionRegistry` holds the per-process state of every session the
middleware serves (its :class:`~mimo_ctx._window.LiveSession` and its
host-history reconcilers) until the session is closed, so a long-running service
does not keep every session it ever served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from mimo_ctx._util import now_ms
from mimo_ctx._window import LiveSession
from mimo_ctx.checkpoint.protocol import SentApi, SentRequest
from mimo_ctx.errors import MimoCtxError, StoreError
from mimo_ctx.memory import MemoryLayout
from mimo_ctx.messages import Message
from mimo_ctx.reconcile import HostHistory
from mimo_ctx.session import RequestPrefix, Session
from mimo_ctx.store.base import Store

__all__ = ["SessionRegistry", "known_session", "open_session"]


async def open_session(
    store: Store,
    layout: MemoryLayout,
    session_id: str | None,
    *,
    project_id: str,
    system: str,
    tools: Sequence[dict[str, object]],
    title: str,
) -> Session:
    """The stored session, or a new one with this frozen prefix.

    Raises:
        PathEscapeError: ``session_id`` or ``project_id`` cannot name a memory
            directory (refused up front rather than at the first rebuild).
    """
    if session_id is not None:
        layout.session_dir(session_id)
    layout.project_dir(project_id)
    if session_id is not None:
        existing = await store.get_session(session_id)
        if existing is not None:
            return existing
    session = Session(
        project_id=project_id,
        title=title,
        time_created=now_ms(),
        prefix=RequestPrefix(system=system, tools=[dict(t) for t in tools]),
    )
    if session_id is not None:
        session = session.model_copy(update={"id": session_id})
    try:
        await store.create_session(session)
    except StoreError:
        # Another task or worker created it first: use theirs.
        existing = await store.get_session(session.id)
        if existing is None:
            raise
        return existing
    return session


async def known_session(store: Store, session_id: str) -> Session:
    """The stored session; an unknown one is the caller's mistake, said as such."""
    session = await store.get_session(session_id)
    if session is None:
        raise MimoCtxError(f"unknown session {session_id!r}: call open_session() first")
    return session


class SessionRegistry:
    """The per-process state of each session, kept until :meth:`close`."""

    def __init__(self) -> None:
        self._states: dict[str, LiveSession] = {}
        self._hosts: dict[tuple[str, str], HostHistory] = {}

    def state(self, session_id: str) -> LiveSession:
        """The session's state (created on first use)."""
        state = self._states.get(session_id)
        if state is None:
            state = self._states[session_id] = LiveSession()
        return state

    def __getitem__(self, session_id: str) -> LiveSession:
        """The state of a session in use (KeyError otherwise)."""
        return self._states[session_id]

    def last_request(self, session_id: str) -> SentRequest | None:
        """The main agent's last request, while the session is in use.

        Its payload's lists are the caller's own copies: a wrapped client updates the
        list it sent in place for its next call (one list per session, O(new) per
        call), and a forked writer must resend what was sent.
        """
        state = self._states.get(session_id)
        last = state.last_request if state is not None else None
        if last is None or last.payload is None:
            return last
        payload = {
            key: list(cast("list[Any]", value)) if isinstance(value, list) else value
            for key, value in last.payload.items()
        }
        return dataclasses.replace(last, payload=payload)

    def sent(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        api: SentApi,
        payload: Mapping[str, Any],
        origin: str | None,
    ) -> None:
        """Attach the payload a client sent to the last request, if it is the one for ``messages``.

        A newer view prepared meanwhile (another task of the session) is left alone:
        the payload belongs to the view it was built from.
        """
        state = self._states.get(session_id)
        last = state.last_request if state is not None else None
        if state is not None and last is not None and last.messages is messages:
            state.last_request = dataclasses.replace(last, api=api, payload=payload, origin=origin)

    def host(self, session_id: str, agent: str, make: Callable[[], HostHistory]) -> HostHistory:
        """The session's host-history reconciler for ``agent`` (made on first use)."""
        found = self._hosts.get((session_id, agent))
        if found is None:
            found = self._hosts[(session_id, agent)] = make()
        return found

    async def close(self, session_id: str) -> None:
        """Forget the session; a call still running finishes on the state it holds."""
        state = self._states.get(session_id)
        if state is not None:
            async with state.lock:
                self._states.pop(session_id, None)
        for key in [k for k in self._hosts if k[0] == session_id]:
            host = self._hosts.pop(key)
            async with host.lock:
                pass
