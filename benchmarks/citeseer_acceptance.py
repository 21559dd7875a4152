"""Issue 12's accuracy acceptance on CiteSeer (standard split, 2 workers), over seeds 0, 1 and 2:
the mean test accuracy against the file's full-batch GraphSAGE reference, 0.700 (its README).

    .venv/bin/python benchmarks/citeseer_acceptance.py [--seeds 0 1 2] [--modes sampled full_graph]

  sampled     the config `gnnflow init-config` proposes for the CiteSeer tables
  full_graph  training.mode full_graph, GCN (the recipe of tests/test_full_graph.py)

Every run goes through the real steps; validation accuracy (at the best validation epoch, which
picks the model) is printed beside test accuracy. These are three 200-epoch trainings per mode,
about 7 minutes here in all: a measurement kept out of the test suite's time budget. The suite
checks the same code paths on one seed (tests/test_full_graph.py, tests/test_train.py) and what
init-config proposes (tests/test_sampled_accuracy.py). Exits 1 when a mean is below the reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

from components import storage
from components.config import GnnflowConfig
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.runlog import configure
from components.serialize.step import serialize
from components.tables.proposal import propose_config
from components.train.step import train

CITESEER = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "citeseer"
FULL_BATCH_SAGE = 0.700  # the reference in ../shared/datasets/citeseer/README


def sampled_config(task: str = "node_classification") -> GnnflowConfig:
    """init-config's proposal for CiteSeer on 2 workers: node classification on its standard split, or
    (``link_prediction``) its citations with a random edge split, label and split then being features."""
    labelled = {"label_column": "label", "split_column": "split"} if task == "node_classification" else {}
    proposed = propose_config(
        str(CITESEER / "nodes.csv.gz"),
        str(CITESEER / "edges.csv.gz"),
        id_column="node_id",
        src_column="src",
        dst_column="dst",
        task=task,  # type: ignore[arg-type]
        **labelled,
    )
    return proposed.model_copy(update={"resources": proposed.resources.model_copy(update={"world_size": 2})})


def full_graph_config() -> GnnflowConfig:
    paper = {"type": "paper", "uri": str(CITESEER / "nodes.csv.gz"), "label_column": "label", "split_column": "split"}
    return GnnflowConfig.model_validate(
        {
            "graph": {
                "nodes": [{**paper, "features": [{"columns": ["f*"]}]}],
                "edges": [{"type": "cites", "uri": str(CITESEER / "edges.csv.gz"), "src_type": "paper", "dst_type": "paper"}],
            },
            "serialize": {"num_shards": 2},
            "resources": {"world_size": 2},
            "model": {"type": "gcn"},
            "training": {"mode": "full_graph", "epochs": 200, "learning_rate": 0.01, "weight_decay": 5e-3, "early_stopping_patience": 100},
        }
    )


def run_mode(config: GnnflowConfig, root: storage.Uri, seeds: list[int]) -> list[dict]:
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
    runs = []
    for seed in seeds:
        seeded = config.model_copy(update={"training": config.training.model_copy(update={"seed": seed})})
        published = train(seeded, root.join("parts"), root.join(f"model{seed}"))
        assert published is not None
        metrics = published.read_json("metrics.json")
        runs.append({k: metrics[k] for k in ("val_accuracy", "test_accuracy", "best_epoch", "epochs_run", "test_count")})
        print(json.dumps({"seed": seed, **runs[-1]}), flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", default=["sampled", "full_graph"], choices=["sampled", "full_graph"])
    args = parser.parse_args()
    configure(logging.WARNING)
    configs = {"sampled": sampled_config, "full_graph": full_graph_config}
    start, failed = time.perf_counter(), False
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnflow-acceptance-") as scratch:
        for mode in args.modes:
            runs = run_mode(configs[mode](), storage.parse_uri(pathlib.Path(scratch) / mode), args.seeds)
            val, test = (statistics.mean(r[key] for r in runs) for key in ("val_accuracy", "test_accuracy"))
            failed |= test < FULL_BATCH_SAGE
            per_seed = {key: " / ".join(f"{r[key]:.3f}" for r in runs) for key in ("val_accuracy", "test_accuracy")}
            rows.append(f"| {mode} | {per_seed['val_accuracy']} | {per_seed['test_accuracy']} | {val:.4f} | {test:.4f} |")
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.perf_counter() - start:.0f} s, seeds {args.seeds}")
    print("| mode | val accuracy per seed | test accuracy per seed | mean val | mean test |\n|---|---|---|---:|---:|")
    print("\n".join(rows))
    verdict = "a mean is below it" if failed else "every mean reaches it"
    print(f"reference (full-batch GraphSAGE, the file's README): {FULL_BATCH_SAGE}; {verdict}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
