"""Import Claude Code session transcripts (``~/.claude/projects/*/<session>.jsonl``).

Each line of a Claude Code transcript is one JSON object. Lines of type ``user``
and ``assistant`` are the conversation, and queued messages (``queue-operation``
enqueue lines, ``queued_command`` attachments) are what the user typed while the
agent worked (see below); ``system``, ``progress``, ``file-history-snapshot``,
``summary`` and any other type are bookkeeping and are not imported (they still
link the chain, see below).

Decisions (our choices, documented here because the format is not):

* **Active branch.** Lines form a tree through ``parentUuid``. Per agent we
  take the chain that ends at the agent's last conversation line and walk it
  back to the root, through bookkeeping lines, and across a compaction
  (a ``compact_boundary`` line has no ``parentUuid`` but a
  ``logicalParentUuid`` pointing at the last line before it). Claude Code also
  makes side branches that are *not* alternatives: parallel tool calls of one
  API response and their tool results hang off different lines (progress lines
  split the chain). Such lines are kept: an off-chain assistant line whose
  ``message.id`` is on the chain (same API response), and an off-chain user line
  holding only results for kept tool calls. Everything else off the chain is a
  real fork (the user rewound or edited a message): it is left out and listed in
  :attr:`~mimo_ctx.importers.ImportedTranscript.off_branch`. When the walk meets
  a parent that is not in the files read (a line skipped as malformed, or a line
  of another agent), it continues at the agent's previous conversation line, so
  a gap does not cut off the history before it.
* **Sub-agents.** ``isSidechain`` lines are sub-agent conversations: their
  ``agentId`` is the message's ``agent``. Old (v1.0) transcripts keep
  sub-agents inline without an ``agentId``; each such chain becomes the agent
  ``sidechain-<first 8 characters of its root uuid>``. Newer transcripts keep
  them in separate files, which are **loaded automatically** when they sit
  beside the main file as ``<stem>_subagents_agent-<id>.jsonl`` or in
  ``<stem>/subagents/agent-<id>.jsonl`` (Claude Code's own layout); pass
  ``subagents=[...]`` to choose the files, or ``subagents=[]`` for none.
  ``agent-acompact-*`` files are Claude Code's compaction sub-agent and are
  imported like any other sub-agent. Messages of all agents are merged into one
  list by time (each agent keeps its own order). Copies of sub-agent messages
  inside ``progress`` lines (``agent_progress``) are not imported: when a
  session's sub-agent files are missing, its sub-agents are missing too.
* **Merging.** Claude Code writes one API response as several lines, one per
  content block, all with the same ``message.id``. Consecutive lines with the
  same ``message.id`` (user lines holding only tool results may sit between
  them) become one assistant message with
  ``provider_message_id`` set; its usage is the last line's (the most complete),
  its ``time_completed`` the last line's time.
* **Tools.** A ``tool_use`` block and the ``tool_result`` that answers it (in a
  later user line) are joined into one ``ToolPart`` of the assistant message:
  ``completed`` with the result text, ``error`` when ``is_error``, ``running``
  (which reads as interrupted) when no result ever came. A result with no known
  call becomes a ``tool`` message holding a ``ToolResultPart``. User lines that
  hold only tool results do not become user messages.
* **Finish.** ``stop_reason`` maps to ``finish`` (``end_turn``/``stop_sequence``
  -> ``stop``, ``tool_use`` -> ``tool-calls``, ``max_tokens`` -> ``length``,
  ``refusal`` -> ``content-filter``, others unchanged). Claude Code usually
  writes ``null`` (streamed lines), so a missing one is inferred from content:
  ``tool-calls`` when the message made calls, else ``stop``; only a last message
  whose call never got a result stays unfinished. API error lines
  (``isApiErrorMessage``) get ``error`` instead of ``finish``.
* **Compactions.** A user line with ``isCompactSummary`` becomes a user message
  whose only content is a ``CompactionPart`` with the summary; it is listed in
  ``compactions`` with the pre-compaction token count from the boundary line's
  ``compactMetadata.preTokens`` when present.
* **The user's words.** What the person typed is a plain text part;
  what the CLI wrote into user lines is not (:mod:`._machine_text`). A slash
  command (``<command-name>/x</command-name>`` with ``<command-args>``) becomes
  the command as typed, ``/x args``; a bash-mode input
  (``<bash-input>cmd</bash-input>``) becomes ``!cmd``; the wrapper itself is kept
  as an ``ignored`` part (stored, never sent). Local command output
  (``<local-command-stdout>``...), caveats, ``<system-reminder>``, hook output
  (``<user-prompt-submit-hook>``), ``<task-notification>`` (to the end of the
  text: the CLI appends a "Read the output file" line) and the
  ``[Request interrupted by user...]`` notes are split out of the text into a
  ``synthetic`` part (sent, but never quoted as the user's words), terminal
  colour codes removed; the original text is then kept as an ``ignored`` part.
  Lines with ``isMeta`` (skill bodies, caveats) are synthetic as a whole.
* **Queued messages.** A message the user typed while the agent was busy is a
  ``queue-operation`` line (``operation: "enqueue"``, the text in ``content``),
  or in newer versions an ``attachment`` line of type ``queued_command``.
  Claude Code delivers it either as a user line of its own (then that line is
  the message and the queued record is not imported again) or inside the running
  turn, with no user line at all. Each queued text that no later main-chain user
  line repeats becomes a main-agent user message at the time it was queued
  (metadata ``{"claude_code": {"queued": true, "line": n}}``), split like any
  user text.
* ``thinking`` -> ``ReasoningPart`` (signature kept); ``redacted_thinking`` ->
  ``ReasoningPart(redacted=True)`` with the encrypted ``data`` kept as
  ``signature`` (it must be sent back unchanged); images and base64/URL
  documents -> ``FilePart`` (``data:`` URL); any other block type ->
  ``OpaquePart(source="claude-code")``.
"""

from __future__ import annotations

import glob
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from mimo_ctx.convert import (
    MessageDraft,
    ToolCallJoiner,
    infer_finish,
)
from mimo_ctx.importers._claude_code_lines import Line, ToolResult, ToolUse, read_lines
from mimo_ctx.importers._common import (
    FORMAT_CLAUDE_CODE,
    ImportedTranscript,
    Problems,
    SkippedLine,
    TranscriptCompaction,
    build_transcript_messages,
    file_time_ms,
    first_line,
    new_session,
    orphan_result_draft,
    read_bytes,
)
from mimo_ctx.importers._machine_text import split_machine_text, strip_ansi, user_text_parts
from mimo_ctx.messages import (
    MAIN_AGENT,
    CompactionPart,
    MessageError,
    Part,
    TextPart,
)
from mimo_ctx.typed_input import CLAUDE_CODE_MACHINE_TAGS, tag_body

__all__ = ["find_subagent_files", "import_claude_code"]

_STOP_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "length",
    "refusal": "content-filter",
}

# A task notification runs to the end of its text (a "Read the output file" line follows).
_MACHINE_TO_END: Final = ("task-notification",)
_MACHINE_LINES: Final = (r"\[Request interrupted by user[^\]\n]*\]",)

_OFF_BRANCH_REASON: Final = "not on the active branch (abandoned fork)"


# ---------------------------------------------------------------------------
# Sub-agent files
# ---------------------------------------------------------------------------


def find_subagent_files(path: str | Path) -> list[Path]:
    """Sub-agent transcripts stored beside a Claude Code session file.

    Looks for ``<stem>_subagents_agent-*.jsonl`` next to the file and for
    ``<stem>/subagents/agent-*.jsonl`` (Claude Code's own layout).
    """
    main = Path(path)
    stem = glob.escape(main.stem)
    beside = sorted(main.parent.glob(f"{stem}_subagents_agent-*.jsonl"))
    nested = sorted((main.parent / main.stem / "subagents").glob("agent-*.jsonl"))
    return [p for p in beside + nested if p.is_file()]


def _agent_from_name(path: Path) -> str:
    name = path.stem
    marker = "agent-"
    at = name.rfind(marker)
    return name[at + len(marker) :] if at >= 0 and name[at + len(marker) :] else name


# ---------------------------------------------------------------------------
# Grouping and branch selection
# ---------------------------------------------------------------------------


def _assign_agents(
    main_lines: list[Line], sub_files: list[tuple[Path, list[Line]]], by_uuid: dict[str, Line]
) -> list[tuple[str, list[Line]]]:
    """Conversation lines per agent, main first, then by first appearance."""
    groups: dict[str, list[Line]] = {}
    taken: set[str] = set()
    last_inline: str | None = None

    def inline_group(line: Line) -> str:
        # v1.0 inline sidechain without agentId: join the chain of its parent.
        nonlocal last_inline
        parent = line.parent
        seen: set[str] = set()
        while parent is not None and parent not in seen:
            seen.add(parent)
            up = by_uuid.get(parent)
            if up is None:
                # Gap (a skipped line): assume it continues the latest sidechain.
                if last_inline is not None:
                    return last_inline
                break
            if up.is_conversation:
                if up.sidechain and up.path == line.path:
                    return up.agent
                break
            parent = up.parent
        assert line.uuid is not None  # conversation lines always have one
        name = f"sidechain-{line.uuid[:8]}"
        suffix = 2
        while name in taken:
            name = f"sidechain-{line.uuid[:8]}-{suffix}"
            suffix += 1
        taken.add(name)
        return name

    for line in main_lines:
        if not line.is_conversation:
            continue
        if not line.sidechain:
            line.agent = MAIN_AGENT
        elif line.agent_id:
            line.agent = line.agent_id
        else:
            line.agent = inline_group(line)
            last_inline = line.agent
        groups.setdefault(line.agent, []).append(line)
    for path, lines in sub_files:
        default = _agent_from_name(path)
        for line in lines:
            if line.is_conversation:
                line.agent = line.agent_id or default
                groups.setdefault(line.agent, []).append(line)
    return sorted(groups.items(), key=lambda item: item[0] != MAIN_AGENT)


def _select_branch(agent: str, lines: list[Line], by_uuid: dict[str, Line]) -> list[bool]:
    """Which of an agent's conversation lines are imported (see the module docs)."""
    position = {id(line): i for i, line in enumerate(lines)}
    keep = [False] * len(lines)
    visited: set[str] = set()
    cur: Line | None = lines[-1]
    last = len(lines) - 1
    while cur is not None:
        at = position.get(id(cur))
        if at is not None:
            if keep[at]:
                break
            keep[at] = True
            last = at
        nxt_id = cur.parent if cur.parent is not None else cur.logical_parent
        if nxt_id is None:
            break
        nxt = by_uuid.get(nxt_id)
        gap = (
            nxt is None
            or nxt_id in visited
            or (nxt.is_conversation and (nxt.agent != agent or id(nxt) not in position))
        )
        if gap:
            # Bridge the gap from the agent's previous conversation line.
            cur = lines[last - 1] if last > 0 else None
            continue
        visited.add(nxt_id)
        cur = nxt
    # Side lines of the same response and results of kept calls are not forks.
    changed = True
    while changed:
        changed = False
        responses = {
            line.message_id
            for i, line in enumerate(lines)
            if keep[i] and line.type == "assistant" and line.message_id is not None
        }
        calls = {
            b.id
            for i, line in enumerate(lines)
            if keep[i] and line.type == "assistant"
            for b in line.blocks
            if isinstance(b, ToolUse)
        }
        for i, line in enumerate(lines):
            if keep[i]:
                continue
            if line.type == "assistant":
                attach = line.message_id is not None and line.message_id in responses
            else:
                attach = bool(line.blocks) and all(
                    isinstance(b, ToolResult) and b.tool_use_id in calls for b in line.blocks
                )
            if attach:
                keep[i] = True
                changed = True
    return keep


# ---------------------------------------------------------------------------
# Building messages
# ---------------------------------------------------------------------------


def _user_parts(part: TextPart, is_meta: bool) -> list[TextPart]:
    """One user text block as typed, synthetic and ignored parts (see the module docs)."""
    raw = part.text
    if is_meta:
        clean = strip_ansi(raw)
        if clean == raw:
            return [part.model_copy(update={"synthetic": True})]
        return [TextPart(text=clean, synthetic=True), TextPart(text=raw, ignored=True)]
    name = tag_body(raw, "command-name")
    if name is not None:
        name = strip_ansi(name).strip()
        if name and not name.startswith("/"):
            name = "/" + name
        args = strip_ansi(tag_body(raw, "command-args") or "").strip()
        typed = f"{name} {args}".strip()
        return user_text_parts(raw, typed, [] if typed else [raw])
    bash = tag_body(raw, "bash-input")
    if bash is not None and strip_ansi(bash).strip():
        return user_text_parts(raw, f"!{strip_ansi(bash).strip()}", [])
    typed, machine = split_machine_text(
        raw, CLAUDE_CODE_MACHINE_TAGS, to_end=_MACHINE_TO_END, lines=_MACHINE_LINES
    )
    if not machine and typed == raw.strip():
        return [part]
    return user_text_parts(raw, typed, machine)


def _typed_text(draft: MessageDraft) -> str:
    return "\n".join(
        p.text for p in draft.parts if isinstance(p, TextPart) and not p.synthetic and not p.ignored
    )


def _queued_drafts(lines: list[Line], delivered: list[MessageDraft]) -> list[MessageDraft]:
    """User messages for queued texts that no later user line delivered (see the module docs)."""
    out: list[MessageDraft] = []
    for line in lines:
        if line.queued is None or line.sidechain:
            continue
        parts: list[Part] = []
        for block in line.blocks:
            if isinstance(block, TextPart):
                parts.extend(_user_parts(block, False))
            elif not isinstance(block, ToolUse | ToolResult):
                parts.append(block)
        draft = MessageDraft(
            role="user",
            time=line.ts,
            parts=parts,
            metadata={"claude_code": {"line": line.number, "queued": True}},
        )
        if line.uuid is not None:
            draft.metadata["claude_code"]["uuids"] = [line.uuid]
        text = _typed_text(draft)
        if not text and not any(not isinstance(p, TextPart) for p in parts):
            continue
        seen = [d for d in delivered if (d.time or 0) >= line.ts] + out
        if text and any(_typed_text(d) == text for d in seen):
            continue
        out.append(draft)
    return out


def _insert_by_time(drafts: list[MessageDraft], extra: list[MessageDraft]) -> list[MessageDraft]:
    """``drafts`` with each of ``extra`` after the last draft not newer than it."""
    merged = list(drafts)
    for item in extra:
        at = len(merged)
        while at > 0 and (merged[at - 1].time or 0) > (item.time or 0):
            at -= 1
        merged.insert(at, item)
    return merged


@dataclass
class _PendingCompaction:
    draft: MessageDraft
    line: Line
    trigger: str | None
    tokens_before: int | None


def _compact_boundary(line: Line, by_uuid: dict[str, Line], boundaries: list[Line]) -> Line | None:
    parent = by_uuid.get(line.parent) if line.parent is not None else None
    if parent is not None and parent.subtype == "compact_boundary":
        return parent
    before = [b for b in boundaries if b.path == line.path and b.number < line.number]
    return before[-1] if before else None


def _build_agent(
    agent: str,
    lines: list[Line],
    by_uuid: dict[str, Line],
    boundaries: list[Line],
    compactions: list[_PendingCompaction],
) -> list[MessageDraft]:
    drafts: list[MessageDraft] = []
    joiner = ToolCallJoiner()
    called: set[str] = set()
    current: MessageDraft | None = None
    for line in lines:
        source = {"uuids": [line.uuid], "line": line.number}
        if line.type == "assistant":
            if (
                current is not None
                and drafts
                and drafts[-1] is current
                and line.message_id is not None
                and current.provider_message_id == line.message_id
            ):
                current.metadata["claude_code"]["uuids"].append(line.uuid)
            else:
                current = MessageDraft(
                    role="assistant",
                    time=line.ts,
                    agent=agent,
                    provider_message_id=line.message_id,
                    metadata={"claude_code": source},
                )
                drafts.append(current)
            for block in line.blocks:
                if isinstance(block, ToolUse):
                    joiner.add_call(current, block.id, block.name, block.input, start=line.ts)
                    called.add(block.id)
                elif not isinstance(block, ToolResult):  # parsing keeps results out
                    current.parts.append(block)
            current.time_completed = line.ts
            current.model = line.model or current.model
            if line.usage is not None:
                current.usage = line.usage
            if line.stop_reason is not None:
                current.finish = _STOP_REASONS.get(line.stop_reason, line.stop_reason)
            if line.is_api_error:
                text = "\n".join(p.text for p in current.parts if isinstance(p, TextPart))
                current.error = MessageError(name="APIError", message=text)
            continue
        parts: list[Part] = []
        for block in line.blocks:
            if isinstance(block, ToolResult):
                joined = joiner.join(
                    block.tool_use_id,
                    block.output,
                    is_error=block.is_error,
                    attachments=block.attachments,
                    end=line.ts,
                )
                if not joined:
                    why = "duplicate result" if block.tool_use_id in called else "no such tool call"
                    drafts.append(
                        orphan_result_draft(
                            block.tool_use_id,
                            block.output,
                            is_error=block.is_error,
                            attachments=block.attachments,
                            end=line.ts,
                            agent=agent,
                            why=why,
                        )
                    )
            elif isinstance(block, TextPart):
                parts.extend(_user_parts(block, line.is_meta))
            elif not isinstance(block, ToolUse):
                parts.append(block)
        meta: dict[str, Any] = {"claude_code": source}
        if line.is_meta:
            meta["claude_code"]["is_meta"] = True
        if line.is_compact_summary:
            summary = "\n".join(p.text for p in parts if isinstance(p, TextPart))
            boundary = _compact_boundary(line, by_uuid, boundaries)
            trigger = boundary.compact_trigger if boundary else None
            others = [p for p in parts if not isinstance(p, TextPart)]
            draft = MessageDraft(
                role="user",
                time=line.ts,
                agent=agent,
                parts=[CompactionPart(summary=summary, auto=trigger != "manual"), *others],
                metadata=meta,
            )
            drafts.append(draft)
            compactions.append(
                _PendingCompaction(
                    draft, line, trigger, boundary.compact_pre_tokens if boundary else None
                )
            )
        elif parts:
            drafts.append(
                MessageDraft(role="user", time=line.ts, agent=agent, parts=parts, metadata=meta)
            )
    for i, d in enumerate(drafts):
        if d.role == "assistant" and d.finish is None:
            d.finish = infer_finish(d, followed=i < len(drafts) - 1)
    return drafts


def _merge_by_time(per_agent: list[list[MessageDraft]]) -> list[MessageDraft]:
    """One list in time order; each agent keeps its own order (running max time)."""
    streams: list[list[tuple[int, int, int, MessageDraft]]] = []
    for rank, drafts in enumerate(per_agent):
        running = 0
        stream: list[tuple[int, int, int, MessageDraft]] = []
        for i, d in enumerate(drafts):
            running = max(running, d.time or 0)
            stream.append((running, rank, i, d))
        streams.append(stream)
    return [item[3] for item in heapq.merge(*streams, key=lambda item: item[:3])]


def import_claude_code(
    path: Path,
    data: bytes,
    *,
    strict: bool,
    session_id: str | None,
    subagents: Sequence[str | Path] | None = None,
) -> ImportedTranscript:
    """Import a Claude Code transcript already read into ``data``.

    Args:
        path: The main transcript file.
        data: Its bytes.
        strict: Raise on the first malformed line instead of skipping it.
        session_id: Id for the new session (default: a new ascending id).
        subagents: Sub-agent files to import too; ``None`` finds them beside the
            main file (:func:`find_subagent_files`), ``[]`` imports none.

    Raises:
        TranscriptError: A line is malformed (``strict``), or a file cannot be read.
    """
    problems = Problems(strict=strict)
    main_lines = read_lines(path, data, problems)
    sub_paths = find_subagent_files(path) if subagents is None else [Path(p) for p in subagents]
    sub_files = [(p, read_lines(p, read_bytes(p), problems)) for p in sub_paths]

    by_uuid: dict[str, Line] = {}
    for line in [*main_lines, *(ln for _, lines in sub_files for ln in lines)]:
        if line.uuid is not None:
            by_uuid.setdefault(line.uuid, line)
    boundaries = [
        ln
        for ln in [*main_lines, *(ln for _, lines in sub_files for ln in lines)]
        if ln.subtype == "compact_boundary"
    ]

    off_branch: list[SkippedLine] = []
    per_agent: list[list[MessageDraft]] = []
    pending: list[_PendingCompaction] = []
    main_path_uuids: set[str] = set()
    for agent, lines in _assign_agents(main_lines, sub_files, by_uuid):
        keep = _select_branch(agent, lines, by_uuid)
        kept = [line for line, k in zip(lines, keep, strict=True) if k]
        off_branch.extend(
            SkippedLine(str(line.path), line.number, _OFF_BRANCH_REASON)
            for line, k in zip(lines, keep, strict=True)
            if not k
        )
        drafts = _build_agent(agent, kept, by_uuid, boundaries, pending)
        if agent == MAIN_AGENT:
            main_path_uuids = {line.uuid for line in kept if line.uuid is not None}
            user_drafts = [d for d in drafts if d.role == "user"]
            drafts = _insert_by_time(drafts, _queued_drafts(main_lines, user_drafts))
        per_agent.append(drafts)

    ordered = _merge_by_time(per_agent)
    first = next((ln for ln in main_lines if ln.is_conversation), None)
    started = ordered[0].time if ordered and ordered[0].time is not None else file_time_ms(path)
    session = new_session(
        session_id=session_id,
        time_created=started,
        title=_title(main_lines, main_path_uuids, ordered),
        fmt=FORMAT_CLAUDE_CODE,
        source=path,
        metadata={"claude_code": _session_facts(first)} if first is not None else None,
    )
    messages = build_transcript_messages(ordered, session.id)
    index = {id(d): i for i, d in enumerate(ordered)}
    compactions: list[TranscriptCompaction] = []
    for item in pending:
        i = index[id(item.draft)]
        tokens = item.tokens_before
        if tokens is None:
            tokens = _usage_before(messages, i, messages[i].agent)
        compactions.append(
            TranscriptCompaction(
                message_id=messages[i].id,
                index=i,
                at=messages[i].time_created,
                agent=messages[i].agent,
                line=item.line.number,
                trigger=item.trigger,
                tokens_before=tokens,
            )
        )
    compactions.sort(key=lambda c: c.index)
    return ImportedTranscript(
        session=session,
        messages=messages,
        format=FORMAT_CLAUDE_CODE,
        source=path,
        sources=[path, *sub_paths],
        compactions=compactions,
        skipped=problems.skipped,
        off_branch=off_branch,
    )


def _usage_before(messages: Sequence[Any], index: int, agent: str) -> int | None:
    for m in reversed(messages[:index]):
        if m.agent == agent and m.role == "assistant" and m.finish and m.usage is not None:
            return int(m.usage.context_tokens)
    return None


def _session_facts(line: Line) -> dict[str, Any]:
    facts = {
        "session_id": line.session_id,
        "cwd": line.cwd,
        "git_branch": line.git_branch,
        "version": line.version,
    }
    return {k: v for k, v in facts.items() if v is not None}


def _title(lines: list[Line], on_path: set[str], drafts: list[MessageDraft]) -> str:
    summaries = [ln for ln in lines if ln.type == "summary" and ln.summary]
    for ln in reversed(summaries):
        if ln.leaf_uuid in on_path:
            return ln.summary or ""
    if summaries:
        return summaries[-1].summary or ""
    for d in drafts:
        if d.role == "user" and d.agent == MAIN_AGENT:
            for p in d.parts:
                if isinstance(p, TextPart) and not p.synthetic and p.text.strip():
                    return first_line(p.text)
    return ""
