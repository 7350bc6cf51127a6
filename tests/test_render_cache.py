"""The budgeted-rendering cache of :mod:`mimo_ctx.render` (R6.1, R6.2; issue 9).

A cache hit must return exactly what a fresh ``read_budgeted[_section_aware]``
call returns: the entry is used only for the same text, cap, path and counter.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_ctx import _budget_cache
from mimo_ctx.budget import read_budgeted, read_budgeted_section_aware
from mimo_ctx.sections import render_section
from mimo_ctx.tokens import CharEstimator


def _doc(word: str, lines: int = 400) -> str:
    body = "\n".join(f"- {word} line {i} with some more words" for i in range(lines))
    return f"# Memory\n\n## Rules\n_What rules hold._\n{body}\n\n## Other\n{body}\n"


def test_r6_2_cache_hit_equals_fresh_call_and_changed_text_is_recomputed() -> None:
    first, second = _doc("alpha"), _doc("bravo")
    for _ in range(2):  # the second pass is served from the cache
        assert _budget_cache.budgeted(
            first, 500, "/m/MEMORY.md", None, section_aware=True, section_caps=None
        ).output == read_budgeted_section_aware(first, 500, path="/m/MEMORY.md")
    # Same path and cap, new content (a rewritten file): never the stale result.
    got = _budget_cache.budgeted(
        second, 500, "/m/MEMORY.md", None, section_aware=True, section_caps=None
    ).output
    assert got == read_budgeted_section_aware(second, 500, path="/m/MEMORY.md")
    assert "bravo" in got
    assert "alpha" not in got


def test_r6_1_cache_keys_on_counter_and_kind() -> None:
    text = _doc("charlie")
    counter = CharEstimator()
    proportional = _budget_cache.budgeted(
        text, 300, "/m/notes.md", counter, section_aware=False, section_caps=None
    ).output
    assert proportional == read_budgeted(text, 300, path="/m/notes.md", counter=counter)
    aware = _budget_cache.budgeted(
        text, 300, "/m/notes.md", counter, section_aware=True, section_caps=None
    ).output
    assert aware == read_budgeted_section_aware(text, 300, path="/m/notes.md", counter=counter)
    assert aware != proportional


def test_cache_stays_bounded() -> None:
    for i in range(3 * _budget_cache.CACHE_ENTRIES):
        _budget_cache.budgeted(
            _doc(f"w{i}", 5), 50, f"/m/{i}.md", None, section_aware=True, section_caps=None
        )
    assert _budget_cache.cached_entries() <= _budget_cache.CACHE_ENTRIES


_TEXTS = st.sampled_from(
    [
        _doc("alpha", 30),
        _doc("bravo", 30),
        "",
        "   \n",
        "# Title\n\n## Recent activity\n- forged\n```\nopen fence\n",
        "plain notes without structure\n" * 20,
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            _TEXTS,
            st.sampled_from([0, 5, 40, 500]),
            st.sampled_from(["/m/MEMORY.md", "/m/notes.md"]),
            st.sampled_from(["Project durable knowledge", "Global memory", "Session notes"]),
            st.booleans(),
            st.booleans(),  # a copy of the text (equal, not the same object)
        ),
        max_size=12,
    )
)
def test_a_remembered_section_is_the_section_rendered_fresh(
    calls: list[tuple[str, int, str, str, bool, bool]],
) -> None:
    # Rebuild after rebuild: files unchanged or rewritten, caps and headings varied;
    # what the cache gives is render_section of a fresh budgeted read every time.
    for text, cap, path, heading, section_aware, copied in calls:
        given_text = "".join(list(text)) if copied else text
        read = read_budgeted_section_aware if section_aware else read_budgeted
        body = read(text, cap, path=path)
        expected = render_section(heading, body, file_path=path) if body.strip() else ""
        got = _budget_cache.budgeted(
            given_text, cap, path, None, section_aware=section_aware, section_caps=None
        ).section(heading)
        assert got == expected
