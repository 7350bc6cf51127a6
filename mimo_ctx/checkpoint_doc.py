"""Deprecated alias: the ``checkpoint.md`` layout moved to :mod:`mimo_ctx.checkpoint.document`.

Kept while the built-in writers (:mod:`mimo_ctx.checkpoint_writers`) still import
from here; import from :mod:`mimo_ctx.checkpoint.document` instead.
"""

from __future__ import annotations

from mimo_ctx.checkpoint.document import *  # noqa: F403  (every name, whatever it grows to)
from mimo_ctx.checkpoint.document import __all__ as __all__  # noqa: PLC0414
