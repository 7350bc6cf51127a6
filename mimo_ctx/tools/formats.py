"""Export shapes of the agent-facing tools, all generated from the one definition.

* :func:`to_openai_tools` — OpenAI function tools: Chat Completions
  (``{"type": "function", "function": {...}}``) or Responses API
  (``{"type": "function", "name": ...}``); plain dicts, no SDK import.
* :func:`to_anthropic_tools` — Anthropic Messages tools
  (``{"name", "description", "input_schema"}``); plain dicts.
* :func:`to_pydantic_ai_tools` — :class:`pydantic_ai.Tool` objects built with
  ``Tool.from_schema`` (needs ``pip install "mimo-ctx[pydantic-ai]"``).
* :func:`to_langchain_tools` — ``langchain_core.tools.StructuredTool`` objects
  whose ``args_schema`` is the JSON schema (needs ``pip install "mimo-ctx[langchain]"``).

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

from mimo_ctx.tools.definitions import ToolDefinition

__all__ = [
    "ToolSchema",
    "to_anthropic_tools",
    "to_langchain_tools",
    "to_openai_tools",
    "to_pydantic_ai_tools",
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


def to_pydantic_ai_tools(tools: Iterable[ToolDefinition]) -> list[Any]:
    """pydantic-ai ``Tool`` objects running the bound handlers.

    Built with ``Tool.from_schema``: the JSON schema is given to the model as it
    is and the arguments reach the handler unchanged (our own check validates
    them and answers a bad call with an ``Error:`` text).

    Args:
        tools: Bound definitions (``SessionTools.definitions``).

    Returns:
        ``pydantic_ai.Tool`` objects for ``Agent(tools=...)``.

    Raises:
        ImportError: pydantic-ai is not installed (``pip install "mimo-ctx[pydantic-ai]"``).
    """
    try:
        from pydantic_ai import Tool
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise ImportError(
            'pydantic-ai tools need pydantic-ai: pip install "mimo-ctx[pydantic-ai]"'
        ) from exc
    return [
        Tool.from_schema(
            _keyword_runner(definition),
            name=definition.name,
            description=definition.description,
            json_schema=definition.parameters,
        )
        for definition in tools
    ]


def to_langchain_tools(tools: Iterable[ToolDefinition]) -> list[Any]:
    """LangChain ``StructuredTool`` objects running the bound handlers (async only).

    ``args_schema`` is the tool's JSON schema dict, so chat models bound with
    ``bind_tools`` see exactly the schema of the other shapes.

    Args:
        tools: Bound definitions (``SessionTools.definitions``).

    Returns:
        ``langchain_core.tools.StructuredTool`` objects; call them with ``ainvoke``.

    Raises:
        ImportError: langchain-core is not installed (``pip install "mimo-ctx[langchain]"``).
    """
    try:
        from langchain_core.tools import StructuredTool
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise ImportError(
            'LangChain tools need langchain-core: pip install "mimo-ctx[langchain]"'
        ) from exc
    return [
        StructuredTool(
            name=definition.name,
            description=definition.description,
            args_schema=definition.parameters,
            coroutine=_keyword_runner(definition),
        )
        for definition in tools
    ]


def _keyword_runner(definition: ToolDefinition) -> Any:
    """An async function taking the arguments as keywords (how both frameworks call)."""

    async def run(**arguments: Any) -> str:
        return (await definition.run(arguments)).text

    run.__name__ = definition.name
    run.__doc__ = definition.description
    return run
