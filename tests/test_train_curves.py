"""Training curves: train writes a TensorBoard event file whose scalars are metrics.jsonl's while
it runs, into the generation being staged and to ``$AIP_TENSORBOARD_LOG_DIR`` (a gs:// folder, as
Vertex AI sets it), and publishes it with the model; a resumed run extends the same file."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from components import storage
from components.config import GnnflowConfig, apply_overrides, load_config
from components.gnn.interruption import PREEMPTED_EXIT_CODE
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.train import checkpoint, curves
from tests.tiny_graph import write_tiny_graph

pytestmark = pytest.mark.multiworker

REPO = Path(__file__).resolve().parents[1]


def _scalars(event_file: str) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every scalar in one event file, read back by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(event_file)
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def _expected(lines: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as TensorBoard stores it: every numeric field but the epoch, as float32, at step = epoch."""
    fields = [k for k, v in lines[0].items() if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {k: [(line["epoch"], float(np.float32(line[k]))) for line in lines] for k in fields}


@pytest.fixture(scope="module")
def tiny_partitions(tmp_path_factory) -> tuple:
    folder = tmp_path_factory.mktemp("curves")
    config = apply_overrides(
        load_config(write_tiny_graph(folder / "graph")), {"training.epochs": 3, "training.batch_size": 2, "training.fan_outs": [2, 2]}
    )
    root = storage.parse_uri(folder)
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    partition(root.join("tfr"), root.join("parts"), config.partition, world_size=1)
    return config, root.join("parts")


def _start_train(config: GnnflowConfig, partitions: storage.Uri, model: str, log_dir: str, folder: Path) -> subprocess.Popen:
    path = folder / f"train-{config.training.epochs}.yaml"
    path.write_text(config.to_yaml())
    command = [sys.executable, "-m", "components.train", "--config", str(path), "--input", str(partitions), "--output", model]
    env = os.environ | {"PYTHONPATH": str(REPO), curves.VERTEX_LOG_DIR_ENV: log_dir}  # as on a Vertex AI replica
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)


def _first_curves(log_dir: str, proc: subprocess.Popen, timeout_s: float = 180) -> storage.Uri:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        found = storage.list_files(log_dir)
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no curves in {log_dir} while training ran (exit code {proc.poll()})")


def _scalars_of(data: bytes) -> dict[str, list[tuple[int, float]]]:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "events.out.tfevents.0")
        Path(path).write_bytes(data)
        return _scalars(path)


def test_curves_grow_while_training_runs_and_a_resumed_run_extends_the_same_file(tiny_partitions, gcs_bucket, tmp_path):
    config, parts = tiny_partitions
    model, log_dir = f"gs://{gcs_bucket}/model", f"gs://{gcs_bucket}/custom-job/logs"
    long = apply_overrides(config, {"training.epochs": 1000, "training.early_stopping_patience": None})  # minutes of epochs
    proc = _start_train(long, parts, model, log_dir, tmp_path)
    try:
        live = _first_curves(log_dir, proc)
        live_bytes = storage.read_bytes(live)
        assert proc.poll() is None and not storage.exists(storage.parse_uri(model).join("manifest.json"))  # while training runs
        [staged] = [f for f in storage.list_files(model) if f.name == live.name]  # in the generation being staged
        assert f"/{curves.FOLDER}/" in str(staged) and "/gen-" in str(staged)
        staged_bytes = storage.read_bytes(staged)
        assert staged_bytes.startswith(live_bytes) or live_bytes.startswith(staged_bytes)  # one may be a write ahead
        epochs_live = len(_scalars_of(live_bytes)["loss"])
        assert epochs_live >= 1
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]

    saved = storage.read_bytes(storage.parse_uri(model).join(checkpoint.CHECKPOINT_FILE))
    raw = torch.load(io.BytesIO(saved), weights_only=True)
    assert raw["curves_name"] == live.name and len(raw["wall_times"]) == raw["next_epoch"] >= epochs_live
    epochs = raw["next_epoch"] + 2
    rerun = _start_train(apply_overrides(long, {"training.epochs": epochs}), parts, model, log_dir, tmp_path)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-3000:]
    assert "resuming from the checkpoint" in stderr

    published = storage.open_published(model, step="train")
    lines = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
    assert [line["epoch"] for line in lines] == list(range(epochs))
    assert published.files_under(curves.FOLDER) == [f"{curves.FOLDER}/{live.name}"]  # one file for both attempts
    final = published.read_bytes(f"{curves.FOLDER}/{live.name}")
    assert storage.list_files(log_dir) == [live] and storage.read_bytes(live) == final  # Vertex AI's copy
    assert final.startswith(live_bytes)  # what readers had read stays as it was
    scalars = _scalars_of(final)
    assert {"loss", "train_accuracy", "val_accuracy", "seconds"} <= set(scalars)
    assert scalars == _expected(lines)


def test_event_file_holds_the_numbers_only_and_tensorboard_reads_it(tmp_path):
    history = [
        {"epoch": 0, "loss": 0.5, "n": 3, "early": False, "note": "x"},
        {"epoch": 1, "loss": 0.1, "n": 4, "early": True, "note": "y"},
    ]
    name = curves.file_name(1_700_000_000.5)
    assert name.startswith("events.out.tfevents.1700000000.")
    (tmp_path / name).write_bytes(curves.event_bytes(history, [1_700_000_001.0, 1_700_000_002.0], 1_700_000_000.5))
    assert _scalars(str(tmp_path / name)) == {"loss": [(0, 0.5), (1, float(np.float32(0.1)))], "n": [(0, 3.0), (1, 4.0)]}
    first = curves.event_bytes(history[:1], [1_700_000_001.0], 1_700_000_000.5)
    assert (tmp_path / name).read_bytes().startswith(first)  # a later write extends an earlier one
