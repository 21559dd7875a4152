"""What a sampled infer worker needs, predicted from the graph's size before the step runs.

An infer worker loads its partition exactly as a trainer does (the same GLT dataset, CSR and
feature copies: :mod:`components.gnn.worker_sizing`), then computes an output row for each node it owns and writes them as Parquet
shards as it goes (:mod:`components.infer.shard_stream`: at most one row group being filled
and the batches that arrive ahead of it). So its peak is the trainer's setup peak, or what it
keeps plus those rows and the per-node original ids and completeness marks, if that is larger.
"""

from __future__ import annotations

from components.config import GnnflowConfig
from components.gnn import worker_sizing
from components.graph_size import INT64, GraphSize, MiB, StepPrediction, share
from components.infer.alpha_grid import CORRECTION_ALPHAS, grid_pairs
from components.infer.shard_stream import EARLY_ROW_GROUPS, ROW_GROUP_ROWS

# Rows a worker holds while it writes: the row group being filled and those that arrived early.
HELD_ROWS = (1 + EARLY_ROW_GROUPS) * ROW_GROUP_ROWS
# An evaluation batch's working set (sampled subgraph, its features and activations, GLT's buffers,
# batches in flight): a part per seed and a part that grows with the graph (GLT's sampling buffers
# and the feature lookups of remote rows, as train's epoch working set does). Fitted on the demo
# graph's 1M and 4M probes at 2 and 4 workers, eval_batch_size 4096, fan-outs [10, 5]
# (benchmarks/plan_validation.py, 2026-11-27): 0.415 GiB per 4,096 seeds + 0.10 GiB per million
# nodes; the 8M probe, not fitted on, is then within 11% (RESULTS, "Sizing model").
WORKING_MIB_PER_SEED = 0.415 * 1024 / 4096
WORKING_MIB_PER_MILLION_NODES = 0.10 * 1024
# Per owned node for the whole step: its original id (an Arrow string, ~20 bytes) and its
# completeness mark (one byte).
PER_NODE_BYTES = 21
# A Parquet output row beside its float32 values: the node id and the original id (a short
# string, compressed); an estimate.
ID_BYTES_PER_ROW = INT64 + 12
# infer.smoothing: correct_and_smooth holds the target's rows until smoothed, plus per own target
# node the propagated matrices (the start, its anchor, the rows being propagated, the neighbours'
# sum and the next rows: five of classes float32 per candidate pair, the pairs side by side,
# components/infer/smoothing.py), the corrected predictions (classes float32 per correction alpha)
# and per own stored edge between target nodes the ring's edge lists and fetch indices
# (components/infer/smoothing_stage.py); arithmetic, not measured. infer.alpha_selection
# validation propagates every pair of components/infer/alpha_grid.py at once; fixed, one.
SMOOTHING_MATRICES = 5
SMOOTHING_BYTES_PER_EDGE = 3 * INT64


def output_row_bytes(graph: GraphSize, config: GnnflowConfig) -> int:
    """An output row: the embedding, and for classification the class probabilities and the class."""
    probabilities = graph.classes * 4 + INT64 if config.task.type == "node_classification" else 0
    return config.model.hidden_channels * 4 + probabilities


def predict(graph: GraphSize, world_size: int, config: GnnflowConfig) -> StepPrediction:
    """The infer step (sampled inference) at ``world_size`` workers."""
    loading, shm, parts = worker_sizing.loading_peak(graph, world_size, config, "infer")
    kept = sum(worker_sizing.kept_bytes(graph, world_size, config).values())
    row = output_row_bytes(graph, config)
    own = sum(share(n.rows, world_size) for n in graph.nodes)
    outputs = min(own, HELD_ROWS) * row + own * PER_NODE_BYTES
    working = WORKING_MIB_PER_SEED * config.training.eval_batch_size + WORKING_MIB_PER_MILLION_NODES * graph.total_nodes / 1e6
    with_outputs = worker_sizing.FLOOR_MIB + (kept + outputs) / MiB + working
    peak = max(loading, with_outputs, worker_sizing.FLOOR_MIB + (kept + _smoothing_bytes(graph, world_size, config)) / MiB)
    disk = graph.total_nodes * (row + ID_BYTES_PER_ROW) / MiB
    return StepPrediction("infer", world_size, peak, shm, disk, parts=(*parts, ("outputs", outputs / MiB), ("evaluation batches", working)))


def _smoothing_bytes(graph: GraphSize, world_size: int, config: GnnflowConfig) -> float:
    """What Correct & Smooth holds beside the loaded graph (0 without ``infer.smoothing``)."""
    if config.infer.smoothing == "none" or config.task.type != "node_classification":
        return 0.0
    target = next((n for n in graph.nodes if n.name == config.task_target), None)
    if target is None:
        return 0.0
    own = share(target.rows, world_size)
    edges = sum(share(e.count, world_size) for e in graph.stored_edges() if e.message and e.compressed_type == target.name)
    pairs, corrections = smoothing_candidates(config)
    matrices = (SMOOTHING_MATRICES * pairs + corrections) * graph.classes * 4
    rows = own * (output_row_bytes(graph, config) + PER_NODE_BYTES + matrices)
    return float(rows + edges * SMOOTHING_BYTES_PER_EDGE)


def smoothing_candidates(config: GnnflowConfig) -> tuple[int, int]:
    """(alpha pairs, correction alphas) Correct & Smooth propagates side by side."""
    if config.infer.alpha_selection == "validation":
        return len(grid_pairs()), len(CORRECTION_ALPHAS)
    return 1, 1
