"""Edge tables: map endpoint ids to node ids, transform edge features, split, and write."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from components.config import EdgeTableSpec, PreprocessSpec, SplitSpec
from components.errors import GnnflowError
from components.feature_storage.quantization import storage_fields
from components.preprocess.nodes import (
    TableSource,
    check_reused_columns,
    count_splits,
    empty_table_error,
    open_bigquery_table,
    open_table,
)
from components.preprocess.parts import PartWriter
from components.runtime.runlog import progress, rate, timed
from components.schema import SPLIT_CODES, EdgeTypeSchema
from components.tables import reading as tables
from components.tables.transforms import FittedFeatures, PerFileFitters, encode_features, encode_splits, feature_ranges
from components.warehouse.table_ref import is_bigquery_uri

log = logging.getLogger("gnnflow.preprocess")


def map_endpoints(values: pa.ChunkedArray, ids: pd.Index) -> np.ndarray:
    """Node ids (rows,) int64 of endpoint ids; -1 where the id is not in the node table."""
    return ids.get_indexer(values.to_numpy(zero_copy_only=False)).astype(np.int64)


def open_edge_table(spec: EdgeTableSpec) -> tuple[TableSource, list[list[str]]]:
    """The edge table's files with the endpoint and split columns and its feature groups."""
    if is_bigquery_uri(spec.uri):
        return open_bigquery_table(spec, (spec.src_column, spec.dst_column))
    base = [spec.src_column, spec.dst_column, *([spec.split_column] if spec.split_column else [])]
    return open_table(spec.uri, spec.format, base, spec.features)


def fit_edge_features(spec: EdgeTableSpec, options: PreprocessSpec, source: TableSource, groups: list[list[str]]) -> list[FittedFeatures]:
    """Pass 1 over an edge table with feature groups: their statistics (no features: none)."""
    if not spec.features:
        return []
    fitters = PerFileFitters(spec.features, groups)
    for chunk in source.chunks(options):
        fitters.update(chunk)
    return fitters.finish()


@dataclass(frozen=True)
class EdgeChunk:
    """One chunk of an edge table, resolved and transformed."""

    table: pa.Table  # src, dst, [features], split: the kept edges
    split_codes: np.ndarray  # (kept,) int8
    dropped: int  # edges with an endpoint missing from its node table


def encode_edge_chunk(
    spec: EdgeTableSpec,
    features: list[FittedFeatures],
    split: SplitSpec | None,
    chunk: tables.TableChunk,
    src: np.ndarray,
    dst: np.ndarray,
    first_edge_row: int,
) -> EdgeChunk:
    """Transforms one chunk whose endpoints are already node ids (-1: unknown); ``first_edge_row``
    is the chunk's first row counted over the whole table (it seeds the random split)."""
    t = chunk.table
    known = (src >= 0) & (dst >= 0)
    if not known.all() and spec.on_unknown_endpoint == "error":
        row = int(np.flatnonzero(~known)[0])
        column, node_type = (spec.src_column, spec.src_type) if src[row] < 0 else (spec.dst_column, spec.dst_type)
        value = t.column(column)[row].as_py()
        raise GnnflowError(
            f"{chunk.row(row)}, column '{column}': node id {value!r} is not in "
            f"node table '{node_type}' ({int((~known).sum())} such edges in this chunk; "
            "set on_unknown_endpoint: drop to skip them)"
        )
    x = encode_features(t, features, chunk.row)
    if split is not None:
        edge_rows = np.arange(first_edge_row, first_edge_row + t.num_rows, dtype=np.int64)
        codes = encode_splits(
            edge_rows,
            split,
            t.column(spec.split_column) if spec.split_column else None,
            None,
            (chunk.row, spec.split_column or ""),
        )
    else:
        codes = np.full(t.num_rows, -1, dtype=np.int8)
    keep = np.flatnonzero(known)
    columns: dict[str, pa.Array] = {"src": pa.array(src[keep]), "dst": pa.array(dst[keep])}
    if x.shape[1]:
        columns["features"] = pa.FixedSizeListArray.from_arrays(pa.array(x[keep].ravel()), x.shape[1])
    columns["split"] = pa.array(codes[keep])
    return EdgeChunk(pa.table(columns), codes[keep], int(len(known) - len(keep)))


def edge_type_schema(
    spec: EdgeTableSpec,
    features: list[FittedFeatures],
    count: int,
    split_sizes: dict[str, int] | None,
    files: list[str],
    file_rows: list[int],
    dropped: int,
) -> EdgeTypeSchema:
    names = [n for f in features for n in f.output_names]
    stored = storage_fields(spec.feature_storage, feature_ranges(features), len(names), f"graph.edges[{spec.name!r}].feature_storage")
    return EdgeTypeSchema(
        src_type=spec.src_type,
        relation=spec.type,
        dst_type=spec.dst_type,
        count=count,
        feature_names=names,
        undirected=spec.undirected and spec.role == "message",  # a label is one (anchor, candidate) pair
        split_sizes=split_sizes or {},
        files=files,
        dropped_unknown_endpoints=dropped,
        file_rows=file_rows,
        role=spec.role,
        **stored,
    )


def write_edges(
    spec: EdgeTableSpec,
    options: PreprocessSpec,
    src_ids: pd.Index,
    dst_ids: pd.Index,
    split: SplitSpec | None,
    reused: dict | None,
    writer: PartWriter,
) -> tuple[EdgeTypeSchema, list[FittedFeatures]]:
    """Writes one edge type; ``split`` is set when it is the link-prediction target.

    Edges whose endpoint is missing from the node table stop the step with the file and row,
    or, with ``on_unknown_endpoint: drop``, are dropped and counted.
    """
    source, groups = open_edge_table(spec)
    if reused is not None:
        features = [FittedFeatures.from_dict(f) for f in reused["features"]]
        check_reused_columns(f"edge table {spec.name!r} ({spec.uri})", features, groups)
    else:
        features = fit_edge_features(spec, options, source, groups)

    split_sizes = dict.fromkeys(SPLIT_CODES, 0)
    file_rows: list[int] = []
    kept = dropped = rows = 0
    with timed() as elapsed, progress(f"write edges[{spec.name}]") as bar:
        for chunk in source.chunks(options):
            t = chunk.table
            src = map_endpoints(t.column(spec.src_column), src_ids)
            dst = map_endpoints(t.column(spec.dst_column), dst_ids)
            encoded = encode_edge_chunk(spec, features, split, chunk, src, dst, rows)
            count_splits(encoded.split_codes, split_sizes)
            writer.write(f"edges/{spec.name}", encoded.table)
            file_rows.append(encoded.table.num_rows)
            rows += t.num_rows
            kept += encoded.table.num_rows
            dropped += encoded.dropped
            bar.update(t.num_rows)
    if rows == 0:
        raise empty_table_error("edge", spec.uri)
    if dropped:
        log.warning("edges[%s]: dropped %d of %d edges whose endpoint is not in the node table", spec.name, dropped, rows)
    log.info("edges[%s]: wrote %d edges (%s)", spec.name, kept, rate(rows, elapsed[0]))
    schema = edge_type_schema(
        spec, features, kept, split_sizes if split is not None else None, writer.files(f"edges/{spec.name}"), file_rows, dropped
    )
    return schema, features
