"""What the ``infer`` step publishes, and the names the report reads it by.

Output (published atomically; workers write into one generation, the launching process
publishes once all have finished)::

    embeddings/<node type>/part-<rank>.parquet   node_id, embedding[, prediction, probability][, cold]
    retrieval/candidates/part-<rank>.parquet     link prediction: node_id, candidate_id, score, rank
    metrics.json                                  test metrics recomputed from the shards

On partitions other than the model's own (fresh tables), the shards have a bool column ``cold``
and metrics.json ``cold_nodes`` and ``cold_nodes.<type>`` (each featureless type): the nodes
without a trained row (see :mod:`components.infer.cold_start`). On the model's own partitions no
node is cold, and neither is written.
    config.resolved.yaml
"""

from __future__ import annotations

from components.errors import GnnflowError

STEP = "infer"
# sampled: GLT's neighbour loader; exact: full neighbourhoods, layer by layer; auto: the way the
# model trained (exact for training.mode full_graph, whose propagation saw whole neighbourhoods).
MODES = ("auto", "sampled", "exact")
METRICS_FILE = "metrics.json"
EMBEDDINGS_FOLDER = "embeddings"
CANDIDATES_FOLDER = "retrieval/candidates"  # the same folder as infer.retrieval.CANDIDATES_DIR


def resolved_mode(mode: str, training_mode: str) -> str:
    """``mode`` (one of :data:`MODES`) with ``auto`` settled by the config's ``training.mode``."""
    if mode not in MODES:
        raise GnnflowError(f"unknown inference mode {mode!r}: choose one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    return "exact" if training_mode == "full_graph" else "sampled"
