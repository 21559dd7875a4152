"""Training curves: train publishes a TensorBoard event file whose scalars are metrics.jsonl's,
and copies it to ``$AIP_TENSORBOARD_LOG_DIR`` (a gs:// folder, as Vertex AI sets it)."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest

from components import storage
from components.config import apply_overrides, load_config
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.train import curves
from components.train.step import train
from tests.tiny_graph import write_tiny_graph

pytestmark = pytest.mark.multiworker


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


def test_published_model_holds_the_curves_and_vertex_tensorboard_gets_a_copy(tiny_partitions, gcs_bucket, monkeypatch):
    config, parts = tiny_partitions
    log_dir = f"gs://{gcs_bucket}/custom-job/logs"
    monkeypatch.setenv(curves.VERTEX_LOG_DIR_ENV, log_dir)  # the workers inherit it, as on a Vertex AI replica
    published = train(config, parts, f"gs://{gcs_bucket}/model")

    lines = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
    assert [line["epoch"] for line in lines] == [0, 1, 2]
    [event_file] = published.files_under(curves.FOLDER)
    assert os.path.basename(event_file).startswith("events.out.tfevents.")
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, os.path.basename(event_file))
        storage.download_file(published.uri(event_file), local)
        scalars = _scalars(local)
        expected = _expected(lines)
        assert {"loss", "train_accuracy", "val_accuracy", "seconds"} <= set(scalars)
        assert scalars == expected

        [copy] = storage.list_files(log_dir)
        assert copy.name == os.path.basename(event_file)
        assert storage.read_bytes(copy) == published.read_bytes(event_file)


def test_event_file_holds_the_numbers_only_and_tensorboard_reads_it(tmp_path):
    history = [
        {"epoch": 0, "loss": 0.5, "n": 3, "early": False, "note": "x"},
        {"epoch": 1, "loss": 0.1, "n": 4, "early": True, "note": "y"},
    ]
    name, data = curves.event_file(history, wall_time=1_700_000_000.5)
    assert name.startswith("events.out.tfevents.1700000000.")
    (tmp_path / name).write_bytes(data)
    assert _scalars(str(tmp_path / name)) == {"loss": [(0, 0.5), (1, float(np.float32(0.1)))], "n": [(0, 3.0), (1, 4.0)]}
