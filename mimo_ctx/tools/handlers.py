"""Handlers of the agent-facing tools, bound to one session.

:class:`SessionTools` binds the four tool specs of
:mod:`mimo_ctx.tools.definitions` to a store, a memory layout and a session:
``history`` (the session's stored messages), ``memory`` (search through
:class:`~mimo_ctx.memory_index.MemoryIndex`, read confined to the memory
root), ``task`` and ``actor`` (the session's registries). Every pointer the
rebuild body and the per-turn reminder give the model leads here.

Errors. A handler never raises for a bad call: wrong arguments, an unknown id,
an id of another session, a path escaping the memory root, an unreadable file
or a store failure come back as a :class:`ToolResult` with ``is_error=True`` and
a text starting with ``Error:`` that says what was wrong and what to send
instead. :meth:`SessionTools.call` returns that text, so a host can hand it to
the model as the tool result as it is; hosts whose protocol has an error flag
(Anthropic's ``is_error``) use :meth:`SessionTools.invoke`. Only bugs (an
exception that is not a :class:`~mimo_ctx.errors.MimoCtxError`, ``OSError`` or
bad argument) propagate.

Session isolation (SPEC R5.4). Every lookup is keyed by the bound session: a
message, task or actor of another session reads exactly like one that does not
exist, so the tools do not even reveal that it exists elsewhere.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.to_thread
from anyio.abc import AsyncResource

from mimo_ctx._util import ago, now_ms, one_line
from mimo_ctx.errors import MimoCtxError, PathEscapeError
from mimo_ctx.memory import is_hard_link
from mimo_ctx.memory_index import MemoryIndex
from mimo_ctx.messages import (
    Message,
)
from mimo_ctx.session import ACTIVE_ACTOR_STATUSES, Actor, Task, task_order_key
from mimo_ctx.store.base import Store
from mimo_ctx.tools._message_text import (
    content_of,
    iso_time,
    message_body,
    message_header,
    page,
    snippet,
)
from mimo_ctx.tools.definitions import (
    ACTOR_TOOL,
    ALL_TOOL_SPECS,
    HISTORY_TOOL,
    MEMORY_TOOL,
    TASK_TOOL,
    ArgumentError,
    ToolDefinition,
    ToolResult,
    ToolSpec,
    check_arguments,
)

if TYPE_CHECKING:
    from mimo_ctx.memory import MemoryLayout

__all__ = ["DEFAULT_MAX_MESSAGE_CHARS", "DEFAULT_NEIGHBOUR_CHARS", "SessionTools"]

DEFAULT_MAX_MESSAGE_CHARS: Final = 50_000
"""``history around/get`` return at most this many characters of the asked-for
message per call; a longer one is paged with ``offset``."""

DEFAULT_NEIGHBOUR_CHARS: Final = 4_000
"""``history around`` shows at most this many characters of each neighbour."""

_MEMORY_SEARCH_MAX: Final = 50
_READ_DEFAULT_LINES: Final = 200
_READ_MAX_LINE_CHARS: Final = 2_000
_ROOT_DIRS: Final = frozenset({"sessions", "projects", "global"})


class _Refused(MimoCtxError):
    """A call the handler refuses; its message is the text shown to the model."""


def _task_line(task: Task, depth: int) -> str:
    summary = one_line(task.summary) or "(no summary)"
    return f"{'  ' * depth}- {task.id} {task.status} — {summary}"


def _depth(task: Task, by_id: Mapping[str, Task]) -> int:
    depth = 0
    seen = {task.id}
    parent = task.parent_id
    while parent is not None and parent in by_id and parent not in seen:
        seen.add(parent)
        depth += 1
        parent = by_id[parent].parent_id
    return depth


def _inside(real: str, directory: str) -> bool:
    return real == directory or real.startswith(directory.rstrip(os.sep) + os.sep)


def _read_lines(real: str, offset: int, limit: int) -> tuple[list[str], int] | None:
    """Lines ``offset .. offset+limit-1`` (1-based) and the total count; None if binary."""
    with open(real, "rb") as handle:
        if b"\x00" in handle.read(8192):
            return None
        handle.seek(0)
        out: list[str] = []
        total = 0
        for raw in handle:
            total += 1
            if offset <= total < offset + limit:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if len(line) > _READ_MAX_LINE_CHARS:
                    line = line[:_READ_MAX_LINE_CHARS] + f"… ({len(line)} characters)"
                out.append(line)
        return out, total


# -- the bound tools -------------------------------------------------------------------------


class SessionTools(AsyncResource):
    """The ``history``, ``memory``, ``task`` and ``actor`` tools bound to one session.

    Example:
        >>> tools = SessionTools(store, layout, "ses_1", "proj")  # doctest: +SKIP
        >>> text = await tools.call("history", {"operation": "around",  # doctest: +SKIP
        ...                                     "message_id": "msg_…"})
        >>> openai_tools = tools.to_openai_tools()  # doctest: +SKIP
    """

    def __init__(
        self,
        store: Store,
        layout: MemoryLayout,
        session_id: str,
        project_id: str | None = None,
        *,
        index: MemoryIndex | None = None,
        clock: Callable[[], int] | None = None,
        max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
        neighbour_chars: int = DEFAULT_NEIGHBOUR_CHARS,
    ) -> None:
        """Bind the tools to a session.

        Args:
            store: The store holding the session's messages, tasks and actors.
            layout: The memory layout (SPEC A13).
            session_id: The session every call is confined to.
            project_id: The session's project; ``None`` reads it from the stored
                session at the first call that needs it.
            index: The memory index to search. ``None`` creates a private
                in-memory index (built at the first search, closed by
                :meth:`aclose`); pass a file-backed one shared by the host for
                large memory roots, so a restart only re-reads changed files.
            clock: Current time in epoch ms (task updates, "ago" figures);
                defaults to the wall clock.
            max_message_chars: Page size of ``history around/get`` for the asked-for
                message.
            neighbour_chars: ``history around`` shows at most this much of each
                neighbour.

        Raises:
            ValueError: A size limit is below 1.
            InvalidIdError: ``session_id`` or ``project_id`` cannot name a memory
                directory.
        """
        if max_message_chars < 1 or neighbour_chars < 1:
            raise ValueError("max_message_chars and neighbour_chars must be at least 1")
        # Ids are checked here, where they enter, not at the first call that needs a path.
        layout.session_dir(session_id)
        if project_id is not None:
            layout.project_dir(project_id)
        self._store = store
        self._layout = layout
        self._session_id = session_id
        self._project_id = project_id
        self._owns_index = index is None
        self._index = index if index is not None else MemoryIndex(":memory:")
        self._clock = clock or now_ms
        self._max_message_chars = max_message_chars
        self._neighbour_chars = neighbour_chars
        handlers: dict[str, Callable[[str, dict[str, Any]], Awaitable[str]]] = {
            HISTORY_TOOL.name: self._history,
            MEMORY_TOOL.name: self._memory,
            TASK_TOOL.name: self._task,
            ACTOR_TOOL.name: self._actor,
        }
        self._definitions = tuple(
            ToolDefinition(spec, self._bind(spec, handlers[spec.name])) for spec in ALL_TOOL_SPECS
        )

    @property
    def session_id(self) -> str:
        """The session the tools are bound to."""
        return self._session_id

    @property
    def index(self) -> MemoryIndex:
        """The memory index the ``memory`` tool searches."""
        return self._index

    @property
    def definitions(self) -> tuple[ToolDefinition, ...]:
        """The four bound tools: history, memory, task, actor."""
        return self._definitions

    def definition(self, name: str) -> ToolDefinition:
        """The bound tool called ``name``.

        Raises:
            KeyError: No such tool.
        """
        for definition in self._definitions:
            if definition.name == name:
                return definition
        raise KeyError(f"no tool named {name!r}; tools: history, memory, task, actor")

    async def aclose(self) -> None:
        """Close the memory index if these tools created it. Idempotent."""
        if self._owns_index:
            await self._index.aclose()

    async def invoke(
        self, name: str, arguments: Mapping[str, Any] | str | None = None
    ) -> ToolResult:
        """Run a tool call and return its result with an error flag.

        Args:
            name: The tool name the model called.
            arguments: The arguments: a mapping, a JSON object string (as OpenAI
                sends them) or ``None``.

        Returns:
            The result; for a bad call ``is_error`` is set and the text says why.
        """
        for definition in self._definitions:
            if definition.name == name:
                try:
                    parsed = _parse_arguments(arguments)
                except ArgumentError as exc:
                    return ToolResult(f"Error: {name}: {exc}", is_error=True)
                return await definition.run(parsed)
        return ToolResult(
            f"Error: there is no tool named {name!r}; the tools are history, memory, task, actor.",
            is_error=True,
        )

    async def call(self, name: str, arguments: Mapping[str, Any] | str | None = None) -> str:
        """Run a tool call and return the text for the model (errors start with ``Error:``)."""
        return (await self.invoke(name, arguments)).text

    # -- export shapes -------------------------------------------------------------------------
    def to_openai_tools(self, *, api: str = "chat") -> list[dict[str, Any]]:
        """OpenAI function tools; see :func:`mimo_ctx.tools.formats.to_openai_tools`."""
        from mimo_ctx.tools.formats import to_openai_tools

        return to_openai_tools(self._definitions, api=api)

    def to_anthropic_tools(self) -> list[dict[str, Any]]:
        """Anthropic tools; see :func:`mimo_ctx.tools.formats.to_anthropic_tools`."""
        from mimo_ctx.tools.formats import to_anthropic_tools

        return to_anthropic_tools(self._definitions)

    def to_pydantic_ai_tools(self) -> list[Any]:
        """pydantic-ai tools; see :func:`mimo_ctx.integrations.tools.to_pydantic_ai_tools`."""
        from mimo_ctx.integrations.tools import to_pydantic_ai_tools

        return to_pydantic_ai_tools(self._definitions)

    def to_langchain_tools(self) -> list[Any]:
        """LangChain tools; see :func:`mimo_ctx.integrations.tools.to_langchain_tools`."""
        from mimo_ctx.integrations.tools import to_langchain_tools

        return to_langchain_tools(self._definitions)

    # -- dispatch ----------------------------------------------------------------------------------
    def _bind(
        self, spec: ToolSpec, handler: Callable[[str, dict[str, Any]], Awaitable[str]]
    ) -> Callable[[Mapping[str, Any]], Awaitable[ToolResult]]:
        async def run(arguments: Mapping[str, Any]) -> ToolResult:
            try:
                operation, values = check_arguments(spec, arguments)
                return ToolResult(await handler(operation, values))
            except (ArgumentError, MimoCtxError) as exc:
                return ToolResult(f"Error: {exc}", is_error=True)
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__
                return ToolResult(f"Error: {spec.name}: {reason}", is_error=True)

        return run

    async def _project(self) -> str:
        if self._project_id is None:
            session = await self._store.get_session(self._session_id)
            if session is None:
                raise _Refused(f"session {self._session_id} is not in the store")
            self._project_id = session.project_id
        return self._project_id

    # -- history -----------------------------------------------------------------------------------
    async def _history(self, operation: str, args: dict[str, Any]) -> str:
        if operation == "search":
            return await self._history_search(str(args["query"]), int(args.get("limit", 10)))
        message = await self._own_message(str(args["message_id"]))
        if operation == "get":
            offset = int(args.get("offset", 0))
            body = message_body(message)
            if offset >= len(body) and offset > 0:
                raise _Refused(
                    f"offset {offset} is past the end of message {message.id} "
                    f"({len(body)} characters)"
                )
            return f"{message_header(message)}\n" + page(
                body, offset, self._max_message_chars, message.id
            )
        return await self._history_around(
            message, int(args.get("before", 2)), int(args.get("after", 2))
        )

    async def _own_message(self, message_id: str) -> Message:
        message_id = message_id.strip()
        message = await self._store.get_message(message_id)
        # Another session's message reads exactly like a missing one (R5.4).
        if message is None or message.session_id != self._session_id:
            raise _Refused(
                f"there is no message {message_id!r} in this session; use an id shown in "
                "this conversation (e.g. the messageID of an elision line) or find one "
                "with operation=search"
            )
        return message

    async def _history_around(self, message: Message, before: int, after: int) -> str:
        # Neighbours on the message's own line (main agent or the sub-agent), in
        # the store's listing order (time_created, id), SPEC A1.
        line = await self._store.list_messages(self._session_id, agent=message.agent)
        position = next((i for i, m in enumerate(line) if m.id == message.id), None)
        if position is None:  # pragma: no cover - the store listed its own message
            raise _Refused(f"message {message.id} is not listed in this session")
        start, end = max(0, position - before), min(len(line), position + after + 1)
        blocks = [
            f"Messages {start + 1}-{end} of {len(line)} on agent {message.agent}'s line; "
            f"the requested message is marked >>> and shown in full."
        ]
        for i in range(start, end):
            item = line[i]
            body = message_body(item)
            if i == position:
                text = page(body, 0, self._max_message_chars, item.id)
                blocks.append(f"{message_header(item, mark='>>> ')}\n{text}")
                continue
            if len(body) > self._neighbour_chars:
                body = (
                    body[: self._neighbour_chars]
                    + f"\n[… {len(body) - self._neighbour_chars} more characters; call history "
                    f"with operation=get, message_id={item.id}]"
                )
            blocks.append(f"{message_header(item)}\n{body}")
        return "\n\n".join(blocks)

    async def _history_search(self, query: str, limit: int) -> str:
        terms = [t.casefold() for t in query.split()]
        if not terms:
            raise _Refused("the query is empty; give one or more words to look for")
        messages = await self._store.list_messages(self._session_id, agent=None)
        full: list[tuple[Message, str, str]] = []
        partial: list[tuple[Message, str, str]] = []
        for message in sorted(messages, key=lambda m: m.id, reverse=True):
            body = "\n".join(c for c in (content_of(p) for p in message.parts) if c)
            folded = body.casefold()
            found = [t for t in terms if t in folded]
            if not found:
                continue
            bucket = full if len(found) == len(terms) else partial
            bucket.append((message, body, found[0]))
            if len(full) >= limit:
                break
        hits = (full + partial)[:limit]
        if not hits:
            return f"No message of this session contains {query!r}."
        lines = [
            f"{len(hits)} message(s) matching {query!r}, newest first "
            "(messages with every word first):"
        ]
        lines.extend(
            f"- {m.id} ({m.role}, agent={m.agent}, {iso_time(m.time_created)}): "
            f"{snippet(body, needle)}"
            for m, body, needle in hits
        )
        lines.append("Use operation=around with a message_id to read a message in full.")
        return "\n".join(lines)

    # -- memory ------------------------------------------------------------------------------------
    async def _memory(self, operation: str, args: dict[str, Any]) -> str:
        project_id = await self._project()
        if operation == "search":
            limit = int(args.get("limit", 10))
            if limit > _MEMORY_SEARCH_MAX:
                raise _Refused(f"limit for search is at most {_MEMORY_SEARCH_MAX}, got {limit}")
            query = str(args["query"])
            await self._index.reconcile(
                self._layout, session_id=self._session_id, project_id=project_id
            )
            hits = await self._index.search(
                query, session_id=self._session_id, project_id=project_id, limit=limit
            )
            if not hits:
                return (
                    f"No memory file matches {query!r} (searched this session's, the "
                    "project's and global memory)."
                )
            lines = [f"{len(hits)} hit(s) for {query!r}, best first (path:line: text):"]
            lines.extend(f"{h.path}:{h.line}: {h.snippet}" for h in hits)
            lines.append('Read more with memory(operation="read", path=<path>, offset=<line>).')
            return "\n".join(lines)
        offset = int(args.get("offset", 1))
        limit = int(args.get("limit", _READ_DEFAULT_LINES))
        return await self._memory_read(str(args["path"]), offset, limit, project_id)

    def _resolve_memory_path(self, raw: str, project_id: str) -> tuple[str, str]:
        """Resolve a ``memory read`` path to ``(relative path, real path)``.

        Accepted: a path relative to the memory root (it starts with
        ``sessions/``, ``projects/`` or ``global/``); any other relative path is
        taken as relative to the session memory directory; an absolute path
        inside the memory root (the rebuild body and the reminder print
        absolute paths). Refused: ``..`` components, absolute paths outside
        the root, symlinks resolving outside it, and files outside this
        session's, its project's and the global directory.
        """
        text = raw.strip()
        if not text or "\x00" in text:
            raise _Refused("path is empty; give a path returned by memory search")
        components = text.replace("\\", "/").split("/")
        if ".." in components:
            raise PathEscapeError(
                f"path {raw!r} is refused: '..' is not allowed; give a path inside the memory root"
            )
        root = Path(self._layout.root)
        root_real = os.path.realpath(root)
        candidate = Path(text)
        if candidate.is_absolute() or text.startswith(("/", "\\")) or text[1:2] == ":":
            rel = None
            for base in (str(root), root_real):
                if _inside(os.path.normpath(text), os.path.normpath(base)):
                    rel = os.path.relpath(os.path.normpath(text), base)
                    break
            if rel is None:
                raise PathEscapeError(
                    f"path {raw!r} is refused: absolute paths outside the memory root are not "
                    "allowed; give a path relative to the memory root"
                )
            chosen = root / rel
        elif next((c for c in components if c not in ("", ".")), "") in _ROOT_DIRS:
            chosen = root / text
        else:
            # Every memory file lives under sessions/, projects/ or global/, so any
            # other relative path can only mean "in the session memory directory".
            # Decided by the spelling, never by what exists: whether a path into
            # another session exists must not show in the answer.
            chosen = Path(self._layout.session_dir(self._session_id)) / text
        allowed = [
            os.path.realpath(self._layout.session_dir(self._session_id)),
            os.path.realpath(self._layout.project_dir(project_id)),
            os.path.realpath(self._layout.global_dir()),
        ]
        real = os.path.realpath(chosen)
        if not _inside(real, root_real):
            raise PathEscapeError(
                f"path {raw!r} is refused: it resolves outside the memory root (symlink out)"
            )
        if not any(_inside(real, d) for d in allowed):
            raise PathEscapeError(
                f"path {raw!r} is refused: only this session's memory, the project's memory "
                "and global memory can be read"
            )
        return Path(os.path.relpath(chosen, root)).as_posix(), real

    async def _memory_read(self, raw: str, offset: int, limit: int, project_id: str) -> str:
        rel, real = self._resolve_memory_path(raw, project_id)

        def read() -> str:
            try:
                st = os.stat(real)
            except FileNotFoundError:
                raise _Refused(
                    f"no memory file {raw!r}; paths are relative to the memory root, as "
                    "memory search returns them"
                ) from None
            if stat.S_ISDIR(st.st_mode):
                names = sorted(
                    entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")
                    for entry in os.scandir(real)
                )
                listing = "\n".join(f"- {rel.rstrip('/')}/{n}" for n in names) or "(empty)"
                return f"Directory {rel}:\n{listing}"
            if not stat.S_ISREG(st.st_mode):
                raise _Refused(f"{rel} is not a regular file")
            if is_hard_link(st):
                raise PathEscapeError(
                    f"path {raw!r} is refused: it is a hard link, whose other name may be "
                    "outside this session's memory"
                )
            result = _read_lines(real, offset, limit)
            if result is None:
                raise _Refused(f"{rel} is a binary file; only text files can be read")
            lines, total = result
            if not lines:
                if total == 0:
                    return f"File: {rel} (empty)"
                raise _Refused(f"offset {offset} is past the end of {rel} ({total} lines)")
            last = offset + len(lines) - 1
            width = len(str(last))
            body = "\n".join(f"{n:>{width}}\t{text}" for n, text in enumerate(lines, offset))
            out = f"File: {rel} (lines {offset}-{last} of {total})\n{body}"
            if last < total:
                out += f"\n[… {total - last} more lines; continue with offset={last + 1}]"
            return out

        return await anyio.to_thread.run_sync(read)

    # -- tasks -------------------------------------------------------------------------------------
    async def _task(self, operation: str, args: dict[str, Any]) -> str:
        if operation == "list":
            tasks = sorted(
                await self._store.list_tasks(self._session_id),
                key=lambda t: (task_order_key(t.id), t.id),
            )
            if not tasks:
                return "This session has no tasks."
            by_id = {t.id: t for t in tasks}
            lines = [f"Tasks of this session ({len(tasks)}):"]
            lines.extend(_task_line(t, _depth(t, by_id)) for t in tasks)
            return "\n".join(lines)
        task = await self._own_task(str(args["task_id"]))
        if operation == "get":
            return await self._task_details(task)
        status = args.get("status")
        summary = args.get("summary")
        if status is None and summary is None:
            raise _Refused("operation 'update' of the task tool needs status, summary or both")
        update: dict[str, Any] = {"time_updated": max(self._clock(), task.time_updated)}
        changes: list[str] = []
        if status is not None and status != task.status:
            update["status"] = status
            changes.append(f"status {task.status} → {status}")
        if summary is not None:
            new_summary = one_line(str(summary))
            if new_summary != task.summary:
                update["summary"] = new_summary
                changes.append(f"summary → {new_summary!r}")
        if not changes:
            return f"Task {task.id} unchanged (it already has that status and summary)."
        await self._store.upsert_task(task.model_copy(update=update))
        return f"Task {task.id} updated: {'; '.join(changes)}."

    async def _own_task(self, task_id: str) -> Task:
        task_id = task_id.strip()
        task = await self._store.get_task(self._session_id, task_id)
        if task is None or task.session_id != self._session_id:
            raise _Refused(
                f"there is no task {task_id!r} in this session; "
                'list them with task(operation="list")'
            )
        return task

    async def _task_details(self, task: Task) -> str:
        tasks = await self._store.list_tasks(self._session_id)
        children = sorted(
            (t for t in tasks if t.parent_id == task.id), key=lambda t: task_order_key(t.id)
        )
        lines = [
            f"Task {task.id}",
            f"status: {task.status}",
            f"summary: {one_line(task.summary) or '(none)'}",
        ]
        if task.parent_id:
            lines.append(f"parent: {task.parent_id}")
        if children:
            lines.append("subtasks: " + ", ".join(f"{c.id} ({c.status})" for c in children))
        progress = task.progress_file or self._progress_path(task.id)
        if progress:
            lines.append(f"progress file: {progress}")
        lines.append(
            f"created: {iso_time(task.time_created)}; updated: {iso_time(task.time_updated)}"
        )
        return "\n".join(lines)

    def _progress_path(self, task_id: str) -> str | None:
        try:
            path = self._layout.task_progress_path(self._session_id, task_id)
            return self._layout.relative(path)
        except MimoCtxError:
            return None

    # -- actors ------------------------------------------------------------------------------------
    async def _actor(self, operation: str, args: dict[str, Any]) -> str:
        now = self._clock()
        if operation == "list":
            actors = [
                a
                for a in await self._store.list_actors(self._session_id)
                if a.session_id == self._session_id
            ]
            if not actors:
                return "This session has no actors."
            actors.sort(key=lambda a: (a.status not in ACTIVE_ACTOR_STATUSES, a.time_created, a.id))
            active = sum(a.status in ACTIVE_ACTOR_STATUSES for a in actors)
            lines = [f"Actors of this session ({len(actors)}, {active} active):"]
            lines.extend(_actor_line(a, now) for a in actors)
            return "\n".join(lines)
        actor_id = str(args["actor_id"]).strip()
        actor = await self._store.get_actor(self._session_id, actor_id)
        if actor is None or actor.session_id != self._session_id:
            raise _Refused(
                f"there is no actor {actor_id!r} in this session; "
                'list them with actor(operation="list")'
            )
        return "\n".join(
            [
                f"Actor {actor.id}: {actor.status}",
                f"agent: {actor.agent}",
                f'description: "{one_line(actor.description)}"',
                f"background: {'yes' if actor.background else 'no'}",
                f"created: {iso_time(actor.time_created)} ({ago(now - actor.time_created)})",
                f"last activity: {iso_time(actor.time_last_activity)} "
                f"({ago(now - actor.time_last_activity)})",
            ]
        )


def _actor_line(actor: Actor, now: int) -> str:
    return (
        f'- {actor.id} — {actor.status}, "{one_line(actor.description)}" '
        f"(agent={actor.agent}), last activity {ago(now - actor.time_last_activity)}"
    )


def _parse_arguments(arguments: Mapping[str, Any] | str | None) -> Mapping[str, Any]:
    """The call's arguments as a mapping; a JSON string (OpenAI's form) is parsed."""
    if arguments is None:
        return {}
    if not isinstance(arguments, str):
        return arguments
    if not arguments.strip():
        return {}
    try:
        parsed: Any = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ArgumentError(
            f"the arguments are not valid JSON ({exc.msg} at character {exc.pos})"
        ) from exc
    if not isinstance(parsed, dict):
        raise ArgumentError("the arguments must be a JSON object")
    items: dict[Any, Any] = parsed  # pyright: ignore[reportUnknownVariableType]
    return {str(k): v for k, v in items.items()}
