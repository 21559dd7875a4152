"""Retrieval metrics recomputed from the published candidate files: for each test edge of the
target type, where its destination ranks in its source's top-k list.

Each test edge goes to its source's owner (which wrote that source's candidates), with its
destination's original id fetched from the destination's owner; the owner reads its own
candidate shard back and looks the pairs up. Sums travel, never lists.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from components import storage
from components.gnn.metrics import all_sum
from components.infer.retrieval import CANDIDATES_DIR
from components.infer.shards import read_shard
from components.partition.output import range_ends, range_owner
from components.runtime.collectives import exchange, request_strings


def candidate_ranks(candidates: pd.DataFrame, sources: np.ndarray, destinations: np.ndarray) -> np.ndarray:
    """(m,) rank (1..k) of each (source, destination) pair in the source's list, 0 where absent."""
    pairs = pd.DataFrame({"node_id": sources, "candidate_id": destinations})
    found = pairs.merge(candidates[["node_id", "candidate_id", "rank"]], on=["node_id", "candidate_id"], how="left")
    return found["rank"].fillna(0).to_numpy(dtype=np.int64)


def retrieval_metrics(
    staging: storage.OutputStaging,
    rank: int,
    test_pairs: torch.Tensor,
    node_counts: dict[str, list[int]],
    originals: dict[str, pa.Array],
    src_type: str,
    dst_type: str,
    k: int,
    world_size: int,
) -> dict[str, float]:
    """recall@k (per source with test edges, averaged), hits@k and MRR@k (per test edge) of the
    test pairs (2, m) [source; destination] partition ids this worker holds; collective."""
    src_ends, dst_ends = range_ends(node_counts[src_type]), range_ends(node_counts[dst_type])
    moved = exchange({"src": test_pairs[0], "dst": test_pairs[1]}, range_owner(test_pairs[0], src_ends), world_size)
    dst_offset = int(dst_ends[rank - 1]) if rank else 0
    dst_originals = request_strings(
        moved["dst"],
        range_owner(moved["dst"], dst_ends),
        world_size,
        lambda asked: originals[dst_type].take(pa.array((asked - dst_offset).numpy())),
    )
    src_offset = int(src_ends[rank - 1]) if rank else 0
    src_originals = originals[src_type].take(pa.array((moved["src"] - src_offset).numpy())).to_numpy(zero_copy_only=False).astype(str)
    table = read_shard(staging, f"{CANDIDATES_DIR}/part-{rank:05d}.parquet", ["node_id", "candidate_id", "rank"]).to_pandas()
    ranks = candidate_ranks(table, src_originals, np.asarray(dst_originals.to_pylist(), dtype=object))
    found = ranks > 0
    per_source = pd.DataFrame({"src": src_originals, "found": found}).groupby("src")["found"].mean()
    sums = torch.tensor(
        [float(found.sum()), float((1.0 / ranks[found]).sum()), float(len(ranks)), float(per_source.sum()), float(len(per_source))],
        dtype=torch.float64,
    )
    hits, reciprocal, edges, recall, sources = all_sum(sums).tolist()
    return {
        f"test_retrieval_recall@{k}": recall / max(sources, 1.0),
        f"test_retrieval_hits@{k}": hits / max(edges, 1.0),
        f"test_retrieval_mrr@{k}": reciprocal / max(edges, 1.0),
        "test_retrieval_count": int(edges),
    }
