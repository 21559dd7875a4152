"""Node tables: fit (ids, feature statistics, label vocabulary), then transform and write.

Pass 1 reads the id, label and feature columns to enumerate ids and fit statistics; pass 2
reads them again and writes transformed Parquet parts, so memory stays bounded by one chunk
plus the id map.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from components import storage
from components.config import EdgeTableSpec, FeatureSpec, NodeTableSpec, PreprocessSpec, SplitSpec
from components.errors import GnnflowError
from components.feature_storage.quantization import storage_fields
from components.preprocess.parts import PartWriter
from components.runtime.runlog import progress, rate, timed
from components.schema import NO_LABEL, SPLIT_CODES, NodeTypeSchema
from components.tables import reading as tables
from components.tables.bigquery_tables import base_uses, bigquery_chunks, check_table_columns, start_table_read
from components.tables.transforms import (
    FittedFeatures,
    PerFileFitters,
    column_type,
    count_unseen_categories,
    encode_features,
    encode_labels,
    encode_splits,
    expand_columns,
    feature_ranges,
    fit_label_vocabulary,
    label_values,
)
from components.warehouse.table_ref import BigQueryTable, is_bigquery_uri

if TYPE_CHECKING:
    from components.warehouse.reading import ReadSession

log = logging.getLogger("gnnflow.preprocess")


@dataclass(frozen=True)
class TableSource:
    """The files (or the BigQuery read session) of one table and the typed columns read from them."""

    uri: str
    files: list[storage.Uri]  # none for a BigQuery table
    fmt: tables.TableFormat | None  # None: a BigQuery table
    column_types: dict[str, pa.DataType]
    # A bq:// table: the one read session every pass reads, so each sees the same rows in the same order.
    bigquery: ReadSession | None = None
    key_columns: tuple[str, ...] = ()  # BigQuery: the columns that name a row in errors
    integer_ids: bool = False  # BigQuery: the id column is INT64, so ids are ordered as numbers (as BigQuery orders them)

    @property
    def description(self) -> str:
        """For logs: ``N file(s)`` or the ``bq://`` table."""
        return self.uri if self.bigquery is not None else f"{len(self.files)} file(s)"

    def chunks(self, options: PreprocessSpec, file: int | None = None) -> Iterator[tables.TableChunk]:
        """The table's chunks in order; only those of ``files[file]`` when ``file`` is given."""
        if self.bigquery is not None:
            return bigquery_chunks(self.bigquery, self.column_types, self.key_columns, options.parquet_batch_rows)
        assert self.fmt is not None
        return tables.iter_chunks(
            self.files if file is None else [self.files[file]],
            self.column_types,
            self.fmt,
            block_bytes=options.csv_block_bytes,
            batch_rows=options.parquet_batch_rows,
        )


def open_table(uri: str, declared_format: str, base_columns: list[str], feature_specs) -> tuple[TableSource, list[list[str]]]:
    """Lists a table's files, checks every header, and expands feature column patterns.

    Returns the source and, per feature group, its concrete columns.
    """
    files = storage.expand_files(uri)
    fmt = tables.file_format(files[0], declared_format)
    headers = {f: tables.read_header(f, tables.file_format(f, fmt)) for f in files}
    first_header = headers[files[0]]
    groups = [expand_columns(spec.columns, first_header, str(files[0])) for spec in feature_specs]
    needed = [*base_columns, *(c for g in groups for c in g)]
    for f, header in headers.items():
        tables.check_columns(f, header, needed)
    return TableSource(uri, files, fmt, _column_types(uri, base_columns, feature_specs, groups)), groups


def _column_types(
    uri: str, base_columns: Sequence[str], feature_specs: Sequence[FeatureSpec], groups: list[list[str]]
) -> dict[str, pa.DataType]:
    """The Arrow type each needed column is read as; a column used twice is an error."""
    column_types: dict[str, pa.DataType] = {c: pa.string() for c in base_columns}
    for spec, group in zip(feature_specs, groups):
        for c in group:
            if c in column_types:
                raise GnnflowError(f"{uri}: column '{c}' is used twice (as an id/label/split or in two feature groups)")
            column_types[c] = column_type(spec)
    return column_types


def open_bigquery_table(spec: NodeTableSpec | EdgeTableSpec, key_columns: tuple[str, ...]) -> tuple[TableSource, list[list[str]]]:
    """Checks a ``bq://`` table's schema against ``spec`` and starts the read session of its
    needed columns and ``row_filter``; rows are named by ``key_columns`` in errors."""
    base = base_uses(spec)
    checked = check_table_columns(spec.uri, base, spec.features)
    column_types = _column_types(spec.uri, list(base), spec.features, checked.groups)
    session = start_table_read(checked.table, list(column_types), spec.row_filter)
    integer_ids = False
    if isinstance(spec, NodeTableSpec):
        from components.tables.bigquery_tables import bigquery_type
        from components.warehouse.reading import table_metadata

        fields = {f.name: f for f in table_metadata(checked.table).schema}
        integer_ids = bigquery_type(fields[spec.id_column]) == "INT64"
    return TableSource(spec.uri, [], None, column_types, session, key_columns, integer_ids), checked.groups


@dataclass(frozen=True)
class NodeFit:
    """What pass 1 learned about one node type."""

    spec: NodeTableSpec
    source: TableSource
    features: list[FittedFeatures]
    label_vocabulary: list[str] | None
    ids: pd.Index  # original ids (as text); a node's int64 id is its position here (a bq:// table's: in value order)
    reused: bool = False  # the transforms came from an earlier run's fitted state


def checked_node_ids(chunk: tables.TableChunk, id_column: str) -> pa.ChunkedArray:
    """The chunk's node ids; an error naming file, row and column at the first empty one."""
    ids = chunk.table.column(id_column)
    if ids.null_count or pc.any(pc.equal(ids, "")).as_py():
        empty = np.flatnonzero(np.asarray([v in (None, "") for v in ids.to_pylist()]))
        if chunk.key_columns:  # BigQuery: the id is the row's only name, so say how to find such rows
            raise GnnflowError(
                f"{chunk.source}, column '{id_column}': NULL or empty node id in {len(empty)} row(s) of this chunk "
                f"(find them with WHERE {id_column} IS NULL OR CAST({id_column} AS STRING) = '')"
            )
        raise GnnflowError(f"{chunk.source}, row {chunk.first_row + empty[0]}, column '{id_column}': empty node id")
    return ids


def duplicate_id_error(value: str, id_column: str, duplicate: str, first: str) -> GnnflowError:
    """The error for a node id seen twice; ``duplicate`` and ``first`` are 'file, row N'."""
    return GnnflowError(f"{duplicate}, column '{id_column}': duplicate node id {value!r} (first seen at {first})")


def empty_table_error(kind: str, uri: str) -> GnnflowError:
    return GnnflowError(f"{kind} table {uri} is empty: it has a header but no rows")


def _row_of(position: int, boundaries: list[tuple[int, storage.Uri | BigQueryTable]]) -> str:
    """'file, row N' for a global row position, given (first position, file) per file."""
    start, uri = max(b for b in boundaries if b[0] <= position)
    return f"{uri}, row {position - start + 1}"


def open_node_table(spec: NodeTableSpec) -> tuple[TableSource, list[list[str]]]:
    """The node table's files with the id, label and split columns and its feature groups."""
    if is_bigquery_uri(spec.uri):
        return open_bigquery_table(spec, (spec.id_column,))
    base = [spec.id_column, *([spec.label_column] if spec.label_column else []), *([spec.split_column] if spec.split_column else [])]
    return open_table(spec.uri, spec.format, base, spec.features)


def fit_nodes(spec: NodeTableSpec, options: PreprocessSpec, reused: dict | None) -> NodeFit:
    """Pass 1 over one node table. ``reused`` holds fitted state from an earlier run to apply as is."""
    source, groups = open_node_table(spec)
    fitters = PerFileFitters(spec.features, groups)
    labels: set[str] = set()
    id_parts: list[pa.ChunkedArray] = []
    boundaries: list[tuple[int, storage.Uri | BigQueryTable]] = []
    rows = 0
    with timed() as elapsed, progress(f"fit nodes[{spec.type}]") as bar:
        for chunk in source.chunks(options):
            if chunk.first_row == 1:
                boundaries.append((rows, chunk.source))
            ids = checked_node_ids(chunk, spec.id_column)
            id_parts.append(ids)
            if reused is None:
                fitters.update(chunk)
            if spec.label_column:
                labels |= label_values(chunk.table, spec.label_column)
            rows += chunk.table.num_rows
            bar.update(chunk.table.num_rows)
    if rows == 0:
        raise empty_table_error("node", spec.uri)
    index = pd.Index(pa.chunked_array([c for part in id_parts for c in part.chunks], type=pa.string()).to_numpy(zero_copy_only=False))
    if not index.is_unique:
        dup = int(np.flatnonzero(index.duplicated())[0])
        if source.bigquery is not None:  # its rows have no numbers to point at
            raise GnnflowError(f"{spec.uri}, column '{spec.id_column}': duplicate node id {index[dup]!r} (in at least two rows)")
        first = int(np.flatnonzero(index == index[dup])[0])
        raise duplicate_id_error(index[dup], spec.id_column, _row_of(dup, boundaries), _row_of(first, boundaries))
    if source.bigquery is not None:
        index = in_value_order(index, source.integer_ids)
    if reused is not None:
        features = [FittedFeatures.from_dict(f) for f in reused["features"]]
        check_reused_columns(f"node table {spec.type!r} ({spec.uri})", features, groups)
        vocabulary = reused.get("label_vocabulary")
    else:
        features = fitters.finish()
        vocabulary = fit_label_vocabulary(labels) if spec.label_column else None
    log.info("nodes[%s]: %d rows from %s, %s", spec.type, rows, source.description, rate(rows, elapsed[0]))
    return NodeFit(spec, source, features, vocabulary, index, reused is not None)


def check_reused_columns(table: str, reused: list[FittedFeatures], groups: list[list[str]]) -> None:
    """An error when the feature columns a table is read with are not those an earlier run's
    transforms were fitted on: the model's input layer expects exactly those, in that order."""
    fitted = [list(f.columns) for f in reused]
    if fitted != [list(g) for g in groups]:
        missing = [c for g in fitted for c in g if c not in {c for g in groups for c in g}]
        extra = [c for g in groups for c in g if c not in {c for g in fitted for c in g}]
        detail = f"missing {missing}" if missing else f"not in the model {extra}" if extra else "in another grouping or order"
        raise GnnflowError(
            f"{table}: its feature columns {groups} differ from those the fitted transforms were made for {fitted} ({detail})"
        )


def in_value_order(ids: pd.Index, integers: bool) -> pd.Index:
    """A ``bq://`` table's ids in the order of their values (as numbers for an INT64 column).

    BigQuery promises no row order: it follows the storage layout and the session's streams, and
    may differ between two reads of the same table. Numbering a table's nodes by their ids'
    order instead of the read's makes the numbering a function of the table alone, and the
    Beam engine's (:mod:`components.preprocess.beam_bigquery`, which sorts the rows by value,
    ids first) the same.
    """
    keys = ids.to_numpy().astype(np.int64) if integers else ids.to_numpy()
    return ids[np.argsort(keys, kind="stable")]


@dataclass(frozen=True)
class NodeChunk:
    """One chunk of a node table, transformed: what pass 2 writes for it."""

    nodes: pa.Table  # node_id, [features], [label], split
    id_map: pa.Table  # node_id, original_id
    split_codes: np.ndarray  # (rows,) int8
    labelled_split_codes: np.ndarray  # (labelled rows,) int8: the split codes of the rows with a label


def encode_node_chunk(
    spec: NodeTableSpec,
    features: list[FittedFeatures],
    vocabulary: list[str] | None,
    split: SplitSpec | None,
    chunk: tables.TableChunk,
    first_id: int,
    node_ids: np.ndarray | None = None,
) -> NodeChunk:
    """Transforms one chunk whose first row gets node id ``first_id``, or whose rows get ``node_ids``
    (both engines call this)."""
    n = chunk.table.num_rows
    if node_ids is None:
        node_ids = np.arange(first_id, first_id + n, dtype=np.int64)
    columns: dict[str, pa.Array] = {"node_id": pa.array(node_ids)}
    x = encode_features(chunk.table, features, chunk.row)
    if x.shape[1]:
        columns["features"] = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])
    label = None
    if spec.label_column and vocabulary is not None:
        label = encode_labels(chunk.table, spec.label_column, vocabulary, chunk.row)
        columns["label"] = pa.array(label)
    if split is not None:
        split_column = chunk.table.column(spec.split_column) if spec.split_column else None
        codes = encode_splits(
            node_ids,
            split,
            split_column,
            label != NO_LABEL if label is not None else None,
            (chunk.row, spec.split_column or ""),
        )
    else:
        codes = np.full(n, -1, dtype=np.int8)
    columns["split"] = pa.array(codes)
    id_map = pa.table({"node_id": pa.array(node_ids), "original_id": chunk.table.column(spec.id_column).combine_chunks()})
    labelled = codes[label != NO_LABEL] if label is not None else codes[:0]
    return NodeChunk(pa.table(columns), id_map, codes, labelled)


def count_splits(codes: np.ndarray, sizes: dict[str, int]) -> None:
    """Adds the rows of each split in ``codes`` to ``sizes``."""
    for name, code in SPLIT_CODES.items():
        sizes[name] += int((codes == code).sum())


def unlabelled_error(spec: NodeTableSpec, labelled: dict[str, int]) -> GnnflowError | None:
    """The error for a node-classification target with no labelled training row (None if it has some)."""
    if labelled["train"] > 0:
        return None
    return GnnflowError(
        f"node table {spec.uri}, column '{spec.label_column}': node classification needs labelled training nodes, but the "
        f"labelled rows per split are train {labelled['train']}, val {labelled['val']}, test {labelled['test']} "
        "(are the labels in another column, or the split values different?)"
    )


def node_type_schema(
    spec: NodeTableSpec,
    features: list[FittedFeatures],
    vocabulary: list[str] | None,
    count: int,
    split_sizes: dict[str, int] | None,
    files: list[str],
    id_map_files: list[str],
    file_rows: list[int],
) -> NodeTypeSchema:
    names = [name for f in features for name in f.output_names]
    stored = storage_fields(spec.feature_storage, feature_ranges(features), len(names), f"graph.nodes[{spec.type!r}].feature_storage")
    return NodeTypeSchema(
        name=spec.type,
        count=count,
        feature_names=names,
        label_vocabulary=vocabulary,
        split_sizes=split_sizes or {},
        files=files,
        id_map_files=id_map_files,
        file_rows=file_rows,
        **stored,
    )


def write_nodes(
    fit: NodeFit, options: PreprocessSpec, split: SplitSpec | None, writer: PartWriter, unseen: Counter[str] | None = None
) -> NodeTypeSchema:
    """Pass 2: transformed features, labels and splits, and the id map, as Parquet parts.

    ``split`` is the task's split spec when this is the task's target node type, else None.
    ``unseen`` adds up, per ``<type>.<column>``, the one-hot values outside an earlier run's
    fitted vocabulary (only when the transforms are reused: in a fitting run they were seen).
    """
    spec = fit.spec
    split_sizes = dict.fromkeys(SPLIT_CODES, 0)
    labelled = dict.fromkeys(SPLIT_CODES, 0)
    file_rows: list[int] = []
    next_id = 0
    with timed() as elapsed, progress(f"write nodes[{spec.type}]", total=len(fit.ids)) as bar:
        for chunk in fit.source.chunks(options):
            # A bq:// table's rows arrive in the read's order; each node's id is its id's place in value order.
            by_value = None
            if fit.source.bigquery is not None:
                by_value = fit.ids.get_indexer(chunk.table.column(spec.id_column).to_numpy(zero_copy_only=False)).astype(np.int64)
            encoded = encode_node_chunk(spec, fit.features, fit.label_vocabulary, split, chunk, next_id, by_value)
            count_splits(encoded.split_codes, split_sizes)
            count_splits(encoded.labelled_split_codes, labelled)
            writer.write(f"nodes/{spec.type}", encoded.nodes)
            writer.write(f"id_maps/{spec.type}", encoded.id_map)
            if fit.reused and unseen is not None:  # a fitting run saw every value: only reused transforms meet new ones
                unseen.update({f"{spec.type}.{column}": n for column, n in count_unseen_categories(chunk.table, fit.features).items()})
            file_rows.append(chunk.table.num_rows)
            next_id += chunk.table.num_rows
            bar.update(chunk.table.num_rows)
    # Data run through an earlier run's fitted state may be for inference only: no training rows needed.
    if split is not None and not fit.reused and (error := unlabelled_error(spec, labelled)):
        raise error
    schema = node_type_schema(
        spec,
        fit.features,
        fit.label_vocabulary,
        next_id,
        split_sizes if split is not None else None,
        writer.files(f"nodes/{spec.type}"),
        writer.files(f"id_maps/{spec.type}"),
        file_rows,
    )
    log.info(
        "nodes[%s]: wrote %d nodes, %d features, %s classes, splits %s (%s)",
        spec.type,
        next_id,
        len(schema.feature_names),
        len(fit.label_vocabulary or []) or "no",
        split_sizes,
        rate(next_id, elapsed[0]),
    )
    return schema
