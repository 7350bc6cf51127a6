"""Evidence from tool calls: the files a call touches, the names it defines, commands,
commits, pushes, test runs and errors (see :mod:`mimo_ctx.checkpoint.evidence`).

Private: the public names are public from :mod:`mimo_ctx.checkpoint.evidence`.
Pure, synchronous.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, cast

__all__ = [
    "FileAction",
    "command_of",
    "commit_subject",
    "cut",
    "defined_names",
    "error_line",
    "file_actions",
    "passing_test_run",
    "pushed_branch",
    "signature",
    "tool_key",
]

FileAction = Literal["created", "edited", "read"]


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters at a word boundary, with ``…``."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    if space >= limit * 2 // 3:
        head = head[:space]
    return head.rstrip(" ,;:") + "…"


# -- tool calls --------------------------------------------------------------------------------

_PATH_KEYS: Final = ("file_path", "filePath", "path", "filename", "notebook_path", "file")
_CREATE_TOOLS: Final = frozenset({"write", "create", "create_file", "write_file", "writefile"})
_EDIT_TOOLS: Final = frozenset(
    {
        "edit", "multiedit", "str_replace", "str_replace_editor", "apply_patch", "patch",
        "notebookedit", "edit_file", "replace", "insert", "search_replace",
    }
)  # fmt: skip
_READ_TOOLS: Final = frozenset({"read", "view", "cat", "open", "read_file", "view_file"})
_PATCH_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+?)\s*$", re.MULTILINE)


def tool_key(tool: str) -> str:
    """A tool name as the rules compare it: lower case, ``_`` for ``-``, no namespace."""
    return tool.strip().lower().replace("-", "_").rsplit(".", 1)[-1]


def file_actions(tool: str, arguments: Mapping[str, Any]) -> list[tuple[str, FileAction]]:
    """The files a call touches and how (module rules); ``[]`` for other calls."""
    key = tool_key(tool)
    if key in {"apply_patch", "patch"}:
        patch = next((v for v in arguments.values() if isinstance(v, str) and "***" in v), "")
        found: list[tuple[str, FileAction]] = []
        for verb, path in _PATCH_FILE.findall(patch):
            found.append((path, "created" if verb == "Add" else "edited"))
        if found:
            return found
    command = arguments.get("command")
    if key == "str_replace_based_edit_tool":
        key = {"create": "create", "view": "view"}.get(str(command), "edit")
    if key in _CREATE_TOOLS:
        action: FileAction = "created"
    elif key in _EDIT_TOOLS:
        action = "edited"
    elif key in _READ_TOOLS:
        action = "read"
    else:
        return []
    for name in _PATH_KEYS:
        value = arguments.get(name)
        if isinstance(value, str) and value.strip() and len(value) < 1000 and "\n" not in value:
            return [(value.strip(), action)]
    return []


_DEFINITION = re.compile(
    r"^[ \t]*(?:export[ \t]+)?(?:default[ \t]+)?(?:pub(?:\([\w:]+\))?[ \t]+)?(?:async[ \t]+)?"
    r"(?:def|defp|defmodule|defmacro|defmacrop|defstruct|defimpl|defprotocol|class|function"
    r"|func|fn|interface|struct|enum|trait|type|module|impl|object|record)[ \t]+"
    r"(?:\([^)]*\)[ \t]*)?"  # a Go method's receiver
    r"([A-Za-z_$][\w.$!?]*)"
    r"|^[ \t]*(?:export[ \t]+)?const[ \t]+([A-Za-z_$][\w$]*)[ \t]*=[ \t]*(?:async[ \t]*)?"
    r"(?:\([^)\n]*\)[ \t]*=>|function\b)"  # const f = (…) => / function
    r"|^[ \t]*(?:function[ \t]+)?([A-Za-z_][\w-]*)[ \t]*\(\)[ \t]*\{",  # a shell function
    re.MULTILINE,
)
_NEW_TEXT_KEYS: Final = ("new_string", "new_str", "content", "file_text", "new_source", "code")
_OLD_TEXT_KEYS: Final = ("old_string", "old_str")
MAX_DEFINED: Final = 6


def _defined(match: re.Match[str]) -> str:
    return next(g for g in match.groups() if g is not None)


def defined_names(arguments: Mapping[str, Any]) -> list[str]:
    """Names a file-changing call defines that the text it replaces did not.

    A definition is a line that starts (after ``export``/``pub``/``async``) with a
    definition keyword of a common language — ``def``, ``defp``, ``defmodule``,
    ``defmacro``, ``class``, ``function``, ``func``, ``fn``, ``interface``,
    ``struct``, ``enum``, ``trait``, ``type``, ``module``, ``impl`` … — and the name
    after it; or ``const name = (…) =>`` / ``= function``; or a shell function
    ``name() {``. The new text is the call's ``new_string``/``new_str``/``content``/
    ``file_text`` (each ``edits`` item's too, or a patch's ``+`` lines); the old
    text its ``old_string``/``old_str`` (or the patch's ``-`` lines). At most
    :data:`MAX_DEFINED`, first-defined first.
    """
    new: list[str] = []
    old: list[str] = []
    pieces: list[Mapping[str, Any]] = [arguments]
    edits = arguments.get("edits")
    if isinstance(edits, list):
        items = cast("list[object]", edits)
        pieces += [cast("dict[str, Any]", e) for e in items if isinstance(e, dict)]
    for piece in pieces:
        new += [v for k in _NEW_TEXT_KEYS if isinstance(v := piece.get(k), str)]
        old += [v for k in _OLD_TEXT_KEYS if isinstance(v := piece.get(k), str)]
    patch = next((v for v in arguments.values() if isinstance(v, str) and "*** " in v), None)
    if patch is not None and not new:
        lines = patch.splitlines()
        new.append("\n".join(line[1:] for line in lines if line.startswith("+")))
        old.append("\n".join(line[1:] for line in lines if line.startswith("-")))
    before = {_defined(m) for text in old for m in _DEFINITION.finditer(text)}
    found: dict[str, None] = {}
    for text in new:
        for match in _DEFINITION.finditer(text):
            name = _defined(match).rstrip(".")
            if name and name not in before and len(name) <= 80:
                found.setdefault(name, None)
                if len(found) >= MAX_DEFINED:
                    return list(found)
    return list(found)


_SHELL_TOOLS: Final = frozenset(
    {"bash", "shell", "exec_command", "run_terminal_cmd", "execute_command", "terminal", "run"}
)


def command_of(tool: str, arguments: Mapping[str, Any]) -> str | None:
    """The shell command of a shell call (module rules), else ``None``."""
    if tool_key(tool) not in _SHELL_TOOLS:
        return None
    for name in ("command", "cmd", "script"):
        value = arguments.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, list):
            words = [w for w in cast("list[object]", value) if isinstance(w, str)]
            if not words or len(words) != len(cast("list[object]", value)):
                continue
            # Codex passes ["bash", "-lc", "<script>"]: the script is the command.
            if len(words) >= 3 and words[1] in {"-c", "-lc"}:
                return words[2].strip()
            return " ".join(words)
    return None


_SUBCOMMAND_TOOLS: Final = frozenset(
    {
        "git", "npm", "yarn", "pnpm", "bun", "mix", "cargo", "go", "docker", "kubectl",
        "make", "gh", "bd", "uv", "poetry", "pip", "dotnet", "gradle", "mvn", "rails",
        "bundle", "deno", "terraform", "helm", "brew", "apt", "apt-get", "npx", "rake",
    }
)  # fmt: skip
_ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")


def _command_head(command: str) -> str:
    first = command.strip().splitlines()[0] if command.strip() else ""
    # In "a && b" the last command is the one that matters (git add && git commit,
    # mix compile && mix test); in "a | tail" the first.
    segments = [s for s in re.split(r"&&|;|\|\|", first) if s.strip()]
    kept = [s for s in segments if not s.strip().startswith(("cd ", "echo ", "export "))]
    first = (kept or segments or [first])[-1].split("|")[0].strip()
    first = _ENV_PREFIX.sub("", first)
    words = first.split()
    if not words:
        return ""
    if words[0] in {"sudo", "time", "env"} and len(words) > 1:
        words = words[1:]
    if words[0] in {"python", "python3", "uv"} and len(words) > 2 and words[1] in {"-m", "run"}:
        return " ".join(words[:3])
    if words[0] in _SUBCOMMAND_TOOLS and len(words) > 1 and not words[1].startswith("-"):
        return f"{words[0]} {words[1]}"
    return words[0]


def signature(tool: str, arguments: Mapping[str, Any]) -> str:
    """The key that matches a failed call with the later call that fixed it."""
    command = command_of(tool, arguments)
    if command is not None:
        return f"$ {_command_head(command)}"
    files = file_actions(tool, arguments)
    if files:
        path, action = files[0]
        kind = "read" if action == "read" else "write"
        return f"{kind} {path}"
    return tool_key(tool)


_COMMIT = re.compile(r"\bgit\b[^|;&]*\bcommit\b")
_COMMIT_OUTPUT = re.compile(r"^\[([^\]\s]+)(?: \([^)]*\))? ([0-9a-f]{7,40})\] (.+)$", re.MULTILINE)
_COMMIT_MESSAGE = re.compile(
    r"""-m\s+(?:"\$\(cat <<'?"?EOF'?"?\s*\n(.*?)\n|"([^"]+)"|'([^']+)')""", re.S
)
_PUSH = re.compile(r"\bgit\b[^|;&]*\bpush\b")
_PUSH_OUTPUT = re.compile(r"^\s+[0-9a-f]+\.\.[0-9a-f]+\s+(\S+)\s+->\s+(\S+)", re.MULTILINE)
_NEW_BRANCH = re.compile(r"\[new branch\]\s+(\S+)\s+->\s+(\S+)")


def commit_subject(command: str, output: str) -> str | None:
    """``<hash> <subject>`` of a successful ``git commit`` call, else ``None``."""
    if not _COMMIT.search(command):
        return None
    found = _COMMIT_OUTPUT.search(output)
    if found is not None:
        return f"{found.group(2)} {cut(found.group(3).strip(), 160)}"
    message = _COMMIT_MESSAGE.search(command)
    if message is None:
        return None
    text = next(g for g in message.groups() if g is not None)
    subject = text.strip().splitlines()[0] if text.strip() else ""
    return cut(subject, 160) if subject else None


def pushed_branch(command: str, output: str) -> str | None:
    """The branch a successful ``git push`` call pushed (``"branch"`` when unknown)."""
    if not _PUSH.search(command):
        return None
    found = _PUSH_OUTPUT.search(output) or _NEW_BRANCH.search(output)
    if found is not None:
        return found.group(2)
    words = command.split()
    if "push" not in words:
        return "branch"
    tail = [w for w in words[words.index("push") + 1 :] if not w.startswith("-")]
    return tail[-1] if len(tail) >= 2 else "branch"


_TEST_RUNNER = re.compile(
    r"\b(?:pytest|py\.test|mix test|npm (?:run )?test|yarn test|pnpm test|bun test|cargo test"
    r"|go test|jest|vitest|mocha|rspec|phpunit|tox|nox|make test|dotnet test|gradlew? test"
    r"|mvn test|ctest|deno test|unittest|swift test|rake test|ava)\b"
)
_TEST_SUMMARY = re.compile(
    r"\b\d+\s+(?:tests?|examples?|specs?|passed|passing|failures?|failed|doctests?|properties)\b",
    re.IGNORECASE,
)


def passing_test_run(command: str, output: str) -> tuple[str, str] | None:
    """``(runner, summary line)`` of a test run whose output has a summary line."""
    runner = _TEST_RUNNER.search(command)
    if runner is None:
        return None
    for raw in reversed(output.splitlines()):
        line = " ".join(raw.replace("=", " ").split())
        if _TEST_SUMMARY.search(line) and len(line) <= 200:
            return runner.group(0), line
    return None


_ERROR_WORDS: Final = (
    re.compile(r"\berror\b|exception|fatal|traceback", re.IGNORECASE),
    re.compile(
        r"failed|failure|not found|cannot|can't|undefined|denied|invalid|missing|refused"
        r"|no such",
        re.IGNORECASE,
    ),
)
_EXIT_CODE = re.compile(r"^\s*Exit code \d+\s*$", re.IGNORECASE)
_TAG = re.compile(r"</?[a-z_]+>")


def error_line(error: str, limit: int = 200) -> str:
    """The line of an error output that says what went wrong, cut near ``limit``."""
    # Hook output often arrives with its line breaks escaped ("failed:\\n\\n[FORMAT]").
    lines = [_TAG.sub("", line).strip() for line in error.replace("\\n", "\n").splitlines()]
    lines = [line for line in lines if line and not _EXIT_CODE.match(line)]
    if not lines:
        return cut(" ".join(error.split()), limit) or "(no message)"
    # The first line usually says it ("String to replace not found in file."); else the
    # first line with an error word, strong words first (code quoted after the first
    # line mentions "error" too).
    at = 0
    if not any(words.search(lines[0]) for words in _ERROR_WORDS):
        at = next(
            (i for words in _ERROR_WORDS for i, line in enumerate(lines) if words.search(line)), 0
        )
    chosen = lines[at]
    after = at + 1
    if chosen.endswith(":") and at + 1 < len(lines):
        chosen = f"{chosen} {lines[at + 1]}"  # "…the following issue:" says what next
        after += 1
    if _thin(chosen):
        # "Pre-commit validation failed: [DIALYZER]" names the checker, not the
        # finding: the finding sits at the first source location further down.
        detail = _located_finding(lines, after)
        if detail:
            chosen = f"{chosen} — {detail}"
            limit += limit // 2
    return cut(" ".join(chosen.split()), limit)


_LOCATION = re.compile(r"[\w./-]+\.\w{1,6}:\d+")
_BOX = re.compile(r"^[\s┃│|>*•-]+")
_THIN_WORDS: Final = 6
_SCAN_LINES: Final = 400


def _thin(line: str) -> bool:
    return len(line.split()) < _THIN_WORDS or line.rstrip().endswith((":", "]"))


def _located_finding(lines: Sequence[str], start: int) -> str:
    """The first ``file.ext:N`` line after ``start`` with the line that explains it."""
    for i in range(start, min(len(lines), start + _SCAN_LINES)):
        if not _LOCATION.search(lines[i]):
            continue
        here = _BOX.sub("", lines[i])
        before = _BOX.sub("", lines[i - 1]) if i - 1 >= start else ""
        following = _BOX.sub("", lines[i + 1]) if i + 1 < len(lines) else ""
        # The explanation is the wordier neighbour (Credo puts it before the
        # location, Dialyzer after).
        said = before if len(before.split()) >= 4 else following
        return f"{said} {here}" if said is before and said else f"{here} {said}".strip()
    return ""
