"""What the ``preprocess`` step publishes, and how later steps read it.

Output (published atomically, see :mod:`components.storage.publish`)::

    nodes/<type>/part-*.parquet     node_id int64, features fixed_size_list<float32>, label int64, split int8
    edges/<src>__<rel>__<dst>/part-*.parquet   src int64, dst int64, [features], split int8
    id_maps/<type>/part-*.parquet   node_id int64 → original_id string
    graph_schema.json               types, counts, feature names, vocabularies, split sizes, files
    transform_state.json            fitted statistics; pass it back with --fitted-state to reuse
    config.resolved.yaml            the full config this output was made with
"""

from __future__ import annotations

import json
import logging

from components import storage
from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.schema import EdgeTypeSchema, GraphSchema, NodeTypeSchema
from components.tables.transforms import FittedFeatures

log = logging.getLogger("gnnflow.preprocess")

STEP = "preprocess"
SCHEMA_FILE = "graph_schema.json"
STATE_FILE = "transform_state.json"
UNSEEN_CATEGORIES = "unseen_categories"  # manifest metadata of a run with reused transforms


def load_fitted_state(uri: storage.Uri | str) -> dict:
    """Fitted statistics from an earlier run: a preprocess output, or any published output that
    carries its ``transform_state.json`` (a trained model does), or the state file itself."""
    uri = storage.parse_uri(uri)
    if storage.exists(uri):
        return json.loads(storage.read_text(uri))
    published = storage.open_published(uri)
    if STATE_FILE not in published.manifest.files:
        raise GnnflowError(f"{uri} holds no {STATE_FILE}: give a preprocess output, a model trained by this version, or the state file")
    return published.read_json(STATE_FILE)


def publish_preprocessed(
    staging: storage.OutputStaging,
    config: GnnflowConfig,
    node_schemas: dict[str, NodeTypeSchema],
    edge_schemas: dict[str, EdgeTypeSchema],
    node_state: dict[str, tuple[list[FittedFeatures], list[str] | None]],
    edge_features: dict[str, list[FittedFeatures]],
    unseen_categories: dict[str, int] | None = None,
) -> storage.PublishedOutput:
    """Writes the schema, the fitted state and the config beside the parts, then publishes.

    ``unseen_categories`` (``<type>.<column>`` → values outside an earlier run's fitted
    vocabulary, which went to the 'other' slot) is recorded in the manifest's metadata."""
    task, target = config.task, config.task_target
    graph = GraphSchema(task_type=task.type, target=target, node_types=node_schemas, edge_types=edge_schemas)
    state = {
        "node_types": {
            name: {"features": [f.to_dict() for f in features], "label_vocabulary": vocabulary}
            for name, (features, vocabulary) in node_state.items()
        },
        "edge_types": {name: {"features": [f.to_dict() for f in feats]} for name, feats in edge_features.items()},
    }
    staging.write_bytes(SCHEMA_FILE, graph.to_json().encode())
    staging.write_json(STATE_FILE, state)
    staging.write_bytes("config.resolved.yaml", config.to_yaml().encode())
    counts = {f"nodes.{k}": v.count for k, v in node_schemas.items()} | {f"edges.{k}": v.count for k, v in edge_schemas.items()}
    metadata: dict[str, object] = {"task_type": task.type, "target": target}
    if unseen_categories is not None:
        metadata[UNSEEN_CATEGORIES] = unseen_categories
        if unseen_categories:
            log.warning(
                "preprocess: categories the fitted transforms never saw, encoded in their 'other' slot: %s",
                ", ".join(f"{k}={v}" for k, v in sorted(unseen_categories.items())),
            )
    published = staging.publish(counts=counts, metadata=metadata)
    log.info("preprocess: published %s (%s)", staging.output, ", ".join(f"{k}={v}" for k, v in counts.items()))
    return published


def read_graph_schema(preprocessed: storage.PublishedOutput) -> GraphSchema:
    return GraphSchema.from_json(preprocessed.read_bytes(SCHEMA_FILE).decode(), str(preprocessed.uri(SCHEMA_FILE)))
