"""Rebuild quality: mimo_ctx's boundary body against Claude Code's own summary (issue 14).

For every shared Claude Code transcript (``MIMO_CTX_TRANSCRIPTS``) that holds its
own compaction records (``isCompactSummary``), at each such point:

1. the history before it is replayed through the middleware turn by turn, as
   ``mimo-ctx replay`` does (:func:`mimo_ctx.replay.replay_transcript` with
   ``rebuild_at``: the default offline checkpoint writer runs at its usage
   thresholds, the transcript's own usage is used), and a manual rebuild
   (``/rebuild``) runs exactly where Claude Code compacted; window 200,000
   tokens (the window Claude Code compacted in);
2. the boundary body that rebuild inserted and Claude Code's summary at that
   point are scored with the same probes, extracted from the raw transcript
   file by code that does not go through the importer
   (:mod:`mimo_ctx.typed_input` for typed text; this module's own readers for
   tool calls and results).

**What "body" measures.** The boundary message as it is sent (SPEC R8.1 (2)):
the checkpoint header line, the ``## Checkpoint`` index part, the rebuild body
(every section) and the ``## Active Actors`` part, joined by newlines. The
*live tail* is everything else in the request prepared right after the rebuild
(the tail's user messages kept verbatim, tool rounds after the watermark that
stay live), measured the same way; the system prompt is not counted (the
transcripts do not record one). Claude Code's summary is the text of its
``isCompactSummary`` user line (its "This session is being continued…" preamble
included). Tokens are exact ``o200k_base`` counts
(:class:`~mimo_ctx.tokens.TiktokenCounter`) for both sides; Claude's own
tokenizer differs, the ratio between the two texts hardly does. Live message ids
(random tails) and the temporary memory folder in our text are replaced by fixed
text of the same length before counting, so every run gives the same sizes.

**Probes** (all from the transcript's main file, records before the compaction
line; *text* is the body, the whole rebuilt request, or the summary; matching is
:func:`mimo_ctx.typed_input.run_share`, whitespace- and quote-insensitive):

(a) *user words*: everything the user typed before the point
    (:func:`~mimo_ctx.typed_input.typed_inputs`), newest first up to 16,000
    tokens (4 characters a token); the share of its 8-word runs found verbatim
    (a text shorter than 8 words is one run that must appear whole).
(b) *first request*: the first typed text that is substantive — it has a word
    (lower-cased, without ``.,!?;:``) outside :data:`ACKNOWLEDGEMENTS` and is not
    a bare slash command; the share of its 8-word runs found.
(c) *latest instruction*: the newest typed text before the point; the share of
    its 8-word runs found.
(d) *files changed*: the distinct ``file_path`` / ``notebook_path`` of every
    ``Edit``, ``Write``, ``MultiEdit`` and ``NotebookEdit`` call of the main
    chain; the share whose file name (the last path component) occurs in the text.
(e) *plan items*: the ``content`` of each item of the newest ``TodoWrite``
    call; the share of items found whole (every word, consecutively; *loosely*:
    case-insensitive, ``.,!?;:()[]`` at a word's ends ignored on both sides, a
    literal ``\\n`` in the text read as a space).
(f) *newest unresolved error*: the newest ``tool_result`` with ``is_error`` of
    the main chain (a rejected or interrupted call is not an error) that no
    later successful call *of the same thing* resolved — same tool and same
    ``file_path`` / ``notebook_path`` / ``path``, or for ``Bash`` the same first
    two words of the command, else the same input. Its key is the first line of
    its text (literal ``\\n`` read as a line break, ``<tool_use_error>`` tags
    dropped) that names a failure (:data:`ERROR_LINE`), else its first line
    that is not ``Exit code N``; the key's first 8 words must be found
    consecutively, loosely as in (e): 1 or 0.

Each rebuilt request is also converted to an OpenAI chat and an Anthropic Messages
payload and checked with :func:`~mimo_ctx.providers.validate.validate_request`, and
its estimated size is compared with the trigger line.

A probe with nothing to look for (no edits, no ``TodoWrite``, no unresolved
error) is ``n/a``. Every probe is exact and deterministic: the same files give
the same figures.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import anyio

from mimo_ctx.errors import InvalidRequestError
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import Message, TextPart
from mimo_ctx.providers.anthropic import to_anthropic
from mimo_ctx.providers.openai import to_openai_chat
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.replay import replay_transcript, request_text, stable_ids
from mimo_ctx.tokens import TiktokenCounter
from mimo_ctx.typed_input import TypedInput, newest_words, run_share, typed_inputs, words

from ._common import Target, result, table, transcripts_dir

__all__ = [
    "ACKNOWLEDGEMENTS",
    "ERROR_LINE",
    "NAME",
    "PROBES",
    "TITLE",
    "WINDOW",
    "Probes",
    "compaction_points",
    "extract_probes",
    "run",
    "score",
    "synthetic_claude_code",
]

NAME = "quality"
TITLE = "Rebuild quality at Claude Code's own compaction points: mimo_ctx vs Claude Code"

WINDOW: Final = 200_000
USER_WORDS_TOKENS: Final = 16_000
PROBES: Final = (
    "(a) user words",
    "(b) first request",
    "(c) latest instruction",
    "(d) files changed",
    "(e) plan items",
    "(f) unresolved error",
)
ACKNOWLEDGEMENTS: Final = frozenset(
    {
        "again",
        "and",
        "carry",
        "check",
        "continue",
        "cool",
        "do",
        "done",
        "fine",
        "go",
        "going",
        "good",
        "great",
        "it",
        "keep",
        "lgtm",
        "next",
        "nice",
        "now",
        "ok",
        "okay",
        "on",
        "please",
        "proceed",
        "so",
        "sure",
        "thank",
        "thanks",
        "that",
        "y",
        "yes",
        "you",
    }
)
"""Words that alone do not make a request substantive (probe (b))."""
ERROR_LINE: Final = re.compile(
    r"(?i)\b(error|errors|fail|failed|failure|failures|fatal|exception|traceback|denied|"
    r"cannot|invalid|not found)\b"
)
"""A line of an error result that names the failure (probe (f))."""

_EDIT_TOOLS: Final = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
_PATH_KEYS: Final = ("file_path", "notebook_path", "path")
_NOT_ERRORS: Final = ("The user doesn't want to proceed", "[Request interrupted by user")
_EXIT_CODE: Final = re.compile(r"^\s*Exit code \d+\s*$")
_PUNCT: Final = ".,!?;:"
_LOOSE_PUNCT: Final = ".,!?;:()[]"


# --------------------------------------------------------------------------- raw records


def _records(data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield number, cast("dict[str, Any]", value)


def _blocks(record: dict[str, Any]) -> list[dict[str, Any]]:
    message = record.get("message")
    content = cast("dict[str, Any]", message).get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [cast("dict[str, Any]", b) for b in cast("list[object]", content) if isinstance(b, dict)]


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            str(cast("dict[str, Any]", item).get("text", ""))
            for item in cast("list[object]", content)
            if isinstance(item, dict)
        ]
        return "\n".join(parts)
    return ""


@dataclass(frozen=True, slots=True)
class CompactionPoint:
    """One ``isCompactSummary`` line of a transcript's main file."""

    line: int
    summary: str


def compaction_points(data: bytes) -> list[CompactionPoint]:
    """The main chain's ``isCompactSummary`` lines and their summary text, in file order."""
    points: list[CompactionPoint] = []
    for number, record in _records(data):
        if record.get("isCompactSummary") and not record.get("isSidechain"):
            message = record.get("message")
            content = (
                cast("dict[str, Any]", message).get("content")
                if isinstance(message, dict)
                else None
            )
            if isinstance(content, str):
                text = content
            else:
                text = "\n".join(
                    str(b.get("text", "")) for b in _blocks(record) if b.get("type") == "text"
                )
            points.append(CompactionPoint(number, text))
    return points


@dataclass(frozen=True, slots=True)
class Probes:
    """What the probes look for at one point (see the module docs).

    Attributes:
        user_words: Word lists of the newest typed texts (probe (a)).
        first_request: The first substantive typed text, if any.
        latest_instruction: The newest typed text, if any.
        files_changed: Distinct paths edited or written.
        plan_items: Items of the newest ``TodoWrite``.
        unresolved_error: Key words of the newest unresolved error, if any.
    """

    user_words: list[list[str]]
    first_request: str | None
    latest_instruction: str | None
    files_changed: list[str]
    plan_items: list[str]
    unresolved_error: list[str] | None


def _substantive(text: str) -> bool:
    ws = text.split()
    if len(ws) == 1 and ws[0].startswith("/"):
        return False
    return any(w.casefold().strip(_PUNCT) not in ACKNOWLEDGEMENTS for w in ws if w.strip(_PUNCT))


def _identity(name: str, arguments: dict[str, Any]) -> str:
    for key in _PATH_KEYS:
        value = arguments.get(key)
        if isinstance(value, str):
            return f"{name}:{value}"
    command = arguments.get("command")
    if name == "Bash" and isinstance(command, str):
        return "Bash:" + " ".join(command.split()[:2])
    return f"{name}:{json.dumps(arguments, sort_keys=True)}"


def _error_key(text: str) -> list[str]:
    text = (
        text.replace("\\n", "\n").replace("<tool_use_error>", "").replace("</tool_use_error>", "")
    )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = next((line for line in lines if ERROR_LINE.search(line)), None)
    if named is None:
        named = next((line for line in lines if not _EXIT_CODE.match(line)), "")
    return words(named)[:8]


def extract_probes(data: bytes, before_line: int, typed: Sequence[TypedInput]) -> Probes:
    """The probes of the records before ``before_line`` of a Claude Code main file."""
    said = [t.text for t in typed if t.line is not None and t.line < before_line]
    first = next((t for t in said if _substantive(t)), None)
    calls: dict[str, tuple[str, str]] = {}
    files: dict[str, None] = {}
    todos: list[str] = []
    outcomes: list[tuple[str, bool, str]] = []  # (identity, is_error, text)
    for number, record in _records(data):
        if number >= before_line:
            break
        if record.get("isSidechain"):
            continue
        for block in _blocks(record):
            kind = block.get("type")
            if kind == "tool_use" and record.get("type") == "assistant":
                name = str(block.get("name", ""))
                raw_input = block.get("input")
                arguments = cast("dict[str, Any]", raw_input) if isinstance(raw_input, dict) else {}
                calls[str(block.get("id", ""))] = (name, _identity(name, arguments))
                if name in _EDIT_TOOLS:
                    path = arguments.get("file_path", arguments.get("notebook_path"))
                    if isinstance(path, str) and path:
                        files[path] = None
                if name == "TodoWrite":
                    items = arguments.get("todos")
                    if isinstance(items, list):
                        todos = [
                            str(cast("dict[str, Any]", item).get("content", ""))
                            for item in cast("list[object]", items)
                            if isinstance(item, dict)
                        ]
            elif kind == "tool_result" and record.get("type") == "user":
                call = calls.get(str(block.get("tool_use_id", "")))
                text = _result_text(block)
                if call is None or text.startswith(_NOT_ERRORS):
                    continue
                outcomes.append((call[1], block.get("is_error") is True, text))
    unresolved: list[str] | None = None
    for i in range(len(outcomes) - 1, -1, -1):
        identity, failed, text = outcomes[i]
        if not failed:
            continue
        if any(o[0] == identity and not o[1] for o in outcomes[i + 1 :]):
            continue
        unresolved = _error_key(text) or None
        break
    return Probes(
        user_words=newest_words(said, USER_WORDS_TOKENS),
        first_request=first,
        latest_instruction=said[-1] if said else None,
        files_changed=list(files),
        plan_items=[t for t in todos if t.strip()],
        unresolved_error=unresolved,
    )


def _loose(text: str) -> str:
    # Plan items and error keys are phrases, not the user's verbatim words: a
    # literal "\n" (JSON-escaped output shown as text) separates words, and
    # sentence punctuation at a word's ends does not count.
    return " ".join(w.strip(_LOOSE_PUNCT) for w in text.replace("\\n", " ").split())


def _whole(text: str, haystack: str) -> bool:
    ws = words(_loose(text))
    return bool(ws) and run_share([ws], _loose(haystack), run=len(ws), casefold=True) == 1.0


def score(probes: Probes, text: str) -> dict[str, float | None]:
    """Each probe's score in ``[0, 1]`` for ``text``, ``None`` where it has nothing to check."""
    names = [p.rsplit("/", 1)[-1] for p in probes.files_changed]
    return {
        PROBES[0]: run_share(probes.user_words, text),
        PROBES[1]: run_share([words(probes.first_request)], text) if probes.first_request else None,
        PROBES[2]: (
            run_share([words(probes.latest_instruction)], text)
            if probes.latest_instruction
            else None
        ),
        PROBES[3]: sum(1 for n in names if n in text) / len(names) if names else None,
        PROBES[4]: (
            sum(1 for item in probes.plan_items if _whole(item, text)) / len(probes.plan_items)
            if probes.plan_items
            else None
        ),
        PROBES[5]: (
            float(_whole(" ".join(probes.unresolved_error), text))
            if probes.unresolved_error
            else None
        ),
    }


# --------------------------------------------------------------------------- one point


def _sent_text(message: Message) -> str:
    return "\n".join(p.text for p in message.parts if isinstance(p, TextPart) and not p.ignored)


# Live message ids end in random characters and the memory root is a fresh temporary
# folder: both are replaced by fixed text of the same length before counting, so the
# sizes are the same in every run.
_LIVE_ID: Final = re.compile(r"\b(msg|prt|ses)_[0-9a-f]{14}[0-9A-Za-z]{14}\b")


def _stable_count(counter: TiktokenCounter, text: str, root: Path) -> int:
    text = text.replace(str(root), "/" + "m" * (len(str(root)) - 1))
    return counter.count(_LIVE_ID.sub(lambda m: f"{m.group(1)}_{'0' * 14}{'x' * 14}", text))


def _invalid(request: list[Message]) -> str | None:
    """Why the request would be refused by either provider, or ``None``."""
    try:
        validate_request(to_openai_chat(request), format="openai-chat")
        _, turns = to_anthropic(request)
        validate_request({"messages": turns}, format="anthropic")
    except InvalidRequestError as exc:
        return str(exc)
    return None


async def _point(
    path: Path, point: CompactionPoint, data: bytes, counter: TiktokenCounter, root: Path
) -> dict[str, Any]:
    transcript = stable_ids(load_transcript(path))
    compaction = next((c for c in transcript.compactions if c.line == point.line), None)
    if compaction is None:
        raise RuntimeError(f"{path.name}: the importer has no compaction at line {point.line}")
    typed = typed_inputs(data, "claude-code")
    replay = await replay_transcript(
        transcript, window=WINDOW, typed=typed, rebuild_at=compaction.index, memory_root=root
    )
    assert replay.point is not None  # rebuild_at was given
    request = list(replay.point.request)
    boundary_id = replay.point.boundary.id if replay.point.boundary is not None else None
    boundary_at = next((i for i, m in enumerate(request) if m.id == boundary_id), None)
    body = _sent_text(request[boundary_at]) if boundary_at is not None else ""
    tail = [m for i, m in enumerate(request) if i != boundary_at]
    tail_text = request_text(tail)
    whole = f"{body}\n{tail_text}"
    probes = extract_probes(data, point.line, typed)
    return {
        "transcript": path.name,
        "line": point.line,
        "at": compaction.index,
        "outcome": replay.point.outcome,
        "mimo_rebuilds_before": len(replay.rebuilds),
        "body_tokens": _stable_count(counter, body, root),
        "tail_tokens": _stable_count(counter, tail_text, root) if tail else 0,
        "summary_tokens": counter.count(point.summary),
        "request_estimate": replay.point.request_tokens,
        "trigger_tokens": replay.trigger_tokens,
        "invalid": _invalid(request),
        "scores": {
            "body": score(probes, body),
            "request": score(probes, whole),
            "claude_code": score(probes, point.summary),
        },
        "probes": {
            "user_word_texts": len(probes.user_words),
            "first_request": probes.first_request,
            "latest_instruction": probes.latest_instruction,
            "files_changed": len(probes.files_changed),
            "plan_items": len(probes.plan_items),
            "unresolved_error": " ".join(probes.unresolved_error)
            if probes.unresolved_error
            else None,
        },
    }


# --------------------------------------------------------------------------- inputs


def synthetic_claude_code(path: Path) -> Path:
    """Write a small made-up Claude Code session with one compaction to ``path``.

    Used when the shared transcripts are absent (and by the smoke test): it has
    a slash command with arguments, a queued message, edits, a ``TodoWrite``, an
    unresolved error and an ``isCompactSummary`` line, so every probe applies.
    """
    lines: list[dict[str, Any]] = []
    clock = [0]

    def stamp() -> str:
        clock[0] += 1
        return f"2026-01-01T00:{clock[0] // 60:02d}:{clock[0] % 60:02d}.000Z"

    parent: list[str | None] = [None]

    def add(kind: str, content: object, **extra: Any) -> None:
        uuid = f"u{len(lines):04d}"
        record = {
            "type": kind,
            "uuid": uuid,
            "parentUuid": parent[0],
            "isSidechain": False,
            "sessionId": "synthetic",
            "timestamp": stamp(),
            "message": {"role": kind, "content": content, **extra.pop("message", {})},
            **extra,
        }
        lines.append(record)
        parent[0] = uuid

    def call(
        n: int, name: str, arguments: dict[str, Any], output: str, error: bool = False
    ) -> None:
        add(
            "assistant",
            [{"type": "tool_use", "id": f"t{n}", "name": name, "input": arguments}],
            message={
                "id": f"m{n}",
                "model": "claude",
                "usage": {"input_tokens": 1000 * n, "output_tokens": 10},
            },
        )
        add(
            "user",
            [{"type": "tool_result", "tool_use_id": f"t{n}", "content": output, "is_error": error}],
        )

    add(
        "user",
        "<command-message>plan is running…</command-message>\n<command-name>/plan</command-name>\n"
        "<command-args>build a small todo app with a sqlite backend and a web page</command-args>",
    )
    call(
        1,
        "TodoWrite",
        {
            "todos": [
                {"content": "Create the sqlite schema", "status": "completed"},
                {"content": "Write the web page", "status": "in_progress"},
            ]
        },
        "ok",
    )
    call(
        2,
        "Write",
        {"file_path": "/repo/app/schema.sql", "content": "create table todo (id int);"},
        "ok",
    )
    call(
        3,
        "Edit",
        {
            "file_path": "/repo/app/web/page_with_a_long_name.html",
            "old_string": "a",
            "new_string": "b",
        },
        "ok",
    )
    lines.append(
        {
            "type": "queue-operation",
            "operation": "enqueue",
            "timestamp": stamp(),
            "sessionId": "synthetic",
            "content": "also add a dark mode toggle to the page please",
        }
    )
    call(
        4,
        "Bash",
        {"command": "npm test -- --run"},
        "Exit code 1\nError: cannot find module 'sqlite3'",
        True,
    )
    add(
        "user",
        "This session is being continued from a previous conversation. Summary: the user asked "
        "for a todo app; schema.sql was written.",
        isCompactSummary=True,
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return path


def _inputs(quick: bool, scratch: Path) -> tuple[list[Path], str | None]:
    folder = transcripts_dir()
    found: list[Path] = []
    if folder is not None:
        for p in sorted((folder / "claude_code").glob("*.jsonl")):
            if "_subagents_" not in p.name and compaction_points(p.read_bytes()):
                found.append(p)
    if not found:
        note = (
            "No shared Claude Code transcript with its own compactions was found (set "
            "MIMO_CTX_TRANSCRIPTS, default ../shared/data/transcripts): only a synthetic "
            "session was scored."
        )
        return [synthetic_claude_code(scratch / "synthetic.jsonl")], note
    return (found[:1] if quick else found), None


# --------------------------------------------------------------------------- report


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


async def _run(quick: bool) -> dict[str, Any]:
    counter = TiktokenCounter()
    scratch = Path(tempfile.mkdtemp(prefix="mimo-ctx-bench-quality-"))
    try:
        paths, missing = _inputs(quick, scratch)
        points: list[dict[str, Any]] = []
        for path in paths:
            data = path.read_bytes()
            for n, point in enumerate(compaction_points(data)):
                root = scratch / f"memory-{path.stem[:8]}-{n}"
                points.append(await _point(path, point, data, counter, root))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _report(points, missing)


def _report(points: list[dict[str, Any]], missing: str | None) -> dict[str, Any]:
    rows: list[list[str]] = []
    for p in points:
        for probe in PROBES:
            ours = p["scores"]["body"][probe]
            theirs = p["scores"]["claude_code"][probe]
            verdict = "-" if ours is None or theirs is None else ("≥" if ours >= theirs else "<")
            rows.append(
                [
                    f"{p['transcript'][:8]} L{p['line']}",
                    probe,
                    _cell(ours),
                    _cell(p["scores"]["request"][probe]),
                    _cell(theirs),
                    verdict,
                ]
            )
    probes_table = table(
        "Probes per compaction point (body: our boundary message; request: body + live tail)",
        ["point", "probe", "mimo body", "mimo request", "Claude Code", "body vs CC"],
        rows,
    )
    size_rows = [
        [
            f"{p['transcript'][:8]} L{p['line']}",
            f"#{p['at']}",
            p["outcome"],
            f"{p['body_tokens']:,}",
            f"{p['summary_tokens']:,}",
            f"{p['body_tokens'] / p['summary_tokens']:.2f}×" if p["summary_tokens"] else "-",
            f"{p['tail_tokens']:,}",
            f"{p['body_tokens'] + p['tail_tokens']:,}",
            f"{p['request_estimate'] / p['trigger_tokens']:.0%}",
            "yes" if p["invalid"] is None else "NO",
        ]
        for p in points
    ]
    sizes = table(
        "Sizes (exact o200k_base tokens of the text each side gives the model)",
        [
            "point",
            "message",
            "outcome",
            "mimo body",
            "CC summary",
            "body / summary",
            "mimo live tail",
            "mimo body + tail",
            "request / trigger line",
            "valid (OpenAI, Anthropic)",
        ],
        size_rows,
    )
    notes = [
        "Body = the boundary message as sent: checkpoint header, ## Checkpoint index, the "
        "rebuild body's sections and ## Active Actors. Live tail = every other message of the "
        "request prepared right after the rebuild. CC summary = the isCompactSummary text. "
        "No system prompt is counted on either side.",
        "Probes are read from the raw transcript (not through the importer); see the module "
        "docstring of benchmarks/quality.py for each definition.",
    ]
    if missing:
        notes.append(missing)
    return result(
        NAME,
        TITLE,
        tables=[probes_table, sizes],
        targets=_targets(points),
        notes=notes,
        data={"points": points},
    )


def _targets(points: list[dict[str, Any]]) -> list[Target]:
    targets: list[Target] = []
    for probe in PROBES:
        pairs = [
            (p["scores"]["body"][probe], p["scores"]["claude_code"][probe])
            for p in points
            if p["scores"]["body"][probe] is not None
            and p["scores"]["claude_code"][probe] is not None
        ]
        worst = min((o - t for o, t in pairs), default=None)
        targets.append(
            Target(
                f"{probe}: mimo body ≥ Claude Code at every point",
                "≥ CC",
                (
                    "; ".join(f"{o:.2f} vs {t:.2f}" for o, t in pairs)
                    if pairs
                    else "n/a at every point"
                ),
                (worst >= 0) if worst is not None else None,
            )
        )
    words_kept = [
        p["scores"]["body"][PROBES[0]] for p in points if p["scores"]["body"][PROBES[0]] is not None
    ]
    targets.append(
        Target(
            "user words in the body (independent extraction)",
            "≥ 0.95",
            f"min {min(words_kept):.2f} over {len(words_kept)} points"
            if words_kept
            else "no point",
            (min(words_kept) >= 0.95) if words_kept else None,
            ratio=min(words_kept) if words_kept else None,
        )
    )
    invalid = [p for p in points if p["invalid"] is not None]
    over = [p for p in points if p["request_estimate"] >= p["trigger_tokens"]]
    targets.append(
        Target(
            "rebuilt request valid for both providers and under the trigger line",
            "every point",
            f"{len(points) - len(invalid)} of {len(points)} valid, "
            f"{len(points) - len(over)} of {len(points)} under the line",
            (not invalid and not over) if points else None,
            note=(invalid[0]["invalid"] or "")[:200] if invalid else "",
        )
    )
    ratios = [p["body_tokens"] / p["summary_tokens"] for p in points if p["summary_tokens"]]
    targets.append(
        Target(
            "body tokens vs Claude Code's summary",
            "≤ 1.5×",
            f"max {max(ratios):.2f}× over {len(ratios)} points" if ratios else "no point",
            (max(ratios) <= 1.5) if ratios else None,
            ratio=max(ratios) if ratios else None,
        )
    )
    return targets


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the quality benchmark (``quick``: the first transcript with a compaction only)."""
    return anyio.run(_run, quick)
