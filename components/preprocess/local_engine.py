"""The preprocess step on this machine: every table read and written by this process."""

from __future__ import annotations

from collections import Counter

from components import storage
from components.config import GnnflowConfig
from components.preprocess.edges import write_edges
from components.preprocess.nodes import NodeFit, fit_nodes, write_nodes
from components.preprocess.output import STEP, publish_preprocessed
from components.preprocess.parts import PartWriter
from components.preprocess.splits import edge_split, node_split


def preprocess_here(config: GnnflowConfig, output: storage.Uri, fitted_state: dict | None) -> storage.PublishedOutput:
    reused_nodes = (fitted_state or {}).get("node_types", {})
    reused_edges = (fitted_state or {}).get("edge_types", {})
    # Every node table is fitted before anything is written: most bad input fails here.
    fits: dict[str, NodeFit] = {
        spec.type: fit_nodes(spec, config.preprocess, reused_nodes.get(spec.type) if fitted_state else None) for spec in config.graph.nodes
    }
    with storage.staged_output(output, STEP) as staging:
        writer = PartWriter(staging)
        unseen: Counter[str] = Counter()
        node_schemas = {name: write_nodes(fit, config.preprocess, node_split(config, name), writer, unseen) for name, fit in fits.items()}
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
        reused = dict(unseen) if fitted_state is not None else None
        return publish_preprocessed(staging, config, node_schemas, edge_schemas, node_state, edge_features, reused)
