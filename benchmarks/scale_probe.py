"""Scale probe: every step of the pipeline as its own process on the demo generator's graph,
for 2 and 4 workers: wall seconds, rows/s and peak RSS per worker.

    .venv/bin/python benchmarks/scale_probe.py [--nodes 250000 1000000 4000000] [--workers 2 4]
        [--methods hash label_propagation] [--feature-storage int8] [--out DIR [--reuse]]

The graph: ``generate_demo_graph`` with average degree 10 (edges = 5 x nodes), 10 classes, 74
features, 8 gzipped CSV files per table. Its split column labels 5% of the nodes for training
and 1% each for validation and test (the rest take no part in the loss), so one training epoch
stays short while every worker still loads, partitions and samples from the whole graph: the
memory a worker needs is the graph's, not the seeds'. preprocess and serialize run once per size
(``engine: local``; ``benchmarks/data_engines.py`` compares the engines); partition and train
(1 epoch, batch 1024, fan-outs [10, 5]) once per worker count and partitioning method.

Peak RSS is sampled every 0.2 s for every worker process the step's launcher starts: the
worker alone and with its own children (loader subprocesses, GLT's sampling processes);
reported as the largest over workers. ``remote`` is the fraction of sampled nodes whose
features came from another partition during the epoch (from the train log).

``--feature-storage`` sets ``graph.nodes[].feature_storage`` (its outputs get the storage as a
suffix); ``--reuse`` keeps what an earlier run left in ``--out``: the tables and their config,
and the preprocess and serialize outputs of the same storage (their rows then say "reused").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.data_engines import write_tables  # noqa: E402
from benchmarks.peak_memory import worker_processes  # noqa: E402
from components.tables.proposal import propose_config  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SPLIT_FRACTIONS = {"train": 0.05, "val": 0.01, "test": 0.01}


def add_split(nodes_folder: pathlib.Path) -> None:
    """Rewrites the node files with a ``split`` column drawn with SPLIT_FRACTIONS (seeded)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    for path in sorted(nodes_folder.glob("*.csv.gz")):
        table = pd.read_csv(path)
        draw = rng.random(len(table))
        edges = np.cumsum(list(SPLIT_FRACTIONS.values()))
        table["split"] = np.select([draw < e for e in edges], list(SPLIT_FRACTIONS), "none")
        table.to_csv(path, index=False, compression={"method": "gzip", "mtime": 0})


def rss_parts(pid: int) -> tuple[int, int, int]:
    """A process's resident anonymous, file-backed and shared-memory bytes (/proc status)."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[name].split()[0]) * 1024 for name in ("RssAnon", "RssFile", "RssShmem"))  # type: ignore[return-value]


def run_step(command: list[str], log_file: pathlib.Path | None = None) -> dict:
    """Runs one step as a process: wall seconds and peak RSS of the largest worker (alone and
    with its children) and of the whole tree; the largest worker's anonymous / file / shared
    memory at its peak."""
    start = time.perf_counter()
    err = open(log_file, "w") if log_file else subprocess.PIPE
    process = subprocess.Popen([sys.executable, "-m", *command], cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True)
    parent = psutil.Process(process.pid)
    alone: dict[int, int] = {}
    parts: dict[int, tuple[int, int, int]] = {}
    with_children: dict[int, int] = {}
    tree = 0
    while process.poll() is None:
        try:
            total = parent.memory_info().rss
            for worker in worker_processes(parent):
                own = worker.memory_info().rss
                below = sum(c.memory_info().rss for c in worker.children(recursive=True))
                if own > alone.get(worker.pid, 0):
                    alone[worker.pid] = own
                    parts[worker.pid] = rss_parts(worker.pid)
                with_children[worker.pid] = max(with_children.get(worker.pid, 0), own + below)
                total += own + below
            tree = max(tree, total)
        except (psutil.Error, OSError, KeyError):  # KeyError: an exiting process has no Rss lines left
            pass
        time.sleep(0.2)
    if process.returncode:
        text = log_file.read_text() if log_file else process.communicate()[1]
        raise SystemExit(f"{command[0]} failed:\n{text[-3000:]}")
    if log_file:
        err.close()
    gib = 2**30
    largest = max(alone, key=alone.__getitem__, default=None)
    anon, file, shmem = parts[largest] if largest is not None else (0, 0, 0)
    return {"seconds": time.perf_counter() - start, "worker_gib": max(alone.values(), default=0) / gib,
            "peak_anon_gib": anon / gib, "peak_file_gib": file / gib, "peak_shmem_gib": shmem / gib,
            "worker_tree_gib": max(with_children.values(), default=0) / gib, "tree_gib": tree / gib}


def _tables(folder: pathlib.Path, count: int, reuse: bool) -> tuple[dict, int]:
    """(raw config, edges) of the probe's graph of ``count`` nodes under ``folder``: written now,
    or with ``reuse`` as an earlier run left them (its config in ``tables/config.yaml``)."""
    saved = folder / "tables" / "config.yaml"
    if reuse and saved.exists():
        raw = yaml.safe_load(saved.read_text())
        return raw, raw.pop("probe_edges")
    if reuse and (folder / "config.yaml").exists():  # left by a probe before --reuse: the edges from its serialize output
        graph = json.loads(next((folder / "tfr").glob("gen-*/graph_metadata.json")).read_text())
        return yaml.safe_load((folder / "config.yaml").read_text()), next(iter(graph["edge_types"].values()))["count"]
    nodes, edges, num_edges = write_tables(folder / "tables", count, 8)
    config = propose_config(str(nodes / "part-000.csv.gz"), str(edges / "part-000.csv.gz"), id_column="node_id",
                            src_column="src", dst_column="dst", label_column="label", output_root=str(folder / "run"))
    add_split(nodes)  # after proposing: the split column is no feature
    raw = config.model_dump(mode="json")
    raw["graph"]["nodes"][0]["uri"], raw["graph"]["edges"][0]["uri"] = str(nodes), str(edges)
    raw["graph"]["nodes"][0]["split_column"] = "split"
    raw["training"].update({"epochs": 1, "batch_size": 1024, "eval_batch_size": 4096, "fan_outs": [10, 5]})
    saved.write_text(yaml.safe_dump({**raw, "probe_edges": num_edges}))
    return raw, num_edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[250_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", default=["hash"])
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--cache-ratios", type=float, nargs="+", default=[],
                        help="train once per training.feature_cache_ratio (default: once, with the config's)")
    parser.add_argument("--feature-storage", help="graph.nodes[].feature_storage (default: the config's)")
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end)")
    parser.add_argument("--reuse", action="store_true", help="reuse the tables, preprocess and serialize outputs found in --out")
    parser.add_argument("--reuse-partitions", action="store_true", help="with --reuse: the partitions too (train only)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| nodes | step | workers | method | wall s | rows/s | worker peak alone / with children (GiB) | tree (GiB) | edge cut | epoch s | remote | worker at peak: anon / file / shmem (GiB) |")
    print("|---:|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|")
    results = []
    with tempfile.TemporaryDirectory(prefix="gnnflow-probe-") as scratch:
        work = pathlib.Path(args.out or scratch)
        for count in args.nodes:
            folder = work / f"n{count}"
            raw, num_edges = _tables(folder, count, args.reuse)
            if args.feature_storage:
                raw["graph"]["nodes"][0]["feature_storage"] = args.feature_storage
            suffix = f"-{args.feature_storage}" if args.feature_storage else ""
            pre, tfr = folder / f"pre{suffix}", folder / f"tfr{suffix}"
            rows = count + num_edges

            def report(step: str, workers: int, method: str, measured: dict, extra: str = "| | |") -> None:
                print(f"| {count:,} | {step} | {workers} | {method} | {measured['seconds']:.1f} | {rows / measured['seconds']:,.0f} | "
                      f"{measured['worker_gib']:.2f} / {measured['worker_tree_gib']:.2f} | {measured['tree_gib']:.2f} {extra} "
                      f"{measured['peak_anon_gib']:.2f} / {measured['peak_file_gib']:.2f} / {measured['peak_shmem_gib']:.2f} |", flush=True)
                results.append({"nodes": count, "step": step, "workers": workers, "method": method, **measured})

            path = folder / "config.yaml"
            path.write_text(yaml.safe_dump(raw))
            if args.reuse and (tfr / "manifest.json").exists():
                print(f"| {count:,} | preprocess, serialize | | reused {pre.name}, {tfr.name} | | | | | | | | |", flush=True)
            else:
                report("preprocess", 1, "local", run_step(["components.preprocess", "--config", str(path), "--output", str(pre)]))
                report("serialize", 1, "local", run_step(["components.serialize", "--config", str(path), "--input", str(pre),
                                                          "--output", str(tfr)]))
            for method in args.methods:
                for workers in args.workers:
                    raw["partition"]["method"] = method
                    raw["resources"]["world_size"] = workers
                    path.write_text(yaml.safe_dump(raw))
                    parts = folder / f"parts-{method}-{workers}{suffix}"
                    if args.reuse and args.reuse_partitions and (parts / "manifest.json").exists():
                        print(f"| {count:,} | partition | {workers} | reused {parts.name} | | | | | | | | |", flush=True)
                    else:
                        measured = run_step(["components.partition", "--config", str(path), "--input", str(tfr),
                                             "--output", str(parts), "--world-size", str(workers)])
                        cut = json.loads((next(parts.glob("gen-*/partition_metadata.json"))).read_text())["edge_cut"]
                        report("partition", workers, method, measured, f"| {next(iter(cut.values())):.3f} | |")
                    if args.skip_train:
                        continue
                    for ratio in args.cache_ratios or [None]:
                        if ratio is not None:
                            raw["training"]["feature_cache_ratio"] = ratio
                            path.write_text(yaml.safe_dump(raw))
                        label = method if ratio is None else f"{method}, cache {ratio:g}"
                        log = folder / f"train-{method}-{workers}-{ratio}{suffix}.log"
                        model = folder / f"model-{method}-{workers}-{ratio}{suffix}"
                        shutil.rmtree(model, ignore_errors=True)  # an earlier run's checkpoint would be resumed: no epoch
                        measured = run_step(["components.train", "--config", str(path), "--input", str(parts),
                                             "--output", str(model), "--world-size", str(workers)], log)
                        text = log.read_text()
                        epoch = re.findall(r"epoch 1/1: .*? in ([\d.]+)s", text)
                        remote = re.findall(r"remote ([\d.]+)%", text)
                        report("train", workers, label, measured,
                               f"| | {epoch[-1] if epoch else '?'} | {remote[-1] + '%' if remote else '?'} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
