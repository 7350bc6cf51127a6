"""The offline writer's state: folding, incrementality, budgets (issue 14 finding 3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import make_id

from mimo_ctx.checkpoint import CHECKPOINT_SECTIONS, section_budgets
from mimo_ctx.checkpoint.sections import render_sections
from mimo_ctx.checkpoint.state import CheckpointState, fold_messages, fold_notes
from mimo_ctx.messages import (
    CheckpointPart,
    Message,
    Part,
    Role,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
)
from mimo_ctx.store.base import Task
from mimo_ctx.tokens import estimate_text_tokens

SESSION = "ses_0000000000000000000000000000"


class _History:
    """Builds a main-agent history with ascending ids, one message at a time."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.calls = 0

    def _add(self, role: Role, parts: Sequence[Part], finish: str | None = None) -> Message:
        n = len(self.messages) + 1
        message = Message(
            id=make_id("msg", n * 4096),
            session_id=SESSION,
            role=role,
            time_created=1_700_000_000_000 + n,
            finish=finish,
            parts=list(parts),
        )
        self.messages.append(message)
        return message

    def user(self, text: str) -> Message:
        return self._add("user", [TextPart(text=text)])

    def say(self, text: str, finish: str = "stop") -> Message:
        return self._add("assistant", [TextPart(text=text)], finish)

    def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        output: str = "ok",
        *,
        error: bool = False,
        text: str | None = None,
        split: bool = False,
    ) -> None:
        self.calls += 1
        call_id = f"call_{self.calls}"
        if split:
            state: Any = ToolStatePending(input=arguments)
        elif error:
            state = ToolStateError(input=arguments, error=output)
        else:
            state = ToolStateCompleted(input=arguments, output=output)
        parts: list[Part] = [TextPart(text=text)] if text else []
        parts.append(ToolPart(call_id=call_id, tool=tool, state=state))
        self._add("assistant", parts, "tool-calls")
        if split:
            result = ToolResultPart(call_id=call_id, tool=tool, output=output, is_error=error)
            self._add("tool", [result])


def _fold(messages: Sequence[Message]) -> CheckpointState:
    return fold_messages(CheckpointState(), messages)


def _bodies(state: CheckpointState, tasks: Sequence[Task] = ()) -> dict[int, list[str]]:
    return render_sections(state, tasks=tasks, budgets=section_budgets()).bodies


def test_intent_keeps_the_task_defining_request_through_continuations() -> None:
    h = _History()
    h.user("Implement spotter-gqc")
    h.say("On it.")
    h.user("continue")
    h.user("new beads for the epic were added. tackle them")
    h.user("yes")
    state = _fold(h.messages)
    assert state.request is not None
    assert state.request.text == "Implement spotter-gqc"
    assert state.latest is not None
    assert state.latest.text.startswith("new beads")
    intent = "\n".join(_bodies(state)[1])
    assert "> Implement spotter-gqc" in intent
    assert "> new beads for the epic were added. tackle them" in intent
    assert '"yes"' in intent  # the newest message is named, not promoted to the goal


def test_errors_get_their_fix_or_stay_unresolved() -> None:
    h = _History()
    h.call(
        "Bash", {"command": "git push 2>&1"}, "Exit code 128\nfatal: no upstream branch", error=True
    )
    h.say("The branch `feat` has no upstream. I need to use `--set-upstream`.")
    h.call(
        "Bash",
        {"command": "git push --set-upstream origin feat"},
        "To x\n * [new branch]      feat -> feat",
    )
    h.call(
        "Bash",
        {"command": "mix test"},
        "Exit code 1\n** (CompileError) undefined function live/2",
        error=True,
    )
    h.call("Edit", {"file_path": "/r/test/live_test.exs"}, text="Import `Phoenix.ConnTest` first.")
    h.call("Bash", {"command": "pytest -q"}, "E   AssertionError: boom", error=True)
    state = _fold(h.messages)
    errors = _bodies(state)[8]
    assert errors[0].startswith("- `git push 2>&1` failed: fatal: no upstream branch")
    assert "— cause: The branch `feat` has no upstream." in errors[0]
    assert errors[0].endswith("→ fixed (with `git push --set-upstream origin feat`).")
    assert errors[1].endswith("→ unresolved.")
    assert "** (CompileError) undefined function live/2" in errors[1]
    assert "AssertionError: boom" in errors[2]
    h.call("Bash", {"command": "mix test"}, "3 tests, 0 failures")
    errors = _bodies(_fold(h.messages))[8]
    assert errors[1].endswith("→ fixed (after changing live_test.exs).")
    assert errors[2].endswith("→ unresolved.")


def test_files_say_what_happened_and_why() -> None:
    h = _History()
    h.call("Read", {"file_path": "/repo/lib/a.ex"}, text="Let me read the router for patterns.")
    h.call(
        "Write", {"file_path": "/repo/lib/b.ex", "content": "x"}, text="Now create the token store."
    )
    h.call("Edit", {"file_path": "/repo/lib/b.ex"})
    h.call("Edit", {"file_path": "/repo/lib/b.ex"}, text="Now register `TokenStore` in the app.")
    files = _bodies(_fold(h.messages))[6]
    assert files == [
        "- Paths below are relative to /repo/lib/",
        "- b.ex — created, edited 2× — Register `TokenStore` in the app.",
        "- Read only: a.ex",
    ]


def test_done_in_order_from_commits_pushes_tests_and_plan() -> None:
    h = _History()
    todos = [
        {"content": "Add state", "status": "in_progress"},
        {"content": "Add page", "status": "pending"},
    ]
    h.call("TodoWrite", {"todos": todos})
    h.call("Bash", {"command": "mix test"}, "10 tests, 0 failures")
    h.call("Bash", {"command": "mix test"}, "11 tests, 0 failures")
    h.call("Bash", {"command": 'git commit -m "feat: state"'}, "[main 1a2b3c4] feat: state\n")
    todos = [
        {"content": "Add state", "status": "completed"},
        {"content": "Add page", "status": "in_progress"},
    ]
    h.call("TodoWrite", {"todos": todos})
    h.call("Bash", {"command": "git push"}, "   1a2b3c4..5d6e7f8  main -> main")
    bodies = _bodies(_fold(h.messages))
    assert bodies[5][:4] == [
        "- ✓ Tests passed (mix test): 11 tests, 0 failures",
        "- ✓ Committed 1a2b3c4 feat: state",
        "- ✓ Plan item completed: Add state",
        "- ✓ Pushed main",
    ]
    assert bodies[4] == ["- Plan (TodoWrite):", "  - ✅ Add state", "  - 🔄 Add page"]
    assert bodies[2][0] == "- Continue the plan item in progress: Add page"


def test_next_action_is_never_review_the_results() -> None:
    # Finding 3: "Review the results of <tool>" in 22 of 24 rebuilds.
    h = _History()
    h.user("Fix the parser")
    h.call("Read", {"file_path": "/r/p.py"}, text="The config is missing `strict`. Let me add it.")
    action = _bodies(_fold(h.messages))[2]
    assert action == ["- Carry on (mid-task): The config is missing `strict`. Let me add it."]
    h.say("Done: the parser accepts `strict` now.")
    action = _bodies(_fold(h.messages))[2]
    assert action[0].startswith(
        "- Nothing is open: the last turn ended with the assistant's answer"
    )
    h.user("now the lexer")
    assert _bodies(_fold(h.messages))[2][0].startswith("- Answer the user's newest message")


def test_split_results_match_their_calls_across_runs() -> None:
    h = _History()
    h.call(
        "Bash",
        {"command": "cargo test"},
        "error[E0425]: cannot find value `x`",
        error=True,
        split=True,
    )
    first = _fold(h.messages[:1])
    assert first.pending  # the result is not there yet
    state = fold_messages(
        CheckpointState.from_json(first.to_json()) or CheckpointState(), h.messages
    )
    assert not state.pending
    assert state.errors[0].message == "error[E0425]: cannot find value `x`"


def test_boundaries_do_not_hide_the_messages_listed_after_them() -> None:
    h = _History()
    h.user("Build the thing")
    watermark = h.messages[-1]
    boundary = Message(
        id=make_id("msg", 10_000 * 4096),  # the newest id, listed next to the watermark
        session_id=SESSION,
        role="user",
        time_created=watermark.time_created + 1,
        parts=[CheckpointPart(covered_up_to=watermark.id)],
    )
    h.call("Write", {"file_path": "/r/a.py"})
    state = _fold([h.messages[0], boundary, *h.messages[1:]])
    assert "/r/a.py" in state.files


def test_notes_are_kept_once_folded() -> None:
    state = fold_notes(CheckpointState(), "- the deploy port is 8443\n\nbuild with make")
    assert state.notes == ["the deploy port is 8443", "build with make"]
    assert fold_notes(state, "the deploy port is 8443").notes == state.notes
    assert _bodies(state)[11] == ["- the deploy port is 8443", "- build with make"]


# -- properties -------------------------------------------------------------------------------

_USER = st.sampled_from([
    "Implement the importer", "continue", "yes", "Always run ruff before committing.",
    "Don't touch the API. Fix the login bug.", "did you push?", "x" * 9000,
])  # fmt: skip
_SAY = st.sampled_from([
    "The parser uses `ast` because the grammar is Python's.", "Good.",
    "I'll use SQLite instead of a JSON file.", "Let me read `core.py`.",
    "All green. Now commit.", "",
])  # fmt: skip
_COMMANDS = st.sampled_from([
    "git push", 'git commit -m "feat: x"', "pytest -q", "mix test", "ls", "cd /r && npm test",
])  # fmt: skip
_OUTPUTS = st.sampled_from([
    "ok", "5 passed in 0.2s", "[main abc1234] feat: x", "Exit code 1\nerror: nope",
    "The user doesn't want to proceed with this tool use.", "see https://x.dev/a\\",
])  # fmt: skip
_PATHS = st.sampled_from(["/r/a.py", "/r/lib/b.ex", "c.md", "/r/lib/deep/d.ts"])
_PLANS = st.lists(
    st.fixed_dictionaries({
        "content": st.sampled_from(["Read", "Write tests", "Ship"]),
        "status": st.sampled_from(["pending", "in_progress", "completed"]),
    }),
    max_size=3,
)  # fmt: skip


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    h = _History()
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["user", "say", "bash", "file", "plan"]))
        text = draw(_SAY) or None
        split = draw(st.booleans())
        if kind == "user":
            h.user(draw(_USER))
        elif kind == "say" and text:
            h.say(text, draw(st.sampled_from(["stop", "tool-calls"])))
        elif kind == "bash":
            output = draw(_OUTPUTS)
            h.call(
                "Bash",
                {"command": draw(_COMMANDS)},
                output,
                error="Exit" in output or "proceed" in output,
                text=text,
                split=split,
            )
        elif kind == "file":
            tool = draw(st.sampled_from(["Read", "Edit", "Write", "MultiEdit"]))
            h.call(
                tool, {"file_path": draw(_PATHS)}, error=draw(st.booleans()), text=text, split=split
            )
        else:
            h.call("TodoWrite", {"todos": draw(_PLANS)}, text=text, split=split)
    return h.messages


@settings(max_examples=150)
@given(histories(), st.data())
def test_folding_in_pieces_equals_folding_at_once(
    messages: list[Message], data: st.DataObject
) -> None:
    # Issue 18 will hand the writer only the messages since the previous watermark:
    # the state saved by one run plus the next messages must give the same result.
    whole = _fold(messages)
    cut = data.draw(st.integers(0, len(messages)))
    first = _fold(messages[:cut])
    restored = CheckpointState.from_json(first.to_json())
    assert restored is not None
    assert restored == first
    assert fold_messages(restored, messages[cut:]) == whole
    # Handing the whole history again (today's coordinator) changes nothing either.
    assert fold_messages(restored, messages) == whole


@settings(max_examples=150)
@given(histories(), st.integers(0, 3000))
def test_sections_stay_within_their_budgets_and_are_deterministic(
    messages: list[Message], budget: int
) -> None:
    state = _fold(messages)
    budgets = dict.fromkeys((s.number for s in CHECKPOINT_SECTIONS), budget)
    tasks = [
        Task(id=f"T{i}", session_id=SESSION, summary="x" * 50, time_created=0, time_updated=0)
        for i in range(8)
    ]
    rendered = render_sections(state, tasks=tasks, budgets=budgets)
    assert rendered == render_sections(state, tasks=tasks, budgets=budgets)
    for number, lines in rendered.bodies.items():
        tokens = estimate_text_tokens("\n".join(lines))
        index_only = len(lines) <= 2 and any(line.startswith("- See checkpoint-") for line in lines)
        assert tokens <= budget or index_only, (number, tokens, budget, lines)


def test_a_plan_stated_before_the_user_spoke_again_is_not_the_next_action() -> None:
    # The next action carried on with "Let me check the MCP servers status." after
    # the user had asked for something else and the assistant was working on it.
    h = _History()
    h.user("start the server in the background")
    h.call("Bash", {"command": "mix phx.server &"}, text="Let me check the MCP servers status.")
    h.user("scrolling in the terminal still does not work, search the web for it")
    h.call("WebSearch", {"query": "xterm.js scroll"})
    action = _bodies(_fold(h.messages))[2]
    assert action[0].startswith("- Carry on (mid-task) with the user's newest message"), action
    assert "scrolling in the terminal still does not work" in action[0]
    assert "MCP" not in " ".join(action)
    h.call("Read", {"file_path": "/r/term.js"}, text="Let me look at the terminal hook.")
    assert (
        _bodies(_fold(h.messages))[2][0]
        == "- Carry on (mid-task): Let me look at the terminal hook."
    )


def test_a_reason_that_names_the_file_outlives_one_that_does_not() -> None:
    # The file lines said "Use the underscore prefix for the unused variable:" for the
    # controller the session built: the latest change's reason, which named nothing.
    h = _History()
    h.call(
        "Write",
        {"file_path": "/repo/lib/trace_helpers.ex", "content": "x"},
        text="Now create the trace_helpers.ex module with the span macros.",
    )
    h.call(
        "Edit", {"file_path": "/repo/lib/trace_helpers.ex"}, text="Prefix the unused `tool_call`:"
    )
    files = _bodies(_fold(h.messages))[6]
    assert files[0].endswith("— Create the trace_helpers.ex module with the span macros."), files
    h.call(
        "Edit",
        {"file_path": "/repo/lib/trace_helpers.ex"},
        text="Let me make `trace_helpers` return the trace id too.",
    )
    files = _bodies(_fold(h.messages))[6]
    assert files[0].endswith("— Make `trace_helpers` return the trace id too."), files


def test_a_decision_that_says_it_gets_the_file_it_was_about() -> None:
    # Design decisions read "Let me rewrite it to be a macro:" with nothing saying
    # what "it" was.
    h = _History()
    h.call(
        "Edit",
        {"file_path": "/repo/lib/trace_helpers.ex"},
        text="The do block is passed as an argument. Let me rewrite it to be a macro:",
    )
    h.call("Edit", {"file_path": "/repo/lib/other.ex"})
    assert _bodies(_fold(h.messages))[10] == [
        "- Let me rewrite it to be a macro (trace_helpers.ex)"
    ]
    h.say("I chose to keep `TraceStore` in memory.")
    h.call("Edit", {"file_path": "/repo/lib/store.ex"})
    assert _bodies(_fold(h.messages))[10][1] == "- I chose to keep `TraceStore` in memory."


def test_a_typed_message_followed_only_by_untyped_text_is_still_to_answer() -> None:
    # "/init" and then the command's expansion (a user message nobody typed): the next
    # action read "(none)" because the newest message folded was not the typed one.
    h = _History()
    typed = h.user("/init")
    h.messages.append(
        h.messages[-1].model_copy(
            update={
                "id": typed.id + "x",
                "parts": [TextPart(text="Please analyze this codebase.", synthetic=True)],
            }
        )
    )
    action = _bodies(_fold(h.messages))[2]
    assert action[0].startswith(f"- Answer the user's newest message (user message {typed.id})")


def test_a_message_listed_after_one_with_a_newer_id_is_folded() -> None:
    """Across workers, ids and listing order (time, then id) can disagree by a few
    milliseconds: the writer is handed ``[a, b]`` where ``b`` lists later but has
    the older id. Both are folded, and folding again changes nothing. Before the
    fix ``b`` was skipped as already folded (its id was not newer than ``a``'s)."""
    base = 1_700_000_000_000
    a = Message(
        id=make_id("msg", (base + 5) * 4096),
        session_id=SESSION,
        role="assistant",
        time_created=base + 1,
        finish="tool-calls",
        parts=[
            ToolPart(
                call_id="call_a",
                tool="Read",
                state=ToolStateCompleted(input={"file_path": "/r/a.py"}, output="ok"),
            )
        ],
    )
    b = Message(
        id=make_id("msg", (base + 3) * 4096),  # older id, later time: lists after a
        session_id=SESSION,
        role="assistant",
        time_created=base + 2,
        finish="tool-calls",
        parts=[
            ToolPart(
                call_id="call_b",
                tool="Read",
                state=ToolStateCompleted(input={"file_path": "/r/b.py"}, output="ok"),
            )
        ],
    )
    assert b.id < a.id
    state = _fold([a, b])
    assert "/r/a.py" in state.files
    assert "/r/b.py" in state.files
    restored = CheckpointState.from_json(state.to_json())
    assert restored is not None
    assert fold_messages(restored, [a, b]) == state


@settings(max_examples=100)
@given(histories(), st.data())
def test_folding_copies_the_state_and_leaves_its_input_alone(
    messages: list[Message], data: st.DataObject
) -> None:
    # The copy goes through pydantic-core, not copy.deepcopy: the state folded on
    # must equal, and share nothing mutable with, the one it came from.
    cut = data.draw(st.integers(0, len(messages)))
    first = _fold(messages[:cut])
    before = first.model_copy(deep=True)
    folded = fold_messages(first, messages[cut:])
    assert first == before
    assert fold_messages(before, messages[cut:]) == folded
    noted = fold_notes(first, "- a note\n- another")
    assert first == before
    noted.notes.append("changed")
    for name in type(noted).model_fields:
        if isinstance(getattr(noted, name), (list, dict)):
            assert getattr(noted, name) is not getattr(first, name), name
