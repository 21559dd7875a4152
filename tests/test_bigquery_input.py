"""BigQuery tables (``bq://``) as preprocess input, against the bqemulator on loopback: the same
published bytes as the same rows read from CSV, the row filter, only the needed columns read,
refusals before any step runs, read-time errors naming the row by its id, init-config."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from google.cloud import bigquery

from components import storage
from components.config import GnnflowConfig, SplitSpec, apply_overrides, load_config, parse_config
from components.errors import GnnflowError
from components.preprocess.nodes import open_node_table
from components.preprocess.step import preprocess
from components.tables.bigquery_tables import check_bigquery_inputs
from components.tables.proposal import count_training_rows
from components.tables.reading import tables_fingerprint
from components.warehouse.clients import bigquery_client
from components.warehouse.reading import read_batches, start_read
from components.warehouse.table_ref import parse_table_uri
from pipelines.cli import main as gnnflow
from pipelines.local_run import run_pipeline
from pipelines.run_request import RunRequest, prepare_run
from tests.bigquery_emulator import BigQueryEmulator

# Files read by the published steps' readers whose bytes must match; config.resolved.yaml names the
# sources (paths vs bq:// URIs) and the manifest its generation and time, so they are compared apart.
_SOURCE_NAMING = {"config.resolved.yaml"}


def _bq_type(values: pd.Series) -> str:
    if pd.api.types.is_integer_dtype(values):
        return "INT64"
    if pd.api.types.is_float_dtype(values):
        return "FLOAT64"
    if pd.api.types.is_bool_dtype(values):
        return "BOOL"
    return "STRING"


def _load(dataset: str, name: str, frame: pd.DataFrame) -> str:
    """``frame`` as a BigQuery table (NaN/None cells as NULL); its ``bq://`` URI."""
    client = bigquery_client(dataset.split(".")[0])
    schema = [bigquery.SchemaField(c, _bq_type(frame[c])) for c in frame.columns]
    table = client.create_table(bigquery.Table(f"{dataset}.{name}", schema=schema))
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()} for row in frame.to_dict("records")]
    assert client.insert_rows_json(table, rows) == []
    return f"bq://{dataset}.{name}"


def _csv(folder: Path, name: str, frame: pd.DataFrame) -> str:
    path = folder / f"{name}.csv"
    frame.to_csv(path, index=False)  # None/NaN → empty cell
    return str(path)


def _config(nodes: list[dict], edges: list[dict], **sections: dict) -> GnnflowConfig:
    return parse_config(yaml.safe_dump({"graph": {"nodes": nodes, "edges": edges}, **sections}), "test config")


def _published_bytes(output: Path) -> tuple[dict[str, bytes], dict]:
    published = storage.open_published(storage.parse_uri(str(output)), step="preprocess")
    files = {path: published.read_bytes(path) for path in sorted(published.manifest.files) if path not in _SOURCE_NAMING}
    return files, published.manifest.counts


def _assert_same_output(a: Path, b: Path) -> None:
    files_a, counts_a = _published_bytes(a)
    files_b, counts_b = _published_bytes(b)
    assert counts_a == counts_b
    assert sorted(files_a) == sorted(files_b)
    assert any(p.startswith("nodes/") for p in files_a) and "graph_schema.json" in files_a
    for path in files_a:
        assert files_a[path] == files_b[path], path


def _papers(n: int = 24) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "paper_id": [f"p{i:02d}" for i in range(n)],
            "year": [1990 + (i * 7) % 30 for i in range(n)],  # INT64 → standardized
            "score": [round(0.125 * ((i * 5) % 11) - 0.3, 3) for i in range(n)],
            "venue": [["kdd", "icml", "www", None][i % 4] for i in range(n)],  # missing → filled
            "label": [None if i % 5 == 0 else f"c{i % 3}" for i in range(n)],
            "keep": [i % 3 != 0 for i in range(n)],
            "secret": [f"s{i}" for i in range(n)],  # never configured: never read
        }
    )


def _cites(n: int = 24) -> pd.DataFrame:
    src = [f"p{i:02d}" for i in range(n)] + [f"p{i:02d}" for i in range(0, n, 2)]
    dst = [f"p{(i + 1) % n:02d}" for i in range(n)] + [f"p{(i + 5) % n:02d}" for i in range(0, n, 2)]
    return pd.DataFrame({"src": src, "dst": dst, "weight": [float(i % 4) for i in range(len(src))]})


def _paper_spec(uri: str, **extra: object) -> dict:
    return {
        "type": "paper",
        "uri": uri,
        "id_column": "paper_id",
        "label_column": "label",
        "features": [
            {"columns": ["year", "score"], "transform": "standardize"},
            {"columns": ["venue"], "transform": "one_hot", "on_missing": "fill"},
        ],
        **extra,
    }


def test_a_bigquery_table_preprocesses_to_the_same_bytes_as_the_same_rows_from_csv(bigquery_dataset: str, tmp_path: Path) -> None:
    papers, cites = _papers(), _cites()
    edge = {"type": "cites", "src_type": "paper", "dst_type": "paper", "features": [{"columns": ["weight"]}]}
    from_csv = _config([_paper_spec(_csv(tmp_path, "papers", papers))], [{**edge, "uri": _csv(tmp_path, "cites", cites)}])
    from_bq = _config([_paper_spec(_load(bigquery_dataset, "papers", papers))], [{**edge, "uri": _load(bigquery_dataset, "cites", cites)}])
    preprocess(from_csv, tmp_path / "csv")
    preprocess(from_bq, tmp_path / "bq")
    _assert_same_output(tmp_path / "csv", tmp_path / "bq")
    assert _published_bytes(tmp_path / "bq")[1] == {"nodes.paper": 24, "edges.paper__cites__paper": 36}


def test_heterogeneous_bigquery_tables_with_a_split_column_match_csv(bigquery_dataset: str, tmp_path: Path) -> None:
    papers = _papers().assign(split=[["train", "val", "test", "train"][i % 4] for i in range(24)])
    authors = pd.DataFrame({"author_id": list(range(100, 110))})  # INT64 ids, no features
    writes = pd.DataFrame({"author_id": [100 + i % 10 for i in range(30)], "paper_id": [f"p{i % 24:02d}" for i in range(30)]})
    cites = _cites()

    def config(uris: dict[str, str]) -> GnnflowConfig:
        return _config(
            [_paper_spec(uris["papers"], split_column="split"), {"type": "author", "uri": uris["authors"], "id_column": "author_id"}],
            [
                {"type": "cites", "uri": uris["cites"], "src_type": "paper", "dst_type": "paper"},
                {
                    "type": "writes",
                    "uri": uris["writes"],
                    "src_type": "author",
                    "dst_type": "paper",
                    "src_column": "author_id",
                    "dst_column": "paper_id",
                },
            ],
            task={"target": "paper"},
        )

    frames = {"papers": papers, "authors": authors, "writes": writes, "cites": cites}
    preprocess(config({name: _csv(tmp_path, name, frame) for name, frame in frames.items()}), tmp_path / "csv")
    preprocess(config({name: _load(bigquery_dataset, name, frame) for name, frame in frames.items()}), tmp_path / "bq")
    _assert_same_output(tmp_path / "csv", tmp_path / "bq")
    counts = _published_bytes(tmp_path / "bq")[1]
    assert counts == {"nodes.paper": 24, "nodes.author": 10, "edges.paper__cites__paper": 36, "edges.author__writes__paper": 30}


def _nodes_by_id(output: Path, node_type: str) -> tuple[dict[int, str], pd.DataFrame]:
    """The published id map (node id → original id) and node rows (sorted by node id) of a type."""
    published = storage.open_published(storage.parse_uri(str(output)), step="preprocess")

    def frame(folder: str) -> pd.DataFrame:
        parts = [pq.read_table(pa.BufferReader(published.read_bytes(p))).to_pandas() for p in published.files_under(folder)]
        return pd.concat(parts).sort_values("node_id", ignore_index=True)

    ids = frame(f"id_maps/{node_type}")
    return dict(zip(ids["node_id"], ids["original_id"])), frame(f"nodes/{node_type}")


def test_node_ids_follow_the_ids_values_not_the_order_rows_are_read_in(bigquery_dataset: str, tmp_path: Path) -> None:
    """The same rows stored (and so read) in two orders give the same ids: a node's id is its id's
    place in value order (INT64 ids as numbers: 9 before 10), however BigQuery hands the rows on."""
    papers = _papers()
    authors = pd.DataFrame({"author_id": [10, 9, 100, 2, 31, 7, 1000, 55], "age": [float(a % 13) for a in range(8)]})
    writes = pd.DataFrame({"author_id": [[10, 9, 100, 2, 31, 7, 1000, 55][i % 8] for i in range(24)], "paper_id": list(papers["paper_id"])})

    def config(uris: dict[str, str]) -> GnnflowConfig:
        return _config(
            [
                _paper_spec(uris["papers"]),
                {"type": "author", "uri": uris["authors"], "id_column": "author_id", "features": [{"columns": ["age"]}]},
            ],
            [
                {
                    "type": "writes",
                    "uri": uris["writes"],
                    "src_type": "author",
                    "dst_type": "paper",
                    "src_column": "author_id",
                    "dst_column": "paper_id",
                }
            ],
            task={"target": "paper"},
        )

    orders = {"stored": {}, "shuffled": {}}
    for seed, (name, uris) in enumerate(orders.items()):
        for table, frame in (("papers", papers), ("authors", authors), ("writes", writes)):
            rows = frame if name == "stored" else frame.sample(frac=1, random_state=seed + 7).reset_index(drop=True)
            uris[table] = _load(bigquery_dataset, f"{table}_{name}", rows)
    first = start_read(parse_table_uri(orders["shuffled"]["papers"]), ["paper_id"], None, max_streams=1)
    read_order = pa.concat_arrays([b.column(0) for b in read_batches(first)]).to_pylist()
    assert read_order != sorted(read_order)  # the emulator hands the shuffled table on in its stored order
    for name, uris in orders.items():
        preprocess(config(uris), tmp_path / name)
    for node_type, expected in (("paper", sorted(papers["paper_id"])), ("author", [str(a) for a in sorted(authors["author_id"])])):
        stored_ids, stored_rows = _nodes_by_id(tmp_path / "stored", node_type)
        shuffled_ids, shuffled_rows = _nodes_by_id(tmp_path / "shuffled", node_type)
        assert stored_ids == shuffled_ids == dict(enumerate(expected))
        pd.testing.assert_frame_equal(stored_rows, shuffled_rows)  # features, labels and splits node by node
    assert _published_bytes(tmp_path / "stored")[1] == _published_bytes(tmp_path / "shuffled")[1]
    # The Beam engine (which sorts the rows by value itself) numbers the shuffled tables' nodes the same.
    beam = apply_overrides(config(orders["shuffled"]), {"preprocess.engine": "beam", "preprocess.beam.num_workers": 1})
    preprocess(beam, tmp_path / "beam")
    for node_type in ("paper", "author"):
        local_ids, local_rows = _nodes_by_id(tmp_path / "shuffled", node_type)
        beam_ids, beam_rows = _nodes_by_id(tmp_path / "beam", node_type)
        assert beam_ids == local_ids
        pd.testing.assert_frame_equal(beam_rows, local_rows)


def test_the_row_filter_reads_only_matching_rows(bigquery_dataset: str, tmp_path: Path) -> None:
    papers, cites = _papers(), _cites()
    kept = papers[papers["keep"]]
    kept_ids = set(kept["paper_id"])
    kept_cites = cites[cites["src"].isin(kept_ids) & cites["dst"].isin(kept_ids)]
    edge = {"type": "cites", "src_type": "paper", "dst_type": "paper"}
    from_csv = _config([_paper_spec(_csv(tmp_path, "papers", kept))], [{**edge, "uri": _csv(tmp_path, "cites", kept_cites)}])
    cites_filter = f"src IN ({', '.join(repr(i) for i in sorted(kept_ids))}) AND dst IN ({', '.join(repr(i) for i in sorted(kept_ids))})"
    from_bq = _config(
        [_paper_spec(_load(bigquery_dataset, "papers", papers), row_filter="keep")],
        [{**edge, "uri": _load(bigquery_dataset, "cites", cites), "row_filter": cites_filter}],
    )
    preprocess(from_csv, tmp_path / "csv")
    preprocess(from_bq, tmp_path / "bq")
    _assert_same_output(tmp_path / "csv", tmp_path / "bq")
    assert _published_bytes(tmp_path / "bq")[1]["nodes.paper"] == len(kept) == 16


def test_only_the_configured_columns_are_read(bigquery_dataset: str) -> None:
    uri = _load(bigquery_dataset, "papers", _papers())
    config = _config(
        [_paper_spec(uri)], [{"uri": uri, "src_column": "paper_id", "dst_column": "paper_id", "src_type": "paper", "dst_type": "paper"}]
    )
    source, groups = open_node_table(config.graph.nodes[0])
    assert source.bigquery is not None and source.bigquery.columns == ("paper_id", "label", "year", "score", "venue")
    chunks = list(source.chunks(config.preprocess))
    assert [c.table.column_names for c in chunks] == [["paper_id", "label", "year", "score", "venue"]]  # no 'keep', no 'secret'
    assert chunks[0].table.schema.field("year").type == pa.float64()  # INT64 read as the configured numeric type
    assert groups == [["year", "score"], ["venue"]]


def test_streams_are_read_concurrently_but_handed_on_in_stream_order(bigquery_emulator: BigQueryEmulator, bigquery_dataset: str) -> None:
    # Over ~1 MB of selected data the emulator splits a session into several streams.
    client = bigquery_client(bigquery_emulator.project)
    client.query(
        f"CREATE TABLE `{bigquery_dataset}.big` AS SELECT i AS id, REPEAT('x', 40) AS pad FROM UNNEST(GENERATE_ARRAY(0, 29999)) AS i"
    ).result()
    session = start_read(parse_table_uri(f"bq://{bigquery_dataset}.big"), ["id", "pad"], None, max_streams=4)
    assert len(session.streams) == 4
    ids = pa.concat_arrays([b.column(0) for b in read_batches(session, concurrency=4)]).to_pylist()
    assert ids == list(range(30000))


def test_the_fingerprint_changes_when_a_table_gains_rows(bigquery_dataset: str) -> None:
    uri = _load(bigquery_dataset, "papers", _papers(4))
    config = _config(
        [_paper_spec(uri)], [{"uri": uri, "src_column": "paper_id", "dst_column": "paper_id", "src_type": "paper", "dst_type": "paper"}]
    )
    before = tables_fingerprint(config.graph)
    assert tables_fingerprint(config.graph) == before
    bigquery_client(bigquery_dataset.split(".")[0]).insert_rows_json(f"{bigquery_dataset}.papers", [{"paper_id": "new", "year": 2000}])
    assert tables_fingerprint(config.graph) != before


# ----------------------------------------------------------------------------- refused up front


@pytest.fixture
def typed_table(bigquery_emulator: BigQueryEmulator, bigquery_dataset: str) -> str:
    """A one-row table with a column of each awkward type."""
    bigquery_client(bigquery_emulator.project).query(
        f"CREATE TABLE `{bigquery_dataset}.odd` AS SELECT 'a' AS id, 1.5 AS f, 'text' AS name, [1.5, 2.5] AS arr, "
        "STRUCT(1 AS a) AS st, DATE '2020-01-01' AS day, 'train' AS split"
    ).result()
    return f"bq://{bigquery_dataset}.odd"


def _one_node_table(uri: str, **node: object) -> GnnflowConfig:
    """One node table whose rows are also its (self-loop) edges: link prediction needs no label column."""
    return _config(
        [{"uri": uri, "id_column": "id", **node}],
        [{"uri": uri, "src_column": "id", "dst_column": "id"}],
        task={"type": "link_prediction"},
    )


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            {"features": [{"columns": ["name"], "transform": "standardize"}]},
            "column 'name' is STRING, but the config uses it as the numeric feature (transform standardize), which needs one of INT64",
        ),
        (
            {"features": [{"columns": ["arr"]}]},
            "column 'arr' is ARRAY<FLOAT64>, but the config uses it as the numeric feature (transform passthrough), which needs one of "
            "INT64, FLOAT64, NUMERIC, BIGNUMERIC, BOOL (a single value per row)",
        ),
        (
            {"features": [{"columns": ["st"], "transform": "one_hot"}]},
            "column 'st' is STRUCT, but the config uses it as the categorical feature",
        ),
        (
            {"label_column": "day"},
            "column 'day' is DATE, but the config uses it as the label column, which needs one of STRING, INT64, BOOL",
        ),
        ({"id_column": "f"}, "column 'f' is FLOAT64, but the config uses it as the node id column, which needs one of STRING, INT64"),
        ({"features": [{"columns": ["missing"]}]}, "missing column 'missing'"),
        ({"split_column": "nope"}, "missing column 'nope' (the table has: id, f, name, arr, st, day, split)"),
        ({"row_filter": "nope > 1"}, "cannot start a Storage Read session with row_filter 'nope > 1'"),
    ],
)
def test_columns_that_do_not_fit_are_refused_naming_table_column_and_type(typed_table: str, node: dict, message: str) -> None:
    with pytest.raises(GnnflowError) as caught:
        check_bigquery_inputs(_one_node_table(typed_table, **node))
    assert typed_table in str(caught.value) and message in str(caught.value)


@pytest.mark.parametrize("table", ["{dataset}.nope", "{project}.no_such_dataset.t", "other-project.{name}.t"])
def test_a_missing_table_dataset_or_project_is_an_error_naming_the_uri(bigquery_dataset: str, table: str) -> None:
    project, name = bigquery_dataset.split(".")
    uri = "bq://" + table.format(dataset=bigquery_dataset, project=project, name=name)
    with pytest.raises(GnnflowError, match=f"BigQuery table {uri} does not exist"):
        check_bigquery_inputs(_one_node_table(uri))


def test_a_local_run_refuses_a_bad_column_before_any_step(typed_table: str, tmp_path: Path) -> None:
    config = _one_node_table(typed_table, features=[{"columns": ["name"], "transform": "standardize"}])
    with pytest.raises(GnnflowError, match="column 'name' is STRING"):
        run_pipeline(config, storage.parse_uri(str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_the_beam_engine_takes_bigquery_tables_and_the_same_up_front_checks(typed_table: str) -> None:
    def beam(**node: object) -> GnnflowConfig:
        return _config(
            [{"uri": typed_table, "id_column": "id", **node}],
            [{"uri": typed_table, "src_column": "id", "dst_column": "id"}],
            task={"type": "link_prediction"},
            preprocess={"engine": "beam"},
        )

    check_bigquery_inputs(beam())  # the Beam engine reads bq:// tables (tests/test_bigquery_beam.py)
    with pytest.raises(GnnflowError, match="column 'name' is STRING"):
        check_bigquery_inputs(beam(features=[{"columns": ["name"], "transform": "standardize"}]))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"uri": "bq://p.d.t", "format": "csv"}, "uri 'bq://p.d.t' is a BigQuery table: format must be auto"),
        ({"uri": "nodes.csv", "row_filter": "a > 1"}, "row_filter is for BigQuery tables"),
    ],
)
def test_format_and_row_filter_fit_the_uri_or_the_config_is_refused(table: dict, message: str) -> None:
    with pytest.raises(GnnflowError, match=message):
        _config([table], [{"uri": "/tmp/edges.csv"}])


# ----------------------------------------------------------------------------- read-time errors


@pytest.mark.parametrize(
    ("papers", "cites", "message"),
    [
        (
            _papers(4).assign(paper_id=["p00", None, "p02", "p03"]),
            None,
            "column 'paper_id': NULL or empty node id in 1 row(s) of this chunk (find them with WHERE paper_id IS NULL",
        ),
        (
            _papers(4).assign(paper_id=["p00", "p01", "p01", "p03"]),
            None,
            "column 'paper_id': duplicate node id 'p01' (in at least two rows)",
        ),
        (
            _papers(4).assign(score=[0.5, float("nan"), 1.0, 2.0]),
            None,
            "the row where paper_id = 'p01', column 'score': missing, NaN or infinite value",
        ),
        (
            _papers(4).assign(label=["c0", "c1", "c0", "c1"], year=[1990, 1991, 1992, 1993]),
            pd.DataFrame({"src": ["p00", "p01"], "dst": ["p01", "zz"]}),
            "the row where src = 'p01' and dst = 'zz', column 'dst': node id 'zz' is not in node table 'paper'",
        ),
    ],
)
def test_bad_values_are_errors_naming_table_column_and_the_rows_id(
    bigquery_dataset: str, tmp_path: Path, papers: pd.DataFrame, cites: pd.DataFrame | None, message: str
) -> None:
    nodes = _load(bigquery_dataset, "papers", papers)
    edges = _load(bigquery_dataset, "cites", cites if cites is not None else _cites(4))
    config = _config([_paper_spec(nodes)], [{"uri": edges, "src_type": "paper", "dst_type": "paper"}])
    with pytest.raises(GnnflowError) as caught:
        preprocess(config, tmp_path / "out")
    assert f"bq://{bigquery_dataset}." in str(caught.value) and message in str(caught.value)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_infinite_feature_from_a_query_is_named_by_its_row(
    bigquery_emulator: BigQueryEmulator, bigquery_dataset: str, tmp_path: Path
) -> None:
    client = bigquery_client(bigquery_emulator.project)
    client.query(
        f"CREATE TABLE `{bigquery_dataset}.n` AS SELECT id, IF(id = 2, CAST('inf' AS FLOAT64), 1.0 * id) AS x FROM UNNEST([1, 2, 3]) AS id"
    ).result()
    config = _one_node_table(f"bq://{bigquery_dataset}.n", features=[{"columns": ["x"]}])
    with pytest.raises(GnnflowError, match=r"\.n, the row where id = '2', column 'x': missing, NaN or infinite value"):
        preprocess(config, tmp_path / "out")


# ----------------------------------------------------------------------------- init-config


def test_init_config_proposes_from_the_table_schema_and_first_rows(bigquery_dataset: str, tmp_path: Path) -> None:
    nodes = _load(bigquery_dataset, "papers", _papers().drop(columns=["secret", "keep"]))
    edges = _load(bigquery_dataset, "cites", _cites())
    out = tmp_path / "config.yaml"
    argv = ["init-config", "--nodes", f"paper={nodes}", "--edges", edges, "--id-column", "paper_id", "--label-column", "label"]
    assert gnnflow([*argv, "--src-column", "src", "--dst-column", "dst", "-o", str(out)]) == 0
    config = load_config(str(out))
    node = config.graph.nodes[0]
    assert node.uri == nodes and config.graph.edges[0].uri == edges
    assert [(f.columns, f.transform, f.on_missing) for f in node.features] == [
        (["year", "score"], "standardize", "error"),
        (["venue"], "one_hot", "fill"),
    ]
    assert [(f.columns, f.transform) for f in config.graph.edges[0].features] == [(["weight"], "standardize")]
    # Training rows, counted from the table: labelled nodes (19 of 24) times the random split's 0.8; every edge.
    reading = config.preprocess
    assert count_training_rows(nodes, "label", None, SplitSpec(), reading, enough=1000) == pytest.approx(0.8 * 19)
    assert count_training_rows(edges, None, None, SplitSpec(), reading, enough=1000) == pytest.approx(0.8 * 36)
    check_bigquery_inputs(config)  # what it proposes passes the up-front checks


def test_a_pipeline_submission_takes_bigquery_tables_and_refuses_a_bad_column_before_sending(bigquery_dataset: str, tmp_path: Path) -> None:
    uri = _load(bigquery_dataset, "papers", _papers(6))
    edges = _load(bigquery_dataset, "cites", _cites(6))
    raw = {"graph": {"nodes": [_paper_spec(uri)], "edges": [{"uri": edges, "src_type": "paper", "dst_type": "paper"}]}}
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(raw))
    version = prepare_run(RunRequest(config=str(good))).parameters["data_version"]
    assert version == "sha256:" + tables_fingerprint(load_config(str(good)).graph)
    raw["graph"]["nodes"][0]["features"] = [{"columns": ["venue"], "transform": "standardize"}]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(GnnflowError, match=f"{uri}, column 'venue' is STRING, but the config uses it as the numeric feature"):
        prepare_run(RunRequest(config=str(bad)))
