"""Full-graph (SAR) vs sampled training on an ogbn-arxiv-sized synthetic graph, against PyG's
single-process full-batch and mini-batch loops in the same run; prints markdown.

Graph: as `benchmarks/train_throughput.py` (defaults: ogbn-arxiv's sizes, 169,343 nodes,
1,166,243 undirected edges, 128 features, 40 classes, homophily 0.6, 80/10/10 split), written
straight into a published serialize output and partitioned for --workers workers (untimed).
--scale s multiplies the node and edge counts (for machines where the full size takes too long).

Rows, all the same model (GraphSAGE, 2 layers, hidden 64, mean aggregation, dropout 0.5, linear
head; Adam lr 0.01, wd 5e-4), --epochs epochs each:
- PyG full-batch: one spawned process holding the whole graph (both edge directions), one
  optimizer step per epoch over all training nodes, --pyg-threads intra-op threads.
- PyG mini-batch: `NeighborLoader` (fan-outs --fan-outs, batch --batch-size), the loop of
  `benchmarks/train_throughput.py`; validation accuracy from sampled neighbourhoods.
- gnnflow sampled: the real train step, `training.mode: sampled`, --workers workers.
- gnnflow full_graph: the real train step, `training.mode: full_graph`, --workers workers.
Epoch seconds: PyG's around the training loop; the train step's from its metrics.jsonl (slowest
worker's `train_epoch`, without validation); the summary takes the mean of epochs 2..last (the
first pays one-off costs). Validation accuracy after the last epoch (PyG: of that model; the
train step: metrics.jsonl's last line). Peak RSS: each worker process alone, sampled every 0.5 s.

    python benchmarks/full_graph.py [--scale 1.0] [--epochs 5] [--workers 2] [--pyg-threads 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.peak_memory import PeakMemory  # noqa: E402
from benchmarks.synthetic_graph import make_graph, write_serialized  # noqa: E402
from benchmarks.train_throughput import _build_model, run_pyg  # noqa: E402


def make_config(args: argparse.Namespace, mode: str):
    """A train-step config; its graph section names tables that train never reads."""
    import yaml

    from components.config import parse_config

    raw = {
        "graph": {"nodes": [{"type": "paper", "uri": "unused.csv", "label_column": "label", "features": [{"columns": ["f*"]}]}],
                  "edges": [{"type": "cites", "uri": "unused.csv", "src_type": "paper", "dst_type": "paper"}]},
        "resources": {"world_size": args.workers},
        "training": {"mode": mode, "epochs": args.epochs, "batch_size": args.batch_size, "fan_outs": args.fan_outs,
                     "early_stopping_patience": None, "seed": args.seed},
    }
    return parse_config(yaml.safe_dump(raw), "benchmark config")


def pyg_full_batch(graph_path: str, threads: int, epochs: int, seed: int, result) -> None:
    """Runs in a spawned process: the whole graph in memory, one full-batch step per epoch."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    g = torch.load(graph_path, weights_only=True)
    x, y = g["features"], g["label"]
    edge_index = torch.stack([torch.cat([g["src"], g["dst"]]), torch.cat([g["dst"], g["src"]])])
    train, val = g["split"] == 0, g["split"] == 1
    model = _build_model(x.shape[1], int(y.max()) + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    seconds = []
    for _ in range(epochs):
        model.train()
        start = time.perf_counter()
        optimizer.zero_grad()
        logits = model.classify(model.encoder(x, edge_index))
        F.cross_entropy(logits[train], y[train]).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    model.eval()
    with torch.no_grad():
        pred = model.classify(model.encoder(x, edge_index)).argmax(-1)
    result.put({"seconds": seconds, "val_accuracy": float((pred[val] == y[val]).float().mean())})


def run_pyg_full_batch(graph_path: Path, args: argparse.Namespace) -> dict:
    spawn = multiprocessing.get_context("spawn")
    result = spawn.Queue()
    with PeakMemory() as memory:
        proc = spawn.Process(target=pyg_full_batch, args=(str(graph_path), args.pyg_threads, args.epochs, args.seed, result))
        proc.start()
        out = result.get()
        proc.join()
    if proc.exitcode:
        raise RuntimeError(f"PyG full-batch baseline exited with {proc.exitcode}")
    return {**out, "peak_rss": [max((alone for alone, _ in memory.workers()), default=0)]}


def run_step(partitions, out: Path, args: argparse.Namespace, mode: str) -> dict:
    """The real train step; epoch seconds and the last validation accuracy from metrics.jsonl."""
    from components.train.step import train

    with PeakMemory() as memory:
        start = time.perf_counter()
        published = train(make_config(args, mode), partitions, out)
        wall = time.perf_counter() - start
    lines = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
    return {"seconds": [line["seconds"] for line in lines], "val_accuracy": lines[-1]["val_accuracy"], "wall": wall,
            "peak_rss": [alone for alone, _ in memory.workers()[: args.workers]]}


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def steady(seconds: list[float]) -> float:
    """Mean epoch seconds without the first epoch (when there are more)."""
    rest = seconds[1:] or seconds
    return sum(rest) / len(rest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=169_343)
    parser.add_argument("--edges", type=int, default=1_166_243, help="undirected edges")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies --nodes and --edges")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=40)
    parser.add_argument("--homophily", type=float, default=0.6)
    parser.add_argument("--signal", type=float, default=0.12)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fan-outs", type=lambda s: [int(v) for v in s.split(",")], default=[15, 10])
    parser.add_argument("--pyg-threads", type=int, default=2)
    parser.add_argument("--rows", type=lambda s: [v for v in s.split(",") if v], default=["pyg_full", "pyg_mini", "sampled", "full_graph"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", help="scratch folder (default: a new temporary folder)")
    args = parser.parse_args()
    nodes, edges = int(args.nodes * args.scale), int(args.edges * args.scale)

    import torch
    import torch_geometric

    from components.config import PartitionSpec
    from components.partition.step import partition

    logging.basicConfig(level=logging.WARNING)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"python={platform.python_version()} torch={torch.__version__} torch_geometric={torch_geometric.__version__} "
          f"cpus={os.cpu_count()} cpu={cpu!r} ram={psutil.virtual_memory().total / 2**30:.0f}GiB "
          f"load={tuple(round(v, 2) for v in os.getloadavg())} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="gnnflow-full-graph-bench-", dir=args.tmp))
    try:
        graph = make_graph(nodes, edges, args.dim, args.classes, args.homophily, args.signal, args.seed)
        serialized = write_serialized(tmp / "tfrecords", graph, args.classes)
        graph_path = tmp / "graph.pt"
        torch.save({k: torch.from_numpy(v) for k, v in graph.items()}, graph_path)
        del graph
        parts = partition(serialized.root, tmp / "partitions", PartitionSpec(), world_size=args.workers).root
        print(f"graph: {nodes:,} nodes, {edges:,} undirected edges, dim {args.dim}, {args.classes} classes "
              f"(scale {args.scale}); {args.workers} partitions; {args.epochs} epochs per row\n", flush=True)
        results: dict[str, dict] = {}
        for row in args.rows:
            load_before = os.getloadavg()[0]
            if row == "pyg_full":
                results[row] = run_pyg_full_batch(graph_path, args)
            elif row == "pyg_mini":
                mini = argparse.Namespace(pyg_epochs=args.epochs, batch_size=args.batch_size, fan_outs=args.fan_outs, seed=args.seed)
                out = run_pyg(graph_path, args.pyg_threads, mini)
                results[row] = {"seconds": [e["seconds"] for e in out["epochs"]], "val_accuracy": out["val_accuracy"],
                                "peak_rss": [out["peak_rss"]]}
            else:
                results[row] = run_step(parts, tmp / f"model-{row}", args, row)
            results[row]["load"] = (load_before, os.getloadavg()[0])
            print(f"{row}: {json.dumps(results[row])}", flush=True)
        labels = {"pyg_full": f"PyG full-batch, 1 process, {args.pyg_threads} thread(s)",
                  "pyg_mini": f"PyG NeighborLoader mini-batch, 1 process, {args.pyg_threads} thread(s)",
                  "sampled": f"gnnflow `training.mode: sampled`, {args.workers} workers",
                  "full_graph": f"gnnflow `training.mode: full_graph`, {args.workers} workers"}
        base = steady(results["sampled"]["seconds"]) if "sampled" in results else None
        print("| setup | epoch seconds (mean of epochs 2..) | sampled epoch / this | val accuracy after "
              f"{args.epochs} epochs | peak RSS per process | load (1 min) before / after |")
        print("|---|---:|---:|---:|---|---|")
        for row, r in results.items():
            ratio = f"{base / steady(r['seconds']):.1f}x" if base else "-"
            print(f"| {labels[row]} | {steady(r['seconds']):.2f} | {ratio} | {r['val_accuracy']:.4f} | "
                  f"{', '.join(mib(v) for v in r['peak_rss'])} | {r['load'][0]:.1f} / {r['load'][1]:.1f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
