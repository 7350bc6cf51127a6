"""Typed narrowing of parsed JSON for the tests.

``json.loads`` returns ``Any`` and ``isinstance(value, list)`` narrows that to a list
of unknown items; these guards narrow to containers of ``Any`` (still untyped JSON),
so a test can check a document's shape and then read it.
"""

from __future__ import annotations

from typing import Any, TypeGuard


def is_json_object(value: object) -> TypeGuard[dict[str, Any]]:
    """Whether ``value`` is a JSON object (a ``dict``)."""
    return isinstance(value, dict)


def is_json_array(value: object) -> TypeGuard[list[Any]]:
    """Whether ``value`` is a JSON array (a ``list``)."""
    return isinstance(value, list)
