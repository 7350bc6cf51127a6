"""Tests of configuration (SPEC R9, R5.3, R5.10, R1.2, R2.3, R3.2, A3)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mimo_ctx.config import (
    DEFAULT_MICRO_COMPACT_TOOLS,
    PushCaps,
    RebuildConfig,
    TailConfig,
    WriterConfig,
    load_config,
    parse_token_amount,
)
from mimo_ctx.errors import ConfigError, MimoCtxError

# Config key (as written in a file) -> SPEC default (R5.3 table, R5.10).
_CAP_DEFAULTS: dict[str, int] = {
    "tasks_ledger": 2000,
    "checkpoint": 11000,
    "actor_ledger": 500,
    "recent_user": 16000,
    "recent_user_per_msg": 2000,
    "memory": 10000,
    "global": 6000,
    "notes": 6000,
    "memory_titles": 500,
    "focus_task": 4000,
    "design_decisions": 3000,
    "open_notes": 800,
}

# Ours (beyond R5.3): the focus of a manual rebuild and a rebuild hook's section.
_OUR_CAP_DEFAULTS: dict[str, int] = {"rebuild_focus": 1000, "host_section": 2000}


def _cap(caps: PushCaps, key: str) -> int:
    # `global` is a Python keyword: the attribute is `global_`, the key `global`.
    value: int = getattr(caps, "global_" if key == "global" else key)
    return value


# ------------------------------------------------------------------ defaults


def test_r9_1_push_caps_defaults_are_the_spec_values() -> None:
    caps = RebuildConfig().push_caps
    assert caps.tasks_ledger == 2000
    assert caps.checkpoint == 11000
    assert caps.actor_ledger == 500
    assert caps.recent_user == 16000
    assert caps.recent_user_per_msg == 2000
    assert caps.memory == 10000
    assert caps.global_ == 6000
    assert caps.notes == 6000
    assert caps.memory_titles == 500
    assert caps.focus_task == 4000
    assert caps.design_decisions == 3000
    assert caps.open_notes == 800


def test_r9_1_push_caps_has_exactly_the_spec_keys_and_ours() -> None:
    keys = {f.alias or name for name, f in PushCaps.model_fields.items()}
    assert keys == set(_CAP_DEFAULTS) | set(_OUR_CAP_DEFAULTS)
    for key, default in _OUR_CAP_DEFAULTS.items():
        assert _cap(PushCaps(), key) == default


def test_r5_9_token_caps_of_sections_2_to_8_sum_to_50000() -> None:
    caps = PushCaps()
    section_caps = (
        caps.checkpoint
        + caps.actor_ledger
        + caps.recent_user
        + caps.memory
        + caps.global_
        + caps.notes
        + caps.memory_titles
    )
    assert section_caps == 50000


def test_r1_2_trigger_ratio_default() -> None:
    assert RebuildConfig().trigger_ratio == 0.90
    assert RebuildConfig().max_context is None


def test_r2_3_tail_defaults() -> None:
    tail = TailConfig()
    assert tail.min_tokens == 10000
    assert tail.max_tokens == 20000
    assert tail.min_text_block_messages == 5
    assert RebuildConfig().tail == tail


def test_r3_2_a3_writer_defaults() -> None:
    writer = WriterConfig()
    assert writer.wait_with_watermark == 30
    assert writer.wait_without_watermark == 300
    assert writer.ensure_wait_auto == 180
    assert writer.ensure_wait_manual == 300
    assert writer.reserved == 13000
    assert writer.thresholds is None
    assert RebuildConfig().writer == writer


def test_r9_2_windows_cut_lengths_and_tools_defaults() -> None:
    config = RebuildConfig()
    assert config.recent_user_window == 200
    assert config.activity_max_lines == 200
    assert config.activity_text_chars == 240
    assert config.activity_arg_chars == 80
    assert config.total_cap is None
    assert config.micro_compact_tools == DEFAULT_MICRO_COMPACT_TOOLS
    assert set(DEFAULT_MICRO_COMPACT_TOOLS) == {
        "read",
        "view_image",
        "bash",
        "grep",
        "glob",
        "webfetch",
        "websearch",
        "edit",
        "write",
        "multiedit",
        "apply_patch",
        "codesearch",
    }


def test_load_config_none_and_empty_give_defaults() -> None:
    assert load_config() == RebuildConfig()
    assert load_config({}) == RebuildConfig()
    assert load_config({"checkpoint": {}}) == RebuildConfig()


def test_config_is_frozen() -> None:
    config = RebuildConfig()
    with pytest.raises(ValidationError):
        config.trigger_ratio = 0.5


# ------------------------------------------------------------------ loading


@pytest.mark.parametrize("key", sorted(_CAP_DEFAULTS))
def test_r9_1_each_cap_loads_from_a_mapping(key: str) -> None:
    config = load_config({"checkpoint": {"push_caps": {key: 1234}}})
    assert _cap(config.push_caps, key) == 1234
    # The other caps keep their defaults.
    for other, default in _CAP_DEFAULTS.items():
        if other != key:
            assert _cap(config.push_caps, other) == default


def test_load_config_from_a_mapping_sets_every_kind_of_key() -> None:
    config = load_config(
        {
            "checkpoint": {
                "trigger_ratio": 0.8,
                "max_context": "300K",
                "push_caps": {"global": 0, "recent_user": 0},
                "tail": {"min_tokens": 5000, "max_tokens": 9000, "min_text_block_messages": 3},
                "writer": {"thresholds": ["40%", "100K", 1500000], "reserved": 9000},
                "micro_compact_tools": ["read", "bash"],
                "recent_user_window": 50,
                "activity_max_lines": 10,
                "activity_text_chars": 100,
                "activity_arg_chars": 20,
                "total_cap": 30000,
            }
        }
    )
    assert config.trigger_ratio == 0.8
    assert config.max_context == "300K"
    assert config.push_caps.global_ == 0
    assert config.push_caps.recent_user == 0
    assert config.tail == TailConfig(min_tokens=5000, max_tokens=9000, min_text_block_messages=3)
    assert config.writer.thresholds == ("40%", "100K", 1500000)
    assert config.writer.reserved == 9000
    assert config.micro_compact_tools == ("read", "bash")
    assert config.recent_user_window == 50
    assert config.activity_max_lines == 10
    assert config.activity_text_chars == 100
    assert config.activity_arg_chars == 20
    assert config.total_cap == 30000


def test_load_config_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "mimo.json"
    path.write_text(
        json.dumps(
            {
                "checkpoint": {
                    "push_caps": {"memory": 7000, "global": 3000},
                    "writer": {"thresholds": ["20%", "60%"]},
                }
            }
        ),
        encoding="utf-8",
    )
    for source in (path, str(path)):
        config = load_config(source)
        assert config.push_caps.memory == 7000
        assert config.push_caps.global_ == 3000
        assert config.writer.thresholds == ("20%", "60%")


def test_load_config_from_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "mimo.toml"
    path.write_text(
        "[checkpoint]\n"
        "trigger_ratio = 0.85\n"
        'max_context = "60%"\n'
        "\n"
        "[checkpoint.push_caps]\n"
        "memory = 8000\n"
        "global = 2000\n"
        "open_notes = 100\n"
        "\n"
        "[checkpoint.writer]\n"
        'thresholds = ["40%", "1.5M", 90000]\n',
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.trigger_ratio == 0.85
    assert config.max_context == "60%"
    assert config.push_caps.memory == 8000
    assert config.push_caps.global_ == 2000
    assert config.push_caps.open_notes == 100
    assert config.push_caps.checkpoint == 11000
    assert config.writer.thresholds == ("40%", "1.5M", 90000)


def test_push_caps_accepts_global_by_alias_and_by_name() -> None:
    assert PushCaps.model_validate({"global": 1}).global_ == 1
    assert PushCaps.model_validate({"global_": 2}).global_ == 2


# ------------------------------------------------------------------ bad values


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert isinstance(info.value, MimoCtxError)
    return str(info.value)


@pytest.mark.parametrize("key", sorted(_CAP_DEFAULTS))
def test_r9_1_negative_cap_names_the_full_key(key: str) -> None:
    message = _error({"checkpoint": {"push_caps": {key: -1}}})
    assert f"checkpoint.push_caps.{key}:" in message
    assert "greater than or equal to 0" in message


@pytest.mark.parametrize("key", sorted(_CAP_DEFAULTS))
@pytest.mark.parametrize("bad", ["lots", 1.5, [100], {"a": 1}, None, True])
def test_r9_1_wrong_type_cap_names_the_full_key(key: str, bad: Any) -> None:
    message = _error({"checkpoint": {"push_caps": {key: bad}}})
    assert f"checkpoint.push_caps.{key}:" in message
    assert repr(bad) in message


def test_r9_1_unknown_cap_key_is_rejected_naming_it() -> None:
    message = _error({"checkpoint": {"push_caps": {"memroy": 100}}})
    assert "checkpoint.push_caps.memroy: unknown key" in message


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"checkpoint": {"trigger": 0.5}}, "checkpoint.trigger: unknown key"),
        ({"checkpoint": {"tail": {"min": 1}}}, "checkpoint.tail.min: unknown key"),
        ({"checkpoint": {"writer": {"wait": 1}}}, "checkpoint.writer.wait: unknown key"),
        ({"push_caps": {"memory": 1}}, "push_caps: unknown key"),
    ],
)
def test_r9_1_unknown_keys_anywhere_are_rejected_naming_them(data: Any, key: str) -> None:
    assert key in _error(data)


def test_every_bad_key_is_reported_at_once() -> None:
    message = _error(
        {"checkpoint": {"push_caps": {"memory": -1, "notes": "x"}, "trigger_ratio": 2}}
    )
    assert "checkpoint.push_caps.memory:" in message
    assert "checkpoint.push_caps.notes:" in message
    assert "checkpoint.trigger_ratio:" in message


@pytest.mark.parametrize("bad", ["40 %x", "40%%", "lots", "-5", "1.5G", "150%", "-1%", True])
def test_a3_bad_writer_threshold_names_the_key(bad: Any) -> None:
    message = _error({"checkpoint": {"writer": {"thresholds": ["40%", bad]}}})
    assert "checkpoint.writer.thresholds" in message
    assert repr(bad) in message


@pytest.mark.parametrize("bad", ["40 %x", "lots", -1, "150%", "-3K", [300000], True])
def test_r1_2_bad_max_context_names_the_key(bad: Any) -> None:
    message = _error({"checkpoint": {"max_context": bad}})
    assert "checkpoint.max_context" in message
    assert repr(bad) in message


@pytest.mark.parametrize("good", [300000, "300K", "1.5M", "60%", " 100k ", "0%", "100%"])
def test_r1_2_good_max_context_is_accepted(good: int | str) -> None:
    assert load_config({"checkpoint": {"max_context": good}}).max_context == good


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("trigger_ratio", 0),
        ("trigger_ratio", 1.01),
        ("trigger_ratio", -0.5),
        ("trigger_ratio", "high"),
        ("activity_text_chars", 1),
        ("activity_arg_chars", 0),
        ("recent_user_window", -1),
        ("activity_max_lines", -1),
        ("total_cap", -1),
        ("min_freed_fraction", 1.5),
        ("micro_compact_tools", "read"),
    ],
)
def test_r9_2_bad_top_level_values_name_the_key(key: str, bad: Any) -> None:
    assert f"checkpoint.{key}:" in _error({"checkpoint": {key: bad}})


@pytest.mark.parametrize(
    ("table", "key", "bad"),
    [
        ("tail", "min_tokens", -1),
        ("tail", "max_tokens", "many"),
        ("tail", "min_text_block_messages", 2.5),
        ("writer", "wait_with_watermark", 0),
        ("writer", "wait_without_watermark", -1),
        ("writer", "ensure_wait_auto", "soon"),
        ("writer", "ensure_wait_manual", 0),
        ("writer", "reserved", -13000),
    ],
)
def test_r9_2_bad_nested_values_name_the_full_key(table: str, key: str, bad: Any) -> None:
    assert f"checkpoint.{table}.{key}:" in _error({"checkpoint": {table: {key: bad}}})


@pytest.mark.parametrize("bad", [5, "x", ["push_caps"]])
def test_checkpoint_table_must_be_a_mapping(bad: Any) -> None:
    assert "checkpoint" in _error({"checkpoint": bad})


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="mapping"):
        # A list instead of a mapping on purpose: the loader names what it got.
        load_config([1, 2])  # pyright: ignore[reportArgumentType]


def test_bad_value_in_a_toml_file_names_the_full_key(tmp_path: Path) -> None:
    path = tmp_path / "mimo.toml"
    path.write_text("[checkpoint.push_caps]\nmemory = -5\n", encoding="utf-8")
    assert "checkpoint.push_caps.memory:" in _error(path)


# ------------------------------------------------------------------ unreadable files


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    message = _error(path)
    assert str(path) in message
    assert "cannot read" in message


def test_directory_instead_of_file_names_it(tmp_path: Path) -> None:
    message = _error(tmp_path)
    assert str(tmp_path) in message


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("bad.json", b'{"checkpoint": {"push_caps": {"memory": 1,}}}'),
        ("bad.json", b"\xff\xfe not utf-8"),
        ("bad.toml", b"[checkpoint.push_caps\nmemory = 1\n"),
        ("bad.toml", b"[checkpoint]\ntrigger_ratio = \xff\n"),
        ("empty.json", b""),
    ],
)
def test_unparseable_file_names_the_file(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    message = _error(path)
    assert "cannot parse" in message
    assert str(path) in message


# ------------------------------------------------------------------ token amounts


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (12000, 12000),
        (1500.0, 1500),
        ("1.1K", 1_100),
        ("12000", 12000),
        ("100K", 100_000),
        ("100k", 100_000),
        ("1.5M", 1_500_000),
        (" 2 m ", 2_000_000),
        ("0", 0),
    ],
)
def test_parse_token_amount(value: int | float | str, expected: int) -> None:
    assert parse_token_amount(value) == expected


@pytest.mark.parametrize(
    ("value", "of", "expected"),
    [("40%", 200_000, 80_000), ("0%", 1000, 0), ("100%", 1000, 1000), ("33.3%", 1000, 333)],
)
def test_parse_token_amount_percentages(value: str, of: int, expected: int) -> None:
    assert parse_token_amount(value, of=of) == expected


@pytest.mark.parametrize(
    ("value", "of"),
    [
        ("40%", None),
        ("x%", 100),
        ("101%", 100),
        ("-1", None),
        (-1, None),
        ("1.5G", None),
        ("1.5", None),
        ("1.2345K", None),
        (1.9, None),
    ],
)
def test_parse_token_amount_rejects(value: int | str, of: int | None) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(value))):
        parse_token_amount(value, of=of)


def test_parse_token_amount_rejects_booleans() -> None:
    with pytest.raises(ValueError, match="True"):
        parse_token_amount(True)


def test_a3_checkpoint_enabled_switch_takes_booleans_only() -> None:
    """The one boolean setting accepts booleans; numbers stay rejected as booleans."""
    assert RebuildConfig().checkpoint_enabled is True
    assert load_config({"checkpoint": {"checkpoint_enabled": False}}).checkpoint_enabled is False
    with pytest.raises(ConfigError, match=r"checkpoint\.checkpoint_enabled"):
        load_config({"checkpoint": {"checkpoint_enabled": "sometimes"}})
    with pytest.raises(ConfigError, match=r"checkpoint\.push_caps\.memory"):
        load_config({"checkpoint": {"push_caps": {"memory": True}}})


def test_r2_3_a_tail_floor_above_its_ceiling_is_valid() -> None:
    """R2.5 stops at the ceiling whatever the floor: such a config is well-defined."""
    config = load_config({"checkpoint": {"tail": {"min_tokens": 30000, "max_tokens": 20000}}})
    assert (config.tail.min_tokens, config.tail.max_tokens) == (30000, 20000)
