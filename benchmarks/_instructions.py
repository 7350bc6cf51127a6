"""CPU instructions of a bare and a managed call, counted by callgrind (the wrappers part).

At 5,000 messages an OpenAI call is most of a second of the SDK's own work, whose
run-to-run spread is tens of milliseconds: timing cannot resolve a few milliseconds
of overhead there (the A/A control is as large as the effect). Instructions retired
do not depend on the load or on the CPU's frequency, so this module counts them:
one process runs under ``valgrind --tool=callgrind`` with instrumentation off,
builds each cell (way in, history size) as the timed benchmark does, warms it up,
and around each measured call only turns instrumentation and collection on (a
valgrind client request, below) and dumps the counter after it. A pair is one
managed and one bare call on the same host list, in that order every time (each
call follows one of the other side, whose work displaced what the interpreter's
caches held for it: alternating the order moved a 40-message overhead by up to a third);
the hash seed is fixed. Successive pairs then agree to a few percent.

Hardware performance counters would do the same much faster; they are not
available in the VMs this runs on, valgrind is. Without valgrind the part reports
the instruction rows as not measured.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CELLS", "QUICK_SIZES", "SIZES", "Counts", "measure", "parse_dump"]

CELLS = ("openai", "openai stream", "openai responses")
"""The ways in whose cells timing cannot resolve at 5,000 messages (an A/A control
as large as the effect): the OpenAI SDK's request building."""
SIZES = (100, 5_000)
QUICK_SIZES = (20, 40)
ROUNDS = 2
"""Measured pairs of a cell under 1,000 messages (see :func:`_rounds`)."""
WARM_PAIRS = 3
"""Pairs before the measured ones (the timed benchmark's warm-up)."""
GAP = 0.2
"""Seconds of idle before each measured call: the store worker's idle work falls
there, not in a counted call (valgrind runs everything several times slower)."""

# The valgrind client request (valgrind.h, amd64): a no-op on a real CPU, a request
# to the tool under valgrind. The function takes a pointer to six words (request,
# five arguments) in %rdi and returns the tool's answer (0 outside valgrind).
_REQUEST_CODE = bytes.fromhex(
    "4889f8"  # mov %rdi,%rax        (the argument block)
    "31d2"  # xor %edx,%edx          (the default answer)
    "48c1c703"  # rol $3,%rdi        \
    "48c1c70d"  # rol $13,%rdi        | the preamble valgrind recognises
    "48c1c73d"  # rol $61,%rdi        | (four rotations: %rdi unchanged)
    "48c1c733"  # rol $51,%rdi       /
    "4887db"  # xchg %rbx,%rbx       (the request: %rdx = request(%rax))
    "4889d0"  # mov %rdx,%rax
    "c3"  # ret
)
_CALLGRIND = (ord("C") << 24) | (ord("T") << 16)  # VG_USERREQ_TOOL_BASE('C','T')
_DUMP_STATS_AT = _CALLGRIND + 3
_ZERO_STATS = _CALLGRIND + 1
_TOGGLE_COLLECT = _CALLGRIND + 2
_START_INSTRUMENTATION = _CALLGRIND + 4
_STOP_INSTRUMENTATION = _CALLGRIND + 5


class _Requests:
    """Callgrind's client requests from Python (the machine code above, in an
    executable page, called through ctypes)."""

    def __init__(self) -> None:
        self._page = mmap.mmap(
            -1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        )
        self._page.write(_REQUEST_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._call = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)(address)
        self._args = (ctypes.c_size_t * 6)()
        self._labels: list[ctypes.Array[ctypes.c_char]] = []

    def __call__(self, request: int, argument: int = 0) -> None:
        self._args[0], self._args[1] = request, argument
        self._call(ctypes.addressof(self._args))

    def start(self) -> None:
        """Instrument from here on, and count from zero."""
        self(_START_INSTRUMENTATION)
        self(_ZERO_STATS)
        self(_TOGGLE_COLLECT)

    def stop(self, label: str) -> None:
        """Stop counting, write the count since :meth:`start` under ``label``."""
        self(_TOGGLE_COLLECT)
        text = ctypes.create_string_buffer(label.encode())
        self._labels.append(text)  # callgrind reads it while it dumps
        self(_DUMP_STATS_AT, ctypes.addressof(text))
        self(_STOP_INSTRUMENTATION)


@dataclass
class Counts:
    """The instructions of a cell's calls, one per measured pair."""

    bare: list[int]
    managed: list[int]

    @property
    def diffs(self) -> list[int]:
        """Per pair: the managed call's instructions minus the bare call's."""
        return [m - b for b, m in zip(self.bare, self.managed, strict=True)]

    @property
    def overhead(self) -> float:
        """The mean per-pair difference."""
        return sum(self.diffs) / len(self.diffs)

    @property
    def base(self) -> float:
        """The bare call's mean instructions."""
        return sum(self.bare) / len(self.bare)


_LABEL = re.compile(r"^desc: Trigger: Client Request: (\S+)$", re.MULTILINE)
_TOTAL = re.compile(r"^(?:totals|summary): (\d+)", re.MULTILINE)


def parse_dump(text: str) -> tuple[str, int] | None:
    """A callgrind dump's label (as :meth:`_Requests.stop` wrote it) and its
    instruction total, or None for a dump no measured call wrote (the final one)."""
    label, total = _LABEL.search(text), _TOTAL.search(text)
    if label is None or total is None:
        return None
    return label.group(1), int(total.group(1))


# --------------------------------------------------------------------------- child


async def _cell(way: str, size: int, rounds: int, requests: _Requests, root: Path) -> None:
    import anyio
    import openai

    from mimo_ctx.middleware import ContextMiddleware
    from mimo_ctx.providers import wrap_openai
    from mimo_ctx.store.sqlite import SQLiteStore

    from ._common import settle_heap
    from .wrappers import ANSWERS, LIMITS, SDK_CALLS, answer_text, transport

    history_of, call = SDK_CALLS[way]
    raw: Any = openai.AsyncOpenAI(
        api_key="sk", base_url="http://fake/v1", max_retries=0, http_client=transport(ANSWERS[way])
    )
    store = await SQLiteStore.open(root / f"{way.replace(' ', '-')}-{size}.db")
    try:
        async with ContextMiddleware(store, root / "memory", model=LIMITS) as mw:
            managed = wrap_openai(raw, mw, session_id=f"ses-{size}")
            host = history_of(size)
            if host[-1].get("role") == "assistant":
                host.append({"role": "user", "content": "Go on."})
            # Every pair, the warm-up's too, is the managed call then the bare one: each
            # call follows one call of the other side (whose work displaced what the
            # interpreter's caches held for this one), at every size alike.
            for warm in range(WARM_PAIRS):  # the first managed call stores the history
                reply = await call(managed, host)
                await call(raw, host)
                host += [answer_text(reply), {"role": "user", "content": f"Warm {warm}."}]
            settle_heap()
            for number in range(rounds):
                replies: dict[str, Any] = {}
                for arm, client in (("managed", managed), ("bare", raw)):
                    await anyio.sleep(GAP)
                    requests.start()
                    replies[arm] = await call(client, host)
                    requests.stop(f"{way.replace(' ', '_')}/{size}/{arm}/{number}")
                host += [answer_text(replies["managed"]), {"role": "user", "content": "Next."}]
    finally:
        await store.aclose()


async def _child(cells: Sequence[tuple[str, int, int]]) -> None:
    requests = _Requests()
    root = Path(tempfile.mkdtemp(prefix="mimo-instructions-"))
    try:
        for way, size, rounds in cells:
            await _cell(way, size, rounds, requests, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- parent


_GROUPS = (("openai", "openai stream"), ("openai responses",))
"""The cells' split over two processes run side by side (a Responses call costs about
as much as the two Chat Completions ones): the part's two cores, half the wall time."""


def _rounds(size: int) -> int:
    """Measured pairs of a cell: one from 1,000 messages on (a 5,000-message call is
    most of a minute under callgrind), :data:`ROUNDS` below (where the repeat costs
    little and shows how exactly a count repeats)."""
    return 1 if size >= 1_000 else ROUNDS


def _command(valgrind: str, out_dir: Path, cells: list[tuple[str, int, int]]) -> list[str]:
    return [
        valgrind,
        "--tool=callgrind",
        "--instr-atstart=no",
        "--collect-atstart=no",
        "--dump-instr=no",
        "--dump-line=no",
        f"--callgrind-out-file={out_dir}/callgrind.out",
        sys.executable,
        "-m",
        "benchmarks._instructions",
        json.dumps(cells),
    ]


def measure(
    *, quick: bool, progress: Callable[[str], None] | None = None
) -> dict[str, dict[int, Counts]] | str:
    """Count every cell's calls under callgrind (two processes, see :data:`_GROUPS`).

    Returns:
        Per way in and size, the counts; or why nothing was counted (no valgrind,
        or its run failed), for the part to print.
    """
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return "valgrind is not installed"
    sizes = QUICK_SIZES if quick else SIZES
    # A fixed hash seed: the same dict and set layouts, so the same instructions.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    root = Path(__file__).resolve().parents[1]
    out_dir = Path(tempfile.mkdtemp(prefix="mimo-callgrind-"))
    try:
        runs: list[subprocess.Popen[str]] = []
        for number, group in enumerate(_GROUPS):
            cells = [(way, size, _rounds(size)) for way in group for size in sizes]
            if progress is not None:
                progress(f"callgrind: {', '.join(f'{w} at {s:,}' for w, s, _ in cells)}")
            group_dir = out_dir / str(number)
            group_dir.mkdir()
            runs.append(
                subprocess.Popen(
                    _command(valgrind, group_dir, cells),
                    cwd=root,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        failed = ""
        for run in runs:
            _, err = run.communicate()
            if run.returncode != 0 and not failed:
                tail = " | ".join(err.strip().splitlines()[-3:])
                failed = f"the callgrind run failed ({run.returncode}): {tail}"
        if failed:
            return failed
        found: list[tuple[int, str, int, str, int]] = []
        for dump in out_dir.glob("*/callgrind.out*"):
            parsed = parse_dump(dump.read_text(errors="replace"))
            if parsed is not None:
                way, size, arm, number = parsed[0].split("/")
                found.append((int(number), way.replace("_", " "), int(size), arm, parsed[1]))
        counts: dict[str, dict[int, Counts]] = {}
        for _, way, size, arm, total in sorted(found):  # pair by pair
            cell = counts.setdefault(way, {}).setdefault(size, Counts([], []))
            (cell.bare if arm == "bare" else cell.managed).append(total)
        return counts
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    import anyio

    anyio.run(_child, [(w, int(s), int(r)) for w, s, r in json.loads(sys.argv[1])])
