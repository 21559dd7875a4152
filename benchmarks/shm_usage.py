"""Estimated against measured /dev/shm use of partition, train and infer (2 workers), per graph.

For each graph the steps run in this process as ``gnnflow run`` runs them (their workers are
spawned processes); a thread samples ``/dev/shm``'s used bytes (statvfs, which also counts the
unlinked segments torch shares tensors through) every 20 ms, and the peak above the level before
the step is reported beside the step's estimate (:mod:`components.runtime.shm_budget`: what the
check at worker start compares with the free space). The estimate must be at least the peak
(an upper bound) and not wildly above it.

    python benchmarks/shm_usage.py [--graphs demo citeseer wide] [--sampling collocated multiprocess] [--subprocess-min-bytes 0]

Run it with a /dev/shm of its own (as root: ``unshare --mount --fork sh -c 'mount -t tmpfs -o size=8g tmpfs /dev/shm &&
python benchmarks/shm_usage.py'``), so that other processes' use of /dev/shm does not count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 2**20


def _used(path: str = "/dev/shm") -> int:
    stats = os.statvfs(path)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def peak_shm(run: Callable[[], object]) -> int:
    """Bytes of /dev/shm in use above the level before ``run``, at its peak while it ran."""
    base, peak, done = _used(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _used() - base)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run()
    finally:
        done.set()
        sampler.join()
    return peak[0]


def _graph_config(name: str, root: Path):
    from components.config import parse_config
    from pipelines.local_run import demo_config

    if name == "demo":
        from components import storage

        return demo_config(storage.parse_uri(str(root)))
    if name == "citeseer":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.shared_datasets import citeseer_graph

        return parse_config(json.dumps({"graph": citeseer_graph(), "resources": {"world_size": 2}, "training": {"epochs": 2}}), "CiteSeer")
    if name == "wide":  # the graph of tests/test_shared_memory.py's 64 MiB test
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.small_graphs import write_wide_graph

        graph = write_wide_graph(root)
        return parse_config(json.dumps({"graph": graph, "resources": {"world_size": 2}, "training": {"epochs": 1}}), "wide graph")
    raise SystemExit(f"unknown graph {name}")


def measure(name: str, sampling: list[str], subprocess_min_bytes: int | None) -> list[dict]:
    from components import storage
    from components.config import apply_overrides
    from components.gnn.shared_memory import WorkerShape, sampled_worker_need
    from components.infer.step import infer
    from components.partition.loading_memory import loading_need
    from components.partition.output import read_metadata
    from components.partition.step import partition
    from components.preprocess.step import preprocess
    from components.serialize.output import read_graph_metadata
    from components.serialize.step import serialize
    from components.train.step import train

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        config = _graph_config(name, root)
        if subprocess_min_bytes is not None:  # 0: every entity loads through a subprocess, its tensors through /dev/shm
            config = apply_overrides(config, {"partition.subprocess_min_bytes": subprocess_min_bytes}, "benchmark")
        preprocess(config, root / "pre")
        serialize(config, root / "pre", root / "tfr")
        serialized = storage.open_published(str(root / "tfr"))
        sizes = {n: e.size for n, e in serialized.manifest.files.items()}
        estimate = loading_need(read_graph_metadata(serialized), sizes, range(2), 2, config.partition.subprocess_min_bytes).total
        peak = peak_shm(lambda: partition(root / "tfr", root / "parts", config.partition, world_size=2))
        rows.append({"graph": name, "step": "partition", "sampling": "-", "estimate": estimate, "peak": peak})
        shape = WorkerShape.of(read_metadata(storage.open_published(str(root / "parts"))))
        for mode in sampling:
            run = apply_overrides(config, {"training.sampling": mode}, "benchmark")
            width = run.model.hidden_channels if run.model.learnt_embeddings == "sharded" else 0
            ratio = run.training.feature_cache_ratio
            for step in ("train", "infer"):
                need = sampled_worker_need(
                    shape, range(2), feature_cache_ratio=ratio, learnt_width=width, multiprocess=mode == "multiprocess", step=step
                )
                if step == "train":
                    peak = peak_shm(lambda run=run, mode=mode: train(run, root / "parts", root / f"model-{mode}"))
                else:
                    peak = peak_shm(lambda run=run, mode=mode: infer(run, root / "parts", root / f"model-{mode}", root / f"emb-{mode}"))
                rows.append({"graph": name, "step": step, "sampling": mode, "estimate": need.total, "peak": peak})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=["demo", "citeseer", "wide"])
    parser.add_argument("--sampling", nargs="+", default=["collocated", "multiprocess"])
    parser.add_argument("--subprocess-min-bytes", type=int, help="partition.subprocess_min_bytes (default: the config's)")
    args = parser.parse_args()
    print("| graph | step | sampling | estimate (MiB) | measured peak (MiB) | estimate - peak (KiB) | estimate / peak |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name in args.graphs:
        for row in measure(name, args.sampling, args.subprocess_min_bytes):
            ratio = f"{row['estimate'] / row['peak']:.2f}" if row["peak"] else "-"
            print(
                f"| {row['graph']} | {row['step']} | {row['sampling']} | {row['estimate'] / MiB:.1f} | {row['peak'] / MiB:.1f} "
                f"| {(row['estimate'] - row['peak']) / 1024:,.0f} | {ratio} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
