"""Keeping machine text out of the user's words.

Agent front-ends write text into user turns on the user's behalf: command
output, hook output, system reminders, task notifications, environment blocks,
terminal colour codes. None of it was typed by the person, and quoted as "the
user's words" it pushes their real words out of a rebuilt context. The
importers split each user text into

* a **typed** text part (what the person wrote; sent, and quoted by "Recent
  user input");
* a **synthetic** text part with the machine text (sent to the model as
  before, never quoted as the user's words), terminal escape sequences removed;
* and, whenever those two are not the original text exactly, the original as
  an **ignored** text part: kept in storage unchanged, never sent (SPEC A10),
  so nothing is lost.

A text with no machine block and no escape sequence stays one plain text part.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mimo_ctx.messages import TextPart
from mimo_ctx.typed_input import strip_ansi

__all__ = ["split_machine_text", "strip_ansi", "user_text_parts"]


def _pattern(tags: Sequence[str], to_end: Sequence[str], lines: Sequence[str]) -> re.Pattern[str]:
    alternatives: list[str] = []
    if to_end:
        alternatives.append(rf"<(?:{'|'.join(map(re.escape, to_end))})>.*\Z")
    if tags:
        # A closed block, or an unclosed one running to the end of the text.
        alternatives.append(rf"<(?P<tag>{'|'.join(map(re.escape, tags))})>.*?(?:</(?P=tag)>|\Z)")
    alternatives.extend(rf"^[ \t]*{line}[ \t]*$" for line in lines)
    return re.compile("|".join(alternatives), re.DOTALL | re.MULTILINE)


_cache: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], re.Pattern[str]] = {}


def split_machine_text(
    text: str,
    tags: Sequence[str],
    *,
    to_end: Sequence[str] = (),
    lines: Sequence[str] = (),
) -> tuple[str, list[str]]:
    """Split ``text`` into what a person typed and the machine blocks in it.

    Args:
        text: One user text.
        tags: Tag names whose ``<tag>…</tag>`` blocks are machine text (an
            unclosed block runs to the end).
        to_end: Tag names whose block runs to the end of the text whatever follows.
        lines: Regular expressions of whole lines that are machine text.

    Returns:
        ``(typed, machine)``: the typed text (escape sequences removed, pieces
        between machine blocks stripped and joined by newlines; ``""`` when
        nothing is typed) and the machine blocks, in order, as they were.
    """
    key = (tuple(tags), tuple(to_end), tuple(lines))
    pattern = _cache.get(key)
    if pattern is None:
        pattern = _cache[key] = _pattern(tags, to_end, lines)
    typed: list[str] = []
    machine: list[str] = []
    at = 0
    for match in pattern.finditer(text):
        typed.append(text[at : match.start()])
        machine.append(match.group(0))
        at = match.end()
    typed.append(text[at:])
    pieces = [strip_ansi(p).strip() for p in typed]
    return "\n".join(p for p in pieces if p), machine


def user_text_parts(raw: str, typed: str, machine: Sequence[str]) -> list[TextPart]:
    """The parts one user text becomes (see the module docs).

    Args:
        raw: The text as the transcript holds it.
        typed: What the person typed in it (``""``: nothing).
        machine: The machine text in it, in order.
    """
    if not machine and typed == raw.strip():
        return [TextPart(text=raw)]
    cleaned = [strip_ansi(m).strip() for m in machine]
    written = "\n".join(m for m in cleaned if m)
    if not typed and written == raw:
        return [TextPart(text=raw, synthetic=True)]
    parts: list[TextPart] = []
    if typed:
        parts.append(TextPart(text=typed))
    if written:
        parts.append(TextPart(text=written, synthetic=True))
    parts.append(TextPart(text=raw, ignored=True))
    return parts
