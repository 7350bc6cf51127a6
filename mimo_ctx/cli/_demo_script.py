"""The scripted session of ``mimo-ctx demo``: a coding agent fixing a bug in ``confkit``.

One user request, about forty tool rounds (``read``/``grep``/``bash``/``edit``
with outputs of one to three thousand tokens, generated deterministically), a
follow-up, a sub-agent slice, and the memory files the session starts with.
"""

from __future__ import annotations

from mimo_ctx.testing import ScriptStep

__all__ = [
    "GLOBAL_MEMORY",
    "NOTES",
    "NOTES_LATER",
    "PROJECT",
    "PROJECT_MEMORY",
    "SUBAGENT",
    "SYSTEM_PROMPT",
    "USER_FOLLOW_UP",
    "USER_REQUEST",
    "demo_script",
    "subagent_script",
]

PROJECT = "confkit"
SUBAGENT = "explore-1"

SYSTEM_PROMPT = (
    "You are a careful coding agent working in the confkit repository. Read before you "
    "edit, run the tests after every change, and keep the user's instructions."
)

USER_REQUEST = (
    "confkit crashes with a KeyError when a config file is empty (`confkit load "
    "empty.toml`). Please find the cause, fix it in the loader, and add a regression "
    "test. Don't change the public signature of `load_config`; other teams import it."
)
USER_FOLLOW_UP = (
    "One more thing: the fix must also cover files that only contain comments. "
    "And please keep the error message for missing files exactly as it is today."
)

PROJECT_MEMORY = """# Project memory

## Project context
- confkit: a small library that loads layered TOML/env configuration.
- Entry point: `confkit.load_config(path, *, env=None)`; CLI `confkit load FILE`.

## Rules
- Public signatures are frozen between minor releases.
- Every bug fix comes with a regression test under tests/regressions/.

## Architecture decisions
- Sources are merged in order: defaults < file < environment.
- Parsing lives in loader.py; validation lives in schema.py.

## Discovered durable knowledge
- `tomllib.loads("")` returns an empty dict; the crash is ours, not the parser's.
"""

GLOBAL_MEMORY = """# Global memory

## Preferences
- Small, reviewable commits; one topic each.
- Explain a fix in one paragraph before the diff.
"""

NOTES = """Session notes
- Started from the bug report in issue #482 (empty files).
- The user wants the public API unchanged.
"""

NOTES_LATER = """Session notes
- merge.py and schema.py both assume every layer has a [section]; fix both.
- Comments-only files take the same path as empty ones (tomllib returns {}).
"""

_FILES = (
    "src/confkit/loader.py",
    "src/confkit/schema.py",
    "src/confkit/sources/env.py",
    "src/confkit/sources/file.py",
    "src/confkit/merge.py",
    "tests/test_loader.py",
    "tests/test_schema.py",
    "src/confkit/cli.py",
)
_NAMES = (
    "load_config",
    "merge_layers",
    "read_source",
    "validate",
    "section",
    "defaults",
    "env_prefix",
    "coerce",
    "resolve_path",
    "apply_schema",
)


def _code(path: str, tokens: int, seed: int) -> str:
    """Deterministic source-looking text of about ``tokens`` tokens."""
    lines: list[str] = []
    size = 0
    n = 0
    while size < tokens * 4:
        name = _NAMES[(seed + n) % len(_NAMES)]
        other = _NAMES[(seed * 3 + n * 7) % len(_NAMES)]
        if n % 6 == 0:
            line = (
                f"{n + 1:5d}\tdef {name}(data: dict[str, object], *, strict: bool = True) -> dict:"
            )
        elif n % 6 == 1:
            line = f'{n + 1:5d}\t    """Return {name} applied to every section of {path}."""'
        elif n % 6 == 2:
            line = f"{n + 1:5d}\t    result = {other}(data.get('{name}', {{}}), strict=strict)"
        elif n % 6 == 3:
            line = f"{n + 1:5d}\t    if not result:  # an empty layer still needs its keys"
        elif n % 6 == 4:
            line = f"{n + 1:5d}\t        raise KeyError('{name}')"
        else:
            line = f"{n + 1:5d}\t    return {{**defaults(), **result}}"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines)


def _grep(pattern: str, tokens: int, seed: int) -> str:
    lines: list[str] = []
    size = 0
    n = 0
    while size < tokens * 4:
        path = _FILES[(seed + n) % len(_FILES)]
        line = f"{path}:{(seed * 17 + n * 13) % 400 + 1}:    value = {pattern}(layer, strict=True)"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines)


def _pytest(tokens: int, seed: int, *, failing: bool) -> str:
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.12.3, pytest-8.3.2",
        "collected 148 items",
        "",
    ]
    size = sum(len(x) + 1 for x in lines)
    n = 0
    while size < tokens * 4:
        test = f"tests/test_{_NAMES[(seed + n) % len(_NAMES)]}.py::test_case_{n}"
        status = "FAILED" if failing and n % 9 == 4 else "PASSED"
        line = f"{test} {status} [{min(99, n)}%]"
        lines.append(line)
        size += len(line) + 1
        n += 1
    if failing:
        lines.append("E   KeyError: 'section'  (src/confkit/loader.py:88 in merge_layers)")
        lines.append("==================== 3 failed, 145 passed in 2.31s ====================")
    else:
        lines.append("==================== 148 passed in 2.18s ====================")
    return "\n".join(lines)


def _read(path: str, tokens: int, seed: int, text: str | None = None) -> ScriptStep:
    return ScriptStep(
        text=text, tool="read", input={"file_path": path}, output=_code(path, tokens, seed)
    )


def demo_script() -> list[ScriptStep]:
    """The main agent's answers: ~40 tool rounds, a sub-agent request, a final answer."""
    steps: list[ScriptStep] = [
        _read("src/confkit/loader.py", 2600, 1, "I'll start with the loader, where the crash is."),
        ScriptStep(
            tool="bash",
            input={"command": "confkit load tests/data/empty.toml"},
            output="Traceback (most recent call last):\n"
            + _code("src/confkit/loader.py", 400, 2)
            + "\nKeyError: 'section'",
        ),
        ScriptStep(
            tool="grep",
            input={"pattern": "merge_layers", "path": "src"},
            output=_grep("merge_layers", 1200, 3),
        ),
        _read("src/confkit/merge.py", 2400, 4),
        _read("src/confkit/schema.py", 2800, 5, "The merge assumes every layer has sections."),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -x -q"},
            output=_pytest(1800, 6, failing=True),
        ),
        _read("src/confkit/sources/file.py", 2200, 7),
        ScriptStep(
            tool="grep",
            input={"pattern": "KeyError", "path": "src"},
            output=_grep("KeyError", 900, 8),
        ),
        _read("tests/test_loader.py", 2500, 9),
        ScriptStep(
            text="Reproduced. Now a failing regression test first.",
            tool="write",
            input={"file_path": "tests/regressions/test_empty_file.py"},
            output="Wrote 34 lines to tests/regressions/test_empty_file.py",
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests/regressions -q"},
            output=_pytest(1500, 11, failing=True),
        ),
        _read("src/confkit/sources/env.py", 2000, 12),
        # -- the user adds a requirement here (see run_demo) --
        ScriptStep(
            text="Comments-only files parse to an empty dict too; same code path.",
            tool="grep",
            input={"pattern": "tomllib.loads", "path": "src"},
            output=_grep("tomllib.loads", 1100, 13),
        ),
        _read("src/confkit/loader.py", 2700, 14),
        ScriptStep(
            tool="edit",
            input={"file_path": "src/confkit/loader.py", "old": "layer['section']"},
            output=_code("src/confkit/loader.py", 700, 15),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2000, 16, failing=True),
        ),
        _read("src/confkit/schema.py", 2600, 17),
        ScriptStep(
            text="Let me have a sub-agent survey every caller of merge_layers.",
            subtask="Survey all callers of merge_layers and how they treat empty layers",
        ),
        ScriptStep(
            tool="grep",
            input={"pattern": "def merge_layers", "path": "."},
            output=_grep("merge_layers", 800, 19),
        ),
        _read("src/confkit/cli.py", 2300, 20),
        ScriptStep(
            tool="edit",
            input={"file_path": "src/confkit/merge.py", "old": "for name in layer"},
            output=_code("src/confkit/merge.py", 800, 21),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2200, 22, failing=True),
        ),
        _read("src/confkit/merge.py", 2500, 23),
        ScriptStep(
            tool="grep",
            input={"pattern": "raise KeyError", "path": "src"},
            output=_grep("raise KeyError", 1000, 24),
        ),
        _read("tests/test_schema.py", 2400, 25),
        ScriptStep(
            tool="edit",
            input={"file_path": "src/confkit/schema.py", "old": "raise KeyError(name)"},
            output=_code("src/confkit/schema.py", 600, 26),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2100, 27, failing=False),
        ),
        _read("src/confkit/loader.py", 2600, 28, "Tests pass; checking the missing-file message."),
        ScriptStep(
            tool="grep",
            input={"pattern": "FileNotFoundError", "path": "src"},
            output=_grep("FileNotFoundError", 900, 29),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "confkit load missing.toml"},
            output="error: config file not found: missing.toml",
        ),
        _read("src/confkit/sources/file.py", 2300, 31),
        ScriptStep(
            tool="write",
            input={"file_path": "tests/data/comments_only.toml"},
            output="Wrote 4 lines to tests/data/comments_only.toml",
        ),
        ScriptStep(
            tool="edit",
            input={"file_path": "tests/regressions/test_empty_file.py", "old": "def test_empty"},
            output=_code("tests/regressions/test_empty_file.py", 500, 33),
        ),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2300, 34, failing=False),
        ),
        _read("src/confkit/merge.py", 2400, 35),
        ScriptStep(
            tool="grep",
            input={"pattern": "load_config(", "path": "."},
            output=_grep("load_config", 1200, 36),
        ),
        _read("src/confkit/schema.py", 2200, 37),
        ScriptStep(
            tool="bash",
            input={"command": "ruff check src tests && pyright src"},
            output="All checks passed!\n0 errors, 0 warnings, 0 informations",
        ),
        _read("tests/test_loader.py", 2500, 39),
        ScriptStep(
            tool="bash",
            input={"command": "pytest tests -q"},
            output=_pytest(2400, 40, failing=False),
        ),
        _read("src/confkit/loader.py", 2000, 41),
        ScriptStep(
            text=(
                "Fixed: empty and comments-only files now load as empty layers "
                "(merge.py and schema.py no longer assume a section exists). "
                "`load_config` keeps its signature, the missing-file message is "
                "unchanged, and tests/regressions/test_empty_file.py covers both cases."
            )
        ),
    ]
    return steps


def subagent_script() -> list[ScriptStep]:
    return [
        ScriptStep(
            tool="grep",
            input={"pattern": "merge_layers(", "path": "."},
            output=_grep("merge_layers", 1500, 50),
        ),
        _read("src/confkit/cli.py", 1800, 51),
        ScriptStep(
            text=(
                "merge_layers has 3 callers (loader.load_config, cli.main, "
                "sources.file.read_source); none guards against an empty layer."
            )
        ),
    ]
