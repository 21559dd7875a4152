"""A generated node-classification graph written straight into a published serialize output.

Shared by the partition and train benchmarks: they measure the steps after `serialize`, so the
graph skips the tables and `preprocess` and is encoded the way `components.serialize` writes it
(shards sized by `shard_count`, `graph_metadata.json`, `manifest.json`).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

WRITE_BATCH = 8192  # rows per encode_examples call, as serialize's Parquet batches


def make_graph(nodes: int, edges: int, dim: int, classes: int, homophily: float = 0.0, signal: float = 0.0,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Uniform labels, features ``signal * centre[label] + N(0, 1)``, ``edges`` undirected edges
    (each once) of which a ``homophily`` fraction join two nodes of the same class (the others:
    uniformly random ends), and a random 80/10/10 train/val/test split.

    With the defaults (no homophily, no signal) it is a plain random graph.
    """
    rng = np.random.default_rng(seed)
    label = rng.integers(0, classes, nodes)
    centres = rng.standard_normal((classes, dim), dtype=np.float32)
    features = rng.standard_normal((nodes, dim), dtype=np.float32)
    if signal:
        features += signal * centres[label]
    split = rng.choice(3, nodes, p=[0.8, 0.1, 0.1]).astype(np.int64)
    src = rng.integers(0, nodes, edges)
    dst = rng.integers(0, nodes, edges)
    same = rng.random(edges) < homophily
    if same.any():
        by_class = np.argsort(label, kind="stable")  # node ids grouped by class
        counts = np.bincount(label, minlength=classes)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        c = label[src[same]]
        dst[same] = by_class[starts[c] + (rng.random(int(same.sum())) * counts[c]).astype(np.int64)]
    return {"label": label, "features": features, "split": split, "src": src, "dst": dst}


def bounds_of(total: int, rows: list[int]) -> list[int]:
    """[0, rows[0], rows[0] + rows[1], ..., total]: where each file's rows start."""
    out = [0]
    for r in rows:
        out.append(out[-1] + r)
    assert out[-1] == total
    return out


def write_serialized(out: Path | str, graph: dict[str, np.ndarray], classes: int):
    """A published serialize output of ``graph`` (one node type ``paper``, one undirected edge
    type ``cites`` without features); returns its `storage.PublishedOutput`."""
    from components import storage
    from components.config import SerializeSpec
    from components.schema import NO_SPLIT, EdgeTypeSchema, GraphSchema, NodeTypeSchema
    from components.serialize.output import METADATA_FILE
    from components.serialize.shards import shard_count
    from components.tfrecord import encode_examples

    nodes, dim = graph["features"].shape
    edges = len(graph["src"])
    node_ints = {"node_id": np.arange(nodes, dtype=np.int64), "label": graph["label"].astype(np.int64), "split": graph["split"]}
    edge_ints = {"edge_id": np.arange(edges, dtype=np.int64), "src": graph["src"], "dst": graph["dst"],
                 "split": np.full(edges, NO_SPLIT, np.int64)}
    with storage.staged_output(str(out), "serialize") as staging:
        files: dict[str, tuple[list[str], list[int]]] = {}
        for folder, ints, floats, rows, d in (
            ("nodes/paper", node_ints, {"features": graph["features"]}, nodes, dim),
            ("edges/paper__cites__paper", edge_ints, {"features": np.zeros((edges, 0), np.float32)}, edges, 0),
        ):
            count = shard_count(rows, d, SerializeSpec())
            bounds = np.linspace(0, rows, count + 1).astype(int)
            paths = [f"{folder}/shard-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]
            for i, path in enumerate(paths):
                with staging.open_write(path) as writer:
                    for lo in range(bounds[i], bounds[i + 1], WRITE_BATCH):
                        hi = min(lo + WRITE_BATCH, bounds[i + 1])
                        writer.write(encode_examples({k: v[lo:hi] for k, v in ints.items()}, {k: v[lo:hi] for k, v in floats.items()}))
            files[folder] = (paths, np.diff(bounds).tolist())
        split = graph["split"]
        sizes = {name: int((split == code).sum()) for name, code in (("train", 0), ("val", 1), ("test", 2))}
        id_maps = []
        starts = bounds_of(nodes, files["nodes/paper"][1])
        for i, (lo, hi) in enumerate(zip(starts, starts[1:])):
            table = pa.table({"node_id": pa.array(np.arange(lo, hi, dtype=np.int64)),
                              "original_id": pa.array([f"n{j}" for j in range(lo, hi)], pa.string())})
            buffer = io.BytesIO()
            pq.write_table(table, buffer)
            id_maps.append(f"id_maps/paper/part-{i:05d}.parquet")
            staging.write_bytes(id_maps[-1], buffer.getvalue())
        node_type = NodeTypeSchema("paper", nodes, [f"f{j}" for j in range(dim)], [f"class_{c}" for c in range(classes)],
                                   sizes, files["nodes/paper"][0], id_map_files=id_maps, file_rows=files["nodes/paper"][1])
        edge_type = EdgeTypeSchema("paper", "cites", "paper", edges, [], True, {"train": 0, "val": 0, "test": 0},
                                   files["edges/paper__cites__paper"][0], file_rows=files["edges/paper__cites__paper"][1])
        record_format = {"node_types": {"paper": {"int64": {"node_id": 1, "label": 1, "split": 1}, "float": {"features": dim}}},
                         "edge_types": {edge_type.name: {"int64": {"edge_id": 1, "src": 1, "dst": 1, "split": 1},
                                                         "float": {"features": 0}}}}
        metadata = GraphSchema("node_classification", "paper", {"paper": node_type}, {edge_type.name: edge_type}, record_format)
        staging.write_bytes(METADATA_FILE, metadata.to_json().encode())
        return staging.publish(counts={"nodes.paper": nodes, f"edges.{edge_type.name}": edges})
