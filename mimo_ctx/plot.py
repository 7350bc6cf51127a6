"""Pictures of a replay: a chart (``mimo-ctx replay --plot``) and a terminal sparkline.

:func:`replay_figure` draws a :class:`~mimo_ctx.replay.ReplayReport` with
matplotlib: the tokens of every request sent, the model window, the trigger line
and the writer thresholds as horizontal lines, and markers where the checkpoint
writer ran, where mimo_ctx rebuilt (an arrow from the request size before to the
size after), where the provider would have overflowed, and where the
transcript's own agent compacted its context. :func:`save_replay_plot` writes it
as PNG or SVG. matplotlib is optional (the ``plot`` extra,
``pip install "mimo-ctx[plot]"``); without it these two raise an ``ImportError``
that says so.

:func:`sparkline` is pure and needs nothing: the same series as one line of
block characters, for the human output of ``mimo-ctx replay``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from mimo_ctx.replay import ReplayReport

__all__ = [
    "PLOT_FORMATS",
    "SPARK_CHARS",
    "marker_line",
    "replay_figure",
    "save_replay_plot",
    "sparkline",
]

SPARK_CHARS: Final = "▁▂▃▄▅▆▇█"
"""The eight levels of a sparkline, lowest first."""

PLOT_FORMATS: Final = (".png", ".svg")
"""The file types ``--plot`` writes."""

# Labels of the legend entries; tests find the artists by them.
LABEL_SENT: Final = "tokens sent per request (mimo_ctx, estimated)"
LABEL_TRANSCRIPT: Final = "the transcript's own context (its provider's usage)"
LABEL_WINDOW: Final = "model window"
LABEL_TRIGGER: Final = "trigger line (rebuild)"
LABEL_THRESHOLDS: Final = "writer thresholds"
LABEL_WRITER: Final = "checkpoint writer run"
LABEL_REBUILD: Final = "rebuild (before → after)"
LABEL_OVERFLOW: Final = "provider overflow (request refused)"
LABEL_COMPACTION: Final = "the transcript's own compaction"


def _buckets(values: Sequence[int], width: int) -> list[int]:
    """``values`` in at most ``width`` buckets, each the largest value in it (peaks matter)."""
    if len(values) <= width:
        return list(values)
    out: list[int] = []
    for bucket in range(width):
        start = bucket * len(values) // width
        end = (bucket + 1) * len(values) // width
        out.append(max(values[start:end]))
    return out


def sparkline(values: Sequence[int], *, top: int | None = None, width: int = 72) -> str:
    """One line of block characters for ``values``, scaled to ``top``.

    Args:
        values: The series (e.g. the tokens of each request).
        top: The value drawn as a full block (e.g. the model window); values above
            it are drawn full too. Default: the largest value.
        width: At most this many characters; a longer series is cut into buckets
            and each bucket drawn as its largest value.

    Returns:
        ``""`` for an empty series, else one character per value or bucket.
    """
    if not values or width <= 0:
        return ""
    scale = top if top is not None and top > 0 else max(*values, 1)
    levels = len(SPARK_CHARS) - 1
    chars: list[str] = []
    for value in _buckets(values, width):
        share = min(max(value, 0), scale) / scale
        chars.append(SPARK_CHARS[round(share * levels)])
    return "".join(chars)


def marker_line(count: int, marks: Sequence[tuple[int, str]], *, width: int = 72) -> str:
    """A line under a :func:`sparkline` of ``count`` values: a letter where something happened.

    Args:
        count: Length of the series the sparkline drew.
        marks: ``(position in the series, letter)``; a later mark of the same
            character cell wins over an earlier one.
        width: The sparkline's width.
    """
    cells = min(count, width)
    if cells <= 0:
        return ""
    line = [" "] * cells
    for position, letter in marks:
        if 0 <= position < count:
            line[position * cells // count] = letter
    return "".join(line).rstrip()


def _pyplot_free_figure() -> Any:
    """matplotlib's ``Figure`` class, or an ``ImportError`` naming the extra."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            'mimo-ctx replay --plot needs matplotlib: pip install "mimo-ctx[plot]"'
        ) from exc
    return Figure


def _short(value: float) -> str:
    """``79396`` -> ``79.4K``: three significant digits, for titles."""
    for scale, suffix in ((1_000_000, "M"), (1_000, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:g}"


def _thousands(value: float, _position: object = None) -> str:
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if abs(value) >= 1_000:
        return f"{value / 1_000:g}K"
    return f"{value:g}"


def replay_figure(report: ReplayReport, *, title: str | None = None) -> Figure:
    """The chart of a replay (see the module docs).

    The x axis is the position in the transcript (the ``at`` figures of the
    report), so requests, writer runs, rebuilds and the transcript's compactions
    line up. No global matplotlib state is touched (no pyplot).

    Args:
        report: What :func:`~mimo_ctx.replay.replay_transcript` returned.
        title: The first title line; default: the session id.

    Raises:
        ImportError: matplotlib is not installed (``pip install "mimo-ctx[plot]"``).
    """
    figure_class = _pyplot_free_figure()
    from matplotlib.ticker import FuncFormatter

    figure = figure_class(figsize=(11, 6.2), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    xs = [r.at for r in report.requests]
    sent = [r.tokens for r in report.requests]
    by_at = dict(zip(xs, sent, strict=True))
    axes.step(xs, sent, where="post", color="#1f77b4", linewidth=1.6, label=LABEL_SENT)
    rebuilds = [r for r in report.rebuilds if r.tokens_before is not None]
    # Scaled to what mimo_ctx sends and the window: a transcript recorded on a larger
    # window would otherwise squash the series this chart is about (its line is cut).
    top = max(
        [
            report.window,
            *sent,
            *(o.tokens for o in report.overflows),
            *(r.tokens_before or 0 for r in rebuilds),
        ]
    )
    own = [(r.at, r.transcript_tokens) for r in report.requests if r.transcript_tokens is not None]
    if own:
        axes.plot(
            [a for a, _ in own],
            [t for _, t in own],
            color="#7f7f7f",
            linewidth=1.0,
            alpha=0.45,
            label=LABEL_TRANSCRIPT + (" — cut at the top" if max(t for _, t in own) > top else ""),
        )
    axes.axhline(report.window, color="#222222", linewidth=1.4, label=LABEL_WINDOW)
    axes.axhline(
        report.trigger_tokens, color="#d62728", linewidth=1.4, linestyle="--", label=LABEL_TRIGGER
    )
    for number, threshold in enumerate(report.writer_thresholds):
        axes.axhline(
            threshold,
            color="#2ca02c",
            linewidth=0.8,
            linestyle=":",
            alpha=0.8,
            label=LABEL_THRESHOLDS if number == 0 else None,
        )
    if report.writer_runs:
        axes.scatter(
            [w.at for w in report.writer_runs],
            [by_at.get(w.at, 0) for w in report.writer_runs],
            marker="^",
            s=42,
            color="#2ca02c",
            edgecolors="white",
            linewidths=0.6,
            zorder=4,
            label=LABEL_WRITER,
        )
    for rebuild in rebuilds:
        axes.annotate(
            "",
            xy=(rebuild.at, rebuild.tokens_after),
            xytext=(rebuild.at, rebuild.tokens_before),
            arrowprops={"arrowstyle": "-|>", "color": "#d62728", "linewidth": 1.6},
            zorder=5,
        )
    if rebuilds:
        axes.scatter(
            [r.at for r in rebuilds],
            [r.tokens_after for r in rebuilds],
            marker="o",
            s=36,
            color="#d62728",
            zorder=6,
            label=LABEL_REBUILD,
        )
    if report.overflows:
        axes.scatter(
            [o.at for o in report.overflows],
            [o.tokens for o in report.overflows],
            marker="X",
            s=70,
            color="#9467bd",
            zorder=6,
            label=LABEL_OVERFLOW,
        )
    for number, compaction in enumerate(report.transcript_compactions):
        axes.axvline(
            compaction.at,
            color="#ff7f0e",
            linewidth=1.4,
            linestyle="-.",
            label=LABEL_COMPACTION if number == 0 else None,
        )
    axes.set_ylim(0, top * 1.1)
    if xs:
        axes.set_xlim(0, max(xs[-1], *(c.at for c in report.transcript_compactions), 1) * 1.01)
    axes.yaxis.set_major_formatter(FuncFormatter(_thousands))
    axes.set_xlabel("position in the transcript (message #)")
    axes.set_ylabel("tokens")
    axes.grid(True, axis="y", alpha=0.25)
    heading = title or f"session {report.session_id}"
    figure.suptitle(
        f"{heading} — window {_short(report.window)} tokens", fontsize=13, fontweight="bold"
    )
    axes.set_title(
        f"session {report.session_id} · {report.turns} requests · "
        f"{len(report.writer_runs)} writer runs · {len(report.rebuilds)} rebuilds · "
        f"{len(report.overflows)} overflows · peak {_short(report.peak_request_tokens)} · "
        f"trigger line {_short(report.trigger_tokens)}",
        fontsize=9.5,
        color="#444444",
    )
    # Below the chart, so it never hides a line.
    figure.legend(loc="outside lower center", fontsize=9, ncols=3, frameon=False)
    return figure


def save_replay_plot(
    report: ReplayReport, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """Write :func:`replay_figure` to ``path`` (``.png`` or ``.svg``).

    Raises:
        ValueError: ``path`` ends in neither ``.png`` nor ``.svg``.
        ImportError: matplotlib is not installed (``pip install "mimo-ctx[plot]"``).
    """
    target = Path(path)
    if target.suffix.lower() not in PLOT_FORMATS:
        raise ValueError(f"{target}: a plot is written as .png or .svg, not {target.suffix!r}")
    figure: Any = replay_figure(report, title=title)
    matplotlib: Any = importlib.import_module("matplotlib")
    # Fixed metadata and element ids: the same report gives the same file (the
    # README image is regenerated by a documented command and diffed).
    fmt = target.suffix[1:].lower()
    metadata: dict[str, Any] = {"Software": None} if fmt == "png" else {"Date": None}
    with matplotlib.rc_context({"svg.hashsalt": "mimo-ctx"}):
        figure.savefig(target, format=fmt, metadata=metadata)
    return target
