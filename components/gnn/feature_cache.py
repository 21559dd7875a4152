"""Whole feature tables on every worker where they are small enough (``training.feature_cache_ratio``).

A sampled batch holds about as many remote nodes as local ones on two workers, and GLT fetches
each remote node's feature row (and label) from its owner over RPC for every batch that holds
it: on an arxiv-sized graph a [15, 10] batch of 1,024 seeds reaches half of the graph's nodes,
and those fetches were a third of an epoch. Where a node type's rows of all other partitions
number at most ``ratio`` times a worker's own, the worker instead copies them once, before its
loaders start, and holds the type's whole table in id order: its feature book then answers
every lookup locally, with no RPC and no stitching of local and remote parts.

Only whole tables are copied. A partial copy (say the most-linked remote rows) would make
every lookup test each id for a copy; on these 2 cores that cost more per batch than it saved.
The copies are of input features and labels, which never change; learnt embedding rows
(featureless types) are updated in place by their owner, so those are never copied.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psutil
import torch
import torch.distributed as dist

from components.partition.output import StoredPartition

log = logging.getLogger("gnnflow.gnn")

_REQUEST_BYTES = 32 << 20  # feature bytes asked of a peer per request


@dataclass(frozen=True)
class WholeTable:
    """One node type's rows of every partition, in id order."""

    features: torch.Tensor  # (N, d)
    labels: torch.Tensor | None  # (N,) where the type has labels


def replicable_types(part: StoredPartition, ratio: float, spare_bytes: float = float("inf")) -> list[str]:
    """Node types whose other partitions' rows this worker copies: types with input features
    whose remote rows number at most ``ratio`` times its own (and at least one), as long as the
    copies, type after type, fit in ``spare_bytes``."""
    schema = part.metadata.schema
    chosen = []
    for node_type, counts in part.metadata.node_counts.items():
        own = counts[part.index]
        remote = sum(counts) - own
        if not (schema.node_types[node_type].feature_dim and 0 < remote <= ratio * own):
            continue
        copies = remote * _row_bytes(part, node_type)
        if copies > spare_bytes:
            log.warning(
                "rank %d: %s's feature rows of other partitions (%.0f MiB) exceed half this worker's share of free memory "
                "(%.0f MiB): fetched per batch instead (training.feature_cache_ratio)",
                part.index,
                node_type,
                copies / 2**20,
                spare_bytes / 2**20,
            )
            continue
        spare_bytes -= copies
        chosen.append(node_type)
    return chosen


def _row_bytes(part: StoredPartition, node_type: str) -> int:
    """Bytes of one node's feature row and label."""
    own = part.nodes[node_type]
    label = own["label"].element_size() if "label" in own else 0
    return own["features"].shape[1] * own["features"].element_size() + label


def fetch_whole_tables(part: StoredPartition, ratio: float, rank: int, world_size: int, local_world_size: int) -> dict[str, WholeTable]:
    """This worker's whole tables (see the module text), copied from their owners over GLT's RPC,
    in at most half of its share (among ``local_world_size`` workers) of the memory free now.
    Collective: call on every worker after ``init_rpc``, before any loader is built."""
    import graphlearn_torch as glt

    if world_size == 1 or ratio <= 0:  # the same answer on every worker: none registers
        return {}
    callee = glt.distributed.rpc_register(_ServeRows(part))  # the same id on every worker: same order
    dist.barrier()  # every worker serves its rows before anyone asks
    start = time.perf_counter()
    names = glt.distributed.rpc.get_rpc_current_group_worker_names()
    spare = psutil.virtual_memory().available / local_world_size / 2
    tables = {node_type: _copy_table(part, node_type, names, callee) for node_type in replicable_types(part, ratio, spare)}
    dist.barrier()  # nobody stops serving before everyone has its copies
    if tables:
        copied = sum(t.features.nbytes - part.nodes[n]["features"].nbytes for n, t in tables.items())
        log.info(
            "rank %d: whole feature tables of %s (copied %.1f MiB from peers in %.1fs)",
            rank,
            {n: len(t.features) for n, t in tables.items()},
            copied / 2**20,
            time.perf_counter() - start,
        )
    return tables


def _copy_table(part: StoredPartition, node_type: str, names: list[str], callee: int) -> WholeTable:
    import graphlearn_torch as glt

    own = part.nodes[node_type]
    counts = part.metadata.node_counts[node_type]
    # In shared memory from the start: GLT moves every feature table there, and moving this one
    # would hold it twice for a moment (the peak RSS of the step).
    features = torch.empty(sum(counts), own["features"].shape[1], dtype=own["features"].dtype).share_memory_()
    labels = torch.empty(sum(counts), dtype=own["label"].dtype).share_memory_() if "label" in own else None
    step = max(1, _REQUEST_BYTES // max(1, own["features"][:1].nbytes))
    offset = 0
    for owner, count in enumerate(counts):
        if owner == part.index:  # the partition's own rows become a view of the table: one copy, not two
            features[offset : offset + count] = own["features"]
            own["features"] = features[offset : offset + count]
            if labels is not None:
                labels[offset : offset + count] = own["label"]
                own["label"] = labels[offset : offset + count]
        for first in range(0, count if owner != part.index else 0, step):
            last = min(count, first + step)
            rows, row_labels = glt.distributed.rpc_request(names[owner], callee, args=(node_type, first, last))
            features[offset + first : offset + last] = rows
            if labels is not None:
                labels[offset + first : offset + last] = row_labels
        offset += count
    return WholeTable(features, labels)


class _ServeRows:
    """GLT RPC callee: a slice of this worker's own rows of a node type, for a peer's copy."""

    def __init__(self, part: StoredPartition) -> None:
        self.part = part

    def call(self, node_type: str, first: int, last: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        own = self.part.nodes[node_type]
        return own["features"][first:last], (own["label"][first:last] if "label" in own else None)
