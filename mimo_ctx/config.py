"""Configuration (SPEC R9, R5.10).

Every knob has the SPEC's default; every model is frozen and rejects unknown keys.
:func:`load_config` reads a mapping, a JSON file or a TOML file whose settings sit
under a top-level ``checkpoint`` table (``[checkpoint.push_caps]`` in TOML) and turns
pydantic's validation errors into one :class:`~mimo_ctx.errors.ConfigError` whose
message names each bad key with what was expected.

No key is dead (R5.10 **beyond**): ``focus_task``, ``design_decisions`` and
``open_notes`` cap the matching checkpoint sections when rendering and are handed
to the checkpoint writer as its section budgets.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Final, cast, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mimo_ctx.errors import ConfigError
from mimo_ctx.view import COMPACTED_PLACEHOLDER

__all__ = [
    "DEFAULT_MICRO_COMPACT_EXCLUDE",
    "DEFAULT_MICRO_COMPACT_TOOLS",
    "ENV_PREFIX",
    "PYPROJECT_TABLE",
    "PushCaps",
    "RebuildConfig",
    "TailConfig",
    "WriterConfig",
    "find_pyproject",
    "load_config",
    "parse_token_amount",
]

DEFAULT_MICRO_COMPACT_TOOLS: Final[tuple[str, ...]] = (
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
)
"""Tools whose completed results a rebuild clears (SPEC R4.5)."""

DEFAULT_MICRO_COMPACT_EXCLUDE: Final[tuple[str, ...]] = (
    "actor",
    "task",
    "question",
    "skill",
    "memory",
)
"""Stateful tools whose results are never cleared, whatever pattern matches them (R4.5)."""

_PLACEHOLDER_CHARS: Final = 500

_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_token_amount(value: int | float | str, *, of: int | None = None) -> int:
    """Parse a token amount: ``12000``, ``"100K"``, ``"1.5M"`` or, with ``of``, ``"40%"``.

    Args:
        value: The amount. A percentage needs ``of``, the quantity it is a share of.
        of: What a percentage is taken of.

    Returns:
        The amount in tokens; a percentage is rounded down.

    Raises:
        ValueError: ``value`` is negative, malformed, not a whole number of tokens
            (``1.5``, ``"1.2345K"``: a fraction of a token means nothing, and rounding
            it silently turned ``--window 1.5`` into a one-token window), or a
            percentage without ``of``.
    """
    if isinstance(value, bool):
        # ValueError, not TypeError: pydantic turns it into a validation error.
        raise ValueError(f"expected a token amount, got {value!r}")  # noqa: TRY004
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"expected a non-negative token amount, got {value!r}")
        if value != int(value):
            raise ValueError(f"expected a whole number of tokens, got {value!r}")
        return int(value)
    text = value.strip()
    if text.endswith("%"):
        if of is None:
            raise ValueError(f"a percentage is not allowed here: {value!r}")
        try:
            share = float(text[:-1])
        except ValueError:
            raise ValueError(f"expected a percentage such as '40%', got {value!r}") from None
        if not 0 <= share <= 100:
            raise ValueError(f"expected a percentage between 0% and 100%, got {value!r}")
        return int(of * share / 100)
    match = _AMOUNT.match(text)
    if match is None:
        raise ValueError(f"expected a token amount such as 12000, '100K' or '1.5M', got {value!r}")
    scale = {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()]
    amount = Decimal(match.group(1)) * scale  # exact: "1.1K" is 1100, not 1100.0000000002
    if amount != amount.to_integral_value():
        raise ValueError(f"expected a whole number of tokens, got {value!r}")
    return int(amount)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _reject_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads `true` as 1 for a number field, so `memory = true`
        # is a mistake to report, not a cap of 1 token. Switches stay booleans.
        if info.field_name is not None and cls.model_fields[info.field_name].annotation is bool:
            return value
        sequence = isinstance(value, list | tuple)
        items = cast("list[object]", value) if sequence else [value]
        if any(isinstance(item, bool) for item in items):
            raise ValueError(f"expected a number or text, got a boolean: {value!r}")
        return value


class PushCaps(_Frozen):
    """Per-section caps of the rebuild body (SPEC R5.3, R5.10). Tokens unless noted."""

    tasks_ledger: int = Field(default=2000, ge=0, description="Tasks ledger, in characters.")
    checkpoint: int = Field(default=11000, ge=0, description="checkpoint.md, section-aware.")
    actor_ledger: int = Field(default=500, ge=0, description="Active actors, line by line.")
    recent_user: int = Field(default=16000, ge=0, description="Recent user input; 0 disables.")
    recent_user_per_msg: int = Field(default=2000, ge=0, description="One user message.")
    memory: int = Field(default=10000, ge=0, description="Project MEMORY.md, section-aware.")
    global_: int = Field(
        default=6000, ge=0, alias="global", description="Global MEMORY.md, section-aware."
    )
    notes: int = Field(default=6000, ge=0, description="notes.md, proportional cut.")
    memory_titles: int = Field(default=500, ge=0, description="Memory keys index.")
    focus_task: int = Field(
        default=4000, ge=0, description="Checkpoint §1 Active intent + §2 Next concrete action."
    )
    design_decisions: int = Field(
        default=3000, ge=0, description="Checkpoint §10 Design decisions."
    )
    open_notes: int = Field(default=800, ge=0, description="Checkpoint §11 Open notes.")
    rebuild_focus: int = Field(
        default=1000, ge=0, description="Ours: the focus text of a manual rebuild, verbatim."
    )
    host_section: int = Field(
        default=2000, ge=0, description="Ours: the section a before_rebuild hook adds."
    )


class TailConfig(_Frozen):
    """Constants of the watermark computation (SPEC R2.3)."""

    min_tokens: int = Field(default=10000, ge=0)
    max_tokens: int = Field(default=20000, ge=0)
    min_text_block_messages: int = Field(default=5, ge=0)


class WriterConfig(_Frozen):
    """Checkpoint-writer scheduling and wait bounds (SPEC R3.2, A3)."""

    wait_with_watermark: float = Field(
        default=30.0, gt=0, description="Seconds a rebuild waits for a writer in flight (R3.2)."
    )
    wait_without_watermark: float = Field(
        default=300.0,
        gt=0,
        description="The same while no watermark is set yet: a writer a usage threshold "
        "started (here or on another worker) is waited for this long (R3.2).",
    )
    ensure_wait_auto: float = Field(
        default=180.0,
        gt=0,
        description="Seconds an automatic rebuild waits for the writer it starts itself "
        "when there is no checkpoint yet (A3).",
    )
    ensure_wait_manual: float = Field(
        default=300.0, gt=0, description="The same for a manual rebuild (A3)."
    )
    thresholds: tuple[int | float | str, ...] | None = Field(
        default=None,
        description="Writer start thresholds ('40%', '100K', '1.5M', numbers); None = A3 schedule.",
    )
    reserved: int = Field(default=13000, ge=0, description="Thresholds stay below usable - this.")
    lease_ttl: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds a worker's writer lease lives without renewal (several workers).",
    )
    run_timeout: float = Field(
        default=150.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds one checkpoint-writer run may take; past it the writer is "
        "cancelled, counts as failed and the fallback writer runs. Below ensure_wait_auto "
        "by default, so the fallback's checkpoint still arrives inside that wait.",
    )

    @field_validator("thresholds")
    @classmethod
    def _check_thresholds(
        cls, value: tuple[int | float | str, ...] | None
    ) -> tuple[int | float | str, ...] | None:
        if value is not None:
            for item in value:
                parse_token_amount(item, of=100)
        return value


class RebuildConfig(_Frozen):
    """Everything that tunes triggers, rendering and the writer (SPEC R9).

    Attributes:
        checkpoint_enabled: ``False`` turns checkpoints off: rebuilds fall back to a
            plain compaction (outcome ``checkpoint-off``, SPEC A3).
        trigger_ratio: Share of the effective window at which a rebuild fires (R1.2).
        max_context: Optional lower window: tokens, ``"300K"`` or ``"60%"`` (R1.2).
        push_caps: Section caps (R5.3).
        tail: Watermark constants (R2.3).
        writer: Writer thresholds and wait bounds (A3, R3.2).
        micro_compact_tools: Tools whose completed results a rebuild clears (R4.5):
            names and glob patterns (``"run_*"``), matched case-insensitively.
        micro_compact_exclude: Names and patterns never cleared, even when
            ``micro_compact_tools`` matches them (the stateful tools by default).
        micro_compact_keep: The newest this many clearable results of each agent
            stay uncleared (0: all are cleared, as in the original).
        micro_compact_placeholder: What a cleared result reads when sent. It is
            stored with the result when a rebuild clears it, so results cleared
            earlier keep the text they were sent with (cached prompts stay valid).
        recent_user_window: How many of the newest user messages of the whole main
            history section 4 reads (0 disables it), plus the pinned first request.
        activity_max_lines: Line limit of the recent-activity section (R7.2).
        activity_text_chars: Cut length of assistant text in the digest.
        activity_arg_chars: Cut length of each tool argument in the digest.
        total_cap: **beyond**: optional cap on the whole body, in tokens (R5.9).
        min_freed_fraction: **beyond**: when two consecutive rebuilds each free less
            than this share of the request, automatic rebuilds stop for the session.
        hook_timeout: Seconds a ``before_rebuild`` / ``after_rebuild`` hook may take;
            past it the hook is ignored (:mod:`mimo_ctx.hooks`).
        release_memory_after_rebuild: **beyond**: after a rebuild or compaction (when
            the old window's messages are dropped), hand the heap pages the C
            allocator keeps free back to the system, in a worker thread (glibc's
            ``malloc_trim``; nothing happens with other C libraries). Keeps a long
            session's resident size flat; skipped while the memory the allocator
            keeps resident with nothing in it grew by less than a sixteenth of the
            resident size since the last release (it would give back little for the
            same walk); ``False`` leaves the allocator alone.
        release_memory_interval: **beyond**: seconds that must pass since the
            process's last release before another starts (every middleware of the
            process shares the limit): on a large heap the call makes the threads
            allocating meanwhile wait (11-21 ms on a 2 GB heap with nothing to give back),
            so many sessions rebuilding do not call it again and again. A rebuild
            within the interval is not skipped: its release runs once the interval
            is over, one for all the rebuilds that asked meanwhile. ``0``: after
            every rebuild, one at a time.
    """

    checkpoint_enabled: bool = True
    trigger_ratio: float = Field(default=0.90, gt=0, le=1)
    max_context: int | str | None = None
    push_caps: PushCaps = Field(default_factory=PushCaps)
    tail: TailConfig = Field(default_factory=TailConfig)
    writer: WriterConfig = Field(default_factory=WriterConfig)
    micro_compact_tools: tuple[str, ...] = DEFAULT_MICRO_COMPACT_TOOLS
    micro_compact_exclude: tuple[str, ...] = DEFAULT_MICRO_COMPACT_EXCLUDE
    micro_compact_keep: int = Field(default=0, ge=0)
    micro_compact_placeholder: str = COMPACTED_PLACEHOLDER
    recent_user_window: int = Field(default=200, ge=0)
    activity_max_lines: int = Field(default=200, ge=0)
    activity_text_chars: int = Field(default=240, ge=2)
    activity_arg_chars: int = Field(default=80, ge=2)
    total_cap: int | None = Field(default=None, ge=0)
    min_freed_fraction: float = Field(default=0.10, ge=0, le=1)
    hook_timeout: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    release_memory_after_rebuild: bool = True
    release_memory_interval: float = Field(default=1.0, ge=0, allow_inf_nan=False)

    @field_validator("micro_compact_tools", "micro_compact_exclude")
    @classmethod
    def _check_tool_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if not pattern.strip():
                raise ValueError("expected tool names or glob patterns, got an empty one")
            if pattern.count("[") != pattern.count("]"):
                raise ValueError(f"unbalanced brackets in the glob pattern {pattern!r}")
        return value

    @field_validator("micro_compact_placeholder")
    @classmethod
    def _check_placeholder(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("expected a non-empty placeholder text")
        if len(value) > _PLACEHOLDER_CHARS:
            raise ValueError(f"expected at most {_PLACEHOLDER_CHARS} characters, got {len(value)}")
        return value

    @field_validator("max_context")
    @classmethod
    def _check_max_context(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            parse_token_amount(value, of=100)
        return value


ENV_PREFIX: Final = "MIMO_CTX_"
"""Environment variables ``MIMO_CTX_<KEY>`` set settings; nested keys join with ``__``."""

PYPROJECT_TABLE: Final = "tool.mimo-ctx"
"""The table of ``pyproject.toml`` that holds settings (``[tool.mimo-ctx]``)."""


def _describe(error: ValidationError, name: Callable[[tuple[str | int, ...]], str]) -> list[str]:
    """One line per bad key; ``name`` spells a key's location as its source does."""
    lines: list[str] = []
    for item in error.errors():
        key = name(tuple(item["loc"]))
        given = item.get("input")
        if item["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        else:
            lines.append(f"{key}: {item['msg']} (got {given!r})")
    return lines


def _invalid(lines: Sequence[str]) -> ConfigError:
    return ConfigError("invalid mimo_ctx configuration:\n  " + "\n  ".join(lines))


def _validated(table: Mapping[str, Any], name: Callable[[tuple[str | int, ...]], str]) -> None:
    """Validate one source on its own, so an error names the source it came from."""
    try:
        RebuildConfig.model_validate(table)
    except ValidationError as exc:
        raise _invalid(_describe(exc, name)) from exc


def _dotted(root: str) -> Callable[[tuple[str | int, ...]], str]:
    def name(loc: tuple[str | int, ...]) -> str:
        return ".".join([root, *map(str, loc)]) if loc else root

    return name


def _merge(base: dict[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """``layer`` over ``base``; nested tables (``push_caps``, ``tail``...) merge key by key."""
    merged = dict(base)
    for key, value in layer.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, dict):
            merged[key] = _merge(cast("dict[str, Any]", below), cast("Mapping[str, Any]", value))
        else:
            merged[key] = value
    return merged


def _read_file(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(raw.decode("utf-8"))
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc


def _source_table(source: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """The ``checkpoint`` table of a mapping or a JSON/TOML file, validated."""
    data = _read_file(Path(source)) if isinstance(source, str | Path) else source
    if not isinstance(data, Mapping):
        raise ConfigError("config must be a mapping with a 'checkpoint' table")
    table = cast("Mapping[str, Any]", data)
    unknown = sorted(set(table) - {"checkpoint"})
    if unknown:
        raise _invalid(
            [f"{unknown[0]}: unknown key (settings go under the top-level 'checkpoint' table)"]
        )
    settings = table.get("checkpoint", {})
    _validated(settings, _dotted("checkpoint"))
    return dict(settings)


def find_pyproject(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest ``pyproject.toml``: in ``start`` (default: the current directory) or above.

    Only the nearest one counts, as with other tools that read ``[tool.*]`` tables.
    """
    here = Path(start) if start is not None else Path.cwd()
    for directory in (here, *here.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _pyproject_table(path: Path) -> dict[str, Any]:
    """The ``[tool.mimo-ctx]`` table of a ``pyproject.toml`` (``{}`` without one), validated."""
    data: object = _read_file(path)
    tool: object = (
        cast("Mapping[str, object]", data).get("tool", {}) if isinstance(data, Mapping) else {}
    )
    table: object = (
        cast("Mapping[str, object]", tool).get("mimo-ctx", {}) if isinstance(tool, Mapping) else {}
    )
    if not isinstance(table, Mapping):
        raise _invalid([f"{path} [{PYPROJECT_TABLE}]: expected a table, got {table!r}"])
    settings = cast("Mapping[str, Any]", table)
    _validated(settings, _dotted(f"{path} [{PYPROJECT_TABLE}]"))
    return dict(settings)


@dataclass(frozen=True, slots=True)
class _EnvKey:
    path: tuple[str, ...]
    annotation: Any


def _env_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[str, _EnvKey]:
    """Every setting's variable name (``MIMO_CTX_PUSH_CAPS__MEMORY``) and where it goes."""
    keys: dict[str, _EnvKey] = {}
    for field_name, info in model.model_fields.items():
        path = (*prefix, info.alias or field_name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.update(_env_keys(annotation, path))
        else:
            keys[ENV_PREFIX + "__".join(path).upper()] = _EnvKey(path, annotation)
    return keys


def _env_value(text: str, annotation: Any) -> Any:
    """An environment variable's text as the value its setting takes.

    Lists (tool patterns, writer thresholds) are JSON lists or comma-separated;
    ``none`` (or nothing) clears a setting that may be unset; everything else is
    left as text for the setting's own validation (``"0.85"``, ``"300K"``, ``"true"``).
    """
    stripped = text.strip()
    args = get_args(annotation)
    optional = type(None) in args
    if optional and stripped.lower() in {"", "none", "null"}:
        return None
    if get_origin(annotation) is tuple or any(get_origin(a) is tuple for a in args):
        if stripped.startswith("["):
            try:
                return json.loads(stripped)
            except ValueError:
                return stripped  # the setting's validation names the variable
        return [item.strip() for item in stripped.split(",") if item.strip()]
    return text if annotation is str else stripped


def _env_table(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Settings from ``MIMO_CTX_*`` variables, and the variable each key came from.

    Variables that name no setting are not settings (``MIMO_CTX_PG_DSN`` of the
    test suite): they are left alone, unless the name is a letter or two away from
    a setting's or lies inside a nested table (``MIMO_CTX_PUSH_CAPS__...``): a typo
    is reported rather than silently ignored.
    """
    known = _env_keys(RebuildConfig)
    # A variable inside one of the nested tables (MIMO_CTX_PUSH_CAPS__...) is surely
    # meant as a setting: an unknown one there is an error.
    tables = tuple(
        {ENV_PREFIX + k.path[0].upper() + "__" for k in known.values() if len(k.path) > 1}
    )
    table: dict[str, Any] = {}
    names: dict[tuple[str, ...], str] = {}
    errors: list[str] = []
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX):
            continue
        key = known.get(variable)
        if key is None:
            close = get_close_matches(variable, list(known), n=1, cutoff=0.9)
            if close:
                errors.append(f"{variable}: unknown setting (did you mean {close[0]}?)")
            elif variable.startswith(tables):
                errors.append(f"{variable}: unknown setting")
            continue
        node = table
        for part in key.path[:-1]:
            node = node.setdefault(part, {})
        node[key.path[-1]] = _env_value(environ[variable], key.annotation)
        names[key.path] = variable
    if errors:
        raise _invalid(errors)

    def name(loc: tuple[str | int, ...]) -> str:
        path = tuple(str(p) for p in loc)
        for length in range(len(path), 0, -1):
            variable = names.get(path[:length])
            if variable is not None:
                rest = "".join(f"[{p}]" for p in path[length:])
                return f"{variable}{rest} ({'.'.join(path[:length])})"
        return ".".join(path)

    _validated(table, name)
    return table, names


def load_config(
    source: Mapping[str, Any] | str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> RebuildConfig:
    """Build a :class:`RebuildConfig` from every place settings are kept.

    One order of precedence, lowest first; a later source overrides single keys of
    an earlier one (nested tables merge key by key):

    1. the defaults (the SPEC's values);
    2. the ``[tool.mimo-ctx]`` table of the nearest ``pyproject.toml`` (``cwd`` or
       above), with the keys of the ``checkpoint`` table directly in it;
    3. ``source``: a mapping ``{"checkpoint": {...}}`` or a ``.json`` / ``.toml`` file
       of that shape (the original's schema, ``checkpoint.push_caps.memory``);
    4. ``MIMO_CTX_*`` environment variables: ``MIMO_CTX_TRIGGER_RATIO=0.85``, nested
       keys joined with ``__`` (``MIMO_CTX_PUSH_CAPS__MEMORY=8000``), lists as JSON
       or comma-separated (``MIMO_CTX_MICRO_COMPACT_TOOLS=read,run_*``).

    Args:
        source: An explicit mapping or settings file, or ``None``.
        environ: The environment to read (default ``os.environ``; ``{}`` for none).
        cwd: Where the search for ``pyproject.toml`` starts (default: the current
            directory).

    Raises:
        ConfigError: A file cannot be read or parsed, or a value is invalid. The
            message names every bad key as its source spells it (the file and table,
            or the environment variable) and what was expected.
    """
    merged: dict[str, Any] = {}
    pyproject = find_pyproject(cwd)
    if pyproject is not None:
        merged = _merge(merged, _pyproject_table(pyproject))
    if source is not None:
        merged = _merge(merged, _source_table(source))
    env, _ = _env_table(os.environ if environ is None else environ)
    merged = _merge(merged, env)
    try:
        return RebuildConfig.model_validate(merged)
    except ValidationError as exc:  # each source was valid on its own: a combination
        raise _invalid(_describe(exc, _dotted("checkpoint"))) from exc
