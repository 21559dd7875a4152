"""Runs one function in N worker processes, here or across the replicas of a cluster job.

Locally a step with `world_size: N` starts N processes on this machine; on Vertex AI each
replica of a CustomJob runs the same entry point, reads its place in the job from the
environment and starts its share of the processes. Each worker gets a `WorkerContext`
with its rank and the rendezvous addresses for torch.distributed (gloo) and GLT's RPC.

Failure is the design centre: the first worker that raises or dies ends the whole step
within seconds (the others are usually blocked in a collective waiting for it), every
process the workers started is killed with them, and the caller gets a `WorkerFailed`
naming the rank and the cause.
"""

from __future__ import annotations

import ctypes
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import psutil

from components.errors import GnnflowError

logger = logging.getLogger(__name__)

R = TypeVar("R")

_KILL_GRACE_S = 3.0  # SIGTERM → SIGKILL; short, because a dead peer is never coming back
_EXIT_GRACE_S = 30.0  # how long a worker that returned its result may take to exit
_SNAPSHOT_EVERY_S = 1.0  # how often descendants are recorded (see _ProcessTree)
_PR_SET_PDEATHSIG = 1
_IPC_RMID = 0


class WorkerFailed(GnnflowError):
    """A worker raised or died; the step was stopped. `traceback` is the worker's, if it had one."""

    def __init__(self, rank: int, reason: str, worker_traceback: str | None = None) -> None:
        super().__init__(f"worker rank {rank} failed: {reason}")
        self.rank = rank
        self.reason = reason
        self.traceback = worker_traceback

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
    master_port: int  # torch.distributed rendezvous (TCPStore hosted by rank 0)
    rpc_port: int  # GLT: glt.distributed.init_rpc(master_addr, rpc_port, ...)

    def init_process_group(self, timeout_s: float = 300) -> None:
        """Joins the gloo process group of all workers (blocks until every rank has joined)."""
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
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

    Vertex AI sets `CLUSTER_SPEC` (replicas are the worker pools concatenated in pool order,
    the master is the first replica of workerpool0); PyTorch-style launchers set
    `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` and `RANK`, counting replicas. `CLUSTER_SPEC`
    wins when both are set. GLT's RPC uses `MASTER_PORT + 1` unless `GNNFLOW_RPC_PORT` says.
    """
    if environ.get("CLUSTER_SPEC"):
        num_replicas, replica_rank, master_addr, master_port = _parse_cluster_spec(environ["CLUSTER_SPEC"])
    else:
        names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
        present = [name for name in names if environ.get(name)]
        if not present:
            return None
        missing = [name for name in names if name not in present]
        if missing:
            raise GnnflowError(f"cluster environment is incomplete: {', '.join(present)} set but {', '.join(missing)} missing")
        master_addr = environ["MASTER_ADDR"]
        master_port = _port(environ["MASTER_PORT"], "MASTER_PORT")
        num_replicas = _integer(environ["WORLD_SIZE"], "WORLD_SIZE", minimum=1)
        replica_rank = _integer(environ["RANK"], "RANK", minimum=0)
        if replica_rank >= num_replicas:
            raise GnnflowError(f"RANK={replica_rank} is not below WORLD_SIZE={num_replicas}")
    rpc_port = _port(environ["GNNFLOW_RPC_PORT"], "GNNFLOW_RPC_PORT") if environ.get("GNNFLOW_RPC_PORT") else master_port + 1
    if rpc_port == master_port or rpc_port > 65535:
        raise GnnflowError(f"the RPC port {rpc_port} must differ from the master port and be at most 65535; set GNNFLOW_RPC_PORT")
    return ClusterSpec(num_replicas, replica_rank, master_addr, master_port, rpc_port)


def _parse_cluster_spec(text: str) -> tuple[int, int, str, int]:
    """(num_replicas, replica_rank, master_addr, master_port) from Vertex AI's CLUSTER_SPEC."""
    try:
        spec = json.loads(text)
        pools = spec["cluster"]
        task_type, task_index = spec["task"]["type"], int(spec["task"]["index"])
        order = sorted(pools, key=lambda name: int(re.fullmatch(r"workerpool(\d+)", name).group(1)))  # type: ignore[union-attr]
        replicas = [(name, index, address) for name in order for index, address in enumerate(pools[name])]
        replica_rank = next(i for i, (name, index, _) in enumerate(replicas) if (name, index) == (task_type, task_index))
        host, _, port = replicas[0][2].rpartition(":")
        return len(replicas), replica_rank, host.strip("[]"), _port(port, "CLUSTER_SPEC master port")
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, StopIteration, GnnflowError) as error:
        raise GnnflowError(f"CLUSTER_SPEC is not a valid Vertex AI cluster spec ({type(error).__name__}: {error}): {text[:200]}") from None


def _integer(text: str, name: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise GnnflowError(f"{name}={text!r} is not an integer") from None
    if value < minimum:
        raise GnnflowError(f"{name}={value} must be at least {minimum}")
    return value


def _port(text: str, name: str) -> int:
    port = _integer(text, name, minimum=1)
    if port > 65535:
        raise GnnflowError(f"{name}={port} is not a TCP port")
    return port


def launch(
    worker: Callable[..., R],
    args: tuple[Any, ...] = (),
    *,
    world_size: int,
    processes_per_replica: int | None = None,
    environ: Mapping[str, str] = os.environ,
    start_timeout_s: float = 120,
) -> list[R]:
    """Runs `worker(context, *args)` in every worker process of this replica; their results by rank.

    Locally (no cluster environment) this starts `world_size` processes on loopback with
    free ports, even for `world_size == 1`, so that one worker behaves like many (its own
    GLT/torch.distributed globals, the same cleanup). On a cluster this replica starts
    `processes_per_replica` processes (default: `world_size / replicas`; the product must be
    `world_size`) and returns only their results. `worker` must be importable (a module-level
    function), and its arguments and result picklable. Raises `WorkerFailed` on the first
    worker that raises, dies, or does not start within `start_timeout_s`.
    """
    cluster = cluster_from_environment(environ)
    if world_size < 1:
        raise GnnflowError(f"world_size must be at least 1, got {world_size}")
    if cluster is None:
        master_port, rpc_port = _free_ports(2)
        cluster, per_replica = ClusterSpec(1, 0, "127.0.0.1", master_port, rpc_port), world_size
    else:
        per_replica = processes_per_replica or world_size // cluster.num_replicas
        if per_replica < 1 or per_replica * cluster.num_replicas != world_size:
            raise GnnflowError(
                f"world_size {world_size} does not match {cluster.num_replicas} replicas"
                f" x {processes_per_replica or 'world_size / replicas'} processes per replica"
            )
    contexts = [
        WorkerContext(
            rank=cluster.replica_rank * per_replica + local_rank, world_size=world_size,
            local_rank=local_rank, local_world_size=per_replica,
            master_addr=cluster.master_addr, master_port=cluster.master_port, rpc_port=cluster.rpc_port,
        )
        for local_rank in range(per_replica)
    ]  # fmt: skip
    logger.info(
        "starting %d worker(s), ranks %d-%d of %d; rendezvous %s:%d, RPC port %d",
        per_replica, contexts[0].rank, contexts[-1].rank, world_size, cluster.master_addr, cluster.master_port, cluster.rpc_port,
    )  # fmt: skip
    # Pickled here rather than by multiprocessing so that an unimportable worker fails in
    # the child's own error handling (reported with its traceback), not in its bootstrap.
    payload = pickle.dumps((worker, args))
    return _Run(contexts, payload, start_timeout_s).run()


def _free_ports(count: int) -> list[int]:
    """Distinct loopback ports nobody listens on now (held together so they differ)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class _ParentTerminated(BaseException):
    """SIGTERM reached the launcher; unwinds it through the cleanup of its workers."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _ParentTerminated()


class _Run:
    """One launch: the worker processes of this replica, watched until all have exited."""

    def __init__(self, contexts: list[WorkerContext], payload: bytes, start_timeout_s: float) -> None:
        self.contexts = contexts
        self.payload = payload
        self.start_timeout_s = start_timeout_s
        self.processes: dict[int, multiprocessing.process.BaseProcess] = {}
        self.readers: dict[int, Connection] = {}
        self.started_at: dict[int, float] = {}
        self.results: dict[int, Any] = {}
        self.exited: set[int] = set()
        self.failed: set[int] = set()  # ranks that reported an exception
        self.tree = _ProcessTree()
        self.shm_before = _dev_shm_names()

    def run(self) -> list[Any]:
        """Starts the workers and watches them; cleans up on every way out, signals included."""
        own_sigterm = _install_sigterm_handler()
        terminated = False
        try:
            self._start()
            self._watch()
            return [self.results[context.rank] for context in self.contexts]
        except _ParentTerminated:
            terminated = True
            raise SystemExit(128 + signal.SIGTERM) from None
        finally:
            # Blocked so that a second Ctrl-C or SIGTERM cannot cut the cleanup short; one
            # that arrives meanwhile is delivered after it, to the handler restored here.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                self._cleanup()
            finally:
                if own_sigterm:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            if terminated:
                signal.raise_signal(signal.SIGTERM)  # die as the signal asked, now that workers are gone

    def _start(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        for context in self.contexts:
            reader, writer = spawn.Pipe(duplex=False)
            process = spawn.Process(
                target=_worker_main, args=(self.payload, context, writer, os.getpid()), name=f"gnnflow-rank-{context.rank}"
            )
            self.started_at[context.rank] = time.monotonic()
            process.start()
            writer.close()  # the child holds the only write end, so its death reads as EOF here
            self.processes[context.rank], self.readers[context.rank] = process, reader

    def _watch(self) -> None:
        """Returns once every worker reported a result and exited; raises on the first failure."""
        start_deadline = time.monotonic() + self.start_timeout_s
        exit_deadline: float | None = None
        next_snapshot = 0.0
        reported: set[int] = set()  # ranks that sent their "started" message
        while len(self.exited) < len(self.processes):
            if time.monotonic() >= next_snapshot:
                self.tree.record(self._live_pids())
                next_snapshot = time.monotonic() + _SNAPSHOT_EVERY_S
            deaths, errors = self._collect(self._wait(_SNAPSHOT_EVERY_S), reported)
            if deaths or errors:
                # A peer's error is often only a consequence of a death (gloo: "connection
                # closed by peer"); that death is visible by now, so look once more and blame
                # silent deaths first, then the earliest error.
                more_deaths, more_errors = self._collect(self._wait(0), reported)
                errors = sorted(errors + more_errors, key=lambda item: item[0])
                raise (deaths + more_deaths + [failure for _, failure in errors])[0]
            now = time.monotonic()
            late = [rank for rank in self.processes if rank not in reported and rank not in self.exited]
            if late and now > start_deadline:
                raise WorkerFailed(late[0], f"did not start within {self.start_timeout_s:.0f} s")
            if len(self.results) == len(self.processes) and exit_deadline is None:
                exit_deadline = now + _EXIT_GRACE_S
            if exit_deadline is not None and now > exit_deadline:
                logger.warning("worker(s) returned but did not exit within %.0f s; killing them", _EXIT_GRACE_S)
                return

    def _wait(self, timeout: float) -> list[Any]:
        waitables: list[Any] = list(self.readers.values())
        waitables += [p.sentinel for rank, p in self.processes.items() if rank not in self.exited]
        return multiprocessing.connection.wait(waitables, timeout=timeout)

    def _collect(self, ready: list[Any], reported: set[int]) -> tuple[list[WorkerFailed], list[tuple[float, WorkerFailed]]]:
        """Handles messages and exits: (silent deaths, (time, reported error) pairs)."""
        deaths: list[WorkerFailed] = []
        errors: list[tuple[float, WorkerFailed]] = []
        for rank, reader in list(self.readers.items()):
            if reader in ready:
                self._drain(rank, reported, errors)
        for rank, process in self.processes.items():
            if process.sentinel in ready and rank not in self.exited:
                self.exited.add(rank)
                self._drain(rank, reported, errors)  # what it sent just before exiting
                if rank not in self.results and rank not in self.failed:
                    process.join()
                    deaths.append(WorkerFailed(rank, _describe_exit(process.exitcode)))
                    logger.error("worker rank %d %s", rank, deaths[-1].reason)
        return deaths, errors

    def _drain(self, rank: int, reported: set[int], errors: list[tuple[float, WorkerFailed]]) -> None:
        reader = self.readers.get(rank)
        try:
            while reader is not None and reader.poll(0):
                kind, *body = reader.recv()
                elapsed = time.monotonic() - self.started_at[rank]
                if kind == "started":
                    reported.add(rank)
                    logger.info("worker rank %d started (pid %d) after %.1f s", rank, body[0], elapsed)
                elif kind == "result":
                    self.results[rank] = body[0]
                    logger.info("worker rank %d finished after %.1f s", rank, elapsed)
                else:
                    at, summary, worker_traceback = body
                    logger.error("worker rank %d failed after %.1f s:\n%s", rank, elapsed, worker_traceback)
                    errors.append((at, WorkerFailed(rank, summary, worker_traceback)))
                    self.failed.add(rank)
        except (EOFError, OSError):
            reader.close()  # type: ignore[union-attr]
            del self.readers[rank]

    def _live_pids(self) -> list[int]:
        return [p.pid for rank, p in self.processes.items() if rank not in self.exited and p.pid is not None]

    def _cleanup(self) -> None:
        """Kills every worker and everything they started; frees what they leaked. Idempotent."""
        pids = [p.pid for p in self.processes.values() if p.pid is not None]
        self.tree.record(pids)
        self.tree.kill(pids, signal.SIGTERM)
        deadline = time.monotonic() + _KILL_GRACE_S
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
        self.tree.kill(pids, signal.SIGKILL)
        for process in self.processes.values():
            process.join()
            process.close()
        self.processes.clear()
        self.exited.clear()
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()
        self.tree.wait_gone()
        _release_shared_memory(self.tree.all_pids(), self.shm_before)


def _install_sigterm_handler() -> bool:
    """Turns SIGTERM into an exception (so workers are cleaned up) where nobody else handles it."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False  # the host's own handler decides; its exception unwinds through cleanup
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode} without reporting a result"


class _ProcessTree:
    """Every process the workers started, recorded while alive so none escapes the kill.

    Workers lead their own process group, which catches descendants that stay in it; the
    recorded (pid, start time) pairs also catch those that left it or were reparented.
    """

    def __init__(self) -> None:
        self.known: dict[int, float] = {}

    def record(self, roots: list[int]) -> None:
        for root in roots:
            try:
                process = psutil.Process(root)
                for member in [process, *process.children(recursive=True)]:
                    self.known.setdefault(member.pid, member.create_time())
            except psutil.Error:
                continue

    def _alive(self) -> list[psutil.Process]:
        alive = []
        for pid, created in self.known.items():
            try:
                process = psutil.Process(pid)
                if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.Error:
                continue
        return alive

    def kill(self, leaders: list[int], sig: int) -> None:
        for leader in leaders:
            try:
                os.killpg(leader, sig)
            except (ProcessLookupError, PermissionError):
                pass  # group gone, or the child has not reached os.setpgrp() yet: killed below
        for process in self._alive():
            try:
                process.send_signal(sig)
            except psutil.Error:
                pass

    def wait_gone(self) -> None:
        """Kills stragglers and waits until they are gone (or zombies: not ours to reap)."""
        deadline = time.monotonic() + _KILL_GRACE_S
        while (remaining := self._alive()) and time.monotonic() < deadline:
            for process in remaining:
                try:
                    process.kill()
                except psutil.Error:
                    pass
            time.sleep(0.05)

    def all_pids(self) -> set[int]:
        return set(self.known)


def _dev_shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _release_shared_memory(pids: set[int], shm_before: set[str]) -> None:
    """Frees shared memory that killed workers could not: GLT's SysV segments, torch's shm files.

    GLT's ShmQueue removes its SysV segment only in a destructor, so a killed worker leaks it
    (256 MB by default) until reboot; torch's file_system tensors leak `/dev/shm/torch_<pid>_*`.
    Only what our own processes created, and nobody still has attached, is removed.
    """
    try:
        with open("/proc/sysvipc/shm") as table:
            header, *rows = [line.split() for line in table]
        column = {name: index for index, name in enumerate(header)}
        libc = ctypes.CDLL(None, use_errno=True)
        for row in rows:
            if int(row[column["cpid"]]) in pids and row[column["nattch"]] == "0" and int(row[column["uid"]]) == os.getuid():
                libc.shmctl(int(row[column["shmid"]]), _IPC_RMID, None)
                logger.info("removed a shared-memory segment (shmid %s) left by a worker", row[column["shmid"]])
    except (OSError, KeyError, ValueError):
        pass  # not Linux, or no SysV IPC here: nothing of ours to free
    for name in _dev_shm_names() - shm_before:
        match = re.match(r"torch_(\d+)_", name)
        if match and int(match.group(1)) in pids:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def _worker_main(payload: bytes, context: WorkerContext, writer: Connection, launcher_pid: int) -> None:
    """Entry point of a worker process: isolates it, runs the worker, reports the outcome."""
    os.setpgrp()  # first: everything this worker starts joins its group, killed as one
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux; the launcher still kills its workers on every way out it controls
    if os.getppid() != launcher_pid:
        os._exit(1)  # the launcher died before prctl took effect
    os.environ.update(
        MASTER_ADDR=context.master_addr, MASTER_PORT=str(context.master_port),
        WORLD_SIZE=str(context.world_size), RANK=str(context.rank),
        LOCAL_RANK=str(context.local_rank), LOCAL_WORLD_SIZE=str(context.local_world_size),
    )  # fmt: skip
    writer.send(("started", os.getpid()))
    try:
        worker, args = pickle.loads(payload)
        result = worker(context, *args)
        writer.send(("result", result))
    except BaseException as error:  # noqa: BLE001 — SystemExit and KeyboardInterrupt are failures too
        summary = traceback.format_exception_only(type(error), error)[-1].strip()
        writer.send(("error", time.time(), summary, traceback.format_exc()))
        writer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        # No interpreter teardown: atexit hooks such as RPC shutdown wait for peers that the
        # launcher is about to kill; what they would free, the launcher frees.
        os._exit(1)
    _destroy_process_group()
    writer.close()


def _destroy_process_group() -> None:
    """Leaves torch.distributed cleanly when the worker joined it (without importing torch otherwise)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
