"""What the managed resources of the client wrappers share around one call.

A managed call of :mod:`mimo_ctx.providers.openai_client` or
:mod:`mimo_ctx.providers.anthropic_client` runs the same steps with the
provider's formats plugged in: the host's list is synced
(:meth:`~mimo_ctx.providers._sync.SessionBinding.sync`), each request is built
from the view and sent with one overflow retry (:func:`recovering_call`), and the
answer is recorded, at once or when its stream ends (:func:`managed_call`). The
pieces of an answer (:func:`finish_of`, :func:`assistant_answer`) and of a
stream (:class:`Accumulator`) are shared too; what differs from call to call is
declared in a :class:`ManagedApi`. No SDK is imported here.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

from mimo_ctx._util import now_ms
from mimo_ctx.errors import ConfigError, ProviderReportedOverflow
from mimo_ctx.messages import Message, TokenUsage
from mimo_ctx.middleware import ContextMiddleware, RequestView
from mimo_ctx.providers._payload import Convert, SentList
from mimo_ctx.providers._sync import (
    Conversations,
    RecordingStream,
    RecoveringCall,
    SessionBinding,
    StreamAdapter,
    Turn,
    client_origin,
    plain,
)
from mimo_ctx.providers.validate import RequestFormat

__all__ = [
    "Accumulator",
    "Answer",
    "ManagedApi",
    "Resource",
    "as_dict",
    "assistant_answer",
    "bind",
    "dicts",
    "finish_of",
    "managed_call",
    "positive_int",
    "recovering_call",
    "require_sdk",
]

Answer = tuple[Message | None, tuple[str, ...]]
"""A recorded answer (None: nothing to record) and the fingerprints the host sends back for it."""


def require_sdk(module: str, who: str, extra: str) -> Any:
    """The provider SDK ``module``, imported when it is first needed (an optional extra).

    Raises:
        ImportError: It is not installed: ``<who> needs the <module> SDK: <extra>``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{who} needs the {module} SDK: {extra}") from exc


def as_dict(value: object) -> dict[str, Any]:
    """``value`` as plain JSON data when it is a mapping (an SDK object dumped), else ``{}``."""
    data = plain(value)
    return cast(dict[str, Any], data) if isinstance(data, dict) else {}


def dicts(value: object) -> list[dict[str, Any]]:
    """The mappings of a list as plain JSON data (other entries skipped; not a list: none)."""
    data = plain(value)
    if not isinstance(data, list):
        return []
    return [cast(dict[str, Any], v) for v in cast(list[Any], data) if isinstance(v, dict)]


def positive_int(value: object) -> int:
    """A token count of a usage report: a positive ``int``, anything else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def finish_of(reason: object, names: Mapping[str, str], *, calls: bool) -> str:
    """Our finish for a provider's stop reason: ``names`` maps the known ones, another
    is kept with ``-`` for ``_``; without one, ``tool-calls`` when the answer calls
    tools, else ``stop``."""
    if isinstance(reason, str):
        return names.get(reason, reason.replace("_", "-"))
    return "tool-calls" if calls else "stop"


def assistant_answer(
    converted: Sequence[Message],
    *,
    turn: Turn,
    finish: str,
    usage: TokenUsage | None,
    model: object,
    response_id: object,
) -> Message:
    """The finished assistant message of a converted answer (an empty one when it has none).

    Args:
        converted: The answer's messages, as the provider's converter made them.
        turn: The call it answers.
        finish: How it ended (:func:`finish_of`).
        usage: The usage the provider reported (None: the middleware estimates it).
        model: The ``model`` of the response (kept when it is a string).
        response_id: The ``id`` of the response (kept when it is a string).
    """
    now = now_ms()
    parts = [p for m in converted if m.role == "assistant" for p in m.parts]
    base = next((m for m in converted if m.role == "assistant"), None)
    if base is None:
        base = Message(
            session_id=turn.session_id, role="assistant", agent=turn.agent, time_created=now
        )
    return base.model_copy(
        update={
            "parts": parts,
            "finish": finish,
            "time_completed": now,
            "usage": usage,
            "model": model if isinstance(model, str) else None,
            "provider_message_id": response_id if isinstance(response_id, str) else None,
        }
    )


class Resource:
    """An SDK resource with managed calls; every other attribute is the SDK's own."""

    def __init__(self, inner: Any, binding: SessionBinding) -> None:
        self._inner = inner
        self._binding = binding

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _managed_create(
        self,
        kwargs: Mapping[str, Any],
        api: ManagedApi,
        sync: Callable[[], Awaitable[Turn]],
        *,
        finish: Callable[[list[Any]], list[Any]] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """The coroutine of a managed call of the SDK's own ``create`` (:func:`managed_call`)."""
        send = self._inner.create
        return managed_call(self._binding, kwargs, api, sync, lambda p: send(**p), finish=finish)


class Accumulator(ABC):
    """The base of the wrappers' stream adapters (:class:`~mimo_ctx.providers._sync.StreamAdapter`):
    the turn whose answer they accumulate; a subclass's :meth:`reset` sets its state."""

    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        self.reset()

    @abstractmethod
    def reset(self) -> None:
        """Forget what was accumulated (a retried stream starts over)."""


@dataclass(frozen=True, slots=True)
class ManagedApi:
    """How the managed call of one SDK method reads and writes its provider's format.

    Attributes:
        key: The keyword argument the history goes in (``messages``, ``input``).
        format: The payload format (the session's builder, the forked writer's API).
        convert: Converts a run of view messages (see
            :class:`~mimo_ctx.providers._payload.PayloadBuilder`).
        adapter: The stream adapter of a turn (``stream=True``).
        answer: A response (as JSON) -> the message to record and its fingerprints.
        overflow: What a response (not a stream) reports as a context overflow, or
            None; such a response is retried like an overflow error.
        merges: Whether two payload entries merge (see the builder).
    """

    key: str
    format: RequestFormat
    convert: Convert
    adapter: Callable[[Turn], StreamAdapter[Any]]
    answer: Callable[[Mapping[str, Any], Turn], Answer]
    overflow: Callable[[Any], str | None]
    merges: Callable[[Any, Any], bool] | None = None


def recovering_call(
    binding: SessionBinding,
    turn: Turn,
    kwargs: Mapping[str, Any],
    api: ManagedApi,
    *,
    send: Callable[[dict[str, Any]], Awaitable[Any]],
    streaming: bool,
    finish: Callable[[list[Any]], list[Any]] | None = None,
) -> RecoveringCall[dict[str, Any], Any]:
    """The turn's call: the host's keyword arguments with ``api.key`` replaced by the view.

    Args:
        binding: The wrapper's session binding.
        turn: The synced call.
        kwargs: The host's keyword arguments.
        api: The format of the call.
        send: Sends a payload.
        streaming: The answer is a stream (its overflow is the stream's to report).
        finish: A last change to the sent list (the Anthropic cache breakpoint): it
            may replace the list's last entry in place (see
            :class:`~mimo_ctx.providers._payload.SentList`).
    """
    builder = turn.builder(api.format, api.convert, merges=api.merges)
    sent_list = turn.history.cached(f"sent:{api.format}", SentList, SentList)
    overflow = None if streaming else api.overflow

    def build(view: RequestView) -> dict[str, Any]:
        entries = builder.build(view.messages, view.boundary_id, reuse=turn.host_item)
        # The session's one list, brought up to date in O(new) (no copy per call).
        sent = sent_list.update(turn.head, entries, builder)
        if finish is not None:
            sent_list.last_replaced()
            sent = finish(sent)
        payload = {**kwargs, api.key: sent}
        binding.sent(view, api.format, payload)
        return payload

    def check(result: Any) -> None:
        reported = None if overflow is None else overflow(result)
        if reported is not None:
            raise ProviderReportedOverflow(reported, result)

    return binding.call(turn, build, send, check)


def managed_call(
    binding: SessionBinding,
    kwargs: Mapping[str, Any],
    api: ManagedApi,
    sync: Callable[[], Awaitable[Turn]],
    send: Callable[[dict[str, Any]], Coroutine[Any, Any, Any]],
    *,
    finish: Callable[[list[Any]], list[Any]] | None = None,
) -> Coroutine[Any, Any, Any]:
    """The coroutine of one managed call: sync the host's list (``sync()``), send the
    turn's call (one overflow retry), give the host its answer.

    A stream (``stream=True``) is returned as a recording stream; any other answer
    is recorded, then returned as the SDK gave it. The other arguments are those of
    :func:`recovering_call`. See :class:`_ManagedCall` for how it runs.
    """
    return _ManagedCall(binding, kwargs, api, sync, send, finish=finish)


_BEFORE, _SDK, _AFTER, _DONE = range(4)
"""The steps of a :class:`_ManagedCall`."""


class _ManagedCall(Coroutine[Any, Any, Any]):
    """A managed call as a coroutine object written by hand (``send``, ``throw``,
    ``close``), so that the SDK's coroutine runs with no coroutine of ours around it.

    CPython walks the chain of running coroutines (their exception states) for every
    exception raised, and the OpenAI SDK raises and catches tens per message while it
    builds a request: each coroutine between the host's await and the SDK's makes
    the SDK's own work slower in proportion to the history (callgrind: about 3
    million instructions per coroutine at 5,000 messages, ``benchmarks/_instructions.py``).
    A plain method's frame is not in that chain, so this object drives the call's
    three steps from its methods, one coroutine at a time: our :meth:`_before`
    (sync, prepare, build the payload), then the SDK's own coroutine, then our
    :meth:`_after` (overflow check or recovery, record, release the turn). What a
    step yields goes to the host's await as it is, and what the host's await sends
    or throws in goes to the step that is running.
    """

    __slots__ = ("_api", "_binding", "_call", "_kwargs", "_stage", "_step", "_turn")

    def __init__(
        self,
        binding: SessionBinding,
        kwargs: Mapping[str, Any],
        api: ManagedApi,
        sync: Callable[[], Awaitable[Turn]],
        send: Callable[[dict[str, Any]], Coroutine[Any, Any, Any]],
        *,
        finish: Callable[[list[Any]], list[Any]] | None,
    ) -> None:
        self._binding = binding
        self._kwargs = kwargs
        self._api = api
        self._turn: Turn | None = None
        self._call: RecoveringCall[dict[str, Any], Any] | None = None
        self._stage = _BEFORE
        self._step: Coroutine[Any, Any, Any] = self._before(sync, send, finish)

    async def _before(
        self,
        sync: Callable[[], Awaitable[Turn]],
        send: Callable[[dict[str, Any]], Coroutine[Any, Any, Any]],
        finish: Callable[[list[Any]], list[Any]] | None,
    ) -> Coroutine[Any, Any, Any]:
        """Sync and build the request; the SDK's coroutine that sends it."""
        turn = self._turn = await sync()
        streaming = self._kwargs.get("stream") is True
        try:
            call = self._call = recovering_call(
                self._binding,
                turn,
                self._kwargs,
                self._api,
                send=send,
                streaming=streaming,
                finish=finish,
            )
            return send(await call.payload())
        except BaseException:
            turn.release()
            raise

    async def _after(self, result: Any, error: Exception | None) -> Any:
        """Check or recover the SDK's answer, record it, release the turn."""
        turn, call = self._turn, self._call
        assert turn is not None
        assert call is not None
        try:
            if error is None:
                try:
                    result = call.checked(result)
                except ProviderReportedOverflow as reported:  # recovered like an error
                    error = reported
            if error is not None:
                result = await call.recover(error)
            if self._kwargs.get("stream") is True:
                # The stream releases the turn's checkpoint hold when it ends.
                return RecordingStream(self._binding, turn, call, result, self._api.adapter(turn))
            message, fps = self._api.answer(as_dict(result), turn)
            await self._binding.record(turn, message, fingerprints=fps)
        except BaseException:
            turn.release()
            raise
        turn.release()
        return result

    def _drive(self, sending: bool, value: Any) -> Any:
        """Send ``value`` into (or throw it into) the running step, and on to the next
        step when one returns; what a step yields goes to the host's await."""
        outcome: Any
        error: Exception | None
        while True:
            try:
                return self._step.send(value) if sending else self._step.throw(value)
            except StopIteration as done:
                outcome, error = done.value, None
            except Exception as exc:
                if self._stage != _SDK:
                    raise  # ours, before the request or after the answer: as it is
                outcome, error = None, exc
            except BaseException:
                if self._stage == _SDK:
                    self._release()  # cancelled (or closed) in the SDK's call
                raise
            if self._stage == _AFTER:
                self._stage = _DONE
                raise StopIteration(outcome)
            if self._stage == _BEFORE:
                self._step, self._stage = outcome, _SDK
            else:
                self._step, self._stage = self._after(outcome, error), _AFTER
            sending, value = True, None

    def _release(self) -> None:
        self._stage = _DONE
        assert self._turn is not None
        self._turn.release()

    def send(self, value: Any) -> Any:
        """The host's await resumes the call (see the class)."""
        return self._drive(True, value)

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        val: BaseException | object = None,
        tb: TracebackType | None = None,
    ) -> Any:
        """An exception (a cancellation) thrown into the host's await goes to the step."""
        exc = typ if val is None else val
        if isinstance(exc, type):
            exc = exc()
        if not isinstance(exc, BaseException):
            raise TypeError(f"exceptions must derive from BaseException, not {exc!r}")
        return self._drive(False, exc if tb is None else exc.with_traceback(tb))

    def close(self) -> None:
        """Close the running step (the host's coroutine is closed)."""
        try:
            self._step.close()
        finally:
            if self._stage == _SDK:
                self._release()
            self._stage = _DONE

    def __next__(self) -> Any:
        return self.send(None)

    def __await__(self) -> Generator[Any, None, Any]:
        return cast(Generator[Any, None, Any], self)


def bind(
    client: object,
    middleware: ContextMiddleware,
    session_id: str,
    agent: str,
    project_id: str,
    *,
    conversations: Conversations,
) -> SessionBinding:
    """The session binding of a wrapped ``client`` (see the ``wrap_*`` functions).

    Raises:
        ConfigError: ``session_id`` is empty, or ``conversations`` is not a choice.
    """
    if not session_id:
        raise ConfigError("session_id must be a non-empty string")
    return SessionBinding(
        middleware,
        session_id,
        agent=agent,
        project_id=project_id,
        conversations=conversations,
        origin=client_origin(client),
    )
