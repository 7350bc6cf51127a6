"""The session tools as framework tool objects: pydantic-ai ``Tool``, LangChain ``StructuredTool``.

Each runs the bound handler of a :class:`~mimo_ctx.tools.definitions.ToolDefinition`
(``SessionTools.definitions``); :meth:`~mimo_ctx.tools.SessionTools.to_pydantic_ai_tools`
and :meth:`~mimo_ctx.tools.SessionTools.to_langchain_tools` call these. The
framework is imported when a function is called, with an ImportError naming the
extra when it is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterable
from typing import Any

from mimo_ctx.tools.definitions import ToolDefinition

__all__ = ["to_langchain_tools", "to_pydantic_ai_tools"]


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
    with _framework("pydantic-ai tools need pydantic-ai", "pydantic-ai"):
        from pydantic_ai import Tool
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
    with _framework("LangChain tools need langchain-core", "langchain"):
        from langchain_core.tools import StructuredTool
    return [
        StructuredTool(
            name=definition.name,
            description=definition.description,
            args_schema=definition.parameters,
            coroutine=_keyword_runner(definition),
        )
        for definition in tools
    ]


@contextlib.contextmanager
def _framework(needs: str, extra: str) -> Generator[None]:
    """Imports of a framework: an ImportError says which extra installs it."""
    try:
        yield
    except ImportError as exc:
        raise ImportError(f'{needs}: pip install "mimo-ctx[{extra}]"') from exc


def _keyword_runner(definition: ToolDefinition) -> Any:
    """An async function taking the arguments as keywords (how both frameworks call)."""

    async def run(**arguments: Any) -> str:
        return (await definition.run(arguments)).text

    run.__name__ = definition.name
    run.__doc__ = definition.description
    return run
