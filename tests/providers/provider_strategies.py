"""Hypothesis strategies for the provider tests: valid provider payloads and messy histories.

Payload strategies produce requests in the canonical form the ``to_*`` converters
emit (so a round trip can be compared with ``==``): list content for Anthropic,
string tool results, compact JSON arguments, one reasoning item per step.
"""

from __future__ import annotations

import base64
import itertools
from typing import Any

from hypothesis import strategies as st

from mimo_ctx.messages import (
    CheckpointPart,
    CompactionPart,
    FilePart,
    Message,
    MessageFailure,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    ToolTime,
)
from mimo_ctx.tokens import js_json

__all__ = [
    "anthropic_payloads",
    "histories",
    "openai_chat_payloads",
    "openai_responses_payloads",
]

_TEXT_ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
texts = st.text(_TEXT_ALPHABET, min_size=1, max_size=24).filter(lambda s: s.strip() != "")
any_texts = st.text(_TEXT_ALPHABET, max_size=24)
_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(_TEXT_ALPHABET, max_size=8)
)
json_inputs = st.dictionaries(
    st.text(_TEXT_ALPHABET, min_size=1, max_size=6), _json_scalars, max_size=4
)
_b64 = st.binary(min_size=1, max_size=24).map(lambda b: base64.b64encode(b).decode("ascii"))


def _image_url(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return f"data:image/png;base64,{draw(_b64)}"
    return f"https://example.com/img{draw(st.integers(0, 99))}.png"


def _tool_names() -> st.SearchStrategy[str]:
    return st.sampled_from(["read", "bash", "grep", "edit", "task"])


# --------------------------------------------------------------------------- OpenAI chat


def _chat_user(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"role": "user", "content": draw(texts)}
    parts: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            parts.append({"type": "text", "text": draw(texts)})
        else:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(draw)}})
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"role": "user", "content": parts[0]["text"]}  # canonical: one text is a string
    return {"role": "user", "content": parts}


@st.composite
def openai_chat_payloads(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid Chat Completions ``messages`` with parallel tool calls."""
    ids = itertools.count()
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(texts)})
    for _ in range(draw(st.integers(1, 4))):
        out.append(_chat_user(draw))
        for _ in range(draw(st.integers(0, 3))):
            calls = [
                {
                    "id": f"call_{next(ids)}",
                    "type": "function",
                    "function": {
                        "name": draw(_tool_names()),
                        "arguments": js_json(draw(json_inputs)),
                    },
                }
                for _ in range(draw(st.integers(0, 3)))
            ]
            content: Any
            if calls and draw(st.booleans()):
                content = None
            elif draw(st.booleans()):
                content = draw(texts)
            else:
                content = [
                    {"type": "text", "text": t}
                    for t in draw(st.lists(texts, min_size=2, max_size=3))
                ]
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            out.extend(
                {"role": "tool", "tool_call_id": c["id"], "content": draw(any_texts)} for c in calls
            )
    return out


# --------------------------------------------------------------------------- OpenAI Responses


@st.composite
def openai_responses_payloads(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid Responses ``input`` items: reasoning items, parallel function calls, outputs."""
    ids = itertools.count()
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        content: list[dict[str, Any]] = [{"type": "input_text", "text": draw(texts)}]
        if draw(st.booleans()):
            content.append({"type": "input_image", "image_url": _image_url(draw), "detail": "auto"})
        out.append({"type": "message", "role": "user", "content": content})
        steps = draw(st.integers(1, 3))
        for step in range(steps):
            last = step == steps - 1
            # Only the last step of a turn may end without calls (a model stops there).
            n_calls = draw(st.integers(0 if last else 1, 3))
            has_text = n_calls == 0 or draw(st.booleans())
            reasoning = draw(st.booleans())
            if reasoning:
                n = next(ids)
                out.append(
                    {
                        "type": "reasoning",
                        "id": f"rs_{n}",
                        "summary": [{"type": "summary_text", "text": draw(texts)}],
                        "encrypted_content": f"enc{n}",
                    }
                )
            step_items: list[dict[str, Any]] = []
            if has_text:
                step_items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [
                            {"type": "output_text", "text": draw(texts), "annotations": []}
                        ],
                    }
                )
            call_ids = [f"call_{next(ids)}" for _ in range(n_calls)]
            step_items.extend(
                {
                    "type": "function_call",
                    "call_id": cid,
                    "name": draw(_tool_names()),
                    "arguments": js_json(draw(json_inputs)),
                }
                for cid in call_ids
            )
            if reasoning:
                # The API pairs a reasoning item with the next item by its id.
                first = step_items[0]
                first["id"] = f"{'msg' if first['type'] == 'message' else 'fc'}_{next(ids)}"
                if first["type"] == "message":
                    first["status"] = "completed"
            out.extend(step_items)
            out.extend(
                {"type": "function_call_output", "call_id": cid, "output": draw(any_texts)}
                for cid in call_ids
            )
    return out


# --------------------------------------------------------------------------- Anthropic


def _anthropic_user_blocks(draw: st.DrawFn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "text", "image", "pdf", "plain"]))
        if kind == "text":
            blocks.append({"type": "text", "text": draw(texts)})
        elif kind == "image":
            if draw(st.booleans()):
                source: dict[str, Any] = {
                    "type": "base64",
                    "media_type": "image/png",
                    "data": draw(_b64),
                }
            else:
                source = {
                    "type": "url",
                    "url": f"https://example.com/cat{draw(st.integers(0, 9))}.jpg",
                }
            blocks.append({"type": "image", "source": source})
        elif kind == "pdf":
            block: dict[str, Any] = {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": draw(_b64)},
            }
            if draw(st.booleans()):
                block["title"] = "spec.pdf"
            blocks.append(block)
        else:
            blocks.append(
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": draw(texts)},
                }
            )
    return blocks


@st.composite
def anthropic_payloads(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid Messages ``messages``: alternating, thinking with signatures, parallel tool use."""
    ids = itertools.count()
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for turn in range(draw(st.integers(1, 5))):
        results = [
            {
                "type": "tool_result",
                "tool_use_id": cid,
                "content": draw(texts),
                **({"is_error": True} if draw(st.booleans()) else {}),
            }
            for cid in pending
        ]
        extra = _anthropic_user_blocks(draw) if not results or draw(st.booleans()) else []
        out.append({"role": "user", "content": [*results, *extra]})
        pending = []
        if turn > 0 and draw(st.integers(0, 4)) == 0:
            break  # end on a user turn
        content: list[dict[str, Any]] = []
        if draw(st.booleans()):
            content.append(
                {"type": "thinking", "thinking": draw(texts), "signature": f"sig{next(ids)}"}
            )
        if draw(st.integers(0, 3)) == 0:
            content.append({"type": "redacted_thinking", "data": f"redacted{next(ids)}"})
        n_calls = draw(st.integers(0, 3))
        if n_calls == 0 or draw(st.booleans()):
            content.append({"type": "text", "text": draw(texts)})
        for _ in range(n_calls):
            cid = f"toolu_{next(ids)}"
            pending.append(cid)
            content.append(
                {
                    "type": "tool_use",
                    "id": cid,
                    "name": draw(_tool_names()),
                    "input": draw(json_inputs),
                }
            )
        out.append({"role": "assistant", "content": content})
    if pending:
        out.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c, "content": "ok"} for c in pending
                ],
            }
        )
    return out


# --------------------------------------------------------------------------- messy histories


def _tool_state(draw: st.DrawFn) -> Any:
    inp = draw(json_inputs)
    kind = draw(st.sampled_from(["pending", "running", "completed", "compacted", "error"]))
    if kind == "pending":
        return ToolStatePending(input=inp)
    if kind == "running":
        return ToolStateRunning(input=inp)
    if kind == "error":
        return ToolStateError(input=inp, error=draw(any_texts))
    attachments = (
        [FilePart(mime="image/png", url=f"data:image/png;base64,{draw(_b64)}")]
        if draw(st.booleans())
        else []
    )
    time = ToolTime(compacted=1) if kind == "compacted" else ToolTime()
    return ToolStateCompleted(input=inp, output=draw(any_texts), attachments=attachments, time=time)


def _part(draw: st.DrawFn, role: Role, calls: list[str], next_call: Any) -> Part:
    kinds = ["text", "text", "ignored", "blank", "file", "opaque", "subtask"]
    if role == "assistant":
        kinds += ["tool", "tool", "reasoning", "reasoning_openai", "redacted"]
    if role == "user":
        kinds += ["checkpoint", "compaction", "file_pdf", "file_other"]
    if role == "tool":
        kinds = ["result", "result", "text"]
    kind = draw(st.sampled_from(kinds))
    if kind == "text":
        return TextPart(text=draw(any_texts), synthetic=draw(st.booleans()))
    if kind == "ignored":
        return TextPart(text=draw(texts), ignored=True)
    if kind == "blank":
        return TextPart(text=draw(st.sampled_from(["", " ", "\n\t"])))
    if kind == "file":
        return FilePart(mime="image/png", url=_image_url(draw))
    if kind == "file_pdf":
        return FilePart(
            mime="application/pdf",
            url=f"data:application/pdf;base64,{draw(_b64)}",
            filename="a.pdf",
        )
    if kind == "file_other":
        return FilePart(mime="application/zip", url="https://example.com/a.zip")
    if kind == "opaque":
        return OpaquePart(source="test", kind="x", data={"a": 1})
    if kind == "subtask":
        return SubtaskPart(agent="explore", description=draw(any_texts), prompt=draw(any_texts))
    if kind == "checkpoint":
        return CheckpointPart(covered_up_to="msg_0")
    if kind == "compaction":
        return CompactionPart(summary=draw(any_texts))
    if kind == "reasoning":
        return ReasoningPart(
            text=draw(any_texts), signature=draw(st.one_of(st.none(), st.just("sig")))
        )
    if kind == "reasoning_openai":
        n = next_call()
        return ReasoningPart(
            text=draw(any_texts),
            provider_data={"openai": {"id": f"rs_{n}", "summary": [], "encrypted_content": "e"}},
        )
    if kind == "redacted":
        return ReasoningPart(text="", signature="data", redacted=True)
    if kind == "tool":
        call_id = f"call_{next_call()}"
        calls.append(call_id)
        return ToolPart(call_id=call_id, tool=draw(_tool_names()), state=_tool_state(draw))
    # result: answers a known call (maybe twice, maybe before it) or an unknown one
    pool = [*calls, "call_unknown", f"call_{draw(st.integers(0, 30))}"]
    return ToolResultPart(
        call_id=draw(st.sampled_from(pool)),
        tool="bash",
        output=draw(any_texts),
        is_error=draw(st.booleans()),
        time=ToolTime(compacted=draw(st.sampled_from([None, 1]))),
    )


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """Messy internal histories: every part kind, failed and aborted messages, orphans."""
    counter = itertools.count()
    calls: list[str] = []
    out: list[Message] = []
    for n in range(draw(st.integers(0, 10))):
        role: Role = draw(st.sampled_from(["user", "assistant", "assistant", "tool"]))
        parts = [
            _part(draw, role, calls, lambda: next(counter)) for _ in range(draw(st.integers(0, 4)))
        ]
        error = None
        if role == "assistant" and draw(st.integers(0, 4)) == 0:
            error = MessageFailure(
                name="AbortedError" if draw(st.booleans()) else "APIError",
                aborted=draw(st.booleans()),
            )
        out.append(
            Message(
                id=f"msg_{n:04d}",
                session_id="ses_1",
                role=role,
                time_created=n,
                parts=parts,
                error=error,
            )
        )
    return out
