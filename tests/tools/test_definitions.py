"""The one definition per tool, and its agreement with what the context tells the model.

The rebuild body (SPEC R5.5, A7 elision line) and the per-turn reminder (R8.3,
A12) name tools, operations and arguments; every such pointer must be a valid
call of the tools we ship (issue 8).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_ctx.reminders import per_turn_reminder
from mimo_ctx.sections import ELISION_LINE
from mimo_ctx.tools import (
    ACTOR_TOOL,
    ALL_TOOL_SPECS,
    HISTORY_TOOL,
    MEMORY_TOOL,
    TASK_TOOL,
    ArgumentError,
    check_arguments,
    to_anthropic_tools,
    to_openai_tools,
)


def test_golden_schema_of_the_task_tool() -> None:
    """The task tool's schema, in full (golden)."""
    assert TASK_TOOL.parameters == {
        "type": "object",
        "properties": {
            "operation": {
                "type": "string",
                "enum": ["list", "get", "update"],
                "description": "What to do: list, get, update.",
            },
            "task_id": {"type": "string", "description": "get, update: the task id, e.g. T1.2."},
            "status": {
                "type": "string",
                "description": "update: the new status.",
                "enum": [
                    "open",
                    "dispatched",
                    "in_progress",
                    "blocked",
                    "human_review",
                    "done",
                    "failed",
                    "abandoned",
                ],
            },
            "summary": {"type": "string", "description": "update: the new one-line summary."},
        },
        "required": ["operation"],
        "additionalProperties": False,
    }


def test_golden_description_of_the_actor_tool() -> None:
    """The actor tool's description lists each operation with its arguments (golden)."""
    assert ACTOR_TOOL.description == (
        "Background actors (long-running sub-agents and jobs) of this session: check one "
        "actor's status or list them all.\n"
        "\n"
        "Operations:\n"
        "- status(actor_id): one actor's status, agent and last activity\n"
        "- list(): every actor of this session, active ones first"
    )


@pytest.mark.parametrize("spec", ALL_TOOL_SPECS, ids=lambda s: s.name)
def test_every_operation_argument_is_in_the_schema(spec: Any) -> None:
    """Each argument an operation uses is a schema property, and every property is used."""
    properties = set(spec.parameters["properties"]) - {"operation"}
    used = {name for op in spec.operations for name in (*op.required, *op.optional)}
    assert used == properties
    assert [op.name for op in spec.operations] == spec.parameters["properties"]["operation"]["enum"]


def test_names_are_the_ones_the_context_uses() -> None:
    """Tool names: history, memory, task, actor (R5.5, R8.3)."""
    assert [s.name for s in ALL_TOOL_SPECS] == ["history", "memory", "task", "actor"]
    assert HISTORY_TOOL.operation("around") is not None
    assert MEMORY_TOOL.operation("search") is not None


def _reminder_calls() -> list[tuple[str, dict[str, Any]]]:
    """Parse the example calls ``tool(operation="x", key="v")`` of the per-turn reminder."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for line in per_turn_reminder("/mem/sessions/ses_1").splitlines():
        match = re.search(r"(\w+)\((.*)\)\s*$", line)
        if not match:
            continue
        tree = ast.parse(f"f({match.group(2)})", mode="eval")
        assert isinstance(tree.body, ast.Call)
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in tree.body.keywords}
        calls.append((match.group(1), {k: v for k, v in arguments.items() if k}))
    return calls


def test_r8_3_per_turn_reminder_examples_are_valid_calls() -> None:
    """Every example call in the per-turn reminder passes our argument check (A12)."""
    specs = {s.name: s for s in ALL_TOOL_SPECS}
    calls = _reminder_calls()
    assert [(name, args["operation"]) for name, args in calls] == [
        ("memory", "search"),
        ("memory", "read"),
        ("task", "list"),
        ("actor", "status"),
    ]
    for name, arguments in calls:
        operation, _values = check_arguments(specs[name], arguments)
        assert operation == arguments["operation"]


def test_a7_elision_line_points_at_a_valid_history_call() -> None:
    """The elision line names the history tool, operation=around and messageID (A7)."""
    line = ELISION_LINE.format(tokens=123, message_id="msg_abc")
    assert "history tool" in line
    operation = re.search(r"operation=(\w+)", line)
    message_id = re.search(r"messageID=([^;\]]+)", line)
    assert operation is not None
    assert message_id is not None
    name, values = check_arguments(
        HISTORY_TOOL, {"operation": operation.group(1), "messageID": message_id.group(1)}
    )
    assert (name, values) == ("around", {"message_id": "msg_abc"})


def test_integer_arguments_accept_integral_spellings() -> None:
    """``5``, ``5.0`` and ``"5"`` are integers; ``True``, ``5.5``, ``"five"`` are not."""
    for value in (5, 5.0, "5"):
        _, values = check_arguments(
            HISTORY_TOOL, {"operation": "search", "query": "q", "limit": value}
        )
        assert values["limit"] == 5
    for value in (True, 5.5, "five", float("nan")):
        with pytest.raises(ArgumentError, match="must be an integer"):
            check_arguments(HISTORY_TOOL, {"operation": "search", "query": "q", "limit": value})


def test_unused_arguments_are_ignored() -> None:
    """Arguments of other operations are dropped (generic clients fill every property)."""
    _, values = check_arguments(
        HISTORY_TOOL, {"operation": "search", "query": "q", "message_id": "m", "before": 3}
    )
    assert values == {"query": "q"}


@given(st.dictionaries(st.text(max_size=12), st.none() | st.integers() | st.text(max_size=8)))
def test_check_arguments_raises_only_argument_error(arguments: dict[str, Any]) -> None:
    """Property: any argument mapping is accepted or refused with ArgumentError, nothing else."""
    for spec in ALL_TOOL_SPECS:
        try:
            check_arguments(spec, arguments)
        except ArgumentError as exc:
            message = str(exc)
        else:
            message = "accepted"
        assert message


def test_shapes_from_specs_without_handlers() -> None:
    """The dict shapes also work on the unbound specs (for prefixes built before a session)."""
    chat = to_openai_tools(ALL_TOOL_SPECS)
    assert [t["function"]["name"] for t in chat] == ["history", "memory", "task", "actor"]
    assert to_anthropic_tools([MEMORY_TOOL])[0]["input_schema"] == MEMORY_TOOL.parameters
    with pytest.raises(ValueError, match="api must be 'chat' or 'responses'"):
        to_openai_tools(ALL_TOOL_SPECS, api="completions")
