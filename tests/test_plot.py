"""The picture of a replay: the chart (``--plot``, matplotlib) and the terminal sparkline."""

from __future__ import annotations

import builtins
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.importers import load_transcript
from mimo_ctx.plot import (
    LABEL_COMPACTION,
    LABEL_OVERFLOW,
    LABEL_REBUILD,
    LABEL_TRIGGER,
    LABEL_WINDOW,
    LABEL_WRITER,
    SPARK_CHARS,
    marker_line,
    replay_figure,
    save_replay_plot,
    sparkline,
)
from mimo_ctx.replay import ReplayReport, replay_transcript, stable_ids
from tests.cli.conftest import run_cli, transcripts_root, write_chat_transcript

matplotlib = pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is needed")

BIG = "claude_code/258c7280-ae70-4798-800f-63464d01a85d.jsonl"

# --------------------------------------------------------------------------- sparkline


def test_sparkline_scales_to_the_top() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 50, 100], top=100) == "▁▅█"
    # Above the top is drawn full; the default top is the largest value.
    assert sparkline([0, 200], top=100) == "▁█"
    assert sparkline([5, 10]) == "▅█"


def test_sparkline_buckets_keep_the_peaks() -> None:
    values = [0] * 100
    values[37] = 100
    line = sparkline(values, top=100, width=10)
    assert len(line) == 10
    assert line.count("█") == 1
    assert line[3] == "█"  # bucket 3 holds positions 30..39


@given(
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=400),
    st.integers(min_value=1, max_value=120),
    st.integers(min_value=1, max_value=10**6),
)
def test_sparkline_properties(values: list[int], width: int, top: int) -> None:
    line = sparkline(values, top=top, width=width)
    assert len(line) == min(len(values), width)
    assert set(line) <= set(SPARK_CHARS)
    if len(values) <= width:
        # One character per value, ordered like the values (monotone).
        for (a, ca), (b, cb) in zip(
            zip(values, line, strict=True), list(zip(values, line, strict=True))[1:], strict=False
        ):
            if a <= b:
                assert SPARK_CHARS.index(ca) <= SPARK_CHARS.index(cb)


def test_marker_line_places_letters_under_their_request() -> None:
    assert marker_line(10, [(0, "w"), (4, "R"), (9, "C")]) == "w   R    C"
    # Squeezed: positions map into buckets; later marks win a shared cell.
    assert marker_line(100, [(10, "w"), (11, "R")], width=10) == " R"
    assert marker_line(0, [(0, "R")]) == ""


# --------------------------------------------------------------------------- the chart


def _collection(figure: Any, label: str) -> Any:
    (axes,) = figure.axes
    found = [c for c in axes.collections if c.get_label() == label]
    return found[0] if found else None


def _lines(figure: Any, label: str) -> list[Any]:
    (axes,) = figure.axes
    return [line for line in axes.get_lines() if line.get_label() == label]


@pytest.fixture(scope="module")
def big_report() -> ReplayReport:
    path = transcripts_root() / BIG
    if not path.is_file():
        pytest.skip(f"{path} not found (set MIMO_CTX_TRANSCRIPTS to the shared transcripts)")
    import anyio

    async def replay() -> ReplayReport:
        return await replay_transcript(stable_ids(load_transcript(path)), window=40_000)

    return anyio.run(replay)


@pytest.mark.transcripts
def test_plot_of_a_shared_transcript(big_report: ReplayReport, tmp_path: Path) -> None:
    """The done-when of the plot: size, it decodes, one marker per rebuild."""
    from matplotlib.text import Annotation

    report = big_report
    assert len(report.rebuilds) >= 3
    assert report.transcript_compactions
    target = save_replay_plot(report, tmp_path / "replay.png", title=Path(BIG).name)
    image = matplotlib.image.imread(target)  # decodes as a PNG
    height, width = image.shape[:2]
    assert (width, height) == (1100, 620)
    assert image.std() > 0.05  # not a blank canvas

    figure = replay_figure(report, title=Path(BIG).name)
    (axes,) = figure.axes
    markers = _collection(figure, LABEL_REBUILD)
    assert markers is not None
    after = [tuple(point) for point in markers.get_offsets()]
    assert after == [(r.at, r.tokens_after) for r in report.rebuilds]
    # One arrow per rebuild, from the size before to the size after.
    arrows = [a for a in axes.texts if isinstance(a, Annotation) and a.arrow_patch is not None]
    assert [(a.xy, a.xyann) for a in arrows] == [
        ((r.at, r.tokens_after), (r.at, r.tokens_before)) for r in report.rebuilds
    ]
    writers = _collection(figure, LABEL_WRITER)
    assert writers is not None
    assert len(writers.get_offsets()) == len(report.writer_runs)
    (compaction,) = _lines(figure, LABEL_COMPACTION)
    assert compaction.get_xdata()[0] == report.transcript_compactions[0].at
    assert _lines(figure, LABEL_WINDOW)[0].get_ydata()[0] == 40_000
    assert _lines(figure, LABEL_TRIGGER)[0].get_ydata()[0] == report.trigger_tokens
    assert _collection(figure, LABEL_OVERFLOW) is None  # none in this replay
    title = figure.get_suptitle()
    assert Path(BIG).name in title
    assert "window 40K tokens" in title
    assert report.session_id in axes.get_title()
    assert axes.get_xlabel()
    assert axes.get_ylabel() == "tokens"
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert LABEL_REBUILD in legend
    assert LABEL_WRITER in legend


@pytest.mark.transcripts
def test_plot_as_svg_and_bad_suffix(big_report: ReplayReport, tmp_path: Path) -> None:
    target = save_replay_plot(big_report, tmp_path / "replay.svg")
    root = ET.parse(target).getroot()
    assert root.tag.endswith("svg")
    again = save_replay_plot(big_report, tmp_path / "again.svg")
    assert again.read_bytes() == target.read_bytes()  # same report, same file
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        save_replay_plot(big_report, tmp_path / "replay.jpg")


async def test_plot_marks_a_provider_overflow(tmp_path: Path) -> None:
    report = await replay_transcript(
        load_transcript(_overflowing_transcript(tmp_path / "chat.json")), window=30_000
    )
    assert report.overflows
    figure = replay_figure(report)
    markers = _collection(figure, LABEL_OVERFLOW)
    assert markers is not None
    assert [tuple(p) for p in markers.get_offsets()] == [(o.at, o.tokens) for o in report.overflows]


def test_plot_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_import = builtins.__import__

    def hide_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", hide_matplotlib)
    report = ReplayReport(window=100, trigger_tokens=80, turns=0, messages=0)
    with pytest.raises(ImportError, match=r'pip install "mimo-ctx\[plot\]"'):
        replay_figure(report)
    with pytest.raises(ImportError, match=r"mimo-ctx\[plot\]"):
        save_replay_plot(report, tmp_path / "x.png")


# --------------------------------------------------------------------------- overflows


def _overflowing_transcript(path: Path) -> Path:
    """A chat transcript whose one huge tool result jumps past the 30K window.

    Its provider reported small usage figures (they drive the trigger line until the
    first rebuild), so the trigger line is not crossed before the request overflows.
    """
    small = " ".join(f"w{i}" for i in range(600))
    huge = " ".join(f"line{i} value={i % 13}" for i in range(12_000))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read the logs and tell me what failed in the nightly run."},
    ]
    for i in range(6):
        content = huge if i == 4 else small
        messages += [
            {
                "role": "assistant",
                "content": f"Step {i}.",
                "usage": {"prompt_tokens": 1_000 + 500 * i, "completion_tokens": 50},
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "read", "arguments": json.dumps({"path": f"{i}.log"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": content},
        ]
    messages.append({"role": "assistant", "content": "The nightly run failed on the migration."})
    path.write_text(json.dumps(messages), encoding="utf-8")
    return path


async def test_replay_recovers_from_a_provider_overflow_like_a_live_loop(tmp_path: Path) -> None:
    """A request over the input limit is refused: on_error rebuilds once, the retry fits."""
    report = await replay_transcript(
        load_transcript(_overflowing_transcript(tmp_path / "chat.json")), window=30_000
    )
    (overflow,) = report.overflows
    assert overflow.tokens > 30_000
    assert overflow.recovered
    rebuild = next(r for r in report.rebuilds if r.trigger == "overflow")
    assert rebuild.at == overflow.at
    assert rebuild.outcome == "rebuilt"
    assert rebuild.tokens_after < report.trigger_tokens
    request = next(r for r in report.requests if r.at == overflow.at)
    assert request.tokens == rebuild.tokens_after  # the series shows what was sent
    assert report.input_limit == 30_000
    document = report.to_json()
    assert document["overflows"] == [
        {"at": overflow.at, "tokens": overflow.tokens, "recovered": True}
    ]
    assert len(document["requests"]) == report.turns


# --------------------------------------------------------------------------- the command


def test_replay_plot_command_writes_the_chart_and_prints_a_sparkline(tmp_path: Path) -> None:
    path = write_chat_transcript(tmp_path / "chat.json", rounds=40)
    target = tmp_path / "chat.png"
    run = run_cli("replay", str(path), "--window", "30K", "--plot", str(target), "--plain")
    assert run.code == 0, run.err
    assert target.is_file()
    assert matplotlib.image.imread(target).shape[:2] == (620, 1100)
    lines = run.out.splitlines()
    heading = next(
        i for i, line in enumerate(lines) if line.startswith("== Tokens sent per request")
    )
    spark, marks = lines[heading + 1], lines[heading + 2]
    assert 0 < len(spark) <= 72
    assert set(spark) <= set(SPARK_CHARS)
    assert "R" in marks
    assert "Plot:" in run.out

    doc = run_cli("replay", str(path), "--window", "30K", "--plot", str(target), "--json").json()
    assert doc["plot"] == str(target)
    assert len(doc["requests"]) == doc["turns"]
    assert doc["overflows"] == []
    assert doc["writer_thresholds"] == []  # usable 15,000 < 25,000: no writer thresholds (A3)


@pytest.mark.parametrize(
    ("target", "message"),
    [("chart.jpg", ".png or .svg"), ("missing-dir/chart.png", "no such directory")],
)
def test_replay_plot_bad_target_is_a_one_line_error(
    tmp_path: Path, target: str, message: str
) -> None:
    path = write_chat_transcript(tmp_path / "chat.json", rounds=2)
    run = run_cli("replay", str(path), "--window", "30K", "--plot", str(tmp_path / target))
    assert run.code == 2
    assert message in run.err
    assert len(run.err.strip().splitlines()) == 1


def test_replay_plot_without_matplotlib_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib

    real = importlib.import_module

    def hide(name: str, package: str | None = None) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", hide)
    path = write_chat_transcript(tmp_path / "chat.json", rounds=2)
    run = run_cli("replay", str(path), "--window", "30K", "--plot", str(tmp_path / "x.png"))
    assert run.code == 2
    assert 'pip install "mimo-ctx[plot]"' in run.err
