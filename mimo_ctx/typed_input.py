"""The words a person typed, read straight from a raw transcript.

This module answers one question — *what did the user type?* — from a
transcript file's bytes, for measures that must not trust the importers:
``replay``'s ``user_words_retained`` and the quality benchmark's user-word
probes. It is **independent of** :mod:`mimo_ctx.importers` on purpose: it parses
the raw records itself and shares none of their code, so a record an importer
drops or mislabels (queued messages, slash-command arguments) lowers the
measured retention instead of being missing from both sides. Where the two
must agree (which text is the CLI's rather than the person's), each keeps its
own rules; a disagreement then shows up as a figure below 1.

Rules, per format (``fmt`` is a :data:`~mimo_ctx.importers.FORMATS` name):

* **claude-code** (JSONL, the main file only: sub-agent files hold text the
  main agent wrote). A ``user`` line that is not ``isSidechain``, not
  ``isMeta`` and not ``isCompactSummary`` contributes its text (a string
  content, or its ``text`` blocks; ``tool_result`` blocks are not typed). A
  ``queue-operation`` line with ``operation`` ``enqueue`` (a message typed
  while the agent was busy) and an ``attachment`` line of type
  ``queued_command`` contribute their content too, unless a later user line
  carries the same typed text (Claude Code then delivered it as a turn of its
  own) or an earlier queued record already did. From each text:

  - terminal escape sequences (ANSI CSI/OSC) are removed;
  - a slash command (``<command-name>/x</command-name>`` with
    ``<command-args>…</command-args>``) is the command as typed, ``/x args``;
  - a bash-mode input (``<bash-input>cmd</bash-input>``) is ``!cmd``;
  - otherwise the blocks the CLI writes (:data:`CLAUDE_CODE_MACHINE_TAGS`:
    command output, caveats, system reminders, hook output, task
    notifications) and ``[Request interrupted by user…]`` lines are removed
    (a task notification runs to the end of its text: Claude Code appends a
    "Read the output file…" line to it); what remains, stripped, is typed
    (nothing remaining: not typed).
* **openai-chat** (a JSON array, ``{"messages": [...]}`` or JSONL): the text
  of every ``user`` message (a string, or ``text``/``input_text`` parts), with
  the wrappers agent frameworks put into user turns
  (:data:`CHAT_MACHINE_TAGS`) and escape sequences removed.
* **openai-responses** (a JSON array, ``{"input": [...]}`` or JSONL): the same
  for ``message`` items (or role-only items) with role ``user``.
* **sweagent** (``{"history": [...]}``): the first ``user`` message of the main
  agent (``agent`` missing, ``main`` or ``primary``) that is not ``is_demo``:
  the task. SWE-agent runs with no person in the loop; its later user-role
  messages are the environment's observations.

Each :class:`TypedInput` records where it sits, so a caller can take "what was
typed before this point": ``line`` (1-based JSONL line, ``None`` in a JSON
document) and ``turns_before``, the number of assistant turns recorded before
it in file order (Claude Code: distinct ``message.id`` values of main-chain
assistant lines; chat: assistant messages; Responses: runs of output items).

Matching (:func:`run_share`): text is split into words at whitespace; quote
characters and backticks around a word are not part of it, and a word made only
of list or quote markers (``>``, ``-``, ``*``, ``•``) is dropped, so quoting a
message in Markdown does not hide it. A text of at least :data:`RUN_WORDS`
words has one *run* per starting word (its :data:`RUN_WORDS`-word windows); a
shorter text is one run, itself. A run is found when the same words appear
consecutively in the haystack. The share is runs found over runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

__all__ = [
    "CHAT_MACHINE_TAGS",
    "CLAUDE_CODE_MACHINE_TAGS",
    "RUN_WORDS",
    "TypedInput",
    "claude_code_typed_text",
    "newest_words",
    "run_share",
    "strip_ansi",
    "tag_body",
    "typed_inputs",
    "words",
]

RUN_WORDS: Final = 8
"""Words per run in :func:`run_share`."""

CLAUDE_CODE_MACHINE_TAGS: Final = (
    "bash-stderr",
    "bash-stdout",
    "command-message",
    "local-command-caveat",
    "local-command-stderr",
    "local-command-stdout",
    "system-reminder",
    "task-notification",
    "user-prompt-submit-hook",
)
"""Blocks the Claude Code CLI writes into user lines (never typed by the person)."""

CHAT_MACHINE_TAGS: Final = ("environment_context", "system-reminder", "user_instructions")
"""Blocks agent frameworks (Codex CLI, Claude Code via the API) put into user turns."""

TypedKind = Literal["message", "queued", "command"]

# CSI (ESC [ … final byte), OSC (ESC ] … BEL or ESC \), and two-byte escapes.
_ANSI: Final = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]"
)
_INTERRUPTED: Final = re.compile(r"^\s*\[Request interrupted by user[^\]]*\]\s*$", re.MULTILINE)
_QUOTES: Final = "\"'`“”‘’«»"
_MARKERS: Final = frozenset({">", "-", "*", "•", "+"})
_MAIN_AGENTS: Final = frozenset({"main", "primary"})


@dataclass(frozen=True, slots=True)
class TypedInput:
    """One piece of text the user typed.

    Attributes:
        text: The text as typed (a slash command as ``/name args``).
        line: 1-based line of its record in a JSONL file; ``None`` in a JSON document.
        turns_before: Assistant turns recorded before it, in file order.
        kind: ``message`` (a user turn), ``queued`` (typed while the agent was
            busy) or ``command`` (a slash command).
    """

    text: str
    line: int | None
    turns_before: int
    kind: TypedKind = "message"


# --------------------------------------------------------------------------- words


def words(text: str) -> list[str]:
    """The words of ``text`` as :func:`run_share` compares them (see the module docs)."""
    out: list[str] = []
    for raw in text.split():
        word = raw.strip(_QUOTES)
        if word and word not in _MARKERS:
            out.append(word)
    return out


def newest_words(texts: Sequence[str], budget_tokens: int) -> list[list[str]]:
    """Words of the newest ``texts`` (oldest first in, newest first out) up to a budget.

    ``budget_tokens`` counts 4 characters a token over the words and one space
    each; the oldest text taken may be cut to its newest words.
    """
    budget = budget_tokens * 4
    taken: list[list[str]] = []
    for text in reversed(texts):
        if budget <= 0:
            break
        ws = words(text)
        if not ws:
            continue
        size = sum(len(w) + 1 for w in ws)
        if size > budget:
            kept: list[str] = []
            for word in reversed(ws):
                budget -= len(word) + 1
                if budget < 0:
                    break
                kept.append(word)
            ws = kept[::-1]
            budget = 0
        else:
            budget -= size
        if ws:
            taken.append(ws)
    return taken


def run_share(
    pieces: Sequence[Sequence[str]],
    haystack: str,
    *,
    run: int = RUN_WORDS,
    casefold: bool = False,
) -> float | None:
    """Share of the runs of ``pieces`` (word lists) found in ``haystack``.

    See the module docs for runs. ``casefold`` compares words case-insensitively.

    Returns:
        A fraction in ``[0, 1]``, or ``None`` when ``pieces`` holds no word.

    Raises:
        ValueError: ``run`` is smaller than 1.
    """
    if run < 1:
        raise ValueError(f"run must be at least 1, got {run!r}")
    fold = str.casefold if casefold else _same
    hay = [fold(w) for w in words(haystack)]
    grams = {tuple(hay[i : i + run]) for i in range(len(hay) - run + 1)}
    joined: str | None = None
    total = found = 0
    for piece in pieces:
        ws = [fold(w) for w in piece]
        if not ws:
            continue
        if len(ws) >= run:
            windows = [tuple(ws[i : i + run]) for i in range(len(ws) - run + 1)]
            total += len(windows)
            found += sum(1 for w in windows if w in grams)
            continue
        total += 1
        if joined is None:
            joined = "\0" + "\0".join(hay) + "\0"
        if "\0" + "\0".join(ws) + "\0" in joined:
            found += 1
    return found / total if total else None


def _same(word: str) -> str:
    return word


# --------------------------------------------------------------------------- records


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, titles)."""
    return _ANSI.sub("", text)


def tag_body(text: str, tag: str) -> str | None:
    """What the first ``<tag>…</tag>`` block of ``text`` holds, or ``None``."""
    match = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return match.group(1) if match else None


def _without_tags(text: str, tags: Sequence[str], *, to_end: Sequence[str] = ()) -> str:
    for tag in to_end:
        text = re.sub(rf"<{tag}>.*\Z", "", text, flags=re.DOTALL)
    for tag in tags:
        # A closed block, or an unclosed one running to the end of the text.
        text = re.sub(rf"<{tag}>.*?(?:</{tag}>|\Z)", "", text, flags=re.DOTALL)
    return text


def claude_code_typed_text(text: str) -> tuple[str, TypedKind]:
    """What the person typed in one Claude Code user text (``""`` when nothing).

    See the module docs for the rules.
    """
    clean = strip_ansi(text)
    name = tag_body(clean, "command-name")
    if name is not None:
        name = name.strip()
        if name and not name.startswith("/"):
            name = "/" + name
        args = (tag_body(clean, "command-args") or "").strip()
        return (f"{name} {args}".strip(), "command")
    bash = tag_body(clean, "bash-input")
    if bash is not None:
        return (f"!{bash.strip()}" if bash.strip() else "", "command")
    rest = _without_tags(clean, CLAUDE_CODE_MACHINE_TAGS, to_end=("task-notification",))
    rest = _INTERRUPTED.sub("", rest)
    return (rest.strip(), "message")


def _chat_typed_text(text: str) -> str:
    return _without_tags(strip_ansi(text), CHAT_MACHINE_TAGS).strip()


def _jsonl(data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(value, dict):
            yield number, cast("dict[str, Any]", value)


def _texts(content: object, kinds: frozenset[str]) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for item in cast("list[object]", content):
            if isinstance(item, dict):
                block = cast("dict[str, Any]", item)
                text = block.get("text")
                if block.get("type", "text") in kinds and isinstance(text, str):
                    out.append(text)
    return out


_CC_TEXT: Final = frozenset({"text"})
_CHAT_TEXT: Final = frozenset({"text", "input_text"})


def _claude_code(data: bytes) -> list[TypedInput]:
    typed: list[TypedInput] = []
    queued: list[TypedInput] = []
    responses: set[str] = set()
    turns = 0
    for number, record in _jsonl(data):
        kind = record.get("type")
        if record.get("isSidechain") is True:
            continue
        if kind == "assistant":
            message = record.get("message")
            mid = cast("dict[str, Any]", message).get("id") if isinstance(message, dict) else None
            key = mid if isinstance(mid, str) else f"line-{number}"
            if key not in responses:
                responses.add(key)
                turns += 1
            continue
        if kind == "queue-operation" and record.get("operation") == "enqueue":
            content = record.get("content")
            for text in _texts(content, _CC_TEXT):
                said, _ = claude_code_typed_text(text)
                if said:
                    queued.append(TypedInput(said, number, turns, "queued"))
            continue
        if kind == "attachment":
            attachment = record.get("attachment")
            if isinstance(attachment, dict):
                att = cast("dict[str, Any]", attachment)
                prompt = att.get("prompt")
                if att.get("type") == "queued_command" and isinstance(prompt, str):
                    said, _ = claude_code_typed_text(prompt)
                    if said:
                        queued.append(TypedInput(said, number, turns, "queued"))
            continue
        if kind != "user" or record.get("isMeta") is True or record.get("isCompactSummary"):
            continue
        message = record.get("message")
        if not isinstance(message, dict):
            continue
        for text in _texts(cast("dict[str, Any]", message).get("content"), _CC_TEXT):
            said, how = claude_code_typed_text(text)
            if said:
                typed.append(TypedInput(said, number, turns, how))
    # A queued message Claude Code delivered as a turn of its own is that turn;
    # two queued records of one message (enqueue, then its attachment) are one.
    kept: list[TypedInput] = []
    for item in queued:
        line = item.line or 0
        delivered = any(t.text == item.text and (t.line or 0) > line for t in typed)
        repeated = any(k.text == item.text for k in kept)
        if not delivered and not repeated:
            kept.append(item)
    return sorted([*typed, *kept], key=lambda t: t.line or 0)


def _document(data: bytes) -> object | None:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _items(data: bytes, key: str) -> list[tuple[int | None, dict[str, Any]]]:
    """The records of a chat-like file: a JSON array, an object's ``key`` array, or JSONL."""
    document = _document(data)
    if document is None:
        return [(n, obj) for n, obj in _jsonl(data)]
    if isinstance(document, dict):
        document = cast("dict[str, Any]", document).get(key)
    if not isinstance(document, list):
        return []
    return [
        (None, cast("dict[str, Any]", item))
        for item in cast("list[object]", document)
        if isinstance(item, dict)
    ]


def _openai_chat(data: bytes) -> list[TypedInput]:
    typed: list[TypedInput] = []
    turns = 0
    for line, item in _items(data, "messages"):
        role = item.get("role")
        if role == "assistant":
            turns += 1
        elif role == "user":
            typed.extend(_chat_typed(item, line, turns))
    return typed


def _chat_typed(item: dict[str, Any], line: int | None, turns: int) -> Iterator[TypedInput]:
    """What the user typed in one chat or Responses user message."""
    for text in _texts(item.get("content"), _CHAT_TEXT):
        said = _chat_typed_text(text)
        if said:
            yield TypedInput(said, line, turns)


def _openai_responses(data: bytes) -> list[TypedInput]:
    typed: list[TypedInput] = []
    turns = 0
    in_output = False
    for line, item in _items(data, "input"):
        kind = item.get("type", "message")
        role = item.get("role")
        output = kind != "function_call_output" and not (
            kind == "message" and role in ("user", "system", "developer")
        )
        if output and not in_output:
            turns += 1
        in_output = output
        if kind == "message" and role == "user":
            typed.extend(_chat_typed(item, line, turns))
    return typed


def _sweagent(data: bytes) -> list[TypedInput]:
    document = _document(data)
    if not isinstance(document, dict):
        return []
    history = cast("dict[str, Any]", document).get("history")
    if not isinstance(history, list):
        return []
    turns = 0
    for raw in cast("list[object]", history):
        if not isinstance(raw, dict):
            continue
        item = cast("dict[str, Any]", raw)
        agent = item.get("agent")
        if isinstance(agent, str) and agent and agent not in _MAIN_AGENTS:
            continue
        if item.get("role") == "assistant":
            turns += 1
        elif item.get("role") == "user" and item.get("is_demo") is not True:
            said = _chat_typed_text("\n".join(_texts(item.get("content"), _CHAT_TEXT)))
            return [TypedInput(said, None, turns)] if said else []
    return []


def typed_inputs(data: bytes, fmt: str) -> list[TypedInput]:
    """Everything the user typed in a transcript file's bytes, in file order.

    Malformed records are passed over (an importer reports them; here they
    simply hold no typed text).

    Args:
        data: The file's bytes (the main file, for Claude Code).
        fmt: Its format: ``claude-code``, ``openai-chat``, ``openai-responses``
            or ``sweagent``.

    Raises:
        ValueError: ``fmt`` is none of those.
    """
    if fmt == "claude-code":
        return _claude_code(data)
    if fmt == "openai-chat":
        return _openai_chat(data)
    if fmt == "openai-responses":
        return _openai_responses(data)
    if fmt == "sweagent":
        return _sweagent(data)
    raise ValueError(
        f"unknown transcript format {fmt!r}; expected claude-code, openai-chat, "
        "openai-responses or sweagent"
    )
