"""Partitioned loading and partitioning throughput, on synthetic data; prints markdown tables.

(a) Loader: node records (int64 node_id, label, split; float32 features of --dim) in --shards
    shards, each written with `encode_examples` in 8192-row batches as the serialize step does.
    Measured, each the best of --repeat rounds over all readers on the same files (page cache warm):
    - raw read: just the files' bytes (`Path.read_bytes`);
    - ours: `decode_tfrecord_file` on those bytes, and `read_entity` (what a loader child
      runs: read + decode + concatenate into torch tensors), one process, one thread;
    - GiGL-style baseline: the same rows written in GiGL's layout (one float key per feature
      column), read with `tf.data.TFRecordDataset` -> `batch(10000)` -> `tf.io.parse_example`,
      columns stacked into an (n, dim) matrix, batches concatenated into torch tensors; once
      sequential and once with tf.data's AUTOTUNE parallel reads and parsing.
(b) Partition step: a graph of --nodes nodes (--dim features, 7 classes) and --edges random
    undirected edges (no features, like serialize's output for a node-classification graph)
    written straight into a published serialize output (shards, graph_metadata.json,
    manifest.json; `benchmarks/synthetic_graph.py`), then `components.partition.step.partition(..., world_size=--world-size)`.
    Reported: input edges / wall second, each worker's loading and partition+write seconds
    (from its log), and each worker's peak RSS (worker process plus its loader children,
    sampled every 0.5 s; shared-memory tensors handed from a child to its worker count in both).

    python benchmarks/partition_throughput.py [--rows 500000] [--nodes 1000000] [--edges 10000000]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.peak_memory import PeakMemory  # noqa: E402
from benchmarks.synthetic_graph import WRITE_BATCH, make_graph, write_serialized  # noqa: E402
from components import storage  # noqa: E402
from components.config import PartitionSpec  # noqa: E402
from components.tfrecord import decode_tfrecord_file, encode_examples  # noqa: E402

BATCH = 10_000  # the baseline's tf.data batch
PARTITION_CLASSES = 7
LOG_ENV = "GNNFLOW_BENCH_LOG"

if __name__ == "__mp_main__" and os.environ.get(LOG_ENV):
    # Spawned partition workers import this file as __mp_main__: send their step logs to a file.
    handler = logging.FileHandler(os.environ[LOG_ENV])
    handler.setFormatter(logging.Formatter("%(process)d %(name)s: %(message)s"))
    logging.getLogger("gnnflow").addHandler(handler)
    logging.getLogger("gnnflow").setLevel(logging.INFO)


def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def write_shards(folder: Path, ints: dict[str, np.ndarray], floats: dict[str, np.ndarray], shards: int) -> list[Path]:
    rows = len(next(iter(ints.values())))
    bounds = np.linspace(0, rows, shards + 1).astype(int)
    paths = []
    for i in range(shards):
        path = folder / f"shard-{i:05d}-of-{shards:05d}.tfrecord"
        with path.open("wb") as f:
            for lo in range(bounds[i], bounds[i + 1], WRITE_BATCH):
                hi = min(lo + WRITE_BATCH, bounds[i + 1])
                f.write(encode_examples({k: v[lo:hi] for k, v in ints.items()}, {k: v[lo:hi] for k, v in floats.items()}))
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- (a) loader


def loader_benchmark(args: argparse.Namespace, tmp: Path) -> None:
    import tensorflow as tf
    import torch

    from components.partition.loading import EntityLoad, read_entity

    rng = np.random.default_rng(0)
    rows, dim = args.rows, args.dim
    ints = {"node_id": np.arange(rows, dtype=np.int64), "label": rng.integers(-1, 7, rows), "split": rng.integers(0, 3, rows)}
    feats = rng.standard_normal((rows, dim)).astype(np.float32)
    (tmp / "ours").mkdir()
    (tmp / "gigl").mkdir()
    ours = write_shards(tmp / "ours", ints, {"features": feats}, args.shards)
    names = [f"feat_{j:05d}" for j in range(dim)]
    gigl = write_shards(tmp / "gigl", ints, {n: feats[:, j:j + 1] for j, n in enumerate(names)}, args.shards)
    int64_keys, float_keys = {"node_id": 1, "label": 1, "split": 1}, {"features": dim}

    def raw_read() -> int:
        return sum(len(p.read_bytes()) for p in ours)

    def decode_ours() -> dict[str, np.ndarray]:
        parts = [decode_tfrecord_file(p.read_bytes(), int64_keys, float_keys, source=str(p)) for p in ours]
        return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}

    expected = tuple(storage.Expected(storage.FileEntry.of(p.read_bytes()), "the benchmark's own record") for p in ours)
    root = str(storage.parse_uri(str(tmp / "ours")))
    job = EntityLoad("node", "paper", root, tuple(p.name for p in ours), expected, int64_keys, float_keys)

    spec = {k: tf.io.FixedLenFeature([], tf.int64) for k in int64_keys}
    spec.update({n: tf.io.FixedLenFeature([], tf.float32) for n in names})

    def parse(batch: tf.Tensor) -> dict[str, tf.Tensor]:
        parsed = tf.io.parse_example(batch, spec)
        out = {k: parsed[k] for k in int64_keys}
        out["features"] = tf.stack([parsed[n] for n in names], axis=1)
        return out

    def gigl_reader(parallel: bool) -> Callable[[], dict[str, torch.Tensor]]:
        auto = tf.data.AUTOTUNE if parallel else None
        files = [str(p) for p in gigl]
        dataset = (tf.data.TFRecordDataset(files, num_parallel_reads=auto).batch(BATCH)
                   .map(parse, num_parallel_calls=auto).prefetch(tf.data.AUTOTUNE if parallel else 2))

        def run() -> dict[str, torch.Tensor]:
            batches = [{k: v.numpy() for k, v in b.items()} for b in dataset]
            return {k: torch.from_numpy(np.concatenate([b[k] for b in batches])) for k in batches[0]}

        return run

    readers = {"raw": raw_read, "decode": decode_ours, "entity": lambda: read_entity(job),
               "gigl_seq": gigl_reader(False), "gigl_par": gigl_reader(True)}
    results = {name: fn() for name, fn in readers.items()}  # warm-up: page cache, tf.function tracing
    times: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(args.repeat):  # rounds over all readers, so a busy moment hits them alike
        for name, fn in readers.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    measured = {name: (min(times[name]), results[name]) for name in readers}
    # Every reader must produce the same rows (the parallel baseline may interleave files).
    want = np.sort(ints["node_id"])
    for name in ("decode", "entity", "gigl_seq", "gigl_par"):
        got = measured[name][1]
        ids = np.asarray(got["node_id"])
        order = np.argsort(ids)
        assert np.array_equal(ids[order], want), name
        np.testing.assert_array_equal(np.asarray(got["features"])[order].reshape(rows, dim), feats, err_msg=name)
        np.testing.assert_array_equal(np.asarray(got["label"])[order], ints["label"], err_msg=name)

    size = sum(p.stat().st_size for p in ours)
    gigl_size = sum(p.stat().st_size for p in gigl)
    base = measured["gigl_seq"][0]
    print(f"### (a) loader: {rows:,} node rows, dim {dim}, {args.shards} shards "
          f"(ours {size / 1e6:.1f} MB, GiGL layout {gigl_size / 1e6:.1f} MB), best of {args.repeat} rounds\n")
    print(f"{load()} (1/5/15 min) at the end of (a)\n")
    print("| measurement | seconds | rows/s | MB/s of our shards | vs GiGL-style sequential | vs GiGL-style AUTOTUNE |")
    print("|---|---:|---:|---:|---:|---:|")
    labels = {
        "gigl_seq": f"GiGL-style: tf.data + batch({BATCH}) + parse_example, {dim} float keys, sequential",
        "gigl_par": "GiGL-style: same, AUTOTUNE parallel reads and parsing",
        "decode": "ours: read bytes + `decode_tfrecord_file` per shard, concatenated (numpy)",
        "entity": "ours: `read_entity` (read + decode + torch tensors, what a loader child runs)",
        "raw": "raw read of our shards' bytes (`Path.read_bytes`)",
    }
    for name, label in labels.items():
        seconds = measured[name][0]
        print(f"| {label} | {seconds:.3f} | {rows / seconds:,.0f} | {size / seconds / 1e6:,.0f} | "
              f"{base / seconds:.2f}x | {measured['gigl_par'][0] / seconds:.2f}x |")
    print()


# ----------------------------------------------------------------------------- (b) partition


def partition_benchmark(args: argparse.Namespace, tmp: Path) -> None:
    from components.partition.step import partition

    start = time.perf_counter()
    graph = make_graph(args.nodes, args.edges, args.dim, classes=PARTITION_CLASSES, seed=1)
    serialized = write_serialized(tmp / "tfrecords", graph, PARTITION_CLASSES)
    del graph
    write_s = time.perf_counter() - start
    shard_bytes = sum(e.size for e in serialized.manifest.files.values())
    log_path = tmp / "workers.log"
    os.environ[LOG_ENV] = str(log_path)
    before = load()
    with PeakMemory() as memory:
        start = time.perf_counter()
        published = partition(serialized.root, tmp / "partitions", PartitionSpec(), world_size=args.world_size)
        wall = time.perf_counter() - start
    del os.environ[LOG_ENV]
    log = log_path.read_text() if log_path.exists() else ""
    loads = {int(r): float(s) for r, s in re.findall(r"rank (\d+): loaded \d+ records from \d+ shard\(s\) in ([\d.]+)s", log)}
    parts = {int(r): float(s) for r, s in re.findall(r"rank (\d+): partition \d+ holds .* \(([\d.]+)s\)", log)}
    workers = sorted(memory.peaks)[: args.world_size]  # the launcher starts ranks in order
    out_bytes = sum(e.size for e in published.manifest.files.values())

    print(f"### (b) partition step: {args.nodes:,} nodes (dim {args.dim}), {args.edges:,} undirected edges, "
          f"world_size {args.world_size}\n")
    print(f"input: {len(serialized.manifest.files) - 1} shards + metadata, {shard_bytes / 1e6:.0f} MB (written in "
          f"{write_s:.1f} s, untimed); output {out_bytes / 1e6:.0f} MB; published counts {published.manifest.counts}\n")
    print(f"{before} before the run, {load()} after it (1/5/15 min)\n")
    print("| measurement | value |")
    print("|---|---:|")
    print(f"| wall time of `partition(...)` (spawn, load, partition, write, publish) | {wall:.1f} s |")
    print(f"| throughput: input edges / wall second | {args.edges / wall:,.0f} edges/s |")
    for rank in range(args.world_size):
        print(f"| rank {rank}: loading (`load_graph`) | {loads.get(rank, float('nan')):.1f} s |")
        print(f"| rank {rank}: partitioning + writing its partition | {parts.get(rank, float('nan')):.1f} s |")
    for rank, key in enumerate(workers):
        print(f"| rank {rank}: peak RSS, worker + loader children | {memory.peaks[key] / 2**20:,.0f} MiB |")
        print(f"| rank {rank}: peak RSS, worker process alone | {memory.alone[key] / 2**20:,.0f} MiB |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000, help="(a) node rows")
    parser.add_argument("--shards", type=int, default=8, help="(a) shards")
    parser.add_argument("--dim", type=int, default=64, help="feature dimension, (a) and (b)")
    parser.add_argument("--repeat", type=int, default=5, help="(a) rounds over all readers; each reader's best counts")
    parser.add_argument("--nodes", type=int, default=1_000_000, help="(b) nodes")
    parser.add_argument("--edges", type=int, default=10_000_000, help="(b) undirected edges")
    parser.add_argument("--world-size", type=int, default=2, help="(b) partition workers")
    parser.add_argument("--skip", choices=["loader", "partition"], help="run only the other part")
    parser.add_argument("--tmp", help="scratch folder (default: a new temporary folder)")
    args = parser.parse_args()

    import tensorflow as tf
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"python={platform.python_version()} numpy={np.__version__} torch={torch.__version__} tensorflow={tf.__version__} "
          f"cpus={os.cpu_count()} cpu={cpu!r} ram={psutil.virtual_memory().total / 2**30:.0f}GiB\n")
    tmp = Path(tempfile.mkdtemp(prefix="gnnflow-bench-", dir=args.tmp))
    try:
        if args.skip != "loader":
            loader_benchmark(args, tmp)
        if args.skip != "partition":
            partition_benchmark(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
