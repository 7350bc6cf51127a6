"""The shape of the package: where things live and who may import whom."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
    assert _class_lines(PACKAGE / "middleware.py", "ContextMiddleware") < 500


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
