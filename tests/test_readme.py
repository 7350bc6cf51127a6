"""The README's promises: the loop example runs, every config key is documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from mimo_ctx.config import PushCaps, RebuildConfig, TailConfig, WriterConfig

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_loop_example_runs(tmp_path: Path) -> None:
    """The minimal loop of "Using the middleware" is executed as written (issue 4)."""
    section = README.read_text().split("## Using the middleware", 1)[1]
    example = _python_blocks(section)[0]
    script = tmp_path / "example.py"
    script.write_text(example)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "context rebuilt:" in result.stdout


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(_keys(annotation, f"{key}."))
        else:
            keys.append(key)
    return keys


def test_readme_documents_every_config_key() -> None:
    text = README.read_text()
    keys = _keys(RebuildConfig)
    assert {k.split(".")[0] for k in keys if "." in k} == {"push_caps", "tail", "writer"}
    for model in (PushCaps, TailConfig, WriterConfig):
        assert model.model_fields  # nested models are walked above
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"README configuration table lacks: {missing}"


def test_readme_image_is_committed_and_regenerated_by_the_documented_command(
    tmp_path: Path,
) -> None:
    """The picture of the demo's session: committed, and made by the command shown."""
    import pytest

    image = pytest.importorskip("matplotlib.image", reason="the plot extra draws the picture")
    text = README.read_text()
    committed = README.parent / "docs" / "images" / "replay-demo.png"
    assert "](docs/images/replay-demo.png)" in text
    assert committed.is_file()
    commands = re.findall(r"^mimo-ctx (.+)$", text.split("### A picture of a session", 1)[1], re.M)
    assert commands[:2] == [
        "demo --transcript demo-session.json",
        "replay demo-session.json --window 50K --plot docs/images/replay-demo.png",
    ]
    (tmp_path / "docs" / "images").mkdir(parents=True)
    for command in commands[:2]:
        result = subprocess.run(
            [sys.executable, "-m", "mimo_ctx", *command.split()],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr
    fresh = image.imread(tmp_path / "docs" / "images" / "replay-demo.png")
    assert fresh.shape == image.imread(committed).shape
    # The same session gives the same chart: only the session id in the subtitle (it
    # comes from the transcript file's time) may differ.
    differing = (abs(fresh - image.imread(committed)).sum(axis=2) > 0.01).mean()
    assert differing < 0.01


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{len(level)}}} ", body, maxsplit=1)[0]


def _item(text: str, start: str) -> str:
    """The list item (bullet or numbered) that starts with ``start``, with its wrapped lines."""
    return re.findall(rf"^(?:\* |\d+\. ){re.escape(start)}.*?(?=^\S|\Z)", text, re.M | re.S)[0]


def test_docs_describe_the_two_writers_and_when_to_choose_each() -> None:
    """Issue 19: the README says what each writer is for; the provider docs show the
    one-line constructions; both point at each other."""
    choice = _section(README.read_text(), "## Checkpoint writers: offline or model")
    assert "**The offline writer** (the default)" in choice
    assert "**`LLMCheckpointWriter`** asks a model" in choice
    assert choice.count("Prefer it") == 2  # when to take one, when the other
    for factory in ("from_openai", "from_anthropic", "from_pydantic_ai", "from_langchain"):
        assert f"`{factory}`" in choice
    assert "examples/llm_writer.py" in choice
    providers = (README.parent / "docs" / "providers.md").read_text()
    on_client = _section(providers, "## Checkpoint writer on your client")
    assert "LLMCheckpointWriter.from_openai(client, model=" in on_client
    assert "LLMCheckpointWriter.from_anthropic(client, model=" in on_client
    assert '"Checkpoint\nwriters: offline or model"' in on_client


def test_docs_citing_a3_state_what_the_writer_reads() -> None:
    """SPEC A3 as amended (the writer reads what the model sees, not the history),
    wherever the docs say what a writer run reads."""
    readme = README.read_text()
    providers = (README.parent / "docs" / "providers.md").read_text()
    items = [
        _item(readme, "**Writer** (A3)"),
        _item(_section(readme, "## Checkpoint writers: offline or model"), "**Bounded.**"),
        _item(_section(providers, "## Checkpoint writer on your client"), "**Standalone**"),
    ]
    for item in items:
        flat = " ".join(item.split())
        assert "SPEC A3 as amended" in flat, item
        assert (
            "the previous checkpoint plus the messages from the newest boundary or the "
            "previous watermark, whichever is later, up to" in flat
        ), item
    for doc in (readme, providers, (README.parent / "docs" / "reliability.md").read_text()):
        assert "checkpoints the history" not in " ".join(doc.split())
