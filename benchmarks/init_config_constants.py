"""How `gnnflow init-config`'s learning constants are chosen: on validation metrics, over several graphs.

    .venv/bin/python benchmarks/init_config_constants.py [--graphs citeseer demo few_labels weak_homophily] [--seeds 0]
        [--variants hidden=128 row_normalize=on ...]   (the proposal itself always runs)

The constants of components/tables/proposal.py that decide what a proposed run learns are
PROPOSED_HIDDEN_CHANNELS (layer width), MIN_OPTIMIZER_STEPS (epochs and patience are raised so a
run takes at least that many steps) and ROW_NORMALIZE_MULTI_HOT (whether wide sparse 0/1 runs are
row-normalised). Each is varied one at a time around the proposal, on each graph:

  citeseer        ../shared/datasets/citeseer, its standard split (120 training labels)
  demo            the bundled demo generator (3,000 nodes, 5 classes, 64 words, homophily 0.8), random split
  few_labels      the demo generator with 6 classes, 256 words, homophily 0.7 and a split column that
                  labels 20 nodes a class for training and 500 for validation (CiteSeer's regime, planted)
  weak_homophily  the demo generator with 4 classes, 32 words, degree 10, homophily 0.5, random split

Every run goes through the real steps (preprocess, serialize, partition, train; one worker, the
proposal's default). Only validation accuracy is read and printed: the test split plays no part.
The rule: per constant, the value with the best mean validation accuracy over the graphs, except
that a cheaper value (narrower, fewer steps, no extra transform) within MARGIN of the best is kept.
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
from collections.abc import Callable

import numpy as np
import pandas as pd

from components import storage
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.runlog import configure
from components.serialize.step import serialize
from components.tables.proposal import MIN_OPTIMIZER_STEPS, PROPOSED_HIDDEN_CHANNELS, ROW_NORMALIZE_MULTI_HOT, propose_config
from components.train.step import train

CITESEER = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "citeseer"
MARGIN = 0.005  # about half the seed-to-seed spread of validation accuracy on these graphs
HIDDEN = (64, 128, 256)
STEPS = (100, 200, 400)


def _with_split(nodes: pathlib.Path, per_class: int, val: int, seed: int) -> None:
    """Adds a split column: ``per_class`` training labels a class, ``val`` validation nodes, the rest test."""
    table = pd.read_csv(nodes, dtype=str)
    rng = np.random.default_rng(seed)
    split = np.full(len(table), "test", dtype=object)
    labelled = table["label"].notna().to_numpy()
    for label in table["label"].dropna().unique():
        members = np.flatnonzero(table["label"].to_numpy() == label)
        split[rng.choice(members, size=per_class, replace=False)] = "train"
    rest = np.flatnonzero(labelled & (split == "test"))
    split[rng.choice(rest, size=val, replace=False)] = "val"
    table["split"] = split
    table.to_csv(nodes, index=False, compression={"method": "gzip", "mtime": 0})


def _demo(folder: pathlib.Path, split: bool, **shape: object) -> tuple[str, str, str | None]:
    nodes, edges = write_demo_graph(generate_demo_graph(**shape), folder)  # type: ignore[arg-type]
    if split:
        _with_split(nodes, per_class=20, val=500, seed=0)
    return str(nodes), str(edges), "split" if split else None


GRAPHS: dict[str, Callable[[pathlib.Path], tuple[str, str, str | None]]] = {
    "citeseer": lambda folder: (str(CITESEER / "nodes.csv.gz"), str(CITESEER / "edges.csv.gz"), "split"),
    "demo": lambda folder: _demo(folder, False, num_nodes=3000, seed=1),
    "few_labels": lambda folder: _demo(folder, True, num_nodes=3000, num_classes=6, num_word_features=256, homophily=0.7, seed=2),
    "weak_homophily": lambda folder: _demo(
        folder, False, num_nodes=3000, num_classes=4, num_word_features=32, avg_degree=10.0, homophily=0.5, seed=3
    ),
}


def variants() -> dict[str, dict]:
    """name → proposal arguments; 'proposal' is today's constants."""
    out = {
        "proposal": {
            "hidden_channels": PROPOSED_HIDDEN_CHANNELS,
            "min_optimizer_steps": MIN_OPTIMIZER_STEPS,
            "row_normalize_multi_hot": ROW_NORMALIZE_MULTI_HOT,
        }
    }
    for width in HIDDEN:
        out[f"hidden={width}"] = {**out["proposal"], "hidden_channels": width}
    for steps in STEPS:
        out[f"min_steps={steps}"] = {**out["proposal"], "min_optimizer_steps": steps}
    for flag in (False, True):
        out[f"row_normalize={'on' if flag else 'off'}"] = {**out["proposal"], "row_normalize_multi_hot": flag}
    return out


def run_graph(name: str, work: pathlib.Path, seeds: list[int], chosen: list[str]) -> dict[str, list[float]]:
    """Validation accuracy per variant (the proposal and those ``chosen``) and seed on one graph."""
    nodes, edges, split = GRAPHS[name](work / "tables")
    partitions: dict[bool, storage.Uri] = {}
    found: dict[str, list[float]] = {}
    proposal = variants()["proposal"]
    for variant, arguments in variants().items():
        if variant not in ("proposal", *chosen) or (variant != "proposal" and arguments == proposal):  # the proposal's run
            continue
        config = propose_config(
            nodes, edges, id_column="node_id", src_column="src", dst_column="dst", label_column="label", split_column=split, **arguments
        )
        key = arguments["row_normalize_multi_hot"]
        if key not in partitions:
            root = storage.parse_uri(work / f"rn{int(key)}")
            preprocess(config, root.join("pre"))
            serialize(config, root.join("pre"), root.join("tfr"))
            partitions[key] = partition(root.join("tfr"), root.join("parts"), config.partition, world_size=1).root
        for seed in seeds:
            seeded = config.model_copy(update={"training": config.training.model_copy(update={"seed": seed})})
            published = train(seeded, partitions[key], work / f"{variant}-{seed}")
            assert published is not None
            metrics = published.read_json("metrics.json")
            found.setdefault(variant, []).append(metrics["val_accuracy"])
            print(
                json.dumps(
                    {
                        "graph": name,
                        "variant": variant,
                        "seed": seed,
                        "val_accuracy": metrics["val_accuracy"],
                        "epochs": config.training.epochs,
                        "epochs_run": metrics["epochs_run"],
                    }
                ),
                flush=True,
            )
    for variant, arguments in variants().items():
        if arguments == proposal:
            found[variant] = found["proposal"]
    return found


def choose(table: dict[str, dict[str, list[float]]], candidates: list[str]) -> str:
    """The candidate (cheapest first) with the best mean validation accuracy over graphs, or a cheaper one within MARGIN."""
    candidates = [c for c in candidates if all(c in table[g] for g in table)]
    means = {c: statistics.mean(statistics.mean(table[g][c]) for g in table) for c in candidates}
    best = max(means.values())
    return next(c for c in candidates if means[c] >= best - MARGIN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--variants", nargs="+", default=list(variants()), choices=list(variants()))
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end)")
    args = parser.parse_args()
    configure(logging.WARNING)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnflow-constants-") as scratch:
        work = pathlib.Path(args.out or scratch)
        table = {name: run_graph(name, work / name, args.seeds, args.variants) for name in args.graphs}
    names = [v for v in variants() if all(v in table[g] for g in args.graphs)]
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.perf_counter() - start:.0f} s, seeds {args.seeds}")
    print("| variant | " + " | ".join(args.graphs) + " | mean |")
    print("|---" * (len(args.graphs) + 2) + "|")
    for variant in names:
        cells = [statistics.mean(table[g][variant]) for g in args.graphs]
        print(f"| {variant} | " + " | ".join(f"{c:.4f}" for c in cells) + f" | {statistics.mean(cells):.4f} |")
    print("chosen (validation accuracy, cheaper value kept within", MARGIN, "of the best):")
    print("  hidden:", choose(table, [f"hidden={w}" for w in HIDDEN]))
    print("  min_steps:", choose(table, [f"min_steps={s}" for s in STEPS]))
    print("  row_normalize:", choose(table, ["row_normalize=off", "row_normalize=on"]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
