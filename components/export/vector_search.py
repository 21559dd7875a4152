"""Embeddings in Vertex AI Vector Search's batch input format.

JSON lines, one object per node: ``{"id": <original id>, "embedding": [...], "restricts":
[{"namespace": "node_type", "allow": [<type>]}, {"namespace": "class", "allow": [<class>]}]}``
(the class restrict only where infer predicted one). Vector Search reads every ``.json`` file
directly under one folder, at most 5,000 of them, uncompressed, with no other subfolders.
Embeddings are written as the float32 values infer stored (each exact as a JSON number).
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from components import storage
from components.errors import GnnflowError
from components.export.inputs import InferResults
from components.export.output import VECTOR_SEARCH_FOLDER

log = logging.getLogger("gnnflow.export")

MAX_FILES = 5_000  # Vector Search's limit per folder
ROWS_PER_FILE = 50_000  # ~75 MB of 64-float JSON per file: held in memory once while written


@dataclass(frozen=True)
class VectorSearchFiles:
    """What was written: files (relative paths), rows, and the embedding size."""

    files: tuple[str, ...]
    rows: int
    dimensions: int


def rows_per_file(total: int, preferred: int = ROWS_PER_FILE) -> int:
    """Rows per file so that ``total`` rows fit in MAX_FILES files."""
    return max(preferred, math.ceil(total / MAX_FILES), 1)


def _lines(results: InferResults, node_type: str, path: str, dimensions: list[int]) -> Iterator[str]:
    """(JSON line) per row of one shard; ``dimensions`` holds the size fixed by the first row seen."""
    uri = results.output.uri(path)
    table = pq.read_table(io.BytesIO(results.output.read_bytes(path)))
    ids = table.column("node_id").to_pylist()
    column = table.column("embedding").combine_chunks()
    lengths = np.diff(column.offsets.to_numpy())
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    classes = table.column("prediction").to_pylist() if "prediction" in table.column_names else [None] * len(ids)
    start = 0
    for node_id, length, label in zip(ids, lengths.tolist(), classes, strict=True):
        vector = values[start : start + length]
        start += length
        if not dimensions:
            dimensions.append(length)
        if length != dimensions[0]:
            raise GnnflowError(f"{uri}: node {node_id!r} has an embedding of {length} values, the others {dimensions[0]}")
        if node_id is None:
            raise GnnflowError(f"{uri}: a row has no node_id")
        if not np.isfinite(vector).all():
            raise GnnflowError(f"{uri}: node {node_id!r} has a NaN or infinite embedding value, which Vector Search refuses")
        restricts = [{"namespace": "node_type", "allow": [node_type]}]
        if label is not None:
            restricts.append({"namespace": "class", "allow": [str(label)]})
        yield json.dumps({"id": str(node_id), "embedding": vector.tolist(), "restricts": restricts}, separators=(",", ":"))


def write_vector_search(staging: storage.OutputStaging, results: InferResults, preferred_rows: int = ROWS_PER_FILE) -> VectorSearchFiles:
    """Every node type's embeddings as JSON line files under ``vector_search/`` of ``staging``."""
    total = sum(files.rows for files in results.embeddings.values())
    per_file = rows_per_file(total, preferred_rows)
    written: list[str] = []
    dimensions: list[int] = []
    pending: list[str] = []

    def flush() -> None:
        path = f"{VECTOR_SEARCH_FOLDER}/embeddings-{len(written):05d}.json"
        staging.write_bytes(path, ("\n".join(pending) + "\n").encode())
        written.append(path)
        pending.clear()

    for node_type, files in results.embeddings.items():
        for path in files.paths:
            for line in _lines(results, node_type, path, dimensions):
                pending.append(line)
                if len(pending) == per_file:
                    flush()
    if pending:
        flush()
    if not written:
        raise GnnflowError(f"{results.output.root} holds no embeddings to export (every shard is empty)")
    log.info("export: %d embeddings of %d dimensions in %d Vector Search file(s)", total, dimensions[0], len(written))
    return VectorSearchFiles(tuple(written), total, dimensions[0])
