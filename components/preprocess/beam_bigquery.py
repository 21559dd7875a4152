"""``bq://`` tables in the Beam engine: ``ReadFromBigQuery`` rows as blocks of numbered rows.

A file is a block whose rows have an order; rows read from BigQuery have none: BigQuery
promises no order, and a PCollection keeps none. So the Beam engine orders a table's rows
itself, by their values (the configured columns in the config's order: the id or the
endpoints first, NULL before NaN before any value), and numbers them in that order. The sort
is spread over workers: rows are range-partitioned on approximate quantiles of that order,
each range sorted on its own, and the ranges counted to place them; rows then go to the block
of ``parquet_batch_rows`` rows their number falls in. Each block is one chunk of the table,
cast to the same Arrow types the one-process engine reads. Both engines number a node table's
nodes in this order (ids first, unique: the one-process engine sorts the ids it read,
:func:`components.preprocess.nodes.in_value_order`), so node ids are the same in both and on
every read; the one-process engine writes the rows in its read's order, so the parts hold the
same rows in the same order (byte for byte) only when that read follows this order.

``row_filter`` becomes the read's row restriction; only the configured columns are selected.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from components.errors import GnnflowError
from components.preprocess.beam_transforms import Block, Plan, RowBlock
from components.tables.reading import TableChunk
from components.warehouse.table_ref import BigQueryTable

# Arrow types for the BigQuery types whose Python values Arrow would not type as the
# Storage Read API does (its NUMERIC is decimal128(38, 9), BIGNUMERIC decimal256(76, 38)).
_SOURCE_TYPES = {"NUMERIC": pa.decimal128(38, 9), "BIGNUMERIC": pa.decimal256(76, 38)}

Row = tuple[Any, ...]


@dataclass(frozen=True)
class BigQueryRead:
    """One ``bq://`` table of the plan, as the read and the blocks need it."""

    kind: str  # "node" or "edge"
    table: int  # index in config.graph.nodes / .edges
    ref: BigQueryTable
    column_types: dict[str, pa.DataType]  # the configured columns, in order, with the types read
    source_types: dict[str, pa.DataType | None]  # per column: how to type its Python values (None: infer)
    key_columns: tuple[str, ...]  # name a row in errors
    row_filter: str | None
    block_rows: int
    ranges: int  # sort ranges (each sorted by one worker)

    def label(self, what: str) -> str:
        return f"{self.kind} table {self.table} ({self.ref}): {what}"


def bigquery_reads(plan: Plan) -> list[BigQueryRead]:
    """The plan's ``bq://`` tables (their schemas were checked when the plan opened them)."""
    from components.tables.bigquery_tables import bigquery_type
    from components.warehouse.reading import table_metadata

    reads = []
    for kind, tables in (("node", plan.nodes), ("edge", plan.edges)):
        for t, table in enumerate(tables):
            session = table.source.bigquery
            if session is None:
                continue
            fields = {f.name: bigquery_type(f) for f in table_metadata(session.table).schema}
            source_types = {c: _SOURCE_TYPES.get(fields.get(c, "")) for c in table.source.column_types}
            reads.append(
                BigQueryRead(
                    kind,
                    t,
                    session.table,
                    dict(table.source.column_types),
                    source_types,
                    table.source.key_columns,
                    session.row_filter,
                    plan.config.preprocess.parquet_batch_rows,
                    max(1, plan.buckets),
                )
            )
    return reads


def _order(value: Any) -> tuple:
    """A value's place in the row order: NULL first, then NaN, then values by their own order."""
    if value is None:
        return (0,)
    if isinstance(value, float) and math.isnan(value):
        return (1,)
    return (2, value)


def row_key(row: Row) -> tuple:
    return tuple(_order(v) for v in row)


def _range_of(row: Row, quantiles: list[tuple]) -> int:
    # Equal rows share a key, so they land in one range: the ranges' concatenation is the sort.
    return bisect.bisect_right(quantiles[1:-1], row_key(row)) if len(quantiles) > 2 else 0


def _numbered(ranged: tuple[int, Iterable[Row]], counts: list[tuple[int, int]], block_rows: int) -> Iterator[tuple[int, tuple[int, Row]]]:
    """One range's rows, sorted and numbered after every earlier range's, keyed by their block."""
    r, rows = ranged
    first = sum(n for other, n in counts if other < r)
    for i, row in enumerate(sorted(rows, key=row_key)):
        yield (first + i) // block_rows, (first + i, row)


def to_block(keyed: tuple[int, Iterable[tuple[int, Row]]], read: BigQueryRead) -> RowBlock:
    """One block's rows, in order, as the chunk the one-process engine would have read."""
    k, numbered = keyed
    rows = [row for _, row in sorted(numbered, key=lambda pr: pr[0])]
    columns = []
    for j, (name, dtype) in enumerate(read.column_types.items()):
        values = [row[j] for row in rows]
        try:
            columns.append(pa.array(values, type=read.source_types[name]).cast(dtype))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise GnnflowError(f"{read.ref}, column '{name}': values that cannot be read as {dtype}: {exc}") from None
    table = pa.table(columns, names=list(read.column_types))
    return RowBlock(Block(read.kind, read.table, k), TableChunk(table, read.ref, 1, read.key_columns))


def read_row_blocks(pipeline: Any, read: BigQueryRead) -> Any:
    """The table's rows as a PCollection of :class:`RowBlock`, one per ``block_rows`` rows."""
    import apache_beam as beam
    from apache_beam.io.gcp.bigquery import ReadFromBigQuery
    from apache_beam.io.gcp.internal.clients.bigquery import DatasetReference, TableReference

    columns = list(read.column_types)
    ref = read.ref
    rows = (
        pipeline
        | read.label("read")
        >> ReadFromBigQuery(
            method=ReadFromBigQuery.Method.DIRECT_READ,
            table=TableReference(projectId=ref.project, datasetId=ref.dataset, tableId=ref.table),
            selected_fields=columns,
            row_restriction=read.row_filter,
            # Beam's clean-up after a read without one lists the project's datasets by a label
            # and deletes them (an emulator that ignores the label filter loses all of them).
            # With one it only deletes its temp table there, which a table read never creates.
            temp_dataset=DatasetReference(projectId=ref.project, datasetId=ref.dataset),
        )
        | read.label("as tuples") >> beam.Map(lambda row: tuple(row.get(c) for c in columns))
    )
    quantiles = (
        rows
        | read.label("row keys") >> beam.Map(row_key)
        | read.label("range bounds") >> beam.transforms.stats.ApproximateQuantiles.Globally(read.ranges + 1)
    )
    ranged = (
        rows
        | read.label("by range") >> beam.Map(lambda row, q: (_range_of(row, q), row), beam.pvalue.AsSingleton(quantiles))
        | read.label("group ranges") >> beam.GroupByKey()
        | read.label("range lists") >> beam.MapTuple(lambda r, rs: (r, list(rs)))
    )
    counts = (
        ranged | read.label("range sizes") >> beam.MapTuple(lambda r, rs: (r, len(rs))) | read.label("all sizes") >> beam.combiners.ToList()
    )
    return (
        ranged
        | read.label("number rows") >> beam.FlatMap(_numbered, beam.pvalue.AsSingleton(counts), read.block_rows)
        | read.label("group blocks") >> beam.GroupByKey()
        | read.label("blocks") >> beam.Map(to_block, read)
    )
