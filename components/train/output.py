"""What the ``train`` step publishes, and the names later steps (infer, report) read it by.

Output (published atomically)::

    model.pt            best-validation ``state_dict`` (load with ``weights_only=True``)
    model_spec.json     what rebuilding the model needs (task, dims, classes, model section)
    metrics.jsonl       one line per epoch: loss, train/val metrics, seconds, batches/s, the largest worker's peak memory
    tensorboard/        the same curves as a TensorBoard event file (see components/train/curves.py)
    metrics.json        best epoch, validation and test metrics of the best model
    learnt_embeddings/<type>/shard-<rank>.pt
                        sharded learnt embeddings of featureless types at the best epoch:
                        {"start": first id, "rows": (n, hidden)} of each partition's nodes
    config.resolved.yaml

Beside the published generations, ``_checkpoints/`` holds what a rerun resumes from.
"""

from __future__ import annotations

STEP = "train"
MODEL_FILE = "model.pt"
SPEC_FILE = "model_spec.json"
HISTORY_FILE = "metrics.jsonl"
METRICS_FILE = "metrics.json"
# The validation metric that selects the best epoch, per task.
VALIDATION_METRIC = {"node_classification": "accuracy", "link_prediction": "roc_auc"}
