"""The tail digest and the collapse of digested messages (SPEC R7, A9).

At a rebuild, the messages after the watermark (the *tail*) are summarised as a
"# Recent activity" list in the boundary body: one line per assistant text, tool
call and sub-task (:func:`render_tail_digest`). From then on every outgoing
request drops the digested assistant/tool messages and keeps only the user
messages among them (:func:`collapse_checkpoint_tail`).

Choices where the SPEC is silent (documented, ours):

* Over the line limit the **newest** lines are kept: the model is told to
  "resume the last task from that list", so the end of the list matters most.
  The first line then says how many earlier lines were left out; that note counts
  towards the limit.
* Assistant text parts marked ``ignored`` are skipped (the model never saw them);
  ``synthetic`` assistant text is listed like any other text (the model did see
  it). Blank text is skipped.
* A sub-task line is cut like assistant text, so every line stays on one line.
* Provider-format data keeps results in separate ``role="tool"`` messages, so a
  call's own state can still read pending. A pending/running call whose result
  appears among the digested messages is listed as completed (or as failed, with
  the result text as the error, when the result is an error).
* Lengths count Python characters (code points), so a cut never splits a
  surrogate pair; the original counts UTF-16 code units.

Cuts that keep what identifies a line (beyond the original, whose A9 rule keeps
the first ``n - 1`` characters of everything, so long path arguments lost their
file name and different files gave identical lines):

* :func:`truncate` does not cut inside a word when a word boundary is near: it
  ends at the last space within :data:`WORD_REACH` characters (at most a quarter
  of the limit) before the cut. Text without a near space (a long token, CJK
  text) is still cut at the limit.
* A **path or URL** argument (a string without whitespace holding ``/`` or
  ``\\``, or any string under a key that names one: ``file_path``, ``path``,
  ``cwd``, ``url``…) is cut in the **middle** at separators by
  :func:`elide_path`: it keeps its first component(s) and its last ones, the
  file name always (a name too long by itself keeps its start and its end, the
  extension), with ``…`` for what was left out. A command keeps its head
  (``git commit -m …``), cut at a word boundary.
* In one digest, **different paths never give the same text**: when two
  distinct path values of the listed calls would elide to one string, both are
  shown longer (the limit doubled until they differ, or whole).
"""

from __future__ import annotations

import functools
import re
import reprlib
import weakref
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Final

from mimo_ctx._util import escape_html_headings, one_line
from mimo_ctx.messages import (
    CheckpointPart,
    Message,
    SubtaskPart,
    TextPart,
    ToolPart,
    ToolResultPart,
    ToolStateCompleted,
    ToolStateError,
    user_input_text,
)
from mimo_ctx.tokens import js_json

__all__ = [
    "ACTIVITY_HEADING",
    "DEFAULT_ARG_CHARS",
    "DEFAULT_MAX_LINES",
    "DEFAULT_TEXT_CHARS",
    "INTERRUPTED_NOTE",
    "USER_QUOTED_WHERE",
    "WORD_REACH",
    "DigestLine",
    "TailDigest",
    "build_tail_digest",
    "collapse_checkpoint_tail",
    "digest_lines",
    "elide_path",
    "format_tool_call",
    "is_digested",
    "is_path_argument",
    "omitted_note",
    "render_tail_digest",
    "truncate",
]

ACTIVITY_HEADING: Final = "# Recent activity"
"""Heading of section 9 of the rebuild body (SPEC R5.3)."""
DEFAULT_MAX_LINES: Final = 200
"""At most this many activity lines (SPEC R7.2)."""
DEFAULT_TEXT_CHARS: Final = 240
"""Assistant text is cut to this many characters (SPEC R7.2)."""
DEFAULT_ARG_CHARS: Final = 80
"""Each tool argument and error message is cut to this many characters (SPEC R7.2)."""
INTERRUPTED_NOTE: Final = (
    "Tool calls marked → interrupted did not finish before the rebuild; "
    "re-run them if you still need their results."
)
"""First line of the section when any listed call was interrupted (wording ours, A9)."""

WORD_REACH: Final = 15
"""How far back (characters) :func:`truncate` looks for a space to end a cut on."""

_ELLIPSIS: Final = "…"
_ARROW: Final = " → "
_PATH_KEY: Final = re.compile(r"(?i)(^|_)(path|file|filename|dir|directory|cwd|url|uri)s?$")
# The characters str.isspace() holds: the regex engine and str use one Unicode table.
_WHITESPACE: Final = re.compile(r"\s")


def _one_line_head(text: str, chars: int) -> str:
    """A prefix of ``one_line(text)`` longer than ``chars``, or all of it when not that long.

    ``one_line`` of a prefix of ``text`` is a prefix of ``one_line(text)`` (its
    last word may be cut, never changed), so a long text is collapsed only as far
    as a cut needs: a user message of pages costs what its first line costs.
    """
    reach = 2 * chars + 64
    if len(text) > reach:
        head = one_line(text[:reach])
        if len(head) > chars:
            return head
    return one_line(text)


def truncate(text: str, limit: int) -> str:
    """Collapse whitespace runs to one space, strip, and cut to ``limit`` characters.

    SPEC A9: a longer string keeps at most its first ``limit - 1`` characters
    followed by ``…``, so the result is never longer than ``limit``. Ours: a cut
    that would fall inside a word ends at the last space within
    ``min(WORD_REACH, limit // 4)`` characters before it instead (that space
    dropped); with no space that near, the word is cut.

    Args:
        text: Any text.
        limit: The maximum length, at least 1.

    Raises:
        ValueError: ``limit`` is smaller than 1.
    """
    if limit < 1:
        raise ValueError(f"truncate limit must be at least 1, got {limit!r}")
    # Only flat[:limit] is read below, and whether there is more.
    flat = _one_line_head(text, limit)
    if len(flat) <= limit:
        return flat
    kept = flat[: limit - 1]
    if kept and kept[-1] != " " and flat[limit - 1] != " ":
        reach = min(WORD_REACH, limit // 4)
        space = kept.rfind(" ", len(kept) - reach) if reach else -1
        if space > 0:
            kept = kept[:space]
    return kept.rstrip(" ") + _ELLIPSIS


def is_path_argument(key: str, value: str) -> bool:
    """Whether a string argument is a path or URL that :func:`elide_path` cuts in the middle.

    True for a value without whitespace that holds ``/`` or ``\\``, and for any
    value under a key that names a path (``file_path``, ``path``, ``cwd``,
    ``url``, ``dir``…).
    """
    if _is_path_key(key):
        return True
    return ("/" in value or "\\" in value) and _WHITESPACE.search(value) is None


@functools.lru_cache(maxsize=1024)
def _is_path_key(key: str) -> bool:
    # Argument names repeat across every call of a digest: matched once each.
    return _PATH_KEY.search(key.strip()) is not None


def _join(sep: str, head: list[str], tail: list[str]) -> str:
    return sep.join([*head, _ELLIPSIS, *tail]) if head else sep.join([_ELLIPSIS, *tail])


def elide_path(path: str, limit: int) -> str:
    """Cut a path or URL to ``limit`` characters in the middle, keeping its file name.

    Whitespace runs become one space first (as in :func:`truncate`). The result
    is ``<first components>/…/<last components>``: the last component always,
    its parents up to half the limit, then as many leading components as fit,
    then more parents with what room is left. A last component too long to sit
    beside ``…/`` keeps its start and its end (the extension) around ``…``.
    Never longer than ``limit``.

    Args:
        path: The path or URL.
        limit: The maximum length, at least 1.

    Raises:
        ValueError: ``limit`` is smaller than 1.
    """
    if limit < 1:
        raise ValueError(f"elide_path limit must be at least 1, got {limit!r}")
    flat = one_line(path)
    if len(flat) <= limit:
        return flat
    sep = "/" if flat.count("/") >= flat.count("\\") else "\\"
    body = flat.rstrip(sep)
    parts = body.split(sep)
    name = parts[-1] + flat[len(body) :]
    if len(parts) == 1 or len(name) + 2 > limit:
        # The name alone does not fit beside "…/": keep its start and its end.
        back = min((limit - 1) - (limit - 1) // 2, len(name))
        front = limit - 1 - back
        return flat[:front] + _ELLIPSIS + name[len(name) - back :]
    inner = parts[:-1]
    head: list[str] = []
    tail = [name]
    lo, hi = 0, len(inner)
    half = max(limit // 2, len(name) + 2)
    while hi > lo and len(_join(sep, head, [inner[hi - 1], *tail])) <= half:
        hi -= 1
        tail.insert(0, inner[hi])
    while lo < hi and len(_join(sep, [*head, inner[lo]], tail)) <= limit:
        head.append(inner[lo])
        lo += 1
    while hi > lo and len(_join(sep, head, [inner[hi - 1], *tail])) <= limit:
        hi -= 1
        tail.insert(0, inner[hi])
    return _join(sep, head, tail)


def _json_value(value: Any) -> str:
    try:
        return js_json(value)
    except (ValueError, TypeError, RecursionError):
        # Not JSON (NaN, a set, a cycle, nesting deeper than the recursion limit):
        # show something rather than fail. reprlib bounds depth and length, where
        # plain repr() would hit the recursion limit again.
        return reprlib.repr(value)


def _shorten(key: str, value: str, limit: int) -> str:
    if is_path_argument(key, value):
        return elide_path(value, limit)
    return truncate(value, limit)


def _format_arg(key: str, value: Any, limit: int, widths: Mapping[str, int]) -> str:
    if isinstance(value, str):
        # The cut happens before escaping, as in the original: the escaped
        # form may be longer than `limit`, the text it encodes is not.
        shown = _shorten(key, value, widths.get(value, limit))
        # What json.dumps(shown, ensure_ascii=False) returns for a string, without
        # building an encoder per argument.
        return f"{key}={encode_basestring(shown)}"
    return f"{key}={truncate(_json_value(value), limit)}"


def format_tool_call(
    tool: str,
    arguments: dict[str, Any],
    *,
    arg_chars: int = 80,
    path_widths: Mapping[str, int] | None = None,
) -> str:
    """Render a call as ``tool(k="v", n=1)``, each argument cut to ``arg_chars`` (A9).

    String arguments are cut (paths and URLs in the middle, see the module docs),
    then JSON-escaped and quoted (non-ASCII kept); other values are serialised as
    compact JSON and then cut. Arguments keep their insertion order.
    ``path_widths`` gives some path values a longer cut (the digest uses it so
    that different paths stay different).
    """
    widths: Mapping[str, int] = path_widths or {}
    # Names are shown as they are, except that whitespace runs become one space:
    # a digest line must stay one line whatever a model put in a key.
    args = ", ".join(
        _format_arg(one_line(str(k)), v, arg_chars, widths) for k, v in arguments.items()
    )
    return f"{one_line(tool)}({args})"


def _path_widths(messages: Sequence[Message], limit: int) -> dict[str, int]:
    """Longer cuts for path values that would elide to the same text as another."""
    values: set[str] = set()
    for message in messages:
        if message.role != "assistant" or message.is_boundary:
            continue
        for part in message.parts:
            if isinstance(part, ToolPart):
                for key, value in part.state.input.items():
                    if (
                        isinstance(value, str)
                        and len(value) > limit
                        and is_path_argument(one_line(str(key)), value)
                    ):
                        values.add(value)
    widths: dict[str, int] = {}
    pending = sorted(values)
    width = limit
    while len(pending) > 1:
        groups: dict[str, list[str]] = {}
        for value in pending:
            groups.setdefault(elide_path(value, width), []).append(value)
        pending = [v for group in groups.values() if len(group) > 1 for v in group]
        if pending and width >= max(len(v) for v in pending):
            break  # shown whole and still alike: they differ only in whitespace runs
        width *= 2
        for value in pending:
            widths[value] = width
    return widths


@dataclass(frozen=True, slots=True)
class DigestLine:
    """One activity line, without the leading ``- ``.

    Attributes:
        text: The line's text, e.g. ``assistant: Done.`` or ``read(path="a.py")``.
        interrupted: The line is a tool call that did not finish.
    """

    text: str
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class TailDigest:
    """The rendered "# Recent activity" section and what went into it.

    Attributes:
        text: The section (heading, optional notes, lines), or ``""`` when there
            was no activity to list. No trailing newline.
        lines: The activity lines that were kept, oldest first.
        omitted: How many older lines were left out to respect the line limit.
    """

    text: str
    lines: tuple[DigestLine, ...]
    omitted: int

    @property
    def rendered(self) -> bool:
        """True when the section is non-empty (the boundary then sets ``digestUpTo``)."""
        return bool(self.text)

    @property
    def has_interrupted(self) -> bool:
        """True when a kept line is an interrupted tool call."""
        return any(line.interrupted for line in self.lines)

    def __bool__(self) -> bool:
        return self.rendered


def _answered(messages: Sequence[Message]) -> dict[str, ToolResultPart]:
    results: dict[str, ToolResultPart] = {}
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                results.setdefault(part.call_id, part)
    return results


def _tool_line(
    part: ToolPart, result: ToolResultPart | None, arg_chars: int, widths: Mapping[str, int]
) -> DigestLine:
    call = format_tool_call(part.tool, part.state.input, arg_chars=arg_chars, path_widths=widths)
    state = part.state
    if isinstance(state, ToolStateError):
        return DigestLine(f"{call}{_ARROW}error: {truncate(state.error, arg_chars)}")
    if isinstance(state, ToolStateCompleted):
        return DigestLine(call)
    # Pending or running: interrupted, unless a split-off result answered it.
    if result is None:
        return DigestLine(f"{call}{_ARROW}interrupted", interrupted=True)
    if result.is_error:
        return DigestLine(f"{call}{_ARROW}error: {truncate(result.output, arg_chars)}")
    return DigestLine(call)


def digest_lines(
    messages: Sequence[Message],
    *,
    text_chars: int = DEFAULT_TEXT_CHARS,
    arg_chars: int = DEFAULT_ARG_CHARS,
    quoted: Collection[str] | None = None,
) -> list[DigestLine]:
    """Every activity line of ``messages``, oldest first, with no line limit.

    SPEC R7.1, R7.2, A9: boundary messages are skipped, and user messages too unless
    ``quoted`` is given (**beyond**: the list then shows where each typed
    user message falls — ``user message <id> (quoted under Recent user input)`` for
    the ids in ``quoted``, ``user: <text>`` cut like assistant text for the others —
    so the model can tell which request the activity after it answers); assistant
    text becomes ``assistant: <text>``, a sub-task ``subtask: <command or agent>``,
    a tool call ``tool(args)`` with `` → error: <message>`` or `` → interrupted``
    appended when it failed or did not finish. Reasoning, file and tool-result
    parts are ignored.

    Args:
        messages: The tail: messages after the watermark, in order.
        text_chars: Cut length of assistant text and sub-task lines.
        arg_chars: Cut length of each tool argument and error message.
        quoted: Ids of the user messages the body quotes elsewhere; ``None`` leaves
            user messages out.

    Raises:
        ValueError: A cut length is smaller than 1.
    """
    _check_cuts(text_chars, arg_chars)
    lister = _Lister(messages, text_chars, arg_chars, quoted)
    return [line for message in messages for line in lister.lines_of(message)]


def _check_cuts(text_chars: int, arg_chars: int) -> None:
    if text_chars < 1 or arg_chars < 1:
        raise ValueError(
            f"digest cut lengths must be at least 1, got text_chars={text_chars!r}, "
            f"arg_chars={arg_chars!r}"
        )


def _blank(text: str) -> bool:
    """``not text.strip()`` without copying a long text."""
    return not text or text.isspace()


_LINES_KEPT: Final = 1024
"""Messages whose activity lines :class:`_RememberedLines` holds at the most."""


class _RememberedLines:
    """The activity lines of assistant messages, kept per message object between digests.

    A rebuild's tail overlaps the previous one's whenever the writer's watermark
    has not passed it, and the window hands the same message objects to each:
    their lines are formatted once. A message's lines depend on the message, the
    two cut lengths and, from the rest of the tail, only on the longer cut of its
    string arguments over ``arg_chars`` (:func:`_path_widths`) and on the results
    answering a call that did not finish: an entry is kept only for a message
    without such a call, and used only while none of its long strings has a
    longer cut. Messages are never changed in place (a changed message is a new
    object, as for the cached token estimate). An entry holds its message weakly
    (a dead one's id may be given to a new message: the reference tells them
    apart) and its long strings by their hashes only (a tool call's file content
    is not kept alive; a collision only misses); the oldest entries go past
    :data:`_LINES_KEPT`.
    """

    def __init__(self) -> None:
        # id(message) -> (the message, weakly; the cuts; its long strings' hashes;
        # its lines)
        self._entries: OrderedDict[
            int,
            tuple[weakref.ref[Message], tuple[int, int], list[int], tuple[DigestLine, ...]],
        ] = OrderedDict()

    def get(
        self, message: Message, cuts: tuple[int, int], widened: frozenset[int]
    ) -> tuple[DigestLine, ...] | None:
        """The lines kept for ``message`` with these cuts, if they hold for this tail
        (``widened``: the hashes of the strings it cuts longer)."""
        entry = self._entries.get(id(message))
        if entry is None or entry[0]() is not message or entry[1] != cuts:
            return None
        if widened and any(value in widened for value in entry[2]):
            return None
        return entry[3]

    def put(
        self,
        message: Message,
        cuts: tuple[int, int],
        long_hashes: list[int],
        lines: tuple[DigestLine, ...],
    ) -> None:
        """Keep ``lines`` for ``message``: they hold while no string whose hash is in
        ``long_hashes`` (its string arguments over the cut) is given a longer cut."""
        entries = self._entries
        entries[id(message)] = (weakref.ref(message), cuts, long_hashes, lines)
        if len(entries) > _LINES_KEPT:
            # One call that cannot see the dict change under it: a host may digest
            # from several threads (the public functions share this cache).
            entries.popitem(last=False)


_remembered = _RememberedLines()
_FINISHED: Final = (ToolStateCompleted, ToolStateError)


class _Lister:
    """The activity lines of one tail, message by message.

    What a line depends on beyond its own message (the results answering a call
    that did not finish, the longer cuts that keep different paths different) is
    worked out over the whole tail, so the lines of any message are the ones
    :func:`digest_lines` gives it; the digest formats only the messages whose
    lines it keeps.
    """

    def __init__(
        self,
        messages: Sequence[Message],
        text_chars: int,
        arg_chars: int,
        quoted: Collection[str] | None,
    ) -> None:
        self._messages = messages
        self._text_chars = text_chars
        self._arg_chars = arg_chars
        self._quoted = quoted
        self._results: dict[str, ToolResultPart] | None = None
        self._widths = _path_widths(messages, arg_chars)
        self._widened = frozenset(map(hash, self._widths))

    def _result(self, call_id: str) -> ToolResultPart | None:
        if self._results is None:
            self._results = _answered(self._messages)
        return self._results.get(call_id)

    def count_of(self, message: Message) -> int:
        """How many lines :meth:`lines_of` gives ``message`` (without formatting them)."""
        if self._quoted is not None and message.role == "user":
            return 0 if user_input_text(message) is None else 1
        if message.role != "assistant" or message.is_boundary:
            return 0
        count = 0
        for part in message.parts:
            if isinstance(part, TextPart):
                count += not (part.ignored or _blank(part.text))
            elif isinstance(part, SubtaskPart | ToolPart):
                count += 1
        return count

    def lines_of(self, message: Message) -> Sequence[DigestLine]:
        """The activity lines of ``message``, in part order."""
        quoted = self._quoted
        text_chars = self._text_chars
        if quoted is not None and message.role == "user":
            typed = user_input_text(message)
            return [] if typed is None else [_user_line(message.id, typed, quoted, text_chars)]
        if message.role != "assistant" or message.is_boundary:
            return []
        cuts = (text_chars, self._arg_chars)
        lines = _remembered.get(message, cuts, self._widened)
        if lines is None:
            formatted, long_hashes = self._format(message)
            lines = tuple(formatted)
            if long_hashes is not None:
                _remembered.put(message, cuts, long_hashes, lines)
        return lines

    def _format(self, message: Message) -> tuple[list[DigestLine], list[int] | None]:
        """The activity lines of an assistant message, and whether they can be kept.

        The second item lists the hashes of the string arguments longer than the cut
        (the lines hold while none has a longer cut), or is ``None`` when they depend on
        the rest of the tail (a call that did not finish, a long string cut longer).
        """
        text_chars = self._text_chars
        arg_chars = self._arg_chars
        widths = self._widths
        lines: list[DigestLine] = []
        long_hashes: list[int] | None = []
        for part in message.parts:
            if isinstance(part, TextPart):
                if part.ignored or _blank(part.text):
                    continue
                lines.append(DigestLine(f"assistant: {truncate(part.text, text_chars)}"))
            elif isinstance(part, SubtaskPart):
                label = part.command or part.agent
                lines.append(DigestLine(f"subtask: {truncate(label, text_chars)}"))
            elif isinstance(part, ToolPart):
                result = None
                state = part.state
                if not isinstance(state, _FINISHED):
                    result = self._result(part.call_id)
                    long_hashes = None  # a result later in the tail may answer it
                elif long_hashes is not None:
                    for value in state.input.values():
                        if isinstance(value, str) and len(value) > arg_chars:
                            if value in widths:
                                long_hashes = None  # cut longer for this tail
                                break
                            long_hashes.append(hash(value))
                lines.append(_tool_line(part, result, arg_chars, widths))
        return lines, long_hashes

    def newest(self, room: int) -> tuple[list[DigestLine], int]:
        """The newest ``room`` lines, oldest first, and how many lines there are in all."""
        messages = self._messages
        counts = [self.count_of(m) for m in messages]
        total = sum(counts)
        chunks: list[Sequence[DigestLine]] = []
        need = min(room, total)
        for index in range(len(messages) - 1, -1, -1):
            if need <= 0:
                break
            if counts[index]:
                lines = self.lines_of(messages[index])
                chunks.append(lines)
                need -= len(lines)
        kept = [line for chunk in reversed(chunks) for line in chunk]
        return kept[len(kept) - min(room, total) :], total


USER_QUOTED_WHERE: Final = "Recent user input"
"""Where the body quotes the user messages the activity list points at."""


def _user_line(message_id: str, text: str, quoted: Collection[str], text_chars: int) -> DigestLine:
    if message_id in quoted:
        return DigestLine(f"user message {message_id} (quoted under {USER_QUOTED_WHERE})")
    return DigestLine(f"user: {truncate(text, text_chars)}")


def omitted_note(count: int) -> str:
    """The line that stands for ``count`` older activity lines left out (wording ours)."""
    noun = "line" if count == 1 else "lines"
    return f"(… {count} earlier activity {noun} omitted)"


def build_tail_digest(
    messages: Sequence[Message],
    *,
    max_lines: int = DEFAULT_MAX_LINES,
    text_chars: int = DEFAULT_TEXT_CHARS,
    arg_chars: int = DEFAULT_ARG_CHARS,
    quoted: Collection[str] | None = None,
) -> TailDigest:
    """Render section 9, "# Recent activity", and report what it holds (SPEC R7.1, R7.2).

    The section is ``# Recent activity``, a blank line, then (only if a kept line
    is an interrupted tool call) :data:`INTERRUPTED_NOTE` and a blank line, then
    one ``- `` line per activity. With more than ``max_lines`` lines the newest are
    kept and the list starts with :func:`omitted_note`; the note counts towards
    ``max_lines``, so the list never has more than ``max_lines`` lines.

    Args:
        messages: The tail: messages after the watermark up to the insert moment.
        max_lines: Line limit of the list; 0 disables the section.
        text_chars: Cut length of assistant text.
        arg_chars: Cut length of each tool argument and error message.
        quoted: See :func:`digest_lines`.

    Returns:
        The digest; its ``text`` is ``""`` when nothing was listed.

    Raises:
        ValueError: ``max_lines`` is negative or a cut length is smaller than 1.
    """
    if max_lines < 0:
        raise ValueError(f"max_lines must not be negative, got {max_lines!r}")
    _check_cuts(text_chars, arg_chars)
    lister = _Lister(messages, text_chars, arg_chars, quoted)
    if max_lines == 0:
        return TailDigest(text="", lines=(), omitted=sum(map(lister.count_of, messages)))
    # One slot goes to the note when there are more lines than the limit, unless
    # the note would be the only line; only the lines kept are formatted.
    kept, total = lister.newest(max_lines)
    if not total:
        return TailDigest(text="", lines=(), omitted=0)
    omitted = 0
    if total > max_lines:
        room = max_lines - 1 if max_lines > 1 else max_lines
        kept = kept[len(kept) - room :]
        omitted = total - room
    out = [ACTIVITY_HEADING, ""]
    if any(line.interrupted for line in kept):
        out += [INTERRUPTED_NOTE, ""]
    if omitted and max_lines > 1:
        out.append(omitted_note(omitted))
    # One line each already; the section is not passed through neutralise_structure,
    # so an HTML heading in a message or an argument is defused here.
    out += [f"- {escape_html_headings(line.text)}" for line in kept]
    return TailDigest(text="\n".join(out), lines=tuple(kept), omitted=omitted)


def render_tail_digest(
    messages: Sequence[Message],
    *,
    max_lines: int = DEFAULT_MAX_LINES,
    text_chars: int = DEFAULT_TEXT_CHARS,
    arg_chars: int = DEFAULT_ARG_CHARS,
) -> str:
    """The "# Recent activity" section as text; ``""`` when there is no activity.

    See :func:`build_tail_digest`, which also reports what was rendered.
    """
    return build_tail_digest(
        messages, max_lines=max_lines, text_chars=text_chars, arg_chars=arg_chars
    ).text


def is_digested(message: Message, part: CheckpointPart) -> bool:
    """True when the boundary carrying ``part`` folded ``message`` into its digest (R7.3).

    A message is digested when it is not a user message, its id lies in
    ``(covered_up_to, digest_up_to]``, and (R7.3 amended, ours) the rebuild listed
    it: its :attr:`~mimo_ctx.messages.Message.insert_seq` is at most the part's
    ``digest_seq``. The id range alone is not what was listed: a message written
    after the rebuild read the tail, but made earlier (or on a worker whose clock
    lags), has an id inside the range, and hiding it would lose it (not sent, not
    in the digest, not in the checkpoint). A message or part without write-order
    numbers (not from a store, or from before this rule) falls back to the range.
    The open tool round the rebuild kept live (``kept_live``) is never digested.
    """
    digested = part.digest_up_to
    if not digested or message.role == "user":
        return False
    if not part.covered_up_to < message.id <= digested or message.id in part.kept_live:
        return False
    listed = part.digest_seq
    return listed is None or message.insert_seq is None or message.insert_seq <= listed


def collapse_checkpoint_tail(messages: list[Message]) -> list[Message]:
    """Drop the messages a rebuild digested from an outgoing request (SPEC R7.3).

    Finds the newest user message (last in list order) with a ``checkpoint`` part.
    Without one, or when its part has no ``digest_up_to``, ``messages`` itself is
    returned. Otherwise a message is dropped iff :func:`is_digested`: it is not a
    user message, its id is in ``(covered_up_to, digest_up_to]`` and the rebuild
    listed it (write order, R7.3 amended). The filter uses ids and write order, not
    list positions, because a message made in the same millisecond as the boundary
    can sort before it. User messages always stay (the last one carries the
    per-turn reminder).

    Refinement for provider-format data (ours): a kept ``role="tool"`` message
    whose results answer tool calls that this collapse removed would be an orphan
    result, which providers reject. Such results are dropped too (a message left
    with no parts is dropped; one with other parts is kept as a copy without
    them). This happens when a rebuild lands mid-loop: the calls were digested
    (as interrupted), their results arrived after the insert. It matches the
    original, where call and result share one part and leave together.

    Args:
        messages: The request's messages in order.

    Returns:
        ``messages`` itself when nothing is removed, else a new list. Input
        messages are never modified.
    """
    boundary = next(
        (m for m in reversed(messages) if m.role == "user" and m.checkpoint_part is not None),
        None,
    )
    part = boundary.checkpoint_part if boundary is not None else None
    if part is None or not part.digest_up_to:
        return messages
    live: list[Message] = []
    removed_calls: set[str] = set()
    for message in messages:
        if not is_digested(message, part):
            live.append(message)
        else:
            removed_calls.update(p.call_id for p in message.parts if isinstance(p, ToolPart))
    if not removed_calls:
        return messages if len(live) == len(messages) else live
    return _drop_orphan_results(live, removed_calls)


def _drop_orphan_results(messages: list[Message], removed_calls: set[str]) -> list[Message]:
    # Only called when some call was removed, so the result always differs
    # from the input list: at least the calling message is gone.
    out: list[Message] = []
    for message in messages:
        if message.role != "tool" or not any(
            isinstance(p, ToolResultPart) and p.call_id in removed_calls for p in message.parts
        ):
            out.append(message)
            continue
        parts = [
            p
            for p in message.parts
            if not (isinstance(p, ToolResultPart) and p.call_id in removed_calls)
        ]
        if parts:
            out.append(message.model_copy(update={"parts": parts}))
    return out
