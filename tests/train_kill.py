"""Kill one trainer of a running ``python -m components.train`` and check the step fails fast,
naming the rank, publishes nothing, and that a re-run resumes from the checkpoint."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import yaml

from components import storage
from tests.test_launcher import worker_processes


def kill_a_worker_then_resume(raw: dict, partitions: str, folder: pathlib.Path, epochs: int, exit_within_s: float) -> None:
    """Trains ``raw`` (patience off, ``epochs`` epochs) on ``partitions`` into ``folder/model``, SIGKILLs the
    last worker once the first checkpoint exists, then re-runs the same command to the end."""
    config = folder / "config.yaml"
    raw = json.loads(json.dumps(raw))
    raw["training"] |= {"epochs": epochs, "early_stopping_patience": None}
    config.write_text(yaml.safe_dump(raw))
    model = folder / "model"
    command = [sys.executable, "-m", "components.train", "--config", str(config), "--input", partitions, "--output", str(model)]
    env = os.environ | {"PYTHONPATH": str(pathlib.Path(__file__).parents[1])}
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    checkpoint = model / "_checkpoints" / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert checkpoint.exists(), "no checkpoint was written"
    workers = worker_processes(proc.pid)
    workers[-1].send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=exit_within_s)
    assert proc.returncode != 0
    assert re.search(r"worker rank \d failed", stderr) and "SIGKILL" in stderr, stderr[-2000:]
    assert "timed out" not in stderr.lower(), "stopped by the death itself, not by a peer's timeout"
    assert not (model / "manifest.json").exists()

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from the checkpoint of epoch" in rerun.stderr
    assert storage.open_published(model, step="train").read_json("metrics.json")["epochs_run"] == epochs
