"""Time to a stated validation accuracy on the arxiv-shaped graph: the four ways to train it, in one run.

    .venv/bin/python benchmarks/time_to_accuracy.py [--scale 1.0] [--target 0.90] [--budget-s 600]

Graph: the ogbn-arxiv-shaped generator of benchmarks/train_throughput.py (169,343 nodes, 1,166,243
undirected edges, 128 features, 40 classes, homophily 0.6, 80/10/10 split) times --scale; 2
partitions (hash). Every row trains the same model (GraphSAGE, 2 layers, hidden 64, mean
aggregation, dropout 0.5, linear head; Adam lr 0.01, weight decay 5e-4), evaluates validation
accuracy after every epoch, and stops at the first epoch at or above --target (or after --budget-s):

  sampled      gnnflow's train step, training.mode sampled, 2 workers (fan-outs 15/10, batch 1,024)
  full_graph   gnnflow's train step, training.mode full_graph, 2 workers (an epoch is one step)
  pyg_full     PyG full-batch, one process, 2 threads (an epoch is one step)
  pyg_loader   PyG NeighborLoader, one process, 2 threads (fan-outs 15/10, batch 1,024)

Per row: epochs to the target, training seconds to it (the epochs' training time alone: for the
train step the slowest worker's, from metrics) and wall seconds to it (from the row's start:
process start, data loading, evaluation and, for the train step, launching workers and loading
partitions). gnnflow rows read each epoch's end from the train step's checkpoint, which holds its
history and wall times, and are stopped once the target is reached.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.synthetic_graph import make_graph, write_serialized  # noqa: E402
from benchmarks.train_throughput import _build_model  # noqa: E402

ROWS = ("sampled", "full_graph", "pyg_full", "pyg_loader")


class _Stop(Exception):
    pass


def _config(mode: str, args: argparse.Namespace):
    import yaml

    from components.config import parse_config

    raw = {
        "graph": {"nodes": [{"type": "paper", "uri": "unused.csv", "label_column": "label", "features": [{"columns": ["f*"]}]}],
                  "edges": [{"type": "cites", "uri": "unused.csv", "src_type": "paper", "dst_type": "paper"}]},
        "resources": {"world_size": 2},
        "training": {"mode": mode, "epochs": 100_000, "batch_size": 1024, "fan_outs": [15, 10], "early_stopping_patience": None,
                     "stop_at_chance_epochs": None, "seed": args.seed},
    }
    return parse_config(yaml.safe_dump(raw), "benchmark config")


def run_step(mode: str, partitions, out: Path, args: argparse.Namespace) -> list[dict]:
    """The train step until the target or the budget; per epoch: val accuracy, train seconds, wall seconds since the start."""
    import torch

    from components.train import checkpoint
    from components.train.step import train

    saved = out / checkpoint.CHECKPOINT_FILE
    epochs: list[dict] = []
    start_wall = time.time()
    done = threading.Event()

    def watch() -> None:
        seen = -1
        while not done.wait(0.2):
            try:
                state = torch.load(io.BytesIO(saved.read_bytes()), weights_only=True)
            except (OSError, RuntimeError, EOFError):
                continue  # not written yet, or being replaced
            if len(state["history"]) == seen:
                continue
            seen = len(state["history"])
            epochs[:] = [
                {"val_accuracy": line["val_accuracy"], "train_s": line["seconds"], "wall_s": wall - start_wall}
                for line, wall in zip(state["history"], state["wall_times"])
            ]
            if epochs[-1]["val_accuracy"] >= args.target or time.time() - start_wall > args.budget_s:
                os.kill(os.getpid(), signal.SIGUSR1)
                return

    def stop(signum, frame):  # noqa: ANN001
        raise _Stop()

    previous = signal.signal(signal.SIGUSR1, stop)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        train(_config(mode, args), partitions, out)
    except _Stop:
        pass
    finally:
        done.set()
        signal.signal(signal.SIGUSR1, previous)
    return epochs


def pyg_row(loader: bool, graph_path: str, args_dict: dict, result) -> None:
    """Runs in a spawned process; puts the per-epoch rows (as run_step's) on ``result``."""
    start_wall = time.time()
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    torch.set_num_threads(2)
    torch.manual_seed(args_dict["seed"])
    g = torch.load(graph_path, weights_only=True)
    x, y = g["features"], g["label"]
    edge_index = torch.stack([torch.cat([g["src"], g["dst"]]), torch.cat([g["dst"], g["src"]])])
    train_mask, val_mask = g["split"] == 0, g["split"] == 1
    data = Data(x=x, y=y, edge_index=edge_index, num_nodes=len(x))
    model = _build_model(x.shape[1], int(y.max()) + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    batches = NeighborLoader(data, num_neighbors=[15, 10], batch_size=1024, input_nodes=train_mask.nonzero().flatten(), shuffle=True)
    val_batches = NeighborLoader(data, num_neighbors=[15, 10], batch_size=1024, input_nodes=val_mask.nonzero().flatten())
    epochs = []
    while True:
        model.train()
        began = time.perf_counter()
        for batch in batches if loader else [None]:
            optimizer.zero_grad()
            if loader:
                size = batch.batch_size
                loss = F.cross_entropy(model(batch)[:size], batch.y[:size])
            else:
                loss = F.cross_entropy(model.classify(model.encoder(x, edge_index))[train_mask], y[train_mask])
            loss.backward()
            optimizer.step()
        train_s = time.perf_counter() - began
        model.eval()
        with torch.no_grad():
            if loader:
                correct = sum(int((model(b)[: b.batch_size].argmax(-1) == b.y[: b.batch_size]).sum()) for b in val_batches)
            else:
                correct = int((model.classify(model.encoder(x, edge_index)).argmax(-1)[val_mask] == y[val_mask]).sum())
        epochs.append({"val_accuracy": correct / int(val_mask.sum()), "train_s": train_s, "wall_s": time.time() - start_wall})
        if epochs[-1]["val_accuracy"] >= args_dict["target"] or epochs[-1]["wall_s"] > args_dict["budget_s"]:
            break
    result.put(epochs)


def run_pyg(loader: bool, graph_path: Path, args: argparse.Namespace) -> list[dict]:
    spawn = multiprocessing.get_context("spawn")
    result = spawn.Queue()
    proc = spawn.Process(target=pyg_row, args=(loader, str(graph_path), vars(args), result))
    proc.start()
    epochs = result.get()
    proc.join()
    return epochs


def summary(name: str, epochs: list[dict], target: float, load: tuple[float, float]) -> str:
    reached = next((i for i, e in enumerate(epochs) if e["val_accuracy"] >= target), None)
    best = max((e["val_accuracy"] for e in epochs), default=0.0)
    if reached is None:
        spent = epochs[-1]["wall_s"] if epochs else 0.0
        return f"| {name} | not in {len(epochs)} epochs | - | not in {spent:.0f} s | {best:.4f} | {load[0]:.2f} → {load[1]:.2f} |"
    train_s = sum(e["train_s"] for e in epochs[: reached + 1])
    return f"| {name} | {reached + 1} | {train_s:.1f} | {epochs[reached]['wall_s']:.1f} | {best:.4f} | {load[0]:.2f} → {load[1]:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of ogbn-arxiv's nodes and edges")
    parser.add_argument("--target", type=float, default=0.90, help="validation accuracy to reach")
    parser.add_argument("--budget-s", type=float, default=600, help="wall seconds a row may take before it is stopped")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    from components.config import PartitionSpec
    from components.partition.step import partition
    from components.runtime.runlog import configure

    configure(30)  # warnings only: the table is the output
    nodes, edges = int(169_343 * args.scale), int(1_166_243 * args.scale)
    print(f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(f"graph: {nodes:,} nodes, {edges:,} undirected edges, 128 features, 40 classes; target val accuracy {args.target}")
    with tempfile.TemporaryDirectory(prefix="gnnflow-tta-") as scratch:
        tmp = Path(scratch)
        graph = make_graph(nodes, edges, 128, 40, 0.6, 0.12, args.seed)
        serialized = write_serialized(tmp / "tfrecords", graph, 40)
        graph_path = tmp / "graph.pt"
        torch.save({k: torch.from_numpy(v) for k, v in graph.items()}, graph_path)
        partitions = partition(serialized.root, tmp / "partitions", PartitionSpec(), world_size=2).root
        lines = []
        for row in args.rows:
            before = os.getloadavg()[0]
            if row in ("sampled", "full_graph"):
                epochs = run_step(row, partitions, tmp / f"model-{row}", args)
            else:
                epochs = run_pyg(row == "pyg_loader", graph_path, args)
            lines.append(summary(row, epochs, args.target, (before, os.getloadavg()[0])))
            print(lines[-1], flush=True)
    print("\n| row | epochs to target | train seconds to target | wall seconds to target | best val accuracy | load 1 min |")
    print("|---|---:|---:|---:|---:|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
