"""The launcher's supervisor: starts this replica's worker processes, watches them (results,
errors, deaths, the progress board, SIGTERM passed on), and on every way out kills what they
started and frees what they leaked (SysV segments, /dev/shm files, registered resources)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing.connection
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import psutil

from components.runtime import watchdog, worker_resources
from components.runtime.launcher.context import WorkerContext, WorkerFailed
from components.runtime.launcher.processes import LauncherState, server_pid, worker_processes
from components.runtime.launcher.worker import worker_main

logger = logging.getLogger("components.runtime.launcher")

_KILL_GRACE_S = 3.0  # SIGTERM → SIGKILL; short, because a peer's death is never undone
# A Spot VM has 30 s between its preemption notice and its end: workers that stop on SIGTERM
# (train checkpoints mid-epoch) get most of it.
_TERMINATION_GRACE_S = 25.0
_EXIT_GRACE_S = 30.0  # how long a worker that returned its result may take to exit
_POLL_S = 1.0  # how often the launcher records descendants and checks deadlines
WORKER_MALLOC_ARENAS = "2"  # glibc arenas per worker, unless the environment sets MALLOC_ARENA_MAX itself
_IPC_RMID = 0


@dataclass
class _Worker:
    """The launcher's view of one worker process."""

    context: WorkerContext
    process: BaseProcess
    reader: Connection | None  # None once the worker's end is closed
    spawned_at: float
    started: bool = False  # sent its "started" message
    exited: bool = False
    failed: bool = False  # reported an exception
    has_result: bool = False
    result: Any = None


_Failure = tuple[int, float, int, WorkerFailed]  # (0 silent death / 1 error, time, rank, error): cause sorts first


_ROOT_CAUSE_WAIT_S = 3.0
# What a worker sees when a peer died or failed first: the peer's failure is the cause.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _collateral(failure: _Failure) -> bool:
    """Whether a reported error is only the echo of another worker's failure."""
    return failure[0] != 0 and any(text in failure[3].reason for text in _PEER_GONE)


_WAITED_TOO_LONG = ("Timeout", "timed out")  # gloo's store: "Socket Timeout"; torch and GLT RPC: "timed out"


def _waited(failure: _Failure) -> bool:
    """Whether a reported error is a wait for peers that ran out (the rendezvous, a collective)."""
    return _collateral(failure) or (failure[0] != 0 and any(text in failure[3].reason for text in _WAITED_TOO_LONG))


class Supervisor:
    """One launch: this replica's worker processes, watched until all have exited."""

    def __init__(self, contexts: list[WorkerContext], payload: bytes, worker_module: str, start_timeout_s: float) -> None:
        self.contexts, self.payload, self.start_timeout_s = contexts, payload, start_timeout_s
        self.workers: list[_Worker] = []
        self.known: dict[int, float] = {}  # pid → start time of every process seen in the workers' trees
        self.resources: set[worker_resources.Resource] = set()  # semaphores etc. the workers registered
        self.shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        self.segments_before = set(_segments_by_creator())
        self.terminated_at: float | None = None  # when this launcher got SIGTERM
        timeouts = contexts[0].timeouts
        # glibc gives every thread that allocates its own arena and keeps freed memory in it; a
        # worker runs dozens of threads (GLT RPC, gloo, sampling), which left about 10% of a
        # trainer's peak RSS as idle arenas (benchmarks/RESULTS.md). Read once, by the fork server.
        os.environ.setdefault("MALLOC_ARENA_MAX", WORKER_MALLOC_ARENAS)
        self.processes = worker_processes(worker_module)
        self.board = watchdog.ProgressBoard(self.processes, len(contexts), timeouts.progress_s, timeouts.rendezvous_s)

    def run(self) -> list[Any]:
        """Starts the workers and watches them; cleans up on every way out, signals included."""
        # SIGTERM is passed on to the workers, which may stop cleanly (train checkpoints and returns
        # on it); those that do not die of it, and the launcher exits with SystemExit(143) through
        # the cleanup unless every worker returned. A host's own handler decides itself.
        # SIGINT → KeyboardInterrupt even where it was inherited as ignored (a job started in the
        # background of a non-interactive shell): an explicit `kill -INT` must still stop the workers.
        main_thread = threading.current_thread() is threading.main_thread()
        own_sigterm = main_thread and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        previous_sigint = signal.getsignal(signal.SIGINT) if main_thread else None
        own_sigint = previous_sigint in (signal.SIG_IGN, signal.SIG_DFL)
        if own_sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if own_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self._start()
            self._watch()
            return [worker.result for worker in self.workers]
        finally:
            # A second Ctrl-C or SIGTERM waits until the cleanup is done, then goes to the restored handler.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                self._cleanup()
            finally:
                if own_sigterm:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if own_sigint:
                    signal.signal(signal.SIGINT, previous_sigint)
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _on_sigterm(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        if self.terminated_at is not None:  # a second one: stop waiting
            sys.exit(128 + signum)
        self.terminated_at = time.monotonic()
        logger.warning("SIGTERM: passed on to the workers, which have %.0f s to stop", _TERMINATION_GRACE_S)
        for worker in self.workers:
            if worker.process.pid is not None and not worker.exited:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signal.SIGTERM)

    def _start(self) -> None:
        launcher, parent = LauncherState.here(), server_pid()
        for context in self.contexts:
            reader, writer = self.processes.Pipe(duplex=False)
            arguments = (self.payload, context, writer, parent, self.board.array, launcher)
            process = self.processes.Process(target=worker_main, args=arguments, name=f"gnnflow-rank-{context.rank}")
            process.start()
            self.workers.append(_Worker(context, process, reader, time.monotonic()))
            writer.close()  # the child holds the only write end, so its death reads as EOF here

    def _watch(self) -> None:
        """Returns once every worker sent its result and exited; raises on the first failure."""
        start_deadline = time.monotonic() + self.start_timeout_s
        exit_deadline: float | None = None
        while not all(worker.exited for worker in self.workers):
            self._record([w.process.pid for w in self.workers if not w.exited])  # type: ignore[misc]
            failures = self._collect(_POLL_S)
            if self.terminated_at is not None:
                if not failures and all(worker.has_result for worker in self.workers):
                    return  # every worker stopped cleanly on it: the cleanup ends what they leave running
                if failures or time.monotonic() > self.terminated_at + _TERMINATION_GRACE_S:
                    sys.exit(128 + signal.SIGTERM)  # the workers died of it, or took too long
            if failures:
                # A peer's error is often a consequence of a death (gloo: "connection closed by
                # peer") visible by now: look once more, blame deaths first, then the earliest error.
                failures += self._collect(0)
                deadline = time.monotonic() + _ROOT_CAUSE_WAIT_S
                while all(_collateral(f) for f in failures) and (left := deadline - time.monotonic()) > 0:
                    failures += self._collect(left)
                # Ranks that only waited too long for a peer: the peer the board shows stuck is the
                # cause (it passes its own limit within moments: it stopped moving before they timed out).
                deadline = time.monotonic() + _ROOT_CAUSE_WAIT_S
                while all(_waited(f) for f in failures) and time.monotonic() < deadline:
                    if stalled := self._stalled():
                        raise stalled
                    time.sleep(0.1)
                raise min(failures, key=lambda f: (f[0], _collateral(f), *f[1:3]))[3]
            now = time.monotonic()
            if now > start_deadline and (late := [w.context.rank for w in self.workers if not (w.started or w.exited)]):
                raise WorkerFailed(late[0], f"did not start within {self.start_timeout_s:.0f} s")
            if stalled := self._stalled():
                raise stalled
            if exit_deadline is None and all(worker.has_result for worker in self.workers):
                exit_deadline = now + _EXIT_GRACE_S
            if exit_deadline is not None and now > exit_deadline:
                logger.warning("workers returned but did not exit within %.0f s; killing them", _EXIT_GRACE_S)
                return

    def _stalled(self) -> WorkerFailed | None:
        """The failure of a running worker that made no progress within its phase's limit, if any."""
        running = {w.context.local_rank: w.process.pid for w in self.workers if w.started and not (w.exited or w.has_result or w.failed)}
        if not (stall := self.board.stall(running)):  # type: ignore[arg-type]
            return None
        rank = self.workers[stall.local_rank].context.rank
        reason = watchdog.describe(stall, rank, self.board.host)
        logger.error("worker rank %d: %s", rank, reason)
        return WorkerFailed(rank, reason)

    def _collect(self, timeout: float) -> list[_Failure]:
        """Waits for messages and exits (at most `timeout` seconds); returns the failures among them."""
        waitables: list[Any] = [w.reader for w in self.workers if w.reader is not None]
        waitables += [w.process.sentinel for w in self.workers if not w.exited]
        ready = multiprocessing.connection.wait(waitables, timeout=timeout)
        failures: list[_Failure] = []
        for worker in self.workers:
            if worker.reader is not None and worker.reader in ready:
                failures += self._drain(worker)
        for worker in self.workers:
            # The exit code (waitpid) is the truth; the sentinel wakes us sooner, but a descendant
            # that inherited its pipe can hold it open (torch_shm_manager, exec'd from C++).
            if not worker.exited and (worker.process.sentinel in ready or worker.process.exitcode is not None):
                worker.exited = True
                failures += self._drain(worker)  # what it sent just before exiting
                if not worker.has_result and not worker.failed:
                    worker.process.join()
                    code, rank = worker.process.exitcode, worker.context.rank
                    reason = f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"
                    logger.error("worker rank %d %s without reporting a result", rank, reason)
                    failures.append((0, time.time(), rank, WorkerFailed(rank, reason)))
        return failures

    def _drain(self, worker: _Worker) -> list[_Failure]:
        """Reads every message the worker has sent so far; returns its reported error, if any."""
        errors: list[_Failure] = []
        rank = worker.context.rank
        try:
            while worker.reader is not None and worker.reader.poll(0):
                kind, *body = worker.reader.recv()
                elapsed = time.monotonic() - worker.spawned_at
                if kind == "started":
                    worker.started = True
                    logger.info("worker rank %d started (pid %d) after %.1f s", rank, body[0], elapsed)
                elif kind == "resource":
                    worker_resources.follow(self.resources, *body)
                elif kind == "result":
                    worker.has_result, worker.result = True, body[0]
                    logger.info("worker rank %d finished after %.1f s", rank, elapsed)
                else:
                    at, summary, worker_traceback = body
                    logger.error(
                        "worker rank %d failed after %.1f s:%s",
                        rank,
                        elapsed,
                        f"\n{worker_traceback}" if worker_traceback else f" {summary}",
                    )
                    worker.failed = True
                    errors.append((1, at, rank, WorkerFailed(rank, summary, worker_traceback)))
        except (EOFError, OSError):
            worker.reader.close()  # type: ignore[union-attr]
            worker.reader = None
        return errors

    def _cleanup(self) -> None:
        """Kills every worker and everything they started, and frees what they leaked."""
        leaders = [worker.process.pid for worker in self.workers if worker.process.pid is not None]
        self._record(leaders)
        self._kill(leaders, signal.SIGTERM)
        deadline = time.monotonic() + _KILL_GRACE_S
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        self._kill(leaders, signal.SIGKILL)
        for worker in self.workers:
            worker.process.join()
            worker.process.close()
        self.workers = []  # and with them the pipes, closed as they are collected
        deadline = time.monotonic() + _KILL_GRACE_S
        while self._alive() and time.monotonic() < deadline:  # stragglers outside the groups
            self._kill([], signal.SIGKILL)
            time.sleep(0.05)
        _release_shared_memory(set(self.known), self.shm_before, self.segments_before)
        worker_resources.release(self.resources)
        self.resources = set()

    def _record(self, roots: list[int]) -> None:
        """Remembers the roots' descendants: the process groups miss those that left them."""
        for root in roots:
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(root)
                for member in [process, *process.children(recursive=True)]:
                    self.known.setdefault(member.pid, member.create_time())

    def _alive(self) -> list[psutil.Process]:
        """Recorded processes still running (zombies are dead: another parent's to reap)."""
        alive = []
        for pid, created in self.known.items():
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        return alive

    def _kill(self, leaders: list[int], sig: int) -> None:
        for leader in leaders:  # fails where the group is gone or the child is not yet its leader
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, sig)
        for process in self._alive():
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)


def _release_shared_memory(pids: set[int], shm_before: set[str], segments_before: set[int]) -> None:
    """Frees what our killed processes created: GLT's ShmQueue removes its SysV segment (256 MB by
    default) only in a destructor, so a killed worker leaks it until reboot; torch's file_system
    tensors leak `/dev/shm/torch_<pid>_*`.
    """
    with contextlib.suppress(OSError, KeyError, ValueError):  # no SysV IPC here: nothing to free
        marked = _mark_segments_removed(pids, segments_before)
        # A killed process's leader can read as a zombie while its other threads still hold the
        # memory map, and with it the segment: it goes once they are gone, which we wait for.
        deadline = time.monotonic() + _KILL_GRACE_S
        while (left := marked & set(_segments_by_creator())) and time.monotonic() < deadline:
            time.sleep(0.05)
        for shmid in sorted(left):
            logger.warning("shared-memory segment %s is still attached; the kernel frees it at the last detach", shmid)
    for name in (set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()) - shm_before:
        if (match := re.match(r"torch_(\d+)_", name)) and int(match.group(1)) in pids:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))


def _segments_by_creator() -> dict[int, int]:
    """This user's SysV shared-memory segments: id → creating pid (none where there is no SysV IPC)."""
    if not os.path.exists("/proc/sysvipc/shm"):
        return {}
    with open("/proc/sysvipc/shm") as table:
        header, *rows = [line.split() for line in table]
    column = {name: index for index, name in enumerate(header)}
    uid = os.getuid()
    return {int(row[column["shmid"]]): int(row[column["cpid"]]) for row in rows if int(row[column["uid"]]) == uid}


def _mark_segments_removed(pids: set[int], segments_before: set[int]) -> set[int]:
    """Marks the segments that `pids` created since `segments_before` for removal (IPC_RMID): the
    kernel frees each now if nothing is attached, else at its last detach. Returns their ids."""
    libc = ctypes.CDLL(None, use_errno=True)
    marked = set()
    for shmid, creator in _segments_by_creator().items():
        if creator in pids and shmid not in segments_before and libc.shmctl(shmid, _IPC_RMID, None) == 0:
            marked.add(shmid)
            logger.info("removed shared-memory segment %s that a worker left", shmid)
    return marked
