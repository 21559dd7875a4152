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
    learnt_embeddings/<type>/ids-<rank>.parquet
                        node_id int64, original_id string of partition <rank>'s nodes of a
                        featureless type (whichever way its rows are stored): what an
                        inference-only run on fresh tables finds each node's trained row by
    transform_state.json
                        the fitted transforms of the preprocess run the model was trained on
                        (the preprocess contract's file, copied): fresh tables are encoded with them
    graph_schema.json   that preprocess run's graph schema: types, feature names and widths,
                        vocabularies (what infer checks fresh data against)
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
# The validation figures metrics.json holds per task: what a registry gate may compare.
GATE_METRICS = {"node_classification": ("val_accuracy", "val_macro_f1"), "link_prediction": ("val_roc_auc",)}
TRANSFORM_STATE_FILE = "transform_state.json"  # the same name as in the preprocess output
GRAPH_SCHEMA_FILE = "graph_schema.json"  # the same name as in the preprocess output
LEARNT_IDS_FILE = "learnt_embeddings/{node_type}/ids-{rank:05d}.parquet"
