"""GPU smoke check: train and infer on CiteSeer with ``training.device: cuda``, 1 and 2 workers,
beside the same runs with ``training.device: cpu``; prints a markdown table and fails (exit 1)
when a GPU run does not train as well as the CPU one.

For a machine with an NVIDIA GPU and the project installed (``make setup``, or the CUDA image of
``containers/Dockerfile.cuda``). Without a visible GPU it stops at once (exit 2) and says so.

What it runs, under one work folder: preprocess → serialize → partition (1 and 2 partitions,
untimed), then for each device (cuda, then cpu) and worker count the real train step
(``components.train.step.train``) and the real infer step (``--mode sampled``), with the settings
of the CiteSeer training test (``tests/test_train.py``: batch 128, fan-outs [10, 10], lr 0.005,
weight decay 0.005) for ``--epochs`` epochs without early stopping. Two workers on a machine with
one GPU share it (each worker takes GPU ``local rank % visible GPUs``).

Columns: epoch seconds (mean of the epochs after the first, the slowest worker's, from the
published ``metrics.jsonl``), batches/s (every worker's batches over that time), test accuracy of
the best-validation model (train's ``metrics.json``) and recomputed by infer from its output
files, and the peak GPU memory in use during the train step above what was in use before it
(``nvidia-smi``, every 0.2 s, all GPUs; "n/a" without nvidia-smi). Ratios: cuda epoch seconds
over cpu epoch seconds with the same workers.

    python benchmarks/gpu_smoke.py [--citeseer ../shared/datasets/citeseer] [--epochs 100]
        [--worlds 1,2] [--no-cpu] [--gpu-feature-fraction 1.0] [--gpu-graph pinned_host|gpu] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEFAULT_CITESEER = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "citeseer"
# A GPU run may differ from the CPU run (other random streams, float sums in another order),
# but not by more than this much test accuracy.
ACCURACY_SLACK = 0.05
MIN_TEST_ACCURACY = 0.60


def gpu_or_exit() -> list[str]:
    """The visible GPUs' names; exits with status 2 and a one-line reason when there is none."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        build = f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"
        print(
            f"gpu_smoke: no GPU visible (torch.cuda.is_available() is {torch.cuda.is_available()}{hidden}; {build}): "
            "run it on a machine with an NVIDIA GPU and its driver",
            file=sys.stderr,
        )
        sys.exit(2)
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


class GpuMemoryPeak:
    """Peak of the memory in use on all GPUs (MiB, summed) while active, above the level at start."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s, self.peak, self.base = interval_s, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def used_mib() -> int | None:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return sum(int(line) for line in out.split() if line.strip().isdigit())

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            used = self.used_mib()
            if used is not None:
                self.peak = used if self.peak is None else max(self.peak, used)

    def __enter__(self) -> GpuMemoryPeak:
        self.base = self.used_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def above_start(self) -> str:
        if self.base is None or self.peak is None:
            return "n/a"
        return f"{self.peak - self.base:,}"


def make_config(citeseer: Path, world_size: int, epochs: int, device: str, args: argparse.Namespace):
    import yaml

    from components.config import parse_config

    raw = {
        "graph": {
            "nodes": [
                {
                    "type": "paper",
                    "uri": str(citeseer / "nodes.csv.gz"),
                    "label_column": "label",
                    "split_column": "split",
                    "features": [{"columns": ["f*"]}],
                }
            ],
            "edges": [{"type": "cites", "uri": str(citeseer / "edges.csv.gz"), "src_type": "paper", "dst_type": "paper"}],
        },
        "serialize": {"num_shards": 2},
        "resources": {"world_size": world_size},
        "training": {
            "epochs": epochs,
            "batch_size": 128,
            "fan_outs": [10, 10],
            "early_stopping_patience": None,
            "learning_rate": 0.005,
            "weight_decay": 0.005,
            "device": device,
            "replace": True,  # GLT's GPU sampler draws with replacement; the CPU row draws the same way for the comparison
            "gpu_feature_fraction": args.gpu_feature_fraction,
            "gpu_graph_placement": args.gpu_graph,
        },
    }
    return parse_config(yaml.safe_dump(raw), "gpu smoke config")


def run_one(citeseer: Path, partitions, work: Path, world_size: int, device: str, args: argparse.Namespace) -> dict:
    from components.infer.step import infer
    from components.train.step import train

    config = make_config(citeseer, world_size, args.epochs, device, args)
    name = f"{device}{world_size}"
    start = time.perf_counter()
    with GpuMemoryPeak() as memory:
        model = train(config, partitions, work / f"model-{name}")
    train_s = time.perf_counter() - start
    metrics = model.read_json("metrics.json")
    lines = [json.loads(line) for line in model.read_bytes("metrics.jsonl").decode().splitlines()]
    timed = lines[1:] or lines  # the first epoch also builds CUDA kernels and caches
    epoch_s = sum(line["seconds"] for line in timed) / len(timed)
    batches = sum(line["batches_per_s"] * line["seconds"] for line in timed)
    inferred = infer(config, partitions, model.root, work / f"infer-{name}", mode="sampled")
    infer_metrics = inferred.read_json("metrics.json")
    return {
        "device": device,
        "workers": world_size,
        "epochs": metrics["epochs_run"],
        "epoch_s": epoch_s,
        "batches_per_s": batches / sum(line["seconds"] for line in timed),
        "test_accuracy": metrics["test_accuracy"],
        "infer_test_accuracy": infer_metrics["test_accuracy"],
        "gpu_mib": memory.above_start() if device == "cuda" else "-",
        "train_s": train_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--citeseer", type=Path, default=DEFAULT_CITESEER, help="folder with nodes.csv.gz and edges.csv.gz")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--worlds", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU runs (no comparison)")
    parser.add_argument("--gpu-feature-fraction", type=float, default=1.0, help="training.gpu_feature_fraction")
    parser.add_argument("--gpu-graph", choices=["pinned_host", "gpu"], default="pinned_host", help="training.gpu_graph_placement")
    parser.add_argument("--keep", type=Path, default=None, help="work folder to keep (default: a temporary one, removed)")
    args = parser.parse_args()
    gpus = gpu_or_exit()
    if not (args.citeseer / "nodes.csv.gz").exists():
        print(f"gpu_smoke: CiteSeer tables not found at {args.citeseer} (--citeseer)", file=sys.stderr)
        return 2
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from components.partition.step import partition
    from components.preprocess.step import preprocess
    from components.serialize.step import serialize

    worlds = [int(w) for w in args.worlds.split(",")]
    work = args.keep or Path(tempfile.mkdtemp(prefix="gnnflow-gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        config = make_config(args.citeseer, 1, args.epochs, "cpu", args)
        preprocess(config, work / "pre")
        serialize(config, work / "pre", work / "tfr")
        parts = {w: partition(work / "tfr", work / f"parts{w}", config.partition, world_size=w).root for w in worlds}
        rows = [run_one(args.citeseer, parts[w], work, w, "cuda", args) for w in worlds]
        if not args.no_cpu:
            rows += [run_one(args.citeseer, parts[w], work, w, "cpu", args) for w in worlds]
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    report(rows, gpus, args)
    return check(rows)


def report(rows: list[dict], gpus: list[str], args: argparse.Namespace) -> None:
    import torch

    cpu = {row["workers"]: row for row in rows if row["device"] == "cpu"}
    print(
        f"\nCiteSeer, {args.epochs} epochs, gpu_feature_fraction {args.gpu_feature_fraction}, gpu_graph_placement "
        f"{args.gpu_graph}; GPUs: {', '.join(gpus)}; {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}\n"
    )
    print("| device | workers | epochs | epoch s | batches/s | test acc (train) | test acc (infer) | peak GPU MiB | epoch s vs cpu |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = cpu.get(row["workers"])
        ratio = f"{row['epoch_s'] / base['epoch_s']:.2f}x" if base and row["device"] == "cuda" and base["epoch_s"] else "-"
        print(
            f"| {row['device']} | {row['workers']} | {row['epochs']} | {row['epoch_s']:.3f} | {row['batches_per_s']:.1f} | "
            f"{row['test_accuracy']:.4f} | {row['infer_test_accuracy']:.4f} | {row['gpu_mib']} | {ratio} |"
        )


def check(rows: list[dict]) -> int:
    """0 when every GPU run trained and inferred as well as expected, else 1 (with reasons)."""
    cpu = {row["workers"]: row for row in rows if row["device"] == "cpu"}
    problems = []
    for row in (r for r in rows if r["device"] == "cuda"):
        name = f"cuda, {row['workers']} worker(s)"
        if row["test_accuracy"] < MIN_TEST_ACCURACY:
            problems.append(f"{name}: test accuracy {row['test_accuracy']:.4f} < {MIN_TEST_ACCURACY}")
        if abs(row["infer_test_accuracy"] - row["test_accuracy"]) > ACCURACY_SLACK:  # infer samples afresh
            problems.append(f"{name}: infer's test accuracy {row['infer_test_accuracy']:.4f} is not train's {row['test_accuracy']:.4f}")
        base = cpu.get(row["workers"])
        if base and abs(row["test_accuracy"] - base["test_accuracy"]) > ACCURACY_SLACK:
            problems.append(f"{name}: test accuracy {row['test_accuracy']:.4f} vs {base['test_accuracy']:.4f} on the cpu")
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    print("gpu_smoke: " + ("FAILED" if problems else "passed"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
