"""``gnnflow plan --config C [--world-size N] [--machine-type M] [--preprocessed URI] [--json]``:
what each multi-worker step needs before anything runs.

It reads the row counts and feature widths from the configured tables (Parquet footers, CSV
newlines, BigQuery table metadata; one-hot widths from a sample), or exactly from a published
preprocess or serialize output given with ``--preprocessed``, and predicts per step (partition,
train, infer) the peak memory and ``/dev/shm`` of a worker, the disk of the step's output and
the time of a training epoch. Then it names the smallest Vertex AI machine type that holds a
replica (``resources.processes_per_replica`` workers) with a 25% margin, in the series of
``--machine-type`` (default: the config's ``resources.custom_job.machine_type``).

Without ``--world-size`` it shows world sizes 1, 2, 4, 8, 16 and 32 (and the config's own);
``--json`` prints one world size (``--world-size``, else the config's).
"""

from __future__ import annotations

import argparse
import json

from components.config import GnnflowConfig, load_config
from components.graph_size import GraphSize
from pipelines.machine_sizes import MARGIN, SYSTEM_RESERVE_GIB
from pipelines.sizing_report import ReplicaPlan, plan_replicas, read_graph_size

WORLD_SIZES = (1, 2, 4, 8, 16, 32)


def add_parser(commands) -> None:  # noqa: ANN001  # argparse's private _SubParsersAction
    plan = commands.add_parser(
        "plan",
        help="predict each step's memory, /dev/shm, disk and epoch time, and the machine type a replica needs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("--config", required=True, help="config YAML (local or gs://)")
    plan.add_argument("--world-size", type=int, help="workers of partition, train and infer (default: a table of several)")
    plan.add_argument(
        "--machine-type", help="machine type to check, and whose series to recommend from (default: resources.custom_job.machine_type)"
    )
    plan.add_argument("--preprocessed", help="a published preprocess or serialize output of this graph: exact counts and feature widths")
    plan.add_argument("--json", action="store_true", help="print one world size as JSON")
    plan.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    if args.world_size is not None and args.world_size < 1:
        from components.errors import GnnflowError

        raise GnnflowError(f"--world-size {args.world_size}: give 1 or more workers")
    config = load_config(args.config)
    graph = read_graph_size(config, args.preprocessed)
    machine_type = args.machine_type or config.resources.custom_job.machine_type
    if args.json:
        print(json.dumps(plan_replicas(graph, config, args.world_size or config.resources.world_size, machine_type).as_json()))
        return
    sizes = [args.world_size] if args.world_size else sorted({*WORLD_SIZES, config.resources.world_size})
    print(report(graph, config, [plan_replicas(graph, config, n, machine_type) for n in sizes], bool(args.preprocessed)))


def report(graph: GraphSize, config: GnnflowConfig, plans: list[ReplicaPlan], exact: bool) -> str:
    """The text ``gnnflow plan`` prints: the inputs, a row per world size, how to read it."""
    rows = ", ".join(f"{n.name} {n.rows:,} x {n.feature_width} ({n.value_bytes} B/value)" for n in graph.nodes)
    edges = ", ".join(f"{e.name} {e.rows:,}{' (undirected)' if e.undirected else ''}" for e in graph.edges)
    source = "the preprocessed output" if exact else "the tables" + (" (some figures estimated)" if graph.estimated else "")
    machine = plans[0].machine
    lines = [
        f"graph (from {source}): nodes {rows}; edges {edges}; {graph.directed_message_edges():,} stored directed edges; "
        f"{graph.train_seeds:,} training seeds",
        f"{config.resources.processes_per_replica} worker(s) per replica; epoch time with "
        + (f"{machine.vcpus} vCPUs of {machine.name} per replica" if machine else "one core per worker"),
        "",
        "| workers | partition GiB | train GiB | infer GiB | /dev/shm GiB | partitions GiB | embeddings GiB | epoch s "
        "| replica GiB | machine type |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for plan in plans:
        steps = plan.steps
        fits = "" if plan.machine is None or plan.machine.memory_gib >= plan.need_gib else f" ({plan.machine.name} too small)"
        lines.append(
            f"| {plan.world_size} | {_gib(steps['partition'].peak_rss_mib_per_worker)} | {_gib(steps['train'].peak_rss_mib_per_worker)} | "
            f"{_gib(steps['infer'].peak_rss_mib_per_worker)} | {_gib(max(p.shm_mib_per_worker for p in steps.values()))} | "
            f"{_gib(steps['partition'].disk_mib)} | {_gib(steps['infer'].disk_mib)} | {steps['train'].epoch_s:.1f} | {plan.need_gib:.2f} | "
            f"{plan.recommended.name if plan.recommended else 'none in the table'}{fits} |"
        )
    lines += [
        "",
        f"GiB: peak resident memory per worker (/dev/shm is part of it); replica: the hungriest step x workers per replica. "
        f"The machine type holds a replica with {MARGIN - 1:.0%} to spare (the model's error target is 20%) after "
        f"{SYSTEM_RESERVE_GIB:g} GiB for the system. Model and its error: benchmarks/RESULTS.md, 'Sizing model'.",
    ]
    return "\n".join(lines)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.2f}"
