"""preprocess + serialize with ``engine: local`` and ``engine: beam`` on the same tables: wall
seconds, rows/s and peak memory, each step as its own process (as a pipeline task runs it).

    .venv/bin/python benchmarks/data_engines.py [--nodes 250000 1000000] [--files 8] [--beam-workers 2] [--out DIR]

The graph is the bundled demo generator (average degree 10, 64 word columns, a score and a
venue), written as ``--files`` gzipped CSV files per table: what a warehouse export hands over,
and what lets Beam workers share a table. rows/s counts node rows plus edge rows over the two
steps. Peak RSS is sampled every 0.2 s: the largest single process and the sum over the step's
process tree (the Beam launcher plus its worker processes).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import yaml

from components.demo.graph import generate_demo_graph
from components.tables.proposal import propose_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def write_tables(folder: pathlib.Path, nodes: int, files: int) -> tuple[pathlib.Path, pathlib.Path, int]:
    graph = generate_demo_graph(nodes, num_classes=10, avg_degree=10.0, seed=0)
    for name, table in (("nodes", graph.nodes), ("edges", graph.edges)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i, part in enumerate(np.array_split(np.arange(len(table)), files)):
            table.iloc[part].to_csv(folder / name / f"part-{i:03d}.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})
    return folder / "nodes", folder / "edges", len(graph.edges)


def run_step(command: list[str]) -> dict[str, float]:
    """Runs one step as a process; its wall seconds and peak RSS (largest process, whole tree)."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", *command], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(process.pid)
    largest = tree = 0
    while process.poll() is None:
        try:
            members = [parent, *parent.children(recursive=True)]
            sizes = [m.memory_info().rss for m in members]
            largest, tree = max(largest, max(sizes)), max(tree, sum(sizes))
        except psutil.Error:
            pass
        time.sleep(0.2)
    _, err = process.communicate()
    if process.returncode:
        raise SystemExit(f"{command[0]} failed:\n{err[-3000:]}")
    return {"seconds": time.perf_counter() - start, "largest_gib": largest / 2**30, "tree_gib": tree / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[250_000])
    parser.add_argument("--files", type=int, default=8, help="files per table")
    parser.add_argument("--beam-workers", type=int, default=2, help="local Beam worker processes")
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB")
    print("| nodes | edges | engine | preprocess s | serialize s | rows/s | peak RSS largest / tree (GiB) |")
    print("|---:|---:|---|---:|---:|---:|---|")
    results = []
    with tempfile.TemporaryDirectory(prefix="gnnflow-engines-") as scratch:
        work = pathlib.Path(args.out or scratch)
        for count in args.nodes:
            folder = work / f"n{count}"
            nodes, edges, num_edges = write_tables(folder / "tables", count, args.files)
            config = propose_config(str(nodes / "part-000.csv.gz"), str(edges / "part-000.csv.gz"), id_column="node_id",
                                    src_column="src", dst_column="dst", label_column="label", output_root=str(folder / "run"))
            raw = config.model_dump(mode="json")
            raw["graph"]["nodes"][0]["uri"], raw["graph"]["edges"][0]["uri"] = str(nodes), str(edges)
            for engine in ("local", "beam"):
                raw["preprocess"]["engine"] = engine
                raw["preprocess"]["beam"]["num_workers"] = args.beam_workers
                path = folder / f"config.{engine}.yaml"
                path.write_text(yaml.safe_dump(raw))
                out = folder / engine
                pre = run_step(["components.preprocess", "--config", str(path), "--output", str(out / "pre")])
                ser = run_step(["components.serialize", "--config", str(path), "--input", str(out / "pre"), "--output", str(out / "tfr")])
                rows = count + num_edges
                rate = 2 * rows / (pre["seconds"] + ser["seconds"])
                peak = max(pre["largest_gib"], ser["largest_gib"]), max(pre["tree_gib"], ser["tree_gib"])
                print(f"| {count:,} | {num_edges:,} | {engine} | {pre['seconds']:.1f} | {ser['seconds']:.1f} | {rate:,.0f} | "
                      f"{peak[0]:.2f} / {peak[1]:.2f} |", flush=True)
                results.append({"nodes": count, "edges": num_edges, "engine": engine, "preprocess": pre, "serialize": ser, "rows_per_s": rate})
    for count in args.nodes:
        local, beam = (next(r for r in results if r["nodes"] == count and r["engine"] == e) for e in ("local", "beam"))
        print(f"{count:,} nodes: beam at {beam['rows_per_s'] / local['rows_per_s']:.0%} of local's rows/s")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
