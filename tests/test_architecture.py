"""The shape of the package: where things live and who may import whom."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import mimo_ctx

PACKAGE = Path(mimo_ctx.__file__).resolve().parent


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_command_line_is_one_package() -> None:
    """No ``_cli_*.py`` beside the core: the command's modules live in ``mimo_ctx/cli/``."""
    assert not sorted(p.name for p in PACKAGE.glob("_cli_*.py"))
    assert not (PACKAGE / "cli.py").exists()
    assert (PACKAGE / "cli" / "__init__.py").is_file()


def test_the_benchmark_runner_is_not_in_the_package() -> None:
    assert not (PACKAGE / "bench.py").exists()
    offenders = [
        p.relative_to(PACKAGE).as_posix()
        for p in _sources()
        if re.search(r"^\s*(from|import) benchmarks\b", p.read_text(encoding="utf-8"), re.M)
    ]
    assert offenders == []


def test_runtime_text_cites_no_issue_numbers() -> None:
    """Docstrings and messages explain themselves instead of pointing at a tracker."""
    pattern = re.compile(r"\bissues? [0-9]+", re.IGNORECASE)
    hits = [
        f"{p.relative_to(PACKAGE).as_posix()}:{n}"
        for p in _sources()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def _class_lines(path: Path, name: str) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def test_the_middleware_is_a_facade_over_private_steps() -> None:
    """``ContextMiddleware`` keeps lifecycle, sessions and the public methods; the live
    window (``_window``) and the rebuild pipeline (``rebuild``) live in their own modules.

    The bound grows only with public entry points that delegate (``context_usage``
    breaks the view down in ``context_usage``; the rebuild hooks run in ``rebuild``;
    spans are opened by ``tracing``): logic added here instead fails it."""
    assert _class_lines(PACKAGE / "middleware.py", "ContextMiddleware") < 450


MODULE_LINES = 800
"""No module of the package is longer: past it a module holds more than one concept."""


def test_no_module_of_the_package_is_over_800_lines() -> None:
    lines = {
        p.relative_to(PACKAGE).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in _sources()
    }
    assert {name: n for name, n in lines.items() if n > MODULE_LINES} == {}


def _classes() -> dict[str, str]:
    """Every class the package defines at module level: ``name`` -> ``module path``."""
    found: dict[str, str] = {}
    for p in _sources():
        for node in ast.parse(p.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, p.relative_to(PACKAGE).as_posix())
    return found


def test_one_host_history_reconciler() -> None:
    """The wrappers and the integrations share one reconciler (``reconcile.HostHistory``),
    created only by the middleware that owns its per-session state."""
    classes = _classes()
    assert classes.get("HostHistory") == "reconcile.py"
    assert not {"HistorySync", "SessionSync"} & set(classes)
    creators = sorted(
        p.relative_to(PACKAGE).as_posix()
        for p in _sources()
        if re.search(r"\bHostHistory\(", p.read_text(encoding="utf-8"))
    )
    assert creators == ["middleware.py"]


def test_one_message_draft() -> None:
    """Providers, integrations and importers build messages with ``convert.MessageDraft``;
    the only other draft is the checkpoint writer's (another concept)."""
    drafts = {
        name: where
        for name, where in _classes().items()
        if name.endswith("Draft") and not name.startswith("_")
    }
    assert drafts == {"MessageDraft": "convert.py", "CheckpointDraft": "checkpoint/protocol.py"}


def test_only_the_middleware_and_its_steps_touch_the_writer_coordinator() -> None:
    """Callers use ``writer_running`` / ``start_writer`` / ``wait_for_writer`` instead."""
    # The middleware, its rebuild step, and the checkpoint package that holds it.
    allowed = {
        "middleware.py",
        "rebuild.py",
        "checkpoint/__init__.py",
        "checkpoint/_coordinator.py",
    }
    roots = [PACKAGE, PACKAGE.parent / "benchmarks", PACKAGE.parent / "examples"]
    pattern = re.compile(r"[.]_?coordinator\b|\bWriterCoordinator\b")
    offenders = [
        f"{p.relative_to(PACKAGE.parent).as_posix()}:{n}"
        for root in roots
        for p in sorted(root.rglob("*.py"))
        if p.relative_to(PACKAGE.parent).as_posix().removeprefix("mimo_ctx/") not in allowed
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line.split("#", 1)[0])
    ]
    assert offenders == []


# --------------------------------------------------------------------------- who imports whom
# The rule docs/architecture.md draws. Modules are named as dotted paths.

PURE = frozenset(
    {
        "mimo_ctx.boundary",
        "mimo_ctx.budget",
        "mimo_ctx.checkpoint.document",
        "mimo_ctx.checkpoint.evidence",
        "mimo_ctx.checkpoint._tool_evidence",
        "mimo_ctx.checkpoint.sections",
        "mimo_ctx.checkpoint.state",
        "mimo_ctx.compaction",
        "mimo_ctx.convert",
        "mimo_ctx.digest",
        "mimo_ctx.ids",
        "mimo_ctx.messages",
        "mimo_ctx.overflow",
        "mimo_ctx.reminders",
        "mimo_ctx.sections",
        "mimo_ctx.session",
        "mimo_ctx.tokens",
        "mimo_ctx.triggers",
        "mimo_ctx.typed_input",
        "mimo_ctx.view",
        "mimo_ctx._budget_cache",
        "mimo_ctx._marks",
        "mimo_ctx._replay_report",
        "mimo_ctx._section_caps",
        "mimo_ctx._skeleton",
        "mimo_ctx._structure",
    }
)
"""Synchronous algorithms on values: no store, no SDK, no file or network I/O."""

PURE_MAY_ALSO_USE = frozenset({"mimo_ctx.config", "mimo_ctx.errors", "mimo_ctx._util"})
"""Settings, the exception tree and the pure helpers: what every layer may import."""

IO_LIBRARIES = frozenset(
    {
        "aiofiles",
        "anthropic",
        "anyio",
        "asyncio",
        "asyncpg",
        "httpx",
        "langchain",
        "langchain_core",
        "openai",
        "opentelemetry",
        "pydantic_ai",
        "shutil",
        "socket",
        "sqlite3",
        "subprocess",
        "tempfile",
    }
)

SDKS = frozenset(
    {"anthropic", "langchain", "langchain_core", "openai", "opentelemetry", "pydantic_ai"}
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in _sources()}


def _resolve(module: str, node: ast.ImportFrom, alias: str) -> str:
    """The module an ``import`` names: ``from mimo_ctx import ids`` is ``mimo_ctx.ids``."""
    if node.level:
        base = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            base = base.rsplit(".", 1)[0]
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    child = f"{target}.{alias}"
    return child if child in MODULES else target


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, at any depth of its code (lazy imports too)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.update(_resolve(module, node, alias.name) for alias in node.names)
    return found


def _ours(names: set[str]) -> set[str]:
    return {n for n in names if n == "mimo_ctx" or n.startswith("mimo_ctx.")}


def _top(names: set[str]) -> set[str]:
    return {n.split(".", 1)[0] for n in names}


def test_the_pure_modules_exist() -> None:
    assert sorted((PURE | PURE_MAY_ALSO_USE) - set(MODULES)) == []


@pytest.mark.parametrize("module", sorted(PURE))
def test_a_pure_module_imports_only_pure_modules_and_no_io(module: str) -> None:
    imported = _imports(module)
    assert _ours(imported) <= PURE | PURE_MAY_ALSO_USE, _ours(imported) - PURE - PURE_MAY_ALSO_USE
    assert _top(imported) & IO_LIBRARIES == set()


@pytest.mark.parametrize("module", sorted(PURE_MAY_ALSO_USE))
def test_what_every_layer_uses_is_pure_too(module: str) -> None:
    imported = _imports(module)
    assert _ours(imported) <= PURE | PURE_MAY_ALSO_USE
    assert _top(imported) & IO_LIBRARIES == set()


def test_sdks_are_imported_only_by_providers_and_integrations() -> None:
    offenders = sorted(
        module
        for module in MODULES
        if _top(_imports(module)) & SDKS
        and not module.startswith(("mimo_ctx.providers", "mimo_ctx.integrations"))
    )
    assert offenders == []


def test_asyncpg_is_imported_only_by_the_postgresql_store() -> None:
    offenders = sorted(
        module
        for module in MODULES
        if "asyncpg" in _top(_imports(module))
        and module not in {"mimo_ctx.store.postgres", "mimo_ctx.store._pg_driver"}
    )
    assert offenders == []


def test_the_storage_package_knows_nothing_above_it() -> None:
    """Stores persist values; they never reach up to the middleware, its steps,
    the adapters or the command line."""
    above = (
        "mimo_ctx.middleware",
        "mimo_ctx.rebuild",
        "mimo_ctx._window",
        "mimo_ctx._sessions",
        "mimo_ctx.render",
        "mimo_ctx.providers",
        "mimo_ctx.integrations",
        "mimo_ctx.importers",
        "mimo_ctx.tools",
        "mimo_ctx.cli",
        "mimo_ctx.replay",
        "mimo_ctx.checkpoint._coordinator",
    )
    offenders = {
        module: sorted(n for n in _ours(_imports(module)) if n.startswith(above))
        for module in MODULES
        if module.startswith("mimo_ctx.store")
    }
    assert {m: found for m, found in offenders.items() if found} == {}


def test_only_the_command_line_imports_the_command_line() -> None:
    offenders = sorted(
        module
        for module in MODULES
        if not module.startswith("mimo_ctx.cli")
        and module != "mimo_ctx.__main__"
        and any(n.startswith("mimo_ctx.cli") for n in _ours(_imports(module)))
    )
    assert offenders == []
