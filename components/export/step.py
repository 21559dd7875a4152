"""Step ``export``: a published infer output into BigQuery tables (``output.bigquery``) and a
Vertex AI Vector Search input folder (``output.vector_search``), keyed by the original ids.

Order, so that a failure anywhere leaves every BigQuery table as it was:

1. read infer's manifest and every Parquet footer (contract errors name the file and column);
   check the dataset exists and every existing final table fits what is written;
2. write the Vector Search files into the step's own staging generation; load the Parquet
   files into staging tables (:mod:`.bigquery_out`);
3. publish the step's output;
4. write all final tables in one transaction; drop the staging tables (also on failure).

The run id (a column of every table) is ``run_id`` or, by default, infer's output generation:
a rerun over the same embeddings replaces its own rows, a new run's rows are added.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from google.cloud import bigquery

from components import storage
from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.export import bigquery_out
from components.export.inputs import InferResults, read_infer_results
from components.export.output import STEP, TABLES_FILE, VECTOR_SEARCH_FOLDER
from components.export.vector_search import write_vector_search
from components.warehouse.clients import bigquery_client
from components.warehouse.result_tables import check_run_id

log = logging.getLogger("gnnflow.export")


@dataclass(frozen=True)
class _Warehouse:
    """The BigQuery side of one export: a client and the tables it writes."""

    client: bigquery.Client
    plan: bigquery_out.BigQueryPlan


def check_export_destination(config: GnnflowConfig) -> None:
    """Before a run starts: the configured BigQuery dataset exists (the tables are checked by the step)."""
    dataset = config.output.bigquery_dataset
    if dataset is not None:
        bigquery_out.check_dataset(bigquery_client(dataset.project), dataset)


def _warehouse(config: GnnflowConfig, results: InferResults, run_id: str) -> _Warehouse | None:
    dataset = config.output.bigquery_dataset
    if dataset is None:
        return None
    warehouse = _Warehouse(
        bigquery_client(dataset.project), bigquery_out.plan_tables(results, dataset, config.output.bigquery_write, run_id)
    )
    bigquery_out.check_destination(warehouse.client, warehouse.plan)
    return warehouse


@contextlib.contextmanager
def _staging_tables(warehouse: _Warehouse | None) -> Iterator[None]:
    if warehouse is None:
        yield
        return
    with bigquery_out.staging_tables(warehouse.client, warehouse.plan):
        yield


def export(
    config: GnnflowConfig, embeddings: storage.Uri | str, output: storage.Uri | str, run_id: str | None = None
) -> storage.PublishedOutput:
    """Runs the step; returns its published output (published before the BigQuery tables change)."""
    start = time.perf_counter()
    if not config.output.exports:
        raise GnnflowError("nothing to export: set output.bigquery (project.dataset) and/or output.vector_search: true")
    output = storage.parse_uri(output)
    # Everything a user can get wrong fails here, before anything is written.
    results = read_infer_results(embeddings)
    run = check_run_id(run_id or results.generation)
    warehouse = _warehouse(config, results, run)
    log.info("export: %s → %s (run id %s)", results.output.root, output, run)
    metadata: dict[str, object] = {"embeddings": str(results.output.root), "run_id": run}
    counts = {f"nodes.{t}": files.rows for t, files in results.embeddings.items()}
    with storage.staged_output(output, STEP) as staging, _staging_tables(warehouse):
        if config.output.vector_search:
            written = write_vector_search(staging, results)
            folder = staging.uri(VECTOR_SEARCH_FOLDER)
            metadata["vector_search"] = {"folder": str(folder), "files": len(written.files), "dimensions": written.dimensions}
            counts["vector_search_files"] = len(written.files)
            log.info(
                "export: Vector Search input: %s (%d dimensions); build an index with gnnflow vector-index --folder %s --dimensions %d",
                folder,
                written.dimensions,
                folder,
                written.dimensions,
            )
        if warehouse is not None:
            bigquery_out.load_staging(warehouse.client, warehouse.plan, results)
            staging.write_json(TABLES_FILE, warehouse.plan.describe())
            metadata["bigquery"] = warehouse.plan.describe()
        staging.write_bytes("config.resolved.yaml", config.to_yaml().encode())
        published = staging.publish(counts=counts, metadata=metadata)
        if warehouse is not None:
            bigquery_out.commit(warehouse.client, warehouse.plan)
    log.info("export: published %s in %.1fs", output, time.perf_counter() - start)
    return published
