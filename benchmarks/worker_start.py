"""What a launch costs before any work: workers spawned as fresh interpreters (the baseline: each
imports torch, PyG and GLT) against workers forked from the launcher's fork server
(components/runtime/launcher/processes.py); and the partition step on CiteSeer with every node
and edge type decoded in a subprocess (the baseline) against small types decoded in the worker.

    .venv/bin/python benchmarks/worker_start.py [--launches 4] [--world-size 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import components.train.step  # noqa: F401 - a step's launcher has imported its step (torch, PyG, GLT) before it launches
from components import storage
from components.config import GnnflowConfig
from components.config.steps import PartitionSpec
from components.runtime.launcher import WorkerContext, launch
from components.runtime.launcher import supervisor as supervisor_module

CITESEER = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "citeseer"


def ready_worker(context: WorkerContext) -> int:
    """A worker with a step worker's imports (this module's, which a spawned worker runs again) and nothing else to do."""
    return context.rank


def _spawned_workers(worker_module: str) -> multiprocessing.context.BaseContext:  # noqa: ARG001
    return multiprocessing.get_context("spawn")


def timed_launches(launches: int, world_size: int, start: str) -> list[float]:
    """Seconds per launch of `ready_worker` on `world_size` workers, started the `start` way."""
    if start == "spawn":  # the launcher before the fork server: a fresh interpreter per worker
        supervisor_module.worker_processes = _spawned_workers  # type: ignore[assignment]
        supervisor_module.server_pid = os.getpid  # the launcher is the spawned workers' parent
    seconds = []
    for _ in range(launches):
        began = time.perf_counter()
        assert launch(ready_worker, world_size=world_size) == list(range(world_size))
        seconds.append(time.perf_counter() - began)
    return seconds


def timed_partition(folder: Path, subprocess_min_bytes: int, world_size: int) -> float:
    from components.partition.step import partition  # noqa: PLC0415
    from components.preprocess.step import preprocess  # noqa: PLC0415
    from components.serialize.step import serialize  # noqa: PLC0415

    root = storage.parse_uri(folder)
    if not storage.exists(root.join("tfr", "manifest.json")):
        paper = {"type": "paper", "uri": str(CITESEER / "nodes.csv.gz"), "label_column": "label", "features": [{"columns": ["f*"]}]}
        graph = {
            "nodes": [paper],
            "edges": [{"type": "cites", "uri": str(CITESEER / "edges.csv.gz"), "src_type": "paper", "dst_type": "paper"}],
        }
        config = GnnflowConfig.model_validate({"graph": graph, "serialize": {"num_shards": 2}})
        preprocess(config, root.join("pre"))
        serialize(config, root.join("pre"), root.join("tfr"))
    began = time.perf_counter()
    partition(
        root.join("tfr"), root.join(f"parts-{subprocess_min_bytes}"), PartitionSpec(subprocess_min_bytes=subprocess_min_bytes), world_size
    )
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}")
    forked = timed_launches(args.launches, args.world_size, "forkserver")  # first: it starts the fork server
    default = PartitionSpec().subprocess_min_bytes
    with tempfile.TemporaryDirectory() as folder:
        every = [timed_partition(Path(folder), 0, args.world_size) for _ in range(2)]
        small_here = [timed_partition(Path(folder), default, args.world_size) for _ in range(2)]
    spawned = timed_launches(args.launches, args.world_size, "spawn")  # last: it replaces the fork server for good
    rows = [
        ("launch, workers spawned (baseline)", statistics.median(spawned)),
        ("launch, workers forked: first (starts the fork server)", forked[0]),
        ("launch, workers forked: later", statistics.median(forked[1:])),
        ("partition CiteSeer, every type in a subprocess (baseline)", min(every)),
        (f"partition CiteSeer, types under {default >> 20} MiB in the worker", min(small_here)),
    ]
    print("| measurement | seconds | ratio |\n|---|---:|---:|")
    for name, seconds in rows:
        baseline = rows[0][1] if name.startswith("launch") else rows[3][1]
        print(f"| {name} | {seconds:.2f} | {baseline / seconds:.2f}x |")
    print(
        f"(launch seconds: spawned {[round(s, 2) for s in spawned]}, forked {[round(s, 2) for s in forked]}; "
        f"partition: every type in a subprocess {[round(s, 2) for s in every]}, small in the worker {[round(s, 2) for s in small_here]})"
    )


if __name__ == "__main__":
    main()
