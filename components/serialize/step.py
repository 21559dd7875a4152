"""Step ``serialize``: preprocessed tables → TFRecord shards (layout: :mod:`.output`, shard
plan and encoder: :mod:`.shards`), in this process or, with ``preprocess.engine: beam``, by Beam
workers (:mod:`.beam_engine`)."""

from __future__ import annotations

import dataclasses
import logging

from components import storage
from components.config import GnnflowConfig, SerializeSpec
from components.config.resources import ThreadsSpec
from components.preprocess.output import STEP as PREPROCESS_STEP
from components.preprocess.output import read_graph_schema
from components.runtime.runlog import rate, timed
from components.runtime.threads import use_worker_threads
from components.schema import GraphSchema
from components.serialize.output import METADATA_FILE, STEP, read_graph_metadata
from components.serialize.records import log_clipped
from components.serialize.shards import TypeShards, iter_part_batches, plan_shards, write_shards

__all__ = ["STEP", "read_graph_metadata", "serialize"]

log = logging.getLogger("gnnflow.serialize")


def serialize(
    config: GnnflowConfig | None, preprocessed_uri: storage.Uri | str, output: storage.Uri | str, image: str | None = None
) -> storage.PublishedOutput:
    """Runs the step over a published preprocess output; returns the published TFRecords.
    With ``preprocess.engine: beam`` the shards are written by Beam workers in parallel."""
    options = config.serialize if config else SerializeSpec()
    preprocessed = storage.open_published(preprocessed_uri, step=PREPROCESS_STEP)
    schema = read_graph_schema(preprocessed)
    output = storage.parse_uri(output)
    engine = config.preprocess.engine if config else "local"
    log.info("serialize: %s → %s (engine %s)", preprocessed.root, output, engine)
    use_worker_threads(config.resources.threads if config else ThreadsSpec(), 1, 0, "compute")
    plans = plan_shards(schema, options)
    with timed() as elapsed, storage.staged_output(output, STEP) as staging:
        if engine == "beam":
            from components.serialize.beam_engine import write_with_beam

            assert config is not None
            written = write_with_beam(config, preprocessed, plans, staging, image)
        else:
            written = {}
            for folder, plan in plans.items():
                paths, counts, clipped = write_shards(staging, plan, iter_part_batches(preprocessed, plan.parts))
                log_clipped(clipped, f"serialize: {folder} ({len(paths)} shard(s))")
                written[folder] = (paths, counts)
            for node in schema.node_types.values():
                for rel in node.id_map_files:
                    storage.copy_file(preprocessed.uri(rel), staging.uri(rel))
        for node in schema.node_types.values():
            staging.add_entries({rel: preprocessed.manifest.files[rel] for rel in node.id_map_files})
        published = _publish(staging, config, preprocessed, schema, plans, written)
    total = sum(published.manifest.counts.values())
    log.info("serialize: published %s: %d records, %s", output, total, rate(total, elapsed[0]))
    return published


def _publish(
    staging: storage.OutputStaging,
    config: GnnflowConfig | None,
    preprocessed: storage.PublishedOutput,
    schema: GraphSchema,
    plans: dict[str, TypeShards],
    written: dict[str, tuple[list[str], list[int]]],
) -> storage.PublishedOutput:
    record_format: dict[str, dict] = {"node_types": {}, "edge_types": {}}
    node_types, edge_types = {}, {}
    for name, node in schema.node_types.items():
        shards, rows = written[f"nodes/{name}"]
        node_types[name] = dataclasses.replace(node, files=shards, file_rows=rows, id_map_files=list(node.id_map_files))
        record_format["node_types"][name] = plans[f"nodes/{name}"].record_format
        log.info("nodes[%s]: %d records in %d shard(s)", name, node.count, len(shards))
    for name, edge in schema.edge_types.items():
        shards, rows = written[f"edges/{name}"]
        edge_types[name] = dataclasses.replace(edge, files=shards, file_rows=rows)
        record_format["edge_types"][name] = plans[f"edges/{name}"].record_format
        log.info("edges[%s]: %d records in %d shard(s)", name, edge.count, len(shards))
    metadata = GraphSchema(schema.task_type, schema.target, node_types, edge_types, record_format)
    staging.write_bytes(METADATA_FILE, metadata.to_json().encode())
    if config is not None:
        staging.write_bytes("config.resolved.yaml", config.to_yaml().encode())
    counts = {f"nodes.{k}": v.count for k, v in node_types.items()} | {f"edges.{k}": v.count for k, v in edge_types.items()}
    return staging.publish(
        counts=counts, metadata={"source": str(preprocessed.root), "source_generation": preprocessed.manifest.generation}
    )
