"""Preemption through the compiled pipeline (issue 36 §1): a train task run as the compiled KFP
component exits 75 when SIGTERM stops it, as ``python -m components.train`` does, and
``gnnflow local-job`` passes its own SIGTERM to every replica as Vertex AI does, waits for them
within the grace period and exits with the job's status; the rerun of the same command resumes
from the mid-epoch checkpoint and completes."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from components import storage
from components.errors import GnnflowError
from components.gnn.interruption import PREEMPTED_EXIT_CODE, Preempted
from components.runtime import pipeline_task
from components.runtime.entrypoint import run_cli
from components.runtime.exit_status import EXIT_USER_ERROR, exit_status
from components.runtime.launcher import WorkerFailed
from pipelines.cli import main as gnnflow
from pipelines.local_job import termination
from pipelines.local_job.spec import read_job_task
from pipelines.local_job.termination import ReplicasStopped

pytestmark = pytest.mark.multiworker

REPO = Path(__file__).resolve().parents[1]
IMAGE = "localhost/gnnflow/step:test"
PREEMPTED_LINE = "local-job train: stopped by SIGTERM; replicas preempted (exit 75): rerun to resume from the checkpoint"
MINIMAL_CONFIG = "graph:\n  nodes: [{uri: n.csv, label_column: y}]\n  edges: [{uri: e.csv}]\n"  # resolves; nothing is read


# --- one rule for the exit status, on both paths ------------------------------------------


ERRORS = [
    (Preempted("train was stopped by SIGTERM (preemption) at batch 3 of epoch 1"), PREEMPTED_EXIT_CODE),
    (GnnflowError("training.epochz: no such key"), EXIT_USER_ERROR),
    (WorkerFailed(1, "no progress for 21 s in phase sampling on host trainer-0"), EXIT_USER_ERROR),  # the watchdog's
    (ReplicasStopped("local-job train: stopped by SIGTERM; replica(s) workerpool1-0 ... killed", 143), 143),
]


@pytest.mark.parametrize(("error", "status"), ERRORS, ids=["preempted", "bad-input", "watchdog", "killed-replicas"])
def test_the_compiled_task_and_the_step_command_end_with_the_same_status(error: GnnflowError, status: int, capsys) -> None:
    def fail(_: object = None) -> None:
        raise error

    assert exit_status(error) == status
    assert run_cli(fail, []) == status
    with pytest.raises(SystemExit) as ended, pipeline_task.running("train", MINIMAL_CONFIG, "{}"):
        fail()
    assert ended.value.code == status
    assert str(error).splitlines()[0] in capsys.readouterr().err  # the one line, on both paths


def test_a_launcher_status_passes_through_the_compiled_task_unchanged() -> None:
    """The launcher ends with SystemExit(143) when its workers died of SIGTERM or outlived its grace."""
    with pytest.raises(SystemExit) as ended, pipeline_task.running("partition", MINIMAL_CONFIG, "{}"):
        raise SystemExit(128 + signal.SIGTERM)
    assert ended.value.code == 143


@pytest.mark.parametrize("code", [0, 256, -1, "75", True, None])
def test_an_exit_code_that_is_no_status_falls_back_to_bad_input(code: object) -> None:
    error = GnnflowError("odd")
    error.exit_code = code  # type: ignore[attr-defined]
    assert exit_status(error) == EXIT_USER_ERROR


def test_the_job_status_after_a_sigterm() -> None:
    label, grace = "local-job train", 30.0
    both = ["workerpool0-0", "workerpool1-0"]
    assert termination.outcome(label, dict.fromkeys(both, 75), [], grace) == termination.Outcome(75, PREEMPTED_LINE)
    partition = termination.outcome("local-job partition", dict.fromkeys(both, 143), [], grace)
    assert partition.status == 143 and "workerpool0-0 exit 143, workerpool1-0 exit 143" in partition.message
    mixed = termination.outcome(label, {both[0]: 75, both[1]: 2}, [], grace)
    assert mixed.status == 2 and "workerpool1-0 exit 2" in mixed.message
    killed = termination.outcome(label, {both[0]: 75, both[1]: 137}, [both[1]], grace)
    assert killed.status == 143 and "replica(s) workerpool1-0 did not exit within the grace period of 30 s" in killed.message
    assert termination.outcome(label, dict.fromkeys(both, 0), [], grace).status == 0
    assert termination.status(-signal.SIGKILL) == 137 and termination.status(75) == 75


# --- local-job's SIGTERM, on stand-in replicas --------------------------------------------


class _Output:
    """A process's merged output, read as it comes, so a test can wait for a line in it."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.lines = process, queue.Queue[str]()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, matches: Callable[[str], object], timeout_s: float, count: int = 1) -> list[str]:
        """The first ``count`` lines ``matches`` accepts; fails with the output so far after ``timeout_s``."""
        deadline, found = time.monotonic() + timeout_s, [line for line in self.seen if matches(line)]
        while len(found) < count:
            try:
                line = self.lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline or self.process.poll() is not None and self.lines.empty():
                    raise AssertionError(f"not seen (exit code {self.process.poll()}):\n" + "\n".join(self.seen[-60:])) from None
                continue
            self.seen.append(line)
            if matches(line):
                found.append(line)
        return found[:count]

    def rest(self, timeout_s: float) -> str:
        """Everything printed, once the process has exited (at most ``timeout_s`` from now)."""
        self.process.wait(timeout_s)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.seen.append(self.lines.get(timeout=0.5))
            except queue.Empty:
                if self.process.stdout is None or self.process.stdout.closed or self.lines.empty():
                    break
        return "\n".join(self.seen)


def _popen(*command: str) -> _Output:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    return _Output(process)


def test_sigterm_reaches_every_replica_and_the_job_exits_75_when_they_were_preempted() -> None:
    job = _popen(sys.executable, "-m", "tests.local_job_replicas", "preempted", "20")
    job.wait_for(lambda line: line.endswith("] ready"), timeout_s=60, count=2)
    started = time.monotonic()
    job.process.send_signal(signal.SIGTERM)
    output = job.rest(timeout_s=30)
    assert job.process.returncode == PREEMPTED_EXIT_CODE, output
    assert time.monotonic() - started < 10, "it waited for the grace period instead of the replicas"
    assert "local-job stand-in: SIGTERM: passed on to 2 running replica(s), which have 20 s to exit" in output
    assert "local-job stand-in: stopped by SIGTERM; replicas preempted (exit 75): rerun to resume from the checkpoint" in output
    assert "done" not in output


def test_a_replica_that_outlives_the_grace_period_is_killed_and_named() -> None:
    job = _popen(sys.executable, "-m", "tests.local_job_replicas", "stubborn", "1.5")
    job.wait_for(lambda line: line.endswith("] ready"), timeout_s=60, count=2)
    job.process.send_signal(signal.SIGTERM)
    output = job.rest(timeout_s=30)
    assert job.process.returncode == 143, output
    assert "replica(s) workerpool1-0 did not exit within the grace period of 1.5 s (--grace-s) and were killed" in output
    assert "workerpool0-0 did not" not in output  # it exited 75 in time


def test_a_replica_preempted_on_its_own_makes_the_job_exit_75_and_stops_the_others() -> None:
    """As on Vertex AI, where each container gets the SIGTERM itself, not through the job."""
    job = _popen(sys.executable, "-m", "tests.local_job_replicas", "alone", "20")
    output = job.rest(timeout_s=60)
    assert job.process.returncode == PREEMPTED_EXIT_CODE, output
    assert "replica workerpool1-0 exited with code 75 (preempted: rerun to resume from the checkpoint)" in output
    assert "done" not in output


# --- the compiled spec's own command: train preempted, then resumed -----------------------


@pytest.fixture(scope="module")
def compiled_train(one_sided_validation, tmp_path_factory):
    """A pipeline compiled for 2 Vertex AI replicas with a small train whose epochs are long enough
    for a SIGTERM to land inside one (batches of 2: about 80 per rank and epoch, some 20 ms each
    here), and a checkpoint every 3 batches, whose log line says that training is under way."""
    raw, partitions, _ = one_sided_validation
    folder = tmp_path_factory.mktemp("preempted_job")
    training = {"epochs": 2, "batch_size": 2, "early_stopping_patience": None, "checkpoint_every_batches": 3}
    config = {**raw, "training": {**raw["training"], **training}, "resources": {"world_size": 2, "runner": "vertex"}}
    config_file = folder / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    pipeline = folder / "pipeline.yaml"
    assert gnnflow(["compile", "-o", str(pipeline), "--image", IMAGE, "--config", str(config_file)]) == 0
    return pipeline, config_file, partitions, folder / "root"


def test_a_sigtermed_local_job_exits_75_and_its_rerun_resumes_mid_epoch(compiled_train) -> None:
    pipeline, config_file, partitions, root = compiled_train
    # The executor is each container's PID 1: a shell there would ignore Vertex AI's SIGTERM.
    pools = read_job_task(yaml.safe_load(pipeline.read_text()), "train", {"config": "x: 1"}, {}).pools
    assert [pool.command[:2] for pool in pools] == [("sh", "-ec")] * 2
    assert all("\n_KFP_RUNTIME=true exec python3 -m kfp.dsl.executor_main" in pool.command[2] for pool in pools)
    command = [sys.executable, "-m", "pipelines.cli", "local-job", str(pipeline), "--task", "train", "--processes"]
    command += ["--root", str(root), "--config", str(config_file), "--input", f"partitions={partitions}"]

    job = _popen(*command)
    job.wait_for(lambda line: "periodic: checkpoint at batch" in line, timeout_s=240)  # training is under way
    job.process.send_signal(signal.SIGTERM)
    output = job.rest(timeout_s=60)
    assert job.process.returncode == PREEMPTED_EXIT_CODE, output[-4000:]
    assert PREEMPTED_LINE in output, output[-4000:]
    # A SIGTERM while the ranks evaluate would stop at the epoch's end, one after the last epoch not at all.
    stopped = re.search(r"train: stopped on SIGTERM at (batch \d+ of epoch \d+)", output)
    assert stopped, output[-4000:]
    model = root / "train" / "model"
    assert not (model / "manifest.json").exists(), "a preempted job published"

    rerun = _popen(*command)
    output = rerun.rest(timeout_s=300)
    assert rerun.process.returncode == 0, output[-4000:]
    assert f"resuming from the checkpoint of {stopped.group(1)}" in output, output[-4000:]
    assert "local-job train: 2 replica(s) done" in output
    metrics = storage.open_published(storage.parse_uri(model), step="train").read_json("metrics.json")
    assert metrics["epochs_run"] == 2
