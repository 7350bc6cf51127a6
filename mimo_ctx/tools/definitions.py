"""The one definition of each agent-facing tool: name, description, JSON schema.

Every export shape (OpenAI, Anthropic, pydantic-ai, LangChain; see
:mod:`mimo_ctx.tools.formats`) and the argument check the handlers run are
generated from the :class:`ToolSpec` objects here, so the four shapes cannot
drift apart.

Each tool takes an ``operation`` argument (an enum) and the arguments of that
operation. The schema is flat (one object, only ``operation`` required) rather
than a ``oneOf`` per operation, because not every provider accepts ``oneOf`` at
the top of a tool schema; which arguments an operation needs is stated in the
descriptions and checked by :func:`check_arguments`.

The names and operations match what the rebuild body and the per-turn reminder
tell the model (SPEC R5.5 ``history`` / ``operation=around``, R8.3 ``memory``,
``task``, ``actor``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from mimo_ctx.errors import ArgumentError
from mimo_ctx.session import TaskStatus

__all__ = [
    "ACTOR_TOOL",
    "ALL_TOOL_SPECS",
    "ARGUMENT_ALIASES",
    "HISTORY_TOOL",
    "MEMORY_TOOL",
    "TASK_STATUSES",
    "TASK_TOOL",
    "ArgumentError",
    "ToolArgument",
    "ToolDefinition",
    "ToolOperation",
    "ToolResult",
    "ToolSpec",
    "check_arguments",
]

TASK_STATUSES: Final[tuple[TaskStatus, ...]] = (
    "open",
    "dispatched",
    "in_progress",
    "blocked",
    "human_review",
    "done",
    "failed",
    "abandoned",
)
"""The task statuses of SPEC A16, in the store's order."""

ARGUMENT_ALIASES: Final[Mapping[str, str]] = {"messageID": "message_id", "messageId": "message_id"}
"""Other spellings accepted for an argument: the elision line of the rebuild body
writes ``messageID=<id>`` (SPEC A7), so a model may copy that spelling."""


@dataclass(frozen=True, slots=True)
class ToolArgument:
    """One property of a tool's input schema.

    Attributes:
        name: The property name.
        type: ``string`` or ``integer``.
        description: What the model should put there (names the operations using it).
        enum: Allowed values of a string argument.
        minimum: Smallest allowed integer.
        maximum: Largest allowed integer.
    """

    name: str
    type: Literal["string", "integer"]
    description: str
    enum: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None

    def schema(self) -> dict[str, Any]:
        """The JSON schema of this property."""
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


@dataclass(frozen=True, slots=True)
class ToolOperation:
    """One value of a tool's ``operation`` argument.

    Attributes:
        name: The operation name.
        summary: One line for the tool description.
        required: Arguments the operation needs.
        optional: Arguments the operation reads when given.
    """

    name: str
    summary: str
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """The one definition of a tool: everything but its handler.

    Attributes:
        name: The tool name the model calls.
        purpose: The first paragraph of the description.
        operations: The operations, in the order they are documented.
        arguments: The operation-specific arguments (``operation`` is added).
    """

    name: str
    purpose: str
    operations: tuple[ToolOperation, ...]
    arguments: tuple[ToolArgument, ...] = field(default=())

    @property
    def description(self) -> str:
        """The tool description: purpose, then one line per operation."""
        lines = [self.purpose, "", "Operations:"]
        for op in self.operations:
            args = [*op.required, *(f"{name}?" for name in op.optional)]
            signature = f"{op.name}({', '.join(args)})"
            lines.append(f"- {signature}: {op.summary}")
        return "\n".join(lines)

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the tool's input (a new dict each time)."""
        properties: dict[str, Any] = {
            "operation": {
                "type": "string",
                "enum": [op.name for op in self.operations],
                "description": "What to do: " + ", ".join(op.name for op in self.operations) + ".",
            }
        }
        for argument in self.arguments:
            properties[argument.name] = argument.schema()
        return {
            "type": "object",
            "properties": properties,
            "required": ["operation"],
            "additionalProperties": False,
        }

    def operation(self, name: str) -> ToolOperation | None:
        """The operation called ``name``, or ``None``."""
        for op in self.operations:
            if op.name == name:
                return op
        return None


def _as_int(name: str, value: Any) -> int:
    # Models sometimes send 5.0 or "5" for an integer; accept what is clearly one.
    if isinstance(value, bool):
        raise ArgumentError(f"argument {name!r} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ArgumentError(f"argument {name!r} must be an integer, got {value!r}")


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Check a call's arguments against ``spec`` and return the operation and its arguments.

    ``null`` values count as absent (OpenAI strict mode sends them for omitted
    optional properties); the spellings in :data:`ARGUMENT_ALIASES` are
    accepted; arguments the operation does not use are ignored, so generic
    clients that fill every property still work.

    Args:
        spec: The tool.
        arguments: The call's arguments as the model sent them.

    Returns:
        The operation name and its arguments (only those it uses, converted).

    Raises:
        ArgumentError: Unknown operation or argument, missing required argument,
            wrong type, value out of range or not in the enum.
    """
    known = {a.name: a for a in spec.arguments}
    values: dict[str, Any] = {}
    for raw_name, value in arguments.items():
        name = ARGUMENT_ALIASES.get(raw_name, raw_name)
        if value is None:
            continue
        if name != "operation" and name not in known:
            expected = ", ".join(["operation", *known])
            raise ArgumentError(
                f"unknown argument {raw_name!r} for the {spec.name} tool; expected: {expected}"
            )
        values[name] = value
    names = [op.name for op in spec.operations]
    operation = values.get("operation")
    if operation is None:
        raise ArgumentError(
            f"the {spec.name} tool needs an 'operation' argument, one of: {', '.join(names)}"
        )
    op = spec.operation(operation) if isinstance(operation, str) else None
    if op is None:
        raise ArgumentError(
            f"unknown operation {operation!r} for the {spec.name} tool; "
            f"expected one of: {', '.join(names)}"
        )
    out: dict[str, Any] = {}
    for name in (*op.required, *op.optional):
        if name not in values:
            continue
        argument = known[name]
        value = values[name]
        if argument.type == "integer":
            number = _as_int(name, value)
            if argument.minimum is not None and number < argument.minimum:
                raise ArgumentError(
                    f"argument {name!r} must be at least {argument.minimum}, got {number}"
                )
            if argument.maximum is not None and number > argument.maximum:
                raise ArgumentError(
                    f"argument {name!r} must be at most {argument.maximum}, got {number}"
                )
            out[name] = number
            continue
        if not isinstance(value, str):
            raise ArgumentError(f"argument {name!r} must be a string, got {value!r}")
        if argument.enum is not None and value not in argument.enum:
            raise ArgumentError(
                f"argument {name!r} must be one of: {', '.join(argument.enum)}; got {value!r}"
            )
        out[name] = value
    missing = [name for name in op.required if name not in out or out[name] == ""]
    if missing:
        raise ArgumentError(
            f"operation {op.name!r} of the {spec.name} tool needs: {', '.join(missing)}"
        )
    return op.name, out


# -- the four tools ----------------------------------------------------------------------------

HISTORY_TOOL: Final = ToolSpec(
    name="history",
    purpose=(
        "Read this session's stored conversation, including messages that are no longer in "
        "your context and tool outputs that were cleared from it. When the context shows "
        "'[…elided N tokens; messageID=<id>; …]', call operation=around with that id as "
        "message_id to get the full text. Only this session's messages are visible."
    ),
    operations=(
        ToolOperation(
            "around",
            "the full stored text of a message and of its neighbours in the conversation",
            required=("message_id",),
            optional=("before", "after"),
        ),
        ToolOperation(
            "get",
            "the full stored text of one message (long messages are paged with offset)",
            required=("message_id",),
            optional=("offset",),
        ),
        ToolOperation(
            "search",
            "find messages containing the query words, newest first",
            required=("query",),
            optional=("limit",),
        ),
    ),
    arguments=(
        ToolArgument("message_id", "string", "around, get: the message id (msg_…)."),
        ToolArgument(
            "before", "integer", "around: messages before it (default 2).", minimum=0, maximum=20
        ),
        ToolArgument(
            "after", "integer", "around: messages after it (default 2).", minimum=0, maximum=20
        ),
        ToolArgument(
            "offset",
            "integer",
            "get: character offset to continue a long message from (default 0).",
            minimum=0,
        ),
        ToolArgument("query", "string", "search: words to look for (case-insensitive)."),
        ToolArgument(
            "limit", "integer", "search: most hits to return (default 10).", minimum=1, maximum=50
        ),
    ),
)
"""``history``: around / get / search over this session's stored messages."""

MEMORY_TOOL: Final = ToolSpec(
    name="memory",
    purpose=(
        "Search and read the memory files that outlive the context window: this session's "
        "checkpoint, notes and task progress files, the project's MEMORY.md and the global "
        "MEMORY.md. Paths are relative to the memory root, as search returns them; a path "
        "relative to the session memory directory also works."
    ),
    operations=(
        ToolOperation(
            "search",
            "full-text search, best matches first; each hit gives path, line and snippet",
            required=("query",),
            optional=("limit",),
        ),
        ToolOperation(
            "read",
            "read a memory file with line numbers, from line offset, at most limit lines",
            required=("path",),
            optional=("offset", "limit"),
        ),
    ),
    arguments=(
        ToolArgument("query", "string", "search: words to look for."),
        ToolArgument("path", "string", "read: the file, e.g. a path returned by search."),
        ToolArgument(
            "offset", "integer", "read: first line to return, 1-based (default 1).", minimum=1
        ),
        ToolArgument(
            "limit",
            "integer",
            "search: most hits (default 10, at most 50); read: most lines (default 200, "
            "at most 2000).",
            minimum=1,
            maximum=2000,
        ),
    ),
)
"""``memory``: search / read over this session's, its project's and global memory."""

TASK_TOOL: Final = ToolSpec(
    name="task",
    purpose=(
        "The task registry of this session (ids like T1, T1.2): list the tasks, show one, "
        "or update its status and summary."
    ),
    operations=(
        ToolOperation("list", "every task of this session with status and summary"),
        ToolOperation("get", "one task in detail", required=("task_id",)),
        ToolOperation(
            "update",
            "change a task's status and/or summary",
            required=("task_id",),
            optional=("status", "summary"),
        ),
    ),
    arguments=(
        ToolArgument("task_id", "string", "get, update: the task id, e.g. T1.2."),
        ToolArgument("status", "string", "update: the new status.", enum=TASK_STATUSES),
        ToolArgument("summary", "string", "update: the new one-line summary."),
    ),
)
"""``task``: list / get / update of this session's tasks."""

ACTOR_TOOL: Final = ToolSpec(
    name="actor",
    purpose=(
        "Background actors (long-running sub-agents and jobs) of this session: check one "
        "actor's status or list them all."
    ),
    operations=(
        ToolOperation("status", "one actor's status, agent and last activity", ("actor_id",)),
        ToolOperation("list", "every actor of this session, active ones first"),
    ),
    arguments=(ToolArgument("actor_id", "string", "status: the actor id."),),
)
"""``actor``: status / list of this session's background actors."""

ALL_TOOL_SPECS: Final[tuple[ToolSpec, ...]] = (HISTORY_TOOL, MEMORY_TOOL, TASK_TOOL, ACTOR_TOOL)
"""The four tools, in the order hosts register them."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call produced.

    Attributes:
        text: The text to hand to the model as the tool result.
        is_error: The call failed; ``text`` starts with ``Error:`` and says why.
    """

    text: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """A tool bound to a session: its spec plus the handler that runs it.

    Attributes:
        spec: The tool's one definition (name, description, schema).
        handler: Runs a call; never raises for a bad call (see the module docstring).
    """

    spec: ToolSpec
    handler: Callable[[Mapping[str, Any]], Awaitable[ToolResult]]

    @property
    def name(self) -> str:
        """The tool name."""
        return self.spec.name

    @property
    def description(self) -> str:
        """The tool description."""
        return self.spec.description

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the tool's input."""
        return self.spec.parameters

    async def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Run a call with the model's arguments."""
        return await self.handler(arguments)
