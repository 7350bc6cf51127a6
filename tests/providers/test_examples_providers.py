"""examples/openai_chat.py and examples/anthropic_stream.py run offline (issue 5, "Done when").

Each is executed as a script, the way a user runs it, against the loopback
stand-in it starts on 127.0.0.1; proxies point nowhere, so an example that tried
the network would fail. Each takes a few seconds (most of it importing the SDK);
the timeout only guards against a hang, it is not a timing assertion.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.update({"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"})
    env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )


def test_openai_chat_example_rebuilds_at_the_trigger_line() -> None:
    """R1.1a / R8.1: the wrapped client crosses the line, the next request is rebuilt."""
    done = run_example("openai_chat.py")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "answer: It adds numbers: demo.add(a, b).",
        "answer: In 0.2.0 add() started to accept floats.",
    ]
    assert lines[2].startswith("context rebuilt: rebuilt, ")
    assert lines[3] == "streamed: demo adds numbers, and since 0.2.0 floats too."
    assert lines[-5:] == [
        "the last request (after the rebuild) sent:",
        "  system: You are a concise assistant for the demo project.",
        "  user: Summary of previous conversation from checkpoint files:",
        "  user: What changed in 0.2.0?",
        "  user: Summarise both answers in one line.",
    ]


def test_anthropic_stream_example_recovers_from_an_overflow() -> None:
    """R1.1b: "prompt is too long" -> one rebuild, one retry, the stream goes on."""
    done = run_example("anthropic_stream.py")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert out.count("context rebuilt after an overflow: rebuilt") == 1
    assert "claude: In 0.2.0 add() started to accept floats." in out
    assert "the stand-in received 5 requests; the retry sent:" in out
    assert "  user: Summary of previous conversation from checkpoint files:" in out


def test_llm_writer_example_forks_the_session_and_reads_the_cache() -> None:
    """examples/llm_writer.py: one line builds the writer from each SDK client; the
    writer's request is forked from the session's and the stand-in's prompt cache
    serves at least 90% of it; the checkpoint is on disk."""
    done = run_example("llm_writer.py")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for provider in ("openai", "anthropic"):
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"{provider}: ")]
        (written,) = [line for line in lines if "checkpoint written by" in line]
        assert "written by llm (forked), 1 call" in written
        sent, cached = (
            int(x.replace(",", ""))
            for x in re.findall(r"([\d,]+) tokens sent, ([\d,]+) of them cached", written)[0]
        )
        assert cached >= 0.9 * sent
        assert f"{provider}: Topic: Split the demo parser into a tokenizer and a parser" in lines
