"""Run every benchmark and print its tables.

Usage, from the repository root (``python -m benchmarks.run_all`` works the same)::

    python benchmarks/run_all.py                    # all benchmarks (under 10 min on 2 cores)
    python benchmarks/run_all.py hot_path rebuild   # some of them
    python benchmarks/run_all.py --quick            # smoke run: tiny inputs, meaningless figures
    python benchmarks/run_all.py --write-results    # also update benchmarks/RESULTS.md
    python benchmarks/run_all.py --json out.json    # also write the raw figures

The benchmarks belong to the source checkout, not to the installed package:
they generate large data sets and one of them needs LangChain as a baseline,
which the library itself never imports. So there is no ``mimo-ctx bench``.

Each benchmark returns a *result* mapping: ``name``, ``title``, ``tables``
(``title``, ``headers``, ``rows``), ``targets`` (``name``, ``goal``,
``measured``, ``met``, ``ratio``, ``note``), ``notes`` and raw ``data``.
Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final, TextIO

if __package__ in (None, ""):
    # Run as a script (python benchmarks/run_all.py): the repository root holds
    # both the mimo_ctx package and this benchmarks package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine_info
from mimo_ctx.errors import ConfigError, MimoCtxError

__all__ = [
    "BENCHMARKS",
    "RESULTS",
    "load_benchmark",
    "main",
    "markdown_section",
    "render_markdown",
    "render_text",
    "run_benchmarks",
    "run_command",
    "summary_section",
    "write_results",
]

BENCHMARKS: Final[tuple[str, ...]] = (
    "hot_path",
    "turns",
    "writer",
    "rebuild",
    "tokens",
    "replay",
    "quality",
    "soak",
    "wrappers",
)
"""The benchmarks, in the order a full run takes them."""

RESULTS: Final = Path(__file__).resolve().parent / "RESULTS.md"
"""Where ``--write-results`` puts the figures by default."""


def load_benchmark(name: str) -> ModuleType:
    """Import one benchmark module by name (one of :data:`BENCHMARKS`).

    Raises:
        ConfigError: ``name`` is not a known benchmark.
    """
    if name not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {name!r}; expected one of: {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"benchmarks.{name}")


def run_benchmarks(
    names: Sequence[str] | None = None,
    *,
    quick: bool,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run benchmarks and collect their results.

    Each benchmark runs its own event loop, so call this from synchronous code
    (not from inside a running event loop).

    Args:
        names: Which benchmarks to run (default: all of :data:`BENCHMARKS`, in
            that order).
        quick: Tiny inputs and few samples: a smoke run that finishes in seconds;
            its figures mean nothing.
        progress: Called with a line of text as each benchmark starts and ends.

    Returns:
        ``{"quick", "machine", "command", "seconds", "results": {name: result}}``.

    Raises:
        ConfigError: An unknown benchmark name.
    """
    chosen = list(BENCHMARKS if not names else dict.fromkeys(names))
    modules = [(name, load_benchmark(name)) for name in chosen]
    # Taken before running: the load average then says how busy the machine was.
    machine = machine_info()
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for name, module in modules:
        if progress is not None:
            progress(f"running {name}{' (quick)' if quick else ''}…")
        begin = time.perf_counter()
        run: Callable[..., dict[str, Any]] = module.run
        outcome = run(quick=quick)
        outcome["seconds"] = time.perf_counter() - begin
        results[name] = outcome
        if progress is not None:
            progress(f"{name} done in {outcome['seconds']:.1f} s")
    return {
        "quick": quick,
        "machine": machine,
        "command": _command(chosen, quick),
        "seconds": time.perf_counter() - started,
        "results": results,
    }


def _command(names: Sequence[str], quick: bool) -> str:
    parts = ["python benchmarks/run_all.py"]
    if list(names) != list(BENCHMARKS):
        parts.extend(names)
    if quick:
        parts.append("--quick")
    return " ".join(parts)


# --------------------------------------------------------------------------- rendering


def _cells(table: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    headers = [str(h) for h in table["headers"]]
    rows = [[str(c) for c in row] for row in table["rows"]]
    return headers, rows


def _text_table(table: Mapping[str, Any]) -> str:
    headers, rows = _cells(table)
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    line = "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)) for row in rows]
    return "\n".join([str(table["title"]), line, rule, *body])


def _md_table(table: Mapping[str, Any]) -> str:
    headers, rows = _cells(table)

    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join(
        [f"**{table['title']}**", "", row(headers), row(["---"] * len(headers)), *map(row, rows)]
    )


def _met(target: Mapping[str, Any]) -> str:
    status = target.get("status")
    if status:
        return str(status)
    value = target["met"]
    if value is None:
        return "n/a"
    return "met" if value else "MISSED"


def _target_table(targets: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rows = [[t["name"], t["goal"], t["measured"], _met(t), t.get("note") or ""] for t in targets]
    return {
        "title": "Targets",
        "headers": ["target", "goal", "measured", "status", "note"],
        "rows": rows,
    }


def render_text(run: Mapping[str, Any]) -> str:
    """The tables of a :func:`run_benchmarks` run, as plain text for a terminal."""
    out = [
        f"mimo-ctx benchmarks{' (quick: figures mean nothing)' if run['quick'] else ''}",
        _machine_line(run),
        "",
    ]
    for result in run["results"].values():
        out.append(f"== {result['title']} ({result.get('seconds', 0):.1f} s)")
        for table in result["tables"]:
            out.extend([_text_table(table), ""])
        if result["targets"]:
            out.extend([_text_table(_target_table(result["targets"])), ""])
        out.extend(f"note: {note}" for note in result["notes"])
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _machine_line(run: Mapping[str, Any]) -> str:
    machine = run["machine"]
    load = machine.get("load_average")
    busy = f", load average {load[0]:.1f} at the start" if load else ""
    return (
        f"Measured {machine['date']} on {machine['processor']} ({machine['usable_cores']} "
        f"usable cores of {machine['cores']}{busy}), {machine['implementation']} "
        f"{machine['python']}, {machine['platform']}."
    )


def markdown_section(run: Mapping[str, Any], name: str) -> str:
    """One benchmark's figures as Markdown: machine line, command, tables, targets, notes."""
    result = run["results"][name]
    command = f"python benchmarks/run_all.py {name}" + (" --quick" if run["quick"] else "")
    out = [
        f"{_machine_line(run)} This part took {result.get('seconds', 0):.0f} s; "
        f"regenerate it with `{command} --write-results`.",
        "",
    ]
    for table in result["tables"]:
        out.extend([_md_table(table), ""])
    if result["targets"]:
        out.extend([_md_table(_target_table(result["targets"])), ""])
    out.extend(f"- {note}" for note in result["notes"])
    return "\n".join(out).rstrip() + "\n"


_SUMMARY_HEADERS: Final = ("benchmark", "target", "goal", "measured", "ratio", "status")


def _summary_rows(run: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for result in run["results"].values():
        for target in result["targets"]:
            ratio = target.get("ratio")
            rows.append(
                [
                    str(result["name"]),
                    str(target["name"]),
                    str(target["goal"]),
                    str(target["measured"]),
                    "" if ratio is None else f"{ratio:.2f}",
                    _met(target),
                ]
            )
    return rows


def summary_section(run: Mapping[str, Any]) -> str:
    """Every target of every benchmark of ``run`` in one Markdown table."""
    table = {"title": "Every target", "headers": list(_SUMMARY_HEADERS), "rows": _summary_rows(run)}
    return (
        f"{_machine_line(run)} Whole run: {run['seconds']:.0f} s "
        f"(`{run['command']}`).\n\n{_md_table(table)}\n"
    )


_REMEASURED = "Re-measured since the whole run: "


def _updated_summary(block: str, run: Mapping[str, Any]) -> str:
    """The summary ``block`` with the rows of ``run``'s benchmarks replaced by its figures.

    A run of some benchmarks only: their rows take the place of their old ones (the
    others stay as the whole run measured them), and a line under the table says
    when and how each re-measured benchmark was run.
    """
    names = list(run["results"])
    table = {"title": "", "headers": list(_SUMMARY_HEADERS), "rows": _summary_rows(run)}
    new_rows = _md_table(table).split("\n")[4:]
    by_name: dict[str, list[str]] = {}
    for line in new_rows:
        by_name.setdefault(_first_cell(line), []).append(line)
    out: list[str] = []
    placed: set[str] = set()
    notes: list[str] = []
    for line in block.split("\n"):
        if line.startswith(_REMEASURED):
            notes.append(line)
            continue
        name = _first_cell(line) if line.startswith("| ") else ""
        if name in names:
            if name not in placed:
                out.extend(by_name.get(name, []))
                placed.add(name)
            continue
        out.append(line)
    missing = [line for name in names if name not in placed for line in by_name.get(name, [])]
    if missing:
        last = max((i for i, line in enumerate(out) if line.startswith("| ")), default=len(out) - 1)
        out[last + 1 : last + 1] = missing
    prefixes = tuple(f"{_REMEASURED}`{name}`:" for name in names)
    kept = [note for note in notes if not note.startswith(prefixes)]
    when = _machine_line(run)[len("Measured ") :].rstrip(".")
    for prefix, name in zip(prefixes, names, strict=True):
        kept.append(f"{prefix} {when} (`python benchmarks/run_all.py {name} --write-results`).")
    while out and not out[-1].strip():
        out.pop()
    return "\n".join([*out, "", *kept]) + "\n"


def _first_cell(line: str) -> str:
    return line[2:].split(" | ", 1)[0] if line.startswith("| ") else ""


def render_markdown(run: Mapping[str, Any]) -> str:
    """The tables of a :func:`run_benchmarks` run, as one Markdown document."""
    out = [summary_section(run)]
    for name, result in run["results"].items():
        out.extend([f"## {result['title']}", "", markdown_section(run, name)])
    return "\n".join(out)


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- generated:{key}:start -->", f"<!-- generated:{key}:end -->"


def _replace_block(document: str, key: str, title: str, body: str) -> str:
    start, end = _markers(key)
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in document and end in document:
        head, rest = document.split(start, 1)
        _, tail = rest.split(end, 1)
        return f"{head}{block}{tail}"
    return f"{document.rstrip()}\n\n## {title}\n\n{block}\n"


def write_results(run: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Put a run's figures into ``RESULTS.md``, keeping the hand-written text around them.

    Each benchmark's figures sit between ``<!-- generated:<name>:start -->`` and
    ``<!-- generated:<name>:end -->`` markers; only the benchmarks of ``run`` are
    replaced (a missing block is appended). The ``summary`` block is rewritten
    whole by a run of every benchmark; a run of some of them replaces their rows
    only and says under the table when they were measured again.

    Raises:
        MimoCtxError: ``run`` is a quick run (its figures mean nothing).
    """
    if run["quick"]:
        raise MimoCtxError("a --quick run's figures mean nothing; not writing them")
    target = Path(path)
    document = target.read_text(encoding="utf-8") if target.exists() else "# Benchmark results\n"
    if set(run["results"]) == set(BENCHMARKS):
        document = _replace_block(document, "summary", "Summary", summary_section(run))
    else:
        start, end = _markers("summary")
        if start in document and end in document:
            old = document.split(start, 1)[1].split(end, 1)[0].strip("\n")
            document = _replace_block(document, "summary", "Summary", _updated_summary(old, run))
    for name, result in run["results"].items():
        document = _replace_block(document, name, str(result["title"]), markdown_section(run, name))
    target.write_text(document, encoding="utf-8")
    return target


# --------------------------------------------------------------------------- command line


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny inputs, a few samples: a smoke run"
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the full results (raw data) as JSON; - for stdout",
    )
    parser.add_argument(
        "--write-results",
        nargs="?",
        const="",
        metavar="PATH",
        help="update the figures in RESULTS.md (default: benchmarks/RESULTS.md)",
    )


def run_command(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    """Run the benchmarks the command line asked for; returns the exit code.

    Synchronous: each benchmark runs its own event loop.
    """
    names = list(args.names or [])
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ConfigError(
            f"unknown benchmark {unknown[0]!r}; expected one of: {', '.join(BENCHMARKS)}"
        )
    if args.write_results is not None and args.quick:
        raise ConfigError("--write-results needs a full run: a --quick run's figures mean nothing")

    def progress(line: str) -> None:
        err.write(f"{line}\n")
        err.flush()

    run = run_benchmarks(names, quick=args.quick, progress=progress)
    if args.json == "-":
        json.dump(run, out, indent=2, default=str)
        out.write("\n")
    else:
        out.write(render_text(run))
        if args.json:
            Path(args.json).write_text(json.dumps(run, indent=2, default=str), encoding="utf-8")
    if args.write_results is not None:
        path = args.write_results or RESULTS
        written = write_results(run, path)
        err.write(f"figures written to {written}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/run_all.py``: parse ``argv``, run, print; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="run_all.py",
        description="Run the mimo_ctx benchmarks and print their tables.",
    )
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_command(args, out=sys.stdout, err=sys.stderr)
    except MimoCtxError as exc:
        sys.stderr.write(f"run_all.py: error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
