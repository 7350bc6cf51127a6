"""The checkpoint in a rebuilt body is current to the newest message (shared sessions).

The offline writer's watermark lies a tail's length before the rebuild; before the
body folded that tail into the writer's saved state, its "Next concrete action"
quoted a plan the tail had already carried out (258c7280 at its compaction point:
"add `secret_key_base` to the test config", done dozens of calls earlier).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo_ctx.checkpoint.evidence import stated_plan
from mimo_ctx.importers import load_transcript
from mimo_ctx.messages import MAIN_AGENT, TextPart
from mimo_ctx.replay import replay_transcript, stable_ids

pytestmark = pytest.mark.transcripts

_CARRY_ON = "- Carry on (mid-task): "


def _points(path: Path) -> list[int]:
    transcript = load_transcript(path)
    return [c.index for c in transcript.compactions] + [len(transcript.messages) * 9 // 10]


@pytest.mark.parametrize(
    "name",
    [
        "258c7280-ae70-4798-800f-63464d01a85d.jsonl",
        "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl",
        "5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
    ],
)
async def test_the_next_action_is_the_newest_stated_plan(transcripts_dir: Path, name: str) -> None:
    path = transcripts_dir / "claude_code" / name
    transcript = stable_ids(load_transcript(path))
    for at in _points(path):
        report = await replay_transcript(transcript, window=200_000, rebuild_at=at)
        assert report.point is not None
        assert report.point.boundary is not None
        body = "\n".join(p.text for p in report.point.boundary.parts if isinstance(p, TextPart))
        nxt = body.split("## 2. Next concrete action", 1)[1].split("\n## ", 1)[0]
        carry = [line for line in nxt.splitlines() if line.startswith(_CARRY_ON)]
        if not carry:
            continue
        newest = None
        for message in transcript.messages[:at]:
            if message.role != "assistant" or message.agent != MAIN_AGENT:
                continue
            for part in message.parts:
                if isinstance(part, TextPart) and not part.ignored:
                    newest = stated_plan(part.text) or newest
        assert newest is not None
        assert carry[0].removeprefix(_CARRY_ON) == newest, (name, at, carry[0], newest)
