"""The `gnnflow` command: the demo run, `step`, and `init-config`, as a user runs them."""

from __future__ import annotations

import subprocess
import sys

from components import storage
from components.serialize.step import read_graph_metadata
from pipelines.cli import main as gnnflow


def test_run_without_config_runs_the_demo(tmp_path):
    assert gnnflow(["run", "--output", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "config.yaml").exists()
    pre = storage.open_published(tmp_path / "run" / "preprocessed", step="preprocess")
    assert pre.manifest.counts == {"nodes.paper": 10_000, "edges.paper__cites__paper": 40_000}
    meta = read_graph_metadata(storage.open_published(tmp_path / "run" / "tfrecords", step="serialize"))
    paper = meta.node_types["paper"]
    assert paper.count == 10_000 and paper.num_classes == 5 and paper.feature_dim == 64 + 1 + 9
    assert sum(paper.split_sizes.values()) == 9_900  # the 1% unlabeled demo nodes get no split
    parts = storage.open_published(tmp_path / "run" / "partitions", step="partition")
    assert parts.manifest.counts == {"partitions": 2, "nodes.paper": 10_000, "edges.paper__cites__paper": 80_000}


def test_step_subcommand_runs_each_step_alone(tmp_path):
    assert gnnflow(["run", "--output", str(tmp_path / "demo")]) == 0
    config = str(tmp_path / "demo" / "config.yaml")
    assert gnnflow(["step", "preprocess", "--config", config, "--output", str(tmp_path / "p")]) == 0
    assert gnnflow(["step", "serialize", "--input", str(tmp_path / "p"), "--output", str(tmp_path / "t")]) == 0
    assert storage.open_published(tmp_path / "t").manifest.counts["nodes.paper"] == 10_000
    assert gnnflow(["step", "partition", "--input", str(tmp_path / "t"), "--output", str(tmp_path / "q"), "--world-size", "3"]) == 0
    assert storage.open_published(tmp_path / "q").manifest.counts["partitions"] == 3


def test_module_entry_points_exit_non_zero_with_a_message(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "components.serialize", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert f"{tmp_path / 'missing'} is not a published output" in result.stderr
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "step", "nope"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "invalid choice: 'nope'" in result.stderr
