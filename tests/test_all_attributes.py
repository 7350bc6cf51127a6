"""Every module's ``__all__``: public modules have one, and every name in it exists."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import mimo_ctx


def _module_names() -> list[str]:
    names = [mimo_ctx.__name__]
    for info in pkgutil.walk_packages(mimo_ctx.__path__, prefix=f"{mimo_ctx.__name__}."):
        names.append(info.name)
    return sorted(names)


def _is_public(name: str) -> bool:
    # "__main__" modules are entry points, not namespaces to import from.
    parts = name.split(".")
    return not any(part.startswith("_") for part in parts)


MODULES = _module_names()


def _load(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_the_walk_finds_the_package() -> None:
    assert "mimo_ctx.middleware" in MODULES
    assert "mimo_ctx.checkpoint.document" in MODULES
    assert "mimo_ctx.store.postgres" in MODULES


@pytest.mark.parametrize("name", [n for n in MODULES if _is_public(n)])
def test_public_module_declares_a_sorted_all(name: str) -> None:
    module = _load(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"

    # ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest, each sorted.
    def key(item: str) -> tuple[int, str]:
        if item.isupper():
            return (0, item)
        if item[:1].isupper():
            return (1, item)
        return (2, item)

    assert exported == sorted(exported, key=key), f"{name}.__all__ is not sorted"


@pytest.mark.parametrize("name", MODULES)
def test_every_name_in_all_exists(name: str) -> None:
    module = _load(name)
    missing = [item for item in getattr(module, "__all__", ()) if not hasattr(module, item)]
    assert missing == [], f"{name}.__all__ names what it does not define: {missing}"
