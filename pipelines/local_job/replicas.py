"""The replicas of a CustomJob on this machine: as Vertex AI starts them, as processes or containers.

Each replica gets what Vertex AI gives one: ``CLUSTER_SPEC`` (every pool's addresses, its own
pool and index, the job), ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR`` and
``AIP_TENSORBOARD_LOG_DIR`` under the job's base output directory, and the pool's container
command and args with the executor input substituted. Rendezvous comes from ``CLUSTER_SPEC``
alone: the steps' launcher takes workerpool0's first address as the master. As on Vertex AI,
only workerpool0 writes the task's executor output, and the job fails with its first failed
replica, which stops the others.
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
from pipelines.local_job.spec import JobTask

log = logging.getLogger("gnnflow.local_job")

_TAIL_LINES = 30  # of a failed replica's log, in the error
_STOP_GRACE_S = 10.0


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


def run_replicas(runtime: Runtime, replicas: Sequence[Replica], timeout_s: float | None) -> None:
    """Starts every replica, streams their logs (prefixed with their names), and waits for all.

    Raises:
        GnnflowError: for the first replica that exits non-zero (the others are stopped), or
            when the job runs past ``timeout_s``; the message holds the replica's last lines.
    """
    running: list[_Running] = []
    try:
        for replica in replicas:
            entry = _Running(replica, runtime.start(replica))
            entry.reader = threading.Thread(target=_pump, args=(entry,), daemon=True)
            entry.reader.start()
            running.append(entry)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while any(entry.process.poll() is None for entry in running):
            failed = [entry for entry in running if entry.process.returncode not in (None, 0)]
            if failed:
                raise _failure(failed[0], f"exited with code {failed[0].process.returncode}")
            if deadline is not None and time.monotonic() > deadline:
                late = next(entry for entry in running if entry.process.poll() is None)
                raise _failure(late, f"was still running after the job's timeout of {timeout_s:.0f} s")
            time.sleep(0.2)
        failed = [entry for entry in running if entry.process.returncode != 0]
        if failed:
            raise _failure(failed[0], f"exited with code {failed[0].process.returncode}")
    finally:
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
        print(f"[{entry.replica.name}] {line}", flush=True)


def _failure(entry: _Running, what: str) -> GnnflowError:
    if entry.reader is not None:
        entry.reader.join(2.0)  # its last lines
    lines = "\n".join(f"  {line}" for line in entry.tail)
    return GnnflowError(f"replica {entry.replica.name} {what}; its last lines:\n{lines}")
