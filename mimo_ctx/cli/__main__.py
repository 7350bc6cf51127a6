"""``python -m mimo_ctx.cli``: the ``mimo-ctx`` command."""

from __future__ import annotations

import sys

from mimo_ctx.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
