"""The offline checkpoint writer's state: evidence folded message by message (pure).

:class:`CheckpointState` is what the offline writer knows about a session, in a
form it can extend: :func:`fold_messages` adds the messages after
:attr:`CheckpointState.upto` and returns a new state; :func:`render_sections`
turns a state into the eleven A14 section bodies. The state is saved beside
``checkpoint.md`` as ``checkpoint.state.json`` (:meth:`CheckpointState.to_json`),
so a writer run needs only the previous state and the messages since the previous
watermark, never the whole history.

Folding is a left fold with every bound applied per message, so folding ``a``
then ``b`` (with a JSON round trip in between) gives exactly the state folding
``a + b`` gives; the property tests check it. What each message contributes
(rules in :mod:`mimo_ctx.checkpoint.evidence`):

* a typed user message: the first substantive one is the task-defining request;
  each later substantive one becomes the latest instruction (a continuation such
  as "continue" or "yes" never replaces either); its directive sentences are
  added to the directives;
* an untyped user message (the environment's output) right after assistant text
  that ended with a command in a code block: the loop is still running (an agent
  that acts through text, such as SWE-agent, gets its observations so), and
  the file its command opens, creates or edits counts as a file call;
* assistant text: knowledge and decision sentences (a decision that names
  nothing and says "it"/"this" gets the file the next file change touches); its
  first sentence is the stated reason of the calls that follow it (in that message or the next); the
  last stated plan and the last text are kept for "next action" and "current
  work"; the first concrete sentence after a failure is that failure's cause;
* a tool call: a plan-tool call replaces the host plan (items that became
  completed are added to what is done); file calls count creations, edits and
  reads per path with the latest stated reason (one that names the file is
  kept until another that names it) and the names the changes
  define (not for prose files: ``.md``, ``.txt``, ``.rst``…); a successful
  commit, push, test run with a summary or sub-agent call (its report's first
  sentence) is added to what is done (a passing run right after a passing run of
  the same command replaces it); a failure opens an error under its
  signature (a repeat counts an attempt), files changed while it is open are its
  fix, and the next success with the same signature marks it fixed; a call the
  user rejected is an open note; URLs and ``localhost`` ports in the input (and in
  a push's output) are live resources.

Results that arrive in separate messages (provider formats) are matched to their
call by id; a call still waiting for its result is kept in the state.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mimo_ctx.checkpoint.evidence import (
    PlanItem,
    command_of,
    commit_subject,
    decision_sentences,
    defined_names,
    delegation_report,
    directive_sentences,
    error_line,
    file_actions,
    is_continuation,
    is_vague,
    knowledge_sentences,
    passing_test_run,
    plan_items,
    pushed_branch,
    resources_in,
    signature,
    stated_plan,
    stated_reason,
    strings_in,
    text_command_files,
    trailing_command,
)
from mimo_ctx.messages import (
    Message,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    message_key,
    user_input_text,
)

__all__ = [
    "STATE_VERSION",
    "CheckpointState",
    "ErrorEntry",
    "FileEntry",
    "Quote",
    "checkpoint_digest",
    "fold_messages",
    "fold_notes",
]

STATE_VERSION: Final = 1
"""Version of :meth:`CheckpointState.to_json`; another version is not read."""

QUOTE_CHARS: Final = 6000
"""A quoted user message keeps at most this many characters in the state."""

# Bounds per list, applied after every message (so folding in pieces is exact).
MAX_DIRECTIVES: Final = 60
MAX_DONE: Final = 300
MAX_FILES: Final = 400
MAX_ERRORS: Final = 120
MAX_SENTENCES: Final = 150
MAX_RESOURCES: Final = 60
MAX_NOTES: Final = 100
MAX_PENDING: Final = 64
MAX_DEFINES: Final = 8
_PROSE_SUFFIXES: Final = (".md", ".markdown", ".txt", ".rst", ".adoc")
_REASON_AGE: Final = 1  # a stated reason applies to calls in its message and the next

_REJECTED: Final = ("doesn't want to proceed", "tool use was rejected", "user rejected")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Quote(_Model):
    """A user message kept word for word (up to :data:`QUOTE_CHARS`).

    Attributes:
        id: The message id.
        text: Its typed text.
        cut: The text was longer and is cut.
    """

    id: str
    text: str
    cut: bool = False


class FileEntry(_Model):
    """What happened to one file.

    Attributes:
        path: The path as the tools named it.
        created: A write-like tool created it.
        edits: Successful edits (a write of a file seen before counts as one).
        reads: Successful reads.
        reason: The assistant's stated reason at the latest change (or first read).
        defines: Names its changes defined (newest last, at most
            :data:`MAX_DEFINES`): what the change was, in the code's own words.
        touched: Order of the latest change or read (higher is newer).
    """

    path: str
    created: bool = False
    edits: int = 0
    reads: int = 0
    reason: str = ""
    defines: list[str] = Field(default_factory=list[str])
    touched: int = 0


class ErrorEntry(_Model):
    """A failed call and what became of it.

    Attributes:
        key: The signature that matches it with a later success.
        call: How the failing call reads (a command or ``Tool file``).
        message: The line of the newest failure that says what went wrong.
        attempts: How many calls with this signature failed.
        causes: The assistant's first concrete sentences after a failure.
        fixes: Files changed while it was open (file names).
        fixed_by: The call that then succeeded, when it reads differently.
        status: ``unresolved`` or ``fixed``.
    """

    key: str
    call: str
    message: str
    attempts: int = 1
    causes: list[str] = Field(default_factory=list[str])
    fixes: list[str] = Field(default_factory=list[str])
    fixed_by: str | None = None
    status: Literal["unresolved", "fixed"] = "unresolved"


class _PlanEntry(_Model):
    text: str
    status: Literal["pending", "in_progress", "completed", "cancelled"]


class _Pending(_Model):
    tool: str
    arguments: dict[str, object]
    reason: str


class CheckpointState(_Model):
    """What the offline writer knows about a session (see the module docstring).

    Attributes:
        version: :data:`STATE_VERSION`.
        upto: Id of the newest message folded in (in listing order).
        upto_time: Its ``time_created``: later runs skip the messages that list up
            to it (time, then id). Listing order, not id order: across workers a
            message can list after one with a newer id, and is still new.
            ``None`` in a state saved before this field: ids decide then.
        checkpoint_sha256: Digest of the ``checkpoint.md`` rendered from this state,
            so a checkpoint written by another writer is noticed.
        counter: Orders events (files touched).
        request: The task-defining request.
        latest: The latest substantive instruction after it.
        last_user: The newest typed user message.
        directives: Standing instructions, verbatim sentences.
        plan: The host agent's plan as last set, with its tool's name.
        plan_tool: The tool that set it.
        done: What was finished, oldest first.
        files: Files by path, in first-seen order.
        errors: Failures, oldest first.
        knowledge: Facts the assistant stated.
        decisions: Choices the assistant stated.
        resources: URLs, ports, branches.
        notes: Open notes (folded ``notes.md`` lines, rejected calls).
        said: The assistant's latest stated reason and the counter it was said at.
        plan_said: The assistant's latest stated plan since the newest typed
            user message.
        conclusion: The assistant's latest text.
        last_finish: Finish reason of the newest assistant message.
        last_command: The command a text-acting agent's newest text ended with.
        command_said: The sentence before that command.
        observed: The newest message is the environment's answer to that
            command (a user message with no typed text after it).
        acts_through_text: Such an answer was seen: the agent acts through
            text, so a text ending with a command awaits its output.
        open_file: The file such an agent opened or created last (its edits
            without a path change it).
        unanswered: No assistant message came after the newest typed user
            message (untyped user text after it, a command's expansion, does not
            answer it).
        vague: How many of the newest decisions name nothing yet: the next file
            change (before more assistant text) names its file in them.
        diagnose: Index in ``errors`` of the failure awaiting its cause.
        pending: Calls whose result has not arrived yet, by call id.
        carried: Section lines read back from a checkpoint this state did not write.
        carried_topic: That checkpoint's topic.
    """

    version: int = STATE_VERSION
    upto: str | None = None
    upto_time: int | None = None
    checkpoint_sha256: str | None = None
    counter: int = 0
    request: Quote | None = None
    latest: Quote | None = None
    last_user: Quote | None = None
    directives: list[str] = Field(default_factory=list[str])
    plan: list[_PlanEntry] = Field(default_factory=list[_PlanEntry])
    plan_tool: str | None = None
    done: list[str] = Field(default_factory=list[str])
    files: dict[str, FileEntry] = Field(default_factory=dict[str, FileEntry])
    errors: list[ErrorEntry] = Field(default_factory=list[ErrorEntry])
    knowledge: list[str] = Field(default_factory=list[str])
    decisions: list[str] = Field(default_factory=list[str])
    resources: list[str] = Field(default_factory=list[str])
    notes: list[str] = Field(default_factory=list[str])
    said: str = ""
    said_at: int = -10
    plan_said: str | None = None
    conclusion: str = ""
    last_finish: str | None = None
    last_command: str | None = None
    command_said: str = ""
    observed: bool = False
    acts_through_text: bool = False
    open_file: str | None = None
    vague: int = 0
    unanswered: bool = False
    diagnose: int | None = None
    pending: dict[str, _Pending] = Field(default_factory=dict[str, _Pending])
    carried: dict[int, list[str]] = Field(default_factory=dict[int, list[str]])
    carried_topic: str | None = None

    def to_json(self) -> str:
        """The state as JSON text (what ``checkpoint.state.json`` holds)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | None) -> CheckpointState | None:
        """Read a saved state; ``None`` when absent, malformed or of another version."""
        if not text or not text.strip():
            return None
        try:
            state = cls.model_validate_json(text)
        except (ValidationError, ValueError):
            return None
        return state if state.version == STATE_VERSION else None

    @property
    def plan_items(self) -> list[PlanItem]:
        """The host plan as :class:`~mimo_ctx.checkpoint.evidence.PlanItem` values."""
        return [PlanItem(e.text, e.status) for e in self.plan]


def checkpoint_digest(text: str) -> str:
    """The SHA-256 of a checkpoint's text (pairs a state with its ``checkpoint.md``)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- folding ---------------------------------------------------------------------------------


def fold_messages(
    state: CheckpointState,
    messages: Iterable[Message],
    *,
    pause: Callable[[], object] | None = None,
) -> CheckpointState:
    """Return ``state`` with ``messages`` folded in (those listed after ``state.upto``).

    ``messages`` come in listing order (time, then id). ``state`` is not changed.
    Boundary messages (earlier rebuilds and compactions) carry no new evidence and
    are skipped; so is every message that lists at or before the newest one
    folded in. ``pause``, if given, is called before each message: a worker
    thread folding many lets the event loop in there (:func:`mimo_ctx._aio.run_sliced`).
    """
    new = _copy(state)
    for message in messages:
        if pause is not None:
            pause()
        if _folded(new, message):
            continue
        if message.is_boundary:
            # A boundary is back-dated next to its watermark but has the newest id:
            # it must not move ``upto`` past the messages listed after it.
            continue
        new.upto = message.id
        new.upto_time = message.time_created
        new.counter += 1
        if message.role == "user":
            _fold_user(new, message)
        elif message.role == "assistant":
            _fold_assistant(new, message)
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                _fold_result(new, part)
        _bound(new)
    return new


def _folded(state: CheckpointState, message: Message) -> bool:
    """True when ``message`` lists at or before the newest message ``state`` folded in."""
    if state.upto is None:
        return False
    if state.upto_time is None:
        return message.id <= state.upto  # a state saved before upto_time
    return message_key(message) <= (state.upto_time, state.upto)


def fold_notes(state: CheckpointState, notes: str | None) -> CheckpointState:
    """Return ``state`` with the lines of ``notes.md`` added to its open notes.

    The writer empties ``notes.md`` after a successful run (A14), so what it folds
    must live on in the state. ``state`` is not changed.
    """
    lines = [line.strip().removeprefix("- ").strip() for line in (notes or "").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return state
    new = _copy(state)
    _add_unique(new.notes, lines)
    _bound(new)
    return new


def _copy(state: CheckpointState) -> CheckpointState:
    """An independent copy of ``state``.

    Through pydantic-core rather than ``copy.deepcopy`` (a third of the time at
    a hundred files and errors, on every writer run); the state is plain data
    that round-trips exactly, as it does through ``checkpoint.state.json``.
    """
    return CheckpointState.model_validate(state.model_dump())


def _quote(message: Message, text: str) -> Quote:
    if len(text) > QUOTE_CHARS:
        return Quote(id=message.id, text=text[:QUOTE_CHARS], cut=True)
    return Quote(id=message.id, text=text)


def _fold_user(state: CheckpointState, message: Message) -> None:
    text = user_input_text(message)
    if text is None:
        # An agent that acts through text gets its command's output as a user
        # message nobody typed: the loop goes on.
        state.observed = state.last_command is not None and any(
            isinstance(p, TextPart) and not p.ignored and p.text.strip() for p in message.parts
        )
        state.acts_through_text = state.acts_through_text or state.observed
        return
    state.observed = False
    state.unanswered = True
    quote = _quote(message, text)
    state.last_user = quote
    state.said = ""
    # A plan stated before the user spoke again is not what the assistant is doing
    # about the new message.
    state.plan_said = None
    if not is_continuation(text):
        if state.request is None:
            state.request = quote
        else:
            state.latest = quote
    _add_unique(state.directives, directive_sentences(text))


def _fold_assistant(state: CheckpointState, message: Message) -> None:
    state.last_finish = message.finish
    state.observed = False
    state.unanswered = False
    for part in message.parts:
        if isinstance(part, TextPart) and not part.ignored and part.text.strip():
            _fold_text(state, part.text)
        elif isinstance(part, ToolPart):
            tool_state = part.state
            reason = state.said if state.counter - state.said_at <= _REASON_AGE else ""
            if isinstance(tool_state, ToolStateCompleted):
                _fold_call(
                    state, part.tool, tool_state.input, tool_state.output, ok=True, reason=reason
                )
            elif isinstance(tool_state, ToolStateError):
                _fold_call(
                    state, part.tool, tool_state.input, tool_state.error, ok=False, reason=reason
                )
            else:
                state.pending[part.call_id] = _Pending(
                    tool=part.tool, arguments=dict(tool_state.input), reason=reason
                )


def _fold_text(state: CheckpointState, text: str) -> None:
    reason = stated_reason(text)
    if reason:
        state.said = reason
        state.said_at = state.counter
    plan = stated_plan(text)
    if plan is not None:
        state.plan_said = plan
    state.conclusion = " ".join(text.split())[:600]
    command = trailing_command(text)
    state.last_command, state.command_said = command if command is not None else (None, "")
    if command is not None:
        for path, action in text_command_files(command[0], state.open_file):
            _fold_files(state, command[0].split()[0], {"path": path}, command[1])
            if action != "edited":
                state.open_file = path
    _add_unique(state.knowledge, knowledge_sentences(text))
    before = len(state.decisions)
    _add_unique(state.decisions, decision_sentences(text))
    added = state.decisions[before:]
    state.vague = len(added) if added and all(is_vague(d) for d in added) else 0
    if state.diagnose is not None and state.diagnose < len(state.errors):
        entry = state.errors[state.diagnose]
        found = knowledge_sentences(text) or decision_sentences(text)
        cause = found[0] if found else None
        if cause and cause not in entry.causes and len(entry.causes) < 2:
            entry.causes.append(cause)
        state.diagnose = None


def _fold_result(state: CheckpointState, part: ToolResultPart) -> None:
    pending = state.pending.pop(part.call_id, None)
    if pending is None:
        return
    _fold_call(
        state,
        pending.tool,
        pending.arguments,
        part.output,
        ok=not part.is_error,
        reason=pending.reason,
    )


def _label(tool: str, arguments: Mapping[str, object]) -> str:
    command = command_of(tool, arguments)
    if command is not None:
        head = command.splitlines()[0] if command.splitlines() else command
        return f"`{_short(head, 90)}`"
    files = file_actions(tool, arguments)
    if files:
        return f"{tool} {os.path.basename(files[0][0].rstrip('/')) or files[0][0]}"
    return tool


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fold_call(
    state: CheckpointState,
    tool: str,
    arguments: Mapping[str, object],
    output: str,
    *,
    ok: bool,
    reason: str,
) -> None:
    _add_unique(state.resources, resources_in(strings_in(dict(arguments))))
    if not ok:
        _fold_failure(state, tool, arguments, output)
        return
    items = plan_items(tool, arguments)
    if items is not None:
        _fold_plan(state, tool, items)
        return
    report = delegation_report(tool, arguments, output)
    if report is not None:
        state.done.append(f"Sub-agent {report}")
    changed = _fold_files(state, tool, arguments, reason)
    if changed and state.vague:
        # "Let me rewrite it to be a macro:" says what "it" is only with the file.
        count = min(state.vague, len(state.decisions))
        for index in range(len(state.decisions) - count, len(state.decisions)):
            state.decisions[index] = f"{state.decisions[index].rstrip(' :')} ({changed[0]})"
        state.vague = 0
    key = signature(tool, arguments)
    open_errors = [e for e in state.errors if e.status == "unresolved"]
    if changed and open_errors:
        newest = open_errors[-1]
        for name in changed:
            if name not in newest.fixes and len(newest.fixes) < 4:
                newest.fixes.append(name)
    label = _label(tool, arguments)
    for entry in open_errors:
        if entry.key == key:
            entry.status = "fixed"
            if label != entry.call:
                entry.fixed_by = label
            if state.diagnose is not None and state.errors[state.diagnose] is entry:
                state.diagnose = None
    command = command_of(tool, arguments)
    if command is not None:
        _fold_command(state, command, output)


def _fold_failure(
    state: CheckpointState, tool: str, arguments: Mapping[str, object], output: str
) -> None:
    label = _label(tool, arguments)
    if any(marker in output.lower() for marker in _REJECTED):
        _add_unique(state.notes, [f"The user rejected {label} (the call did not run)."])
        return
    key = signature(tool, arguments)
    message = error_line(output)
    for index, entry in enumerate(state.errors):
        if entry.key == key and entry.status == "unresolved":
            entry.attempts += 1
            entry.message = message
            entry.call = label
            state.diagnose = index
            return
    state.errors.append(ErrorEntry(key=key, call=label, message=message))
    state.diagnose = len(state.errors) - 1


def _fold_plan(state: CheckpointState, tool: str, items: Sequence[PlanItem]) -> None:
    before = {e.text: e.status for e in state.plan}
    for item in items:
        if item.status == "completed" and before.get(item.text) != "completed":
            state.done.append(f"Plan item completed: {item.text}")
    state.plan = [_PlanEntry(text=i.text, status=i.status) for i in items]
    state.plan_tool = tool


def _fold_files(
    state: CheckpointState, tool: str, arguments: Mapping[str, object], reason: str
) -> list[str]:
    changed: list[str] = []
    for path, action in file_actions(tool, arguments):
        entry = state.files.get(path)
        if entry is None:
            entry = state.files[path] = FileEntry(path=path)
        if action == "read":
            entry.reads += 1
            if not entry.reason and reason:
                entry.reason = reason
        else:
            if action == "created" and entry.edits == 0 and not entry.created:
                entry.created = True
            else:
                entry.edits += 1
            if reason and (_names_file(reason, path) or not _names_file(entry.reason, path)):
                # A reason that names the file says why it matters; a later one that
                # does not ("Fix the quoting:") does not replace it.
                entry.reason = reason
            if not path.lower().endswith(_PROSE_SUFFIXES):
                _add_unique(entry.defines, defined_names(arguments))
                del entry.defines[: max(0, len(entry.defines) - MAX_DEFINES)]
            changed.append(os.path.basename(path.rstrip("/")) or path)
        entry.touched = state.counter
    return changed


def _names_file(text: str, path: str) -> bool:
    """``text`` names the file: its name, or its stem when that has 4+ characters."""
    if not text:
        return False
    name = os.path.basename(path.rstrip("/")).lower()
    stem = name.rsplit(".", 1)[0]
    lowered = text.lower()
    return bool(name) and (name in lowered or (len(stem) >= 4 and stem in lowered))


def _fold_command(state: CheckpointState, command: str, output: str) -> None:
    commit = commit_subject(command, output)
    if commit is not None:
        state.done.append(f"Committed {commit}")
    branch = pushed_branch(command, output)
    if branch is not None:
        state.done.append(f"Pushed {branch}")
        _add_unique(state.resources, resources_in([output[:4000]]))
        if branch != "branch":
            _add_unique(state.resources, [f"git branch {branch} (pushed)"])
    summary = passing_test_run(command, output)
    if summary is not None:
        runner, counts = summary
        line = f"Tests passed ({runner}): {counts}"
        if state.done and state.done[-1].startswith(f"Tests passed ({runner}):"):
            state.done[-1] = line
        else:
            state.done.append(line)


def _add_unique(target: list[str], items: Iterable[str]) -> None:
    seen = {" ".join(t.lower().split()) for t in target}
    for item in items:
        norm = " ".join(item.lower().split())
        if norm and norm not in seen:
            seen.add(norm)
            target.append(item)


def _bound(state: CheckpointState) -> None:
    for items, limit in (
        (state.directives, MAX_DIRECTIVES),
        (state.done, MAX_DONE),
        (state.knowledge, MAX_SENTENCES),
        (state.decisions, MAX_SENTENCES),
        (state.resources, MAX_RESOURCES),
        (state.notes, MAX_NOTES),
    ):
        del items[: max(0, len(items) - limit)]
    if len(state.errors) > MAX_ERRORS:
        drop = len(state.errors) - MAX_ERRORS
        del state.errors[:drop]
        if state.diagnose is not None:
            state.diagnose = state.diagnose - drop if state.diagnose >= drop else None
    if len(state.files) > MAX_FILES:
        # Forget the files touched longest ago (reads before changes).
        order = sorted(
            state.files.values(), key=lambda e: (e.created or e.edits > 0, e.touched, e.path)
        )
        for entry in order[: len(state.files) - MAX_FILES]:
            del state.files[entry.path]
    while len(state.pending) > MAX_PENDING:
        del state.pending[next(iter(state.pending))]
