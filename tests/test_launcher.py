"""The multi-worker launcher, with real processes and gloo on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from components.config.resources import WorkerTimeouts
from components.errors import GnnflowError
from components.runtime.launcher import ClusterSpec, WorkerFailed, cluster_from_environment, launch
from tests.launcher_workers import all_reduce_rank, fail_or_wait, glt_rpc_round

pytestmark = pytest.mark.multiworker

LOCAL: dict[str, str] = {}  # an environment with no cluster variables: a local run
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_NOT_WORKERS = ("resource_tracker", "fake-gcs-server", "bqemulator")


def _fork_server(process: psutil.Process) -> bool:
    """The launcher's fork server (it lives as long as the launcher), not a worker forked from it."""
    return "multiprocessing.forkserver" in " ".join(process.cmdline()) and not process.name().startswith("gnnflow-rank")


def _children() -> list[psutil.Process]:
    """This process's descendants, less those no worker started.

    Multiprocessing's resource tracker and the launcher's fork server are started once per
    process and live as long as it does; the session's GCS and BigQuery emulators belong to the test session.
    Processes that are gone, or dead and not yet reaped (zombies), are not running: not counted.
    """
    running = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not any(n in " ".join(child.cmdline()) for n in _NOT_WORKERS):
                if not _fork_server(child):
                    running.append(child)
        except psutil.NoSuchProcess:  # ZombieProcess included
            pass
    return running


def worker_processes(launcher_pid: int) -> list[psutil.Process]:
    """The worker processes of a launcher, by rank (each names itself gnnflow-rank-N)."""
    workers = []
    for process in psutil.Process(launcher_pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.name().startswith("gnnflow-rank-"):
                workers.append(process)
    return sorted(workers, key=lambda process: int(process.name().rsplit("-", 1)[1]))


def _new_shm_files(before: set[str]) -> set[str]:
    """Files new in /dev/shm, less multiprocessing's named semaphores ('sem.mp-*').

    Under 'spawn' those live in /dev/shm until the creating process's resource tracker unlinks
    them, and other test runs on this machine create and drop them all the time; the workers
    here create none.
    """
    return {name for name in set(os.listdir("/dev/shm")) - before if not name.startswith("sem.mp-")}


def _sysv_segments() -> set[int]:
    """Ids of the SysV shared-memory segments that exist now."""
    with open("/proc/sysvipc/shm") as table:
        return {int(line.split()[1]) for line in list(table)[1:]}


def test_two_workers_all_reduce_and_return_results_by_rank(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    results = launch(all_reduce_rank, (), world_size=2, environ=LOCAL)

    # Workers run with few glibc arenas (their idle per-thread arenas were ~10% of a trainer's peak).
    assert results == [
        {"rank": 0, "world_size": 2, "sum": 3, "malloc_arenas": "2"},
        {"rank": 1, "world_size": 2, "sum": 3, "malloc_arenas": "2"},
    ]


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        ("raise", ["rank 1", "ValueError", "boom"]),
        ("sigkill", ["rank 1", "killed by signal SIGKILL"]),
        ("exit", ["rank 1", "exited with code 3"]),
    ],
)
def test_a_failed_worker_stops_the_step_and_leaves_nothing_behind(failure: str, expected: list[str], tmp_path: Path) -> None:
    shm_before = set(os.listdir("/dev/shm"))

    with pytest.raises(WorkerFailed) as raised:
        launch(fail_or_wait, (failure, str(tmp_path)), world_size=2, environ=LOCAL)

    # Stopped by the failure itself, not by rank 0's collective timing out waiting for it.
    assert "timed out" not in str(raised.value).lower()
    for text in expected:
        assert text in str(raised.value)
    assert raised.value.rank == 1
    if failure == "raise":
        assert raised.value.traceback is not None and "fail_or_wait" in raised.value.traceback
    # Nothing survives: not the rank blocked in the barrier, not the grandchildren.
    assert _children() == []
    facts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for fact in facts:
        assert not psutil.pid_exists(fact["grandchild"]) or psutil.Process(fact["grandchild"]).status() == "zombie"
    # Both ports can be listened on again (with SO_REUSEADDR, as TCPStore and RPC servers do:
    # the closed connections of the killed store may sit in TIME_WAIT for a minute).
    for port in (facts[0]["master_port"], facts[0]["rpc_port"]):
        assert [c for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.status == "LISTEN"] == []
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
    assert all(fact["shm_files"] for fact in facts)  # the check below is not vacuous
    assert _new_shm_files(shm_before) == set()
    # The workers' SysV segments (GLT's queues are such) are freed, though their owners were killed.
    assert {fact["shmid"] for fact in facts} & _sysv_segments() == set()


def test_glt_rpc_runs_beside_gloo_and_a_failure_while_it_is_up_stops_the_step() -> None:
    """GLT's RPC on the second port works (the all-gather), and its agents die with the step.

    (The success path, with `shutdown_rpc`, costs another ~10 s of GLT imports; the same
    worker with `fail=False` returns [[0, 1], [0, 1]].)
    """
    pytest.importorskip("graphlearn_torch")

    with pytest.raises(WorkerFailed, match=r"rank 1 failed: RuntimeError: .* gathered ranks \[0, 1\]"):
        launch(glt_rpc_round, (True,), world_size=2, environ=LOCAL)
    assert _children() == []


def _python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("inherited_sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_launcher_kills_its_workers_and_dies_of_the_signal(
    sig: signal.Signals, inherited_sigint: signal.Handlers, tmp_path: Path
) -> None:
    """The launcher's SIGINT disposition is set here, not inherited from however pytest was
    started: a background job of a non-interactive shell inherits SIGINT as ignored, and the
    launcher must still stop on an explicit SIGINT."""
    command = [sys.executable, "-m", "tests.launcher_workers", "hang", str(tmp_path)]
    launcher = subprocess.Popen(
        command,
        cwd=REPO,
        env=_python_env(),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited_sigint),
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank*.json"))) < 2 and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.1)
    facts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]

    launcher.send_signal(sig)
    stderr = launcher.communicate(timeout=30)[1]

    # SIGTERM: SystemExit(143) after cleanup; SIGINT: KeyboardInterrupt, which Python exits with as the signal.
    assert launcher.returncode == (128 + sig if sig == signal.SIGTERM else -sig), stderr
    pids = [fact[key] for fact in facts for key in ("pid", "grandchild")]
    time.sleep(0.2)  # killed grandchildren are reparented to init, which reaps them soon after
    assert [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"] == []


def test_cluster_spec_places_this_replica_in_the_concatenated_pools() -> None:
    spec = {
        "cluster": {
            "workerpool0": ["chief-0:2222"],
            "workerpool1": ["worker-0:2222", "worker-1:2222", "worker-2:2222"],
        },
        "environment": "cloud",
        "task": {"type": "workerpool1", "index": 1, "trial": ""},
    }

    cluster = cluster_from_environment({"CLUSTER_SPEC": json.dumps(spec)})

    assert cluster == ClusterSpec(num_replicas=4, replica_rank=2, master_addr="chief-0", master_port=2222, rpc_port=2223)


def test_cluster_spec_chief_is_rank_zero_and_rpc_port_can_be_set() -> None:
    spec = {"cluster": {"workerpool0": ["chief-0:2222"], "workerpool1": ["w-0:2222"]}, "task": {"type": "workerpool0", "index": 0}}

    cluster = cluster_from_environment({"CLUSTER_SPEC": json.dumps(spec), "GNNFLOW_RPC_PORT": "3000"})

    assert cluster == ClusterSpec(num_replicas=2, replica_rank=0, master_addr="chief-0", master_port=2222, rpc_port=3000)


def test_pytorch_variables_describe_the_cluster() -> None:
    environ = {"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500", "WORLD_SIZE": "3", "RANK": "2"}

    assert cluster_from_environment(environ) == ClusterSpec(3, 2, "10.0.0.2", 29500, 29501)


def test_no_cluster_variables_mean_a_local_run() -> None:
    assert cluster_from_environment({"HOME": "/root"}) is None


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"CLUSTER_SPEC": "{not json"}, "CLUSTER_SPEC"),
        ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["a:1"]}, "task": {"type": "workerpool1", "index": 0}})}, "CLUSTER_SPEC"),
        ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["a"]}, "task": {"type": "workerpool0", "index": 0}})}, "CLUSTER_SPEC"),
        ({"MASTER_ADDR": "a", "MASTER_PORT": "1"}, "WORLD_SIZE"),
        ({"MASTER_ADDR": "a", "MASTER_PORT": "x", "WORLD_SIZE": "2", "RANK": "0"}, "MASTER_PORT"),
        ({"MASTER_ADDR": "a", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "2"}, "RANK"),
    ],
)
def test_a_malformed_cluster_environment_is_a_clear_error(environ: dict[str, str], named: str) -> None:
    with pytest.raises(GnnflowError, match=named):
        cluster_from_environment(environ)


def test_world_size_must_fit_the_cluster() -> None:
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "0"}

    with pytest.raises(GnnflowError, match="world_size 3"):
        launch(all_reduce_rank, (), world_size=3, environ=environ)


def test_two_replicas_of_two_processes_form_one_job() -> None:
    """Two launchers on this machine, each a replica the way Vertex AI's variables describe it."""
    port = _free_port()
    replicas = []
    for replica in range(2):
        environ = {**_python_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(replica)}
        command = [sys.executable, "-m", "tests.launcher_workers", "all_reduce", "4"]
        replicas.append(subprocess.Popen(command, cwd=REPO, env=environ, stdout=subprocess.PIPE, text=True))

    outputs = [json.loads(replica.communicate(timeout=120)[0]) for replica in replicas]

    assert [replica.returncode for replica in replicas] == [0, 0]
    arenas = {"malloc_arenas": environ.get("MALLOC_ARENA_MAX", "2")}
    assert outputs[0] == [{"rank": 0, "world_size": 4, "sum": 10, **arenas}, {"rank": 1, "world_size": 4, "sum": 10, **arenas}]
    assert outputs[1] == [{"rank": 2, "world_size": 4, "sum": 10, **arenas}, {"rank": 3, "world_size": 4, "sum": 10, **arenas}]


def test_a_peer_that_never_joins_fails_the_rendezvous_after_resources_rendezvous_timeout_s() -> None:
    """Replica 0 of a 2-replica job whose other replica never starts: its rank waits for the
    configured rendezvous timeout, not forever and not torch's default."""
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "RANK": "0"}
    started = time.monotonic()
    with pytest.raises(WorkerFailed, match="rank 0 failed"):
        launch(all_reduce_rank, world_size=2, environ=environ, timeouts=WorkerTimeouts(rendezvous_s=5))
    waited = time.monotonic() - started
    assert 5 <= waited < 60, waited


def test_the_default_rendezvous_timeout_survives_an_image_pull() -> None:
    from components.config import ResourcesSpec

    assert ResourcesSpec().rendezvous_timeout_s >= 15 * 60  # a fresh node pulls the multi-GB image first
    assert ResourcesSpec(rendezvous_timeout_s=30).rendezvous_timeout_s == 30
