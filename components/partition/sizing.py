"""What a partition worker needs, predicted from the graph's size before the step runs.

A partition worker loads its share of the TFRecord shards, moves rows to their owners (one
all-to-all per tensor), sorts and renumbers them, and writes its partition. Its peak is the
import floor plus a multiple of the bytes its partition holds: loaded rows, the exchanged copy
and the sorted copy overlap for a moment. The multiple is measured, not derived: recalibrate
``SHARE_FACTOR`` and ``FLOOR_MIB`` with ``benchmarks/plan_validation.py`` when the step changes.
"""

from __future__ import annotations

from components.config import PartitionSpec
from components.graph_size import INT64, GraphSize, MiB, StepPrediction, share
from components.runtime.shm_budget import WORKER_OVERHEAD

# Peak RSS of a partition worker = FLOOR_MIB + SHARE_FACTOR x the bytes of its own partition
# (partition_bytes below). Fitted on benchmarks/scale_probe.py's partition rows (demo graph, 74
# float32 features, 10 stored edges per node): 4M nodes at 2 and 4 workers and 8M nodes at 2 and
# 4 workers (benchmarks/RESULTS.md, "where a trainer's peak goes, 4M and 8M nodes": 2.99, 1.62,
# 5.67, 3.02 GiB) and 1M nodes at 2 and 4 workers (1.11, 0.79 GiB, 2026-11-27 18:10 UTC,
# benchmarks/plan_validation.py): the least largest error over the six, 4.5%. The demo graph's
# ratio of feature bytes to edge bytes is fixed, so one factor covers both; see the weaknesses in
# benchmarks/RESULTS.md ("Sizing model").
FLOOR_MIB = 460.0
SHARE_FACTOR = 2.05
# Bytes per row a partition file holds besides features (components/partition/store.py).
NODE_ROW_BYTES = 2 * INT64 + 1  # node_id, source_id, split (+ label: INT64 where labelled)
EDGE_ROW_BYTES = 2 * INT64 + 2 * INT64 + 1  # edge_index (2), edge_id, source_edge_id, split
# Published beside the tensors, per node: original_ids/<type>.parquet and the id_maps copy
# (int64 id + the original id as a short string, compressed); an estimate.
ID_MAP_BYTES_PER_NODE = 2 * (INT64 + 12)
# A decoded TFRecord row as partition loading holds it (components/partition/loading_memory.py).
SPLIT_BYTES = 1


def partition_bytes(graph: GraphSize, world_size: int, edge_assignment: str = "src") -> float:
    """Bytes of the largest worker's partition: its node rows and stored edges with features."""
    total = 0
    for n in graph.nodes:
        total += share(n.rows, world_size) * (NODE_ROW_BYTES + (INT64 if n.labeled else 0) + n.row_feature_bytes)
    for e in graph.stored_edges(edge_assignment):
        total += share(e.count, world_size) * (EDGE_ROW_BYTES + e.feature_row_bytes)
    return float(total)


def loading_shm_bytes(graph: GraphSize, world_size: int, subprocess_min_bytes: int) -> float:
    """What one worker's loader subprocesses hand it through ``/dev/shm``: the decoded rows of
    each type whose share reaches ``partition.subprocess_min_bytes`` (as
    :func:`components.partition.loading_memory.loading_need` counts them; the share's decoded
    bytes stand in for its shard bytes)."""
    total = 0.0
    for n in graph.nodes:
        held = share(n.rows, world_size) * (INT64 + (INT64 if n.labeled else 0) + SPLIT_BYTES + n.feature_width * 4)
        total += held if held >= subprocess_min_bytes else 0
    for e in graph.edges:
        held = share(e.rows, world_size) * (3 * INT64 + SPLIT_BYTES + e.feature_width * 4)
        total += held if held >= subprocess_min_bytes else 0
    return total


def predict(graph: GraphSize, world_size: int, options: PartitionSpec) -> StepPrediction:
    """The partition step at ``world_size`` workers."""
    own = partition_bytes(graph, world_size, options.edge_assignment)
    everyone = partition_bytes(graph, 1, options.edge_assignment)
    shm = loading_shm_bytes(graph, world_size, options.subprocess_min_bytes)
    peak = FLOOR_MIB + SHARE_FACTOR * own / MiB
    disk = (everyone + graph.total_nodes * ID_MAP_BYTES_PER_NODE) / MiB
    parts = (("import floor", FLOOR_MIB), ("own partition", own / MiB), ("copies while exchanging", (SHARE_FACTOR - 1) * own / MiB))
    return StepPrediction("partition", world_size, peak, (shm + WORKER_OVERHEAD) / MiB, disk, parts=parts)
