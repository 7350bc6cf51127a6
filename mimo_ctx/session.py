"""The domain models: sessions, their frozen prefix and state, tasks and actors.

Plain pydantic models, without I/O: the pure modules (sections, the checkpoint
writers' inputs) use them without importing the storage package, and every
store (:mod:`mimo_ctx.store`) persists them. Messages live in
:mod:`mimo_ctx.messages`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any, Final, Literal, TypeAlias, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mimo_ctx import ids
from mimo_ctx.errors import InvalidIdError

__all__ = [
    "ACTIVE_ACTOR_STATUSES",
    "MAX_ID_BYTES",
    "TERMINAL_TASK_STATUSES",
    "Actor",
    "ActorStatus",
    "RequestPrefix",
    "Session",
    "SessionState",
    "StateChange",
    "Task",
    "TaskStatus",
    "check_id",
    "task_order_key",
]

_DIGITS = re.compile(r"(\d+)")

MAX_ID_BYTES: Final = 128
"""Longest session, project or task id, in UTF-8 bytes.

An id is a directory name (SPEC A13): file systems stop at 255 bytes a name,
and a directory path of several such names soon passes ``PATH_MAX`` on others.
Generated ids are 32 characters; UUIDs 36.
"""

_CATEGORY_NAMES: Final = {
    "Cc": "a control character",
    "Cs": "a lone surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
"""Unicode categories an id must not hold, by what the message calls them."""


def check_id(value: str, what: str) -> str:
    """Return ``value`` if it can name a memory directory, else raise one clear error.

    Args:
        value: The id.
        what: What it is, for the message (``session id``...).

    Raises:
        InvalidIdError: Empty; longer than :data:`MAX_ID_BYTES` in UTF-8; ``.`` or
            ``..``; holds ``/``, ``\\``, a control character (NUL, newline, tab...), a
            line separator or a lone surrogate.
    """
    if not isinstance(value, str) or not value:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidIdError(f"{what} must be a non-empty string, got {value!r}")
    for index, char in enumerate(value):
        if unicodedata.category(char) in _CATEGORY_NAMES:
            kind = _CATEGORY_NAMES[unicodedata.category(char)]
            raise InvalidIdError(
                f"{what} {value[:60]!a}{'...' if len(value) > 60 else ''} holds {kind} "
                f"(U+{ord(char):04X} at position {index}); ids name directories and must be "
                "printable text"
            )
    if value in (".", "..") or "/" in value or "\\" in value:
        raise InvalidIdError(
            f"{what} {value!r} cannot be used as a path component "
            "(it must not be '.' or '..' or contain '/' or '\\')"
        )
    size = len(value.encode("utf-8"))
    if size > MAX_ID_BYTES:
        raise InvalidIdError(
            f"{what} {value[:40]!r}... is {size} bytes long in UTF-8; ids name directories "
            f"and may be at most {MAX_ID_BYTES} bytes"
        )
    return value


TaskStatus = Literal[
    "open", "dispatched", "in_progress", "blocked", "human_review", "done", "failed", "abandoned"
]
TERMINAL_TASK_STATUSES: frozenset[str] = frozenset({"done", "failed", "abandoned"})

ActorStatus = Literal["pending", "running", "completed", "failed", "cancelled"]
ACTIVE_ACTOR_STATUSES: frozenset[str] = frozenset({"pending", "running"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestPrefix(_Model):
    """A session's frozen request prefix (SPEC R8.1 (1)): system prompt and tool list.

    Stored once and returned byte-identical every turn, so provider prompt caches
    keep hitting.
    """

    system: str = ""
    tools: list[dict[str, Any]] = Field(default_factory=list[dict[str, Any]])


_RETIRED_STATE_FIELD: Final = "skip_overflow_once"


class SessionState(_Model):
    """Automation state of a session, persisted so other workers see it.

    Attributes:
        crossed_thresholds: Writer thresholds (tokens) already fired; cleared after a
            successful rebuild (SPEC A3).
        auto_rebuild_disabled: Set by the loop guard (R5.9 **beyond**).
        freed_fractions: Share of the request freed by each recent rebuild, newest last.
        rebuilds: How many rebuilds the session has had.
    """

    crossed_thresholds: list[int] = Field(default_factory=list[int])
    auto_rebuild_disabled: bool = False
    freed_fractions: list[float] = Field(default_factory=list[float])
    rebuilds: int = 0

    def after_rebuild(self, freed: float, *, manual: bool, min_freed: float) -> SessionState:
        """The state after a committed rebuild that freed ``freed`` of the request.

        Thresholds are cleared and the rebuild counted. The loop guard (R5.9
        **beyond**): two rebuilds in a row that each freed less than ``min_freed``
        stop automatic rebuilds; a manual one never does.
        """
        fractions = [*self.freed_fractions, freed][-5:]
        disable = not manual and len(fractions) >= 2 and all(f < min_freed for f in fractions[-2:])
        return self.model_copy(
            update={
                "crossed_thresholds": [],
                "rebuilds": self.rebuilds + 1,
                "freed_fractions": fractions,
                "auto_rebuild_disabled": self.auto_rebuild_disabled or disable,
            }
        )

    @model_validator(mode="before")
    @classmethod
    def _drop_retired_fields(cls, data: object) -> object:
        # R1.4's "skip the next overflow check once after a rebuild" is the
        # once-per-usage rule itself (a boundary newer than the last usage skips
        # every check until a new assistant message finishes), so the separate
        # flag earlier versions stored was never read. Rows written by them still
        # load; the flag is dropped.
        if not isinstance(data, dict):
            return data
        fields = cast("dict[str, Any]", data)
        return {k: v for k, v in fields.items() if k != _RETIRED_STATE_FIELD}


StateChange: TypeAlias = Callable[[SessionState], SessionState]
"""A change of a session's state: the new state computed from the state as stored.

Pure and quick (a store may run it on a worker thread, inside its write
transaction): it must not await, do I/O or depend on anything but its argument
and values captured beforehand.
"""


class Session(_Model):
    """A conversation: ordered messages of a main agent and its sub-agents."""

    id: str = Field(default_factory=lambda: ids.ascending("ses"))
    project_id: str = "default"
    title: str = ""
    time_created: int = Field(ge=0)
    prefix: RequestPrefix | None = None
    watermark: str | None = None
    state: SessionState = Field(default_factory=SessionState)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Task(_Model):
    """An entry of a session's task registry (SPEC A16): ids ``T1``, ``T1.2``."""

    id: str
    session_id: str
    parent_id: str | None = None
    status: TaskStatus = "open"
    summary: str = ""
    progress_file: str | None = None
    time_created: int = Field(ge=0)
    time_updated: int = Field(ge=0)

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        # A task id names its directory (tasks/<id>/progress.md) and a ledger line.
        return check_id(value, "task id")


class Actor(_Model):
    """A background actor (a long-running sub-agent or job) of a session."""

    id: str
    session_id: str
    agent: str
    description: str = ""
    status: ActorStatus = "pending"
    background: bool = True
    time_created: int = Field(ge=0)
    time_last_activity: int = Field(ge=0)


def task_order_key(task_id: str) -> tuple[tuple[int, str], ...]:
    """Return a key that sorts task ids naturally (SPEC A16): ``T2`` before ``T10``.

    The id is split into alternating text and number pieces; numbers compare by
    value, text by its characters. So ``T1 < T1.2 < T1.10 < T2 < T10``.

    Args:
        task_id: A task id such as ``T1.2`` (any string is accepted).

    Returns:
        A tuple usable as a sort key. Ids differing only in leading zeros
        (``T01``, ``T1``) get equal keys; sort by ``(key, id)`` to break the tie.
    """
    pieces = _DIGITS.split(task_id)
    # re.split with a capturing group puts numbers at the odd positions, so a
    # position holds text in every key or a number in every key: encoding text
    # as (0, text) and numbers as (value, "") keeps the comparison typed and total.
    return tuple((int(p), "") if i % 2 else (0, p) for i, p in enumerate(pieces))
