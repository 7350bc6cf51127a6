"""The ``mimo-ctx`` command: :func:`main` is its entry point.

One private module per subcommand (``_demo``, ``_inspect``, ``_replay``,
``_render``, ``_db``) registers its parser and prints its results; ``_app``
assembles the parser and maps errors to exit codes (see its docstring).
"""

from __future__ import annotations

from mimo_ctx.cli._app import build_parser, main

__all__ = ["build_parser", "main"]
