"""``gnnflow run``: the whole DAG on this machine, the demo, CiteSeer from BigQuery through gs:// back to
BigQuery (emulators), and re-runs that skip what is up to date."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from components import storage
from components.errors import GnnflowError
from components.warehouse.clients import bigquery_client
from pipelines.cli import main as gnnflow
from pipelines.local_run import STATE_FILE
from tests.bigquery_emulator import load_csv_table
from tests.shared_datasets import citeseer_test_chance
from tests.small_graphs import demo_chance
from tests.test_citeseer import CITESEER, needs_citeseer
from tests.test_train import NODE_CLASSIFICATION

pytestmark = pytest.mark.multiworker

STEPS = ["preprocess", "serialize", "partition", "train", "infer", "report"]
# This module checks how runs rerun, skip and resume, over the many batches of a sampled epoch: the
# demo trains sampled graphsage here, not its full-graph proposal (one step an epoch; test_kfp_local runs that).
SAMPLED = ["--set", "model.type=graphsage", "--set", "training.mode=sampled", "--set", "model.num_layers=2"]
# The demo is learnt within a few epochs; what the reruns below check is which steps run again.
DEMO_EPOCHS = 4
# More epochs continue the published model's run (3 or 4 epochs): the SIGTERM, sent at its first
# new checkpoint, has 4 or more epochs left to land in.
SIGTERM_EPOCHS = DEMO_EPOCHS + 4


def _ran_and_skipped(root) -> dict[str, str]:
    return json.loads((root / STATE_FILE).read_text())["steps"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo") / "run"
    assert gnnflow(["run", "--output", str(root), *SAMPLED, "--set", f"training.epochs={DEMO_EPOCHS}"]) == 0
    return root


def test_demo_run_publishes_every_step_and_prints_where(demo_run, capsys):
    for name, step in zip(["preprocessed", "tfrecords", "partitions", "model", "embeddings", "report"], STEPS):
        assert storage.open_published(demo_run / name).manifest.step == step
    assert storage.open_published(demo_run / "preprocessed").manifest.counts == {"nodes.paper": 10_000, "edges.paper__cites__paper": 40_000}
    parts = storage.open_published(demo_run / "partitions")
    assert parts.manifest.counts == {"partitions": 2, "nodes.paper": 10_000, "edges.paper__cites__paper": 80_000}
    report = storage.open_published(demo_run / "report")
    metrics = report.read_json("metrics.json")
    assert metrics["test_accuracy"] >= 2 * demo_chance(10_000), metrics  # learnt: twice the largest class's share
    assert json.loads((demo_run / "report" / "metrics.json").read_text()) == metrics
    assert report.read_bytes("report.html").startswith(b"<!DOCTYPE html>")
    embeddings = storage.open_published(demo_run / "embeddings")
    ids = pd.concat(pq.read_table(io.BytesIO(embeddings.read_bytes(f))).to_pandas() for f in embeddings.files_under("embeddings/paper"))[
        "node_id"
    ]
    assert ids.nunique() == len(ids) == 10_000
    assert set(_ran_and_skipped(demo_run)) == set(STEPS)


def test_rerun_skips_up_to_date_steps_and_reruns_what_changed(demo_run, capsys):
    before = {s: v["generation"] for s, v in _ran_and_skipped(demo_run).items()}
    config = str(demo_run / "config.yaml")
    capsys.readouterr()
    assert gnnflow(["run", "--config", config, "--output", str(demo_run), *SAMPLED, "--set", f"training.epochs={DEMO_EPOCHS}"]) == 0
    out = capsys.readouterr().out
    assert "skipped (up to date): preprocess, serialize, partition, train, infer, report" in out
    assert {s: v["generation"] for s, v in _ran_and_skipped(demo_run).items()} == before

    # A training change reruns train and what follows it, nothing before it.
    assert gnnflow(["run", "--config", config, "--output", str(demo_run), *SAMPLED, "--set", f"training.epochs={DEMO_EPOCHS - 1}"]) == 0
    out = capsys.readouterr().out
    assert "skipped (up to date): preprocess, serialize, partition" in out
    after = {s: v["generation"] for s, v in _ran_and_skipped(demo_run).items()}
    assert [s for s in STEPS if after[s] == before[s]] == ["preprocess", "serialize", "partition"]
    assert storage.open_published(demo_run / "model").read_json("metrics.json")["epochs_run"] <= DEMO_EPOCHS - 1


def test_a_run_stopped_by_sigterm_in_train_exits_75_and_its_rerun_resumes_train_only(demo_run):
    """SIGTERM to `gnnflow run` (a local job's launcher) reaches the trainers, which checkpoint; the
    rerun skips the published steps before train and resumes train from its checkpoint.

    The rerun is a clean multi-process run: its train and infer workers join gloo and GLT's RPC
    with Python's default warning filters, as a user's do, and print no warning of torch's (its
    RPC start-up's ProcessGroupGloo one is silenced: components/runtime/rendezvous.py)."""
    command = [
        sys.executable,
        "-c",
        "import sys; from pipelines.cli import main; sys.exit(main())",
        "run",
        "--config",
        str(demo_run / "config.yaml"),
        "--output",
        str(demo_run),
        *SAMPLED,
        "--set",
        f"training.epochs={SIGTERM_EPOCHS}",
        "--set",
        "training.checkpoint_every_batches=4",
        "--set",
        "training.early_stopping_patience=null",
    ]
    defaults = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's default filters
    env = defaults | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    checkpoint = demo_run / "model" / "_checkpoints" / "checkpoint.pt"
    before = storage.version(checkpoint)
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while _version_or_none(checkpoint) == before and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)  # a checkpoint of this run (or one being written): train is under way
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 75, stderr[-3000:]
    assert "train was stopped by SIGTERM (preemption)" in stderr

    rerun = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "skipped (up to date): preprocess, serialize, partition" in rerun.stdout
    assert "resuming from the checkpoint of" in rerun.stderr
    assert storage.open_published(demo_run / "model").read_json("metrics.json")["epochs_run"] == SIGTERM_EPOCHS
    assert "ProcessGroupGloo" not in rerun.stderr
    assert "UserWarning" not in rerun.stderr, rerun.stderr[-3000:]


def _version_or_none(uri: Path) -> str | None:
    """The file's version, or None while it is missing: a checkpoint's save moves the current file
    aside before it writes the new one, so a poll can land between the two."""
    try:
        return storage.version(uri)
    except GnnflowError:
        return None


def test_run_rejects_a_bad_override_before_any_step(tmp_path, capsys):
    # The demo's proposal is appnp with a one-layer MLP, whose sampled depth is its own; a graphsage of it is not.
    assert gnnflow(["run", "--output", str(tmp_path / "r"), "--set", "training.mode=sampled", "--set", "model.type=graphsage"]) == 2
    assert "training.fan_outs has 2 entries but model.num_layers is 1" in capsys.readouterr().err
    assert not (tmp_path / "r" / "preprocessed").exists()
    assert gnnflow(["run", "--output", str(tmp_path / "s"), "--set", "training.epoch=5"]) == 2
    assert "key 'training.epoch' does not name a config field" in capsys.readouterr().err
    # A model that exact inference cannot run is refused before preprocess, not after training.
    gat = ["--set", "model.type=gat", "--set", "training.mode=sampled", "--set", "model.num_layers=2"]
    assert gnnflow(["run", "--output", str(tmp_path / "t"), "--infer-mode", "exact", *gat]) == 2
    assert (
        "infer --mode exact supports model.type graphsage, gcn, appnp or gcnii; this config has model.type gat" in capsys.readouterr().err
    )
    assert not (tmp_path / "t" / "preprocessed").exists()
    # --force means nothing to kfp.local (it reruns every task): said, not silently ignored.
    assert gnnflow(["run", "--via", "kfp-local", "--force", "--output", str(tmp_path / "u")]) == 2
    assert "--force has no effect with --via kfp-local" in capsys.readouterr().err
    assert not (tmp_path / "u").exists()
    rgcn = ["--set", "model.type=rgcn", "--set", "training.mode=sampled", "--set", "model.num_layers=2"]
    assert gnnflow(["run", "--via", "kfp-local", "--output", str(tmp_path / "v"), "--infer-mode", "exact", *rgcn]) == 2
    assert (
        "infer --mode exact supports model.type graphsage, gcn, appnp or gcnii; this config has model.type rgcn" in capsys.readouterr().err
    )
    assert not (tmp_path / "v" / "config.resolved.yaml").exists()


@pytest.mark.slow
@needs_citeseer
def test_citeseer_from_bigquery_through_gcs_back_to_bigquery(gcs_bucket_bigquery_reads, bigquery_emulator, tmp_path, capsys):
    """The warehouse round trip on a real graph: CiteSeer's tables in BigQuery, the config and every
    step's output on gs://, embeddings and predictions back in BigQuery under CiteSeer's ids (loaded
    by BigQuery from the embeddings' gs:// URIs, as on the cloud)."""
    gcs_bucket = gcs_bucket_bigquery_reads
    project = bigquery_emulator.project
    client = bigquery_client(project)
    source, results = f"citeseer_{gcs_bucket[-8:]}", f"results_{gcs_bucket[-8:]}"
    client.create_dataset(source)
    client.create_dataset(results)
    nodes = load_csv_table(client, f"{project}.{source}.nodes", str(CITESEER / "nodes.csv.gz"))
    load_csv_table(client, f"{project}.{source}.edges", str(CITESEER / "edges.csv.gz"))
    raw = json.loads(json.dumps(NODE_CLASSIFICATION))
    raw["graph"]["nodes"][0]["uri"] = f"bq://{project}.{source}.nodes"  # features f* expand from the table's schema
    raw["graph"]["edges"][0]["uri"] = f"bq://{project}.{source}.edges"
    raw["output"] = {"root": f"gs://{gcs_bucket}/runs", "bigquery": f"{project}.{results}"}
    # What this adds to tests/test_train.py (which trains the same config to the accuracy figure)
    # is every step on gs:// between two warehouse ends: a short run, scored against chance below.
    raw["training"] |= {"epochs": 20, "early_stopping_patience": None}
    config = f"gs://{gcs_bucket}/config.yaml"
    storage.write_text(config, yaml.safe_dump(raw))
    root = f"gs://{gcs_bucket}/runs/citeseer"

    assert gnnflow(["run", "--config", config, "--output", root]) == 0
    out = capsys.readouterr().out
    metrics = storage.open_published(f"{root}/report").read_json("metrics.json")
    chance = citeseer_test_chance()  # always answering the commonest test class
    assert metrics["test_count"] == 1000 and metrics["test_accuracy"] >= 2 * chance, (metrics, chance)
    assert f"{root}/report/gen-" in out and "report.html" in out and f"{root}/export" in out
    embeddings = storage.open_published(f"{root}/embeddings")
    table = pd.concat(pq.read_table(io.BytesIO(embeddings.read_bytes(f))).to_pandas() for f in embeddings.files_under("embeddings/paper"))
    assert len(table) == 3327 and set(table["node_id"].astype(str)) == set(nodes["node_id"])
    assert len(table["embedding"].iloc[0]) == 64

    exported = pd.DataFrame(dict(row) for row in client.list_rows(f"{project}.{results}.paper_embeddings"))
    assert len(exported) == 3327 and set(exported["node_id"]) == set(nodes["node_id"])
    assert list(exported["run_id"].unique()) == [embeddings.manifest.generation]
    published = table.set_index(table["node_id"].astype(str))["embedding"]
    first = exported.iloc[0]
    assert np.array_equal(np.float32(first["embedding"]), published[first["node_id"]])
    predictions = pd.DataFrame(dict(row) for row in client.list_rows(f"{project}.{results}.paper_predictions"))
    test = nodes[nodes["split"] == "test"].set_index("node_id")["label"]
    read_back = float((predictions.set_index("node_id")["prediction"].reindex(test.index) == test).mean())
    assert abs(read_back - metrics["test_accuracy"]) < 1e-6, (read_back, metrics)
