"""Rows per table and feature widths per type, read fast from the tables a config names.

For sizing (``gnnflow plan`` and the checks before a run), not for preprocessing: Parquet files
give their row count in their footer; a CSV file's rows are its newlines less the header
(streamed, gunzipped on the way; a quoted field with a newline in it counts twice); a BigQuery
table's from its metadata (``tables.get``: ``numRows`` plus the streaming buffer's estimate; with
a ``row_filter`` that is an upper bound). A CSV file larger than ``exact_up_to`` bytes is
estimated from its first ``SAMPLE_BYTES`` instead (rows per stored byte, times its size).

Feature widths follow the transforms (:mod:`.transforms`): a numeric group is one value per
column, hashing ``num_buckets`` per column, one-hot one per category kept plus the 'other' slot.
Without the fitted vocabulary a one-hot column of a file is counted from the distinct values in
its first ``SAMPLE_ROWS`` rows (a category first seen further down is missed), at most
``max_categories``, plus the 'other' slot; a BigQuery column at its upper bound
``max_categories + 1`` (give ``--preprocessed`` for the fitted widths).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import BinaryIO

from components import storage
from components.config import EdgeTableSpec, GnnflowConfig, NodeTableSpec
from components.errors import GnnflowError
from components.graph_size import STORAGE_BYTES, EdgeSize, GraphSize, NodeSize
from components.tables import reading
from components.tables.transforms import NUMERIC_TRANSFORMS, expand_columns
from components.warehouse.table_ref import is_bigquery_uri, parse_table_uri

CHUNK_BYTES = 8 << 20
SAMPLE_BYTES = 16 << 20  # stored bytes read from a CSV file counted by estimate
SAMPLE_ROWS = 1000  # rows whose distinct values stand for a one-hot column's categories


@dataclass(frozen=True)
class TableCount:
    rows: int
    estimated: bool = False


class _CountingReader:
    """Counts the stored bytes read from a stream (what a gzip sample cost of the file)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.consumed = raw, 0

    def read(self, n: int) -> bytes:
        data = self.raw.read(n)
        self.consumed += len(data)
        return data


def _csv_rows(uri: storage.Uri, limit: int | None) -> tuple[int, int]:
    """(data rows, stored bytes read) of one CSV file, reading at most ``limit`` stored bytes."""
    raw = _CountingReader(storage.open_read(uri))
    gunzip = zlib.decompressobj(wbits=31) if uri.name.lower().endswith(".gz") else None
    newlines, last, seen = 0, b"\n", False
    try:
        while limit is None or raw.consumed < limit:
            block = raw.read(CHUNK_BYTES)
            if not block:
                break
            if gunzip is not None:
                block = gunzip.decompress(block)
                while gunzip.eof and gunzip.unused_data:  # a concatenated (multi-member) gzip file
                    rest = gunzip.unused_data
                    gunzip = zlib.decompressobj(wbits=31)
                    block += gunzip.decompress(rest)
            if block:
                newlines += block.count(b"\n")
                last, seen = block[-1:], True
    except zlib.error as exc:
        raise GnnflowError(f"cannot read {uri}: not a valid gzip file ({exc})") from None
    finally:
        raw.raw.close()
    if not seen:
        raise GnnflowError(f"table {uri} is empty: no header row")
    lines = newlines + (0 if last == b"\n" else 1)  # a last line without its newline
    return max(lines - 1, 0), raw.consumed


def count_file(uri: storage.Uri, fmt: reading.TableFormat, exact_up_to: int | None = None) -> TableCount:
    """Data rows of one table file (see the module docstring)."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        with storage.open_read(uri) as f:
            try:
                return TableCount(pq.ParquetFile(f).metadata.num_rows)
            except (pa.ArrowException, OSError) as exc:
                raise GnnflowError(f"{uri} is not a readable Parquet file: {exc}") from None
    size = storage.size(uri)
    if exact_up_to is None or size <= exact_up_to:
        return TableCount(_csv_rows(uri, None)[0])
    rows, consumed = _csv_rows(uri, SAMPLE_BYTES)
    return TableCount(round(rows * size / max(consumed, 1)), estimated=True)


def count_table(spec: NodeTableSpec | EdgeTableSpec, exact_up_to: int | None = None) -> TableCount:
    """Rows of one configured table: every file under its URI, or its BigQuery metadata."""
    if is_bigquery_uri(spec.uri):
        from components.warehouse.reading import table_metadata  # the BigQuery client loads only when needed

        meta = table_metadata(parse_table_uri(spec.uri))
        buffered = meta.streaming_buffer.estimated_rows if meta.streaming_buffer is not None else 0
        return TableCount(int(meta.num_rows or 0) + int(buffered or 0), estimated=spec.row_filter is not None or bool(buffered))
    files = storage.expand_files(spec.uri)
    rows, estimated = 0, False
    for uri in files:
        counted = count_file(uri, reading.file_format(uri, spec.format), exact_up_to)
        rows, estimated = rows + counted.rows, estimated or counted.estimated
    return TableCount(rows, estimated)


def table_header(spec: NodeTableSpec | EdgeTableSpec) -> tuple[str, list[str]]:
    """(where, column names) of a configured table: its first file's header, or its BigQuery schema."""
    if is_bigquery_uri(spec.uri):
        from components.warehouse.reading import table_metadata

        return spec.uri, [field.name for field in table_metadata(parse_table_uri(spec.uri)).schema]
    first = storage.expand_files(spec.uri)[0]
    return str(first), reading.read_header(first, reading.file_format(first, spec.format))


def feature_width(table: NodeTableSpec | EdgeTableSpec) -> tuple[int, bool]:
    """(values per row, whether estimated) of a table's feature groups."""
    if not table.features:
        return 0, False
    source, header = table_header(table)
    width, estimated, sample = 0, False, None
    for spec in table.features:
        columns = expand_columns(spec.columns, header, source)
        if spec.transform in NUMERIC_TRANSFORMS:
            width += len(columns)
        elif spec.transform == "hashing":
            width += len(columns) * spec.num_buckets
        else:
            if sample is None and not is_bigquery_uri(table.uri):
                first = storage.expand_files(table.uri)[0]
                sample = reading.read_sample(first, reading.file_format(first, table.format), SAMPLE_ROWS)
            for column in columns:
                seen = len(sample.column(column).drop_null().unique()) if sample is not None else spec.max_categories
                width += min(seen, spec.max_categories) + 1
            estimated = True
    return width, estimated


def storage_bytes(spec: NodeTableSpec | EdgeTableSpec) -> int:
    """Bytes per stored feature value: ``feature_storage`` where the config has it, else float32."""
    return STORAGE_BYTES[str(getattr(spec, "feature_storage", "float32"))]


def storage_by_type(config: GnnflowConfig) -> dict[str, int]:
    """Bytes per stored feature value of every node type and edge type (by name)."""
    return {**{n.type: storage_bytes(n) for n in config.graph.nodes}, **{e.name: storage_bytes(e) for e in config.graph.edges}}


def graph_size_from_tables(config: GnnflowConfig, exact_up_to: int | None = None) -> GraphSize:
    """The graph's size as the configured tables give it, before preprocessing."""
    estimated = False
    nodes = []
    for n in config.graph.nodes:
        count = count_table(n, exact_up_to)
        width, guessed = feature_width(n)
        estimated = estimated or count.estimated or guessed
        nodes.append(NodeSize(n.type, count.rows, width, storage_bytes(n), n.label_column is not None))
    edges = []
    for e in config.graph.edges:
        count = count_table(e, exact_up_to)
        width, guessed = feature_width(e)
        estimated = estimated or count.estimated or guessed
        undirected = e.undirected and e.role == "message"
        edges.append(EdgeSize(e.src_type, e.type, e.dst_type, count.rows, undirected, width, storage_bytes(e), e.role))
    seeds, seeds_estimated = _train_seeds(config, nodes, edges)
    return GraphSize(tuple(nodes), tuple(edges), train_seeds=seeds, estimated=estimated or seeds_estimated)


def _train_seeds(config: GnnflowConfig, nodes: list[NodeSize], edges: list[EdgeSize]) -> tuple[int, bool]:
    """(training rows of the target, whether estimated): a Parquet table's split column is
    counted (one column read); a CSV or BigQuery one's share is known only after preprocessing,
    so its rows times the random split's train fraction stand in."""
    target = config.task_target
    table: NodeTableSpec | EdgeTableSpec | None
    if config.task.type == "node_classification":
        rows = next(n.rows for n in nodes if n.name == target)
        table = next((n for n in config.graph.nodes if n.type == target), None)
    else:
        rows = next((e.rows for e in edges if e.relation == target or e.name == target), 0)
        table = next((e for e in config.graph.edges if e.type == target or e.name == target), None)
    if table is None or not table.split_column:
        return round(rows * config.task.split.train), False
    counted = split_rows(table, config.task.split.train_value)
    return (round(rows * config.task.split.train), True) if counted is None else (counted, False)


def split_rows(spec: NodeTableSpec | EdgeTableSpec, value: str) -> int | None:
    """Rows of ``spec``'s tables whose split column holds ``value``, read from the Parquet files'
    one column in batches; None where the tables are CSV or BigQuery (a full scan to count)."""
    if is_bigquery_uri(spec.uri):
        return None
    files = storage.expand_files(spec.uri)
    if any(reading.file_format(uri, spec.format) != "parquet" for uri in files):
        return None
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    column, total = str(spec.split_column), 0
    for uri in files:
        with storage.open_read(uri) as f:
            parquet = pq.ParquetFile(f)
            if column not in parquet.schema_arrow.names:
                raise GnnflowError(f"{uri} has no column {column!r} (the split_column of its table)")
            for batch in parquet.iter_batches(columns=[column], batch_size=1 << 20):
                total += int(pc.sum(pc.equal(batch.column(0).cast(pa.string()), value)).as_py() or 0)
    return total
