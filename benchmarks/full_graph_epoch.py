"""Seconds of one full-graph epoch (the train step's ``train_epoch`` and the validation pass that
follows it) on CiteSeer, per model and worker count; prints markdown.

Each row launches the real workers (:func:`components.runtime.launcher.launch`, gloo on
loopback), applies the train step's thread policy (``use_worker_threads``, work ``compute``),
reads the partitions and sets up :class:`FullGraphNodeTask` as the train step does, then times
--epochs epochs of ``train_epoch`` + ``evaluate('val')`` on every rank. The table gives the
slowest rank's median epoch (the first epoch, which builds the sparse chunk matrices, is
reported apart). No checkpoints, curves or metrics files: this is the epoch alone.

--profile writes rank 0's cProfile of the timed epochs to --tmp/profile-<model>-<workers>.txt.
Before/after: copy this script into a worktree of the older commit (``git worktree add
/work/scratch/fg-old HEAD``) and run it from there and from this tree, one after the other.

    python benchmarks/full_graph_epoch.py [--models graphsage,gcn,appnp,gcnii] [--workers 1,2] [--epochs 15]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

TREE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TREE))


def config_for(model: str, workers: int, epochs: int, threads: int | None = None):
    import yaml

    from components.config import parse_config
    from tests.shared_datasets import citeseer_graph

    raw = {
        "graph": citeseer_graph(),
        "serialize": {"num_shards": 2},
        "resources": {"world_size": workers, "threads": {"compute": threads}},
        "model": {"type": model},
        "training": {"mode": "full_graph", "epochs": epochs, "learning_rate": 0.01, "weight_decay": 5e-3, "seed": 0},
    }
    return parse_config(yaml.safe_dump(raw), "benchmark config")


def worker(ctx, config, partitions_root: str, epochs: int, profile: str | None) -> dict:
    import torch

    from components import storage
    from components.gnn.glt_dataset import read_for_worker
    from components.runtime.threads import use_worker_threads
    from components.train.full_graph import full_graph_setup
    from components.train.step import _seed_everything

    ctx.init_process_group(backend="gloo")
    threads = use_worker_threads(config.resources.threads, ctx.local_world_size, ctx.rank, "compute")
    part = read_for_worker(storage.open_published(storage.parse_uri(partitions_root)), ctx.rank, sampled=False)
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    task, model, ddp, _ = full_graph_setup(ctx, part, config, edge_dir, _seed_everything)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.training.learning_rate, weight_decay=config.training.weight_decay)
    _seed_everything(config.training.seed + ctx.rank)
    seconds, train_s, val = [], [], []
    profiler = cProfile.Profile() if profile and ctx.rank == 0 else None
    for epoch in range(epochs + 1):
        if profiler is not None and epoch == 1:
            profiler.enable()
        start = time.perf_counter()
        result = task.train_epoch(ddp, optimizer, show_progress=False)
        middle = time.perf_counter()
        metrics = task.evaluate(model, "val")
        seconds.append(time.perf_counter() - start)
        train_s.append(middle - start)
        val.append(metrics["accuracy"])
        del result
    if profiler is not None:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(45)
        Path(profile).write_text(out.getvalue())
    return {"seconds": seconds, "train": train_s, "val_accuracy": val, "threads": threads.compute}


def ensure_partitions(root: Path) -> dict[int, str]:
    done = root / "done.json"
    if done.exists():
        return {int(k): v for k, v in json.loads(done.read_text()).items()}
    from tests.shared_datasets import build_citeseer_node_partitions

    root.mkdir(parents=True, exist_ok=True)
    parts = {n: str(uri) for n, uri in build_citeseer_node_partitions(root).items()}
    done.write_text(json.dumps(parts))
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=lambda s: s.split(","), default=["graphsage", "gcn", "appnp", "gcnii"])
    parser.add_argument("--workers", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--tmp", default="/work/scratch/fg-speed", help="where the CiteSeer partitions are cached")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--threads", type=int, help="resources.threads.compute (default: the thread policy's)")
    parser.add_argument("--label", default=str(TREE))
    args = parser.parse_args()

    import logging

    import torch

    from components.runtime.launcher import launch

    logging.basicConfig(level=logging.WARNING)
    parts = ensure_partitions(Path(args.tmp) / "citeseer")
    print(
        f"tree={args.label} torch={torch.__version__} cpus={os.cpu_count()} load={tuple(round(v, 2) for v in os.getloadavg())} "
        f"at {time.strftime('%Y-%m-%d %H:%M:%S')}; CiteSeer, {args.epochs} timed epochs after 1 untimed\n",
        flush=True,
    )
    rows = []
    for model in args.models:
        for workers in args.workers:
            load = os.getloadavg()[0]
            profile = str(Path(args.tmp) / f"profile-{model}-{workers}.txt") if args.profile else None
            results = launch(
                worker, (config_for(model, workers, args.epochs, args.threads), parts[workers], args.epochs, profile), world_size=workers
            )
            slowest = [max(r["seconds"][e] for r in results) for e in range(args.epochs + 1)]
            train = [max(r["train"][e] for r in results) for e in range(args.epochs + 1)]
            row = {
                "model": model,
                "workers": workers,
                "threads": results[0]["threads"],
                "first": slowest[0],
                "median": statistics.median(slowest[1:]),
                "train_median": statistics.median(train[1:]),
                "val_accuracy": results[0]["val_accuracy"][-1],
                "load": (load, os.getloadavg()[0]),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        "\n| model | workers | threads each | first epoch s | epoch s (median) | of which train s | val acc (last) | load before / after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['workers']} | {r['threads']} | {r['first']:.3f} | {r['median']:.3f} | {r['train_median']:.3f} | "
            f"{r['val_accuracy']:.4f} | {r['load'][0]:.1f} / {r['load'][1]:.1f} |"
        )


if __name__ == "__main__":
    main()
