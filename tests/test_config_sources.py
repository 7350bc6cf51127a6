"""Settings where people keep them: ``pyproject.toml``, the environment, a file.

One order of precedence, lowest first: defaults, ``[tool.mimo-ctx]`` of the
nearest ``pyproject.toml``, the explicit source (mapping or file), ``MIMO_CTX_*``
variables; nested tables merge key by key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo_ctx.cli._common import load_cli_config
from mimo_ctx.config import RebuildConfig, find_pyproject, load_config
from mimo_ctx.errors import ConfigError

PYPROJECT = """\
[project]
name = "my-agent"

[tool.mimo-ctx]
trigger_ratio = 0.8
micro_compact_tools = ["read", "run_*"]

[tool.mimo-ctx.push_caps]
memory = 8000
notes = 3000
"""


def _project(tmp_path: Path, text: str = PYPROJECT) -> Path:
    (tmp_path / "pyproject.toml").write_text(text, encoding="utf-8")
    return tmp_path


# --------------------------------------------------------------------------- pyproject


def test_pyproject_table_is_read(tmp_path: Path) -> None:
    config = load_config(environ={}, cwd=_project(tmp_path))
    assert config.trigger_ratio == 0.8
    assert config.micro_compact_tools == ("read", "run_*")
    assert config.push_caps.memory == 8000
    assert config.push_caps.notes == 3000
    assert config.push_caps.checkpoint == 11000  # untouched keys keep their defaults


def test_pyproject_is_found_from_a_subdirectory(tmp_path: Path) -> None:
    deep = _project(tmp_path) / "src" / "agent"
    deep.mkdir(parents=True)
    assert find_pyproject(deep) == tmp_path / "pyproject.toml"
    assert load_config(environ={}, cwd=deep).trigger_ratio == 0.8


def test_only_the_nearest_pyproject_counts(tmp_path: Path) -> None:
    inner = _project(tmp_path) / "inner"
    inner.mkdir()
    _project(inner, '[project]\nname = "inner"\n')
    assert load_config(environ={}, cwd=inner) == RebuildConfig()


def test_no_pyproject_means_defaults(tmp_path: Path) -> None:
    lone = tmp_path / "no-project-here"
    lone.mkdir()
    if find_pyproject(lone) is None:
        assert load_config(environ={}, cwd=lone) == RebuildConfig()


def test_bad_pyproject_value_names_the_file_table_and_key(tmp_path: Path) -> None:
    _project(tmp_path, "[tool.mimo-ctx.push_caps]\nmemory = -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, cwd=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "pyproject.toml") in message
    assert "[tool.mimo-ctx].push_caps.memory" in message


def test_unknown_pyproject_key_is_rejected(tmp_path: Path) -> None:
    _project(tmp_path, "[tool.mimo-ctx]\ntriger_ratio = 0.8\n")
    with pytest.raises(ConfigError, match=r"\[tool.mimo-ctx\].triger_ratio: unknown key"):
        load_config(environ={}, cwd=tmp_path)


def test_pyproject_table_that_is_not_a_table(tmp_path: Path) -> None:
    _project(tmp_path, '[tool]\n"mimo-ctx" = 3\n')
    with pytest.raises(ConfigError, match="expected a table"):
        load_config(environ={}, cwd=tmp_path)


def test_unparsable_pyproject_names_the_file(tmp_path: Path) -> None:
    _project(tmp_path, "[tool.mimo-ctx\n")
    with pytest.raises(ConfigError, match=r"cannot parse config file .*pyproject\.toml"):
        load_config(environ={}, cwd=tmp_path)


# --------------------------------------------------------------------------- environment


def test_environment_variables_set_every_kind_of_key(tmp_path: Path) -> None:
    environ = {
        "MIMO_CTX_TRIGGER_RATIO": "0.85",
        "MIMO_CTX_PUSH_CAPS__MEMORY": "9000",
        "MIMO_CTX_PUSH_CAPS__GLOBAL": "700",
        "MIMO_CTX_TAIL__MIN_TOKENS": "5000",
        "MIMO_CTX_WRITER__THRESHOLDS": '["40%", "100K"]',
        "MIMO_CTX_MICRO_COMPACT_TOOLS": "read, run_*",
        "MIMO_CTX_MICRO_COMPACT_PLACEHOLDER": "[cleared, ask the history tool]",
        "MIMO_CTX_MAX_CONTEXT": "300K",
        "MIMO_CTX_CHECKPOINT_ENABLED": "false",
        "MIMO_CTX_TOTAL_CAP": "none",
    }
    config = load_config(environ=environ, cwd=tmp_path)
    assert config.trigger_ratio == 0.85
    assert config.push_caps.memory == 9000
    assert config.push_caps.global_ == 700
    assert config.tail.min_tokens == 5000
    assert config.writer.thresholds == ("40%", "100K")
    assert config.micro_compact_tools == ("read", "run_*")
    # Text settings are taken as they are: commas and spaces included.
    assert config.micro_compact_placeholder == "[cleared, ask the history tool]"
    assert config.max_context == "300K"
    assert config.checkpoint_enabled is False
    assert config.total_cap is None


def test_bad_environment_value_names_the_variable_and_key(tmp_path: Path) -> None:
    environ = {"MIMO_CTX_PUSH_CAPS__MEMORY": "-3", "MIMO_CTX_TRIGGER_RATIO": "lots"}
    with pytest.raises(ConfigError) as info:
        load_config(environ=environ, cwd=tmp_path)
    message = str(info.value)
    assert "MIMO_CTX_PUSH_CAPS__MEMORY (push_caps.memory)" in message
    assert "MIMO_CTX_TRIGGER_RATIO (trigger_ratio)" in message


def test_bad_list_item_in_the_environment_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"MIMO_CTX_WRITER__THRESHOLDS": '["40%", "lots"]'}, cwd=tmp_path)
    assert "MIMO_CTX_WRITER__THRESHOLDS (writer.thresholds)" in str(info.value)
    assert "'lots'" in str(info.value)


@pytest.mark.parametrize(
    ("variable", "message"),
    [
        ("MIMO_CTX_TRIGER_RATIO", "did you mean MIMO_CTX_TRIGGER_RATIO"),
        ("MIMO_CTX_PUSH_CAPS__MEMROY", "did you mean MIMO_CTX_PUSH_CAPS__MEMORY"),
        ("MIMO_CTX_PUSH_CAPS__EVERYTHING", "MIMO_CTX_PUSH_CAPS__EVERYTHING: unknown setting"),
    ],
)
def test_misspelt_variables_are_reported(tmp_path: Path, variable: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(environ={variable: "1"}, cwd=tmp_path)


def test_other_mimo_ctx_variables_are_not_settings(tmp_path: Path) -> None:
    environ = {
        "MIMO_CTX_PG_DSN": "postgresql://postgres@127.0.0.1:5432/x",
        "MIMO_CTX_TRANSCRIPTS": "/data",
        "MIMO_CTX_SOAK": "full",
        "OTHER_TRIGGER_RATIO": "0.1",
    }
    assert load_config(environ=environ, cwd=tmp_path) == RebuildConfig()


# --------------------------------------------------------------------------- precedence


def test_one_order_of_precedence(tmp_path: Path) -> None:
    _project(tmp_path)
    settings = tmp_path / "mimo.toml"
    settings.write_text(
        "[checkpoint]\ntrigger_ratio = 0.7\n\n[checkpoint.push_caps]\nnotes = 2000\n",
        encoding="utf-8",
    )
    environ = {"MIMO_CTX_TRIGGER_RATIO": "0.6"}

    only_pyproject = load_config(environ={}, cwd=tmp_path)
    with_file = load_config(settings, environ={}, cwd=tmp_path)
    everything = load_config(settings, environ=environ, cwd=tmp_path)

    assert only_pyproject.trigger_ratio == 0.8
    assert with_file.trigger_ratio == 0.7  # the file over pyproject.toml
    assert everything.trigger_ratio == 0.6  # the environment over both
    # Nested tables merge key by key: memory from pyproject, notes from the file.
    assert (with_file.push_caps.memory, with_file.push_caps.notes) == (8000, 2000)
    assert everything.micro_compact_tools == ("read", "run_*")


def test_a_mapping_source_takes_the_files_place(tmp_path: Path) -> None:
    _project(tmp_path)
    config = load_config({"checkpoint": {"push_caps": {"memory": 1}}}, environ={}, cwd=tmp_path)
    assert (config.push_caps.memory, config.push_caps.notes, config.trigger_ratio) == (1, 3000, 0.8)


def test_load_config_without_a_source_applies_the_process_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No arguments: the current directory's pyproject.toml and os.environ."""
    monkeypatch.chdir(_project(tmp_path))
    monkeypatch.setenv("MIMO_CTX_PUSH_CAPS__NOTES", "1234")
    config = load_config()
    assert config.trigger_ratio == 0.8
    assert config.push_caps.notes == 1234
    # The command line reads them the same way when --config is not given.
    assert load_cli_config(None) == config


def test_cli_config_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = tmp_path / "mimo.json"
    settings.write_text('{"checkpoint": {"trigger_ratio": 0.7}}', encoding="utf-8")
    monkeypatch.setenv("MIMO_CTX_ACTIVITY_MAX_LINES", "50")
    config = load_cli_config(str(settings))
    assert (config.trigger_ratio, config.activity_max_lines) == (0.7, 50)
