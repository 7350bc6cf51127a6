"""Errors of the ``mimo-ctx`` command: one line on stderr, exit code 2, never a traceback.

Issue 6 done-when: corrupt files give a one-line error and exit code 2.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_ctx import cli
from mimo_ctx.cli import _demo
from tests.cli.conftest import REPO_ROOT, Run, run_cli, write_chat_transcript

CORRUPT = {
    "empty.jsonl": b"",
    "blank.jsonl": b"\n\n  \n",
    "binary.jsonl": b"\x00\x01\x02garbage\x00",
    "not-json.json": b"this is not json at all\n",
    "truncated.jsonl": (
        b'{"type": "user", "uuid": "a", "message": {"role": "user", "content": "hi"}}\n'
        b'{"type": "assistant", "uuid": "b", "parentUuid": "a", "message": {"role": \n'
    ),
    "number.json": b"42",
    "unknown-object.json": b'{"hello": "world"}',
    "array-of-numbers.json": b"[1, 2, 3]",
    "bad-utf8.jsonl": b'{"type": "user", "uuid": "a", "message": {"content": "\xff\xfe"}}\n',
    "traj-without-history.traj": b'{"history": 5}',
}


def assert_one_line_error(run: Run, *, code: int = 2) -> None:
    assert run.code == code, (run.code, run.out, run.err)
    assert run.out == ""
    assert run.err.endswith("\n")
    assert run.err.count("\n") == 1, run.err
    assert run.err.startswith("mimo-ctx")
    assert "Traceback" not in run.err


@pytest.mark.parametrize("name", sorted(CORRUPT))
@pytest.mark.parametrize("command", ["inspect", "replay"])
def test_corrupt_transcript_exits_2_with_one_line(tmp_path: Path, name: str, command: str) -> None:
    path = tmp_path / name
    path.write_bytes(CORRUPT[name])
    run = run_cli(command, str(path), "--window", "100K", "--json")
    assert_one_line_error(run)
    assert str(path) in run.err


@pytest.mark.parametrize("command", ["inspect", "replay"])
def test_missing_file_and_directory(tmp_path: Path, command: str) -> None:
    missing = run_cli(command, str(tmp_path / "nope.jsonl"), "--window", "1M")
    assert_one_line_error(missing)
    assert "no such file" in missing.err
    directory = run_cli(command, str(tmp_path), "--window", "1M")
    assert_one_line_error(directory)
    assert "a directory" in directory.err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["replay", "x.jsonl"],  # --window is required
        ["replay", "x.jsonl", "--window", "lots"],
        ["replay", "x.jsonl", "--window", "0"],
        ["inspect", "x.jsonl", "--format", "gemini"],
        ["render"],  # --store is required
        ["render", "--store", "x.db", "--format", "xml"],
        ["demo", "--unknown-flag"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    run = run_cli(*argv)
    assert run.code == 2, run
    assert "error:" in run.err
    assert "Traceback" not in run.err


def test_help_and_version_exit_0() -> None:
    run = run_cli("--help")
    assert run.code == 0
    for command in ("demo", "inspect", "replay", "render"):
        assert command in run.out
    assert run_cli("--version").code == 0
    assert run_cli("inspect", "--help").code == 0


def test_bad_at_and_bad_config(tmp_path: Path) -> None:
    path = write_chat_transcript(tmp_path / "chat.json", rounds=3)
    run = run_cli("inspect", str(path), "--at", "#999")
    assert_one_line_error(run)
    assert "#999" in run.err
    run = run_cli("inspect", str(path), "--at", "msg_unknown")
    assert_one_line_error(run)
    config = tmp_path / "bad.toml"
    config.write_text("[checkpoint]\ntrigger_ratio = 7\nnope = 1\n", encoding="utf-8")
    run = run_cli("replay", str(path), "--window", "1M", "--config", str(config))
    assert_one_line_error(run)  # ConfigError's lines are joined into one
    assert "trigger_ratio" in run.err
    assert "nope" in run.err


def test_corrupt_and_missing_store_for_render(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not an sqlite database" * 100)
    run = run_cli("render", "--store", str(bad))
    assert_one_line_error(run)
    assert bad.read_bytes() == b"not an sqlite database" * 100  # left unchanged
    missing = run_cli("render", "--store", str(tmp_path / "none.db"))
    assert_one_line_error(missing)
    assert not (tmp_path / "none.db").exists()  # render never creates a store


def test_demo_store_that_is_a_directory(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("demo", "--store", str(tmp_path)))


def test_internal_error_is_one_line_exit_1_and_debug_shows_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(_demo, "run_demo", broken)
    run = run_cli("demo")
    assert_one_line_error(run, code=1)
    assert "RuntimeError: boom" in run.err
    with pytest.raises(RuntimeError, match="boom"):
        run_cli("demo", "--debug")


class _ClosedPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_broken_pipe_is_quiet() -> None:
    err = io.StringIO()
    code = cli.main(["demo", "--json"], stdout=_ClosedPipe(), stderr=err)
    assert code == 141
    assert err.getvalue() == ""


def test_corrupt_file_in_a_subprocess_has_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.jsonl"
    path.write_bytes(b"{not json\n")
    done = subprocess.run(
        [sys.executable, "-m", "mimo_ctx", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    json.dumps(done.stderr)  # a plain string
