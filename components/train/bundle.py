"""What makes a published model self-contained: an inference-only run on fresh tables needs,
besides the weights, the transforms the training data was encoded with, its schema, and which
node each learnt-embedding row belongs to.

- The preprocess output a model was trained from is found through the manifests' lineage:
  partitions → (``source``, ``source_generation``) → TFRecords → (``source``,
  ``source_generation``) → preprocess output. Its ``transform_state.json`` and
  ``graph_schema.json`` are copied, byte for byte, into the model (read before any worker starts,
  so an unreachable lineage fails the step at once, naming the URI it could not open).
- Each rank writes ``learnt_embeddings/<type>/ids-<rank>.parquet`` for its partition's nodes of
  each featureless type: ``node_id`` (the model run's id, the row's index) and ``original_id``
  (the user's id), whichever way the rows themselves are stored (sharded or in ``model.pt``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components import storage
from components.config import ModelSpec
from components.errors import GnnflowError
from components.partition import output as partition_output
from components.preprocess.output import SCHEMA_FILE as PREPROCESS_SCHEMA_FILE
from components.preprocess.output import STATE_FILE as PREPROCESS_STATE_FILE
from components.preprocess.output import STEP as PREPROCESS_STEP
from components.schema import GraphSchema
from components.serialize import output as serialize_output
from components.serialize.output import STEP as SERIALIZE_STEP
from components.storage.publish import MANIFEST_NAME
from components.train.output import GRAPH_SCHEMA_FILE, LEARNT_IDS_FILE, TRANSFORM_STATE_FILE


@dataclass(frozen=True)
class TrainedFrom:
    """The data a model is trained on: the partitions' generation and the preprocess run's files."""

    partitions_generation: str
    preprocessed: str  # the preprocess output's root
    files: dict[str, bytes]  # the model's file name → the preprocess output's bytes


def _follow(
    published: storage.PublishedOutput, source: str | None, generation: str | None, what: str, step: str
) -> storage.PublishedOutput:
    """The output ``published`` names as its source, checked to be the generation it was made from."""
    manifest = published.root.join(MANIFEST_NAME)
    if source is None:
        raise GnnflowError(
            f"{manifest} names no {what} it was made from: a model carries its preprocess run's transforms and schema, "
            "so train needs partitions made by preprocess, serialize and partition"
        )
    try:
        upstream = storage.open_published(source, step=step)
    except GnnflowError as exc:
        raise GnnflowError(f"cannot open {source}, the {what} {published.root} was made from: {exc}") from None
    if generation is not None and upstream.manifest.generation != generation:
        raise GnnflowError(
            f"{source} was published again (generation {upstream.manifest.generation}) after {published.root} was made from "
            f"its generation {generation}: its transforms may not be those of the data; re-run the steps after it"
        )
    return upstream


def trace_lineage(partitions: storage.PublishedOutput) -> TrainedFrom:
    """The preprocess run behind ``partitions`` and the files a model copies from it; an error
    naming the first output of the chain that cannot be opened."""
    serialized = _follow(partitions, *partition_output.source_of(partitions), "serialize output", SERIALIZE_STEP)
    preprocessed = _follow(serialized, *serialize_output.source_of(serialized), "preprocess output", PREPROCESS_STEP)
    files = {}
    for name, theirs in ((TRANSFORM_STATE_FILE, PREPROCESS_STATE_FILE), (GRAPH_SCHEMA_FILE, PREPROCESS_SCHEMA_FILE)):
        if theirs not in preprocessed.manifest.files:
            raise GnnflowError(f"{preprocessed.root} holds no {theirs} (an older gnnflow wrote it): re-run preprocess")
        files[name] = preprocessed.read_bytes(theirs)
    return TrainedFrom(partitions.manifest.generation, str(preprocessed.root), files)


def stage_lineage(staging: storage.OutputStaging, trained_from: TrainedFrom) -> None:
    for name, data in trained_from.files.items():
        staging.write_bytes(name, data)


def ids_table(node_ids: np.ndarray, original_ids: np.ndarray) -> pa.Table:
    return pa.table({"node_id": pa.array(node_ids, pa.int64()), "original_id": pa.array(original_ids, pa.string())})


def stage_learnt_ids(
    partitions: storage.PublishedOutput, index: int, node_types: list[str], output: storage.Uri, generation: str, step: str
) -> dict[str, storage.FileEntry]:
    """Writes partition ``index``'s id map of each of ``node_types`` into the staged generation;
    returns the entries for the manifest."""
    staging = storage.OutputStaging(output, step, generation=generation)
    metadata = partition_output.read_metadata(partitions)
    for node_type in node_types:
        originals = partition_output.read_original_ids(partitions, index, node_type)
        first, count = partition_output.range_offset(metadata.node_counts[node_type], index), metadata.node_counts[node_type][index]
        if len(originals) != count:
            raise GnnflowError(f"{partitions.root}: partition {index} holds {len(originals)} original ids of {node_type!r}, {count} nodes")
        buffer = io.BytesIO()
        pq.write_table(ids_table(np.arange(first, first + count, dtype=np.int64), originals), buffer, compression="zstd")
        staging.write_bytes(LEARNT_IDS_FILE.format(node_type=node_type, rank=index), buffer.getvalue())
    return staging.entries


def model_spec(schema: GraphSchema, edge_dir: str, model: ModelSpec) -> dict:
    """model_spec.json: what rebuilding the model needs besides the graph's schema."""
    return {
        "task_type": schema.task_type,
        "target": schema.target,
        "heterogeneous": schema.is_heterogeneous,
        "edge_dir": edge_dir,
        "model": model.model_dump(mode="json"),
    }
