"""The warehouse round trip on a real graph: CiteSeer's tables loaded into BigQuery (the emulator
on loopback), the whole pipeline reading them as ``bq://`` tables, and its embeddings and class
predictions written back to BigQuery under CiteSeer's own node ids."""

from __future__ import annotations

import io
import json
import uuid

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.cloud import bigquery

from components import storage
from components.config import parse_config
from components.warehouse.clients import bigquery_client
from pipelines.local_run import run_pipeline
from tests.bigquery_emulator import BigQueryEmulator
from tests.shared_datasets import CITESEER, citeseer_graph, citeseer_test_chance, needs_citeseer

pytestmark = [pytest.mark.multiworker, needs_citeseer]


def load_csv_table(client: bigquery.Client, table_id: str, csv_path: str) -> pd.DataFrame:
    """A CSV file as a BigQuery table (STRING and INT64 columns), through a Parquet load job."""
    frame = pd.read_csv(csv_path, dtype={"node_id": str, "label": str, "split": str, "src": str, "dst": str})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    schema = [bigquery.SchemaField(f.name, "STRING" if pa.types.is_string(f.type) else "INT64") for f in table.schema]
    client.create_table(bigquery.Table(table_id, schema=schema))
    parquet = io.BytesIO()
    pq.write_table(table, parquet)
    parquet.seek(0)
    config = bigquery.LoadJobConfig(source_format=bigquery.SourceFormat.PARQUET, schema=schema, write_disposition="WRITE_APPEND")
    client.load_table_from_file(parquet, table_id, job_config=config).result(timeout=300)
    assert client.get_table(table_id).num_rows == len(frame)
    return frame


def test_citeseer_from_bigquery_to_embeddings_in_bigquery(tmp_path, bigquery_emulator: BigQueryEmulator) -> None:
    project = bigquery_emulator.project
    client = bigquery_client(project)
    source, results = f"citeseer_{uuid.uuid4().hex[:8]}", f"results_{uuid.uuid4().hex[:8]}"
    client.create_dataset(source)
    client.create_dataset(results)
    nodes = load_csv_table(client, f"{project}.{source}.nodes", str(CITESEER / "nodes.csv.gz"))
    load_csv_table(client, f"{project}.{source}.edges", str(CITESEER / "edges.csv.gz"))

    graph = citeseer_graph()
    graph["nodes"][0]["uri"] = f"bq://{project}.{source}.nodes"  # features f* expand from the table's schema
    graph["edges"][0]["uri"] = f"bq://{project}.{source}.edges"
    settings = {
        "graph": graph,
        "model": {"hidden_channels": 32},
        "training": {"epochs": 8, "early_stopping_patience": None, "fan_outs": [10, 5]},
        "partition": {"load_in_parallel": False},
        "resources": {"world_size": 1},
        "output": {"bigquery": f"{project}.{results}"},
    }
    config = parse_config(json.dumps(settings), "CiteSeer from BigQuery")
    result = run_pipeline(config, storage.parse_uri(tmp_path / "run"))
    assert "export" in result.ran

    embeddings = pd.DataFrame(dict(row) for row in client.list_rows(f"{project}.{results}.paper_embeddings"))
    assert len(embeddings) == len(nodes) == 3327
    assert set(embeddings["node_id"]) == set(nodes["node_id"])
    assert embeddings["run_id"].nunique() == 1 and {len(e) for e in embeddings["embedding"]} == {32}

    predictions = pd.DataFrame(dict(row) for row in client.list_rows(f"{project}.{results}.paper_predictions"))
    test = nodes[nodes["split"] == "test"].set_index("node_id")["label"]
    predicted = predictions.set_index("node_id")["prediction"].reindex(test.index)
    accuracy = float((predicted == test).mean())
    # Learning at all, read back from the warehouse: twice the commonest test class's share.
    assert accuracy >= 2 * citeseer_test_chance(), accuracy
    assert abs(accuracy - result.metrics["test_accuracy"]) < 1e-6, (accuracy, result.metrics)
