"""BigQuery tables (``bq://project.dataset.table``) as node and edge tables.

The table's schema stands in for a file's header: the columns a config names are looked up in
it, and each column's BigQuery type is checked against what the config uses it for (a node id,
a label, a number to standardize, ...) before any row is read; :func:`check_bigquery_inputs`
does this for a whole config before any step runs. Rows are read with the Storage Read API
(:mod:`components.warehouse.reading`): only the needed columns, only the rows the table's
``row_filter`` keeps, cast to the same Arrow types the file readers give, and rebatched into
chunks of ``parquet_batch_rows`` rows.

Row order: the read's order is the order of the session's streams, each in the order BigQuery
sends it. BigQuery promises no order: it follows the table's storage layout and may differ
between runs (after DML or streaming inserts, or as the service re-splits streams). So node ids
do not follow it: a ``bq://`` node table's nodes are numbered in the order of their ids' values
(:func:`components.preprocess.nodes.in_value_order`), the same on every read and in both engines.
Within one run both passes over a table read the same session, a snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from components.errors import GnnflowError
from components.tables.reading import TableChunk, check_columns
from components.tables.transforms import NUMERIC_TRANSFORMS, expand_columns
from components.warehouse.table_ref import BigQueryTable, is_bigquery_uri, parse_table_uri

if TYPE_CHECKING:
    from google.cloud.bigquery import SchemaField

    from components.config import EdgeTableSpec, FeatureSpec, GnnflowConfig, NodeTableSpec
    from components.warehouse.reading import ReadSession

Use = Literal["id", "label", "split", "number", "category"]

# The legacy names tables.get reports, as the standard SQL names users know.
_STANDARD_NAMES = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL", "RECORD": "STRUCT"}
_ALLOWED: dict[Use, tuple[str, ...]] = {
    # Ids and labels are read as text: a FLOAT64 or NUMERIC would give '1.0' or '1.000000000'.
    "id": ("STRING", "INT64"),
    "label": ("STRING", "INT64", "BOOL"),
    "split": ("STRING",),
    "number": ("INT64", "FLOAT64", "NUMERIC", "BIGNUMERIC", "BOOL"),
    "category": ("STRING", "INT64", "BOOL"),
}
_STREAMS = 8  # streams asked of a read session (BigQuery may give fewer)


@dataclass(frozen=True)
class ColumnUse:
    """What the config uses one column for, and how to say it in an error."""

    use: Use
    what: str  # e.g. "node id column", "numeric feature (transform standardize)"


def bigquery_type(field: SchemaField) -> str:
    """A column's type as BigQuery SQL writes it: ``INT64``, ``ARRAY<FLOAT64>``, ``STRUCT``."""
    name = _STANDARD_NAMES.get(field.field_type, field.field_type)
    return f"ARRAY<{name}>" if field.mode == "REPEATED" else name


def check_column_types(table: BigQueryTable, fields: Mapping[str, SchemaField], uses: Mapping[str, ColumnUse]) -> None:
    """An error naming the table, the first column whose type does not fit its use, its type and what was expected."""
    for column, use in uses.items():
        found = bigquery_type(fields[column])
        if found not in _ALLOWED[use.use]:
            expected = ", ".join(_ALLOWED[use.use])
            scalar = " (a single value per row)" if found.startswith(("ARRAY", "STRUCT")) else ""
            raise GnnflowError(
                f"{table}, column '{column}' is {found}, but the config uses it as the {use.what}, which needs one of {expected}{scalar}"
            )


def _feature_use(spec: FeatureSpec) -> ColumnUse:
    if spec.transform in NUMERIC_TRANSFORMS:
        return ColumnUse("number", f"numeric feature (transform {spec.transform})")
    return ColumnUse("category", f"categorical feature (transform {spec.transform})")


def base_uses(spec: NodeTableSpec | EdgeTableSpec) -> dict[str, ColumnUse]:
    """The id/endpoint, label and split columns of a table spec, with their uses."""
    from components.config import NodeTableSpec

    if isinstance(spec, NodeTableSpec):
        uses = {spec.id_column: ColumnUse("id", "node id column")}
        if spec.label_column:
            uses[spec.label_column] = ColumnUse("label", "label column")
    else:
        uses = {spec.src_column: ColumnUse("id", "source node id column"), spec.dst_column: ColumnUse("id", "destination node id column")}
    if spec.split_column:
        uses[spec.split_column] = ColumnUse("split", "split column")
    return uses


@dataclass(frozen=True)
class BigQueryColumns:
    """A table's schema checked against a table spec: its header and concrete feature columns."""

    table: BigQueryTable
    header: list[str]
    groups: list[list[str]]  # per feature group, its columns (patterns expanded over the schema)


def check_table_columns(uri: str, base: Mapping[str, ColumnUse], feature_specs: Sequence[FeatureSpec]) -> BigQueryColumns:
    """Reads the table's schema (``tables.get``) and checks that every column the spec names is
    there with a type that fits its use; errors name the ``bq://`` table and the column."""
    from components.warehouse.reading import table_metadata

    table = parse_table_uri(uri)
    fields = {f.name: f for f in table_metadata(table).schema}
    header = list(fields)
    groups = [expand_columns(spec.columns, header, str(table)) for spec in feature_specs]
    check_columns(table, header, [*base, *(c for g in groups for c in g)])
    uses = dict(base)
    for spec, group in zip(feature_specs, groups):
        uses.update({c: _feature_use(spec) for c in group if c not in uses})
    check_column_types(table, fields, uses)
    return BigQueryColumns(table, header, groups)


def start_table_read(table: BigQueryTable, columns: Sequence[str], row_filter: str | None) -> ReadSession:
    """One read session over the table, for every pass of a step over it (the same rows, in the same order)."""
    from components.warehouse.reading import start_read

    return start_read(table, columns, row_filter, max_streams=_STREAMS)


def bigquery_chunks(
    session: ReadSession, column_types: Mapping[str, pa.DataType], key_columns: Sequence[str], batch_rows: int
) -> Iterator[TableChunk]:
    """The session's rows as chunks of ``batch_rows`` rows, columns in ``column_types``' order and
    cast to those types (the Storage Read API may give narrower integers than the table's)."""
    from components.warehouse.reading import read_batches

    schema = pa.schema([(name, dtype) for name, dtype in column_types.items()])
    pending: list[pa.Table] = []
    held = 0
    first_row = 1

    def flush(rows: int) -> TableChunk:
        nonlocal pending, held, first_row
        whole = pa.concat_tables(pending)
        chunk = TableChunk(whole.slice(0, rows).combine_chunks(), session.table, first_row, tuple(key_columns))
        rest = whole.slice(rows)
        pending, held, first_row = ([rest] if rest.num_rows else []), rest.num_rows, first_row + rows
        return chunk

    for batch in read_batches(session):
        pending.append(pa.table([batch.column(name).cast(dtype) for name, dtype in column_types.items()], schema=schema))
        held += batch.num_rows
        while held >= batch_rows:
            yield flush(batch_rows)
    if held:
        yield flush(held)


def read_bigquery_header_and_sample(uri: str, rows: int) -> tuple[list[str], pa.Table]:
    """Column names from the schema and the first ``rows`` rows (for proposing a config); INT64
    columns as int64 whatever width the Storage Read API sends."""
    from components.warehouse.reading import read_first_rows, table_metadata

    table = parse_table_uri(uri)
    fields = list(table_metadata(table).schema)
    sample = read_first_rows(table, rows)
    if sample.num_rows == 0:
        raise GnnflowError(f"BigQuery table {table} is empty: it has columns but no rows")
    columns = [sample.column(f.name) for f in fields]
    columns = [c.cast(pa.int64()) if pa.types.is_integer(c.type) else c for c in columns]
    return [f.name for f in fields], pa.table(columns, names=[f.name for f in fields])


def check_bigquery_inputs(config: GnnflowConfig) -> None:
    """Refuses, before any step runs, what a run reading BigQuery tables would fail on: a missing
    table or column, a column whose type does not fit its use, or a row filter BigQuery rejects.
    Config without ``bq://`` tables: nothing is checked."""
    specs: list[NodeTableSpec | EdgeTableSpec] = [*config.graph.nodes, *config.graph.edges]
    tables = [spec for spec in specs if is_bigquery_uri(spec.uri)]
    if not tables:
        return
    for spec in tables:
        columns = check_table_columns(spec.uri, base_uses(spec), spec.features)
        needed = [*base_uses(spec), *(c for g in columns.groups for c in g)]
        start_table_read(columns.table, list(dict.fromkeys(needed)), spec.row_filter)  # checks the filter; reads no row
