"""``--window`` means the same in every command, and a fraction of a token is an
error (issue 17 item 20): ``--window 1.5`` used to be read as a one-token window."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import cast

import pytest

from mimo_ctx.cli._app import build_parser
from tests.cli.conftest import run_cli, write_chat_transcript


def _commands_with_window() -> dict[str, argparse.Action]:
    parser = build_parser()
    # The subcommands' action is the one whose choices map names to parsers.
    choices: dict[str, argparse.ArgumentParser] = next(
        cast("dict[str, argparse.ArgumentParser]", a.choices)  # pyright: ignore[reportUnknownMemberType]
        for a in parser._actions  # pyright: ignore[reportPrivateUsage]
        if isinstance(a.choices, dict)  # pyright: ignore[reportUnknownMemberType]
    )
    found: dict[str, argparse.Action] = {}
    for name, sub in choices.items():
        for action in sub._actions:  # pyright: ignore[reportPrivateUsage]
            if "--window" in action.option_strings:
                found[name] = action
    return found


def test_every_window_argument_is_parsed_alike() -> None:
    actions = _commands_with_window()
    assert {"inspect", "replay"} <= set(actions)
    converters = {action.type for action in actions.values()}
    assert len(converters) == 1  # one parser for the flag everywhere
    (convert,) = converters
    assert callable(convert)
    for text, tokens in [("200000", 200_000), ("200K", 200_000), ("0.2M", 200_000), ("1.5K", 1500)]:
        assert convert(text) == tokens
    for bad in ["1.5", "1.2345K", "0", "-5", "lots", "50%"]:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(bad)


@pytest.mark.parametrize("command", ["inspect", "replay"])
@pytest.mark.parametrize("bad", ["1.5", "1.2345K"])
def test_a_fractional_window_is_refused(tmp_path: Path, command: str, bad: str) -> None:
    path = write_chat_transcript(tmp_path / "chat.json", rounds=3)
    run = run_cli(command, str(path), "--window", bad)
    assert run.code == 2
    assert "--window" in run.err
    assert run.err.count("\n") == 1


def test_inspect_and_replay_agree_on_the_trigger_line(tmp_path: Path) -> None:
    path = write_chat_transcript(tmp_path / "chat.json", rounds=3)
    for window in ("30K", "30000", "0.03M"):
        lines = {
            run_cli(command, str(path), "--window", window, "--json").json()["trigger_tokens"]
            for command in ("inspect", "replay")
        }
        assert lines == {15_000}
