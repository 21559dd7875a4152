"""What the server needs at a larger size, built the cheap faithful way: the arxiv run's model over a bigger graph.

The bundled demo generator at ``nodes`` nodes (same columns: 118 word columns, score, venue; 40
classes), written as Parquet, then ``pipelines.local_run.plan``'s inference-only steps with the
arxiv run's model (``RunOutputs.under(root, model=...)``, as ``gnnflow run --from-model`` does):
preprocess with the model's fitted transforms → serialize → partition, 2 workers. No training and
no infer: the server reads the model, the partitions and (without --embeddings) nothing else,
so what it maps is what a 4M-node run would give it. Cached under ``work/large-N`` like the arxiv run.
"""

from __future__ import annotations

import json
import pathlib
import time

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.serving_run import config_for
from components import storage
from components.config import apply_overrides
from components.demo.graph import generate_demo_graph
from pipelines.local_run import RunOutputs, plan

STEPS = ("preprocess", "serialize", "partition")
RECORD = "large.json"


def build_large(work: pathlib.Path, nodes: int, avg_degree: float, workers: int, epochs: int) -> dict:
    """Partitions of a ``nodes``-node demo graph for the model under ``work/run``; reuses finished ones."""
    folder = work / f"large-{nodes}"
    record = folder / RECORD
    if record.exists():
        return json.loads(record.read_text())
    tables = folder / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    graph = generate_demo_graph(nodes, num_classes=40, num_word_features=118, avg_degree=avg_degree, seed=1)
    pq.write_table(pa.Table.from_pandas(graph.nodes, preserve_index=False), tables / "nodes.parquet")
    pq.write_table(pa.Table.from_pandas(graph.edges, preserve_index=False), tables / "edges.parquet")
    edges = len(graph.edges)
    del graph
    timings = {"generate": time.perf_counter() - start}
    base = config_for(work, work / "tables" / "nodes.csv.gz", work / "tables" / "edges.csv.gz", workers, epochs)
    config = apply_overrides(
        base,
        {
            "graph.nodes": [{**base.graph.nodes[0].model_dump(), "uri": str(tables / "nodes.parquet")}],
            "graph.edges": [{**base.graph.edges[0].model_dump(), "uri": str(tables / "edges.parquet")}],
            "output.root": str(folder / "run"),
        },
        "larger graph",
    )
    model = storage.parse_uri(work / "run" / "model")
    outputs = RunOutputs.under(storage.parse_uri(folder / "run"), model=model)
    for step in plan(config, outputs):
        if step.name in STEPS:
            started = time.perf_counter()
            step.run()
            timings[step.name] = time.perf_counter() - started
    result = {"nodes": nodes, "edges": edges, "seconds": timings, "model": str(model), "partitions": str(outputs.partitions),
              "nodes_table": str(tables / "nodes.parquet"), "edges_table": str(tables / "edges.parquet")}  # fmt: skip
    record.write_text(json.dumps(result, indent=1))
    return result
