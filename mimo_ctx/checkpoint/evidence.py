"""What the offline checkpoint writer reads in one message or one tool call (pure).

Every function here is synchronous, does no I/O and looks at one piece of text or
one tool call; :mod:`mimo_ctx.checkpoint.state` folds their answers over a
session's messages. The rules are deliberately plain so that a reader can predict
what lands in ``checkpoint.md``:

**The user's words.** A typed message is a *continuation* when, once its
punctuation is dropped, it has at most six words and either all of them are
acknowledgement words (``yes``, ``ok``, ``continue``, ``go on``, ``check again``,
``thanks`` …) or its first word (after ``and``/``ok``/``please``/``yes``) is
``continue``, ``proceed``, ``resume`` or ``keep``. Every other typed message is
*substantive*: it can define or change the task. A *directive* is a sentence of a
typed message that starts with ``always``, ``never``, ``don't``, ``do not``,
``must``, ``avoid``, ``prefer``, ``use``, ``make sure``, ``remember`` or ``only``
(after an optional ``please``), or that contains ``always``, ``never``, ``from now
on``, ``make sure``, ``must not``/``mustn't`` or ``you should``/``we should``.

**The assistant's words.** Its text is split into sentences (code blocks, tables
and headings dropped, Markdown emphasis removed). A sentence is *concrete* when it
names something: a backticked token, a path or file name, a ``CamelCase``,
``snake_case`` or upper-case (``SQLite``, ``JSON``) identifier, a capitalised name
in mid-sentence, or a number. A *stated plan* starts with ``let me``,
``now``, ``next``, ``then``, ``i'll``, ``i will``, ``i need to``, ``i'm going to``
or ``first``. A *decision* is a sentence with ``instead``, ``rather than``,
``decided``, ``chose``, ``going with``, ``switch(ed) to``, ``opt(ed) for``,
``trade-off``, ``fix it by`` or "let me / I'll / I need to" + ``rewrite``,
``switch``, ``replace``, ``restructure``, ``refactor``, ``move``; or a concrete
sentence with ``better to``, ``to avoid``, ``so that``, ``approach``,
``decision``, ``choose`` or "I/we need to / will / 'll / should" + ``use``,
``rewrite``, ``switch``, ``replace``, ``go with``, ``stick with``, ``keep``,
``avoid``, ``move``. *Knowledge* is a concrete sentence that is not a
plan or a decision and states a fact: ``doesn't``/``does not``, ``isn't``/``is
not``, ``can't``/``cannot``, ``requires``, ``needs``, ``must``, ``only``,
``supports``, ``default``, ``is missing``, ``runs in``/``on``, ``uses``,
``expects``, ``returns``, ``because``, ``turns out``, ``root cause``, ``is defined``, ``lives
in``, ``is configured``, ``has no``, ``not found``, ``does not exist``.

A decision that names nothing and points with a pronoun (``it``, ``this``,
``that``, ``them``…: "Let me rewrite it to be a macro") is *vague*: the file the
next file change touches is added to it in parentheses.

**Commands in text.** An agent that acts through text (SWE-agent's older
trajectories) ends its message with the action in a fenced code block: the
block's first line is its *command*, the sentence before the block what it said
about it. A command whose first word is a file verb of the tool-call rules below
(``open``/``cat``/``view`` read, ``create`` creates, ``edit``/``insert`` edit)
touches its first argument with a ``.`` or ``/`` in it; an edit without one, the
file opened or created last.

**Tool calls.** A call names files through its ``file_path``/``path``/
``filename``/``notebook_path``/``file`` argument or, for ``apply_patch``, the
``*** Add/Update/Delete File:`` lines of its patch. Write-like tools
(``write``, ``create``, ``str_replace_based_edit_tool`` with ``create``) *create*
a file seen for the first time and *edit* it afterwards; edit-like tools
(``edit``, ``multiedit``, ``str_replace``, ``apply_patch``, ``notebookedit`` …)
*edit*; read-like tools (``read``, ``view``, ``cat``, ``open``) *read*. A shell
call is one whose tool is ``bash``/``shell``/``exec_command``/``run_terminal_cmd``
/``execute_command``/``terminal`` and whose input has a ``command``/``cmd``
string. A successful shell call is a *commit* when its command runs ``git
commit`` (the subject is read from ``[branch hash] subject`` in the output, else
from ``-m``), a *push* when it runs ``git push``, and a *passing test run* when it
runs a test runner (``pytest``, ``mix test``, ``npm test``, ``cargo test``, ``go
test`` …) and its output holds a summary line (``87 tests, 0 failures``, ``5
passed``). A plan tool is Claude Code's ``TodoWrite`` (``todos`` with
``content``/``status``), Codex's ``update_plan`` (``plan`` with
``step``/``status``), or any tool named ``todo``/``todos``/``plan``/``todo_write``
/``update_todos``/``set_plan`` whose input holds a list of items with a text
field and a status or ``done`` flag.

**What a change defines.** A file-changing call *defines* the names on the
lines of its new text that start with a definition keyword (``def``,
``defmodule``, ``class``, ``function``, ``func``, ``fn``, ``interface``,
``struct``, ``enum``, ``trait``, ``type``, ``impl`` …, after ``export``/``pub``/
``async``), a ``const name = (…) =>`` or a shell function ``name() {``, and
that its old text did not define.

**Errors.** A failure's line is the first line of its output that names the
failure (the first line, else the first with an error word); one that ends with
``:`` takes the next line too. A line that is still *thin* (under six words, or
ending with ``:`` or ``]``, as "Pre-commit validation failed: [DIALYZER]") gets
the first ``file.ext:N`` location further down with its explanation (the wordier
of the lines before and after it).

**Delegation.** A finished call of a sub-agent tool (``Task``, ``Agent``,
``spawn_agent``, ``delegate`` …) is done work: what was delegated (its
``description``) and the first concrete sentence among the first four of five
words or more of the sub-agent's report (else the first).

**Signatures.** Failures are matched with the later success that fixed them by a
*signature*: for a shell call, the head of its last ``&&``/``;`` command that is
not a ``cd``/``echo``/``export`` (before any ``|``): ``git push``, ``mix test``,
``pytest`` — the first word, two for tools with sub-commands; for a file call,
the action and path; otherwise the tool name.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from mimo_ctx.checkpoint._tool_evidence import (
    FileAction,
    command_of,
    commit_subject,
    cut,
    defined_names,
    error_line,
    file_actions,
    passing_test_run,
    pushed_branch,
    signature,
    tool_key,
)
from mimo_ctx.messages import Message, ToolPart

__all__ = [
    "FileAction",
    "PlanItem",
    "PlanStatus",
    "clean_resource",
    "command_of",
    "commit_subject",
    "decision_sentences",
    "defined_names",
    "delegation_report",
    "directive_sentences",
    "error_line",
    "file_actions",
    "first_sentence",
    "is_continuation",
    "is_vague",
    "knowledge_sentences",
    "newest_plan",
    "passing_test_run",
    "plan_items",
    "pushed_branch",
    "resources_in",
    "sentences",
    "signature",
    "stated_plan",
    "stated_reason",
    "strings_in",
    "text_command_files",
    "trailing_command",
]

PlanStatus = Literal["pending", "in_progress", "completed", "cancelled"]


@dataclass(frozen=True, slots=True)
class PlanItem:
    """One item of the host agent's own plan (``TodoWrite``, ``update_plan``…).

    Attributes:
        text: What the item says.
        status: ``pending``, ``in_progress``, ``completed`` or ``cancelled``.
    """

    text: str
    status: PlanStatus


# -- text -------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
# Not after an ellipsis ("ALTER TABLE ... ADD"): that is one sentence.
_SENTENCE_END = re.compile(r"(?<=[^.][.!?])\s+(?=[A-Z`*\"'(\[])")
_EMPHASIS = re.compile(r"(\*\*|__)(.+?)\1")
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_WORD = re.compile(r"[\w'’-]+")


def _plain(line: str) -> str:
    line = _BULLET.sub("", line)
    return _EMPHASIS.sub(r"\2", line).strip()


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, in order, one line each.

    Fenced code blocks, table rows and headings are dropped; list markers and
    Markdown emphasis are removed; a line is split at ``. ``/``! ``/``? `` before
    an upper-case letter, a backtick or a quote.
    """
    out: list[str] = []
    fenced = False
    for raw in text.splitlines():
        if _FENCE.match(raw):
            fenced = not fenced
            continue
        if fenced:
            continue
        stripped = raw.strip()
        if not stripped or stripped.startswith(("|", "#", ">")):
            continue
        for piece in _SENTENCE_END.split(_plain(stripped)):
            flat = " ".join(piece.split())
            if flat:
                out.append(flat)
    return out


def trailing_command(text: str) -> tuple[str, str] | None:
    """``(command, what the text said before it)`` when ``text`` ends with a code block.

    Agents that act through text (SWE-agent's ``edit 287:295``, a shell block)
    end the message with the action in a fenced block; the command is the block's
    first non-blank line, cut near 120 characters, and what was said is the last
    sentence before the block (``""`` when there is none). ``None`` when the text
    does not end with a closed block.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or not _FENCE.match(lines[-1]) or lines[-1].strip() not in {"```", "~~~"}:
        return None
    opening = next((i for i in range(len(lines) - 2, -1, -1) if _FENCE.match(lines[i])), None)
    if opening is None:
        return None
    body = [line.strip() for line in lines[opening + 1 : -1] if line.strip()]
    if not body:
        return None
    before = sentences("\n".join(lines[:opening]))
    return cut(body[0], 120), (cut(before[-1], 300) if before else "")


def text_command_files(command: str, open_file: str | None) -> list[tuple[str, FileAction]]:
    """The file a text command (see :func:`trailing_command`) touches, and how.

    Its first word is the verb, read as a tool name by :func:`file_actions`
    (``open``/``cat``/``view`` read, ``create`` creates, ``edit``/``insert``/
    ``str_replace`` edit); the path is its first argument with a ``.`` or ``/`` in
    it, else, for an edit, ``open_file`` (SWE-agent's ``edit 287:295`` changes the
    file opened last). ``[]`` for any other command.
    """
    words = command.split()
    if not words:
        return []
    path = next((w.strip("\"'") for w in words[1:] if "." in w or "/" in w), None)
    verb = words[0]
    if path is None and file_actions(verb, {"path": "x"}) == [("x", "edited")]:
        path = open_file
    return file_actions(verb, {"path": path}) if path else []


def first_sentence(text: str, limit: int = 200) -> str:
    """The first sentence of ``text`` (see :func:`sentences`), cut at a word near ``limit``."""
    found = sentences(text)
    return cut(found[0], limit) if found else ""


def _words(text: str, limit: int | None = None) -> list[str]:
    """The words of ``text``, lower-cased; only the first ``limit`` when given."""
    if limit is None:
        return [w.lower().strip("'’-") for w in _WORD.findall(text)]
    return [m.group().lower().strip("'’-") for m in itertools.islice(_WORD.finditer(text), limit)]


# -- the user's words ----------------------------------------------------------------------

_ACK_WORDS: Final = frozenset(
    {
        "yes", "yep", "yeah", "y", "ok", "okay", "k", "sure", "please", "pls", "go",
        "on", "ahead", "continue", "proceed", "resume", "keep", "going", "next", "do",
        "it", "that", "again", "check", "thanks", "thank", "you", "thx", "great",
        "good", "fine", "nice", "perfect", "lgtm", "right", "correct", "cool", "and",
        "now", "then", "so", "sounds", "done", "alright", "carry", "retry", "try",
    }
)  # fmt: skip
_CONTINUE_HEADS: Final = frozenset({"continue", "proceed", "resume", "keep", "carry"})
_CONTINUE_LEADS: Final = frozenset({"and", "ok", "okay", "please", "yes", "so", "now", "then"})
_CONTINUATION_MAX_WORDS: Final = 6


def is_continuation(text: str) -> bool:
    """True when a typed message only acknowledges or says "go on" (see the module rules)."""
    # One word past the limit decides a long message: the rest is never looked at
    # (the task-defining request is often thousands of words).
    words = _words(text, _CONTINUATION_MAX_WORDS + 1)
    if not words:
        return True
    if len(words) > _CONTINUATION_MAX_WORDS:
        return False
    if all(w in _ACK_WORDS for w in words):
        return True
    lead = 0
    while lead < len(words) - 1 and words[lead] in _CONTINUE_LEADS:
        lead += 1
    return words[lead] in _CONTINUE_HEADS


_DIRECTIVE_START = re.compile(
    r"^(?:please\s+)?"
    r"(?:always|never|don'?t|do not|must|avoid|prefer|use|make sure|remember|only)\b",
    re.IGNORECASE,
)
_DIRECTIVE_ANYWHERE = re.compile(
    r"\b(?:always|never|from now on|make sure|must not|mustn'?t|you should|we should)\b",
    re.IGNORECASE,
)
_DIRECTIVE_MAX_CHARS: Final = 300


def directive_sentences(text: str) -> list[str]:
    """Sentences of a typed message that read as standing instructions (module rules)."""
    return [
        s
        for s in sentences(text)
        if len(s) <= _DIRECTIVE_MAX_CHARS
        and (_DIRECTIVE_START.search(s) or _DIRECTIVE_ANYWHERE.search(s))
    ]


# -- the assistant's words ---------------------------------------------------------------------

_CONCRETE = re.compile(
    r"`[^`]+`"  # a backticked token
    r"|[\w.-]*/[\w./-]+"  # a path
    r"|\b\w+\.(?:py|ex|exs|js|ts|tsx|jsx|rs|go|rb|java|kt|md|json|toml|ya?ml|sh|sql|c|h|cpp|css|html)\b"
    r"|\b[A-Z][a-z]+[A-Z]\w*"  # CamelCase
    r"|\b[A-Z]\w*[A-Z]\w*"  # SQLite, JSON, OTEL
    r"|(?<=[a-z,;:] )[A-Z][a-z]{2,}\b"  # a name in mid-sentence (Phoenix, Ecto)
    r"|\b[a-z]+_[a-z_]+\b"  # snake_case
    r"|\b\d+\b"
)
_PLAN_START = re.compile(
    r"^(?:let me|let's|now|next|then|i'll|i will|i need to|i'm going to|i am going to|first"
    r"|starting with|moving on)\b",
    re.IGNORECASE,
)
_DECISION_STRONG = re.compile(
    r"\b(?:instead|rather than|decided|chose|going with|switch(?:ed)? to|opt(?:ed)? for"
    r"|trade-?off|fix (?:it|this|that) by|(?:let me|i'll|i will|i need to|we need to)"
    r" (?:rewrite|switch|replace|restructure|refactor|move))\b",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(?:decision|choose|better to|to avoid|so that|approach"
    r"|(?:i|we) (?:need to|will|'ll|should) (?:use|rewrite|switch|replace|go with|stick with"
    r"|keep|avoid|move)"
    r"|(?:i|we)'ll (?:use|rewrite|switch|replace|go with|stick with|keep|avoid|move))\b",
    re.IGNORECASE,
)
_KNOWLEDGE = re.compile(
    r"\b(?:doesn'?t|does not|isn'?t|is not|aren'?t|are not|can'?t|cannot|won'?t|requires?"
    r"|needs|must|only|supports|(?:doesn'?t|does not|don'?t|do not) support|default"
    r"|is missing|are missing|runs in|runs on|uses|expects|returns|because|turns out"
    r"|root cause|is defined|are defined|lives in|is configured"
    r"|isn't configured|is set|points to|depends on|has no|have no|there is no|not found"
    r"|doesn'?t exist|does not exist|the (?:issue|problem|bug|cause) (?:is|was))\b",
    re.IGNORECASE,
)
_PLAN_LEAD = re.compile(
    r"^(?:(?:now|next|then|first|ok|okay|good|great)[,.]?\s+)*"
    r"(?:let me|let's|i'll|i will|i need to|i'm going to|i am going to|we need to)?\s*"
    r"(?:also\s+|now\s+|first\s+)?",
    re.IGNORECASE,
)
_FILLER_START = re.compile(
    r"^(?:good|great|perfect|ok|okay|done|all|excellent|nice|right|yes|no|hmm|sure|looks)\b[.!,:]?",
    re.IGNORECASE,
)
_MIN_CHARS: Final = 24
_MAX_CHARS: Final = 260


def _concrete(sentence: str) -> bool:
    return _CONCRETE.search(sentence) is not None


_PRONOUN = re.compile(r"\b(?:it|this|that|them|these|those)\b", re.IGNORECASE)


def is_vague(sentence: str) -> bool:
    """True when ``sentence`` names nothing concrete and points with a pronoun (it, this…)."""
    return not _concrete(sentence) and _PRONOUN.search(sentence) is not None


def _candidate(sentence: str) -> bool:
    return _MIN_CHARS <= len(sentence) <= _MAX_CHARS and _concrete(sentence)


def stated_plan(text: str) -> str | None:
    """What ``text`` says the assistant does next: its last plan sentence, if any.

    A plan sentence too vague to act on alone ("Let me add it.") comes with the
    sentence before it.
    """
    found = sentences(text)
    index = next((i for i in reversed(range(len(found))) if _PLAN_START.search(found[i])), None)
    if index is None:
        return None
    plan = found[index]
    if not _concrete(plan) and index > 0:
        plan = f"{found[index - 1]} {plan}"
    return cut(plan, 300)


def _decision(sentence: str) -> bool:
    if not _MIN_CHARS <= len(sentence) <= _MAX_CHARS:
        return False
    return bool(_DECISION_STRONG.search(sentence)) or (
        _concrete(sentence) and _DECISION.search(sentence) is not None
    )


def decision_sentences(text: str) -> list[str]:
    """Sentences of assistant text that state a choice (module rules)."""
    return [s for s in sentences(text) if _decision(s)]


def knowledge_sentences(text: str) -> list[str]:
    """Concrete sentences of assistant text that state a fact (module rules)."""
    out: list[str] = []
    for s in sentences(text):
        if not _candidate(s) or _decision(s) or _PLAN_START.search(s):
            continue
        body = _FILLER_START.sub("", s).strip(" —-:")
        if len(body) >= _MIN_CHARS and _KNOWLEDGE.search(body):
            out.append(body if body == s else body[0].upper() + body[1:])
    return out


def stated_reason(text: str) -> str | None:
    """Why the assistant makes the calls that follow ``text``, in its own words.

    The last stated plan (without its "let me"/"now I'll" lead-in; with the
    sentence before it when the plan names nothing and that sentence does) when
    there is one, else the first concrete sentence that is not filler; ``None``
    otherwise.
    """
    found = sentences(text)
    index = next((i for i in reversed(range(len(found))) if _PLAN_START.search(found[i])), None)
    if index is not None:
        reason = _PLAN_LEAD.sub("", found[index]).strip()
        if len(reason) >= 12:
            reason = reason[:1].upper() + reason[1:]
            before = found[index - 1] if index > 0 else ""
            if not _concrete(reason) and _concrete(before):
                # "Create it now." says why only with the sentence before it.
                reason = f"{_FILLER_START.sub('', before).strip(' —-:')} {reason}"
            return cut(reason, 200)
    for sentence in found:
        body = _FILLER_START.sub("", sentence).strip(" —-:")
        if len(body) >= _MIN_CHARS and _concrete(body):
            return cut(body, 200)
    return None


# -- delegation ---------------------------------------------------------------------------

_DELEGATION_TOOLS: Final = frozenset(
    {"task", "agent", "spawn_agent", "subagent", "sub_agent", "delegate", "dispatch_agent"}
)
_DELEGATION_LABEL_KEYS: Final = ("description", "title", "name", "task", "prompt")
_REPORT_MIN_WORDS: Final = 5


def delegation_report(tool: str, arguments: Mapping[str, Any], output: str) -> str | None:
    """``<what was delegated>: <what the sub-agent reported>`` for a finished sub-agent call.

    A delegation tool is Claude Code's ``Task``/``Agent`` or one named ``spawn_agent``,
    ``subagent``, ``delegate``, ``dispatch_agent``; what was delegated is its
    ``description`` (else ``title``/``name``/``task``/``prompt``, cut near 80
    characters); the report is the first concrete sentence among the output's
    first four of at least five words (else the first of them; headings and
    "Perfect!" skipped), cut near 200. ``None`` for other calls
    or an empty report.
    """
    if tool_key(tool) not in _DELEGATION_TOOLS:
        return None
    label = next(
        (v for k in _DELEGATION_LABEL_KEYS if isinstance(v := arguments.get(k), str) and v.strip()),
        None,
    )
    found = [s for s in sentences(output[:20_000]) if len(s.split()) >= _REPORT_MIN_WORDS]
    # "I now have all the information needed." says nothing: a sentence that names
    # something (module rules) is preferred among the first few.
    said = next((s for s in found[:4] if _concrete(s)), found[0] if found else None)
    if label is None or said is None:
        return None
    return f"{cut(' '.join(label.split()), 80)}: {cut(said, 200)}"


# -- plans -------------------------------------------------------------------------------------

_PLAN_TOOLS: Final = frozenset(
    {"todowrite", "todo_write", "update_plan", "todo", "todos", "plan", "update_todos", "set_plan"}
)
_ITEM_TEXT_KEYS: Final = ("content", "step", "text", "title", "task", "description", "name")
_STATUS_WORDS: Final[Mapping[str, PlanStatus]] = {
    "pending": "pending",
    "todo": "pending",
    "open": "pending",
    "not_started": "pending",
    "in_progress": "in_progress",
    "in-progress": "in_progress",
    "active": "in_progress",
    "doing": "in_progress",
    "completed": "completed",
    "complete": "completed",
    "done": "completed",
    "cancelled": "cancelled",
    "canceled": "cancelled",
    "skipped": "cancelled",
}


def _item(raw: object) -> PlanItem | None:
    if isinstance(raw, str):
        return PlanItem(" ".join(raw.split()), "pending") if raw.strip() else None
    if not isinstance(raw, dict):
        return None
    entry = cast("dict[str, object]", raw)
    text = next((entry[k] for k in _ITEM_TEXT_KEYS if isinstance(entry.get(k), str)), None)
    if not isinstance(text, str) or not text.strip():
        return None
    status_value = entry.get("status", entry.get("state"))
    status: PlanStatus = "pending"
    if isinstance(status_value, str):
        status = _STATUS_WORDS.get(status_value.strip().lower(), "pending")
    elif entry.get("done") is True or entry.get("completed") is True:
        status = "completed"
    return PlanItem(" ".join(text.split()), status)


def plan_items(tool: str, arguments: Mapping[str, Any]) -> list[PlanItem] | None:
    """The whole plan a plan-tool call sets (module rules), or ``None`` for other calls."""
    if tool_key(tool) not in _PLAN_TOOLS:
        return None
    for name in ("todos", "plan", "items", "steps", "tasks"):
        value = arguments.get(name)
        if isinstance(value, list):
            return [i for i in map(_item, cast("list[object]", value)) if i is not None]
    return None


# -- live resources ----------------------------------------------------------------------------

_URL = re.compile(r"https?://[^\s\"'<>`\\)\]}]+")
_HOST_PORT = re.compile(r"\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]):\d{2,5}\b")
_TRAILING = ".,;:!?'\"\\)]}>"


def clean_resource(value: str) -> str:
    """A URL or ``host:port`` without the punctuation or escapes that end a sentence."""
    value = value.strip()
    while value and value[-1] in _TRAILING:
        value = value[:-1]
    return value


def resources_in(texts: Iterable[str]) -> list[str]:
    """URLs and ``localhost:port`` addresses in ``texts``, cleaned, first seen first."""
    seen: dict[str, None] = {}
    for text in texts:
        urls = [clean_resource(u.split("[")[0]) for u in _URL.findall(text) if "${" not in u]
        for cleaned in urls:
            if len(cleaned) > 10 and cleaned.count("/") <= 12:
                seen.setdefault(cleaned, None)
        for address in _HOST_PORT.findall(text):
            # An address already named by one of its URLs adds nothing.
            if not any(f"//{address}" in url for url in seen):
                seen.setdefault(address, None)
    return list(seen)


def strings_in(value: object, *, limit: int = 64) -> Sequence[str]:
    """The string values inside a tool input (nested), at most ``limit`` of them."""
    found: list[str] = []
    stack: list[object] = [value]
    while stack and len(found) < limit:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(cast("dict[str, object]", item).values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(list(cast("Sequence[object]", item))))
    return found


# -- from messages ---------------------------------------------------------------------------


def newest_plan(messages: Sequence[Message]) -> list[PlanItem] | None:
    """The newest plan a tool call of ``messages`` states (:func:`plan_items`), if any."""
    for message in reversed(messages):
        for part in reversed(message.parts):
            if isinstance(part, ToolPart):
                items = plan_items(part.tool, part.state.input)
                if items is not None:
                    return items
    return None
