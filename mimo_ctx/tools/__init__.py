"""Agent-facing tools: ``history``, ``memory``, ``task`` and ``actor``.

The rebuild body and the per-turn reminder point the model at these tools (SPEC
R5.5, R8.3); :class:`SessionTools` makes every pointer lead somewhere real.
Each tool has one definition (:mod:`mimo_ctx.tools.definitions`) from which the
OpenAI, Anthropic, pydantic-ai and LangChain shapes are generated
(:mod:`mimo_ctx.tools.formats`).

Example:
    >>> tools = SessionTools(store, layout, session.id, session.project_id)  # doctest: +SKIP
    >>> response = await client.chat.completions.create(  # doctest: +SKIP
    ...     model=..., messages=..., tools=tools.to_openai_tools())
    >>> text = await tools.call(call.function.name, call.function.arguments)  # doctest: +SKIP
"""

from __future__ import annotations

from mimo_ctx.tools._message_text import render_message
from mimo_ctx.tools.definitions import (
    ACTOR_TOOL,
    ALL_TOOL_SPECS,
    HISTORY_TOOL,
    MEMORY_TOOL,
    TASK_TOOL,
    ArgumentError,
    ToolArgument,
    ToolDefinition,
    ToolOperation,
    ToolResult,
    ToolSpec,
    check_arguments,
)
from mimo_ctx.tools.formats import (
    ToolSchema,
    to_anthropic_tools,
    to_openai_tools,
)
from mimo_ctx.tools.handlers import SessionTools

__all__ = [
    "ACTOR_TOOL",
    "ALL_TOOL_SPECS",
    "HISTORY_TOOL",
    "MEMORY_TOOL",
    "TASK_TOOL",
    "ArgumentError",
    "SessionTools",
    "ToolArgument",
    "ToolDefinition",
    "ToolOperation",
    "ToolResult",
    "ToolSchema",
    "ToolSpec",
    "check_arguments",
    "render_message",
    "to_anthropic_tools",
    "to_openai_tools",
]
