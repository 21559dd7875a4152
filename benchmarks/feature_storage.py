"""Feature storage types side by side (issue 39 item 1): per ``graph.nodes[].feature_storage``,
partition bytes, RPC bytes per batch, trainer peak RSS, epoch time and validation accuracy.

    .venv/bin/python benchmarks/feature_storage.py --graph citeseer [--seeds 0 1 2] [--storages ...]
    flock /work/notes/bench.lock .venv/bin/python benchmarks/feature_storage.py --graph arxiv --epochs 5
    flock /work/notes/bench.lock .venv/bin/python benchmarks/feature_storage.py --graph scale --nodes 4000000 --seeds 0 --epochs 1

Graphs: ``citeseer`` (../shared/datasets/citeseer, init-config's proposal, its standard split),
``arxiv`` (the arxiv-sized demo graph of benchmarks/pipeline_end_to_end.py, 169,343 nodes and 128
features) and ``scale`` (benchmarks/scale_probe.py's generated graph). Per storage type the tables
are preprocessed, serialized and partitioned once (2 workers), then trained once per seed as a
``python -m components.train`` process whose workers' peak RSS is sampled (scale_probe's
``run_step``). With ``training.feature_cache_ratio: 0`` every remote feature row crosses GLT's RPC
per batch, so the RPC bytes per batch are the remote rows a batch holds (measured by sampling
batches of partition 0's training seeds with the configured fan-outs over the partitions' CSR,
``remote_rows_per_batch``) times the stored row's bytes. The default is chosen on validation only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.citeseer_acceptance import sampled_config  # noqa: E402
from benchmarks.scale_probe import run_step  # noqa: E402
from components import storage  # noqa: E402
from components.config import GnnflowConfig  # noqa: E402
from components.partition.step import partition  # noqa: E402
from components.partition.store import read_partition  # noqa: E402
from components.preprocess.step import preprocess  # noqa: E402
from components.serialize.step import serialize  # noqa: E402
from components.tables.proposal import propose_config  # noqa: E402

STORAGES = ("float32", "float16", "bfloat16", "int8")


def graph_config(name: str, work: pathlib.Path, nodes: int, epochs: int | None) -> dict:
    """The raw config of a benchmark graph (tables written under ``work`` where generated)."""
    if name == "citeseer":
        raw = sampled_config().model_dump(mode="json")
    elif name == "arxiv":
        from benchmarks.pipeline_end_to_end import write_tables

        node_file, edge_file, _ = write_tables(work / "tables")
        raw = propose_config(
            str(node_file), str(edge_file), id_column="node_id", src_column="src", dst_column="dst", label_column="label"
        ).model_dump(mode="json")
        raw["training"].update({"fan_outs": [15, 10], "early_stopping_patience": None})
    else:
        from benchmarks.scale_probe import _tables

        raw, _ = _tables(work, nodes, reuse=True)
    raw["resources"]["world_size"] = 2
    raw["training"]["feature_cache_ratio"] = 0.0  # every remote row over RPC: what more workers would see
    if epochs is not None:
        raw["training"].update({"epochs": epochs, "early_stopping_patience": None})
    return raw


def remote_rows_per_batch(parts: storage.PublishedOutput, fan_outs: list[int], batch: int, batches: int = 10) -> float:
    """Mean rows of other partitions' nodes in a batch of partition 0's training seeds, sampled
    uniformly (without replacement per node) along stored out-edges hop by hop, as GLT does."""
    metadata = read_partition(parts, 0).metadata
    (node_type,) = metadata.node_counts
    (edge_type,) = metadata.edge_counts
    owned = np.cumsum(metadata.node_counts[node_type])
    srcs, dsts = [], []
    for index in range(metadata.num_partitions):
        edges = read_partition(parts, index).edges[edge_type]["edge_index"].numpy()
        srcs.append(edges[0])
        dsts.append(edges[1])
    src, dst = np.concatenate(srcs), np.concatenate(dsts)
    order = np.argsort(src, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=int(owned[-1])))])
    neighbours = dst[order]
    own = read_partition(parts, 0).nodes[node_type]
    seeds_all = own["node_id"][own["split"] == 0].numpy()
    rng = np.random.default_rng(0)
    counts = []
    for _ in range(batches):
        frontier = rng.choice(seeds_all, size=min(batch, len(seeds_all)), replace=False)
        seen = set(frontier.tolist())
        for fan in fan_outs:
            nxt = []
            for v in frontier:
                start, end = indptr[v], indptr[v + 1]
                pick = neighbours[start:end] if end - start <= fan else rng.choice(neighbours[start:end], fan, replace=False)
                nxt.extend(int(u) for u in pick if u not in seen)
                seen.update(int(u) for u in pick)
            frontier = np.asarray(nxt, dtype=np.int64)
        ids = np.fromiter(seen, dtype=np.int64)
        counts.append(int((np.searchsorted(owned, ids, side="right") != 0).sum()))
    return float(np.mean(counts))


def measure(raw: dict, storage_type: str, seeds: list[int], work: pathlib.Path) -> dict:
    raw = json.loads(json.dumps(raw))
    raw["graph"]["nodes"][0]["feature_storage"] = storage_type
    config = GnnflowConfig.model_validate(raw)
    root = work / storage_type
    started = time.perf_counter()
    preprocess(config, root / "pre")
    serialize(config, root / "pre", root / "tfr")
    parts = partition(root / "tfr", root / "parts", config.partition, world_size=2)
    assert parts is not None
    data_s = time.perf_counter() - started
    node_type = config.graph.nodes[0].type
    stored = [read_partition(parts, i).nodes[node_type] for i in range(2)]
    feature_bytes = sum(t["features"].nbytes for t in stored)
    row_bytes = feature_bytes / max(1, sum(len(t["node_id"]) for t in stored))
    del stored
    node_files = sum(e.size for name, e in parts.manifest.files.items() if "/nodes/" in name)
    remote = remote_rows_per_batch(parts, config.training.fan_outs, config.training.batch_size)
    (root / "config.yaml").write_text(yaml.safe_dump(raw))
    runs = []
    for seed in seeds:
        model = root / f"model{seed}"
        command = ["components.train", "--config", str(root / "config.yaml"), "--input", str(root / "parts"), "--output", str(model)]
        stats = run_step([*command, "--set", f"training.seed={seed}"], root / f"train{seed}.log")
        published = storage.open_published(model)
        metrics = published.manifest.metadata["metrics"]
        history = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines() if line.strip()]
        runs.append(
            {
                "seed": seed,
                "val_accuracy": metrics["val_accuracy"],
                "epoch_s": statistics.median(h["seconds"] for h in history),
                "remote_fraction": history[-1]["remote_fraction"],
                "worker_peak_gib": stats["worker_gib"],
            }
        )
        print(json.dumps({"storage": storage_type, **runs[-1]}), flush=True)
    return {
        "storage": storage_type,
        "feature_mib": feature_bytes / 2**20,
        "node_files_mib": node_files / 2**20,
        "rpc_mib_per_batch": remote * row_bytes / 2**20,
        "remote_rows_per_batch": remote,
        "data_steps_s": data_s,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", choices=["citeseer", "arxiv", "scale"], default="citeseer")
    parser.add_argument("--storages", nargs="+", default=list(STORAGES), choices=STORAGES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, help="training.epochs (default: the config's)")
    parser.add_argument("--nodes", type=int, default=4_000_000, help="scale: nodes of the generated graph")
    parser.add_argument("--work", help="work folder (default: a temporary folder, deleted at the end)")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnflow-storage-") as scratch:
        work = pathlib.Path(args.work or scratch)
        work.mkdir(parents=True, exist_ok=True)
        raw = graph_config(args.graph, work, args.nodes, args.epochs)
        results = [measure(raw, s, args.seeds, work) for s in args.storages]
    load = os.getloadavg()
    print(
        f"\n{args.graph}: {platform.node()}, {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{time.perf_counter() - start:.0f} s, seeds {args.seeds}, 2 workers, feature_cache_ratio 0"
    )
    print(
        "| storage | node features (MiB, both partitions) | node files (MiB) | RPC per batch (MiB) | trainer peak RSS (GiB) "
        "| epoch (s, median) | val accuracy per seed | mean val |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for r in results:
        runs = r["runs"]
        vals = " / ".join(f"{x['val_accuracy']:.3f}" for x in runs)
        print(
            f"| {r['storage']} | {r['feature_mib']:.1f} | {r['node_files_mib']:.1f} | {r['rpc_mib_per_batch']:.2f} "
            f"| {max(x['worker_peak_gib'] for x in runs):.2f} | {statistics.median(x['epoch_s'] for x in runs):.2f} "
            f"| {vals} | {statistics.mean(x['val_accuracy'] for x in runs):.4f} |"
        )
    print(f"remote rows per batch (sampled, partition 0's seeds): {results[0]['remote_rows_per_batch']:.0f}")


if __name__ == "__main__":
    main()
