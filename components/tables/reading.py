"""Reading node and edge tables (CSV, gzipped CSV, Parquet; local or ``gs://``) in chunks.

Tables stream through in bounded-memory chunks; every failure is turned into an error that
names the file, and where it can, the row (1-based, counting data rows after the header) and
the column.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from components import storage
from components.errors import GnnflowError
from components.warehouse.table_ref import BigQueryTable, is_bigquery_uri, parse_table_uri

if TYPE_CHECKING:
    from components.config import EdgeTableSpec, GraphSpec, NodeTableSpec

TableFormat = Literal["csv", "parquet"]


@dataclass(frozen=True)
class TableChunk:
    """Consecutive rows of one file or BigQuery table, holding only the requested columns with their types."""

    table: pa.Table
    source: storage.Uri | BigQueryTable
    first_row: int  # 1-based number of the chunk's first data row within ``source`` (BigQuery: in the read's order)
    # BigQuery rows have no numbers a user could look up: errors name them by these columns' values instead.
    key_columns: tuple[str, ...] = ()

    def row(self, i: int) -> str:
        """Where the chunk's ``i``-th row (0-based) is, for an error: ``file, row N``, or for a
        BigQuery table ``bq://..., the row where id = 'x'``."""
        if not self.key_columns:
            return f"{self.source}, row {self.first_row + i}"
        keys = []
        for name in self.key_columns:
            value = self.table.column(name)[i].as_py()
            keys.append(f"{name} is NULL" if value is None else f"{name} = {value!r}")
        return f"{self.source}, the row where {' and '.join(keys)}"


def file_format(uri: storage.Uri, declared: str = "auto") -> TableFormat:
    """The format of one file: the declared one, else from its extension."""
    if declared in ("csv", "parquet"):
        return declared  # type: ignore[return-value]
    name = uri.name.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".csv.gz", ".tsv", ".txt", ".gz")):
        return "csv"
    raise GnnflowError(f"cannot tell the format of {uri} from its name: set format: csv or parquet in the config")


def _open_text_stream(uri: storage.Uri) -> BinaryIO:
    raw = storage.open_read(uri)
    if uri.name.lower().endswith(".gz"):
        return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "gzip")
    return raw


def read_header(uri: storage.Uri, fmt: TableFormat) -> list[str]:
    """Column names of one file, read without loading the table."""
    try:
        if fmt == "parquet":
            with storage.open_read(uri) as f:
                return list(pq.read_schema(f).names)
        stream = _open_text_stream(uri)
        try:
            first = io.TextIOWrapper(stream, encoding="utf-8", newline="").readline()
        finally:
            stream.close()
    except GnnflowError:
        raise
    except (pa.ArrowException, OSError, EOFError, UnicodeDecodeError) as exc:
        if fmt == "parquet":
            raise GnnflowError(f"{uri} is not a readable Parquet file: {_short(exc)}") from None
        raise GnnflowError(f"cannot read {uri}: {_short(exc)} (is the file corrupt or truncated?)") from None
    if not first.strip():
        raise GnnflowError(f"table {uri} is empty: no header row")
    return next(csv.reader([first]))


def read_sample(uri: storage.Uri, fmt: TableFormat, rows: int = 1000) -> pa.Table:
    """The first ``rows`` rows with types inferred, for proposing a config. Chunks are gathered
    until there are ``rows``: a 1 MiB CSV block of a wide table (CiteSeer's 3,703 word columns)
    holds about 140 rows, and a sample of those alone missed the empty labels further down."""
    parts: list[pa.Table] = []
    count = 0
    for chunk in iter_chunks([uri], None, fmt, block_bytes=1 << 20, batch_rows=rows):
        parts.append(chunk.table)
        count += chunk.table.num_rows
        if count >= rows:
            break
    if not count:
        raise GnnflowError(f"table {uri} is empty: it has a header but no rows")
    return pa.concat_tables(parts, promote_options="permissive").slice(0, rows)


def check_columns(uri: storage.Uri | BigQueryTable, header: Sequence[str], needed: Sequence[str]) -> None:
    """Errors naming the file (or BigQuery table) and the first needed column the header lacks."""
    present = set(header)
    for column in needed:
        if column not in present:
            shown = ", ".join(header[:12]) + (", ..." if len(header) > 12 else "")
            what = "table" if isinstance(uri, BigQueryTable) else "file"
            raise GnnflowError(f"{uri}: missing column '{column}' (the {what} has: {shown})")


def iter_chunks(
    files: Sequence[storage.Uri],
    column_types: Mapping[str, pa.DataType] | None,
    fmt: TableFormat,
    *,
    block_bytes: int,
    batch_rows: int,
) -> Iterator[TableChunk]:
    """Streams the rows of ``files`` in order, with only ``column_types``' columns, cast to
    those types (all columns with inferred types when ``None``)."""
    for uri in files:
        reader = _csv_batches if fmt == "csv" else _parquet_batches
        yield from reader(uri, column_types, block_bytes=block_bytes, batch_rows=batch_rows)


def _csv_batches(
    uri: storage.Uri, column_types: Mapping[str, pa.DataType] | None, *, block_bytes: int, batch_rows: int
) -> Iterator[TableChunk]:
    convert = pacsv.ConvertOptions(
        column_types=dict(column_types or {}),
        include_columns=list(column_types) if column_types else None,
        strings_can_be_null=False,
    )
    row = 1
    stream = _open_text_stream(uri)
    try:
        try:
            reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(block_size=block_bytes), convert_options=convert)
            for batch in reader:
                yield TableChunk(pa.Table.from_batches([batch]), uri, row)
                row += batch.num_rows
        except pa.ArrowInvalid as exc:
            raise _conversion_error(uri, exc, column_types, row) from None
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise GnnflowError(f"cannot read {uri} after row {row - 1}: {_short(exc)} (is the file truncated or corrupt?)") from None
    finally:
        stream.close()


def _parquet_batches(
    uri: storage.Uri, column_types: Mapping[str, pa.DataType] | None, *, block_bytes: int, batch_rows: int
) -> Iterator[TableChunk]:
    del block_bytes
    row = 1
    with storage.open_read(uri) as f:
        try:
            parquet = pq.ParquetFile(f)
            columns = list(column_types) if column_types else None
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
                table = pa.Table.from_batches([batch])
                if column_types:
                    table = _cast_columns(table, column_types, uri, row)
                yield TableChunk(table, uri, row)
                row += batch.num_rows
        except GnnflowError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise GnnflowError(f"{uri} is not a readable Parquet file: {_short(exc)}") from None


def _cast_columns(table: pa.Table, column_types: Mapping[str, pa.DataType], uri: storage.Uri, first_row: int) -> pa.Table:
    arrays = []
    for name, dtype in column_types.items():
        column = table.column(name)
        if column.type != dtype:
            try:
                column = column.cast(dtype)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad_row, value = _first_unparsable(column.cast(pa.string()), dtype) or (0, "?")
                raise GnnflowError(f"{uri}, row {first_row + bad_row}, column '{name}': {value!r} is not a valid {dtype}") from None
        arrays.append(column)
    return pa.table(arrays, names=list(column_types))


_NULL_TOKENS = {"", "nan", "-nan", "null", "na", "n/a", "#n/a", "none"}


def _first_unparsable(values: pa.ChunkedArray, dtype: pa.DataType) -> tuple[int, str] | None:
    """Index and text of the first value that is neither a null token nor a valid ``dtype``."""
    for i, value in enumerate(values.to_pylist()):
        if value is None or value.lower() in _NULL_TOKENS:
            continue
        try:
            pa.array([value]).cast(dtype)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return i, value
    return None


_COLUMN_NUMBER = re.compile(r"In CSV column #(\d+)")


def _conversion_error(
    uri: storage.Uri, exc: pa.ArrowInvalid, column_types: Mapping[str, pa.DataType] | None, chunk_row: int
) -> GnnflowError:
    """Arrow says which column failed but not which row: rescan that column as text to find it."""
    match = _COLUMN_NUMBER.search(str(exc))
    if not match or not column_types:
        return GnnflowError(f"cannot parse {uri} near row {chunk_row}: {_short(exc)}")
    header = read_header(uri, "csv")
    name = header[int(match.group(1))]
    dtype = column_types.get(name, pa.string())
    row = 1
    for chunk in iter_chunks([uri], {name: pa.string()}, "csv", block_bytes=1 << 22, batch_rows=0):
        found = _first_unparsable(chunk.table.column(0), dtype)
        if found is not None:
            return GnnflowError(f"{uri}, row {row + found[0]}, column '{name}': {found[1]!r} is not a number")
        row += chunk.table.num_rows
    return GnnflowError(f"{uri}, column '{name}': {_short(exc)}")


def _short(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def tables_fingerprint(graph: GraphSpec) -> str:
    """A short hash of every input file's version (size, mtime or GCS generation), and of every
    BigQuery table's (etag, modification time, row counts; its row filter).

    It changes when a table file is added, removed or rewritten at the same URI, or a BigQuery
    table's rows change, which is what a pipeline's cache key and ``gnnflow run``'s up-to-date
    check need to notice new data.
    """
    digest = hashlib.sha256()
    tables: list[NodeTableSpec | EdgeTableSpec] = [*graph.nodes, *graph.edges]
    for table in tables:
        if is_bigquery_uri(table.uri):
            from components.warehouse.reading import table_version  # the BigQuery clients load only when needed

            filtered = f"\twhere {table.row_filter}" if table.row_filter else ""
            digest.update(f"{table.uri}\t{table_version(parse_table_uri(table.uri))}{filtered}\n".encode())
            continue
        root = storage.parse_uri(table.uri)
        files = storage.expand_files(root)
        versions = {str(root): storage.version(root)} if files == [root] else storage.versions_below(root)
        for uri in files:
            if str(uri) not in versions:
                raise GnnflowError(f"input file {uri} vanished while fingerprinting the input tables")
            digest.update(f"{uri}\t{versions[str(uri)]}\n".encode())
    return digest.hexdigest()[:32]
