"""One SQLite connection driven from its own worker thread: the plumbing shared by
the SQLite store and the memory index.

Each object has one dedicated thread that owns the connection's calls: callers
put a job on its queue (:class:`queue.SimpleQueue`, one C-level put and one
wake-up of a blocked thread) and wait on an :class:`anyio.Event` that the thread
sets through the caller's event loop token (one thread-safe wake-up of the
loop, no waiting on the thread's side). That is the whole hand-off: no capacity
limiter to take and release, no pool of threads to pick from, no loop iteration
spent before the job is queued, so the event loop never blocks on SQLite and a
turn's writes cost little more than their SQLite work. Jobs run one at a time in
the order they were queued (callers from several event loops or threads share
the one queue); the lock guards the connection against any other thread that
reaches it directly.

**Inline writes.** A hand-off costs more than a small write itself: the thread's
wake-up and the loop's wake-up cost ~40 µs of CPU on a quiet machine, 70-130 µs
when the two threads run on different cores, against ~80 µs of SQL for a
message. So a small write of the store's messages (:meth:`SQLiteWorker._run_write`,
what ``append``/``update``/``upsert_messages`` of up to a few messages use) runs
on the caller's thread instead, but only when it could not wait anyway: no job
queued or running (so the order of first come, first served holds), the lock
free (no checkpoint running), the connection already open (opening, migrating
and checkpointing stay the thread's), WAL mode with ``synchronous=NORMAL`` (a
commit appends to the log and returns, no ``fsync``), and no checkpoint due by
count. Between jobs the connection *rests* with the busy timeout at 0 and
SQLite's automatic checkpoint off (a subclass allows it: the store, not the
memory index); each job of the thread sets the connection's own busy timeout
and backstop checkpoint for its run and puts the resting ones back after it,
so an inline write (and the store's change-feed check) sets nothing: a write
lock held by another connection or process answers ``SQLITE_BUSY`` at once
instead of blocking the loop, nothing was written, and the write goes to the
thread, which waits for the lock as long as the busy timeout says. No
checkpoint runs in an inline commit (the thread's checkpoints run between jobs
as below, and it counts its idle time from the last inline write); the memory
index and large or bulk writes never run inline. What blocks the loop is then
one such write: serialising and estimating up to ``INLINE_CHARS`` (32 K)
characters of payload and a commit of a few pages to the log, ~0.1-0.5 ms.
After an inline write the caller yields to the loop's other tasks only once
the work it did on the loop's thread since its last yield (inline writes, the
store's change-feed checks) adds up to :data:`LOOP_SLICE`; a hand-off always
yields. A turn's one or two writes and its feed read then cost no loop
iteration of their own (~35 µs of CPU each on a cold cache; the host's own
await, the model call, gives the others their turn), and a task writing in a
loop still lets the others run at least every millisecond or so.
With ``synchronous="FULL"``,
without WAL (``":memory:"``) or with the lock taken, every write is a hand-off
as before.

A caller cancelled while its job waits in the queue takes it back (it never
runs); one cancelled while its job runs waits for it to finish, so a
transaction is never left half-done. The thread ends after a while with nothing
to do (at once after :meth:`~SQLiteWorker.aclose`) and starts again with the
next job, so an object that is dropped without closing does not keep a thread
forever.

WAL checkpoints are the thread's own work, not a caller's: SQLite's automatic
checkpoint runs inside the commit that fills the log past a size (every ~100
message writes at SQLite's 1,000 pages, ~7 ms then), so one write in a hundred
paid for all of them. The thread instead checkpoints (``PASSIVE``: it never
waits for readers or writers) once it has had nothing to do for
:data:`CHECKPOINT_IDLE` seconds after a write, and at the latest after
:data:`CHECKPOINT_WRITES` writing jobs, right after handing the last one's
result back. Between jobs, a checkpoint copies every page of the log (unless a
reader still needs old ones), so the next write starts the log over: the log
stays bounded, and a write waits for a checkpoint only when it arrives during
one (in a host's turns, model calls leave idle time for every checkpoint).
SQLite's own checkpoint is kept only as a backstop for one huge transaction
(:data:`WAL_BACKSTOP_PAGES`). A checkpoint changes no data: the
``data_version`` the change feed relies on (``mimo_ctx.store._sqlite_feed``)
stays as it was.

**Held while a model call is outstanding.** A wrapped call writes the host's new
messages, then the SDK builds and sends its request (for a long history, most
of a second of CPU), then the answer is written. An idle checkpoint between the
two writes would run while the SDK works: it competes with the SDK for the
interpreter and the CPU caches, and after it the answer's write arms a second
one. A :class:`CheckpointHold` (:func:`hold_checkpoints`, which the client
wrappers and the framework integrations take for each model call) makes the
thread wait for the call's end instead: when the last hold is released the idle
time counts again and the checkpoint runs :data:`CHECKPOINT_IDLE` after the last
write, in the host's own time. Nothing is lost: the checkpoint stays due, the
one by count (:data:`CHECKPOINT_WRITES`) is never held, no hold lasts longer
than :data:`CHECKPOINT_HOLD_LIMIT` (a call that never ends, holds that always
overlap), and a closed object holds nothing.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sqlite3
import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Final, Generic, Self, TypeVar

import anyio
import anyio.lowlevel
from anyio.abc import AsyncResource

from mimo_ctx.errors import StoreError

__all__ = [
    "CHECKPOINT_HOLD_LIMIT",
    "CHECKPOINT_IDLE",
    "CHECKPOINT_WRITES",
    "LOOP_SLICE",
    "WAL_BACKSTOP_PAGES",
    "CheckpointHold",
    "SQLiteWorker",
    "hold_checkpoints",
]

_T = TypeVar("_T")

_THREAD_IDLE: Final = 10.0
"""Seconds the worker thread waits for a job before it ends (it starts again on the
next one)."""

CHECKPOINT_IDLE: Final = 0.05
"""Seconds without a job after a write before the thread checkpoints the WAL: far
below the time a model takes to answer, so a host's turns leave it plenty."""

CHECKPOINT_WRITES: Final = 128
"""Writing jobs after which the thread checkpoints even without an idle moment
(a message write adds ~10 pages to the log: ~1,300 pages, ~5 MB, at most)."""

CHECKPOINT_HOLD_LIMIT: Final = 30.0
"""Seconds at most that held idle checkpoints wait, counted from when the first
of the holds outstanding was taken (longer than a model call takes to answer)."""

WAL_BACKSTOP_PAGES: Final = 10_000
"""SQLite's automatic checkpoint, kept for a single transaction larger than this
(a bulk import): the thread's checkpoints come first for everything else."""

LOOP_SLICE: Final = 0.001
"""Seconds of a caller's work on the event loop's thread (inline writes, the
store's change-feed checks) after which it yields to the loop's other tasks
(see the module docstring)."""

_SQL_CHECKPOINT: Final = "PRAGMA wal_checkpoint(PASSIVE)"

# The connection's resting settings between jobs (see the module docstring): take
# the write lock or fail at once, and leave every checkpoint to the thread.
_RESTING: Final = ("PRAGMA busy_timeout = 0", "PRAGMA wal_autocheckpoint = 0")

_WAKE: Final = object()
"""Queued by an inline write that armed a checkpoint: the thread wakes to keep the
idle time (it is not a job: nobody waits for it)."""

_QUEUED: Final = 0
_TAKEN: Final = 1  # the thread started it (or it is done)
_WITHDRAWN: Final = 2  # its caller was cancelled before it started: never run


class _Job(Generic[_T]):
    """One call for the worker thread and, once it ran, its outcome."""

    __slots__ = ("done", "error", "result", "state", "token", "work")

    def __init__(self, work: Callable[[], _T]) -> None:
        self.work = work
        self.token = anyio.lowlevel.current_token()
        self.done = anyio.Event()
        self.state = _QUEUED
        self.result: _T | None = None
        self.error: BaseException | None = None


class SQLiteWorker(AsyncResource):
    """Base of the SQLite-backed classes: a lazily opened connection on a worker thread.

    Subclasses implement :meth:`_connect`; ``label`` names the object in errors
    (``"SQLite store"``, ``"memory index"``).
    """

    def __init__(self, path: str | os.PathLike[str], *, label: str) -> None:
        self._path = os.fspath(path)
        self._label = label
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._jobs: queue.SimpleQueue[_Job[object]] = queue.SimpleQueue()
        # Guards the thread's start and end against the queue (see _serve) and
        # each job's state between its caller and the thread.
        self._jobs_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # WAL mode (known once connected) and the writing jobs since the thread's
        # last checkpoint; both touched under the lock only.
        self._wal = False
        self._unchecked = 0
        # Inline writes (see _run_write): allowed by the subclass (the store's
        # message writes with synchronous=NORMAL), the jobs queued or running
        # (under the jobs lock: an inline write waits for none of them), when the
        # last inline write ended (the thread's idle time counts from it).
        self._inline_allowed = False
        self._outstanding = 0
        self._last_inline = 0.0
        self._on_loop = 0.0
        self._turn_watched = False  # a callback waits for the loop's next turn
        # The connection rests without waits between jobs (see the module
        # docstring) when the subclass allows it and the file is in WAL mode:
        # `_thread_settings` then holds the statements giving a job of the thread
        # the connection's own busy timeout and backstop checkpoint (read on
        # connecting), and `_resting` says the resting ones are in effect now.
        self._rest_allowed = False
        self._thread_settings: tuple[str, ...] = ()
        self._resting = False
        # Checkpoint holds (see CheckpointHold), under the jobs lock: how many are
        # outstanding, since when some are, and whether the thread waits for their
        # end (the last release then wakes it).
        self._holds = 0
        self._held_since = 0.0
        self._parked = False

    @property
    def path(self) -> str:
        """The database path as given."""
        return self._path

    async def __aenter__(self) -> Self:
        await self._run(lambda _conn: None)
        return self

    async def aclose(self) -> None:
        """Close the connection; later calls raise ``StoreError``. Idempotent."""
        if self._closed:
            return
        self._closed = True

        def close() -> None:
            with self._lock:
                self._resting = False
                self._release()
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()

        # Shielded: a cancelled caller must still release the connection. Queued
        # after every job already waiting, which then find the object closed.
        with anyio.CancelScope(shield=True):
            await self._hand_off(close)

    @abstractmethod
    def _connect(self) -> sqlite3.Connection:
        """Open the connection (called once, on the worker thread, under the lock)."""

    def _release(self) -> None:
        """Close what a subclass opened besides the connection (worker thread, under
        the lock, before the connection: the last connection to close checkpoints)."""
        return

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the {self._label} {self._path} is closed")

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        self._check_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        return await self._hand_off(lambda: self._call(fn))

    async def _hand_off(self, work: Callable[[], _T]) -> _T:
        """Run ``work`` on the worker thread and return its result (or raise its error)."""
        job = _Job(work)
        self._on_loop = 0.0  # the caller yields until the job is done
        with self._jobs_lock:
            self._jobs.put(job)  # pyright: ignore[reportArgumentType]
            self._outstanding += 1
            if self._thread is None:
                self._start_thread()
        try:
            await job.done.wait()
        except anyio.get_cancelled_exc_class():
            with self._jobs_lock:
                withdrawn = job.state == _QUEUED
                if withdrawn:
                    job.state = _WITHDRAWN
            if not withdrawn:
                # Running: its transaction finishes (or rolls back) before we go.
                with anyio.CancelScope(shield=True):
                    await job.done.wait()
            raise
        error, job.error = job.error, None
        if error is not None:
            raise error
        return job.result  # pyright: ignore[reportReturnType]

    def _start_thread(self) -> None:
        """Start the worker thread (under the jobs lock, when none runs)."""
        self._thread = threading.Thread(
            target=self._serve, name=f"mimo-ctx {self._label}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        """The worker thread; should it ever fail, a new one takes over the queue."""
        try:
            self._serve_jobs()
        except BaseException:
            with self._jobs_lock:
                self._thread = None
                if not self._jobs.empty():
                    self._start_thread()
            raise

    def _serve_jobs(self) -> None:
        """Run the queued jobs in order, checkpoint between them, end when idle."""
        jobs = self._jobs
        wait_more = 0.0
        while True:
            pending = self._unchecked > 0
            timeout = (wait_more or CHECKPOINT_IDLE) if pending else _THREAD_IDLE
            wait_more = 0.0
            try:
                job = jobs.get(timeout=timeout)
            except queue.Empty:
                # Read again: an inline write may have armed one meanwhile without
                # waking the thread (see _wake).
                if self._unchecked > 0:
                    # Idle since the last job and the last inline write alike.
                    quiet = time.monotonic() - self._last_inline
                    if quiet < CHECKPOINT_IDLE:
                        wait_more = CHECKPOINT_IDLE - quiet
                    else:
                        wait_more = self._hold_left()
                        if not wait_more:
                            self._checkpoint()
                elif self._end_if_idle():
                    return
                continue
            if job is _WAKE:
                continue
            with self._jobs_lock:
                if job.state == _WITHDRAWN:
                    self._outstanding -= 1
                    continue
                job.state = _TAKEN
            try:
                job.result = job.work()
            except BaseException as exc:  # delivered to the caller, raised there
                job.error = exc
            with self._jobs_lock:
                # Done before its caller hears of it: an inline write may follow now.
                self._outstanding -= 1
            token = job.token
            try:
                token.backend_class.run_sync_soon(job.done.set, (), token.native_token)
            except anyio.RunFinishedError:  # the caller's event loop has ended: nobody waits
                job.error = None
            del job, token
            if self._unchecked >= CHECKPOINT_WRITES:
                self._checkpoint()
            if self._closed and self._conn is None and self._end_if_idle():
                return

    def hold_checkpoints(self) -> CheckpointHold:
        """Hold the idle checkpoint until the returned hold is released (see the
        module docstring): for the length of a model call."""
        with self._jobs_lock:
            if not self._holds:
                self._held_since = time.monotonic()
            self._holds += 1
        return CheckpointHold(self)

    def _unhold(self) -> None:
        """One hold ends; the last one wakes a thread waiting for it (any thread)."""
        with self._jobs_lock:
            self._holds -= 1
            if self._holds or not self._parked:
                return
            self._parked = False
            self._jobs.put(_WAKE)  # pyright: ignore[reportArgumentType]
            if self._thread is None:
                self._start_thread()

    def _hold_left(self) -> float:
        """Seconds a due idle checkpoint still waits for the holds (0: run it now).

        Worker thread. Waiting, the thread is parked: the last release wakes it.
        """
        with self._jobs_lock:
            if not self._holds or self._closed:
                return 0.0
            left = CHECKPOINT_HOLD_LIMIT - (time.monotonic() - self._held_since)
            if left <= 0:
                return 0.0
            self._parked = True
            return left

    def _end_if_idle(self) -> bool:
        """End the thread if no job is queued (worker thread)."""
        with self._jobs_lock:
            # Under the lock a caller cannot queue a job without seeing the
            # thread gone (and starting another).
            if not self._jobs.empty():
                return False
            self._thread = None
            return True

    def _checkpoint(self) -> None:
        """Checkpoint the WAL without waiting for anyone (worker thread, between jobs).

        Never raises (an error would end the thread with jobs queued): a failure
        (the file busy in another process's checkpoint, a reader holding old pages)
        leaves the log for the next one, which the next write arms again.
        """
        with self._lock:
            self._unchecked = 0
            conn = self._conn
            if conn is None or conn.in_transaction:
                return
            try:
                conn.execute(_SQL_CHECKPOINT).fetchall()
            except Exception:  # nobody's call failed: the next write arms another
                return

    def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``fn`` on the connection under the lock (worker thread).

        A resting connection gets its own busy timeout and backstop checkpoint
        for the call and the resting settings back after it.
        """
        with self._lock:
            try:
                if self._resting and self._conn is not None:
                    self._resting = False
                    self._apply_settings(self._conn, self._thread_settings)
                return self._locked(fn)
            finally:
                self._rest()

    def _apply_settings(self, conn: sqlite3.Connection, statements: tuple[str, ...]) -> None:
        try:
            for statement in statements:
                conn.execute(statement)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._label} {self._path}: {exc}") from exc

    def _rest(self) -> None:
        """Put the resting settings in effect (under the lock), where they apply."""
        conn = self._conn
        if self._resting or not self._thread_settings or conn is None or self._closed:
            return
        try:
            for statement in _RESTING:
                conn.execute(statement)
        except sqlite3.Error:  # left waiting: every write goes to the thread
            return
        self._resting = True

    def _locked(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``fn`` on the connection, opened first if need be (the lock held).

        Subclasses wrap ``fn`` here (whichever thread runs it).
        """
        self._check_open()
        conn = self._conn
        if conn is None:
            conn = self._conn = self._connect()
            self._wal = _take_checkpoints(conn)
            if self._wal and self._rest_allowed:
                self._thread_settings = _settings(conn)
        changes = conn.total_changes
        try:
            return fn(conn)
        except (sqlite3.Error, OverflowError) as exc:
            # OverflowError: a value beyond SQLite's 64-bit integers.
            raise StoreError(f"{self._label} {self._path}: {exc}") from exc
        finally:
            if self._wal and conn.total_changes != changes:
                self._unchecked += 1

    async def _run_write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run a small write transaction: on the caller's thread when nothing waits.

        Inline (see the module docstring) when the subclass allows it, the
        connection is open in WAL mode, no job is queued or running, the lock is
        free and no checkpoint is due by count; otherwise, or when another
        connection holds the write lock, on the worker thread like :meth:`_run`.
        ``fn`` must run one write transaction (``BEGIN IMMEDIATE``), so a busy
        lock means nothing was written and it can run again on the thread.
        """
        self._check_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        return await self._write_checked(fn)

    async def _write_checked(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """:meth:`_run_write` once its checks are made (the caller made them, with no
        await since: one cancellation check per write, not two)."""
        if self._take_inline():
            started = time.perf_counter()
            try:
                result = self._call_inline(fn)
            except _Busy:
                pass
            else:
                # The write stands whatever happens while others take their turn.
                await self._ran_on_loop(started)
                return result
        return await self._hand_off(lambda: self._call(fn))

    async def _ran_on_loop(self, started: float) -> None:
        """Work on the caller's thread since ``started`` (``perf_counter``) held the loop.

        Other tasks get their turn, as after a hand-off, once such work since the
        caller's last yield adds up to :data:`LOOP_SLICE`.
        """
        self._on_loop += time.perf_counter() - started
        if self._on_loop >= LOOP_SLICE:
            self._on_loop = 0.0
            await anyio.lowlevel.cancel_shielded_checkpoint()
        elif not self._turn_watched:
            self._watch_loop_turn()

    def _watch_loop_turn(self) -> None:
        """Have the count start again once the loop turns (the caller yielded).

        The caller's own awaits (the model call between two turns) give the other
        tasks their turn as well as a yield here would: counting on across them
        made a turn pay a loop iteration for work done before the last one. A
        callback queued now runs only after the caller has yielded, so the count
        is of work since its last yield, never longer. Without an asyncio loop
        the count runs on until the slice.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._turn_watched = True
        loop.call_soon(self._loop_turned)

    def _loop_turned(self) -> None:
        self._on_loop = 0.0
        self._turn_watched = False

    def _inline_ready(self) -> bool:
        """Whether a write could run inline now (a hint: :meth:`_run_write` decides)."""
        return (
            self._inline_allowed
            and self._resting
            and self._unchecked < CHECKPOINT_WRITES
            and self._outstanding == 0
        )

    def _take_inline(self) -> bool:
        """Take the lock for an inline write if nothing waits for it (caller's thread)."""
        if not self._inline_ready():
            return False
        with self._jobs_lock:
            # Under the jobs lock: a job queued before this point is seen here, one
            # queued after it waits for the lock, so the order stays first come.
            return self._outstanding == 0 and self._lock.acquire(blocking=False)

    def _call_inline(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``fn`` on the caller's thread, the lock taken; release it.

        Raises:
            _Busy: Another connection holds the write lock: nothing was written.
        """
        try:
            conn = self._conn
            if conn is None or self._closed or not self._resting:
                raise _Busy  # closed meanwhile (the thread says so), or waiting
            armed = self._unchecked == 0
            try:
                result = self._locked(fn)
            except StoreError as exc:
                if _is_busy(exc.__cause__):
                    raise _Busy from None
                raise
            if self._unchecked:
                self._last_inline = time.monotonic()
                if armed:
                    self._wake()
            return result
        finally:
            self._lock.release()

    def _wake(self) -> None:
        """Have the thread count its idle time for a checkpoint (after an inline write).

        While a hold is outstanding a running thread is left asleep: the last
        release wakes it, and its own timeout finds the checkpoint due regardless.
        """
        with self._jobs_lock:
            if self._holds and self._thread is not None and not self._closed:
                self._parked = True
                return
            self._jobs.put(_WAKE)  # pyright: ignore[reportArgumentType]
            if self._thread is None:
                self._start_thread()


class CheckpointHold:
    """One outstanding hold on a worker's idle checkpoint
    (:meth:`SQLiteWorker.hold_checkpoints`); :meth:`release` ends it, once.

    Also a context manager (released on exit). ``CheckpointHold(None)`` holds
    nothing (a store without a worker thread).
    """

    __slots__ = ("_worker",)

    def __init__(self, worker: SQLiteWorker | None) -> None:
        self._worker = worker

    def release(self) -> None:
        """End the hold (a second call does nothing)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker._unhold()  # pyright: ignore[reportPrivateUsage]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def hold_checkpoints(store: object) -> CheckpointHold:
    """Hold ``store``'s idle checkpoint for a model call (see the module docstring).

    The client wrappers and the framework integrations take one from the host's
    list arriving until the answer is recorded (a stream: until it ends). A store
    without a worker thread (in memory, PostgreSQL) holds nothing.
    """
    return store.hold_checkpoints() if isinstance(store, SQLiteWorker) else CheckpointHold(None)


class _Busy(Exception):
    """Internal: an inline write found the write lock taken; it goes to the thread."""


def _is_busy(error: BaseException | None) -> bool:
    """Whether ``error`` is SQLite's "database is locked" (``SQLITE_BUSY``, any variant)."""
    return (
        isinstance(error, sqlite3.OperationalError)
        and getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
    )


def _take_checkpoints(conn: sqlite3.Connection) -> bool:
    """Leave the connection's WAL checkpoints to the worker thread; ``False``: no WAL."""
    try:
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        if mode != "wal":
            return False
        conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_BACKSTOP_PAGES}")
    except sqlite3.Error:
        return False
    return True


def _settings(conn: sqlite3.Connection) -> tuple[str, ...]:
    """Statements giving the connection its own busy timeout and automatic checkpoint
    (``()`` when they cannot be read: the connection then never rests)."""
    try:
        timeout = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        pages = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
    except sqlite3.Error:
        return ()
    return (f"PRAGMA busy_timeout = {timeout}", f"PRAGMA wal_autocheckpoint = {pages}")
