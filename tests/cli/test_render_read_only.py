"""``mimo-ctx render`` never writes to the store (issue 17 item 16).

It used to open the store like a writer: a 0-byte file became an 86 KB
database, and a store on a read-only mount was reported as "not a readable
SQLite database". It now opens it read-only.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from mimo_ctx import Session, SQLiteStore, StoreError
from tests.cli.conftest import REPO_ROOT, run_cli


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("demo")
    run = run_cli("demo", "--store", str(folder / "demo.db"), "--json")
    assert run.code == 0, run.err
    return folder / "demo.db"


def test_an_empty_file_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    run = run_cli("render", "--store", str(empty))
    assert run.code == 2
    assert "empty file, not a mimo_ctx store" in run.err
    assert run.err.count("\n") == 1
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_render_leaves_the_file_byte_identical(demo_store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(demo_store, copy)
    shutil.copytree(demo_store.parent / "demo-memory", tmp_path / "copy-memory")
    before = _digest(copy)
    run = run_cli("render", "--store", str(copy), "--json")
    assert run.code == 0, run.err
    assert run.json()["boundary_id"] is not None
    assert _digest(copy) == before
    # A WAL-mode reader may leave SQLite's WAL files beside the store; no content.
    wal = tmp_path / "copy.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0


async def test_a_read_only_store_refuses_writes(demo_store: Path) -> None:
    async with await SQLiteStore.open(demo_store, read_only=True) as store:
        sessions = await store.list_sessions()
        assert sessions
        with pytest.raises(StoreError, match="readonly"):
            await store.create_session(Session(time_created=1))


async def test_read_only_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no SQLite store file"):
        await SQLiteStore.open(tmp_path / "missing.db", read_only=True)
    assert [p async for p in anyio.Path(tmp_path).iterdir()] == []


def _unshare_works() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False, timeout=30)
    return probe.returncode == 0


def test_render_works_on_a_read_only_mount(demo_store: Path, tmp_path: Path) -> None:
    """A real read-only bind mount (user and mount namespaces, no root needed)."""
    if not _unshare_works():
        pytest.skip("needs Linux user namespaces (`unshare -rm`) to make a read-only mount")
    folder = tmp_path / "ro"
    folder.mkdir()
    shutil.copy(demo_store, folder / "demo.db")
    shutil.copytree(demo_store.parent / "demo-memory", folder / "demo-memory")
    script = (
        f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && "
        f"! touch {folder}/probe 2>/dev/null && "
        f"{sys.executable} -m mimo_ctx render --store {folder}/demo.db --json"
    )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert '"boundary_id": "msg_' in done.stdout


def test_the_store_opens_read_only_in_render(demo_store: Path) -> None:
    """The library call behind the command, for hosts that render from code."""
    from mimo_ctx.cli._render import render_session

    result = anyio.run(render_session, demo_store, None)
    assert result.view.boundary_id is not None
