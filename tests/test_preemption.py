"""Preemption and periodic checkpoints (issue 22 §1): a real SIGTERM to the step's launcher (as
Vertex sends PID 1 of a replica) stops every trainer after the same batch, rank 0 writes a
mid-epoch checkpoint, the step exits 75, and the rerun resumes from that batch and ends with the
model an uninterrupted run trains; a kill -9 fails the step at once (the launcher sees the death)
and the rerun resumes from the last periodic checkpoint.

The graph puts all validation nodes in partition 0, so the two trainers have different numbers
of batches per epoch: stops and checkpoints also happen while one of them has joined (DDP's
uneven-input join), whose model and optimizer are then its own."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from components import storage
from components.config import parse_config
from components.errors import GnnflowError
from components.gnn.interruption import PREEMPTED_EXIT_CODE, BatchAgreement, Preempted
from components.gnn.sampling import _without_first
from components.runtime.entrypoint import run_cli
from components.runtime.launcher import WorkerFailed
from components.train import attempts, checkpoint
from components.train.step import train
from tests.small_graphs import with_updates
from tests.test_launcher import worker_processes

pytestmark = pytest.mark.multiworker

REPO = Path(__file__).resolve().parents[1]
# Small batches: ~70 per epoch, so a stop lands inside an epoch far more often than in evaluation.
TRAINING = {"epochs": 2, "batch_size": 4, "early_stopping_patience": None}


def _raw(raw: dict, **training: object) -> dict:
    return {**raw, "training": {**raw["training"], **TRAINING, **training}}


def _weights(model: Path) -> dict[str, torch.Tensor]:
    published = storage.open_published(model, step="train")
    return torch.load(io.BytesIO(published.read_bytes("model.pt")), weights_only=True)


def _start(raw: dict, partitions: storage.Uri, model: Path) -> subprocess.Popen:
    config = model.parent / f"{model.name}.yaml"
    config.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "components.train", "--config", str(config), "--input", str(partitions), "--output", str(model)]
    env = os.environ | {"PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)


def _mid_epoch_checkpoint(model: Path, proc: subprocess.Popen, timeout_s: float = 300) -> checkpoint.TrainingState:
    """Waits for a periodic checkpoint taken inside an epoch; returns it."""
    uri = storage.parse_uri(model)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        state = _checkpoint_or_none(uri)
        if state is not None and state.mid_epoch:
            return state
        time.sleep(0.02)
    raise AssertionError(f"no mid-epoch checkpoint appeared (exit code {proc.poll()})")


def _checkpoint_or_none(uri: storage.Uri) -> checkpoint.TrainingState | None:
    """The checkpoint, or None while there is none: a save moves the current file aside before it
    writes the new one (each file appears whole), so a poll can land between the two."""
    try:
        return _any_checkpoint(uri)
    except GnnflowError:
        return None


def _any_checkpoint(uri: storage.Uri) -> checkpoint.TrainingState | None:
    raw = torch.load(io.BytesIO(storage.read_bytes(uri.join(checkpoint.CHECKPOINT_FILE))), weights_only=True)
    return checkpoint.TrainingState(**raw)


def _assert_identical(resumed: Path, uninterrupted: Path) -> None:
    mine, theirs = _weights(resumed), _weights(uninterrupted)
    assert mine.keys() == theirs.keys()
    different = [name for name in mine if not torch.equal(mine[name], theirs[name])]
    assert different == [], f"weights that differ from the uninterrupted run's: {different}"
    metrics = [storage.open_published(m, step="train").read_json("metrics.json") for m in (resumed, uninterrupted)]
    assert metrics[0] == metrics[1]


def test_sigterm_stops_every_rank_after_one_batch_and_the_rerun_ends_with_the_uninterrupted_model(one_sided_validation, tmp_path):
    raw, partitions, _ = one_sided_validation
    train(with_updates(_raw(raw)), partitions, tmp_path / "uninterrupted")

    # Periodic checkpoints (every 5 batches) show where training is; they change nothing it computes.
    interrupted = _raw(raw, checkpoint_every_batches=5)
    model = tmp_path / "interrupted"
    stops_inside_an_epoch = 0
    for _ in range(3):  # a SIGTERM that lands in evaluation stops at the epoch's end: try again from there
        proc = _start(interrupted, partitions, model)
        _mid_epoch_checkpoint(model, proc)
        psutil.Process(proc.pid).send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
        assert "train was stopped by SIGTERM (preemption) at" in stderr and "run the step again to resume" in stderr
        assert not (model / "manifest.json").exists(), "a stopped run published"
        state = _any_checkpoint(storage.parse_uri(model))
        if state.mid_epoch:
            stops_inside_an_epoch += 1
            positions = [rank["batches"] for rank in state.ranks]
            assert len(positions) == 2 and all(p > 0 for p in positions), positions
            assert f"at batch {positions[0]} of epoch {state.next_epoch + 1}" in stderr, stderr[-2000:]
            assert "SIGTERM: checkpoint at batch" in stderr  # with how long it took to write
            break
    assert stops_inside_an_epoch == 1, "no SIGTERM stopped training inside an epoch in three tries"

    rerun = _start(interrupted, partitions, model)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-3000:]
    assert f"resuming from the checkpoint of batch {positions[0]} of epoch {state.next_epoch + 1}" in stderr
    _assert_identical(model, tmp_path / "uninterrupted")


def test_a_killed_worker_resumes_from_the_last_periodic_checkpoint_with_multiprocess_sampling(one_sided_validation, tmp_path):
    raw, partitions, _ = one_sided_validation
    sampling = {"sampling": "multiprocess", "sampling_workers": 1, "epochs": 1}  # a kill inside the only epoch
    train(with_updates(_raw(raw, **sampling)), partitions, tmp_path / "uninterrupted")

    interrupted = _raw(raw, checkpoint_every_batches=5, **sampling)
    model = tmp_path / "killed"
    proc = _start(interrupted, partitions, model)
    state = _mid_epoch_checkpoint(model, proc)
    workers = worker_processes(proc.pid)
    workers[-1].send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "SIGKILL" in stderr, stderr[-3000:]
    # Stopped by the death itself (the launcher saw it), not by a peer's timeout; nothing published.
    assert re.search(r"worker rank \d failed", stderr) and "timed out" not in stderr.lower(), stderr[-3000:]
    assert not (model / "manifest.json").exists()

    rerun = _start(interrupted, partitions, model)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-3000:]
    assert "resuming from the checkpoint of batch" in stderr, stderr[-3000:]
    assert state.mid_epoch
    _assert_identical(model, tmp_path / "uninterrupted")


def test_a_resumed_multiprocess_epoch_deals_the_rest_of_its_order_in_whole_batches() -> None:
    order = torch.arange(23)
    per_worker = [order[:8], order[8:16], order[16:]]  # GLT's split of an epoch's order over 3 subprocesses
    dealt = _without_first(per_worker, dropped=8, batch_size=4)
    assert torch.equal(torch.cat(dealt), order[8:])
    assert [len(part) for part in dealt] == [8, 4, 3]  # batches [2, 1, 1]: the last one takes the tail
    assert [len(part) for part in _without_first([order], dropped=20, batch_size=4)] == [3]
    assert [len(part) for part in _without_first([order], dropped=24, batch_size=4)] == [0]


def test_batch_agreement_on_one_process_checkpoints_every_n_batches_and_stops_on_request(monkeypatch) -> None:
    written: list[tuple[int, bool]] = []
    batches = [0]
    agreement = BatchAgreement(
        3, None, snapshot=lambda: {"batches": batches[0]}, write=lambda snapshots, stop: written.append((snapshots[0]["batches"], stop))
    )
    for batch in range(1, 8):
        batches[0] = batch
        assert agreement.after_batch() is False
    assert written == [(3, False), (6, False)]
    monkeypatch.setattr("components.gnn.interruption._stop_requested", True)
    batches[0] = 8
    assert agreement.after_batch() is True and written[-1] == (8, True)


def test_a_preempted_step_exits_75_with_its_message(capsys) -> None:
    def preempted(_: object) -> None:
        raise Preempted("train was stopped by SIGTERM (preemption) at batch 3 of epoch 2")

    assert run_cli(preempted, []) == 75
    assert "at batch 3 of epoch 2" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["checkpoint_every_batches", "checkpoint_every_seconds"])
def test_checkpoint_periods_must_be_positive(key: str) -> None:
    with pytest.raises(Exception, match=key):
        parse_config(yaml.safe_dump({"graph": {"nodes": [], "edges": []}, "training": {key: 0}}), "test config")


def test_a_second_failure_from_the_same_checkpoint_says_so_and_a_third_attempt_is_refused(one_sided_validation, tmp_path, caplog):
    raw, partitions, _ = one_sided_validation
    broken = tmp_path / "parts"
    shutil.copytree(partitions.path, broken)
    (features,) = broken.glob("gen-*/part-00001/nodes/paper.safetensors")
    intact = features.read_bytes()
    features.write_bytes(intact[: len(intact) // 2])  # rank 1 fails reading its partition, every time
    config = with_updates(_raw(raw, epochs=1))
    model = tmp_path / "model"

    with pytest.raises(WorkerFailed, match="rank 1"):
        train(config, broken, model)
    assert "failed again from the same point" not in caplog.text
    with pytest.raises(WorkerFailed, match="rank 1"):
        train(config, broken, model)
    assert "train failed again from the same point as the previous attempt (the start of training)" in caplog.text

    started = time.monotonic()
    refusal = r"train failed 2 times from the same point \(the start of training\), last with: WorkerFailed: .*rank 1"
    with pytest.raises(GnnflowError, match=refusal):
        train(config, broken, model)
    assert time.monotonic() - started < 5, "refused before any worker started"

    features.write_bytes(intact)
    (model / attempts.FAILURES_FILE).unlink()  # what the refusal says to do once the cause is fixed
    train(config, broken, model)
    assert storage.open_published(model, step="train").read_json("metrics.json")["epochs_run"] == 1
    assert not (model / attempts.FAILURES_FILE).exists()
