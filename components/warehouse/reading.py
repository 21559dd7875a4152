"""Reading BigQuery tables: their metadata (schema, version) over REST, their rows with the Storage Read API.

Rows come as Arrow record batches from one read session. A session is a snapshot of the table
taken when it is created, split into streams that are read concurrently here but handed on in
stream-index order, each stream's rows in the order the server sends them. BigQuery promises
no row order beyond that: it follows the table's storage layout, which can change between
sessions (after DML, streaming inserts, re-clustering). Reading the same session twice gives
the same rows in the same order, which is what a two-pass reader needs.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery
from google.cloud.bigquery_storage_v1 import types

from components.errors import GnnflowError
from components.services import deadline
from components.warehouse.clients import bigquery_client, read_client, read_retry, read_service
from components.warehouse.table_ref import BigQueryTable

log = logging.getLogger("gnnflow.warehouse")

# Batches a stream's reader thread may hold before the consumer takes them: memory stays bounded
# by streams x this many batches while later streams are fetched ahead of the one being consumed.
_BATCHES_AHEAD = 4


def table_metadata(table: BigQueryTable) -> bigquery.Table:
    """The table's schema and version (``tables.get``); a missing table, dataset or project is an
    error naming the ``bq://`` URI."""
    try:
        return bigquery_client(table.project).get_table(table.table_id)
    except api_exceptions.NotFound as exc:
        raise GnnflowError(f"BigQuery table {table} does not exist (or its dataset or project does not): {_short(exc)}") from None
    except api_exceptions.Forbidden as exc:
        raise GnnflowError(f"BigQuery table {table}: access denied: {_short(exc)}") from None
    except api_exceptions.GoogleAPICallError as exc:
        raise GnnflowError(f"BigQuery table {table}: cannot read its metadata: {_short(exc)}") from None


def table_version(table: BigQueryTable) -> str:
    """What changes when the table's rows do: etag, last modification, row count and rows still
    in the streaming buffer (a streaming insert changes only the last two)."""
    meta = table_metadata(table)
    buffered = meta.streaming_buffer.estimated_rows if meta.streaming_buffer is not None else 0
    modified = meta.modified.isoformat() if meta.modified else ""
    return f"etag={meta.etag} modified={modified} rows={meta.num_rows} buffered={buffered}"


@dataclass(frozen=True)
class ReadSession:
    """One Storage Read session over a table: its snapshot, columns, filter and streams."""

    table: BigQueryTable
    name: str
    streams: tuple[str, ...]
    columns: tuple[str, ...]
    row_filter: str | None
    arrow_schema: bytes  # the session's serialized Arrow schema (every stream's batches follow it)


def start_read(table: BigQueryTable, columns: Sequence[str], row_filter: str | None, max_streams: int) -> ReadSession:
    """A read session with only ``columns`` and the rows matching ``row_filter`` (BigQuery SQL).

    An unknown column or an invalid filter is refused here, naming the table and the filter.
    """
    request = types.ReadSession(
        table=table.read_path,
        data_format=types.DataFormat.ARROW,
        read_options=types.ReadSession.TableReadOptions(selected_fields=list(columns), row_restriction=row_filter or ""),
    )
    try:
        session = read_client().create_read_session(
            parent=f"projects/{table.project}",
            read_session=request,
            max_stream_count=max_streams,
            retry=read_retry(str(table)),
            timeout=deadline.deadline_s(),
        )
    except (api_exceptions.RetryError, api_exceptions.ServiceUnavailable, api_exceptions.DeadlineExceeded) as exc:
        raise deadline.unreachable(read_service(), str(table), exc) from None
    except api_exceptions.GoogleAPICallError as exc:
        shown = f" with row_filter {row_filter!r}" if row_filter else ""
        raise GnnflowError(f"BigQuery table {table}: cannot start a Storage Read session{shown}: {_short(exc)}") from None
    streams = tuple(s.name for s in session.streams)
    log.info("bigquery: %s, %d column(s)%s, %d stream(s)", table, len(columns), f" where {row_filter}" if row_filter else "", len(streams))
    return ReadSession(table, session.name, streams, tuple(columns), row_filter, bytes(session.arrow_schema.serialized_schema))


def _decode(session: ReadSession, serialized: bytes) -> pa.RecordBatch:
    schema = pa.ipc.read_schema(pa.py_buffer(session.arrow_schema))
    return pa.ipc.read_record_batch(pa.py_buffer(serialized), schema)


def _stream_batches(session: ReadSession, stream: str) -> Iterator[pa.RecordBatch]:
    """One stream's batches; the client resumes a broken stream at its offset by itself."""
    # The retry bounds each (re)connection; the call's own timeout stays the library's (a day),
    # since reading a large stream may rightly take longer than the service deadline.
    try:
        for response in read_client().read_rows(stream, retry=read_retry(str(session.table))):
            if response.row_count:
                yield _decode(session, response.arrow_record_batch.serialized_record_batch)
    except (api_exceptions.RetryError, api_exceptions.ServiceUnavailable) as exc:
        raise deadline.unreachable(read_service(), f"{session.table} (stream {stream})", exc) from None


_END = object()


class _StreamReader(threading.Thread):
    """Reads one stream into a bounded queue; an exception is queued and raised by the consumer."""

    def __init__(self, session: ReadSession, stream: str, stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"bigquery-read-{stream.rsplit('/', 1)[-1]}")
        self.session, self.stream, self.stop = session, stream, stop
        self.batches: queue.Queue[object] = queue.Queue(maxsize=_BATCHES_AHEAD)

    def _put(self, item: object) -> bool:
        while not self.stop.is_set():
            try:
                self.batches.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        try:
            for batch in _stream_batches(self.session, self.stream):
                if not self._put(batch):
                    return
            self._put(_END)
        except BaseException as exc:  # noqa: BLE001  # handed to the consumer, which raises it
            self._put(exc)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            item = self.batches.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def read_batches(session: ReadSession, concurrency: int = 4) -> Iterator[pa.RecordBatch]:
    """Every batch of the session: streams read ``concurrency`` at a time, yielded in stream-index
    order, so the rows' order does not depend on which stream answers first."""
    stop = threading.Event()
    readers: list[_StreamReader] = []
    try:
        for i, stream in enumerate(session.streams):
            while len(readers) < min(len(session.streams), i + concurrency):
                reader = _StreamReader(session, session.streams[len(readers)], stop)
                reader.start()
                readers.append(reader)
            try:
                yield from readers[i]
            except api_exceptions.GoogleAPICallError as exc:
                raise GnnflowError(f"BigQuery table {session.table}: reading stream {stream} failed: {_short(exc)}") from None
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=5)


def read_first_rows(table: BigQueryTable, rows: int) -> pa.Table:
    """Up to ``rows`` rows of every column, from the first stream of a one-stream session."""
    meta = table_metadata(table)
    session = start_read(table, [f.name for f in meta.schema], None, max_streams=1)
    batches: list[pa.RecordBatch] = []
    taken = 0
    for stream in session.streams[:1]:
        for batch in _stream_batches(session, stream):
            batches.append(batch)
            taken += batch.num_rows
            if taken >= rows:
                break
    schema = pa.ipc.read_schema(pa.py_buffer(session.arrow_schema))
    return pa.Table.from_batches(batches, schema=schema).slice(0, rows)


def _short(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
