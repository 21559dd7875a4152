"""Inference-only runs (``gnnflow run --from-model``) on the ogbn-arxiv-sized demo, against the full run.

    .venv/bin/python benchmarks/inference_only.py [--workers 2] [--epochs 5] [--hold-back 0.1] [--out DIR]

The graph is benchmarks/pipeline_end_to_end.py's: the bundled demo generator at ogbn-arxiv's
size (169,343 nodes, 1,166,243 undirected edges, 40 classes, 128 features), as gzipped CSV.
A seeded 10 % of the nodes, and every edge touching them, are held back from the training
tables. In one script run:

1. the full run (preprocess → serialize → partition → train → infer → report) on the training
   tables, timed per step: its test accuracy is the transductive figure (test nodes were in the
   graph the model trained on, their labels hidden);
2. the inference-only run with that model on the full tables (preprocess with the model's
   fitted transforms → serialize → partition → infer → report), timed per step.

It prints the accuracy on the held-back labelled nodes (never seen by training, in any role)
against the transductive test accuracy, how far the embeddings of the unchanged nodes moved
(cosine between the two runs' embeddings, by original id), and the inference-only run's time
as a fraction of the full run's (target: at most 40 %).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import psutil
import pyarrow.parquet as pq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.pipeline_end_to_end import write_tables  # noqa: E402  (the same generated graph)
from components import storage  # noqa: E402
from components.config import apply_overrides  # noqa: E402
from components.infer.shards import embedding_matrix  # noqa: E402
from components.runtime.runlog import configure  # noqa: E402
from components.tables.proposal import propose_config  # noqa: E402
from pipelines.local_run import RunOutputs, plan  # noqa: E402


def hold_back(
    nodes_csv: pathlib.Path, edges_csv: pathlib.Path, fraction: float, folder: pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path, set]:
    """Training tables without a seeded ``fraction`` of the nodes and their edges; returns the held-back ids."""
    nodes = pd.read_csv(nodes_csv, dtype={"node_id": str, "venue": str, "label": str})
    edges = pd.read_csv(edges_csv, dtype={"src": str, "dst": str})
    rng = np.random.default_rng(7)
    held = set(nodes["node_id"][rng.random(len(nodes)) < fraction])
    folder.mkdir(parents=True, exist_ok=True)
    kept_nodes = nodes[~nodes["node_id"].isin(held)]
    kept_edges = edges[~(edges["src"].isin(held) | edges["dst"].isin(held))]
    kept_nodes.to_csv(folder / "nodes.csv.gz", index=False)
    kept_edges.to_csv(folder / "edges.csv.gz", index=False)
    return folder / "nodes.csv.gz", folder / "edges.csv.gz", held


def timed_steps(config, outputs: RunOutputs) -> dict[str, float]:  # noqa: ANN001
    timings: dict[str, float] = {}
    for step in plan(config, outputs):
        start = time.perf_counter()
        step.run()
        timings[step.name] = time.perf_counter() - start
    return timings


def embeddings_by_id(embeddings: storage.Uri) -> pd.DataFrame:
    """node_id (original), prediction, embedding rows of every shard of a published infer output."""
    published = storage.open_published(embeddings)
    frames = []
    for path in published.files_under("embeddings"):
        table = pq.read_table(io.BytesIO(published.read_bytes(path)))
        frame = table.select([c for c in ("node_id", "prediction") if c in table.column_names]).to_pandas()
        frame["embedding"] = list(embedding_matrix(table).numpy())
        frames.append(frame)
    return pd.concat(frames, ignore_index=True).set_index("node_id")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hold-back", type=float, default=0.1)
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end)")
    args = parser.parse_args()
    configure(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="gnnflow-bench-") as scratch:
        work = pathlib.Path(args.out or scratch)
        full_nodes, full_edges, _ = write_tables(work / "tables")
        train_nodes, train_edges, held = hold_back(full_nodes, full_edges, args.hold_back, work / "train_tables")

        def config_for(nodes: pathlib.Path, edges: pathlib.Path, root: pathlib.Path):  # noqa: ANN202
            config = propose_config(
                str(nodes),
                str(edges),
                id_column="node_id",
                src_column="src",
                dst_column="dst",
                label_column="label",
                node_type="paper",
                relation="cites",
                output_root=str(root),
            )
            return apply_overrides(
                config,
                {
                    "resources.world_size": args.workers,
                    "training.epochs": args.epochs,
                    "training.early_stopping_patience": None,
                    "training.fan_outs": [15, 10],
                },
                "benchmark",
            )

        trained = RunOutputs.under(storage.parse_uri(work / "full_run"))
        full_config = config_for(train_nodes, train_edges, work / "full_run")
        full_s = timed_steps(full_config, trained)
        fresh = RunOutputs.under(storage.parse_uri(work / "inference_run"), model=trained.model)
        # The training run's config with the full tables: the transforms are the model's, whatever the proposal would fit.
        fresh_config = apply_overrides(
            full_config,
            {
                "graph.nodes": [{**full_config.graph.nodes[0].model_dump(), "uri": str(full_nodes)}],
                "graph.edges": [{**full_config.graph.edges[0].model_dump(), "uri": str(full_edges)}],
            },
            "full tables",
        )
        fresh_s = timed_steps(fresh_config, fresh)
        transductive = storage.open_published(trained.report).read_json("metrics.json")
        before, after = embeddings_by_id(trained.embeddings), embeddings_by_id(fresh.embeddings)
        labels = pd.read_csv(full_nodes, usecols=["node_id", "label"], dtype=str).set_index("node_id")["label"]
        pre_meta = storage.open_published(fresh.preprocessed).manifest.metadata

    held_labelled = [i for i in held if isinstance(labels.get(i), str)]
    held_accuracy = float(np.mean([after.at[i, "prediction"] == labels[i] for i in held_labelled]))
    common = before.index.intersection(after.index)
    a, b = np.stack(before.loc[common, "embedding"].to_numpy()), np.stack(after.loc[common, "embedding"].to_numpy())
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
    relative = np.linalg.norm(a - b, axis=1) / (np.linalg.norm(a, axis=1) + 1e-12)
    same_class = float(np.mean(before.loc[common, "prediction"].to_numpy() == after.loc[common, "prediction"].to_numpy()))
    full_total, fresh_total = sum(full_s.values()), sum(fresh_s.values())
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB; "
        f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"held back {len(held)} nodes ({len(held_labelled)} labelled); unseen categories: {pre_meta.get('unseen_categories')}")
    print("| step | full run s | inference-only s |\n|---|---:|---:|")
    for name in full_s:
        print(f"| {name} | {full_s[name]:.1f} | {fresh_s.get(name, 0.0):.1f} |")
    print(f"| **total** | **{full_total:.1f}** | **{fresh_total:.1f}** ({fresh_total / full_total:.0%} of the full run) |")
    print(f"accuracy: held-back nodes {held_accuracy:.4f} vs transductive test {transductive['test_accuracy']:.4f}")
    print(
        f"unchanged nodes ({len(common)}): cosine median {np.median(cosine):.4f}, p5 {np.percentile(cosine, 5):.4f}; "
        f"relative L2 change median {np.median(relative):.4f}; same predicted class {same_class:.4f}"
    )
    print(
        json.dumps(
            {
                "workers": args.workers,
                "epochs": args.epochs,
                "held_back": len(held),
                "full_s": round(full_total, 1),
                "inference_only_s": round(fresh_total, 1),
                "time_ratio": round(fresh_total / full_total, 3),
                "held_back_accuracy": round(held_accuracy, 4),
                "transductive_test_accuracy": transductive["test_accuracy"],
                "unchanged_cosine_median": round(float(np.median(cosine)), 4),
                "unchanged_same_class": round(same_class, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
