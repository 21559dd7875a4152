"""Distributed training throughput: the train step (GLT, 1 and 2 workers) vs a single-process PyG
NeighborLoader loop with the same model, on an ogbn-arxiv-sized synthetic graph; prints markdown.

Graph (defaults: ogbn-arxiv's sizes): --nodes nodes with --dim float features and --classes labels
(uniform), features = --signal * (class centre) + N(0, 1) noise, --edges undirected edges of which a
--homophily fraction join two nodes of the same class (the others: uniformly random ends); node
split 80/10/10 at random. It is written straight into a published serialize output (shards,
graph_metadata.json, manifest.json; no CSV, no preprocess), then partitioned with
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

--profile W runs, instead of train(), a worker that mirrors `train_worker` on W ranks and times
(a) a sampling-only pass (collect_features False), (b) a sampling pass with features, (c)
forward+backward+step on cached batches, (d) one full training epoch, per rank; rank 0's
cProfile of (d) is printed (top functions by own time).

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
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WRITE_BATCH = 8192  # rows per encode_examples call, as serialize's Parquet batches
CONCURRENCY_ENV = "GNNFLOW_BENCH_SAMPLER_CONCURRENCY"

if __name__ == "__mp_main__" and os.environ.get(CONCURRENCY_ENV):
    # Spawned train workers import this file as __mp_main__ first: here the "multiprocess-fixed" rows raise
    # the worker_concurrency that components/train/sampling.py passes to GLT (GLT sizes the sample channel
    # as num_workers * worker_concurrency messages; with 1 it deadlocks after the first batch).
    import graphlearn_torch.distributed as _glt_distributed

    _mp_options = _glt_distributed.MpDistSamplingWorkerOptions

    def _mp_options_with_concurrency(*args, **kwargs):
        kwargs["worker_concurrency"] = max(kwargs.get("worker_concurrency", 1), int(os.environ[CONCURRENCY_ENV]))
        return _mp_options(*args, **kwargs)

    _glt_distributed.MpDistSamplingWorkerOptions = _mp_options_with_concurrency


# ----------------------------------------------------------------------------- the graph


def make_graph(nodes: int, edges: int, dim: int, classes: int, homophily: float, signal: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Labels, class-correlated features, homophilous undirected edges (each once), 80/10/10 split."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, classes, nodes)
    centres = rng.standard_normal((classes, dim), dtype=np.float32)
    features = rng.standard_normal((nodes, dim), dtype=np.float32)
    features += signal * centres[label]
    split = rng.choice(3, nodes, p=[0.8, 0.1, 0.1]).astype(np.int64)
    src = rng.integers(0, nodes, edges)
    dst = rng.integers(0, nodes, edges)
    same = rng.random(edges) < homophily
    by_class = np.argsort(label, kind="stable")  # node ids grouped by class
    counts = np.bincount(label, minlength=classes)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    c = label[src[same]]
    dst[same] = by_class[starts[c] + (rng.random(int(same.sum())) * counts[c]).astype(np.int64)]
    return {"label": label, "features": features, "split": split, "src": src, "dst": dst}


def write_serialized(out: Path, graph: dict[str, np.ndarray], classes: int):
    """A published serialize output of ``graph``, laid out as `components.serialize` writes it."""
    from components import storage
    from components.config import SerializeSpec
    from components.schema import NO_SPLIT, EdgeTypeSchema, GraphSchema, NodeTypeSchema
    from components.serialize.step import METADATA_FILE, shard_count
    from components.tfrecord import encode_examples

    nodes, dim = graph["features"].shape
    edges = len(graph["src"])
    node_ints = {"node_id": np.arange(nodes, dtype=np.int64), "label": graph["label"].astype(np.int64), "split": graph["split"]}
    edge_ints = {"edge_id": np.arange(edges, dtype=np.int64), "src": graph["src"], "dst": graph["dst"],
                 "split": np.full(edges, NO_SPLIT, np.int64)}
    with storage.staged_output(str(out), "serialize") as staging:
        files: dict[str, tuple[list[str], list[int]]] = {}
        for folder, ints, floats, rows, d in (
            ("nodes/paper", node_ints, {"features": graph["features"]}, nodes, dim),
            ("edges/paper__cites__paper", edge_ints, {"features": np.zeros((edges, 0), np.float32)}, edges, 0),
        ):
            count = shard_count(rows, d, SerializeSpec())
            bounds = np.linspace(0, rows, count + 1).astype(int)
            paths = [f"{folder}/shard-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]
            for i, path in enumerate(paths):
                with staging.open_write(path) as writer:
                    for lo in range(bounds[i], bounds[i + 1], WRITE_BATCH):
                        hi = min(lo + WRITE_BATCH, bounds[i + 1])
                        writer.write(encode_examples({k: v[lo:hi] for k, v in ints.items()}, {k: v[lo:hi] for k, v in floats.items()}))
            files[folder] = (paths, np.diff(bounds).tolist())
        split = graph["split"]
        sizes = {name: int((split == code).sum()) for name, code in (("train", 0), ("val", 1), ("test", 2))}
        node_type = NodeTypeSchema("paper", nodes, [f"f{j}" for j in range(dim)], [f"class_{c}" for c in range(classes)],
                                   sizes, files["nodes/paper"][0], file_rows=files["nodes/paper"][1])
        edge_type = EdgeTypeSchema("paper", "cites", "paper", edges, [], True, {"train": 0, "val": 0, "test": 0},
                                   files["edges/paper__cites__paper"][0], file_rows=files["edges/paper__cites__paper"][1])
        record_format = {"node_types": {"paper": {"int64": {"node_id": 1, "label": 1, "split": 1}, "float": {"features": dim}}},
                         "edge_types": {edge_type.name: {"int64": {"edge_id": 1, "src": 1, "dst": 1, "split": 1},
                                                         "float": {"features": 0}}}}
        metadata = GraphSchema("node_classification", "paper", {"paper": node_type}, {edge_type.name: edge_type}, record_format)
        staging.write_bytes(METADATA_FILE, metadata.to_json().encode())
        return staging.publish(counts={"nodes.paper": nodes, f"edges.{edge_type.name}": edges})


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


def _is_tracker(process: psutil.Process) -> bool:
    return "resource_tracker" in " ".join(process.cmdline())  # multiprocessing's helper, not a worker


class PeakMemory:
    """Samples the RSS of each direct child of this process (a worker) alone and with its descendants."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s, self.peaks, self.alone = interval_s, {}, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(self.interval_s):
            for child in me.children():
                try:
                    if _is_tracker(child):
                        continue
                    own = child.memory_info().rss
                    total = own + sum(p.memory_info().rss for p in child.children(recursive=True) if not _is_tracker(p))
                    key = (child.create_time(), child.pid)
                except psutil.Error:
                    continue
                self.peaks[key] = max(self.peaks.get(key, 0), total)
                self.alone[key] = max(self.alone.get(key, 0), own)

    def workers(self) -> list[tuple[int, int]]:
        """(peak alone, peak with descendants) per worker, in start order (the launcher starts ranks in order)."""
        return [(self.alone[k], self.peaks[k]) for k in sorted(self.peaks)]

    def __enter__(self) -> "PeakMemory":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


# ----------------------------------------------------------------------------- PyG baseline


def _build_model(in_dim: int, classes: int):
    from components.config import ModelSpec
    from components.train.model import NodeClassifier, homogeneous_encoder

    spec = ModelSpec()
    return NodeClassifier(homogeneous_encoder(in_dim, spec), spec.hidden_channels, classes)


def pyg_baseline(graph_path: str, threads: int, epochs: int, batch_size: int, fan_outs: list[int], seed: int, result) -> None:
    """Runs in a spawned process: PyG NeighborLoader training, the train step's loop and optimizer."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from components.train.metrics import confusion_matrix

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
            size = batch.batch_size
            optimizer.zero_grad()
            logits = model(batch.x, batch.edge_index)[:size]
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
            correct += int((model(batch.x, batch.edge_index)[: batch.batch_size].argmax(-1) == batch.y[: batch.batch_size]).sum())
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


def run_glt(partitions, out: Path, world_size: int, args: argparse.Namespace, timeout_s: float | None = None,
            concurrency: int | None = None, **training) -> dict:
    """`train()` with one config; on a time-out (SIGALRM in this thread) the launcher's own cleanup ends the workers."""
    import signal

    from components.errors import GnnflowError
    from components.train.step import train

    config = make_config(args, world_size, **training)
    load_before = load1()
    if concurrency:
        os.environ[CONCURRENCY_ENV] = str(concurrency)

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
        os.environ.pop(CONCURRENCY_ENV, None)
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


# ----------------------------------------------------------------------------- profile


def profile_worker(ctx, partitions_uri: str, config, collect_batches: int, num_rpc_threads: int) -> dict:
    """Mirrors `train_worker` up to the training loop, then times its parts separately."""
    import cProfile
    import io
    import pstats

    import graphlearn_torch as glt
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from components import storage
    from components.partition.dataset import node_splits, to_dist_dataset
    from components.partition.step import STEP as PARTITION_STEP
    from components.partition.store import read_partition
    from components.train.node_task import NodeTask, build_node_classifier
    from components.train.sampling import SamplingSetup

    ctx.init_process_group()
    torch.set_num_threads(1)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    part = read_partition(storage.open_published(partitions_uri, step=PARTITION_STEP), ctx.rank)
    schema = part.metadata.schema
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    dataset = to_dist_dataset(part)
    timings["load_partition_s"] = time.perf_counter() - start
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="gnnflow-bench")
    glt.distributed.init_rpc(master_addr=ctx.master_addr, master_port=ctx.rpc_port, num_rpc_threads=num_rpc_threads, rpc_timeout=300)
    setup = SamplingSetup(ctx, config.training, edge_dir)
    task = NodeTask(setup, dataset, part, node_splits(part), config)
    torch.manual_seed(0)
    model = build_node_classifier(schema, config, edge_dir)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    loader = task.loaders["train"]
    seeds = task.seed_counts["train"]

    def barrier():
        torch.distributed.barrier()

    # (a) sampling alone, without features (a loader of its own, same seeds and options).
    bare = glt.distributed.DistNeighborLoader(
        dataset, config.training.fan_outs, node_splits(part).train["paper"],
        batch_size=config.training.batch_size, shuffle=True, collect_features=False, edge_dir=edge_dir,
        random_seed=ctx.rank, worker_options=setup.worker_options(7),
    )
    barrier()
    start = time.perf_counter()
    nodes_sampled, n_bare = 0, 0
    for batch in bare:
        nodes_sampled += batch.node.numel()
        n_bare += 1
    timings["sample_no_features_s"] = time.perf_counter() - start
    bare.shutdown()
    # (b) sampling with features (the train loader itself); keep a few batches for (c).
    barrier()
    start = time.perf_counter()
    cached, n_feat = [], 0
    for batch in loader:
        n_feat += 1
        if len(cached) < collect_batches:
            cached.append(batch)
    timings["sample_with_features_s"] = time.perf_counter() - start
    # (c) forward + backward + step on cached batches, no sampling.
    barrier()
    model.train()
    start = time.perf_counter()
    for batch in cached:
        optimizer.zero_grad()
        logits = ddp(batch.x, batch.edge_index)[: batch.batch_size]
        y = batch.y.reshape(-1)[: batch.batch_size]
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
    timings["compute_per_batch_s"] = (time.perf_counter() - start) / max(len(cached), 1)
    # (d) a full training epoch as the train step runs it, under cProfile.
    barrier()
    profiler = cProfile.Profile()
    profiler.enable()
    result = task.train_epoch(ddp, optimizer, show_progress=False)
    profiler.disable()
    timings["train_epoch_s"] = result.seconds
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(18)
    barrier()
    task.shutdown()
    glt.distributed.barrier()
    glt.distributed.shutdown_rpc()
    torch.distributed.destroy_process_group()
    return {"rank": ctx.rank, "seeds": seeds, "batches_bare": n_bare, "batches": n_feat, "mean_nodes_per_batch": nodes_sampled / max(n_bare, 1),
            "local_nodes": len(part.nodes["paper"]["node_id"]), **timings, "profile": stream.getvalue()}


def run_profile(partitions, world_size: int, args: argparse.Namespace, num_rpc_threads: int, **training) -> list[dict]:
    from components.launcher import launch

    config = make_config(args, world_size, **training)
    return launch(profile_worker, (str(partitions), config, 8, num_rpc_threads), world_size=world_size)


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
                        help="extra GLT rows: multiprocess (sampling: multiprocess, 1 sampling worker, config as is), "
                             "multiprocess-fixed (the same with GLT worker_concurrency 2)")
    parser.add_argument("--variant-worlds", type=lambda s: [int(v) for v in s.split(",") if v], default=[2])
    parser.add_argument("--variant-timeout", type=float, default=150, help="seconds before the (hanging) multiprocess run is killed")
    parser.add_argument("--fixed-timeout", type=float, default=600, help="seconds before a multiprocess-fixed run is killed")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every setup, interleaved; the summary takes the fastest")
    parser.add_argument("--repeat-setups", type=lambda s: [v for v in s.split(",") if v], default=[],
                        help="setups that run again after the first round (default: all), e.g. pyg/2,collocated/1,collocated/2")
    parser.add_argument("--profile", type=lambda s: [int(v) for v in s.split(",") if v], default=[],
                        help="world sizes to profile (instead of nothing); see the docstring")
    parser.add_argument("--profile-rpc-threads", type=lambda s: [int(v) for v in s.split(",") if v], default=[4])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", help="scratch folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()

    import torch

    from components.partition.step import partition
    from components.config import PartitionSpec

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
            for w in args.profile:
                for threads in args.profile_rpc_threads:
                    load_before = load1()
                    results = run_profile(parts[w], w, args, threads)
                    print(f"### profile: {w} worker(s), num_rpc_threads {threads}, load {load_before:.2f} -> {load1():.2f}\n")
                    print("| rank | train seeds | local nodes | nodes/batch | sampling alone, no features | sampling + features | "
                          "compute (fwd+bwd+step) per batch | full epoch |")
                    print("|---|---:|---:|---:|---:|---:|---:|---:|")
                    for r in results:
                        print(f"| {r['rank']} | {r['seeds']:,} | {r['local_nodes']:,} | {r['mean_nodes_per_batch']:,.0f} | "
                              f"{r['sample_no_features_s']:.1f} s ({r['batches_bare'] / r['sample_no_features_s']:.2f} b/s) | "
                              f"{r['sample_with_features_s']:.1f} s ({r['batches'] / r['sample_with_features_s']:.2f} b/s) | "
                              f"{r['compute_per_batch_s'] * 1000:.0f} ms | {r['train_epoch_s']:.1f} s |")
                    print("\nrank 0 cProfile of the full epoch (main thread):\n\n```\n" + results[0]["profile"].strip() + "\n```\n", flush=True)
            return

        # Every setup runs --repeat times, interleaved (PyG, GLT, PyG, GLT, ...), so that each sees the
        # machine's other load at about the same times; the summary takes each setup's fastest run.
        runs: dict[str, list[dict]] = {}
        describe: dict[str, tuple[str, int]] = {}  # name → (label, world size or threads)
        for threads in args.pyg_threads:
            describe[f"pyg/{threads}"] = (f"PyG NeighborLoader, 1 process, {threads} thread(s)", threads)
        for w in args.worlds:
            describe[f"collocated/{w}"] = (f"GLT train step, {w} worker(s), collocated sampling (the default)", w)
        variant_labels = {
            "multiprocess": "`sampling: multiprocess`, `sampling_workers: 1` (config as is)",
            "multiprocess-fixed": "`sampling: multiprocess`, `sampling_workers: 1`, GLT worker_concurrency 2 (the proposed fix, patched in by this script)",
        }
        for variant in args.variants:
            if variant not in variant_labels:
                raise SystemExit(f"unknown variant {variant!r}")
            for w in args.variant_worlds:
                describe[f"{variant}/{w}"] = (f"GLT train step, {w} worker(s), {variant_labels[variant]}", w)
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
                    timeout = args.variant_timeout if kind == "multiprocess" else args.fixed_timeout
                    out = run_glt(parts[n], tmp / f"model-{kind}-{n}-{repeat}", n, args, timeout_s=timeout, sampling="multiprocess",
                                  sampling_workers=1, concurrency=2 if kind == "multiprocess-fixed" else None)
                    out["timeout_s"] = timeout
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
        print(f"All runs (epoch seconds: the `train_epoch` loop only, no evaluation; GLT: the slowest worker's; "
              f"memory: peak RSS of each process alone / with its children):\n")
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
                  f"(target <= 1.2: {'met' if ratio <= 1.2 else 'missed'})")
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
