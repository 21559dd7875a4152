"""The replicas of a CustomJob on this machine: as Vertex AI starts them, as processes or containers.

Each replica gets what Vertex AI gives one: ``CLUSTER_SPEC`` (every pool's addresses, its own
pool and index, the job), ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR`` and
``AIP_TENSORBOARD_LOG_DIR`` under the job's base output directory, and the pool's container
command and args with the executor input substituted. Rendezvous comes from ``CLUSTER_SPEC``
alone: the steps' launcher takes workerpool0's first address as the master. As on Vertex AI,
only workerpool0 writes the task's executor output, and the job fails with its first failed
replica, which stops the others. On SIGTERM the replicas get SIGTERM too, as Vertex AI sends it
to each replica's container (:mod:`pipelines.local_job.termination`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from components.errors import GnnflowError
from components.runtime.exit_status import EXIT_PREEMPTED
from pipelines.local_job import termination
from pipelines.local_job.spec import JobTask

log = logging.getLogger("gnnflow.local_job")

_TAIL_LINES = 30  # of a failed replica's log, in the error
_STOP_GRACE_S = 10.0
# One reader thread per replica prints its lines; print() writes a line and its newline in two
# calls, so without one lock and one write two replicas' lines could run into each other.
_OUTPUT_LOCK = threading.Lock()


@dataclass(frozen=True)
class Replica:
    """One replica to start: its place in the job, its argv and the environment Vertex AI sets."""

    pool: str
    index: int
    host: str  # how its peers address it (CLUSTER_SPEC)
    argv: tuple[str, ...]
    environment: dict[str, str]
    image: str

    @property
    def name(self) -> str:
        return f"{self.pool}-{self.index}"


def vertex_environment(job: JobTask, cluster: dict[str, list[str]], pool: str, index: int, base_output: str) -> dict[str, str]:
    """The variables Vertex AI sets in a replica of ``job`` (``base_output``: its base output directory)."""
    spec = {"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": index}, "job": job.job_spec()}
    base = base_output.rstrip("/")
    return {
        "CLUSTER_SPEC": json.dumps(spec),
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
    }


@dataclass
class _Running:
    replica: Replica
    process: subprocess.Popen
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_TAIL_LINES))
    reader: threading.Thread | None = None


class ProcessReplicas:
    """Replicas as processes of this machine, on loopback; ``python3`` in their command is this interpreter."""

    def hosts(self, names: Sequence[str], ports: Sequence[int]) -> list[str]:
        return [f"127.0.0.1:{port}" for port in ports]

    def start(self, replica: Replica) -> subprocess.Popen:
        path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
        environment = {**os.environ, "PATH": path, **replica.environment}
        # A session of its own: the pool's command is a shell running the executor, and stopping
        # a replica must reach the step's launcher (which stops its workers), not only the shell.
        return subprocess.Popen(
            replica.argv, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True
        )

    def stop(self, replica: Replica, process: subprocess.Popen, force: bool = False) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL if force else signal.SIGTERM)

    def terminate(self, replica: Replica, process: subprocess.Popen) -> None:
        """SIGTERM as Vertex AI sends it: to the replica's first process (a container's PID 1,
        the step's executor), which passes it on to its workers itself."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)

    def close(self) -> None:
        pass


@dataclass
class ContainerReplicas:
    """Replicas as containers of the step image on one network of their own (podman or docker).

    Each container gets the stated ``/dev/shm`` size and ulimits, a writable ``/gcs`` (where
    Vertex AI mounts Cloud Storage and KFP's executor makes its folders), the variables of
    ``passed_environment``, and ``exchange`` (a host folder) mounted at the same path, where
    workerpool0 writes the task's executor output.
    """

    engine: str
    network: str
    exchange: str
    shm_size: str = "2g"
    ulimits: tuple[str, ...] = ("nofile=4096:4096", "nproc=4096:4096")
    passed_environment: dict[str, str] = field(default_factory=dict)
    created: bool = False

    def hosts(self, names: Sequence[str], ports: Sequence[int]) -> list[str]:
        self._run("network", "create", self.network)
        self.created = True
        return [f"{name}:2222" for name in names]  # as on Vertex AI: a host name per replica, port 2222

    def start(self, replica: Replica) -> subprocess.Popen:
        host = replica.host.rpartition(":")[0]
        command = [self.engine, "run", "--rm", "--name", self._container(replica), "--network", self.network]
        command += ["--hostname", host, "--network-alias", host, "--shm-size", self.shm_size]
        command += [option for limit in self.ulimits for option in ("--ulimit", limit)]
        command += ["--tmpfs", "/gcs:rw,mode=1777", "--volume", f"{self.exchange}:{self.exchange}:rw"]
        for name, value in {**self.passed_environment, **replica.environment}.items():
            command += ["--env", f"{name}={value}"]
        command += ["--entrypoint", replica.argv[0], replica.image, *replica.argv[1:]]
        log.info("%s: %s", replica.name, shlex.join([c if len(c) < 200 else c[:60] + "..." for c in command]))
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def stop(self, replica: Replica, process: subprocess.Popen, force: bool = False) -> None:
        signal_name = "KILL" if force else "TERM"
        subprocess.run([self.engine, "kill", "--signal", signal_name, self._container(replica)], capture_output=True, check=False)

    def terminate(self, replica: Replica, process: subprocess.Popen) -> None:
        """SIGTERM to the container's PID 1 (the step's executor), as Vertex AI sends it."""
        self.stop(replica, process)

    def close(self) -> None:
        if self.created:
            subprocess.run([self.engine, "network", "rm", "-f", self.network], capture_output=True, check=False)

    def _container(self, replica: Replica) -> str:
        return f"{self.network}-{replica.name}"

    def _run(self, *args: str) -> None:
        result = subprocess.run([self.engine, *args], capture_output=True, text=True, check=False)
        if result.returncode:
            raise GnnflowError(f"{self.engine} {' '.join(args)} failed: {result.stderr.strip()[-500:]}")


Runtime = ProcessReplicas | ContainerReplicas


def run_replicas(
    runtime: Runtime,
    replicas: Sequence[Replica],
    timeout_s: float | None,
    *,
    label: str = "local-job",
    grace_s: float = termination.DEFAULT_GRACE_S,
) -> None:
    """Starts every replica, streams their logs (prefixed with their names), and waits for all.

    On SIGTERM (main thread), passes it to every replica and waits ``grace_s`` for them (see
    :mod:`pipelines.local_job.termination`); returns only if they all finished regardless.

    Raises:
        GnnflowError: for the first replica that exits non-zero (the others are stopped), or
            when the job runs past ``timeout_s``; the message holds the replica's last lines.
        termination.ReplicasStopped: after a SIGTERM; its ``exit_code`` is the job's status
            (75 when the replicas were preempted).
    """
    running: list[_Running] = []
    with termination.sigterm_requests() as sigterm:
        try:
            for replica in replicas:
                entry = _Running(replica, runtime.start(replica))
                entry.reader = threading.Thread(target=_pump, args=(entry,), daemon=True)
                entry.reader.start()
                running.append(entry)
            _wait(running, timeout_s, sigterm)
            if sigterm.requested:
                _terminate(runtime, running, label, grace_s, sigterm)
        finally:
            _stop_all(runtime, running)


def _wait(running: list[_Running], timeout_s: float | None, sigterm: termination.SigtermRequests) -> None:
    """Until every replica exited 0, one failed, the timeout or a SIGTERM."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not _all_exited(running) and not sigterm.requested:
        failed = [entry for entry in running if entry.process.returncode not in (None, 0)]
        if failed:
            raise _failure(failed[0], f"exited with code {failed[0].process.returncode}")
        if deadline is not None and time.monotonic() > deadline:
            late = next(entry for entry in running if entry.process.poll() is None)
            raise _failure(late, f"was still running after the job's timeout of {timeout_s:.0f} s")
        sigterm.event.wait(0.2)
    failed = [entry for entry in running if entry.process.returncode != 0]
    if failed and not sigterm.requested:
        raise _failure(failed[0], f"exited with code {failed[0].process.returncode}")


def _all_exited(entries: list[_Running]) -> bool:
    """Polls every one (``any`` over ``poll()`` would stop at the first still running, and a
    later replica's failure would go unseen while an earlier one waits for it)."""
    return all([entry.process.poll() is not None for entry in entries])  # noqa: C419


def _terminate(runtime: Runtime, running: list[_Running], label: str, grace_s: float, sigterm: termination.SigtermRequests) -> None:
    """SIGTERM to each replica still running, at most ``grace_s`` to exit, then the kill; raises
    with the job's status unless every replica exited 0."""
    alive = [entry for entry in running if entry.process.poll() is None]
    _say(f"{label}: SIGTERM: passed on to {len(alive)} running replica(s), which have {grace_s:g} s to exit")
    for entry in alive:
        runtime.terminate(entry.replica, entry.process)
    deadline, received = time.monotonic() + grace_s, sigterm.count
    while not _all_exited(alive) and time.monotonic() < deadline and sigterm.count == received:
        time.sleep(0.1)  # another SIGTERM from now on: kill at once
    killed = [entry for entry in alive if entry.process.poll() is None]
    for entry in killed:
        runtime.stop(entry.replica, entry.process, force=True)
        entry.process.kill()
        entry.process.wait()
    exits = {entry.replica.name: termination.status(entry.process.returncode) for entry in running}
    end = termination.outcome(label, exits, [entry.replica.name for entry in killed], grace_s)
    if end.status:
        raise termination.ReplicasStopped(end.message, end.status)
    _say(end.message)


def _stop_all(runtime: Runtime, running: list[_Running]) -> None:
    """Stops the replicas still running (SIGTERM, then the kill); closes ``runtime``."""
    for entry in running:
        if entry.process.poll() is None:
            runtime.stop(entry.replica, entry.process)
    for entry in running:
        try:
            entry.process.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            runtime.stop(entry.replica, entry.process, force=True)
            entry.process.kill()
            entry.process.wait()
        if entry.reader is not None:
            entry.reader.join(_STOP_GRACE_S)
    runtime.close()


def _pump(entry: _Running) -> None:
    assert entry.process.stdout is not None
    for line in entry.process.stdout:
        line = line.rstrip("\n")
        entry.tail.append(line)
        _say(f"[{entry.replica.name}] {line}")


def _say(line: str) -> None:
    """Prints ``line`` whole, never into the middle of a replica's line."""
    with _OUTPUT_LOCK:
        sys.stdout.write(f"{line}\n")
        sys.stdout.flush()


def _failure(entry: _Running, what: str) -> GnnflowError:
    """The job's error for ``entry``: a replica preempted by a SIGTERM of its own (as Vertex AI
    sends each container) makes it exit 75 too, any other failure 2."""
    if entry.reader is not None:
        entry.reader.join(2.0)  # its last lines
    lines = "\n".join(f"  {line}" for line in entry.tail)
    if entry.process.returncode == EXIT_PREEMPTED:
        what += " (preempted: rerun to resume from the checkpoint)"
        return termination.ReplicasStopped(f"replica {entry.replica.name} {what}; its last lines:\n{lines}", EXIT_PREEMPTED)
    return GnnflowError(f"replica {entry.replica.name} {what}; its last lines:\n{lines}")
