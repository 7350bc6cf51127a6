"""Export shapes of the agent-facing tools, all generated from the one definition.

* :func:`to_openai_tools` — OpenAI function tools: Chat Completions
  (``{"type": "function", "function": {...}}``) or Responses API
  (``{"type": "function", "name": ...}``); plain dicts, no SDK import.
* :func:`to_anthropic_tools` — Anthropic Messages tools
  (``{"name", "description", "input_schema"}``); plain dicts.

The framework shapes (pydantic-ai ``Tool``, LangChain ``StructuredTool``) import
their SDK, so they live with the integrations: :mod:`mimo_ctx.integrations.tools`.
Name, description and JSON schema always come from
:class:`~mimo_ctx.tools.definitions.ToolSpec`, so the four shapes agree. The
framework tools run the bound handler and return its text; a bad call returns
text starting with ``Error:`` rather than raising (see
:mod:`mimo_ctx.tools.handlers`), so the model reads what went wrong and can
correct itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, Protocol

__all__ = [
    "ToolSchema",
    "to_anthropic_tools",
    "to_openai_tools",
]


class ToolSchema(Protocol):
    """What the dict shapes need: a tool's name, description and JSON schema.

    Both :class:`~mimo_ctx.tools.definitions.ToolSpec` (unbound) and
    :class:`~mimo_ctx.tools.definitions.ToolDefinition` (bound) qualify.
    """

    @property
    def name(self) -> str:
        """The tool name."""
        ...

    @property
    def description(self) -> str:
        """The tool description."""
        ...

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the input."""
        ...


def to_openai_tools(
    tools: Iterable[ToolSchema], *, api: Literal["chat", "responses"] | str = "chat"
) -> list[dict[str, Any]]:
    """OpenAI function tool definitions.

    Args:
        tools: Tool specs or bound definitions.
        api: ``"chat"`` for Chat Completions
            (``{"type": "function", "function": {"name", "description", "parameters"}}``),
            ``"responses"`` for the Responses API
            (``{"type": "function", "name", "description", "parameters", "strict": False}``).
            ``strict`` is off: strict mode would require every property, and most
            arguments here are operation-specific and optional.

    Returns:
        One dict per tool, ready for the SDK's ``tools=`` parameter.

    Raises:
        ValueError: ``api`` is neither ``"chat"`` nor ``"responses"``.
    """
    if api == "chat":
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in tools
        ]
    if api == "responses":
        return [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in tools
        ]
    raise ValueError(f"api must be 'chat' or 'responses', got {api!r}")


def to_anthropic_tools(tools: Iterable[ToolSchema]) -> list[dict[str, Any]]:
    """Anthropic Messages API tool definitions (``{"name", "description", "input_schema"}``).

    Args:
        tools: Tool specs or bound definitions.

    Returns:
        One dict per tool, ready for the SDK's ``tools=`` parameter.
    """
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]
