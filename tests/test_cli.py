"""The `gnnflow` command: `step` and the module entry points, as a user runs them (the whole run:
test_pipeline_run.py)."""

from __future__ import annotations

import subprocess
import sys

from components import storage
from pipelines.cli import main as gnnflow
from pipelines.local_run import demo_config


def test_step_subcommand_runs_each_step_alone(tmp_path):
    demo_config(storage.parse_uri(tmp_path / "demo"))
    config = str(tmp_path / "demo" / "config.yaml")
    assert gnnflow(["step", "preprocess", "--config", config, "--output", str(tmp_path / "p")]) == 0
    assert gnnflow(["step", "serialize", "--input", str(tmp_path / "p"), "--output", str(tmp_path / "t")]) == 0
    assert storage.open_published(tmp_path / "t").manifest.counts["nodes.paper"] == 10_000
    assert gnnflow(["step", "partition", "--input", str(tmp_path / "t"), "--output", str(tmp_path / "q"), "--world-size", "3"]) == 0
    assert storage.open_published(tmp_path / "q").manifest.counts["partitions"] == 3


def test_module_entry_points_exit_non_zero_with_a_message(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "components.serialize", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert f"{tmp_path / 'missing'} is not a published output" in result.stderr
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "step", "nope"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "invalid choice: 'nope'" in result.stderr
