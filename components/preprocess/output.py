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
from components.schema import EdgeTypeSchema, GraphSchema, NodeTypeSchema
from components.tables.transforms import FittedFeatures

log = logging.getLogger("gnnflow.preprocess")

STEP = "preprocess"
SCHEMA_FILE = "graph_schema.json"
STATE_FILE = "transform_state.json"


def load_fitted_state(uri: storage.Uri | str) -> dict:
    """Fitted statistics from an earlier preprocess output (its root, or the state file itself)."""
    uri = storage.parse_uri(uri)
    if storage.exists(uri):
        return json.loads(storage.read_text(uri))
    return storage.open_published(uri, step=STEP).read_json(STATE_FILE)


def publish_preprocessed(
    staging: storage.OutputStaging,
    config: GnnflowConfig,
    node_schemas: dict[str, NodeTypeSchema],
    edge_schemas: dict[str, EdgeTypeSchema],
    node_state: dict[str, tuple[list[FittedFeatures], list[str] | None]],
    edge_features: dict[str, list[FittedFeatures]],
) -> storage.PublishedOutput:
    """Writes the schema, the fitted state and the config beside the parts, then publishes."""
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
    published = staging.publish(counts=counts, metadata={"task_type": task.type, "target": target})
    log.info("preprocess: published %s (%s)", staging.output, ", ".join(f"{k}={v}" for k, v in counts.items()))
    return published


def read_graph_schema(preprocessed: storage.PublishedOutput) -> GraphSchema:
    return GraphSchema.from_json(preprocessed.read_bytes(SCHEMA_FILE).decode(), str(preprocessed.uri(SCHEMA_FILE)))
