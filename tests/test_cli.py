"""The `gnnflow` command: `step` and the module entry points, as a user runs them (the whole run:
test_pipeline_run.py)."""

from __future__ import annotations

import os
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


def _gnnflow_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_set_value_that_is_not_yaml_is_one_line_naming_the_key(tmp_path):
    # What a shell leaves of --set training.fan_outs=[10, 5] when the space is not quoted.
    result = _gnnflow_cli("run", "--output", str(tmp_path / "run"), "--set", "training.fan_outs=[10,")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "ParserError" not in result.stderr and "line 1, column" not in result.stderr
    (line,) = _error_lines(result.stderr)
    assert line.startswith("error: --set training.fan_outs=[10,: not a valid YAML value (")
    assert "--set 'training.fan_outs=[10, 5]'" in line
    assert not (tmp_path / "run").exists()  # refused before the demo data is written


def test_cuda_on_a_machine_without_a_gpu_is_refused_before_the_first_step(tmp_path):
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on a machine with one too.
    root = tmp_path / "run"
    result = _gnnflow_cli(
        "run", "--output", str(root), "--set", "training.device=cuda", "--set", "training.replace=true", env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = _error_lines(result.stderr)
    assert line.startswith("error: training.device is cuda but this machine, where a local run's train and infer workers run, sees no GPU")
    assert line.endswith("set training.device to auto or cpu")
    assert "==> preprocess" not in result.stderr
    published = sorted(p.name for p in root.iterdir())
    assert published == ["config.yaml", "demo_data"]  # the demo's input and its config; no step output, no run state
