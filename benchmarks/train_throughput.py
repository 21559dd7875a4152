"""Distributed training throughput: the train step (GLT, 1 and 2 workers) vs a single-process PyG
NeighborLoader loop with the same model, on an ogbn-arxiv-sized synthetic graph; prints markdown.

Graph (defaults: ogbn-arxiv's sizes): --nodes nodes with --dim float features and --classes labels
(uniform), features = --signal * (class centre) + N(0, 1) noise, --edges undirected edges of which a
--homophily fraction join two nodes of the same class (the others: uniformly random ends); node
split 80/10/10 at random. It is written straight into a published serialize output (shards,
graph_metadata.json, manifest.json; no CSV, no preprocess; `benchmarks/synthetic_graph.py`), then partitioned with
`components.partition.step.partition(..., world_size=1)` and `(..., world_size=2)` (untimed).

Rows (every row trains the same model: the project's GraphSAGE defaults, hidden 64, 2 layers,
dropout 0.5, mean aggregation, + linear head; Adam lr 0.01, wd 5e-4; fan-outs --fan-outs, batch
--batch-size):
- PyG: `torch_geometric.loader.NeighborLoader` (num_workers 0, shuffle) over the train nodes of the
  whole graph (both edge directions), the same loop as `NodeTask._train_batches`, in a spawned
  process of its own with `torch.set_num_threads(T)` for T in --pyg-threads; epoch seconds timed
  around the loop over the loader (sampling + training, no evaluation), like the train step's.
- GLT: the project's real `components.train.step.train(config, partitions, output)` with
  training.epochs --epochs, early_stopping_patience null, resources.world_size W (each worker
  calls torch.set_num_threads(1)); epoch seconds and batches/s read from the published
  metrics.jsonl (seconds: slowest worker's `train_epoch`; batches/s: all workers' batches / that).
  `--variants` adds rows with other training options (e.g. sampling: multiprocess).
Peak memory: RSS of each direct child of this process (a worker; the launcher's resource
tracker excluded), alone and with its descendants (GLT sampling subprocesses), sampled every
0.5 s. Load average (1 min) before and after each row.

--profile W runs, instead of train(), the per-rank timing and cProfile of `benchmarks/train_profile.py`
on W ranks (--profile-rpc-threads: GLT RPC threads per rank).

    python benchmarks/train_throughput.py [--nodes 169343] [--edges 1166243] [--epochs 2]
        [--worlds 1,2] [--pyg-threads 2,1] [--variants multiprocess] [--profile 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.peak_memory import PeakMemory  # noqa: E402
from benchmarks.synthetic_graph import make_graph, write_serialized  # noqa: E402
from benchmarks.train_profile import print_profile, profile_worker  # noqa: E402

# Extra GLT rows (--variants): name → (label, training options).
VARIANTS = {
    "multiprocess": ("`sampling: multiprocess`, `sampling_workers: 1`", {"sampling": "multiprocess", "sampling_workers": 1}),
    "multiprocess-2": ("`sampling: multiprocess`, `sampling_workers: 2`", {"sampling": "multiprocess", "sampling_workers": 2}),
    "replace": ("`replace: true` (GLT 0.2.4's own draw, with replacement)", {"replace": True}),
}


def make_config(args: argparse.Namespace, world_size: int, **training):
    """A config for the train step; its graph section names tables that train never reads."""
    import yaml

    from components.config import parse_config

    raw = {
        "graph": {"nodes": [{"type": "paper", "uri": "unused.csv", "label_column": "label"}],
                  "edges": [{"type": "cites", "uri": "unused.csv", "src_type": "paper", "dst_type": "paper"}]},
        "resources": {"world_size": world_size},
        "training": {"epochs": args.epochs, "batch_size": args.batch_size, "fan_outs": args.fan_outs,
                     "early_stopping_patience": None, **training},
    }
    return parse_config(yaml.safe_dump(raw), "benchmark config")


# ----------------------------------------------------------------------------- measuring


def load1() -> float:
    return os.getloadavg()[0]


# ----------------------------------------------------------------------------- PyG baseline


def _build_model(in_dim: int, classes: int):
    """The project's GraphSAGE + head. On PyG's NeighborLoader batches (without pyg-lib they carry
    no per-hop counts) it runs the plain forward over every node, as PyG's examples do; the train
    step's GLT batches are encoded layer-trimmed (components/gnn/hop_trimming.py)."""
    from components.config import ModelSpec
    from components.gnn.model import HomogeneousSAGE, NodeClassifier

    spec = ModelSpec()
    return NodeClassifier(HomogeneousSAGE("node", in_dim, spec), spec.hidden_channels, classes, "node")


def pyg_baseline(graph_path: str, threads: int, epochs: int, batch_size: int, fan_outs: list[int], seed: int, result) -> None:
    """Runs in a spawned process: PyG NeighborLoader training, the train step's loop and optimizer."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from components.gnn.metrics import confusion_matrix

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    g = torch.load(graph_path, weights_only=True)
    x, y = g["features"], g["label"]
    src, dst = g["src"], g["dst"]
    data = Data(x=x, y=y, edge_index=torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]), num_nodes=len(x))
    classes = int(y.max()) + 1
    train_nodes = torch.nonzero(g["split"] == 0).flatten()
    val_nodes = torch.nonzero(g["split"] == 1).flatten()
    start = time.perf_counter()
    loader = NeighborLoader(data, num_neighbors=fan_outs, batch_size=batch_size, input_nodes=train_nodes, shuffle=True)
    setup_s = time.perf_counter() - start
    model = _build_model(x.shape[1], classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    rows = []
    for epoch in range(epochs):
        model.train()
        load_before = load1()
        cpu_start = time.process_time()
        start = time.perf_counter()
        batches, total_loss, count = 0, 0.0, 0
        confusion = torch.zeros((classes, classes), dtype=torch.int64)
        for batch in loader:
            assert "num_sampled_nodes" not in batch, "the PyG baseline is meant untrimmed"
            size = batch.batch_size
            optimizer.zero_grad()
            logits = model(batch)[:size]
            target = batch.y[:size]
            loss = F.cross_entropy(logits, target)
            loss.backward()
            optimizer.step()
            total_loss += float(loss) * size
            count += size
            batches += 1
            confusion += confusion_matrix(logits.argmax(-1).detach(), target, classes)
        seconds = time.perf_counter() - start
        rows.append({"epoch": epoch, "seconds": seconds, "batches": batches, "cpu_s": time.process_time() - cpu_start, "loss": total_loss / count,
                     "train_accuracy": float(confusion.diag().sum() / confusion.sum()), "load_before": load_before, "load_after": load1()})
    # Sampling alone (one pass over the loader, no model), to split the epoch into its parts.
    start = time.perf_counter()
    sampled = sum(1 for _ in loader)
    sample_s = time.perf_counter() - start
    model.eval()
    correct = 0
    with torch.no_grad():
        for batch in NeighborLoader(data, num_neighbors=fan_outs, batch_size=1024, input_nodes=val_nodes):
            correct += int((model(batch)[: batch.batch_size].argmax(-1) == batch.y[: batch.batch_size]).sum())
    result.put({"epochs": rows, "setup_s": setup_s, "sample_only_s": sample_s, "sample_only_batches": sampled,
                "val_accuracy": correct / len(val_nodes), "peak_rss_self": psutil.Process().memory_info().rss})


def run_pyg(graph_path: Path, threads: int, args: argparse.Namespace) -> dict:
    spawn = multiprocessing.get_context("spawn")
    result = spawn.Queue()
    with PeakMemory() as memory:
        proc = spawn.Process(target=pyg_baseline, args=(str(graph_path), threads, args.pyg_epochs, args.batch_size,
                                                        args.fan_outs, args.seed, result))
        proc.start()
        out = result.get()
        proc.join()
    if proc.exitcode:
        raise RuntimeError(f"PyG baseline exited with {proc.exitcode}")
    out["peak_rss"] = max((alone for alone, _ in memory.workers()), default=0)
    return out


# ----------------------------------------------------------------------------- GLT train step


class Timeout(Exception):
    pass


def _sysv_segments() -> list[dict[str, int]]:
    """SysV shared-memory segments (GLT's sample channels are such segments)."""
    try:
        with open("/proc/sysvipc/shm") as table:
            header, *rows = [line.split() for line in table]
    except OSError:
        return []
    return [{k: int(v) for k, v in zip(header, row)} for row in rows]


def run_glt(partitions, out: Path, world_size: int, args: argparse.Namespace, timeout_s: float | None = None, **training) -> dict:
    """`train()` with one config; on a time-out (SIGALRM in this thread) the launcher's own cleanup ends the workers."""
    import signal

    from components.errors import GnnflowError
    from components.train.step import train

    config = make_config(args, world_size, **training)
    load_before = load1()

    def expire(signum, frame):
        raise Timeout()

    previous = signal.signal(signal.SIGALRM, expire)
    published, wall = None, None
    try:
        with PeakMemory() as memory:
            start = time.perf_counter()
            if timeout_s:
                signal.alarm(int(timeout_s))
            failed = None
            try:
                published = train(config, partitions, out)
            except Timeout:
                pass
            except GnnflowError as error:  # a worker failed: reported as this run's result
                failed = str(error)
            finally:
                signal.alarm(0)
            wall = time.perf_counter() - start
    finally:
        signal.signal(signal.SIGALRM, previous)
    result = {"wall": wall, "memory": memory.workers()[:world_size], "load_before": load_before, "load_after": load1(),
              "timed_out": published is None and failed is None, "failed": failed}
    # Segments that the workers created and nobody holds any more (leaked by a killed run).
    workers = {pid for _, pid in sorted(memory.peaks)}
    leaked = [s for s in _sysv_segments() if s["cpid"] in workers and s["nattch"] == 0]
    result["leaked_segments"] = [(s["shmid"], s["size"]) for s in leaked]
    if published is not None:
        result["epochs"] = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
        result["final"] = published.read_json("metrics.json")
    return result


# ----------------------------------------------------------------------------- main


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=169_343)
    parser.add_argument("--edges", type=int, default=1_166_243, help="undirected edges")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=40)
    parser.add_argument("--homophily", type=float, default=0.6, help="fraction of edges inside a class")
    parser.add_argument("--signal", type=float, default=0.12, help="class-centre scale in the features (noise std 1)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fan-outs", type=lambda s: [int(v) for v in s.split(",")], default=[15, 10])
    parser.add_argument("--epochs", type=int, default=2, help="GLT epochs")
    parser.add_argument("--pyg-epochs", type=int, default=2)
    parser.add_argument("--pyg-threads", type=lambda s: [int(v) for v in s.split(",") if v], default=[2, 1])
    parser.add_argument("--worlds", type=lambda s: [int(v) for v in s.split(",") if v], default=[1, 2])
    parser.add_argument("--variants", type=lambda s: [v for v in s.split(",") if v], default=[],
                        help="extra GLT rows: " + ", ".join(f"{k} ({v[0]})" for k, v in VARIANTS.items()))
    parser.add_argument("--variant-worlds", type=lambda s: [int(v) for v in s.split(",") if v], default=[2])
    parser.add_argument("--variant-timeout", type=float, default=600, help="seconds before a variant's run is killed")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every setup, interleaved; the summary takes the fastest")
    parser.add_argument("--repeat-setups", type=lambda s: [v for v in s.split(",") if v], default=[],
                        help="setups that run again after the first round (default: all), e.g. pyg/2,collocated/1,collocated/2")
    parser.add_argument("--profile", type=lambda s: [int(v) for v in s.split(",") if v], default=[],
                        help="world sizes to profile (instead of nothing); see the docstring")
    parser.add_argument("--profile-rpc-threads", type=lambda s: [int(v) for v in s.split(",") if v], default=[1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", help="scratch folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()

    import torch

    from components.config import PartitionSpec
    from components.partition.step import partition

    logging.basicConfig(level=logging.WARNING)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    import graphlearn_torch
    import torch_geometric

    print(f"python={platform.python_version()} torch={torch.__version__} torch_geometric={torch_geometric.__version__} "
          f"graphlearn_torch={getattr(graphlearn_torch, '__version__', '0.2.4')} cpus={os.cpu_count()} cpu={cpu!r} "
          f"ram={psutil.virtual_memory().total / 2**30:.0f}GiB load={tuple(round(v, 2) for v in os.getloadavg())} "
          f"at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    tmp = Path(tempfile.mkdtemp(prefix="gnnflow-train-bench-", dir=args.tmp))
    try:
        start = time.perf_counter()
        graph = make_graph(args.nodes, args.edges, args.dim, args.classes, args.homophily, args.signal, args.seed)
        serialized = write_serialized(tmp / "tfrecords", graph, args.classes)
        graph_path = tmp / "graph.pt"
        torch.save({k: torch.from_numpy(v) for k, v in graph.items()}, graph_path)
        prep_s = time.perf_counter() - start
        worlds = sorted(set(args.worlds) | (set(args.variant_worlds) if args.variants else set()) | set(args.profile))
        parts, part_s = {}, {}
        for w in worlds:
            start = time.perf_counter()
            parts[w] = partition(serialized.root, tmp / f"partitions{w}", PartitionSpec(), world_size=w).root
            part_s[w] = time.perf_counter() - start
        train_seeds = int((graph["split"] == 0).sum())
        same = float((graph["label"][graph["src"]] == graph["label"][graph["dst"]]).mean())
        print(f"graph: {args.nodes:,} nodes, {args.edges:,} undirected edges ({2 * args.edges:,} directed), dim {args.dim}, "
              f"{args.classes} classes, edge homophily {same:.2f}, {train_seeds:,} train seeds; "
              f"batch {args.batch_size}, fan-outs {args.fan_outs}; generated + serialized in {prep_s:.1f} s, partitioned in "
              + ", ".join(f"{part_s[w]:.1f} s ({w} part.)" for w in worlds) + "\n", flush=True)
        del graph

        if args.profile:
            from components.runtime.launcher import launch

            for w in args.profile:
                for threads in args.profile_rpc_threads:
                    load_before = load1()
                    results = launch(profile_worker, (str(parts[w]), make_config(args, w), 8, threads), world_size=w)
                    print_profile(w, threads, (load_before, load1()), results)
            return

        # Every setup runs --repeat times, interleaved (PyG, GLT, PyG, GLT, ...), so that each sees the
        # machine's other load at about the same times; the summary takes each setup's fastest run.
        runs: dict[str, list[dict]] = {}
        describe: dict[str, tuple[str, int]] = {}  # name → (label, world size or threads)
        for threads in args.pyg_threads:
            describe[f"pyg/{threads}"] = (f"PyG NeighborLoader, 1 process, {threads} thread(s)", threads)
        for w in args.worlds:
            describe[f"collocated/{w}"] = (f"GLT train step, {w} worker(s), collocated sampling (the default)", w)
        for variant in args.variants:
            if variant not in VARIANTS:
                raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
            for w in args.variant_worlds:
                describe[f"{variant}/{w}"] = (f"GLT train step, {w} worker(s), {VARIANTS[variant][0]}", w)
        for repeat in range(args.repeat):
            for name, (label, n) in describe.items():
                kind = name.split("/")[0]
                if repeat and name not in (args.repeat_setups or describe):
                    continue
                if kind == "pyg":
                    out = run_pyg(graph_path, n, args)
                elif kind == "collocated":
                    out = run_glt(parts[n], tmp / f"model-{kind}-{n}-{repeat}", n, args)
                else:
                    out = run_glt(parts[n], tmp / f"model-{kind}-{n}-{repeat}", n, args, timeout_s=args.variant_timeout, **VARIANTS[kind][1])
                    out["timeout_s"] = args.variant_timeout
                    for shmid, _ in out.get("leaked_segments", []):
                        subprocess.run(["ipcrm", "-m", str(shmid)], check=False)
                out["repeat"] = repeat
                runs.setdefault(name, []).append(out)
                print(f"{name} #{repeat}: {json.dumps(out, default=str)}", file=sys.stderr, flush=True)

        def epochs_of(name: str, out: dict) -> list[dict]:
            """Per epoch: seconds, batches, batches/s, train/val accuracy, load."""
            if name.startswith("pyg"):
                return [{"epoch": e["epoch"], "seconds": e["seconds"], "batches": e["batches"], "batches_per_s": e["batches"] / e["seconds"],
                         "train_accuracy": e["train_accuracy"], "val_accuracy": out["val_accuracy"], "cpu_s": e["cpu_s"],
                         "load": f"{e['load_before']:.2f} → {e['load_after']:.2f}"} for e in out["epochs"]]
            return [{"epoch": e["epoch"], "seconds": e["seconds"], "batches": round(e["batches_per_s"] * e["seconds"]),
                     "batches_per_s": e["batches_per_s"], "train_accuracy": e.get("train_accuracy", float("nan")),
                     "val_accuracy": e["val_accuracy"], "cpu_s": None,
                     "load": f"{out['load_before']:.2f} → {out['load_after']:.2f} (whole run)"} for e in out.get("epochs", [])]

        def memory_of(name: str, out: dict) -> str:
            if name.startswith("pyg"):
                return mib(out["peak_rss"])
            return "; ".join(f"rank {rank}: {mib(a)} / {mib(t)}" for rank, (a, t) in enumerate(out["memory"]))

        last = {name: min((epochs_of(name, out)[-1]["seconds"], out["repeat"]) for out in outs if epochs_of(name, out))
                for name, outs in runs.items() if any(epochs_of(name, out) for out in outs)}
        base_name = f"pyg/{max(args.pyg_threads)}"
        base = last[base_name][0]
        print("All runs (epoch seconds: the `train_epoch` loop only, no evaluation; GLT: the slowest worker's; "
              "memory: peak RSS of each process alone / with its children):\n")
        print("| setup | run | epoch | epoch seconds | batches | batches/s | train acc | val acc | peak RSS | load (1 min) before → after |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for name, outs in runs.items():
            for out in outs:
                label = describe[name][0]
                if out.get("failed"):
                    print(f"| {label} | {out['repeat']} | - | failed: {out['failed'].splitlines()[0][:120]} | | | | | "
                          f"{memory_of(name, out)} | {out['load_before']:.2f} → {out['load_after']:.2f} (whole run) |")
                    continue
                if out.get("timed_out"):
                    print(f"| {label} | {out['repeat']} | - | did not finish; killed after {out['timeout_s']:.0f} s | | | | | "
                          f"{memory_of(name, out)} | {out['load_before']:.2f} → {out['load_after']:.2f} (whole run) |")
                    continue
                for e in epochs_of(name, out):
                    print(f"| {label} | {out['repeat']} | {e['epoch']} | {e['seconds']:.1f} | {e['batches']} | {e['batches_per_s']:.2f} | "
                          f"{e['train_accuracy']:.3f} | {e['val_accuracy']:.3f} | {memory_of(name, out)} | {e['load']} |")
        print(f"\nSummary: each setup's fastest last epoch (epoch {args.epochs - 1} for GLT, {args.pyg_epochs - 1} for PyG) "
              f"over {args.repeat} run(s):\n")
        print(f"| setup | epoch seconds | batches/s | vs {describe[base_name][0]} | peak RSS per process (that run) |")
        print("|---|---:|---:|---:|---|")
        for name, (seconds, repeat) in last.items():
            out = runs[name][[o["repeat"] for o in runs[name]].index(repeat)]
            e = epochs_of(name, out)[-1]
            print(f"| {describe[name][0]} | {seconds:.1f} | {e['batches_per_s']:.2f} | {seconds / base:.2f}x | {memory_of(name, out)} |")
        print()
        for name, outs in runs.items():
            for out in outs:
                if name.startswith("pyg"):
                    n = out["sample_only_batches"]
                    cpu = ", ".join(f"{e['cpu_s']:.1f}" for e in out["epochs"])
                    print(f"- {name} run {out['repeat']}: process CPU seconds per epoch {cpu}; a sampling-only pass over the loader "
                          f"(no model): {out['sample_only_s']:.1f} s, {n / out['sample_only_s']:.2f} batches/s")
                elif out.get("failed"):
                    print(f"- {name} run {out['repeat']}: failed after {out['wall']:.0f} s: {out['failed']}")
                elif out.get("timed_out"):
                    leaked = out["leaked_segments"]
                    print(f"- {name} run {out['repeat']}: killed after {out['wall']:.0f} s; SysV shared-memory segments the workers left: "
                          f"{len(leaked)} ({sum(size for _, size in leaked) / 2**20:,.0f} MiB; removed by this script)")
                else:
                    print(f"- {name} run {out['repeat']}: `train()` wall {out['wall']:.1f} s for {len(out['epochs'])} epochs (spawn, load, "
                          f"RPC set-up, per-epoch validation, final evaluation, publish); test accuracy {out['final'].get('test_accuracy', float('nan')):.3f}")
        if "collocated/2" in last:
            ratio = last["collocated/2"][0] / base
            print(f"\nratio (fastest 2-worker GLT epoch) / (fastest {describe[base_name][0]} epoch): {ratio:.2f} "
                  f"(issue 24's target <= 0.5: {'met' if ratio <= 0.5 else 'missed'})")
            paired = [g["epochs"][-1]["seconds"] / p["epochs"][-1]["seconds"]
                      for g, p in zip(runs["collocated/2"], runs[base_name]) if "epochs" in g]
            print(f"ratio per repeat (runs next to each other): {', '.join(f'{r:.2f}' for r in paired)}")
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
