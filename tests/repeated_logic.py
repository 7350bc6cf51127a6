"""Find runs of logic that stand twice in a tree of Python modules.

Import from a test module as ``from repeated_logic import find_repeats`` (pytest's
rootdir-relative import puts ``tests/`` on the path, as for ``strategies``).

A module is cut into lines of code with :mod:`tokenize`: the tokens of each line,
joined by one space (comments, blank lines, indentation and lines of lone
punctuation such as a closing ``)`` are dropped, so formatting does not count).
Statements that are not logic are left out by their AST kind, never by a list of
file names:

- docstrings (a string literal standing alone as a statement), and the ``...``
  or ``pass`` of an empty body (protocol methods, stubs);
- import statements;
- declarative tables and constants: a module- or class-level assignment whose value
  is a literal container (dict, list, tuple, set, or one call wrapping one, like
  ``frozenset({...})``) or an expression of literals, names and calls of them only
  (``_T = TypeVar("_T")``, ``_FENCE = re.compile(r"...")``);
- field blocks: annotated names in a class body (dataclass, TypedDict, NamedTuple,
  protocol attributes);
- overload stubs (functions decorated with ``typing.overload``);
- signatures: a function's ``def`` line and parameter list up to its body (a
  parameter list declares; sync/async twins and protocol implementations repeat
  theirs by design). The body is logic like any other.

Every window of :data:`WINDOW` consecutive remaining lines of a module is
hashed; a window whose text stands at two places (in one module or in two) is a
repeat. Overlapping windows of the same two places are merged into one run, reported
with the first and last physical line of both sides.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WINDOW", "CodeLine", "Repeat", "code_lines", "find_repeats", "find_repeats_in"]

WINDOW = 6
"""How many consecutive lines of logic make a repeat."""

_SKIPPED_TOKENS = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
)
_PUNCTUATION = frozenset("()[]{},:;")


@dataclass(frozen=True, slots=True)
class CodeLine:
    """One line of logic: its tokens joined by one space, and its line number."""

    text: str
    row: int


@dataclass(frozen=True, slots=True)
class Repeat:
    """A run of lines of logic that stands at two places.

    ``first`` and ``second`` are ``(name, first line, last line)``; ``lines`` counts
    the lines of logic of the run (at least :data:`WINDOW`).
    """

    first: tuple[str, int, int]
    second: tuple[str, int, int]
    lines: int

    def __str__(self) -> str:
        (a, a1, a2), (b, b1, b2) = self.first, self.second
        return f"{a}:{a1}-{a2} ~ {b}:{b1}-{b2} ({self.lines} lines)"


def _is_table(value: ast.expr | None) -> bool:
    """A literal container (of anything), one call wrapping one, or a constant expression."""
    containers = (ast.Dict, ast.List, ast.Tuple, ast.Set)
    if isinstance(value, containers):
        return True
    if (
        isinstance(value, ast.Call)
        and len(value.args) == 1
        and not value.keywords
        and isinstance(value.args[0], containers)
    ):
        return True
    return value is not None and _is_constant(value)


def _is_constant(value: ast.expr) -> bool:
    """Literals, names, attributes and calls, subscripts and operators of them only.

    ``TypeVar("_T")``, ``re.compile(r"…", re.M)``, ``1 << 20``, ``Final[int]``: what
    a module-level name is declared as. A lambda, a comprehension, a condition or a
    comparison is logic.
    """
    if isinstance(value, ast.Constant | ast.Name):
        return True
    if isinstance(value, ast.Attribute | ast.Starred):
        return _is_constant(value.value)
    if isinstance(value, ast.Call):
        parts = [value.func, *value.args, *(k.value for k in value.keywords)]
        return all(_is_constant(p) for p in parts)
    if isinstance(value, ast.Subscript):
        return _is_constant(value.value) and _is_constant(value.slice)
    if isinstance(value, ast.BinOp):
        return _is_constant(value.left) and _is_constant(value.right)
    if isinstance(value, ast.UnaryOp):
        return _is_constant(value.operand)
    if isinstance(value, ast.Dict):
        return all(_is_constant(v) for v in [*value.values, *(k for k in value.keys if k)])
    if isinstance(value, ast.List | ast.Tuple | ast.Set):
        return all(_is_constant(e) for e in value.elts)
    return False


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        name = decorator.attr if isinstance(decorator, ast.Attribute) else None
        if isinstance(decorator, ast.Name):
            name = decorator.id
        if name == "overload":
            return True
    return False


def _left_out(body: Sequence[ast.stmt], *, declarative: bool) -> Iterator[tuple[int, int]]:
    """The line ranges of ``body`` (and below) that are not logic, first and last line."""
    for node in body:
        if _is_not_logic(node, declarative=declarative):
            yield _span(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = _span(node)[0]
            if node.body[0].lineno > start:
                yield start, node.body[0].lineno - 1
            yield from _left_out(node.body, declarative=False)
        elif isinstance(node, ast.ClassDef):
            yield from (_span(n) for n in node.body if isinstance(n, ast.AnnAssign))
            yield from _left_out(node.body, declarative=True)
        else:
            for block in _blocks(node):
                yield from _left_out(block, declarative=False)


def _span(node: ast.stmt) -> tuple[int, int]:
    """First and last line of a statement, its decorators included."""
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    start = min([node.lineno, *(d.lineno for d in decorators)])
    return start, node.end_lineno or node.lineno


def _is_not_logic(node: ast.stmt, *, declarative: bool) -> bool:
    if isinstance(node, ast.Pass):
        return True
    if isinstance(node, ast.Expr):
        # A docstring, or the ``...`` body of a protocol method or stub.
        return isinstance(node.value, ast.Constant) and (
            isinstance(node.value.value, str) or node.value.value is Ellipsis
        )
    if isinstance(node, ast.Import | ast.ImportFrom):
        return True
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return _is_overload(node)
    if declarative and isinstance(node, ast.AnnAssign):
        return node.value is None or _is_table(node.value)
    return declarative and isinstance(node, ast.Assign) and _is_table(node.value)


def _blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement blocks nested in a compound statement (if, for, try, with, match)."""
    for name in ("body", "orelse", "finalbody"):
        block: object = getattr(node, name, None)
        if isinstance(block, list):
            yield [s for s in block if isinstance(s, ast.stmt)]  # pyright: ignore[reportUnknownVariableType]
    if isinstance(node, ast.Try | ast.TryStar):
        yield from (handler.body for handler in node.handlers)
    if isinstance(node, ast.Match):
        yield from (case.body for case in node.cases)


def code_lines(source: str) -> list[CodeLine]:
    """The lines of logic in ``source``, in order (see the module docstring)."""
    tree = ast.parse(source)
    dropped: set[int] = set()
    for first, last in _left_out(tree.body, declarative=True):
        dropped.update(range(first, last + 1))
    rows: dict[int, list[str]] = defaultdict(list)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _SKIPPED_TOKENS and token.start[0] not in dropped:
            rows[token.start[0]].append(token.string)
    return [
        CodeLine(" ".join(pieces), row)
        for row, pieces in sorted(rows.items())
        if not all(piece in _PUNCTUATION for piece in pieces)
    ]


def _windows(lines: Sequence[CodeLine]) -> Iterator[tuple[int, str]]:
    for start in range(len(lines) - WINDOW + 1):
        yield start, "\n".join(line.text for line in lines[start : start + WINDOW])


def find_repeats(files: Iterable[tuple[str, str]]) -> list[Repeat]:
    """Every run of :data:`WINDOW` or more lines of logic that stands twice.

    Args:
        files: ``(name, source)`` pairs; the name is what a repeat reports.

    Returns:
        The repeats, one per pair of places, longest run first.
    """
    modules: dict[str, list[CodeLine]] = {}
    places: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, source in files:
        modules[name] = lines = code_lines(source)
        for start, text in _windows(lines):
            places[text].append((name, start))
    # Each pair of places of one window, keyed so that runs can be merged: two
    # windows continue one run when both sides move on by one line.
    pairs: set[tuple[str, int, str, int]] = set()
    for spots in places.values():
        for i, (a, a_at) in enumerate(spots):
            for b, b_at in spots[i + 1 :]:
                pairs.add((a, a_at, b, b_at))
    repeats: list[Repeat] = []
    for a, a_at, b, b_at in sorted(pairs):
        if (a, a_at - 1, b, b_at - 1) in pairs:
            continue  # inside a run that started earlier
        length = 1
        while (a, a_at + length, b, b_at + length) in pairs:
            length += 1
        end = length - 1 + WINDOW - 1
        a_lines, b_lines = modules[a], modules[b]
        repeats.append(
            Repeat(
                (a, a_lines[a_at].row, a_lines[a_at + end].row),
                (b, b_lines[b_at].row, b_lines[b_at + end].row),
                end + 1,
            )
        )
    repeats.sort(key=lambda r: (-r.lines, r.first, r.second))
    return repeats


def find_repeats_in(root: Path) -> list[Repeat]:
    """:func:`find_repeats` over every ``*.py`` below ``root``, named relative to it."""
    paths = sorted(root.rglob("*.py"))
    return find_repeats(
        (p.relative_to(root).as_posix(), p.read_text(encoding="utf-8")) for p in paths
    )
