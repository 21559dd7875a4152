"""A run's results into BigQuery: load jobs into staging tables, then one transaction into the final tables.

Per node type, infer's embedding shards are loaded (Parquet) into one staging table; likewise
the candidate shards. When infer's output is on ``gs://`` (a cloud run), one load job per
staging table names the files' ``gs://`` URIs and BigQuery reads them itself; a local output
is loaded one job per file, uploaded through the client's resumable upload (which the real
service and the emulator both take). Nothing final changes until every load has
succeeded, and then all final tables change in one multi-statement transaction: per table, a
DELETE (replace: every row; append: the rows of this run id, so a rerun never duplicates) and an
INSERT from its staging table with the run id. BigQuery rolls a failed transaction back, so a
failure anywhere leaves every final table as it was. Staging tables are dropped afterwards,
also on failure (and expire after a day should the process die first).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery

from components import storage
from components.errors import GnnflowError
from components.export.inputs import InferResults, ResultFiles
from components.storage import gcs
from components.warehouse.result_tables import ResultKind, check_run_id, result_table
from components.warehouse.table_ref import BigQueryDataset, BigQueryTable

log = logging.getLogger("gnnflow.export")

REQUEST_TIMEOUT_S = 120.0  # one HTTP request (an upload chunk, a table lookup)
JOB_TIMEOUT_S = 3600.0  # one load job or the commit: a stuck job fails the step instead of hanging it
STAGING_EXPIRY = dt.timedelta(days=1)
RUN_ID = "run_id"
# Every column export writes: BigQuery type and mode.
_FIELDS = {
    RUN_ID: ("STRING", "NULLABLE"),
    "node_id": ("STRING", "NULLABLE"),
    "embedding": ("FLOAT", "REPEATED"),
    "prediction": ("STRING", "NULLABLE"),
    "probability": ("FLOAT", "NULLABLE"),
    "cold": ("BOOLEAN", "NULLABLE"),  # in the staging tables only: infer's shards carry it
    "candidate_id": ("STRING", "NULLABLE"),
    "score": ("FLOAT", "NULLABLE"),
    "rank": ("INTEGER", "NULLABLE"),
}
KIND_COLUMNS: dict[ResultKind, tuple[str, ...]] = {
    "embeddings": ("node_id", "embedding"),
    "predictions": ("node_id", "prediction", "probability"),
    "candidates": ("node_id", "candidate_id", "score", "rank"),
}
_SYNONYMS = {"FLOAT64": "FLOAT", "INT64": "INTEGER", "BOOL": "BOOLEAN"}  # legacy and standard SQL names


def _schema(columns: tuple[str, ...]) -> list[bigquery.SchemaField]:
    return [bigquery.SchemaField(name, *_FIELDS[name]) for name in columns]


def _sql_name(table: BigQueryTable) -> str:
    return f"`{table.table_id}`"


@dataclass(frozen=True)
class Staged:
    """One staging table and the files loaded into it."""

    files: ResultFiles
    table: BigQueryTable


@dataclass(frozen=True)
class TableWrite:
    """One final table: what it receives, from which staging table."""

    table: BigQueryTable
    kind: ResultKind
    node_type: str
    source: Staged

    @property
    def columns(self) -> tuple[str, ...]:
        return (RUN_ID, *KIND_COLUMNS[self.kind])


@dataclass(frozen=True)
class BigQueryPlan:
    """Every table one export writes, decided before anything is loaded."""

    dataset: BigQueryDataset
    mode: str  # replace or append
    run_id: str
    staged: tuple[Staged, ...]
    writes: tuple[TableWrite, ...]

    def describe(self) -> dict:
        """What ``bigquery.json`` records."""
        return {
            "dataset": str(self.dataset),
            "write": self.mode,
            "run_id": self.run_id,
            "tables": {w.table.table_id: {"kind": w.kind, "node_type": w.node_type, "rows": w.source.files.rows} for w in self.writes},
        }


def plan_tables(results: InferResults, dataset: BigQueryDataset, mode: str, run_id: str) -> BigQueryPlan:
    """One staging table per node type's embeddings (and for the candidates); the final tables they feed."""
    check_run_id(run_id)
    token = secrets.token_hex(4)  # two exports into one dataset at once never share a staging table
    staged: list[Staged] = []
    writes: list[TableWrite] = []
    for node_type, files in results.embeddings.items():
        source = Staged(files, dataset.table(f"_gnnflow_staging_{node_type}_embeddings_{token}"))
        staged.append(source)
        writes.append(TableWrite(dataset.table(result_table(node_type, "embeddings")), "embeddings", node_type, source))
        if results.has_predictions(node_type):
            writes.append(TableWrite(dataset.table(result_table(node_type, "predictions")), "predictions", node_type, source))
    if results.candidates is not None:
        node_type = results.candidates.node_type
        source = Staged(results.candidates, dataset.table(f"_gnnflow_staging_{node_type}_candidates_{token}"))
        staged.append(source)
        writes.append(TableWrite(dataset.table(result_table(node_type, "candidates")), "candidates", node_type, source))
    return BigQueryPlan(dataset, mode, run_id, tuple(staged), tuple(writes))


def check_dataset(client: bigquery.Client, dataset: BigQueryDataset) -> None:
    """An error naming the dataset when it does not exist (export creates tables, never datasets)."""
    try:
        client.get_dataset(f"{dataset.project}.{dataset.dataset}", timeout=REQUEST_TIMEOUT_S)
    except api_exceptions.NotFound:
        raise GnnflowError(
            f"BigQuery dataset {dataset} (output.bigquery) does not exist: create it (bq mk --dataset {dataset}) or name another"
        ) from None


def _existing(client: bigquery.Client, table: BigQueryTable) -> bigquery.Table | None:
    try:
        return client.get_table(table.table_id, timeout=REQUEST_TIMEOUT_S)
    except api_exceptions.NotFound:
        return None


def check_destination(client: bigquery.Client, plan: BigQueryPlan) -> None:
    """The dataset exists and every final table that exists already takes the rows export writes."""
    check_dataset(client, plan.dataset)
    for write in plan.writes:
        existing = _existing(client, write.table)
        if existing is None:
            continue
        have = {f.name: (_SYNONYMS.get(f.field_type, f.field_type), f.mode or "NULLABLE") for f in existing.schema}
        for name in write.columns:
            wanted = _FIELDS[name]
            if have.get(name) != wanted:
                found = f"{have[name][1]} {have[name][0]}" if name in have else "no such column"
                raise GnnflowError(
                    f"BigQuery table {write.table.table_id} does not fit the {write.kind} export writes: column {name!r} "
                    f"must be {wanted[1]} {wanted[0]} ({found}); drop the table or export to another dataset"
                )


def _wait(job: bigquery.LoadJob | bigquery.QueryJob, what: str) -> None:
    try:
        job.result(timeout=JOB_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        with contextlib.suppress(api_exceptions.GoogleAPICallError):
            job.cancel()
        raise GnnflowError(f"{what}: BigQuery job {job.job_id} did not finish within {JOB_TIMEOUT_S:.0f} s") from None


def _load(client: bigquery.Client, staged: Staged, results: InferResults, feeds: list[str]) -> None:
    table = bigquery.Table(staged.table.table_id, schema=_schema(staged.files.columns))
    table.expires = dt.datetime.now(dt.UTC) + STAGING_EXPIRY
    client.create_table(table, timeout=REQUEST_TIMEOUT_S)
    parquet = bigquery.ParquetOptions()
    parquet.enable_list_inference = True  # a Parquet list column loads as REPEATED, not as a nested record
    config = bigquery.LoadJobConfig(
        source_format=bigquery.SourceFormat.PARQUET,
        schema=_schema(staged.files.columns),
        write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
        create_disposition=bigquery.CreateDisposition.CREATE_NEVER,
        parquet_options=parquet,
    )
    if isinstance(results.output.root, storage.GcsUri):
        _load_from_gcs(client, staged, results, config, feeds)
    else:
        _load_local_files(client, staged, results, config, feeds)
    loaded = client.get_table(staged.table.table_id, timeout=REQUEST_TIMEOUT_S).num_rows
    if loaded != staged.files.rows:
        raise GnnflowError(
            f"staging table {staged.table.table_id} holds {loaded} rows after loading {len(staged.files.paths)} file(s) "
            f"of {staged.files.rows} rows (for {', '.join(feeds)})"
        )


def _load_from_gcs(
    client: bigquery.Client, staged: Staged, results: InferResults, config: bigquery.LoadJobConfig, feeds: list[str]
) -> None:
    """One load job reading the files where they are: BigQuery fetches ``gs://`` itself, and not a byte
    passes through this process. Each object's stored CRC32C is first compared with the manifest's
    (a metadata read), so the job loads the files infer published, not others put at their names."""
    uris = [results.output.uri(path) for path in staged.files.paths]
    for path, uri in zip(staged.files.paths, uris):
        expected = results.output.manifest.files[path].crc32c
        if isinstance(uri, storage.GcsUri) and (found := gcs.stored_crc32c(uri)) != expected:
            raise GnnflowError(
                f"{uri}: CRC32C {found} differs from the manifest's {expected}: the file changed after infer published it; "
                "re-run infer (nothing was loaded)"
            )
    what = f"loading {len(uris)} file(s) from {results.output.root} into staging table {staged.table.table_id} (for {', '.join(feeds)})"
    try:
        job = client.load_table_from_uri([str(u) for u in uris], staged.table.table_id, job_config=config, timeout=REQUEST_TIMEOUT_S)
        _wait(job, what)
    except api_exceptions.GoogleAPICallError as exc:
        raise GnnflowError(f"{what} failed: {exc.message}") from None


def _load_local_files(
    client: bigquery.Client, staged: Staged, results: InferResults, config: bigquery.LoadJobConfig, feeds: list[str]
) -> None:
    """One load job per file, its bytes uploaded through the client (a local run: BigQuery cannot read them)."""
    for path in staged.files.paths:
        uri = results.output.uri(path)
        what = f"loading {uri} into staging table {staged.table.table_id} (for {', '.join(feeds)})"
        try:
            with results.output.open_read(path) as stream:  # checked against the manifest as it uploads
                # No size: the resumable upload, which sends the data without a multipart media type.
                job = client.load_table_from_file(stream, staged.table.table_id, job_config=config, timeout=REQUEST_TIMEOUT_S)
            _wait(job, what)
        except api_exceptions.GoogleAPICallError as exc:
            raise GnnflowError(f"{what} failed: {exc.message}") from None


def load_staging(client: bigquery.Client, plan: BigQueryPlan, results: InferResults) -> None:
    """Every staging table created and loaded; an error names the file and the tables it was for."""
    for staged in plan.staged:
        feeds = [w.table.table_id for w in plan.writes if w.source == staged]
        _load(client, staged, results, feeds)
        log.info("export: %d rows loaded into staging table %s", staged.files.rows, staged.table.table_id)


@contextlib.contextmanager
def staging_tables(client: bigquery.Client, plan: BigQueryPlan) -> Iterator[None]:
    """Drops the plan's staging tables when the block exits, however it exits."""
    try:
        yield
    finally:
        for staged in plan.staged:
            try:
                client.delete_table(staged.table.table_id, not_found_ok=True, timeout=REQUEST_TIMEOUT_S)
            except api_exceptions.GoogleAPICallError as exc:  # the original error, if any, matters more
                log.warning("export: could not drop staging table %s (it expires by itself): %s", staged.table.table_id, exc)


def commit_script(plan: BigQueryPlan) -> str:
    """The transaction: per final table, its old rows of this run (or all, replace) out, the staged rows in."""
    run_id = check_run_id(plan.run_id)  # written as a literal: the emulator takes no parameters inside scripts
    statements = ["BEGIN TRANSACTION;"]
    for write in plan.writes:
        condition = "TRUE" if plan.mode == "replace" else f"{RUN_ID} = '{run_id}'"
        statements.append(f"DELETE FROM {_sql_name(write.table)} WHERE {condition};")
        columns = KIND_COLUMNS[write.kind]
        statements.append(
            f"INSERT INTO {_sql_name(write.table)} ({', '.join(write.columns)}) "
            f"SELECT '{run_id}', {', '.join(columns)} FROM {_sql_name(write.source.table)};"
        )
    statements.append("COMMIT TRANSACTION;")
    return "\n".join(statements)


def commit(client: bigquery.Client, plan: BigQueryPlan) -> None:
    """Creates the final tables that do not exist yet, then writes all of them in one transaction.

    Tables are created outside it (BigQuery allows no DDL on permanent tables in a transaction);
    when the transaction fails, those just created (still empty) are dropped again.
    """
    created = []
    for write in plan.writes:
        if _existing(client, write.table) is None:
            client.create_table(bigquery.Table(write.table.table_id, schema=_schema(write.columns)), timeout=REQUEST_TIMEOUT_S)
            created.append(write.table)
    tables = ", ".join(w.table.table_id for w in plan.writes)
    try:
        _wait(client.query(commit_script(plan), timeout=REQUEST_TIMEOUT_S), f"writing {tables}")
    except (api_exceptions.GoogleAPICallError, GnnflowError) as exc:
        for table in created:
            with contextlib.suppress(api_exceptions.GoogleAPICallError):
                client.delete_table(table.table_id, not_found_ok=True, timeout=REQUEST_TIMEOUT_S)
        message = exc.message if isinstance(exc, api_exceptions.GoogleAPICallError) else str(exc)
        raise GnnflowError(f"writing run {plan.run_id} into BigQuery tables {tables} failed; they are unchanged: {message}") from None
    for write in plan.writes:
        log.info("export: %s: %d rows of run %s (%s)", write.table.table_id, write.source.files.rows, plan.run_id, plan.mode)
