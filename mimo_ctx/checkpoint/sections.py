"""The eleven ``checkpoint.md`` sections rendered from a :class:`CheckpointState` (pure).

:func:`render_sections` fills every A14 section from the state and the session's
task registry; :func:`state_from_checkpoint` reads a checkpoint
this writer did not produce (an LLM writer's, or one whose state file is gone)
back into a state that carries its lines forward.

What each section shows:

1. **Active intent** — the task-defining request and the latest instruction,
   quoted verbatim under ``- Task (user message <id>):`` and ``- Latest
   instruction (user message <id>):`` (``> `` lines), and the newest message when
   it is a continuation. A quote longer than its share of the budget keeps its
   head and an elision line naming the message for the history tool.
2. **Next concrete action** — the first that applies: answer the user's newest
   message when no assistant message came after it; carry on with the stated plan when
   the assistant was mid-loop (a plan stated since the newest typed message;
   with none, carry on with that message); act on the output of its last command when an
   agent acting through text got it back (the newest message), or await it when
   that agent's newest text ended with one; the plan item
   in progress, else the next pending one; the first open task of the registry;
   the newest unresolved error; else "nothing is open".
3. **Directives** — the user's standing instructions, verbatim.
4. **Task tree** — the registry's tasks with their icons, then the host plan's
   items with ✅ / 🔄 / 🔵 / ❌.
5. **Current work** — what is done, in order (``- ✓ …``), and the assistant's
   latest words.
6. **Files and code sections** — changed files (created / edited n× / read n×,
   the names the changes define) with the assistant's stated reason, then the
   files only read, on one line; paths relative to the files' common directory,
   which the first line names.
7. **Discovered knowledge** / 10. **Design decisions** — the assistant's own
   sentences, newest kept.
8. **Errors and fixes** — each failure with its attempts, cause and fix, or
   ``Unresolved``.
9. **Live resources** — that common directory, pushed branches, URLs and ports.
11. **Open notes** — lines carried forward, calls the user rejected, ``notes.md``.

A section keeps at most its item limit and its token budget, newest items first
(unresolved errors and open plan items before the rest); what does not fit moves
to ``checkpoint-<section>.md`` with an index line (SPEC A14), regenerated from the
state on every run, so nothing the state still holds is lost.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from mimo_ctx.checkpoint.document import (
    CHECKPOINT_SECTIONS,
    fit_items,
    is_index_line,
    parse_checkpoint,
    topic_of,
)
from mimo_ctx.checkpoint.state import CheckpointState, ErrorEntry, FileEntry, Quote
from mimo_ctx.sections import ELISION_LINE, TASK_STATUS_ICONS
from mimo_ctx.session import TERMINAL_TASK_STATUSES, Task
from mimo_ctx.tokens import estimate_text_tokens

__all__ = [
    "ITEM_LIMITS",
    "QUOTE_HEADER",
    "RenderedSections",
    "names_user_messages",
    "refer_to_quoted",
    "render_sections",
    "state_from_checkpoint",
    "task_tree_lines",
]

ITEM_LIMITS: Final[Mapping[int, int]] = {3: 20, 5: 16, 6: 30, 7: 12, 8: 12, 9: 12, 10: 10, 11: 20}
"""Most items a section keeps in ``checkpoint.md``; older ones go to its spill-over file."""

QUOTE_HEADER: Final = re.compile(r"^- (?P<label>[^(]+) \(user message (?P<id>[^)\s]+)\):$")
"""The line that opens a quoted user message in §1 (its ``> `` lines follow)."""

_INLINE_QUOTE = re.compile(r'\(user message (?P<id>[^)\s]+)\): ".*"$')
_QUOTE_LINE = re.compile(r"  (?:>|\[…elided )")
# Every quote (header or inline) names its message so; lines without it are kept.
_QUOTE_MARK: Final = "(user message "

PLAN_ICONS: Final[Mapping[str, str]] = {
    "completed": "✅",
    "in_progress": "🔄",
    "pending": "🔵",
    "cancelled": "❌",
}

_QUOTE_SHARE: Final = 0.45  # of the §1 budget, per quoted message


@dataclass(frozen=True, slots=True)
class RenderedSections:
    """Section bodies and spill-over files.

    Attributes:
        bodies: Lines per section number (empty: the section reads ``(none)``).
        extra_files: ``checkpoint-<section>.md`` name -> content.
    """

    bodies: dict[int, list[str]]
    extra_files: dict[str, str]


def task_tree_lines(tasks: Sequence[Task]) -> list[str]:
    """Task ids with status icons, sub-tasks indented under their parent (A14 §4)."""

    def key(task: Task) -> list[int | str]:
        return [int(p) if p.isdigit() else p for p in re.split(r"[.T]", task.id) if p]

    children: dict[str | None, list[Task]] = {}
    known = {t.id for t in tasks}
    for task in sorted(tasks, key=key):
        parent = task.parent_id if task.parent_id in known else None
        children.setdefault(parent, []).append(task)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for task in children.get(parent, []):
            icon = TASK_STATUS_ICONS.get(task.status, "")
            summary = f" — {_one_line(task.summary, 120)}" if task.summary else ""
            lines.append(f"{'  ' * depth}- {icon}{task.id} {task.status}{summary}")
            walk(task.id, depth + 1)

    walk(None, 0)
    return lines


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    return (head[:space] if space >= limit * 2 // 3 else head) + "…"


# -- §1 ------------------------------------------------------------------------------------


def _quote_block(label: str, quote: Quote, budget: int) -> str:
    """One quoted message: its header line and ``> `` lines, as one item."""
    return "\n".join(_quote_lines(label, quote, budget))


def _quote_lines(label: str, quote: Quote, budget: int) -> list[str]:
    text = quote.text
    limit = max(200, int(budget * _QUOTE_SHARE) * 4)
    lines = [f"- {label} (user message {quote.id}):"]
    if len(text) > limit or quote.cut:
        head = text[:limit]
        lines += [f"  > {line}" if line else "  >" for line in head.splitlines()]
        lines.append(
            "  "
            + ELISION_LINE.format(
                tokens=max(1, estimate_text_tokens(text) - estimate_text_tokens(head)),
                message_id=quote.id,
            )
        )
        return lines
    return lines + [f"  > {line}" if line else "  >" for line in text.splitlines()]


def _intent(state: CheckpointState, budget: int) -> list[str]:
    lines: list[str] = []
    if state.request is not None:
        lines.append(_quote_block("Task", state.request, budget))
    if state.latest is not None:
        lines.append(_quote_block("Latest instruction", state.latest, budget))
    last = state.last_user
    shown = {q.id for q in (state.request, state.latest) if q is not None}
    if last is not None and last.id not in shown:
        said = _one_line(last.text, 120)
        lines.append(f'- Then the user said (user message {last.id}): "{said}"')
    return lines or state.carried.get(1, [])


# -- §2 ------------------------------------------------------------------------------------

_TOOL_CALL_FINISHES: Final = frozenset({"tool-calls", "tool_calls", "tool_use"})
_OPEN_TASK_ORDER: Final = ("in_progress", "dispatched", "open", "blocked", "human_review")


def _next_action(state: CheckpointState, tasks: Sequence[Task]) -> list[str]:
    plan = state.plan_items
    doing = next((i for i in plan if i.status == "in_progress"), None)
    pending = next((i for i in plan if i.status == "pending"), None)
    open_tasks = sorted(
        (t for t in tasks if t.status not in TERMINAL_TASK_STATUSES),
        key=lambda t: _OPEN_TASK_ORDER.index(t.status) if t.status in _OPEN_TASK_ORDER else 9,
    )
    unresolved = [e for e in state.errors if e.status == "unresolved"]
    lines: list[str] = []
    last_user_last = state.last_user is not None and (
        state.unanswered or state.last_user.id == state.upto
    )
    if last_user_last and state.last_user is not None:
        lines.append(
            f"- Answer the user's newest message (user message {state.last_user.id}): "
            f'"{_one_line(state.last_user.text, 160)}"'
        )
    elif state.last_finish in _TOOL_CALL_FINISHES and state.plan_said:
        lines.append(f"- Carry on (mid-task): {state.plan_said}")
    elif state.last_finish in _TOOL_CALL_FINISHES and state.last_user is not None:
        # Mid-loop on the newest message without a word of plan since it.
        lines.append(
            f"- Carry on (mid-task) with the user's newest message (user message "
            f'{state.last_user.id}): "{_one_line(state.last_user.text, 160)}"'
        )
    elif state.last_command is not None and (state.observed or state.acts_through_text):
        said = f" It said: {state.command_said}" if state.command_said else ""
        what = "came back; act on it" if state.observed else "has not returned yet: await it"
        lines.append(
            f"- Carry on (mid-task): the output of the assistant's last command "
            f"`{state.last_command}` {what}.{said}"
        )
    if doing is not None:
        lines.append(f"- Continue the plan item in progress: {doing.text}")
    elif pending is not None:
        lines.append(f"- Start the next plan item: {pending.text}")
    if open_tasks:
        task = open_tasks[0]
        lines.append(f"- Continue {task.id} ({task.status}): {_one_line(task.summary, 200)}")
    if not lines and unresolved:
        entry = unresolved[-1]
        lines.append(f"- Fix the failing {entry.call}: {entry.message}")
    if not lines and state.plan_said and state.last_finish is None:
        lines.append(f"- {state.plan_said}")
    if not lines:
        if state.conclusion:
            lines.append(
                "- Nothing is open: the last turn ended with the assistant's answer "
                f'("{_one_line(state.conclusion, 160)}"). Wait for the next instruction.'
            )
        else:
            lines += state.carried.get(2, [])
    return lines


# -- §4, §5 ---------------------------------------------------------------------------------


def _task_tree(state: CheckpointState, tasks: Sequence[Task]) -> list[str]:
    lines = task_tree_lines(tasks)
    if state.plan:
        lines.append(f"- Plan ({state.plan_tool or 'plan tool'}):")
        lines += [
            f"  - {PLAN_ICONS.get(i.status, '')} {_one_line(i.text, 200)}" for i in state.plan
        ]
    return state.carried.get(4, []) + lines


def _current_work(state: CheckpointState) -> list[str]:
    lines = [f"- ✓ {item}" for item in state.done]
    if state.conclusion:
        lines.append(f"- Latest: {_one_line(state.conclusion, 400)}")
    return state.carried.get(5, []) + lines


# -- §6, §9 ---------------------------------------------------------------------------------


def _common_root(paths: Sequence[str]) -> str | None:
    absolute = [p for p in paths if p.startswith("/")]
    if len(absolute) < 2:
        return None
    root = os.path.commonpath([os.path.dirname(p) for p in absolute])
    return root if root.count("/") >= 2 else None


def _relative(path: str, root: str | None) -> str:
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path


def _file_line(entry: FileEntry, root: str | None) -> str:
    what: list[str] = []
    if entry.created:
        what.append("created")
    if entry.edits:
        what.append("edited" if entry.edits == 1 else f"edited {entry.edits}×")
    if entry.reads:
        what.append("read" if entry.reads == 1 else f"read {entry.reads}×")
    if entry.defines:
        what.append("defines " + ", ".join(f"`{name}`" for name in entry.defines))
    reason = f" — {_one_line(entry.reason, 160)}" if entry.reason else ""
    return f"- {_relative(entry.path, root)} — {', '.join(what)}{reason}"


def _files(state: CheckpointState, root: str | None) -> tuple[list[str], list[str]]:
    """Changed-file lines (oldest change first) and the read-only paths."""
    entries = list(state.files.values())
    changed = sorted((e for e in entries if e.created or e.edits), key=lambda e: e.touched)
    read = sorted((e for e in entries if not (e.created or e.edits)), key=lambda e: e.touched)
    return [_file_line(e, root) for e in changed], [_relative(e.path, root) for e in read]


# -- §8 -------------------------------------------------------------------------------------


def _error_line(entry: ErrorEntry) -> str:
    times = f" ({entry.attempts}×)" if entry.attempts > 1 else ""
    text = f"- {entry.call} failed{times}: {entry.message}"
    if entry.causes:
        text += f" — cause: {' '.join(_one_line(c, 200) for c in entry.causes)}"
    if entry.status == "fixed":
        how: list[str] = []
        if entry.fixes:
            how.append(f"after changing {', '.join(entry.fixes)}")
        if entry.fixed_by:
            how.append(f"with {entry.fixed_by}")
        text += " → fixed" + (f" ({'; '.join(how)})" if how else "") + "."
    else:
        text += " → unresolved."
    return text


# -- fitting --------------------------------------------------------------------------------


def _fit(
    number: int,
    items: Sequence[str],
    budget: int,
    *,
    head: Sequence[str] = (),
    keep: frozenset[int] = frozenset(),
) -> tuple[list[str], tuple[str, str] | None]:
    return fit_items(number, items, budget, limit=ITEM_LIMITS.get(number), head=head, keep=keep)


def render_sections(
    state: CheckpointState,
    *,
    tasks: Sequence[Task],
    budgets: Mapping[int, int],
) -> RenderedSections:
    """The A14 section bodies for ``state`` (see the module docstring).

    Args:
        state: What the writer has folded so far (``notes.md`` included, see
            :func:`~mimo_ctx.checkpoint.state.fold_notes`).
        tasks: The session's task registry.
        budgets: Token budget per section number (A14 defaults where missing).
    """

    def budget(number: int) -> int:
        default = next(s.budget for s in CHECKPOINT_SECTIONS if s.number == number)
        return budgets.get(number, default)

    bodies: dict[int, list[str]] = {}
    extra: dict[str, str] = {}

    def put(number: int, fitted: tuple[list[str], tuple[str, str] | None]) -> None:
        bodies[number] = fitted[0]
        if fitted[1] is not None:
            extra[fitted[1][0]] = fitted[1][1]

    intent = _intent(state, budget(1))
    put(1, _fit(1, intent, budget(1), keep=frozenset(range(min(2, len(intent))))))
    put(2, _fit(2, _next_action(state, tasks), budget(2), keep=frozenset({0})))
    put(3, _fit(3, state.carried.get(3, []) + [f"- {d}" for d in state.directives], budget(3)))
    put(4, _fit(4, _task_tree(state, tasks), budget(4)))
    put(5, _fit(5, _current_work(state), budget(5)))

    root = _common_root(list(state.files))
    changed, read = _files(state, root)
    head = [f"- Paths below are relative to {root}/"] if root else []
    if read:
        changed = [*changed, _read_line(read, budget(6) // 3)]
    put(6, _fit(6, state.carried.get(6, []) + changed, budget(6), head=head))

    put(7, _fit(7, state.carried.get(7, []) + [f"- {k}" for k in state.knowledge], budget(7)))
    errors = [_error_line(e) for e in state.errors]
    open_errors = frozenset(
        i + len(state.carried.get(8, []))
        for i, e in enumerate(state.errors)
        if e.status == "unresolved"
    )
    put(8, _fit(8, state.carried.get(8, []) + errors, budget(8), keep=open_errors))
    resources = ([f"- Project directory: {root}"] if root else []) + [
        f"- {r}" for r in state.resources
    ]
    put(9, _fit(9, state.carried.get(9, []) + resources, budget(9)))
    put(10, _fit(10, state.carried.get(10, []) + [f"- {d}" for d in state.decisions], budget(10)))
    put(11, _fit(11, state.carried.get(11, []) + [f"- {n}" for n in state.notes], budget(11)))
    return RenderedSections(bodies=bodies, extra_files=extra)


def _read_line(paths: Sequence[str], budget: int) -> str:
    """One line naming the files only read, newest last, within ``budget`` tokens."""
    kept: list[str] = []
    used = 10
    for path in reversed(paths):
        price = estimate_text_tokens(path) + 1
        if used + price > budget:
            break
        kept.append(path)
        used += price
    kept.reverse()
    more = len(paths) - len(kept)
    tail = f" (and {more} more)" if more else ""
    return f"- Read only: {', '.join(kept)}{tail}"


def names_user_messages(text: str) -> bool:
    """Whether ``text`` may quote a user message: without, :func:`refer_to_quoted`
    hands it back as it is, whatever the quoted messages are."""
    return _QUOTE_MARK in text


def refer_to_quoted(text: str, quoted: Collection[str], where: str) -> str:
    """``text`` with the quotes of ``quoted`` messages replaced by a pointer to ``where``.

    The rebuild body quotes each user message once: where "Recent user
    input" already holds a message word for word, the checkpoint's §1 block
    (header and ``> `` lines) and inline quotes (``(user message <id>): "…"``) of it
    become ``(user message <id>): quoted under <where>``. Lines that are not such
    quotes are kept as they are.

    Cost: only the lines that name a user message are looked at (found with one
    substring search each), the rest is copied in slices; a checkpoint without
    quotes is returned as it is.
    """
    if not quoted or not names_user_messages(text):
        return text
    wanted = set(quoted)
    pieces: list[str] = []
    copied = 0  # text[:copied] is in `pieces` already
    found = text.find(_QUOTE_MARK)
    while found >= 0:
        start = text.rfind("\n", 0, found) + 1
        end = _end_of_line(text, found)
        line = text[start:end]
        header = QUOTE_HEADER.match(line)
        if header is not None and header.group("id") in wanted:
            # The header and the quote lines right after it become one pointer.
            while end < len(text) and _QUOTE_LINE.match(text, end + 1):
                end = _end_of_line(text, end + 1)
            replacement = (
                f"- {header.group('label')} (user message {header.group('id')}): "
                f"quoted under {where}"
            )
            pieces.extend((text[copied:start], replacement))
            copied = end
        else:
            inline = _INLINE_QUOTE.search(line)
            if inline is not None and inline.group("id") in wanted:
                pieces.extend(
                    (
                        text[copied : start + inline.start()],
                        f"(user message {inline.group('id')}): quoted under {where}",
                    )
                )
                copied = end
        found = text.find(_QUOTE_MARK, end)
    if not pieces:
        return text
    pieces.append(text[copied:])
    return "".join(pieces)


def _end_of_line(text: str, position: int) -> int:
    end = text.find("\n", position)
    return len(text) if end < 0 else end


def state_from_checkpoint(text: str | None) -> CheckpointState:
    """A state that carries forward the sections of a checkpoint it did not write.

    Every non-empty line of each section is kept as it is (spill-over index lines
    excepted: their files are regenerated or left as they are), and rendered
    before what later messages add.
    """
    state = CheckpointState(carried_topic=topic_of(text))
    if not text:
        return state
    for number, lines in parse_checkpoint(text).items():
        kept = [line for line in lines if line.strip() and not is_index_line(line)]
        if kept:
            state.carried[number] = kept
    return state
