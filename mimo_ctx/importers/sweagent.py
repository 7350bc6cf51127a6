"""Import SWE-agent trajectories (``*.traj``).

A trajectory is a JSON object whose ``history`` holds the chat messages sent to
and received from the model (``role`` system/user/assistant/tool, ``content`` a
string or a list of ``{"type": "text"}`` parts, ``tool_calls``,
``tool_call_ids``/``tool_call_id``, plus SWE-agent's ``thought``, ``action``,
``agent``, ``message_type`` and ``is_demo``). ``trajectory`` repeats the same
steps with the prompt per step and is not imported.

Decisions (our choices):

* Messages are converted like OpenAI chat messages (see :mod:`.openai_chat`):
  leading system messages become ``Session.prefix.system``; tool calls and
  ``tool`` results are joined into ``ToolPart`` s.
* Older trajectories have no ``tool_calls``: the action is part of the
  assistant text, and the observation is a user message. They are kept exactly
  so (assistant text, user text); no tool call is invented.
* ``thought`` and ``action`` repeat what ``content``/``tool_calls`` already say
  and are not imported, except that an assistant message with empty content
  gets ``thought`` + ``action`` as its text.
* The agent names ``main`` and ``primary`` (and a missing one) are the main
  agent; any other name is kept as the message's ``agent``.
* ``is_demo`` messages (a demonstration the framework inserts) are user text
  with ``synthetic=True`` and metadata ``{"is_demo": true}``.
* The main agent's first other user message is the task (the issue text in the
  instance template): the words the run was given, kept as typed text. SWE-agent
  runs with no person in the loop, so every later user message of the main
  agent is the environment speaking (older trajectories send each observation
  as a user message): its text is ``synthetic`` and its metadata says
  ``{"observation": true}`` (quoted as the user's words, observations would
  push the task out of a rebuilt context).
* There are no timestamps and no per-message usage: message *k* gets
  ``base + k`` ms; ``info.model_stats`` and ``info.exit_status`` go to the
  session metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from mimo_ctx.errors import TranscriptError
from mimo_ctx.importers._common import (
    FORMAT_SWEAGENT,
    ImportedTranscript,
    Problems,
    as_object,
    is_object,
    opt_bool,
    opt_str,
)
from mimo_ctx.importers.openai_chat import (
    ChatConverter,
    ParsedMessage,
    convert_items,
    finish_import,
)
from mimo_ctx.messages import MAIN_AGENT, TextPart

__all__ = ["import_sweagent"]

_MAIN_NAMES: Final = frozenset({"main", "primary"})


def _agent_of(msg: dict[str, Any]) -> str:
    name = msg.get("agent")
    if not isinstance(name, str) or not name or name in _MAIN_NAMES:
        return MAIN_AGENT
    return name


def _parse(conv: ChatConverter, raw: object, what: str) -> ParsedMessage:
    msg = as_object(raw, what)
    parsed = conv.parse_chat(msg, what, agent_of=_agent_of)
    if opt_bool(msg, "is_demo", what):
        parsed.synthetic = True
        parsed.metadata["is_demo"] = True
    message_type = opt_str(msg, "message_type", what)
    if message_type is not None:
        parsed.metadata["message_type"] = message_type
    if parsed.kind == "assistant" and not any(isinstance(p, TextPart) for p in parsed.parts):
        pieces = [opt_str(msg, "thought", what) or "", opt_str(msg, "action", what) or ""]
        text = "\n\n".join(p for p in pieces if p.strip())
        if text:
            parsed.parts.insert(0, TextPart(text=text))
    return parsed


def _mark_observations(conv: ChatConverter) -> None:
    """Main-agent user messages after the task are observations (see the module docs)."""
    task_seen = False
    for draft in conv.drafts:
        if draft.role != "user" or draft.agent != MAIN_AGENT or draft.metadata.get("is_demo"):
            continue
        if draft.metadata.get("role") == "system":
            continue
        if not task_seen:
            task_seen = True
            continue
        draft.parts = [
            p.model_copy(update={"synthetic": True}) if isinstance(p, TextPart) else p
            for p in draft.parts
        ]
        draft.metadata["observation"] = True


def import_sweagent(
    path: Path,
    data: bytes,
    document: object,
    text: str,
    *,
    strict: bool,
    session_id: str | None,
    base_time: int,
) -> ImportedTranscript:
    """Import a SWE-agent trajectory (already parsed into ``document``).

    Args:
        path: The ``.traj`` file.
        data: Its bytes.
        document: The parsed JSON document.
        text: The document's text (used to name lines in errors).
        strict: Raise on the first malformed message instead of skipping it.
        session_id: Id for the new session (default: a new ascending id).
        base_time: Time of the first message in epoch ms.
    """
    problems = Problems(strict=strict)
    if not is_object(document) or "history" not in document:
        raise TranscriptError("the trajectory has no 'history'", path=str(path), line=1)
    doc = document
    conv = convert_items(
        path,
        data,
        doc,
        text,
        key="history",
        problems=problems,
        base_time=base_time,
        label="history",
        parse=_parse,
    )
    _mark_observations(conv)
    metadata: dict[str, Any] = {}
    info = doc.get("info")
    if is_object(info):
        facts = {k: info[k] for k in ("exit_status", "model_stats") if k in info}
        if facts:
            metadata["sweagent"] = facts
    environment = doc.get("environment")
    if isinstance(environment, str):
        metadata.setdefault("sweagent", {})["environment"] = environment
    return finish_import(
        path,
        conv,
        problems,
        fmt=FORMAT_SWEAGENT,
        session_id=session_id,
        base_time=base_time,
        title=path.stem,
        metadata=metadata,
    )
