"""The offline writer's evidence rules, one piece of text or one call at a time (issue 14)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_objects, texts

from mimo_ctx.checkpoint.evidence import (
    PlanItem,
    clean_resource,
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
    sentences,
    signature,
    stated_plan,
    stated_reason,
    text_command_files,
    trailing_command,
)


@pytest.mark.parametrize(
    "text",
    ["continue", "yes", "ok, go on", "Check again", "and continue with the remaining tasks",
     "continue implementation", "thanks!", "   ", "keep going please"],
)  # fmt: skip
def test_continuations_do_not_define_a_task(text: str) -> None:
    assert is_continuation(text)


@pytest.mark.parametrize(
    "text",
    ["Implement spotter-gqc", "new beads for the epic were added. tackle them",
     "did you push?", "continue, but first rename the module to core.py and update every import"],
)  # fmt: skip
def test_substantive_messages(text: str) -> None:
    assert not is_continuation(text)


def test_directives_are_the_standing_instructions() -> None:
    text = (
        "Fix the login bug. Always run the tests before committing. Don't touch the API.\n"
        "Use ruff for formatting. The page is slow. From now on write the docs in English."
    )
    assert directive_sentences(text) == [
        "Always run the tests before committing.",
        "Don't touch the API.",
        "Use ruff for formatting.",
        "From now on write the docs in English.",
    ]


def test_sentences_skip_code_tables_and_headings() -> None:
    text = (
        "## Plan\n**Done.** The parser works.\n```py\nx = 1. Y = 2\n```\n| a | b |\n- Next: tests."
    )
    assert sentences(text) == ["Done.", "The parser works.", "Next: tests."]


def test_knowledge_and_decisions_come_from_the_assistant_words() -> None:
    text = (
        "The auto-generated migration uses `ALTER TABLE ... modify` which SQLite doesn't "
        "support for nullability changes. I need to rewrite it with a SQLite-safe table "
        "rewrite pattern. Good. Let me run it."
    )
    assert knowledge_sentences(text) == [
        "The auto-generated migration uses `ALTER TABLE ... modify` which SQLite doesn't "
        "support for nullability changes."
    ]
    assert decision_sentences(text) == [
        "I need to rewrite it with a SQLite-safe table rewrite pattern."
    ]
    # Vague sentences name nothing: not knowledge.
    assert knowledge_sentences("That does not work because it is wrong.") == []


def test_stated_plan_and_reason() -> None:
    text = "The test config is missing `secret_key_base`. Let me add it."
    assert stated_plan(text) == "The test config is missing `secret_key_base`. Let me add it."
    assert stated_reason("Migration ran cleanly. Now let me implement Task 2 (the JS hook).") == (
        "Implement Task 2 (the JS hook)."
    )
    assert stated_reason("Good.") is None


def test_file_actions_by_tool() -> None:
    assert file_actions("Write", {"file_path": "/r/a.py", "content": "x"}) == [
        ("/r/a.py", "created")
    ]
    assert file_actions("Edit", {"file_path": "/r/a.py"}) == [("/r/a.py", "edited")]
    assert file_actions("Read", {"file_path": "/r/a.py"}) == [("/r/a.py", "read")]
    assert file_actions("Grep", {"path": "/r"}) == []
    patch = "*** Begin Patch\n*** Add File: src/new.rs\n+x\n*** Update File: src/lib.rs\n@@\n"
    assert file_actions("apply_patch", {"input": patch}) == [
        ("src/new.rs", "created"),
        ("src/lib.rs", "edited"),
    ]
    assert file_actions("str_replace_based_edit_tool", {"command": "view", "path": "a"}) == [
        ("a", "read")
    ]


def test_shell_commands_and_signatures() -> None:
    assert command_of("Bash", {"command": "git push"}) == "git push"
    assert command_of("exec_command", {"cmd": ["bash", "-lc", "pytest -q"]}) == "pytest -q"
    assert command_of("Read", {"command": "x"}) is None
    assert signature("Bash", {"command": "cd /repo && git push 2>&1"}) == "$ git push"
    assert signature("Bash", {"command": "python -m pytest -x tests/"}) == "$ python -m pytest"
    assert signature("Bash", {"command": "FOO=1 mix test test/a.exs"}) == "$ mix test"
    assert signature("Edit", {"file_path": "/a.py"}) == signature(
        "MultiEdit", {"file_path": "/a.py"}
    )
    assert signature("Task", {"prompt": "x"}) == "task"


def test_commits_pushes_and_test_runs() -> None:
    command = "git add x && git commit -m \"$(cat <<'EOF'\nfeat: add state (T4)\n\nBody\nEOF\n)\""
    output = "[spotter-gqc ceff8c3] feat: add state (T4)\n 4 files changed"
    assert commit_subject(command, output) == "ceff8c3 feat: add state (T4)"
    assert commit_subject('git commit -m "fix: typo"', "") == "fix: typo"
    assert commit_subject("git status", output) is None
    push = "To github.com:o/r.git\n   bb53fb4..05fd186  spotter-gqc -> spotter-gqc\n"
    assert pushed_branch("bd sync && git push 2>&1", push) == "spotter-gqc"
    assert pushed_branch("git push --set-upstream origin feat", "") == "feat"
    assert passing_test_run(
        "mix test 2>&1 | tail -5", "....\nFinished in 1.5 s\n14 doctests, 87 tests, 0 failures\n"
    ) == (
        "mix test",
        "14 doctests, 87 tests, 0 failures",
    )
    assert passing_test_run("pytest -q", "===== 5 passed in 0.31s =====") == (
        "pytest",
        "5 passed in 0.31s",
    )
    assert passing_test_run("mix test", "Command running in background with ID: b0be39e.") is None
    assert passing_test_run("ls", "3 tests") is None


def test_error_line_names_what_went_wrong() -> None:
    output = (
        "Exit code 2\n==> fine\nCompiling 1 file\n** (CompileError) undefined function live/2\n"
    )
    assert error_line(output) == "** (CompileError) undefined function live/2"
    assert error_line("<tool_use_error>File has not been read yet.</tool_use_error>") == (
        "File has not been read yet."
    )


def test_plan_tools_of_each_host() -> None:
    todo = {"todos": [{"content": "Read", "status": "completed", "activeForm": "Reading"},
                      {"content": "Write tests", "status": "in_progress"}]}  # fmt: skip
    assert plan_items("TodoWrite", todo) == [
        PlanItem("Read", "completed"),
        PlanItem("Write tests", "in_progress"),
    ]
    codex = {"explanation": "x", "plan": [{"step": "Parse", "status": "pending"}]}
    assert plan_items("update_plan", codex) == [PlanItem("Parse", "pending")]
    generic = {"items": [{"title": "Ship", "done": True}, "Celebrate"]}
    assert plan_items("todo", generic) == [
        PlanItem("Ship", "completed"),
        PlanItem("Celebrate", "pending"),
    ]
    assert plan_items("Bash", todo) is None


def test_live_resources_lose_the_punctuation_around_them() -> None:
    # Finding 7 (URL part): a URL inside JSON or a sentence kept its closing escape.
    found = resources_in(['see "https://github.com/o/r/pull/new/feat\\" now', "at localhost:4000."])
    assert found == ["https://github.com/o/r/pull/new/feat", "localhost:4000"]
    assert clean_resource("https://x.dev/a).") == "https://x.dev/a"


@given(texts(400))
def test_text_rules_never_raise_and_are_deterministic(text: str) -> None:
    for rule in (sentences, directive_sentences, knowledge_sentences, decision_sentences):
        assert rule(text) == rule(text)
    assert is_continuation(text) == is_continuation(text)
    assert stated_plan(text) == stated_plan(text)
    for line in sentences(text):
        assert "\n" not in line
        assert line.strip() == line


@given(
    st.sampled_from(["Bash", "Edit", "Write", "Read", "TodoWrite", "apply_patch", "x"]),
    json_objects(),
)
def test_call_rules_never_raise(tool: str, arguments: dict[str, object]) -> None:
    file_actions(tool, arguments)
    signature(tool, arguments)
    plan_items(tool, arguments)
    command_of(tool, arguments)


_COMMAND_LINE = st.text(
    alphabet=st.characters(codec="ascii", categories=("L", "N", "P", "Zs")), min_size=1, max_size=60
).filter(lambda t: t.strip() and not t.strip().startswith(("```", "~~~")))


@given(said=st.sampled_from(["", "The test fails.", "I will fix the import now."]),
       command=_COMMAND_LINE, more=st.lists(_COMMAND_LINE, max_size=3))  # fmt: skip
def test_a_text_ending_with_a_code_block_names_its_command(
    said: str, command: str, more: list[str]
) -> None:
    text = "\n".join([said, "```", command, *more, "```"])
    assert trailing_command(text) == (command.strip(), said)
    assert trailing_command(text + "\nDone.") is None  # the block is not last
    assert trailing_command(said) is None


@pytest.mark.parametrize(
    ("arguments", "names"),
    [
        ({"old_string": "defp a do", "new_string": "defp a do\n  defmacro with_span(n) do"},
         ["with_span"]),
        ({"content": "export async function load() {}\nclass Store extends Base {}"},
         ["load", "Store"]),
        ({"content": "func (r *Repo) Save() error {\n}\ntype Repo struct {"}, ["Save", "Repo"]),
        ({"file_text": "rand_hex() {\n  :\n}\nexport const pick = (a) => a"},
         ["rand_hex", "pick"]),
        ({"edits": [{"old_string": "x", "new_string": "    def run(self):"}]}, ["run"]),
        ({"patch": "*** Update File: a.py\n-def old():\n+def old():\n+def new():"}, ["new"]),
        ({"new_string": "the class of problems we define here"}, []),
    ],
)  # fmt: skip
def test_a_change_names_what_it_defines(arguments: dict[str, object], names: list[str]) -> None:
    assert defined_names(arguments) == names


_NAME = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


@given(kept=st.lists(_NAME, max_size=4), added=st.lists(_NAME, max_size=8))
def test_names_the_old_text_defined_are_never_new(kept: list[str], added: list[str]) -> None:
    old = "\n".join(f"def {n}():" for n in kept)
    new = "\n".join(f"def {n}():" for n in kept + added)
    found = defined_names({"old_string": old, "new_string": new})
    assert not set(found) & set(kept)
    expected = list(dict.fromkeys(n for n in added if n not in kept))[:6]
    assert found == expected


def test_a_thin_error_line_gets_the_finding_at_its_source_location() -> None:
    # A checker's banner ("Pre-commit validation failed: [DIALYZER]") said which check
    # failed, not what it found: the error could not be fixed from the checkpoint.
    dialyzer = (
        "Pre-commit validation failed:\\n\\n[DIALYZER]\\nFinding suitable PLTs\n"
        "Total errors: 1, Skipped: 0\ndone in 0m12.17s\n"
        "lib/web/trace_helpers.ex:57:13:pattern_match\nThe pattern can never match the type.\n"
    )
    assert error_line(dialyzer) == (
        "Pre-commit validation failed: [DIALYZER] — lib/web/trace_helpers.ex:57:13:pattern_match"
        " The pattern can never match the type."
    )
    credo = (
        "Pre-commit validation failed:\\n\\n[CREDO]\\nChecking 88 source files ...\n"
        "┃ [F] → Function is too complex (cyclomatic complexity is 13, max is 9).\n"
        "┃       lib/web/hooks_controller.ex:144:7 #(Web.HooksController.tool_call)\n"
    )
    assert error_line(credo) == (
        "Pre-commit validation failed: [CREDO] — [F] → Function is too complex (cyclomatic"
        " complexity is 13, max is 9). lib/web/hooks_controller.ex:144:7"
        " #(Web.HooksController.tool_call)"
    )
    # A line that says enough is left alone, and so is a thin one with no location.
    full = "error: undefined function get/2 (expected Web.Test to import it)\nlib/a.ex:3\nx y z w"
    assert error_line(full) == "error: undefined function get/2 (expected Web.Test to import it)"
    assert error_line("File does not exist.") == "File does not exist."


def test_a_sub_agents_report_is_done_work() -> None:
    # Work done by sub-agents (Claude Code's Task tool) showed only as the calls: what
    # they built was in their reports, which no section kept.
    report = "## Summary\n\nPerfect!\n\nI created the Next.js project with TypeScript and Tailwind."
    arguments = {"description": "Setup Next.js project", "prompt": "Create a new project"}
    assert delegation_report("Task", arguments, report) == (
        "Setup Next.js project: I created the Next.js project with TypeScript and Tailwind."
    )
    assert delegation_report("Agent", {"prompt": "Check the schema"}, "The schema has two tables.")
    assert delegation_report("Bash", {"description": "x"}, report) is None
    assert delegation_report("Task", arguments, "## Done\n\nOk.") is None


@pytest.mark.parametrize(
    ("command", "open_file", "found"),
    [
        ("open pydicom/handlers/numpy_handler.py 293", None,
         [("pydicom/handlers/numpy_handler.py", "read")]),
        ("create reproduce.py", None, [("reproduce.py", "created")]),
        ("edit 287:295", "src/a.py", [("src/a.py", "edited")]),
        ("edit 287:295", None, []),
        ("python reproduce.py", "src/a.py", []),
        ("find_file numpy_handler.py", None, []),
        ("submit", "src/a.py", []),
    ],
)  # fmt: skip
def test_a_text_command_names_the_file_it_touches(
    command: str, open_file: str | None, found: list[tuple[str, str]]
) -> None:
    assert text_command_files(command, open_file) == found


def test_a_sub_agents_report_prefers_a_sentence_that_names_something() -> None:
    report = "I now have all the information I need. The `opentelemetry_api` package is at 1.5."
    assert delegation_report("Task", {"description": "Versions"}, report) == (
        "Versions: The `opentelemetry_api` package is at 1.5."
    )


@pytest.mark.parametrize(
    ("sentence", "vague"),
    [("Let me rewrite it to be a macro:", True), ("Fix this properly.", True),
     ("Let me rewrite `with_span` as a macro.", False), ("Rewrite the helper.", False)],
)  # fmt: skip
def test_a_sentence_that_only_points_is_vague(sentence: str, vague: bool) -> None:
    assert is_vague(sentence) is vague
