"""The whole pipeline on an ogbn-arxiv-sized synthetic graph, on this machine: time per step and total.

    .venv/bin/python benchmarks/pipeline_end_to_end.py [--workers 2] [--epochs 5] [--out DIR]

The graph is the bundled demo generator at ogbn-arxiv's size: 169,343 nodes, 1,166,243
undirected edges, 40 classes and 128 feature columns after preprocessing (118 binary word
columns, a standardized number, and an 8-venue categorical one-hot encoded into 9 slots). The
tables are written as gzipped CSV with opaque string ids, as a user would hand them over, so
preprocessing does the whole job (parse, enumerate ids, fit and apply transforms).
Each step runs through the same functions as ``gnnflow run``; the table and the JSON line at
the end give seconds per step, the total, and the rows per second of each step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import tempfile
import time

import psutil

from components import storage
from components.config import apply_overrides
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.runtime.runlog import configure
from components.serialize.output import read_graph_metadata
from components.tables.proposal import propose_config
from pipelines.local_run import RunOutputs, plan

NODES = 169_343
EDGES = 1_166_243
CLASSES = 40
WORD_COLUMNS = 118  # + score (1) + venue one-hot (8 venues + other) = 128 features


def write_tables(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, float]:
    start = time.perf_counter()
    graph = generate_demo_graph(NODES, num_classes=CLASSES, num_word_features=WORD_COLUMNS, avg_degree=2 * EDGES / NODES, seed=0)
    assert len(graph.edges) == EDGES, len(graph.edges)
    nodes, edges = write_demo_graph(graph, folder)
    return nodes, edges, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="world size of partition, train and infer")
    parser.add_argument("--epochs", type=int, default=5, help="training epochs (early stopping off)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--infer-mode", choices=["sampled", "exact"], default="sampled")
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end)")
    args = parser.parse_args()
    configure(logging.INFO)

    with tempfile.TemporaryDirectory(prefix="gnnflow-bench-") as scratch:
        work = pathlib.Path(args.out or scratch)
        nodes, edges, generate_s = write_tables(work / "tables")
        config = propose_config(str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst",
                                label_column="label", node_type="paper", relation="cites", output_root=str(work / "run"))
        config = apply_overrides(config, {
            "resources.world_size": args.workers, "training.epochs": args.epochs, "training.early_stopping_patience": None,
            "training.batch_size": args.batch_size, "training.fan_outs": [15, 10],
        }, "benchmark settings")
        outputs = RunOutputs.under(storage.parse_uri(work / "run"))
        timings: dict[str, float] = {}
        for step in plan(config, outputs, args.infer_mode):
            start = time.perf_counter()
            step.run()
            timings[step.name] = time.perf_counter() - start
        metrics = storage.open_published(outputs.report).read_json("metrics.json")
        pre = storage.open_published(outputs.preprocessed).manifest.counts
        paper = read_graph_metadata(storage.open_published(outputs.tfrecords)).node_types["paper"]

    total = sum(timings.values())
    rows = {"preprocess": NODES + EDGES, "serialize": NODES + EDGES, "partition": NODES + 2 * EDGES}
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB; "
          f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"graph: {pre}, {paper.feature_dim} features, {paper.num_classes} classes; tables generated in {generate_s:.1f}s (not counted)")
    print("| step | seconds | share | rows/s |\n|---|---:|---:|---:|")
    for name, seconds in timings.items():
        rate = f"{rows[name] / seconds:,.0f}" if name in rows else ""
        print(f"| {name} | {seconds:.1f} | {seconds / total:.0%} | {rate} |")
    print(f"| **total** | **{total:.1f}** ({total / 60:.1f} min) | | |")
    print(json.dumps({"workers": args.workers, "epochs": args.epochs, "seconds": {k: round(v, 1) for k, v in timings.items()},
                      "total_s": round(total, 1), "test_accuracy": metrics.get("test_accuracy")}))


if __name__ == "__main__":
    main()
