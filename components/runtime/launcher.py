"""Runs one function in N worker processes (Linux), here or across the replicas of a cluster job.

Each worker gets a `WorkerContext`: its rank and the rendezvous addresses for torch.distributed
(gloo; plus nccl for workers on GPUs) and GLT's RPC. The first worker that raises or dies ends the step within seconds (its peers
are usually blocked in a collective), everything the workers started dies with them, and the caller
gets a `WorkerFailed` naming rank and cause.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import multiprocessing.connection
import os
import pickle
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, TypeVar

import psutil

from components.config.resources import DEFAULT_TIMEOUTS, WorkerTimeouts
from components.errors import GnnflowError
from components.runtime import watchdog, worker_resources
from components.runtime.rendezvous import host_stores, joining_hosted_store

if TYPE_CHECKING:
    from components.storage import OutputStaging

logger = logging.getLogger(__name__)

R = TypeVar("R")

_KILL_GRACE_S = 3.0  # SIGTERM → SIGKILL; short, because a peer's death is never undone
# A Spot VM has 30 s between its preemption notice and its end: workers that stop on SIGTERM
# (train checkpoints mid-epoch) get most of it.
_TERMINATION_GRACE_S = 25.0
_EXIT_GRACE_S = 30.0  # how long a worker that returned its result may take to exit
VERBOSE_ENV = "GNNFLOW_VERBOSE"  # set (by --verbose) to log the traceback of every worker error
_POLL_S = 1.0  # how often the launcher records descendants and checks deadlines
WORKER_MALLOC_ARENAS = "2"  # glibc arenas per worker, unless the environment sets MALLOC_ARENA_MAX itself
_PR_SET_PDEATHSIG = 1
_IPC_RMID = 0


class WorkerFailed(GnnflowError):
    """A worker raised or died and the step was stopped; `traceback` is the worker's, if any."""

    def __init__(self, rank: int, reason: str, worker_traceback: str | None = None) -> None:
        super().__init__(f"worker rank {rank} failed: {reason}")
        self.rank, self.reason, self.traceback = rank, reason, worker_traceback

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.rank, self.reason, self.traceback)


@dataclass(frozen=True)
class WorkerContext:
    """Where one worker process stands in the job; passed as the worker's first argument."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int  # torch.distributed rendezvous (a TCPStore: the launcher's locally, rank 0's on a cluster)
    rpc_port: int  # GLT's RPC rendezvous, likewise
    stores_hosted: bool = False  # the launcher hosts both stores (see components.runtime.rendezvous)
    timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS  # resources.{rendezvous,progress,rpc}_timeout_s

    def init_process_group(self, backend: str = "gloo") -> None:
        """Joins the process group of all workers (blocks until every rank has joined, at most
        ``timeouts.rendezvous_s``, which is also the collectives' timeout).

        ``backend``: gloo, or for workers on GPUs ``cpu:gloo,cuda:nccl`` (components/gnn/device.py).
        """
        import torch.distributed as dist

        address, timeout = f"tcp://{self.master_addr}:{self.master_port}", timedelta(seconds=self.timeouts.rendezvous_s)
        with joining_hosted_store(self.stores_hosted), watchdog.phase("rendezvous"):
            dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=self.world_size, timeout=timeout)

    def init_rpc(self, num_rpc_threads: int) -> None:
        """Joins GLT's RPC (after ``glt.distributed.init_worker_group``), its calls timing out
        after ``timeouts.rpc_s``."""
        import graphlearn_torch as glt

        with joining_hosted_store(self.stores_hosted), watchdog.phase("rendezvous"):
            glt.distributed.init_rpc(
                master_addr=self.master_addr, master_port=self.rpc_port, num_rpc_threads=num_rpc_threads, rpc_timeout=self.timeouts.rpc_s
            )


@dataclass(frozen=True)
class ClusterSpec:
    """This replica's place in a multi-replica job, as the cluster environment describes it."""

    num_replicas: int
    replica_rank: int
    master_addr: str
    master_port: int
    rpc_port: int


def cluster_from_environment(environ: Mapping[str, str] = os.environ) -> ClusterSpec | None:
    """The job this replica belongs to, or None for a local run.

    Vertex AI's `CLUSTER_SPEC` (replicas: the worker pools concatenated in pool order; master:
    workerpool0's first) wins over `MASTER_ADDR`/`MASTER_PORT`/`WORLD_SIZE`/`RANK` (counting
    replicas). GLT's RPC listens on the master port + 1 unless `GNNFLOW_RPC_PORT` says otherwise.
    """
    if environ.get("CLUSTER_SPEC"):
        num_replicas, replica_rank, master_addr, master_port = _parse_cluster_spec(environ["CLUSTER_SPEC"])
    else:
        names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
        present = [name for name in names if environ.get(name)]
        if not present:
            return None
        if missing := [name for name in names if name not in present]:
            raise GnnflowError(f"cluster environment is incomplete: {', '.join(present)} set but {', '.join(missing)} missing")
        master_addr, master_port = environ["MASTER_ADDR"], _integer(environ["MASTER_PORT"], "MASTER_PORT", 1, 65535)
        num_replicas = _integer(environ["WORLD_SIZE"], "WORLD_SIZE", 1)
        replica_rank = _integer(environ["RANK"], "RANK", 0, num_replicas - 1)
    rpc_port = _integer(environ.get("GNNFLOW_RPC_PORT") or str(master_port + 1), "GNNFLOW_RPC_PORT", 1, 65535)
    if rpc_port == master_port:
        raise GnnflowError(f"GNNFLOW_RPC_PORT={rpc_port} must differ from the master port")
    return ClusterSpec(num_replicas, replica_rank, master_addr, master_port, rpc_port)


def _parse_cluster_spec(text: str) -> tuple[int, int, str, int]:
    """(num_replicas, replica_rank, master_addr, master_port) from Vertex AI's CLUSTER_SPEC."""
    try:
        spec = json.loads(text)
        pools, task_type, task_index = spec["cluster"], spec["task"]["type"], int(spec["task"]["index"])
        order = sorted(pools, key=lambda name: int(re.fullmatch(r"workerpool(\d+)", name).group(1)))  # type: ignore[union-attr]
        replicas = [(name, index, address) for name in order for index, address in enumerate(pools[name])]
        replica_rank = next(i for i, (name, index, _) in enumerate(replicas) if (name, index) == (task_type, task_index))
        host, _, port = replicas[0][2].rpartition(":")
        return len(replicas), replica_rank, host.strip("[]"), _integer(port, "the master's port", 1, 65535)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, StopIteration, GnnflowError) as error:
        raise GnnflowError(f"CLUSTER_SPEC is not a valid Vertex AI cluster spec ({type(error).__name__}: {error}): {text[:200]}") from None


def _integer(text: str, name: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise GnnflowError(f"{name}={text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        raise GnnflowError(f"{name}={value} is not in [{low}, {'inf' if high is None else high}]")
    return value


def verbose() -> bool:
    """Whether a worker's expected errors (GnnflowError) are logged with their traceback too."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def launch(
    worker: Callable[..., R],
    args: tuple[Any, ...] = (),
    *,
    world_size: int,
    processes_per_replica: int | None = None,
    environ: Mapping[str, str] = os.environ,
    start_timeout_s: float = 120,
    timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS,
) -> list[R]:
    """Runs `worker(context, *args)` in each worker process of this replica; their results by rank.

    Locally (no cluster environment) this starts `world_size` processes on loopback, even for
    one, so that one worker behaves like many (own GLT/torch.distributed globals, same cleanup).
    On a cluster this replica starts `processes_per_replica` (default `world_size / replicas`)
    and returns their results only. `worker` must be module-level, its arguments and result
    picklable. Raises `WorkerFailed` for the first worker that raises, dies, or is not started
    after `start_timeout_s`, or makes no progress (see components.runtime.watchdog) for
    `timeouts.progress_s` (`timeouts.rendezvous_s` while it waits for its peers to join).
    """
    if world_size < 1:
        raise GnnflowError(f"world_size must be at least 1, got {world_size}")
    cluster = cluster_from_environment(environ)
    stores = []  # referenced until the workers are done: the launcher hosts them locally
    if cluster is None:
        stores = host_stores(2, timeout_s=timeouts.rendezvous_s)
        cluster, per_replica = ClusterSpec(1, 0, "127.0.0.1", stores[0].port, stores[1].port), world_size
    else:
        per_replica = processes_per_replica or world_size // cluster.num_replicas
        if per_replica < 1 or per_replica * cluster.num_replicas != world_size:
            per = processes_per_replica or "world_size / replicas"
            raise GnnflowError(f"world_size {world_size} does not match {cluster.num_replicas} replicas x {per} processes per replica")
    addresses = (cluster.master_addr, cluster.master_port, cluster.rpc_port)
    first = cluster.replica_rank * per_replica
    contexts = [
        WorkerContext(first + local, world_size, local, per_replica, *addresses, bool(stores), timeouts) for local in range(per_replica)
    ]
    logger.info("starting ranks %d-%d of %d; rendezvous %s:%d, RPC port %d", first, contexts[-1].rank, world_size, *addresses)
    # Pickled here, so that a worker the child cannot import fails in its error reporting, not its bootstrap.
    try:
        return _Launch(contexts, pickle.dumps((worker, args)), start_timeout_s).run()
    finally:
        stores.clear()  # the servers stop with their last reference (a raised error's traceback keeps this frame)


def launch_staged(
    staging: OutputStaging,
    worker: Callable[..., R],
    args: tuple[Any, ...] = (),
    *,
    world_size: int,
    processes_per_replica: int | None = None,
    timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS,
) -> R | None:
    """:func:`launch` for workers that write into ``staging``, a new generation of a step's output.

    Returns rank 0's result on the replica that publishes (every local run; replica 0 on a
    cluster) and None on the others. If any worker fails, or returns an exception (a way to end
    the step that is not a failure of the workers), that replica deletes what was staged before
    raising it, so the output published before stays as it was.
    """
    cluster = cluster_from_environment()
    publishes = cluster is None or cluster.replica_rank == 0
    try:
        results = launch(worker, args, world_size=world_size, processes_per_replica=processes_per_replica, timeouts=timeouts)
        if stopped := [result for result in results if isinstance(result, BaseException)]:
            raise stopped[0]  # the workers agreed to end the step without an output (train on SIGTERM)
    except BaseException:
        if publishes:
            staging.abort()
        raise
    return results[0] if publishes else None


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


class _Launch:
    """One launch: this replica's worker processes, watched until all have exited."""

    def __init__(self, contexts: list[WorkerContext], payload: bytes, start_timeout_s: float) -> None:
        self.contexts, self.payload, self.start_timeout_s = contexts, payload, start_timeout_s
        self.workers: list[_Worker] = []
        self.known: dict[int, float] = {}  # pid → start time of every process seen in the workers' trees
        self.resources: set[worker_resources.Resource] = set()  # semaphores etc. the workers registered
        self.shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        self.segments_before = set(_segments_by_creator())
        self.terminated_at: float | None = None  # when this launcher got SIGTERM
        timeouts = contexts[0].timeouts
        self.board = watchdog.ProgressBoard(multiprocessing.get_context("spawn"), len(contexts), timeouts.progress_s, timeouts.rendezvous_s)

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
        # glibc gives every thread that allocates its own arena and keeps freed memory in it; a
        # worker runs dozens of threads (GLT RPC, gloo, sampling), which left about 10% of a
        # trainer's peak RSS as idle arenas (benchmarks/RESULTS.md). Spawned workers read it at start.
        os.environ.setdefault("MALLOC_ARENA_MAX", WORKER_MALLOC_ARENAS)
        spawn = multiprocessing.get_context("spawn")
        for context in self.contexts:
            reader, writer = spawn.Pipe(duplex=False)
            arguments = (self.payload, context, writer, os.getpid(), self.board.array)
            process = spawn.Process(target=_worker_main, args=arguments, name=f"gnnflow-rank-{context.rank}")
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
            if self.terminated_at is not None and (failures or time.monotonic() > self.terminated_at + _TERMINATION_GRACE_S):
                sys.exit(128 + signal.SIGTERM)  # the workers died of it, or took too long
            if failures:
                # A peer's error is often a consequence of a death (gloo: "connection closed by
                # peer") visible by now: look once more, blame deaths first, then the earliest error.
                failures += self._collect(0)
                deadline = time.monotonic() + _ROOT_CAUSE_WAIT_S
                while all(_collateral(f) for f in failures) and (left := deadline - time.monotonic()) > 0:
                    failures += self._collect(left)
                raise min(failures, key=lambda f: (f[0], _collateral(f), *f[1:3]))[3]
            now = time.monotonic()
            if now > start_deadline and (late := [w.context.rank for w in self.workers if not (w.started or w.exited)]):
                raise WorkerFailed(late[0], f"did not start within {self.start_timeout_s:.0f} s")
            running = {w.context.local_rank: w.process.pid for w in self.workers if w.started and not (w.exited or w.has_result)}
            if stall := self.board.stall(running):  # type: ignore[arg-type]
                rank = self.workers[stall.local_rank].context.rank
                reason = watchdog.describe(stall, rank, self.board.host)
                logger.error("worker rank %d: %s", rank, reason)
                raise WorkerFailed(rank, reason)
            if exit_deadline is None and all(worker.has_result for worker in self.workers):
                exit_deadline = now + _EXIT_GRACE_S
            if exit_deadline is not None and now > exit_deadline:
                logger.warning("workers returned but did not exit within %.0f s; killing them", _EXIT_GRACE_S)
                return

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


def _worker_main(payload: bytes, context: WorkerContext, writer: Connection, launcher_pid: int, board: Any) -> None:
    """Entry point of a worker process: isolates it, runs the worker, reports the outcome."""
    os.setpgrp()  # first thing: all this worker starts joins its group, to be killed as one
    for fd in [int(name) for name in os.listdir("/proc/self/fd") if int(name) > 2]:
        with contextlib.suppress(OSError):  # multiprocessing's pipes: exec'd descendants must not hold them open
            os.set_inheritable(fd, False)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the launcher's cleanup must do
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:
        os._exit(1)  # the launcher died before prctl took effect
    # For libraries that read torch's variables (counting processes here, not replicas).
    os.environ.update(MASTER_ADDR=context.master_addr, MASTER_PORT=str(context.master_port), RANK=str(context.rank))
    os.environ.update(WORLD_SIZE=str(context.world_size), LOCAL_RANK=str(context.local_rank))
    lock = threading.Lock()  # resource registrations may come from any thread of the worker

    def send(message: tuple) -> None:
        with lock:
            writer.send(message)

    watchdog.attach(board, context.local_rank)
    send(("started", os.getpid()))
    worker_resources.report_registrations(send)
    from components.runtime.runlog import configure

    configure(prefix=f"[rank {context.rank}] ")
    try:
        worker, args = pickle.loads(payload)
        result = worker(context, *args)
        send(("result", result))
    except BaseException as error:  # SystemExit and KeyboardInterrupt are failures too
        expected = isinstance(error, GnnflowError)  # bad input: the message already says what and where
        summary = str(error) if expected else traceback.format_exception_only(type(error), error)[-1].strip()
        details = None if expected and not verbose() else traceback.format_exc()
        send(("error", time.time(), summary, details))
        sys.stdout.flush()
        sys.stderr.flush()
        # No interpreter teardown: atexit hooks such as RPC shutdown wait for the peers that
        # the launcher is about to kill; what they would free, the launcher frees.
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # No process-group teardown either: gloo's destroy can block on a peer that has already
    # exited (seen under load). Workers end their work with a barrier, so nothing is in flight.
    os._exit(0)
