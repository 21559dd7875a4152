"""Step ``preprocess``: raw node and edge tables → validated, enumerated, transformed tables.

Output (published atomically, see :mod:`components.storage.publish`)::

    nodes/<type>/part-*.parquet     node_id int64, features fixed_size_list<float32>, label int64, split int8
    edges/<src>__<rel>__<dst>/part-*.parquet   src int64, dst int64, [features], split int8
    id_maps/<type>/part-*.parquet   node_id int64 → original_id string
    graph_schema.json               types, counts, feature names, vocabularies, split sizes, files
    transform_state.json            fitted statistics; pass it back with --fitted-state to reuse
    config.resolved.yaml            the full config this output was made with
"""

from __future__ import annotations

import logging

from components import storage
from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.preprocess.edges import write_edges
from components.preprocess.nodes import NodeFit, fit_nodes, write_nodes
from components.preprocess.parts import PartWriter
from components.preprocess.splits import edge_split, node_split
from components.schema import EdgeTypeSchema, GraphSchema, NodeTypeSchema
from components.transforms import FittedFeatures

log = logging.getLogger("gnnflow.preprocess")

STEP = "preprocess"
SCHEMA_FILE = "graph_schema.json"
STATE_FILE = "transform_state.json"


def load_fitted_state(uri: storage.Uri | str) -> dict:
    """Fitted statistics from an earlier preprocess output (its root, or the state file itself)."""
    uri = storage.parse_uri(uri)
    if storage.exists(uri):
        import json

        return json.loads(storage.read_text(uri))
    return storage.open_published(uri, step=STEP).read_json(STATE_FILE)


def check_fitted_state(config: GnnflowConfig, fitted_state: dict | None) -> None:
    """An error naming the types an earlier run's fitted state has no statistics for."""
    if fitted_state is None:
        return
    missing = [n.type for n in config.graph.nodes if n.type not in fitted_state.get("node_types", {})]
    missing += [e.name for e in config.graph.edges if e.name not in fitted_state.get("edge_types", {})]
    if missing:
        raise GnnflowError(f"the fitted state has no statistics for {missing}")


def preprocess(
    config: GnnflowConfig, output: storage.Uri | str, fitted_state: dict | None = None, image: str | None = None
) -> storage.PublishedOutput:
    """Runs the step with the configured engine; returns the published output. Nothing is
    published if any check fails. ``image`` is the step image (Dataflow's worker image)."""
    output = storage.parse_uri(output)
    log.info(
        "preprocess: %d node table(s), %d edge table(s) → %s (engine %s)",
        len(config.graph.nodes),
        len(config.graph.edges),
        output,
        config.preprocess.engine,
    )
    check_fitted_state(config, fitted_state)
    if config.preprocess.engine == "beam":
        from components.preprocess.beam_engine import preprocess_with_beam

        return preprocess_with_beam(config, output, fitted_state, image)
    return _preprocess_here(config, output, fitted_state)


def _preprocess_here(config: GnnflowConfig, output: storage.Uri, fitted_state: dict | None) -> storage.PublishedOutput:
    reused_nodes = (fitted_state or {}).get("node_types", {})
    reused_edges = (fitted_state or {}).get("edge_types", {})
    # Every node table is fitted before anything is written: most bad input fails here.
    fits: dict[str, NodeFit] = {
        spec.type: fit_nodes(spec, config.preprocess, reused_nodes.get(spec.type) if fitted_state else None) for spec in config.graph.nodes
    }
    with storage.staged_output(output, STEP) as staging:
        writer = PartWriter(staging)
        node_schemas = {name: write_nodes(fit, config.preprocess, node_split(config, name), writer) for name, fit in fits.items()}
        edge_schemas, edge_features = {}, {}
        for spec in config.graph.edges:
            schema, features = write_edges(
                spec,
                config.preprocess,
                fits[spec.src_type].ids,
                fits[spec.dst_type].ids,
                edge_split(config, spec),
                reused_edges.get(spec.name) if fitted_state else None,
                writer,
            )
            edge_schemas[spec.name], edge_features[spec.name] = schema, features
        node_state = {name: (fit.features, fit.label_vocabulary) for name, fit in fits.items()}
        return publish_preprocessed(staging, config, node_schemas, edge_schemas, node_state, edge_features)


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
