"""graphsage vs appnp vs gcnii on CiteSeer (standard split, 2 workers), sampled and full-graph:
validation accuracy (at the best validation epoch, which picks the model) and the median time
of an epoch. Test accuracy is not computed (training.evaluate_test false).

    .venv/bin/python benchmarks/propagation_models.py [--seed 0] [--models graphsage appnp gcnii] [--modes sampled full_graph]

Every run starts from the config `gnnflow init-config` proposes for the CiteSeer tables (what a
user gets) and changes only model.type (and training.mode); appnp and gcnii keep their own
defaults (appnp: a 2-layer MLP, K 10, teleport 0.1; gcnii: 16 layers, alpha 0.1, lambda 0.5).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import statistics
import tempfile
import time

from citeseer_acceptance import sampled_config

from components import storage
from components.config import GnnflowConfig
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.runlog import configure
from components.serialize.step import serialize
from components.train.step import train


def variant(base: GnnflowConfig, model_type: str, mode: str, seed: int) -> GnnflowConfig:
    """``base`` with another model type and mode, validated again (so gcnii gets its own depth)."""
    raw = base.model_dump(mode="json")
    model = {k: v for k, v in raw["model"].items() if k != "num_layers" or model_type == base.model.type}
    raw["model"] = {**model, "type": model_type}
    raw["training"] = {**raw["training"], "mode": mode, "seed": seed, "evaluate_test": False}
    return GnnflowConfig.model_validate(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", nargs="+", default=["graphsage", "appnp", "gcnii"])
    parser.add_argument("--modes", nargs="+", default=["sampled", "full_graph"], choices=["sampled", "full_graph"])
    args = parser.parse_args()
    configure(logging.WARNING)
    base = sampled_config()
    start, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="gnnflow-propagation-") as scratch:
        root = storage.parse_uri(pathlib.Path(scratch))
        preprocess(base, root.join("pre"))
        serialize(base, root.join("pre"), root.join("tfr"))
        partition(root.join("tfr"), root.join("parts"), base.partition, world_size=2)
        for mode in args.modes:
            for model_type in args.models:
                config = variant(base, model_type, mode, args.seed)
                began = time.perf_counter()
                published = train(config, root.join("parts"), root.join(f"{model_type}-{mode}"))
                assert published is not None
                metrics = published.read_json("metrics.json")
                history = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
                epoch = statistics.median(h["seconds"] for h in history)
                row = {
                    "model": model_type,
                    "mode": mode,
                    "layers": config.model.num_layers,
                    "val_accuracy": metrics["val_accuracy"],
                    "best_epoch": metrics["best_epoch"],
                    "epochs_run": metrics["epochs_run"],
                    "epoch_s": round(epoch, 4),
                    "wall_s": round(time.perf_counter() - began, 1),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.perf_counter() - start:.0f} s, seed {args.seed}")
    shown = base.training.model_dump(include={"epochs", "batch_size", "fan_outs", "learning_rate"})
    print(f"base: init-config's proposal (training: {shown})")
    print("| model | mode | val accuracy | best epoch / run | median epoch (s) | run wall (s) |\n|---|---|---:|---:|---:|---:|")
    for r in rows:
        best = f"{r['best_epoch']} / {r['epochs_run']}"
        print(f"| {r['model']} | {r['mode']} | {r['val_accuracy']:.3f} | {best} | {r['epoch_s']:.3f} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
