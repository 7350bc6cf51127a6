"""The exception tree: every public exception of the library is a ``MimoCtxError`` in
``mimo_ctx.errors``; the module's docstring draws all of them."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import mimo_ctx
from mimo_ctx import errors
from mimo_ctx.testing import FakeOverflowError

# Stands in for a provider's own error in tests and demos: deliberately not ours.
_NOT_OURS = {FakeOverflowError}


def _public_exceptions() -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    names = [mimo_ctx.__name__] + [
        info.name
        for info in pkgutil.walk_packages(mimo_ctx.__path__, prefix=f"{mimo_ctx.__name__}.")
    ]
    for name in names:
        if any(part.startswith("_") for part in name.split(".")):
            # A private module's signals (a rebuild key already taken, ...) are
            # caught inside the library and never reach a host.
            continue
        module = importlib.import_module(name)
        for item in getattr(module, "__all__", ()):
            value = getattr(module, item)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.add(value)
    return found - _NOT_OURS


def test_every_public_exception_is_a_mimo_ctx_error_defined_in_errors() -> None:
    found = _public_exceptions()
    assert errors.ArgumentError in found  # the walk sees the re-exports too
    for exc in found:
        assert issubclass(exc, errors.MimoCtxError), exc
        assert exc.__module__ == "mimo_ctx.errors", exc


@pytest.mark.parametrize("name", errors.__all__)
def test_the_docstring_draws_every_error(name: str) -> None:
    assert errors.__doc__ is not None
    assert name in errors.__doc__


@pytest.mark.parametrize(
    ("old_home", "name"),
    [
        ("mimo_ctx.boundary", "BoundaryError"),
        ("mimo_ctx.tools", "ArgumentError"),
        ("mimo_ctx.tools.definitions", "ArgumentError"),
    ],
)
def test_errors_are_still_importable_where_they_were(old_home: str, name: str) -> None:
    assert getattr(importlib.import_module(old_home), name) is getattr(errors, name)


def test_bad_tool_arguments_are_caught_as_a_library_error() -> None:
    from mimo_ctx.tools import HISTORY_TOOL, check_arguments

    with pytest.raises(errors.MimoCtxError, match="operation"):
        check_arguments(HISTORY_TOOL, {"operation": "no-such-operation"})
