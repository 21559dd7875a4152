"""Node and edge tables of any size, written chunk by chunk (the demo graph's kind, streamed).

``components.demo.graph`` builds its tables in memory, which tops out well below the largest
graph this machine's pipeline can take. This writes the same kind of graph, a chunk of nodes
or edges at a time, as Parquet files:

* nodes: ``node_id`` (int64), ``label`` (``class_<c>``), ``split`` (train 5% / val 1% /
  test 1% / none) and ``w0 .. w<F-1>``: binary word columns (uint8), each class using its own
  preferred words more often, as the demo does;
* edges: ``src``, ``dst`` (int64), undirected rows, ``homophily`` of them within a class, no
  self loops. Duplicate rows are not removed (about ``edges**2 / nodes**2 / 2`` of them: a
  few thousand at 25M nodes and 100M rows); the pipeline keeps them as parallel edges.

A node's class is a fixed hash of its id, so the edge writer draws same-class partners from
per-class id lists without holding the node tables. Memory: one chunk plus the class lists
(8 bytes a node).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SPLITS = {"train": 0.05, "val": 0.01, "test": 0.01}
_PREFERRED, _BACKGROUND = 0.25, 0.03  # word probabilities: a class's own words, the rest


@dataclass(frozen=True)
class LargeGraph:
    nodes: int
    edge_rows: int  # undirected rows: the pipeline stores twice as many directed edges
    features: int
    classes: int = 10
    homophily: float = 0.8
    seed: int = 0


def node_classes(ids: np.ndarray, classes: int) -> np.ndarray:
    """(n,) class of each id: a fixed multiplicative hash, so no table is needed to look it up."""
    return ((ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)).astype(np.int64) % classes


def _preferred_words(graph: LargeGraph) -> np.ndarray:
    rng = np.random.default_rng(graph.seed)
    preferred = np.zeros((graph.classes, graph.features), dtype=bool)
    preferred[np.arange(graph.features) % graph.classes, rng.permutation(graph.features)] = True
    return np.where(preferred, _PREFERRED, _BACKGROUND).astype(np.float32)


def write_nodes(graph: LargeGraph, folder: pathlib.Path, chunk: int = 1_000_000) -> int:
    """Writes ``nodes/part-*.parquet``; returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    probability = _preferred_words(graph)
    split_names = np.array([*SPLITS, "none"], dtype=object)
    bounds = np.cumsum(list(SPLITS.values()))
    written = 0
    for index, start in enumerate(range(0, graph.nodes, chunk)):
        rng = np.random.default_rng([graph.seed, 1, index])
        ids = np.arange(start, min(start + chunk, graph.nodes), dtype=np.int64)
        classes = node_classes(ids, graph.classes)
        words = (rng.random((len(ids), graph.features), dtype=np.float32) < probability[classes]).astype(np.uint8)
        split = split_names[np.searchsorted(bounds, rng.random(len(ids)), side="right")]
        columns = {"node_id": pa.array(ids), "label": pa.array(np.char.add("class_", classes.astype(str))), "split": pa.array(split)}
        columns |= {f"w{j}": pa.array(words[:, j]) for j in range(graph.features)}
        path = folder / f"part-{index:05d}.parquet"
        pq.write_table(pa.table(columns), path, compression="zstd")
        written += path.stat().st_size
    return written


def write_edges(graph: LargeGraph, folder: pathlib.Path, chunk: int = 5_000_000) -> int:
    """Writes ``edges/part-*.parquet``; returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    classes = node_classes(np.arange(graph.nodes, dtype=np.int64), graph.classes)
    members = [np.flatnonzero(classes == c) for c in range(graph.classes)]
    del classes
    written = 0
    for index, start in enumerate(range(0, graph.edge_rows, chunk)):
        rng = np.random.default_rng([graph.seed, 2, index])
        count = min(chunk, graph.edge_rows - start)
        src = rng.integers(0, graph.nodes, size=count, dtype=np.int64)
        src_class = node_classes(src, graph.classes)
        same = rng.random(count) < graph.homophily
        dst_class = np.where(same, src_class, (src_class + rng.integers(1, graph.classes, size=count)) % graph.classes)
        dst = np.empty(count, dtype=np.int64)
        for c in range(graph.classes):
            picked = dst_class == c
            dst[picked] = members[c][rng.integers(0, len(members[c]), size=int(picked.sum()))]
        keep = src != dst
        path = folder / f"part-{index:05d}.parquet"
        pq.write_table(pa.table({"src": src[keep], "dst": dst[keep]}), path, compression="zstd")
        written += path.stat().st_size
    return written


def table_config(graph: LargeGraph, tables: pathlib.Path, output_root: pathlib.Path) -> dict:
    """The run config's ``graph`` and ``task`` sections for these tables (other sections: defaults)."""
    return {
        "graph": {
            "nodes": [{"type": "node", "uri": str(tables / "nodes"), "format": "parquet", "id_column": "node_id",
                       "label_column": "label", "split_column": "split",
                       "features": [{"columns": ["w*"], "transform": "passthrough"}]}],
            "edges": [{"type": "link", "uri": str(tables / "edges"), "format": "parquet", "src_column": "src", "dst_column": "dst",
                       "src_type": "node", "dst_type": "node"}],
        },
        "task": {"type": "node_classification"},
        "output": {"root": str(output_root)},
    }
