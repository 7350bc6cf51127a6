"""More secret shapes stay out of logs and events; hard links stay out of prompts
(issue 17 item 19).

GitHub, Groq, Hugging Face and Slack tokens, AWS keys, ``?token=`` query values and
passwords inside DSN URLs used to reach logs unredacted; a hard link inside a
session directory passed the memory tool's path check (a path check cannot see a
hard link's other name).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from mimo_ctx import ContextMiddleware, InMemoryStore, TextPart, WriterFailed
from mimo_ctx.errors import PathEscapeError
from mimo_ctx.events import REDACTED, redact_secrets
from mimo_ctx.memory import read_text

# Built at run time: no credential-shaped literal sits in the repository.
SECRETS = {
    "github classic": "ghp_" + "Ab1" * 12,
    "github oauth": "gho_" + "Zz9" * 12,
    "github fine-grained": "github_pat_" + "11AAAA" * 6,
    "groq": "gsk_" + "q1W2" * 10,
    "hugging face": "hf_" + "HuGg" * 9,
    "slack bot": "xoxb-" + "1234567890-" * 2 + "aBcD" * 6,
    "slack app": "xapp-1-" + "A0B1C2" * 3 + "-" + "9" * 12,
    "aws access key id": "AKIA" + "IOSFODNN7EXAMPL"[:15] + "Q",
}
NAMED = {
    "aws secret": ("aws_secret_access_key = ", "wJalrXUtnFEMI" + "/K7MDENG/bPxRfiCYEX"),
    "aws secret json": ('"SecretAccessKey": "', "abc/def+ghi" + "jklmno"),
    "query token": ("GET https://api.example.com/v1/files?token=", "t0k3n" + "Value"),
    "query access token": ("callback?state=1&access_token=", "ya29" + ".abcdef"),
    "client secret": ("client_secret=", "cl1ent" + "s3cret"),
    "dsn password": ("postgresql://bob:", "pa55" + "word"),
    "redis url": ("redis://:", "r3d1s" + "pw"),
}
SLACK_HOOK = "https://hooks.slack.com/services/" + "T0000/B0000/" + "X" * 24


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_token_shapes_are_redacted(name: str) -> None:
    secret = SECRETS[name]
    text = f"request failed ({secret}) for session ses_1"
    assert redact_secrets(text) == f"request failed ({REDACTED}) for session ses_1"


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_values_are_redacted(name: str) -> None:
    prefix, secret = NAMED[name]
    redacted = redact_secrets(f"{prefix}{secret}@db:5432/x and more")
    assert secret not in redacted
    assert redacted.startswith(prefix)
    assert REDACTED in redacted


def test_query_redaction_stops_at_the_next_parameter() -> None:
    assert redact_secrets("x?token=abc123&page=2") == f"x?token={REDACTED}&page=2"
    assert redact_secrets(SLACK_HOOK) == REDACTED


def test_ordinary_text_is_left_alone() -> None:
    for text in (
        "max_tokens=4000 tokens_before=100 tokens_after=90",
        "usage 95000 >= 90000: writer started",
        "password reset instructions were sent",
        "the token budget of the checkpoint section",
        "https://example.com/docs?page=2#token",
        "ses_1a2293a42790008uAfphCrdBR4PO msg_1a2293a4279000AbCdEfGhIjKlMn",
    ):
        assert redact_secrets(text) == text


def test_logs_and_events_carry_none_of_them(caplog: pytest.LogCaptureFixture) -> None:
    everything = " ".join([*SECRETS.values(), *(p + s + "@h" for p, s in NAMED.values())])
    with caplog.at_level(logging.WARNING, logger="mimo_ctx"):
        logging.getLogger("mimo_ctx").warning("provider said: %s", everything)
    event = WriterFailed(session_id="s", time=0, writer="llm", error=everything)
    for secret in [*SECRETS.values(), *(s for _, s in NAMED.values())]:
        assert secret not in caplog.records[0].getMessage()
        assert secret not in event.error


# --------------------------------------------------------------------------- hard links

SECRET_TEXT = "root:x:0:0:the outside secret"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "secret.md"
    target.parent.mkdir()
    target.write_text(SECRET_TEXT + "\n")
    return target


async def test_the_memory_tool_refuses_a_hard_link(tmp_path: Path, outside: Path) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=100_000) as mw:
        session = await mw.open_session()
        directory = mw.layout.session_dir(session.id)
        directory.mkdir(parents=True)
        os.link(outside, directory / "linked.md")
        (directory / "plain.md").write_text("# plain\n\nordinary memory\n")
        tools = mw.tools(session.id)
        answer = await tools.call("memory", {"operation": "read", "path": "linked.md"})
        assert answer.startswith("Error:")
        assert "hard link" in answer
        assert SECRET_TEXT not in answer
        found = await tools.call("memory", {"operation": "search", "query": "outside secret"})
        assert SECRET_TEXT not in found
        plain = await tools.call("memory", {"operation": "read", "path": "plain.md"})
        assert "ordinary memory" in plain


async def test_a_hard_linked_memory_file_is_never_injected(tmp_path: Path, outside: Path) -> None:
    async with ContextMiddleware(InMemoryStore(), tmp_path / "mem", model=100_000) as mw:
        session = await mw.open_session()
        notes = mw.layout.notes_path(session.id)
        notes.parent.mkdir(parents=True)
        os.link(outside, notes)
        with pytest.raises(PathEscapeError, match="hard link"):
            await read_text(notes, root=mw.layout.root)
        await mw.add_user_message(session.id, "Start.")
        report = await mw.rebuild(session.id)
        boundary = await mw.store.get_message(report.boundary_id) if report.boundary_id else None
    assert boundary is not None
    body = "\n".join(p.text for p in boundary.parts if isinstance(p, TextPart))
    assert SECRET_TEXT not in body
