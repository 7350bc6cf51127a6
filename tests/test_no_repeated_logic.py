"""No run of six or more lines of logic stands twice in the package.

The checker (``tests/repeated_logic.py``) is tested here on small sources first, so
that the whole-package test is known to be able to fail.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from repeated_logic import WINDOW, Repeat, code_lines, find_repeats, find_repeats_in

import mimo_ctx

PACKAGE = Path(mimo_ctx.__file__).resolve().parent


def test_no_run_of_six_lines_of_logic_stands_twice_in_the_package() -> None:
    """Logic that stands twice gets one implementation used by both places (issue 15)."""
    repeats = find_repeats_in(PACKAGE)
    assert not repeats, "runs of logic that stand twice in mimo_ctx/:\n" + "\n".join(
        f"  {r}" for r in repeats
    )


_BODY = """
    total = 0
    for item in items:
        if item.size > limit:
            total += item.size
        else:
            total -= 1
    return total
"""


def _module(*functions: str) -> str:
    return "\n\n".join(textwrap.dedent(f) for f in functions)


def _function(name: str, body: str = _BODY) -> str:
    return f"def {name}(items, limit):\n{textwrap.indent(textwrap.dedent(body), '    ')}"


def test_two_copied_functions_in_two_modules_are_named_with_their_lines() -> None:
    one = _module("x = 1\n", _function("first"))
    two = _module(_function("second"))
    repeats = find_repeats([("one.py", one), ("two.py", two)])
    # The def lines differ; the seven body lines are the same.
    assert repeats == [Repeat(("one.py", 6, 12), ("two.py", 3, 9), 7)]
    assert str(repeats[0]) == "one.py:6-12 ~ two.py:3-9 (7 lines)"


def test_a_copy_in_the_same_module_is_found() -> None:
    source = _module(_function("first"), _function("second"))
    (repeat,) = find_repeats([("m.py", source)])
    assert repeat.first[0] == repeat.second[0] == "m.py"
    assert repeat.lines == 7


def test_comments_blank_lines_and_closing_brackets_do_not_hide_a_copy() -> None:
    noisy = """
    total = 0  # start

    for item in items:
        # only the big ones
        if item.size > limit:
            total += item.size
        else:
            total -= 1
    return total
    """
    repeats = find_repeats([("a.py", _function("a")), ("b.py", _function("b", noisy))])
    assert [r.lines for r in repeats] == [7]


def test_fewer_than_six_shared_lines_are_no_repeat() -> None:
    short = """
    total = 0
    for item in items:
        if item.size > limit:
            total += item.size
    return -1
    """
    assert find_repeats([("a.py", _function("a", short)), ("b.py", _function("b", short))]) == []
    assert WINDOW == 6


def test_docstrings_imports_tables_fields_and_overloads_are_not_logic() -> None:
    source = '''
        """A module docstring
        over several lines
        that says the same
        in both files
        word for word
        and then some."""

        from typing import (
            Any,
            Final,
            Literal,
            TypedDict,
            overload,
        )
        import os
        import re
        import sys

        TABLE = {
            "a": 1,
            "b": 2,
            "c": 3,
            "d": 4,
            "e": 5,
            "f": 6,
        }
        NAMES = frozenset(
            [
                "one",
                "two",
                "three",
                "four",
                "five",
                "six",
            ]
        )


        class Row(TypedDict):
            """A row."""

            one: int
            two: str
            three: float
            four: bytes
            five: bool
            six: Any


        @overload
        def pick(a: int) -> int: ...
        @overload
        def pick(a: str) -> str: ...
        @overload
        def pick(a: bytes) -> bytes: ...
        @overload
        def pick(a: float) -> float: ...
        def pick(a: Any) -> Any:
            return a
        '''
    source = textwrap.dedent(source)
    assert find_repeats([("a.py", source), ("b.py", source)]) == []
    # What is left of it is the class line and the body of ``pick``.
    assert [line.text for line in code_lines(source)] == ["class Row ( TypedDict ) :", "return a"]


def test_a_signature_is_a_declaration_and_a_shared_one_is_no_repeat() -> None:
    signature = """
    def {name}(
        path: str,
        data: bytes,
        *,
        strict: bool,
        session_id: str | None,
        base_time: int,
    ) -> int:
        return {value}
    """
    one = textwrap.dedent(signature.format(name="load", value="len(data)"))
    two = textwrap.dedent(signature.format(name="aload", value="base_time"))
    assert find_repeats([("a.py", one), ("b.py", two)]) == []
    assert [line.text for line in code_lines(one)] == ["return len ( data )"]


def test_module_constants_are_declarations_and_computed_ones_are_logic() -> None:
    constants = """
        _T = TypeVar("_T")
        _M = TypeVar("_M", bound=BaseModel)
        _FENCE = re.compile(r"^```", re.MULTILINE)
        LIMIT: Final = 1 << 20
        NAME: Final[str] = "x" + "y"
        SHIFT = -LIMIT
        """
    source = textwrap.dedent(constants)
    assert code_lines(source) == []
    assert find_repeats([("a.py", source), ("b.py", source)]) == []
    computed = textwrap.dedent(
        """
        A = [n * 2 for n in range(10)]
        B = {k: v for k, v in pairs if v}
        C = lambda x: x + 1
        D = x if flag else y
        E = first or second
        F = len(A) > 3
        """
    )
    (repeat,) = find_repeats([("a.py", computed), ("b.py", computed)])
    assert repeat.lines == 6


def test_a_table_built_inside_a_function_is_logic() -> None:
    body = """
    table = {
        "a": items,
        "b": limit,
        "c": items + limit,
        "d": items * limit,
        "e": items - limit,
        "f": -items,
    }
    return table
    """
    repeats = find_repeats([("a.py", _function("a", body)), ("b.py", _function("b", body))])
    assert [r.lines for r in repeats] == [8]
