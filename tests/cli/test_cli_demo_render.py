"""``mimo-ctx demo`` and ``mimo-ctx render`` (issue 6 items 2 and 5).

The demo must run offline in seconds and show writers starting at the A3
thresholds, the 90% trigger line (R1.2) firing, the boundary (R4) with its
sections against their caps (R5.3), the collapsed tail (R7.3) and
micro-compaction (R4.5). ``render`` must show a stored session's next request
(R8.1) without changing the store.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from mimo_ctx.cli import _output as _cli_output
from mimo_ctx.providers.validate import validate_request
from mimo_ctx.store.sqlite import SQLiteStore
from tests.cli.conftest import REPO_ROOT, run_cli

HEADINGS = (
    "Tasks ledger",
    "Session checkpoint",
    "Active actors",
    "Recent user input (verbatim)",
    "Project durable knowledge",
    "Global memory",
    "Session notes",
    "Memory keys index",
    "Recent activity",
)


def test_demo_json_shows_writers_trigger_and_boundary() -> None:
    """A3 writers, R1.2 trigger at 90%, R4 boundary, R5.3 sections, R7.3 tail, R4.5."""
    run = run_cli("demo", "--json")
    assert run.code == 0, run.err
    doc = run.json()
    assert doc["window"] == 50_000
    assert doc["trigger_tokens"] == 45_000  # exactly 90%: the ratio decides
    assert doc["writer_thresholds"] == [9_000, 18_000, 27_000, 32_000]
    kinds = [e["event"] for e in doc["events"]]
    assert kinds.count("writer started") >= 4
    assert kinds.count("writer finished") == kinds.count("writer started")
    assert "context rebuilt" in kinds
    # Writers started before the first rebuild, at increasing turns.
    first_rebuild = kinds.index("context rebuilt")
    assert kinds.index("writer started") < first_rebuild
    assert doc["rebuilds"]
    rebuild = doc["rebuilds"][0]
    assert rebuild["outcome"] == "rebuilt"
    assert rebuild["tokens_before"] >= 45_000
    assert rebuild["tokens_after"] < 45_000 / 4
    assert rebuild["compacted_results"] > 0
    assert [s["heading"] for s in rebuild["sections"]] == list(HEADINGS)
    # Every source the demo writes shows up in the body. The notes do inside the
    # checkpoint: the rebuild brings the offline checkpoint up to now first, and that
    # writer run folds notes.md into its "Open notes" and empties the file (A14).
    tokens = {s["heading"]: s["tokens"] for s in rebuild["sections"]}
    for heading in HEADINGS:
        if heading != "Session notes":
            assert tokens[heading] > 0, heading
    tail = rebuild["tail"]
    assert tail["messages"] == tail["folded_into_digest"] + tail["kept_verbatim"]
    assert tail["folded_into_digest"] > 0
    assert doc["compacted_by_tool"]
    assert doc["peak_request_tokens"] < 45_000 + 5_000
    assert doc["store"] is None  # temporary


def test_demo_human_output_has_the_section_table() -> None:
    """Rich output (rich is in the test extra): timeline, table, tail, summary."""
    run = run_cli("demo")
    assert run.code == 0, run.err
    for text in (
        "Timeline",
        "writer started",
        "context rebuilt",
        "Sections of the rebuilt request",
        *HEADINGS,
        "11,000",
        "Collapsed tail",
        "Micro-compaction",
        "Summary",
    ):
        assert text in run.out, text


def test_demo_without_rich_prints_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core install has no rich: the demo still runs and prints plain tables."""
    monkeypatch.setattr(_cli_output, "load_rich", lambda: None)
    run = run_cli("demo")
    assert run.code == 0, run.err
    assert "== Timeline" in run.out
    assert "Session checkpoint" in run.out
    assert "┃" not in run.out


def test_demo_store_then_render_reads_without_writing(tmp_path: Path) -> None:
    """render prints the next request (R8.1) and leaves the store unchanged."""
    store = tmp_path / "demo.db"
    demo = run_cli("demo", "--store", str(store), "--json").json()
    assert demo["store"] == str(store)
    session_id = demo["session_id"]
    assert (tmp_path / "demo-memory" / "projects" / "confkit" / "MEMORY.md").is_file()

    before = _snapshot(store, session_id)
    text = run_cli("render", "--store", str(store), "--session", session_id, "--plain")
    assert text.code == 0, text.err
    assert "Summary of previous conversation from checkpoint files:" in text.out
    assert "# Session checkpoint" in text.out
    openai = run_cli("render", "--store", str(store), "--format", "openai", "--json").json()
    assert openai["session_id"] == session_id  # the newest session by default
    validate_request(openai["request"]["messages"], format="openai-chat")
    assert openai["request"]["messages"][0]["role"] == "system"
    anthropic = run_cli("render", "--store", str(store), "--format", "anthropic", "--json").json()
    validate_request(anthropic["request"]["messages"], format="anthropic")
    assert anthropic["request"]["messages"]["system"].startswith("You are a careful coding agent")
    plain = run_cli("render", "--store", str(store), "--json").json()
    assert plain["request"]["format"] == "text"
    assert plain["boundary_id"] == openai["boundary_id"] is not None
    assert plain["tokens"] == openai["tokens"]
    # The per-turn reminder (R8.3) is in the request, never in the store.
    last_user = [m for m in plain["request"]["messages"] if m["role"] == "user"][-1]
    assert "data-mimo-ctx" in last_user["text"]
    assert _snapshot(store, session_id) == before


def _snapshot(store: Path, session_id: str) -> tuple[object, ...]:
    async def read() -> tuple[object, ...]:
        async with await SQLiteStore.open(store) as s:
            messages = await s.list_messages(session_id, agent=None)
            session = await s.get_session(session_id)
            changes = await s.changes_since(session_id, 0)
            return (
                [m.model_dump_json() for m in messages],
                session.model_dump_json() if session else None,
                changes[1],
            )

    return anyio.run(read)


def test_demo_runs_as_a_module_in_a_subprocess(tmp_path: Path) -> None:
    """`python -m mimo_ctx demo`: exit 0, prints the section table, no network needed."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "NO_COLOR": "1"}
    # Proxies pointing nowhere: any network attempt would fail loudly.
    env.update({"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"})
    done = subprocess.run(
        [sys.executable, "-m", "mimo_ctx", "demo"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Sections of the rebuilt request" in done.stdout
    assert "Session checkpoint" in done.stdout
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # the temporary store is gone


def test_render_unknown_session_and_empty_store(tmp_path: Path) -> None:
    """Exit 2 with one line naming what is missing."""
    store = tmp_path / "demo.db"
    run_cli("demo", "--store", str(store), "--json")
    missing = run_cli("render", "--store", str(store), "--session", "ses_nope")
    assert missing.code == 2
    assert "no session 'ses_nope'" in missing.err
    assert missing.err.count("\n") == 1

    empty = tmp_path / "empty.db"

    async def create() -> None:
        async with await SQLiteStore.open(empty):
            pass

    anyio.run(create)
    run = run_cli("render", "--store", str(empty))
    assert run.code == 2
    assert "holds no session" in run.err


def test_demo_runs_without_rich_installed(tmp_path: Path) -> None:
    """The core install (no `cli` extra): `import rich` fails, the demo prints plain text."""
    code = (
        "import sys\n"
        "sys.modules['rich'] = None  # makes `import rich` raise ImportError\n"
        "from mimo_ctx.cli import main\n"
        "sys.exit(main(['demo']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "== Timeline" in done.stdout
    assert "Recent user input (verbatim)" in done.stdout
    assert "━" not in done.stdout
