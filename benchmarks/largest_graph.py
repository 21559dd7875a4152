"""The largest graph on this machine: the whole pipeline, preprocess to infer, every step as its
own process, on a streamed generated graph (:mod:`benchmarks.large_tables`).

    .venv/bin/python benchmarks/largest_graph.py --nodes 25000000 --edge-rows 100000000 \
        --features 128 --workers 4 --feature-storage int8 --out /work/scratch/largest [--free-disk]

Per step: wall seconds, rows/s, the largest worker's peak RSS (alone / with children), the
whole tree's, and the bytes of the step's output. ``--free-disk`` deletes each output's data files
(those of 16 MiB or more) once the next step has consumed them (tables after preprocess,
preprocessed after serialize, TFRecords after partition), for a machine whose disk holds no
more than two outputs at a time; manifests and metadata stay, as train follows the partitions'
lineage back to the preprocess run. The printed sizes are taken before deletion. Train: one epoch, batch 1024, fan-outs [10, 5];
5% of the nodes are training seeds. Infer embeds every node.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

import psutil
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.large_tables import LargeGraph, table_config, write_edges, write_nodes  # noqa: E402
from benchmarks.scale_probe import run_step  # noqa: E402


# A consumed output keeps its manifest and metadata (train follows the partitions' lineage back to
# the preprocess run's transforms and schema, and checks each manifest's generation); only its
# data files go.
KEPT_FILE_BYTES = 16 << 20


def free_data_files(folder: pathlib.Path) -> None:
    """Deletes ``folder``'s files of ``KEPT_FILE_BYTES`` or more (the rows: tables, shards)."""
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_size >= KEPT_FILE_BYTES:
            path.unlink()


def folder_bytes(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--edge-rows", type=int, help="undirected edge rows (default: 4 x nodes: 8 directed edges a node)")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--feature-storage", default=None, help="graph.nodes[].feature_storage (default: the config's)")
    parser.add_argument("--steps", nargs="+", default=["tables", "preprocess", "serialize", "partition", "train", "infer"])
    parser.add_argument("--free-disk", action="store_true", help="delete each output once the next step has read it")
    parser.add_argument("--out", required=True, help="work folder")
    args = parser.parse_args()
    graph = LargeGraph(nodes=args.nodes, edge_rows=args.edge_rows or 4 * args.nodes, features=args.features)
    work = pathlib.Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}; graph: {graph}")
    raw = table_config(graph, work / "tables", work / "run")
    if args.feature_storage:
        raw["graph"]["nodes"][0]["feature_storage"] = args.feature_storage
    raw["resources"] = {"world_size": args.workers}
    raw["training"] = {"epochs": 1, "batch_size": 1024, "eval_batch_size": 4096, "fan_outs": [10, 5]}
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    outputs = {"tables": work / "tables", "preprocess": work / "pre", "serialize": work / "tfr", "partition": work / "parts",
               "train": work / "model", "infer": work / "emb"}
    consumed_by = {"preprocess": "tables", "serialize": "preprocess", "partition": "serialize"}
    rows = graph.nodes + graph.edge_rows
    commands = {
        "preprocess": ["components.preprocess", "--config", str(config), "--output", str(outputs["preprocess"])],
        "serialize": ["components.serialize", "--config", str(config), "--input", str(outputs["preprocess"]),
                      "--output", str(outputs["serialize"])],
        "partition": ["components.partition", "--config", str(config), "--input", str(outputs["serialize"]),
                      "--output", str(outputs["partition"]), "--world-size", str(args.workers)],
        "train": ["components.train", "--config", str(config), "--input", str(outputs["partition"]),
                  "--output", str(outputs["train"]), "--world-size", str(args.workers)],
        "infer": ["components.infer", "--config", str(config), "--partitions", str(outputs["partition"]),
                  "--model", str(outputs["train"]), "--output", str(outputs["infer"]), "--world-size", str(args.workers)],
    }
    print("| step | workers | wall s | rows/s | worker peak alone / with children (GiB) | tree (GiB) | output GiB | load avg |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    results = []
    for step in args.steps:
        load = os.getloadavg()[0]
        if step == "tables":
            start = time.perf_counter()
            write_nodes(graph, outputs["tables"] / "nodes")
            write_edges(graph, outputs["tables"] / "edges")
            measured = {"seconds": time.perf_counter() - start, "worker_gib": 0.0, "worker_tree_gib": 0.0, "tree_gib": 0.0}
        else:
            measured = run_step(commands[step], work / f"{step}.log")
        size = folder_bytes(outputs[step])
        workers = args.workers if step in ("partition", "train", "infer") else 1
        print(f"| {step} | {workers} | {measured['seconds']:.1f} | {rows / measured['seconds']:,.0f} | "
              f"{measured['worker_gib']:.2f} / {measured['worker_tree_gib']:.2f} | {measured['tree_gib']:.2f} | "
              f"{size / 2**30:.2f} | {load:.1f} |", flush=True)
        results.append({"step": step, "workers": workers, "output_bytes": size, "load_average": load, **measured})
        if args.free_disk and step in consumed_by:
            free_data_files(outputs[consumed_by[step]])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
