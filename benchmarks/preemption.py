"""How fast a preempted training step checkpoints and exits, and what its resumed run ends with.

    .venv/bin/python benchmarks/preemption.py [--nodes 2000]

Trains the demo graph (2 workers, batch 16) as ``python -m components.train`` three ways:
uninterrupted (the baseline), and twice with a SIGTERM sent to the launcher (as Vertex sends it
to a replica's PID 1) once a periodic mid-epoch checkpoint shows the first epoch under way, each
followed by the rerun that resumes. Per setting the table reports the seconds from the SIGTERM to
the checkpoint written and to the step's exit (a Spot VM has 30), that against one batch of the
baseline, the checkpoint's size, and whether the resumed run's final model equals the baseline's
(node classification; link prediction's random negatives come from a C++ engine whose state is
not saved, so there the difference of the final validation metric is reported).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time

import torch
import yaml

from components import storage
from components.config import GnnflowConfig
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.train import checkpoint

REPO = pathlib.Path(__file__).resolve().parents[1]


def _train(raw: dict, parts: str, model: pathlib.Path, stop_after_checkpoint: bool) -> tuple[int, str, float | None]:
    """Runs the step; with ``stop_after_checkpoint`` SIGTERMs it at the first mid-epoch checkpoint.
    Returns (exit code, stderr, seconds from the SIGTERM to the exit)."""
    config = model.parent / f"{model.name}.yaml"
    config.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "components.train", "--config", str(config), "--input", parts, "--output", str(model)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(REPO)})
    sent = None
    if stop_after_checkpoint:
        file = model / checkpoint.CHECKPOINT_FILE
        while proc.poll() is None and sent is None:
            if file.exists():
                raw_state = torch.load(io.BytesIO(file.read_bytes()), weights_only=True)
                if raw_state["mid_epoch"]:
                    proc.send_signal(signal.SIGTERM)
                    sent = time.monotonic()
            time.sleep(0.02)
    _, stderr = proc.communicate()
    return proc.returncode, stderr, (time.monotonic() - sent) if sent is not None else None


def _final(model: pathlib.Path) -> tuple[dict[str, torch.Tensor], dict]:
    published = storage.open_published(model, step="train")
    return torch.load(io.BytesIO(published.read_bytes("model.pt")), weights_only=True), published.read_json("metrics.json")


def _setting(name: str, raw: dict, parts: str, work: pathlib.Path) -> dict:
    base = work / f"{name}-baseline"
    code, _, _ = _train(raw, parts, base, stop_after_checkpoint=False)
    assert code == 0
    lines = [json.loads(line) for line in storage.open_published(base, step="train").read_bytes("metrics.jsonl").decode().splitlines()]
    batch_s = sum(line["seconds"] for line in lines) / sum(line["batches_per_s"] * line["seconds"] for line in lines)
    weights, metrics = _final(base)
    interrupted = {**raw, "training": {**raw["training"], "checkpoint_every_batches": 20}}
    model = work / f"{name}-preempted"
    code, stderr, exit_s = _train(interrupted, parts, model, stop_after_checkpoint=True)
    assert code == 75, stderr[-2000:]
    written = re.search(r"SIGTERM: checkpoint at batch \S+ of epoch \d+ written in ([\d.]+) s", stderr)
    size = (model / checkpoint.CHECKPOINT_FILE).stat().st_size
    code, stderr, _ = _train(interrupted, parts, model, stop_after_checkpoint=False)
    assert code == 0 and "resuming from the checkpoint of batch" in stderr, stderr[-2000:]
    resumed, resumed_metrics = _final(model)
    metric = next(k for k in metrics if k.startswith("val_") and k != "val_count")
    return {
        "setting": name,
        "batch_s": round(batch_s, 4),
        "checkpoint_write_s": float(written.group(1)) if written else None,
        "sigterm_to_exit_s": round(exit_s or 0.0, 2),
        "exit_in_batches": round((exit_s or 0.0) / batch_s, 1),
        "checkpoint_kib": round(size / 1024, 1),
        "identical_model": all(torch.equal(weights[k], resumed[k]) for k in weights),
        "metric": metric,
        "baseline": round(metrics[metric], 4),
        "resumed": round(resumed_metrics[metric], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnflow-preemption-") as scratch:
        work = pathlib.Path(scratch)
        nodes, edges = write_demo_graph(generate_demo_graph(args.nodes, seed=0), work / "tables")
        graph = {
            "nodes": [{"type": "paper", "uri": str(nodes), "label_column": "label", "features": [{"columns": ["w*"]}]}],
            "edges": [{"type": "cites", "uri": str(edges), "src_type": "paper", "dst_type": "paper"}],
        }
        training = {"epochs": 3, "batch_size": 16, "early_stopping_patience": None}
        raw = {"graph": graph, "resources": {"world_size": 2}, "training": training}
        config = GnnflowConfig.model_validate(raw)
        root = storage.parse_uri(work)
        preprocess(config, root.join("pre"))
        serialize(config, root.join("pre"), root.join("tfr"))
        partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
        parts = str(root.join("parts"))
        rows.append(_setting("node classification, collocated", raw, parts, work))
        multiprocess = {**training, "sampling": "multiprocess", "sampling_workers": 1}
        rows.append(_setting("node classification, multiprocess", {**raw, "training": multiprocess}, parts, work))
        link = {**raw, "task": {"type": "link_prediction"}}
        link_config = GnnflowConfig.model_validate(link)
        preprocess(link_config, root.join("link-pre"))
        serialize(link_config, root.join("link-pre"), root.join("link-tfr"))
        partition(root.join("link-tfr"), root.join("link-parts"), link_config.partition, world_size=2)
        rows.append(_setting("link prediction, collocated", link, str(root.join("link-parts")), work))
    load = os.getloadavg()
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| setting | one batch (s) | checkpoint written in (s) | SIGTERM to exit (s) | = batches | checkpoint (KiB) | resumed model |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        outcome = "identical" if r["identical_model"] else f"{r['metric']} {r['resumed']} vs {r['baseline']}"
        print(f"| {r['setting']} | {r['batch_s']} | {r['checkpoint_write_s']} | {r['sigterm_to_exit_s']} | {r['exit_in_batches']} "
              f"| {r['checkpoint_kib']} | {outcome} |")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
