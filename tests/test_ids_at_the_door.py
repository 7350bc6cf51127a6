"""Session, project and task ids are checked where they enter (issue 17 item 15).

A 300-character id used to pass ``open_session`` and then every writer failed
with "File name too long" (a traceback on stderr); ids holding a newline or a
control character were accepted; a lone surrogate raised a raw encoding error.
An id names a memory directory (SPEC A13): now it is refused up front with one
:class:`InvalidIdError` naming the problem.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from mimo_ctx import ContextMiddleware, InMemoryStore, InvalidIdError, PathEscapeError, Task
from mimo_ctx.session import MAX_ID_BYTES, check_id

BAD_IDS = {
    "300 characters": "s" * 300,
    "129 bytes": "é" * 64 + "x",
    "newline": "ses\nsecond line",
    "carriage return": "ses\r1",
    "tab": "ses\t1",
    "NUL": "ses\x001",
    "escape": "ses\x1b[31m",
    "DEL": "ses\x7f",
    "NEL": "ses\x851",
    "line separator": "ses\u20281",
    "paragraph separator": "ses\u20291",
    "lone surrogate": "ses\ud800",
    "empty": "",
    "dot dot": "..",
    "slash": "a/b",
    "backslash": "a\\b",
}


@pytest.mark.parametrize("name", sorted(BAD_IDS))
def test_bad_ids_are_refused_with_one_clear_error(name: str) -> None:
    with pytest.raises(InvalidIdError) as caught:
        check_id(BAD_IDS[name], "session id")
    message = str(caught.value)
    assert message.startswith("session id")
    message.encode("utf-8")  # printable: no lone surrogate reaches a log line
    assert "\n" not in message
    assert isinstance(caught.value, PathEscapeError)  # the error open_session raised before


@pytest.mark.parametrize(
    "good",
    [
        "ses_1a2b3c",
        "T1.2",
        "a" * MAX_ID_BYTES,
        "projet-été",
        "4f1c0e6a-1f7d-4a8e-9c57-0d9b1f3e8a21",
    ],
)
def test_ordinary_ids_pass(good: str) -> None:
    assert check_id(good, "id") == good


@given(st.text(min_size=1, max_size=80))
def test_an_accepted_id_is_one_printable_path_component(value: str) -> None:
    try:
        check_id(value, "id")
    except InvalidIdError:
        return
    assert len(value.encode("utf-8")) <= MAX_ID_BYTES
    assert Path(value).name == value
    assert value not in (".", "..")
    assert not any(unicodedata.category(c) in {"Cc", "Cs", "Zl", "Zp"} for c in value)


@pytest.mark.parametrize("name", ["300 characters", "newline", "lone surrogate", "NUL"])
@pytest.mark.parametrize("field", ["session_id", "project_id"])
async def test_open_session_and_the_tools_refuse_them(
    tmp_path: Path, name: str, field: str
) -> None:
    bad = BAD_IDS[name]
    session_id, project_id = (bad, "default") if field == "session_id" else ("ok", bad)
    store = InMemoryStore()
    async with ContextMiddleware(store, tmp_path / "mem", model=100_000) as mw:
        with pytest.raises(InvalidIdError):
            await mw.open_session(session_id, project_id=project_id)
        with pytest.raises(InvalidIdError):
            mw.tools(session_id, project_id)
    assert await store.list_sessions() == []
    assert not (tmp_path / "mem" / "sessions").exists()


@pytest.mark.parametrize("name", ["300 characters", "newline", "lone surrogate"])
def test_task_ids_are_checked_when_the_task_is_made(name: str) -> None:
    with pytest.raises(ValidationError, match="task id"):
        Task(id=BAD_IDS[name], session_id="s", time_created=0, time_updated=0)
