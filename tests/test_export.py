"""Step export: a tiny real run's results into BigQuery tables (the bqemulator on loopback) and
Vertex AI Vector Search input files; reruns, append, failed loads and commits, schema conflicts;
the vector-index command against the request recorder; bad configs refused before any step runs."""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from google.cloud import bigquery
from google.cloud.aiplatform_v1.types import Index

from components import storage
from components.config import GnnflowConfig, apply_overrides, parse_config
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.errors import GnnflowError
from components.export import bigquery_out
from components.export.inputs import read_infer_results
from components.export.step import export
from components.infer.output import CANDIDATES_FOLDER
from components.infer.retrieval import CANDIDATES_DIR
from components.tables.proposal import propose_config
from components.warehouse.clients import bigquery_client
from pipelines.cli import main as gnnflow
from pipelines.local_run import run_pipeline, summary
from tests.bigquery_emulator import BigQueryEmulator
from tests.recording_server import RecordingServer, add_vector_index_routes

pytestmark = pytest.mark.multiworker  # the module's run starts train and infer workers

NUM_NODES = 200
HIDDEN = 8


@dataclass(frozen=True)
class ExportedRun:
    config: GnnflowConfig
    root: Path
    dataset: str  # project.dataset the run exported to
    original_ids: set[str]
    summary: str

    @property
    def embeddings(self) -> Path:
        return self.root / "run" / "embeddings"


def new_dataset(emulator: BigQueryEmulator) -> str:
    name = f"export_{uuid.uuid4().hex[:12]}"
    bigquery_client(emulator.project).create_dataset(name)
    return f"{emulator.project}.{name}"


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory: pytest.TempPathFactory, bigquery_emulator: BigQueryEmulator) -> ExportedRun:
    """The demo graph (200 nodes, one worker, 2 epochs, exact inference) run whole with export on."""
    root = tmp_path_factory.mktemp("export")
    nodes, edges = write_demo_graph(generate_demo_graph(NUM_NODES), root / "data")
    config = propose_config(
        str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst", label_column="label", node_type="paper"
    )
    dataset = new_dataset(bigquery_emulator)
    overrides = {
        "training.epochs": 2,
        "training.early_stopping_patience": None,
        "training.fan_outs": [5, 5],
        "training.batch_size": 64,
        "model.hidden_channels": HIDDEN,
        "partition.load_in_parallel": False,
        "resources.world_size": 1,
        "output.bigquery": dataset,
        "output.vector_search": True,
    }
    config = apply_overrides(config, overrides)
    result = run_pipeline(config, storage.parse_uri(root / "run"), infer_mode="exact")
    original = set(pd.read_csv(nodes, usecols=["node_id"], dtype=str)["node_id"])
    return ExportedRun(config, root, dataset, original, summary(result))


def rows(table_id: str) -> list[dict]:
    project = table_id.split(".")[0]
    return [dict(row) for row in bigquery_client(project).list_rows(table_id)]


def table_names(dataset: str) -> set[str]:
    project, name = dataset.split(".")
    return {t.table_id for t in bigquery_client(project).list_tables(name)}


def infer_shards(run: ExportedRun) -> pd.DataFrame:
    published = storage.open_published(run.embeddings)
    return pd.concat(pq.read_table(io.BytesIO(published.read_bytes(f))).to_pandas() for f in published.files_under("embeddings/paper"))


def with_output(config: GnnflowConfig, **output: object) -> GnnflowConfig:
    return apply_overrides(config, {f"output.{k}": v for k, v in output.items()})


# ------------------------------------------------------------------------- the real run


def test_a_run_writes_tables_keyed_by_original_ids(exported_run: ExportedRun) -> None:
    published = storage.open_published(exported_run.root / "run" / "export", step="export")
    run_id = storage.open_published(exported_run.embeddings).manifest.generation
    assert published.manifest.metadata["run_id"] == run_id
    assert f"export       {exported_run.root / 'run' / 'export'}" in exported_run.summary

    embeddings = rows(f"{exported_run.dataset}.paper_embeddings")
    assert len(embeddings) == NUM_NODES
    assert set(embeddings[0]) == {"run_id", "node_id", "embedding"}
    assert {r["node_id"] for r in embeddings} == exported_run.original_ids
    assert {r["run_id"] for r in embeddings} == {run_id}
    assert {len(r["embedding"]) for r in embeddings} == {HIDDEN}

    shards = infer_shards(exported_run).set_index("node_id")
    predictions = rows(f"{exported_run.dataset}.paper_predictions")
    assert len(predictions) == NUM_NODES
    assert set(predictions[0]) == {"run_id", "node_id", "prediction", "probability"}
    assert {r["node_id"]: r["prediction"] for r in predictions} == shards["prediction"].to_dict()
    first = embeddings[0]
    assert np.array_equal(np.float32(first["embedding"]), shards.loc[first["node_id"], "embedding"])
    assert not [t for t in table_names(exported_run.dataset) if t.startswith("_gnnflow_staging")]


def test_vector_search_files_are_json_lines_with_restricts(exported_run: ExportedRun) -> None:
    published = storage.open_published(exported_run.root / "run" / "export", step="export")
    vector = published.manifest.metadata["vector_search"]
    files = published.files_under("vector_search")
    assert vector["dimensions"] == HIDDEN and vector["files"] == len(files) == 1
    assert files == ["vector_search/embeddings-00000.json"]
    assert vector["folder"] == str(published.root.join(published.manifest.generation, "vector_search"))
    lines = [json.loads(line) for line in published.read_bytes(files[0]).decode().splitlines()]
    assert len(lines) == NUM_NODES and {p["id"] for p in lines} == exported_run.original_ids
    shards = infer_shards(exported_run).set_index("node_id")
    for point in lines:
        assert set(point) == {"id", "embedding", "restricts"}
        assert np.array_equal(np.float32(point["embedding"]), shards.loc[point["id"], "embedding"])  # float32 values, exact
        predicted = shards.loc[point["id"], "prediction"]
        assert point["restricts"] == [{"namespace": "node_type", "allow": ["paper"]}, {"namespace": "class", "allow": [predicted]}]


def test_a_rerun_replaces_its_own_rows_and_append_adds_a_new_runs(exported_run: ExportedRun, bigquery_dataset: str, tmp_path) -> None:
    config = with_output(exported_run.config, bigquery=bigquery_dataset, bigquery_write="append", vector_search=False)
    export(config, exported_run.embeddings, tmp_path / "a", run_id="run-1")
    export(config, exported_run.embeddings, tmp_path / "a", run_id="run-1")  # a rerun: no duplicates
    table = f"{bigquery_dataset}.paper_embeddings"
    assert len(rows(table)) == NUM_NODES
    export(config, exported_run.embeddings, tmp_path / "a", run_id="run-2")
    by_run = pd.Series([r["run_id"] for r in rows(table)]).value_counts().to_dict()
    assert by_run == {"run-1": NUM_NODES, "run-2": NUM_NODES}
    assert len(rows(f"{bigquery_dataset}.paper_predictions")) == 2 * NUM_NODES

    replace = with_output(config, bigquery_write="replace")
    export(replace, exported_run.embeddings, tmp_path / "a", run_id="run-3")
    assert {r["run_id"] for r in rows(table)} == {"run-3"} and len(rows(table)) == NUM_NODES
    assert table_names(bigquery_dataset) == {"paper_embeddings", "paper_predictions"}


# ---------------------------------------------------------------- failures leave the tables


def copy_with_broken_shard(run: ExportedRun, target: Path, broken: bytes) -> Path:
    """The run's infer output with a second 'paper' shard of ``broken`` bytes."""
    source = storage.open_published(run.embeddings)
    with storage.staged_output(target, "infer") as staging:
        for path in source.manifest.files:
            staging.write_bytes(path, source.read_bytes(path))
        staging.write_bytes("embeddings/paper/part-00001.parquet", broken)
        staging.publish(counts=source.manifest.counts, metadata=source.manifest.metadata)
    return target


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()


def corrupt_pages(data: bytes) -> bytes:
    """A Parquet file whose footer still reads but whose pages do not decompress."""
    corrupted = bytearray(data)
    footer = int.from_bytes(data[-8:-4], "little")
    for i in range(40, len(data) - 8 - footer - 40):
        corrupted[i] ^= 0x5A
    return bytes(corrupted)


def test_a_failing_load_leaves_the_tables_as_they_were(exported_run: ExportedRun, bigquery_dataset: str, tmp_path) -> None:
    config = with_output(exported_run.config, bigquery=bigquery_dataset, bigquery_write="replace", vector_search=False)
    export(config, exported_run.embeddings, tmp_path / "good", run_id="before")
    shard = pq.read_table(io.BytesIO(storage.open_published(exported_run.embeddings).read_bytes("embeddings/paper/part-00000.parquet")))
    broken = copy_with_broken_shard(exported_run, tmp_path / "infer", corrupt_pages(parquet_bytes(shard)))

    with pytest.raises(GnnflowError) as failure:
        export(config, broken, tmp_path / "bad", run_id="after")
    message = str(failure.value)
    assert "part-00001.parquet" in message and "_gnnflow_staging_paper_embeddings" in message
    assert f"{bigquery_dataset}.paper_embeddings" in message and f"{bigquery_dataset}.paper_predictions" in message
    assert {r["run_id"] for r in rows(f"{bigquery_dataset}.paper_embeddings")} == {"before"}
    assert len(rows(f"{bigquery_dataset}.paper_predictions")) == NUM_NODES
    assert table_names(bigquery_dataset) == {"paper_embeddings", "paper_predictions"}  # staging dropped
    assert not storage.exists(tmp_path / "bad" / "manifest.json")  # nothing published


def test_a_shard_breaking_the_contract_is_named_before_anything_is_loaded(
    exported_run: ExportedRun, bigquery_dataset: str, tmp_path
) -> None:
    config = with_output(exported_run.config, bigquery=bigquery_dataset, vector_search=False)
    wrong = pa.table({"node_id": pa.array(["x"]), "embedding": pa.array([1], pa.int64())})
    broken = copy_with_broken_shard(exported_run, tmp_path / "infer", parquet_bytes(wrong))
    with pytest.raises(GnnflowError, match=r"part-00001\.parquet: column 'embedding' is int64, expected list<float>"):
        export(config, broken, tmp_path / "out")
    assert table_names(bigquery_dataset) == set()


def test_a_failed_commit_rolls_every_table_back(exported_run: ExportedRun, bigquery_dataset: str, tmp_path) -> None:
    """The transaction fails after its first DELETE ran (a staging table vanished): every table is as it was."""
    config = with_output(exported_run.config, bigquery=bigquery_dataset, vector_search=False)
    export(config, exported_run.embeddings, tmp_path / "good", run_id="kept")
    client = bigquery_client(bigquery_dataset.split(".")[0])
    results = read_infer_results(exported_run.embeddings)
    plan = bigquery_out.plan_tables(results, config.output.bigquery_dataset, "replace", "lost")
    with pytest.raises(GnnflowError, match="writing run lost into BigQuery tables .*paper_embeddings.* failed; they are unchanged"):
        with bigquery_out.staging_tables(client, plan):
            bigquery_out.load_staging(client, plan, results)
            client.delete_table(plan.staged[0].table.table_id)
            bigquery_out.commit(client, plan)
    assert {r["run_id"] for r in rows(f"{bigquery_dataset}.paper_embeddings")} == {"kept"}
    assert len(rows(f"{bigquery_dataset}.paper_embeddings")) == NUM_NODES


def test_a_table_of_another_schema_is_refused_and_kept(exported_run: ExportedRun, bigquery_dataset: str, tmp_path) -> None:
    client = bigquery_client(bigquery_dataset.split(".")[0])
    table = f"{bigquery_dataset}.paper_embeddings"
    schema = [bigquery.SchemaField(n, "STRING") for n in ("run_id", "node_id", "embedding")]
    client.create_table(bigquery.Table(table, schema=schema))
    client.insert_rows_json(table, [{"run_id": "theirs", "node_id": "a", "embedding": "[1, 2]"}])
    config = with_output(exported_run.config, bigquery=bigquery_dataset, vector_search=False)
    with pytest.raises(GnnflowError, match=rf"BigQuery table {table} .* column 'embedding' must be REPEATED FLOAT \(NULLABLE STRING\)"):
        export(config, exported_run.embeddings, tmp_path / "out")
    assert rows(table) == [{"run_id": "theirs", "node_id": "a", "embedding": "[1, 2]"}]
    assert table_names(bigquery_dataset) == {"paper_embeddings"}


# ------------------------------------------------------------------------ link prediction


def test_candidates_of_a_link_prediction_output(bigquery_dataset: str, tmp_path) -> None:
    """A hand-built infer output of two node types and retrieval candidates (infer's contract)."""
    assert CANDIDATES_FOLDER == CANDIDATES_DIR  # export finds candidates where infer writes them
    floats = pa.list_(pa.float32())
    resolved = {
        "graph": {
            "nodes": [{"type": "user", "uri": "u.csv"}, {"type": "item", "uri": "i.csv"}],
            "edges": [{"type": "buys", "uri": "e.csv", "src_type": "user", "dst_type": "item"}],
        },
        "task": {"type": "link_prediction"},
    }
    with storage.staged_output(tmp_path / "infer", "infer") as staging:
        staging.write_bytes(
            "embeddings/user/part-00000.parquet",
            parquet_bytes(pa.table({"node_id": ["u1", "u2"], "embedding": pa.array([[1, 0], [0, 1]], floats)})),
        )
        staging.write_bytes(
            "embeddings/item/part-00000.parquet",
            parquet_bytes(pa.table({"node_id": ["i1", "i2", "i3"], "embedding": pa.array([[1, 1]] * 3, floats)})),
        )
        candidates = {
            "node_id": ["u1", "u1", "u2", "u2"],
            "candidate_id": ["i1", "i2", "i3", "i1"],
            "score": pa.array([0.9, 0.5, 0.8, 0.1], pa.float32()),
            "rank": pa.array([1, 2, 1, 2], pa.int32()),
        }
        staging.write_bytes(f"{CANDIDATES_FOLDER}/part-00000.parquet", parquet_bytes(pa.table(candidates)))
        staging.write_bytes("config.resolved.yaml", yaml.safe_dump(resolved).encode())
        staging.write_json("metrics.json", {"mode": "sampled"})
        staging.publish()
    config = parse_config(yaml.safe_dump({**resolved, "output": {"bigquery": bigquery_dataset, "vector_search": True}}), "test")
    published = export(config, tmp_path / "infer", tmp_path / "out", run_id="lp")

    assert table_names(bigquery_dataset) == {"user_embeddings", "item_embeddings", "user_candidates"}
    got = sorted(
        (r["node_id"], r["rank"], r["candidate_id"], round(r["score"], 4), r["run_id"]) for r in rows(f"{bigquery_dataset}.user_candidates")
    )
    assert got == [("u1", 1, "i1", 0.9, "lp"), ("u1", 2, "i2", 0.5, "lp"), ("u2", 1, "i3", 0.8, "lp"), ("u2", 2, "i1", 0.1, "lp")]
    assert len(rows(f"{bigquery_dataset}.item_embeddings")) == 3
    points = [json.loads(line) for line in published.read_bytes("vector_search/embeddings-00000.json").decode().splitlines()]
    assert [(p["id"], p["restricts"]) for p in points] == [
        ("i1", [{"namespace": "node_type", "allow": ["item"]}]),
        ("i2", [{"namespace": "node_type", "allow": ["item"]}]),
        ("i3", [{"namespace": "node_type", "allow": ["item"]}]),
        ("u1", [{"namespace": "node_type", "allow": ["user"]}]),
        ("u2", [{"namespace": "node_type", "allow": ["user"]}]),
    ]
    assert json.loads(published.read_bytes("bigquery.json"))["tables"][f"{bigquery_dataset}.user_candidates"] == {
        "kind": "candidates",
        "node_type": "user",
        "rows": 4,
    }


def test_a_nan_embedding_is_named_for_vector_search(tmp_path) -> None:
    with storage.staged_output(tmp_path / "infer", "infer") as staging:
        table = pa.table({"node_id": ["a", "b"], "embedding": pa.array([[1.0, 2.0], [float("nan"), 0.0]], pa.list_(pa.float32()))})
        staging.write_bytes("embeddings/node/part-00000.parquet", parquet_bytes(table))
        staging.publish()
    config = parse_config(
        yaml.safe_dump(
            {
                "graph": {"nodes": [{"uri": "n.csv"}], "edges": [{"uri": "e.csv"}]},
                "task": {"type": "link_prediction"},
                "output": {"vector_search": True},
            }
        ),
        "t",
    )
    with pytest.raises(GnnflowError, match=r"part-00000\.parquet: node 'b' has a NaN or infinite embedding value"):
        export(config, tmp_path / "infer", tmp_path / "out")
    assert not storage.exists(tmp_path / "out" / "manifest.json")


VECTOR_ONLY = {"graph": {"nodes": [{"uri": "n.csv"}], "edges": [{"uri": "e.csv"}]}, "task": {"type": "link_prediction"}}
FLOATS = pa.list_(pa.float32())


@pytest.mark.parametrize(
    ("shard", "message"),
    [
        (b"not parquet", r"part-00000\.parquet is not a readable Parquet file"),
        (
            parquet_bytes(pa.table({"node_id": ["a"]})),
            r"part-00000\.parquet has no column 'embedding' \(it has node_id\): expected list<float>",
        ),
        (
            parquet_bytes(pa.table({"node_id": ["a"], "embedding": pa.array([[1.0]], FLOATS), "extra": [1]})),
            r"part-00000\.parquet has column 'extra', which infer's embeddings files do not have",
        ),
        (
            parquet_bytes(pa.table({"node_id": ["a", "b"], "embedding": pa.array([[1.0, 2.0], [1.0]], FLOATS)})),
            r"part-00000\.parquet: node 'b' has an embedding of 1 values, the others 2",
        ),
    ],
    ids=["not-parquet", "missing-column", "extra-column", "ragged-embedding"],
)
def test_a_broken_infer_output_is_named(tmp_path, shard: bytes, message: str) -> None:
    with storage.staged_output(tmp_path / "infer", "infer") as staging:
        staging.write_bytes("embeddings/node/part-00000.parquet", shard)
        staging.publish()
    config = parse_config(yaml.safe_dump({**VECTOR_ONLY, "output": {"vector_search": True}}), "t")
    with pytest.raises(GnnflowError, match=message):
        export(config, tmp_path / "infer", tmp_path / "out")
    assert not storage.exists(tmp_path / "out" / "manifest.json")


def test_an_export_without_its_inputs_or_destination_is_refused(tmp_path) -> None:
    config = parse_config(yaml.safe_dump({**VECTOR_ONLY, "output": {"vector_search": True}}), "t")
    with pytest.raises(GnnflowError, match=rf"the embeddings: {tmp_path / 'none'} is not a published output"):
        export(config, tmp_path / "none", tmp_path / "out")
    with storage.staged_output(tmp_path / "infer", "infer") as staging:
        staging.write_bytes(
            "embeddings/node/part-00000.parquet", parquet_bytes(pa.table({"node_id": ["a"], "embedding": pa.array([[1.0]], FLOATS)}))
        )
        staging.publish()
    with pytest.raises(GnnflowError, match=r"run id 'a b' is not allowed"):
        export(config, tmp_path / "infer", tmp_path / "out", run_id="a b")
    nothing = parse_config(yaml.safe_dump(VECTOR_ONLY), "t")
    with pytest.raises(GnnflowError, match="nothing to export: set output.bigquery"):
        export(nothing, tmp_path / "infer", tmp_path / "out")
    assert not storage.exists(tmp_path / "out" / "manifest.json")


# ------------------------------------------------------------------------- vector-index


@pytest.fixture
def index_recorder() -> RecordingServer:
    with RecordingServer() as server:
        add_vector_index_routes(server)
        yield server


INDEXES = r"/v1/projects/demo-project/locations/us-central1/indexes"


def vector_args(recorder: RecordingServer, folder: str, *extra: str) -> list[str]:
    return [
        "vector-index",
        "--project",
        "demo-project",
        "--region",
        "us-central1",
        "--folder",
        folder,
        "--api-endpoint",
        recorder.url,
        *extra,
    ]


def test_vector_index_create_and_update_through_the_sdk(exported_run: ExportedRun, gcs_bucket: str, index_recorder, capsys) -> None:
    config = with_output(exported_run.config, bigquery=None, vector_search=True)
    published = export(config, exported_run.embeddings, f"gs://{gcs_bucket}/export")
    folder = published.manifest.metadata["vector_search"]["folder"]
    assert folder.startswith(f"gs://{gcs_bucket}/export/gen-") and folder.endswith("/vector_search")

    assert gnnflow(vector_args(index_recorder, folder, "--display-name", "papers", "--dimensions", str(HIDDEN))) == 0
    name = capsys.readouterr().out.strip()
    assert name == "projects/demo-project/locations/us-central1/indexes/1"
    [post] = index_recorder.seen("POST", INDEXES)
    assert "authorization" not in post.headers
    body = post.json
    # The REST transport sends enums as their numbers.
    assert body["displayName"] == "papers" and body["indexUpdateMethod"] == Index.IndexUpdateMethod.BATCH_UPDATE.value
    assert body["metadata"]["contentsDeltaUri"] == folder
    assert body["metadata"]["config"]["dimensions"] == HIDDEN
    assert body["metadata"]["config"]["distanceMeasureType"] == "DOT_PRODUCT_DISTANCE"
    assert body["metadata"]["config"]["approximateNeighborsCount"] == 10
    assert body["metadata"]["config"]["algorithmConfig"] == {
        "treeAhConfig": {"leafNodeEmbeddingCount": 1000, "leafNodesToSearchPercent": 10}
    }

    assert gnnflow(vector_args(index_recorder, folder, "--update", "1")) == 0
    [patch] = index_recorder.seen("PATCH", INDEXES + "/1")
    assert patch.query["updateMask"] == ["metadata"]
    assert patch.json["metadata"] == {"contentsDeltaUri": folder, "isCompleteOverwrite": True}


def test_vector_index_refuses_a_folder_vector_search_would_not_read(gcs_bucket: str, index_recorder, capsys) -> None:
    storage.write_text(f"gs://{gcs_bucket}/vs/a.json", "{}\n")
    storage.write_text(f"gs://{gcs_bucket}/vs/extra/b.json", "{}\n")
    args = ("--display-name", "x", "--dimensions", "4")
    assert gnnflow(vector_args(index_recorder, f"gs://{gcs_bucket}/vs", *args)) == 2
    assert "holds a subfolder (extra/b.json)" in capsys.readouterr().err
    assert gnnflow(vector_args(index_recorder, "/tmp/local-folder", *args)) == 2
    assert "--folder must be a gs:// folder" in capsys.readouterr().err
    assert gnnflow(vector_args(index_recorder, f"gs://{gcs_bucket}/vs", "--display-name", "x")) == 2
    assert "creating an index needs --dimensions" in capsys.readouterr().err
    storage.write_text(f"gs://{gcs_bucket}/csv/points.csv", "a,1\n")
    assert gnnflow(vector_args(index_recorder, f"gs://{gcs_bucket}/csv", *args)) == 2
    assert "holds points.csv, not a .json file" in capsys.readouterr().err
    assert gnnflow(vector_args(index_recorder, f"gs://{gcs_bucket}/vs", "--update", "no/such")) == 2
    assert "--update 'no/such' is not an index id" in capsys.readouterr().err
    assert index_recorder.requests == []


# --------------------------------------------------------------------------- bad configs


def test_a_malformed_dataset_is_refused_when_the_config_is_read() -> None:
    base = {
        "graph": {"nodes": [{"type": "paper", "uri": "n.csv"}], "edges": [{"uri": "e.csv", "src_type": "paper", "dst_type": "paper"}]},
        "task": {"type": "link_prediction"},
    }
    with pytest.raises(GnnflowError, match=r"key 'output.bigquery': .*'my-project' is not a BigQuery dataset: expected project.dataset"):
        parse_config(yaml.safe_dump({**base, "output": {"bigquery": "my-project"}}), "c.yaml")
    with pytest.raises(GnnflowError, match=r"key 'output.bigquery_write'"):
        parse_config(yaml.safe_dump({**base, "output": {"bigquery": "proj.ds", "bigquery_write": "merge"}}), "c.yaml")
    dashed = {**base, "graph": {**base["graph"], "nodes": [{"type": "my-paper", "uri": "n.csv"}]}}
    dashed["graph"]["edges"] = [{"uri": "e.csv", "src_type": "my-paper", "dst_type": "my-paper"}]
    with pytest.raises(GnnflowError, match=r"node type 'my-paper' cannot name a BigQuery table"):
        parse_config(yaml.safe_dump({**dashed, "output": {"bigquery": "proj.ds"}}), "c.yaml")
    assert parse_config(yaml.safe_dump({**base, "output": {"bigquery": "bq://proj.ds"}}), "c.yaml").output.bigquery == "proj.ds"


def test_a_missing_dataset_is_named_before_any_step_runs(exported_run: ExportedRun, bigquery_emulator: BigQueryEmulator, tmp_path) -> None:
    config = with_output(exported_run.config, bigquery=f"{bigquery_emulator.project}.no_such_dataset")
    with pytest.raises(
        GnnflowError, match=rf"BigQuery dataset {bigquery_emulator.project}.no_such_dataset \(output.bigquery\) does not exist"
    ):
        run_pipeline(config, storage.parse_uri(tmp_path / "run"))
    assert not (tmp_path / "run" / "preprocessed").exists()


def test_the_compiled_dag_has_an_export_task_only_when_the_config_asks(tmp_path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("output: {vector_search: true}\n")

    def tasks(*args: str) -> dict:
        assert gnnflow(["compile", "-o", str(tmp_path / "p.yaml"), *args]) == 0
        return next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))["root"]["dag"]["tasks"]

    assert "export" not in tasks()
    exporting = tasks("--config", str(config))["export"]
    assert exporting["inputs"]["artifacts"]["embeddings"]["taskOutputArtifact"] == {
        "outputArtifactKey": "embeddings",
        "producerTask": "infer",
    }
    config.write_text("output: {bigquery: nodots}\n")
    assert gnnflow(["compile", "-o", str(tmp_path / "p.yaml"), "--config", str(config)]) == 2
    assert "'nodots' is not a BigQuery dataset" in capsys.readouterr().err


# ------------------------------------------------------------- a cloud run: loads from gs://

_BQ = "/bigquery/v2/projects/demo-project"


def _bigquery_recorder(server: RecordingServer, rows: int) -> None:
    """The BigQuery REST calls of a staging load: create the table, insert the job (done at once), read the table."""
    server.route("POST", rf"{_BQ}/datasets/exports/tables", lambda request, _: (200, request.json))
    server.route(
        "POST",
        rf"{_BQ}/jobs",
        lambda request, _: (200, {**request.json, "status": {"state": "DONE"}, "statistics": {"creationTime": "1"}}),
    )
    server.route(
        "GET", rf"{_BQ}/jobs/(?P<job>[^/]+)", lambda _, match: (200, {"jobReference": {"jobId": match["job"]}, "status": {"state": "DONE"}})
    )
    server.route(
        "GET",
        rf"{_BQ}/datasets/exports/tables/(?P<table>[^/]+)",
        lambda _, match: (
            200,
            {"tableReference": {"projectId": "demo-project", "datasetId": "exports", "tableId": match["table"]}, "numRows": str(rows)},
        ),
    )


def _on_gcs(run: ExportedRun, bucket: str) -> str:
    """The run's infer output published again under ``gs://bucket/infer`` (what a cloud run's infer leaves)."""
    source = storage.open_published(run.embeddings)
    target = f"gs://{bucket}/infer"
    with storage.staged_output(target, "infer") as staging:
        for path in source.manifest.files:
            staging.write_bytes(path, source.read_bytes(path))
        staging.publish(counts=source.manifest.counts, metadata=source.manifest.metadata)
    return target


def _client(server: RecordingServer) -> bigquery.Client:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return bigquery.Client("demo-project", credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=server.url))


def test_results_on_gcs_load_from_their_gs_uris_without_passing_through_export(exported_run: ExportedRun, gcs_bucket: str) -> None:
    """BigQuery reads a cloud run's Parquet files itself: one load job naming their gs:// URIs, no upload."""
    from components.warehouse.table_ref import BigQueryDataset

    results = read_infer_results(_on_gcs(exported_run, gcs_bucket))
    plan = bigquery_out.plan_tables(results, BigQueryDataset("demo-project", "exports"), "replace", "run-1")
    with RecordingServer() as server:
        _bigquery_recorder(server, NUM_NODES)
        bigquery_out.load_staging(_client(server), plan, results)
        [job] = server.seen("POST", rf"{_BQ}/jobs")
        uploads = [r for r in server.requests if r.path.startswith("/upload/")]
    load = job.json["configuration"]["load"]
    shards = results.embeddings["paper"].paths
    assert shards and load["sourceUris"] == [str(results.output.uri(p)) for p in shards]
    assert all(u.startswith(f"gs://{gcs_bucket}/infer/gen-") and u.endswith(".parquet") for u in load["sourceUris"])
    assert load["sourceFormat"] == "PARQUET" and load["destinationTable"]["tableId"].startswith("_gnnflow_staging_paper_embeddings_")
    assert uploads == [] and all(len(r.body) < 4096 for r in server.requests)  # no file's bytes went through the client


def test_a_gcs_file_changed_after_infer_is_refused_before_the_load(exported_run: ExportedRun, gcs_bucket: str) -> None:
    from components.warehouse.table_ref import BigQueryDataset

    root = _on_gcs(exported_run, gcs_bucket)
    results = read_infer_results(root)
    [shard, *_] = results.embeddings["paper"].paths
    original = storage.read_bytes(results.output.uri(shard))
    storage.write_bytes(results.output.uri(shard), original[:-1] + bytes([original[-1] ^ 1]))  # same size, one bit off
    plan = bigquery_out.plan_tables(results, BigQueryDataset("demo-project", "exports"), "replace", "run-1")
    with RecordingServer() as server:
        _bigquery_recorder(server, NUM_NODES)
        with pytest.raises(GnnflowError, match=rf"{results.output.uri(shard)}: CRC32C \w+ differs from the manifest's \w+"):
            bigquery_out.load_staging(_client(server), plan, results)
        assert server.seen("POST", rf"{_BQ}/jobs") == []
