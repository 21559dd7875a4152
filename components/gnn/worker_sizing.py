"""What a sampled train or infer worker holds once it has loaded its partition, and the copies
it makes on the way: the part of the sizing model (``gnnflow plan``) that train and infer share.

A trainer's peak (benchmarks/RESULTS.md, "where a trainer's peak goes, 4M and 8M nodes") is in
its setup, not its epoch: the import floor, what it keeps (its features, labels and GLT's CSR,
in shared memory, plus whole feature tables copied from peers), and the transient copies made
while GLT initialises its graph or the peers' rows arrive. In the epoch it holds the kept part
plus a working set for batches. The constants below are measured; when the workers'
loading changes (issue 39's leaner worker), rerun ``benchmarks/plan_validation.py`` and refit.
Pure arithmetic on a :class:`~components.graph_size.GraphSize`.
"""

from __future__ import annotations

import math

from components.config import GnnflowConfig
from components.gnn.shared_memory import WorkerShape, sampled_worker_need, whole_table_types
from components.graph_size import INT64, GraphSize, MiB, share

# Anonymous memory a worker inherits from the fork server before it loads anything: torch (CUDA
# build), PyG and GLT imported (RESULTS.md, "where a trainer's peak goes": 0.37 GiB).
FLOOR_MIB = 0.37 * 1024
# Setup transients (after issue 39's leaner worker: partition files are streamed into the tensors
# GLT keeps and the CSR is stored, so neither the files nor a COO-to-CSR sort are copied). What is
# left is GLT's C++ graph initialisation, which sorts a copy of ``indices`` to count distinct ids:
# 8 bytes per stored edge and the sort's buffer. Bounded by measurement: at 25M nodes (50M stored
# edges a worker, 4 workers, RESULTS "The largest graph") the whole peak above what is kept was
# 0.68 GiB, 14.6 bytes per stored edge, so no more than that goes to these copies.
SETUP_BYTES_PER_EDGE = 12
# Above the kept data during the epoch: batches, autograd, allocator arenas and the sampler's
# per-id arrays, which grow with the graph, but less than in proportion. Fitted on the leaner
# worker's 4-worker trainer peaks at 1M, 4M and 8M nodes (2026-11-27, plan_validation.py: 0.17,
# 0.31-0.34 and 0.38 GiB above what is kept): 0.155 GiB x sqrt(million nodes); the 25M-node run,
# not fitted on, is then within 4%.
EPOCH_WORKING_MIB_PER_SQRT_MILLION_NODES = 0.155 * 1024
# Copying whole feature tables (``training.feature_cache_ratio``): the peers' rows arrive in a
# buffer before they are placed, about once their bytes (2-worker trainer peaks at 1M, 4M and 8M:
# 0.22, 0.64 and 1.26 GiB above what is kept, against 0.14, 0.57 and 1.13 GiB of peers' rows).
WHOLE_TABLE_COPY_FACTOR = 1.0
NODE_ID_SPLIT_BYTES = INT64 + 1


def worker_shape(graph: GraphSize, world_size: int) -> WorkerShape:
    """The shape :func:`sampled_worker_need` takes, for equal shares, with each type's stored value bytes."""
    stored = graph.stored_edges()
    messages = [s for s in stored if s.message]
    edge_sizes = {e.name: e for e in graph.edges}
    return WorkerShape(
        node_counts={n.name: [share(n.rows, world_size)] * world_size for n in graph.nodes},
        feature_dims={n.name: n.feature_width for n in graph.nodes},
        labeled=frozenset(n.name for n in graph.nodes if n.labeled),
        edges={
            s.name: ([share(s.count, world_size)] * world_size, edge_sizes[s.forward].feature_width, s.compressed_type) for s in messages
        },
        label_edge_counts={s.name: [share(s.count, world_size)] * world_size for s in stored if not s.message},
        heterogeneous=len(graph.nodes) > 1 or sum(1 for e in graph.edges if e.role == "message") > 1,
        feature_bytes={n.name: n.value_bytes for n in graph.nodes},
        edge_feature_bytes={s.name: edge_sizes[s.forward].value_bytes for s in messages},
    )


def learnt_width(config: GnnflowConfig) -> int:
    """Columns of a featureless type's learnt-embedding shard in shared memory (0: replicated)."""
    return config.model.hidden_channels if config.model.learnt_embeddings == "sharded" else 0


def kept_bytes(graph: GraphSize, world_size: int, config: GnnflowConfig) -> dict[str, float]:
    """What the largest worker keeps once loaded, by kind (bytes)."""
    shape = worker_shape(graph, world_size)
    copied = set(whole_table_types(shape, world_size - 1, config.training.feature_cache_ratio))
    hidden = config.model.hidden_channels
    kept = {"features": 0.0, "whole feature tables": 0.0, "labels and ids": 0.0, "learnt embeddings": 0.0, "CSR": 0.0}
    for n in graph.nodes:
        own = share(n.rows, world_size)
        if n.name in copied:
            kept["whole feature tables"] += n.rows * (n.row_feature_bytes + (INT64 if n.labeled else 0))
        else:
            kept["features"] += own * n.row_feature_bytes
        kept["labels and ids"] += own * (NODE_ID_SPLIT_BYTES + (INT64 if n.labeled else 0))
        if not n.feature_width:  # weights and one optimizer state per row: sharded own rows, replicated all
            rows = own if config.model.learnt_embeddings == "sharded" else n.rows
            kept["learnt embeddings"] += rows * hidden * 4 * 2
    for s in graph.stored_edges():
        edges = share(s.count, world_size)
        if s.message:  # indptr over every id of the compressed side, indices and edge ids
            # Edge ids are kept only where edges have features (a stand-in otherwise: 8 bytes less)
            ids = INT64 + s.feature_row_bytes if s.feature_row_bytes else 0
            kept["CSR"] += (graph.node(s.compressed_type).rows + 1) * INT64 + edges * (INT64 + ids)
        else:
            kept["labels and ids"] += edges * 3 * INT64
    return kept


def setup_transient_bytes(graph: GraphSize, world_size: int, config: GnnflowConfig) -> float:
    """Copies made while loading, above what is kept (see the constants): GLT's sort of a copy of
    ``indices`` over the worker's stored edges (own feature rows are streamed into place: no
    copy), or the peers' rows of whole feature tables on their way in, whichever is larger."""
    edges = sum(share(s.count, world_size) for s in graph.stored_edges() if s.message)
    copied = set(whole_table_types(worker_shape(graph, world_size), world_size - 1, config.training.feature_cache_ratio))
    peers = sum((n.rows - share(n.rows, world_size)) * n.row_feature_bytes for n in graph.nodes if n.name in copied)
    return float(max(SETUP_BYTES_PER_EDGE * edges, WHOLE_TABLE_COPY_FACTOR * peers))


def loading_peak(graph: GraphSize, world_size: int, config: GnnflowConfig, step: str) -> tuple[float, float, tuple[tuple[str, float], ...]]:
    """(peak MiB, /dev/shm MiB, the peak's terms in MiB) of the largest worker of ``world_size``,
    through its setup and an epoch's batches."""
    kept = kept_bytes(graph, world_size, config)
    transient = setup_transient_bytes(graph, world_size, config)
    working = EPOCH_WORKING_MIB_PER_SQRT_MILLION_NODES * math.sqrt(graph.total_nodes / 1e6)
    peak = FLOOR_MIB + sum(kept.values()) / MiB + max(transient / MiB, working)
    need = sampled_worker_need(
        worker_shape(graph, world_size),
        [world_size - 1],
        feature_cache_ratio=config.training.feature_cache_ratio,
        learnt_width=learnt_width(config),
        multiprocess=config.training.sampling == "multiprocess",
        step=step,
    )
    parts = (
        ("import floor", FLOOR_MIB),
        *((k, v / MiB) for k, v in kept.items() if v),
        ("setup copies", transient / MiB),
        ("epoch working set", working),
    )
    return peak, need.total / MiB, parts
