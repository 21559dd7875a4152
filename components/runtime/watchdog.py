"""Progress watchdog of multi-worker steps: each worker marks its progress, the launcher fails the
step when a worker has made none for too long, naming it.

A worker blocked forever is the usual way a distributed job dies without an error: a stopped or
wedged peer leaves the others waiting in a collective (gloo's timeout is the rendezvous timeout,
20 minutes by default) or in GLT's ``DistLoader.__next__``, whose channel receive has no timeout
at all. So every worker writes, into a slot of shared memory its launcher reads, the phase it is
in and when it last moved (:func:`mark`); a batch, a shard, a round of a collective are each
progress. The launcher's supervisor (:class:`ProgressBoard`) checks the slots every poll.

Which worker to blame: when one stops, its peers soon stop too, waiting for it. The rank whose
process tree holds a stopped process (SIGSTOP, a debugger) comes first; then a rank that is not
waiting on its peers (in ``rendezvous`` or ``all-reduce`` it waits for the others), one in lasting
uninterruptible sleep before the others; then the rank that moved last the longest ago.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil

PHASES = ("starting", "rendezvous", "loading", "sampling", "computing", "all-reduce", "evaluating", "writing", "publishing")
WAITING_ON_PEERS = frozenset({"rendezvous", "all-reduce"})  # blocked until every peer is there
# Phases whose one step may legitimately take long: a worker's imports on a loaded machine, a
# peer's image pull before the rendezvous, reading a whole partition (and building GLT's
# structures from it), rank 0's writes at the end. They get the rendezvous limit.
LONG_PHASES = frozenset({"starting", "rendezvous", "loading", "publishing"})
_FIELDS = 2  # per worker: last progress (time.monotonic, the same clock in every process), phase index

T = TypeVar("T")
_slot: tuple[Any, int] | None = None  # this worker's (shared array, offset), set by attach()


def attach(board: Any, local_rank: int) -> None:
    """Called once in a worker process: where its :func:`mark` calls go."""
    global _slot
    _slot = (board, local_rank * _FIELDS)
    mark("starting")


def mark(phase: str) -> None:
    """Records progress in ``phase`` (one of :data:`PHASES`); a no-op outside a launched worker."""
    if _slot is None:
        return
    board, offset = _slot
    board[offset] = time.monotonic()
    board[offset + 1] = PHASES.index(phase)


def touch() -> None:
    """Records progress in the phase the worker is in (a row, a shard, a round of a loop)."""
    if _slot is not None:
        board, offset = _slot
        board[offset] = time.monotonic()


def batches(loader: Iterable[T], working: str = "computing") -> Iterator[T]:
    """``loader``'s batches, the wait for each marked ``sampling`` (GLT's loaders block there,
    with no timeout of their own, when a sampling process or a peer is gone) and the work on it
    marked ``working``."""
    iterator = iter(loader)
    while True:
        mark("sampling")
        try:
            batch = next(iterator)
        except StopIteration:
            # Done with its own batches, a worker next waits for its peers' (DDP's join shadows
            # their all-reduces; evaluation sums its counts): excused while a peer still moves.
            mark("all-reduce")
            return
        mark(working)
        yield batch


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks ``name`` for the block; at its end, progress in the phase the worker was in before."""
    previous = PHASES[int(_slot[0][_slot[1] + 1])] if _slot is not None else name
    mark(name)
    try:
        yield
    finally:
        mark(previous)


@dataclass(frozen=True)
class Stall:
    """A worker that made no progress for longer than its limit."""

    local_rank: int
    phase: str
    seconds: float
    limit_s: float
    limit_key: str  # the config key that sets limit_s
    stopped: str | None  # a stopped or uninterruptible process of its tree, described


class ProgressBoard:
    """The launcher's side: one slot per local worker, and the check of them."""

    def __init__(self, context: Any, workers: int, progress_timeout_s: float, rendezvous_timeout_s: float) -> None:
        self.array = context.RawArray(ctypes.c_double, workers * _FIELDS)
        now = time.monotonic()
        for local_rank in range(workers):
            self.array[local_rank * _FIELDS] = now
        self.progress_timeout_s, self.rendezvous_timeout_s = progress_timeout_s, rendezvous_timeout_s
        self.host = socket.gethostname()

    def last(self, local_rank: int) -> tuple[float, str]:
        """(seconds since the worker's last progress, its phase)."""
        offset = local_rank * _FIELDS
        return time.monotonic() - self.array[offset], PHASES[int(self.array[offset + 1])]

    def stall(self, running: dict[int, int]) -> Stall | None:
        """The stall to blame among ``running`` (local rank → pid of a worker still at work), or
        None while every one of them moves within its limit.

        A worker at the rendezvous or in ``all-reduce`` is excused while another local worker
        is within its limit: it waits for that one (a peer still importing, or computing). The
        :data:`LONG_PHASES` have the rendezvous limit. Among stalls, :func:`blame` picks the rank."""
        last = {local_rank: self.last(local_rank) for local_rank in running}
        stalls = []
        for local_rank, (seconds, name) in last.items():
            if seconds <= self._limit(name):
                continue
            if name in WAITING_ON_PEERS and any(s <= self._limit(n) for r, (s, n) in last.items() if r != local_rank):
                continue
            key = "resources.rendezvous_timeout_s" if name in LONG_PHASES else "resources.progress_timeout_s"
            stalls.append(Stall(local_rank, name, seconds, self._limit(name), key, stopped_process(running[local_rank])))
        return blame(stalls) if stalls else None

    def _limit(self, phase: str) -> float:
        return self.rendezvous_timeout_s if phase in LONG_PHASES else self.progress_timeout_s


def blame(stalls: list[Stall]) -> Stall:
    """The stall whose rank caused the others.

    A stopped process is the cause wherever it is. Uninterruptible sleep is weaker evidence (a
    page fault under load lasts seconds): it decides only among ranks that are not waiting on
    their peers, or among waiters; a waiter caught in it was not why a peer never came."""
    return min(
        stalls,
        key=lambda s: (
            not s.stopped or s.stopped.endswith(_UNINTERRUPTIBLE),
            s.phase in WAITING_ON_PEERS,
            s.stopped is None,
            s.phase in LONG_PHASES,
            -s.seconds,
        ),
    )


_UNINTERRUPTIBLE = "in uninterruptible sleep"
_CANNOT_RUN = {
    psutil.STATUS_STOPPED: "stopped",
    psutil.STATUS_TRACING_STOP: "stopped by a tracer",
    psutil.STATUS_DISK_SLEEP: _UNINTERRUPTIBLE,
}


# Uninterruptible sleep is also how a process waits on a disk read or a page fault: it counts only
# when every one of these looks, 0.1 s apart, finds it there (a loaded machine's reads pass in less).
_DISK_SLEEP_LOOKS = 5


def _cannot_run(process: psutil.Process) -> str | None:
    state = _CANNOT_RUN.get(process.status())
    if state != _UNINTERRUPTIBLE:
        return state
    for _ in range(_DISK_SLEEP_LOOKS - 1):
        time.sleep(0.1)
        if process.status() != psutil.STATUS_DISK_SLEEP:
            return None
    return state


def stopped_process(pid: int) -> str | None:
    """A process in ``pid``'s tree that cannot run (stopped, traced, or in uninterruptible
    sleep that lasts), described as 'process N (name) is stopped', or None."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                if state := _cannot_run(process):
                    return f"process {process.pid} ({process.name()}) is {state}"
    return None


def describe(stall: Stall, rank: int, host: str) -> str:
    """The failure's reason, as WorkerFailed shows it after 'worker rank N failed: '."""
    stopped = f"; {stall.stopped}" if stall.stopped else ""
    return (
        f"no progress for {stall.seconds:.0f} s in phase {stall.phase} on host {host}{stopped} "
        f"(limit {stall.limit_s:.0f} s, {stall.limit_key}); every worker of the step was stopped"
    )
