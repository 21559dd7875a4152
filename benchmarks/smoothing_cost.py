"""What Correct & Smooth costs in infer beside training, and where its time goes; 2 workers.

    .venv/bin/python benchmarks/smoothing_cost.py --work DIR [--graphs demo demo_tuned citeseer] [--repeats 5] [--split]

Graphs (tables as benchmarks/init_config_constants.py makes them, init-config's proposal, 2
workers, ``infer.smoothing: correct_and_smooth`` with ``infer.alpha_selection: validation``):

  demo        the demo generator's 3,000 nodes, 5 classes; sampled training, sampled infer
  demo_tuned  the same graph with the best trial of `gnnflow tune` in the issue 40 measurement
              (GCN, full-graph training, hidden 32), infer in exact mode: the run whose smoothing
              cost 0.107 of its training
  citeseer    CiteSeer's standard split; sampled training, sampled infer

The data steps and one training run (its wall seconds) are made once under --work and reused, so
that two checkouts of the project time their infer steps against the same model. Then
``--repeats`` infer runs: ``smoothing_seconds`` of each run's metrics.json (the slowest worker's:
building the ring over the target's edges and both propagations), their median and its ratio to
the train seconds.

``--split`` also runs the smoothing stage alone in 2 workers on the stored partitions (the
model's probabilities replaced by seeded random ones: the time does not depend on them) and
prints each worker's split: building the ring, the correction pass, the neighbour sums and, within
them, the point-to-point exchanges, the selection's all_sums; then the same stage with every
exchange replaced by zeros of its shape (the arithmetic and Python alone, as in a world of one),
and the bare latency of an exchange of the same sizes with nothing between two.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Iterator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks.init_config_constants import GRAPHS  # noqa: E402
from components import storage  # noqa: E402
from components.config import GnnflowConfig, apply_overrides  # noqa: E402
from components.infer.step import infer  # noqa: E402
from components.runtime.launcher import WorkerContext, launch  # noqa: E402
from components.runtime.runlog import configure  # noqa: E402
from components.tables.proposal import propose_config  # noqa: E402
from components.train.step import train  # noqa: E402
from pipelines.local_run import RunOutputs, run_steps  # noqa: E402
from pipelines.tune.study import DATA_STEPS  # noqa: E402

SMOOTHING = {"infer.smoothing": "correct_and_smooth", "infer.alpha_selection": "validation"}
# The best trial of `gnnflow tune` on the demo graph, seed 0, in benchmarks/unseen_accuracy.py's run of 2026-11-28.
TUNED = {
    "model.type": "gcn",
    "training.mode": "full_graph",
    "model.hidden_channels": 32,
    "model.dropout": 0.45212587914665925,
    "training.learning_rate": 0.008558894657793087,
    "training.weight_decay": 5.627932047415171e-05,
}
VARIANTS = {"demo": ("demo", {}, "sampled"), "demo_tuned": ("demo", TUNED, "exact"), "citeseer": ("citeseer", {}, "sampled")}
SWAPS = 100


def graph_config(name: str, work: pathlib.Path) -> tuple[GnnflowConfig, str]:
    """``name``'s config and its infer mode."""
    tables, overrides, mode = VARIANTS[name]
    nodes, edges, split = GRAPHS[tables](work / tables / "tables")
    proposed = propose_config(
        nodes, edges, id_column="node_id", src_column="src", dst_column="dst", label_column="label", split_column=split
    )
    return apply_overrides(proposed, {"resources.world_size": 2, **SMOOTHING, **overrides}, "2 workers, Correct & Smooth"), mode


def trained(name: str, config: GnnflowConfig, work: pathlib.Path) -> tuple[RunOutputs, dict]:
    """The data steps (up-to-date ones skipped) and a model trained once: {"train_seconds", "uri"}."""
    root = storage.parse_uri(work / name / "data")
    run_steps(config, root, DATA_STEPS)
    record = work / name / "train.json"
    if not record.exists():
        model = storage.parse_uri(work / name / "model")
        storage.delete_prefix(model)
        start = time.perf_counter()
        train(config, RunOutputs.under(root).partitions, model)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"train_seconds": time.perf_counter() - start, "uri": str(model)}))
    return RunOutputs.under(root), json.loads(record.read_text())


def infer_runs(
    name: str, config: GnnflowConfig, mode: str, outputs: RunOutputs, model: str, work: pathlib.Path, repeats: int
) -> list[float]:
    seconds = []
    for repeat in range(repeats):
        output = storage.parse_uri(work / name / f"infer-{os.getpid()}-{repeat}")
        published = infer(config, outputs.partitions, storage.parse_uri(model), output, mode=mode)
        if published is None:
            raise RuntimeError(f"{name}: infer published nothing")
        metrics = published.read_json("metrics.json")
        shown = {k: metrics[k] for k in ("smoothing_seconds", "smoothing_selected", "val_accuracy", "test_accuracy")}
        print(json.dumps({"graph": name, "repeat": repeat, "load": os.getloadavg()[0], **shown}), flush=True)
        seconds.append(float(metrics["smoothing_seconds"]))
        storage.delete_prefix(output)
    return seconds


class Clock:
    """Seconds summed per label, and calls counted."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.wrapped: list[tuple[object, str, object]] = []

    @contextlib.contextmanager
    def time(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start
            self.calls[label] = self.calls.get(label, 0) + 1

    def wrap(self, owner: object, attribute: str, label: str) -> None:
        original = getattr(owner, attribute)
        self.wrapped.append((owner, attribute, original))

        def timed(*args, **kwargs):
            with self.time(label):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)

    def unwrap(self) -> None:
        for owner, attribute, original in reversed(self.wrapped):
            setattr(owner, attribute, original)
        self.wrapped.clear()

    def report(self) -> dict[str, str]:
        return {label: f"{seconds:.3f} s / {self.calls[label]}" for label, seconds in self.seconds.items()}


def _bare_swaps(send_rows: int, receive_rows: int, columns: int, peer: int) -> float:
    """Milliseconds per exchange of ``SWAPS`` back to back (isend + irecv + both waits)."""
    send, receive = torch.randn(send_rows, columns), torch.empty(receive_rows, columns)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(SWAPS):
        for work in [dist.isend(send, peer), dist.irecv(receive, peer)]:
            if work is not None:  # None only outside the group
                work.wait()
    return (time.perf_counter() - start) / SWAPS * 1000


def split_worker(ctx: WorkerContext, partitions: str, config: GnnflowConfig) -> dict:
    """The smoothing stage's pieces timed on this worker's partition (see the module docstring)."""
    from components.gnn.full_graph import aggregate as aggregate_module
    from components.infer import alpha_selection, smoothing, smoothing_stage
    from components.infer.alpha_grid import CORRECTION_ALPHAS, SMOOTHING_ALPHAS
    from components.partition.output import read_partition

    ctx.init_process_group()
    torch.set_num_threads(1)  # infer's share of 2 cores for 2 workers
    part = read_partition(storage.open_published(storage.parse_uri(partitions), step="partition"), ctx.rank)
    schema = part.metadata.schema
    nodes = part.nodes[schema.target]
    classes = schema.node_types[schema.target].num_classes
    base = torch.softmax(torch.randn((len(nodes["node_id"]), classes), generator=torch.Generator().manual_seed(ctx.rank)), dim=1)
    labels, splits = nodes["label"].reshape(-1).to(torch.int64), nodes["split"].reshape(-1).to(torch.int64)
    block_rows = config.training.full_graph_block_rows

    def stage() -> None:
        graph = smoothing_stage.target_graph(part, ctx.world_size, block_rows)
        alpha_selection.smooth_and_select(base, labels, splits, smoothing.ring_propagation(graph), config.infer)

    stage()  # warm: imports, first allocations
    clock = Clock()
    real_swap = aggregate_module._swap
    clock.wrap(smoothing_stage, "target_graph", "ring (target_graph)")
    clock.wrap(smoothing, "_correct", "correction pass")
    clock.wrap(smoothing, "aggregate", "neighbour sums")
    clock.wrap(aggregate_module, "_swap", "exchanges (in the sums)")
    clock.wrap(alpha_selection, "all_sum", "selection all_sums")
    dist.barrier()
    with clock.time("stage"):
        stage()
    clock.unwrap()

    def no_exchange(send, to, receive, source, dtype):
        return None if receive is None else torch.zeros(receive, dtype=dtype)

    aggregate_module._swap = no_exchange
    walls, cpus = [], []
    for _ in range(3):
        start, cpu = time.perf_counter(), time.thread_time()
        stage()
        walls.append(time.perf_counter() - start)
        cpus.append(time.thread_time() - cpu)
    aggregate_module._swap = real_swap
    graph = smoothing_stage.target_graph(part, ctx.world_size, block_rows)
    plan, peer = graph.plan, (ctx.rank + 1) % ctx.world_size
    swaps = {}
    if ctx.world_size == 2:
        for what, columns in (
            ("correction", len(CORRECTION_ALPHAS) * classes),
            ("smoothing", len(CORRECTION_ALPHAS) * len(SMOOTHING_ALPHAS) * classes),
        ):
            swaps[f"bare exchange ms, {what} width ({columns} columns)"] = round(
                _bare_swaps(len(plan.serve[1]), plan.fetch[1].count, columns, peer), 3
            )
    return {
        "rank": ctx.rank,
        "rows": len(base),
        "split": clock.report(),
        "stage without exchanges: wall s, thread cpu s (min of 3)": (round(min(walls), 4), round(min(cpus), 4)),
        **swaps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=pathlib.Path, required=True)
    parser.add_argument("--graphs", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--split", action="store_true")
    args = parser.parse_args()
    configure(logging.WARNING)
    tree = pathlib.Path(__file__).resolve().parents[1]
    print(f"# {platform.node()}, tree {tree}, {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()}", flush=True)
    table = []
    for name in args.graphs:
        config, mode = graph_config(name, args.work)
        outputs, model = trained(name, config, args.work)
        if args.split:
            for worker in launch(split_worker, (str(outputs.partitions), config), world_size=2):
                print(json.dumps({"graph": name, **worker}), flush=True)
        if args.repeats:
            seconds = infer_runs(name, config, mode, outputs, model["uri"], args.work, args.repeats)
            table.append((name, mode, statistics.median(seconds), seconds, model["train_seconds"]))
    print(f"# load average at the end {os.getloadavg()}")
    print("| graph | infer mode | smoothing s (median) | each run | train s | ratio |\n|---|---|---|---|---|---|")
    for name, mode, median, seconds, train_seconds in table:
        runs = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"| {name} | {mode} | {median:.3f} | {runs} | {train_seconds:.1f} | {median / train_seconds:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
