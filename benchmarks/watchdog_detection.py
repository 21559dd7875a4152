"""How soon a hung training step fails, with and without the progress watchdog.

    .venv/bin/python benchmarks/watchdog_detection.py [--timeouts 10 30] [--nodes 2000]

Trains the demo graph (2 workers, multiprocess sampling, one sampling process each) and, once
the first epoch's checkpoint exists, SIGSTOPs one sampling process: the trainer that waits for
its batches blocks in GLT's ``DistLoader.__next__``, which has no timeout. For each
``resources.progress_timeout_s`` given, the table reports the seconds from the SIGSTOP to the
step's failure (``WorkerFailed``, every process and shared-memory segment removed), and what
that is over the limit (the launcher polls once a second, then cleans up). The baseline is the
same hang without the watchdog: nothing in GLT or gloo ends it (the run is stopped by hand in a
real job); the row says what bounded it before: gloo's timeout, ``rendezvous_timeout_s``, only
applies to the peer blocked in a collective, not to the one waiting for its loader.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import signal
import tempfile
import threading
import time

import psutil

from components import storage
from components.config import GnnflowConfig
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.runtime.launcher import WorkerFailed
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.runlog import configure
from components.serialize.step import serialize
from components.train.step import train


def _sampling_processes() -> list[psutil.Process]:
    workers = psutil.Process().children()
    return [g for w in workers for g in w.children() if "spawn_main" in " ".join(g.cmdline()) and "resource_tracker" not in " ".join(g.cmdline())]


def _stop_after_first_epoch(model: pathlib.Path, stopped_at: list[float]) -> None:
    checkpoint = model / "_checkpoints" / "checkpoint.pt"
    while not checkpoint.exists():
        time.sleep(0.05)
    while not (victims := _sampling_processes()):
        time.sleep(0.05)
    os.kill(victims[0].pid, signal.SIGSTOP)
    stopped_at.append(time.monotonic())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeouts", type=float, nargs="+", default=[10.0, 30.0])
    parser.add_argument("--nodes", type=int, default=2000)
    args = parser.parse_args()
    configure(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnflow-watchdog-") as scratch:
        work = pathlib.Path(scratch)
        nodes, edges = write_demo_graph(generate_demo_graph(args.nodes, seed=0), work / "tables")
        raw = {
            "graph": {
                "nodes": [{"type": "paper", "uri": str(nodes), "label_column": "label", "features": [{"columns": ["w*"]}]}],
                "edges": [{"type": "cites", "uri": str(edges), "src_type": "paper", "dst_type": "paper"}],
            },
            "resources": {"world_size": 2},
            "training": {"epochs": 1000, "batch_size": 16, "sampling": "multiprocess", "sampling_workers": 1, "early_stopping_patience": None},
        }
        config = GnnflowConfig.model_validate(raw)
        root = storage.parse_uri(work)
        preprocess(config, root.join("pre"))
        serialize(config, root.join("pre"), root.join("tfr"))
        partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
        for limit in args.timeouts:
            run = GnnflowConfig.model_validate({**raw, "resources": {"world_size": 2, "progress_timeout_s": limit}})
            model, stopped_at = work / f"model-{limit:g}", []
            threading.Thread(target=_stop_after_first_epoch, args=(model, stopped_at), daemon=True).start()
            try:
                train(run, root.join("parts"), model)
                raise SystemExit("the step finished: nothing was stopped")
            except WorkerFailed as failure:
                detected = time.monotonic() - stopped_at[0]
                rows.append({"progress_timeout_s": limit, "detected_s": round(detected, 2), "over_limit_s": round(detected - limit, 2),
                             "message": str(failure)})
    load = os.getloadavg()
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| progress_timeout_s | SIGSTOP to failure (s) | over the limit (s) |\n|---:|---:|---:|")
    print("| none (baseline: no watchdog) | never: GLT's loader waits without a timeout | - |")
    for row in rows:
        print(f"| {row['progress_timeout_s']:g} | {row['detected_s']:.2f} | {row['over_limit_s']:.2f} |")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
