"""The JSON examples of the docs are what the commands print (issue 17 item 20).

Every ``jsonc`` block of ``docs/cli.md`` and the README is preceded by a marker
naming the command that prints it::

    <!-- example: mimo-ctx inspect demo-session.json --json -->
    <!-- example (main keys): mimo-ctx replay demo-session.json --window 50K --json -->

The commands run in a folder where ``mimo-ctx demo --store demo.db --transcript
demo-session.json`` has run. The example must have the real document's shape:
every key, in order (only the keys it shows, in order, with ``(main keys)``);
lists show their first items and end with ``...`` when the real one has more,
an object ending with ``...`` shows some of its keys (``{...}``: any object);
strings equal the real ones, or match around a ``...``; numbers have the real
type; ``null`` and booleans are equal. ``//`` and ``/* */`` comments are notes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import pytest

from tests.cli.conftest import REPO_ROOT, run_cli

DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "cli.md"]
ELIDED = "\u2026elided\u2026"
_MARKER = re.compile(
    r"<!-- example( \(main keys\))?: mimo-ctx (.+?) -->\s*\n```jsonc\n(.*?)\n```", re.S
)


@dataclass(frozen=True)
class Example:
    doc: Path
    command: str
    text: str
    main_keys: bool

    @property
    def name(self) -> str:
        return f"{self.doc.name}: {self.command}"


def examples() -> list[Example]:
    found: list[Example] = []
    for doc in DOCS:
        for match in _MARKER.finditer(doc.read_text(encoding="utf-8")):
            found.append(Example(doc, match.group(2), match.group(3), bool(match.group(1))))
    return found


def _strip_jsonc(text: str) -> str:
    """Comments removed and bare ``...`` made a sentinel string, outside strings."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == '"':
            end = i + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i : end + 1])
            i = end + 1
        elif text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
        elif text.startswith("...", i):
            # In an object, "..." stands for more keys; in a list, for more items.
            before = "".join(out).rstrip()
            in_object = before.endswith("{") or (
                before.endswith(",") and _innermost_open(before) == "{"
            )
            out.append(f"{json.dumps(ELIDED)}: null" if in_object else json.dumps(ELIDED))
            i += 3
        else:
            out.append(char)
            i += 1
    return re.sub(r",(\s*[\]}])", r"\1", "".join(out))


def _innermost_open(text: str) -> str:
    """The innermost bracket still open at the end of ``text`` (strings skipped)."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped = not escaped and char == "\\"
            in_string = escaped or char != '"'
        elif char == '"':
            in_string = True
        elif char in "[{":
            stack.append(char)
        elif char in "]}":
            stack.pop()
    return stack[-1] if stack else ""


# A parsed JSON document (the docs' example or the command's output).
Json: TypeAlias = "bool | int | float | str | list[Json] | dict[str, Json] | None"


def _check(doc: Json, real: Json, path: str, main_keys: bool) -> Iterator[str]:
    if isinstance(doc, dict):
        if not isinstance(real, dict):
            yield f"{path}: an object in the docs, {type(real).__name__} in the output"
            return
        doc_keys, real_keys = [k for k in doc if k != ELIDED], list(real)
        if main_keys or ELIDED in doc:
            positions = [real_keys.index(k) if k in real_keys else -1 for k in doc_keys]
            if -1 in positions or positions != sorted(positions):
                yield f"{path}: keys {doc_keys} are not in the output in this order: {real_keys}"
        elif doc_keys != real_keys:
            yield f"{path}: keys {doc_keys} in the docs, {real_keys} in the output"
        for key in doc_keys:
            if key in real:
                yield from _check(doc[key], real[key], f"{path}.{key}", main_keys)
    elif isinstance(doc, list):
        if not isinstance(real, list):
            yield f"{path}: a list in the docs, {type(real).__name__} in the output"
            return
        items = list(doc)
        open_ended = bool(items) and items[-1] == ELIDED
        if open_ended:
            items.pop()
        if len(items) > len(real) or (not open_ended and len(items) != len(real)):
            more = " and ..." if open_ended else ""
            yield f"{path}: {len(items)} items{more} in the docs, {len(real)} in the output"
        for index, (item, value) in enumerate(zip(items, real, strict=False)):
            yield from _check(item, value, f"{path}[{index}]", main_keys)
    elif isinstance(doc, str):
        if not isinstance(real, str):
            yield f"{path}: a string in the docs, {real!r} in the output"
        elif ELIDED in doc or "..." in doc or "…" in doc:
            pieces = re.split(r"\.\.\.|…", doc.replace(ELIDED, "..."))
            head, tail = pieces[0], pieces[-1]
            if not (real.startswith(head) and real.endswith(tail)):
                yield f"{path}: {doc!r} in the docs, {real!r} in the output"
        elif doc != real:
            yield f"{path}: {doc!r} in the docs, {real!r} in the output"
    elif doc is None or isinstance(doc, bool):
        if doc is not real:
            yield f"{path}: {doc!r} in the docs, {real!r} in the output"
    elif type(doc) is not type(real):
        yield f"{path}: {doc!r} in the docs, {real!r} ({type(real).__name__}) in the output"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("examples")
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        demo = run_cli("demo", "--store", "demo.db", "--transcript", "demo-session.json", "--json")
    finally:
        os.chdir(cwd)
    assert demo.code == 0, demo.err
    return folder


def test_every_jsonc_block_names_its_command() -> None:
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert text.count("```jsonc") == len(list(_MARKER.finditer(text))), doc.name


@pytest.mark.parametrize("example", examples(), ids=lambda e: e.name)
def test_the_example_is_the_real_output(example: Example, workdir: Path) -> None:
    argv = shlex.split(example.command)
    if "{dsn}" in example.command:
        dsn = os.environ.get("MIMO_CTX_PG_DSN")
        if not dsn:
            pytest.skip("MIMO_CTX_PG_DSN is not set: no PostgreSQL server for `db upgrade`")
        argv = [dsn if a == "{dsn}" else a for a in argv]
    cwd = Path.cwd()
    os.chdir(workdir)
    try:
        run = run_cli(*argv)
    finally:
        os.chdir(cwd)
    assert run.code == 0, run.err
    documented = json.loads(_strip_jsonc(example.text))
    problems = list(_check(documented, run.json(), "$", example.main_keys))
    assert problems == []


# Words of how the project was made, not of what it is: no page says them.
_INTERNAL = re.compile(
    r"(?i:the lead merges|for the readme\b|merges this in|\bworktree\b|\bland\.sh\b"
    r"|internal note)|\bTODO\b|\bFIXME\b"
)


@pytest.mark.parametrize(
    "page",
    [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))],
    ids=lambda p: p.name,
)
def test_pages_hold_no_internal_notes(page: Path) -> None:
    hits = [
        f"{page.name}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if _INTERNAL.search(line)
    ]
    assert hits == []
