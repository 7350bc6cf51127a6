"""Human output of the ``mimo-ctx`` command: rich when installed, plain text otherwise.

``rich`` is an optional dependency (the ``cli`` extra): the core install must
still run ``mimo-ctx demo``, so it is imported lazily and everything has a
plain-text rendering. Text from transcripts is never read as rich markup.
"""

from __future__ import annotations

import errno
import importlib
import json
import shutil
import sys
from collections.abc import Sequence
from typing import Any, Literal, TextIO

__all__ = ["Align", "Output", "dump_json", "fmt_tokens", "load_rich"]

Align = Literal["left", "right"]


def load_rich() -> Any | None:
    """The ``rich`` package, or ``None`` when it is not installed."""
    try:
        for name in ("rich.console", "rich.table", "rich.text"):
            importlib.import_module(name)
    except ImportError:
        return None
    return sys.modules["rich"]


def fmt_tokens(value: int | None) -> str:
    """``12,345`` (``-`` for ``None``)."""
    return "-" if value is None else f"{value:,}"


def dump_json(document: object, stream: TextIO) -> None:
    """Write one JSON document (ASCII-escaped, so any terminal encoding takes it)."""
    stream.write(json.dumps(document, indent=2, ensure_ascii=True))
    stream.write("\n")


def _broken_pipe() -> None:
    raise BrokenPipeError(errno.EPIPE, "Broken pipe")


class Output:
    """Writes headings, key/value lines and tables to a stream.

    Args:
        stream: Where to write (the command's stdout).
        plain: Force plain text even when rich is installed.
    """

    def __init__(self, stream: TextIO, *, plain: bool = False) -> None:
        self.stream = stream
        rich = None if plain else load_rich()
        self._console: Any | None = None
        if rich is not None:
            is_tty = bool(getattr(stream, "isatty", lambda: False)())
            width = shutil.get_terminal_size((120, 24)).columns if is_tty else 120
            console = rich.console.Console(
                file=stream, width=max(width, 80), highlight=False, emoji=False
            )
            # rich answers a closed pipe with SystemExit(1); the command's own
            # handling (exit 141, as for SIGPIPE) needs the error itself.
            console.on_broken_pipe = _broken_pipe
            self._console = console

    @property
    def rich(self) -> bool:
        """True when output goes through rich."""
        return self._console is not None

    def heading(self, text: str) -> None:
        """A section heading."""
        if self._console is not None:
            self._console.print()
            self._console.rule(_text(text, "bold"), align="left")
        else:
            self.stream.write(f"\n== {text}\n")

    def line(self, text: str = "", *, style: str | None = None) -> None:
        """One line of text (never interpreted as markup)."""
        if self._console is not None:
            self._console.print(_text(text, style), soft_wrap=True)
        else:
            self.stream.write(f"{text}\n")

    def fields(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Aligned ``name: value`` lines."""
        width = max((len(name) for name, _ in pairs), default=0)
        for name, value in pairs:
            if self._console is not None:
                line = _text(f"{name + ':':<{width + 1}} ", "bold")
                line.append(value)
                self._console.print(line, soft_wrap=True)
            else:
                self.stream.write(f"{name + ':':<{width + 1}} {value}\n")

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        align: Sequence[Align] | None = None,
        title: str | None = None,
    ) -> None:
        """A table; ``align`` gives each column's alignment (left by default)."""
        aligns: list[Align] = list(align) if align is not None else ["left"] * len(columns)
        if self._console is not None:
            rich = load_rich()
            assert rich is not None
            table = rich.table.Table(title=title, title_justify="left", show_lines=False)
            for name, how in zip(columns, aligns, strict=True):
                table.add_column(name, justify=how, overflow="fold")
            for row in rows:
                table.add_row(*(_text(cell) for cell in row))
            self._console.print(table)
            return
        if title:
            self.stream.write(f"{title}\n")
        widths = [len(c) for c in columns]
        for row in rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))

        def render(cells: Sequence[str]) -> str:
            out = [
                cell.rjust(widths[i]) if aligns[i] == "right" else cell.ljust(widths[i])
                for i, cell in enumerate(cells)
            ]
            return "  ".join(out).rstrip()

        self.stream.write(render(columns) + "\n")
        self.stream.write("  ".join("-" * w for w in widths) + "\n")
        for row in rows:
            self.stream.write(render(row) + "\n")


def _text(text: str, style: str | None = None) -> Any:
    rich = load_rich()
    assert rich is not None
    return rich.text.Text(text, style=style or "")
