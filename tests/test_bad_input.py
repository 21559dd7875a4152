"""Bad input: a short error naming file and row/column (or key, or URI), a non-zero exit, and
no published output — and a previously published output left intact."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from components import storage
from components.preprocess.__main__ import main as preprocess_main
from components.runtime.entrypoint import run_cli
from components.serialize.__main__ import main as serialize_main
from tests.tiny_graph import EDGES_CSV, NODES_CSV, config_dict, write_tiny_graph


def fails(capsys: pytest.CaptureFixture[str], config: pathlib.Path, output: pathlib.Path) -> str:
    """Runs preprocess; asserts exit 2 and nothing published; returns the error text."""
    code = run_cli(preprocess_main, ["--config", str(config), "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not (output / "manifest.json").exists()
    assert not list(output.glob("gen-*/**/*.parquet")), "a failed run left staged files behind"
    return err.strip().splitlines()[-1]


def test_missing_column(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, label_column="category")
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'nodes.csv'}: missing column 'category'" in err


def test_missing_feature_pattern(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, features=[{"columns": ["y*"]}])
    err = fails(capsys, config, tmp_path / "out")
    assert "missing column 'y*'" in err and "nodes.csv" in err


def test_duplicate_node_id(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, NODES_CSV + "c,red,train,6.0,60,blue\n")
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'nodes.csv'}, row 6, column 'node_id': duplicate node id 'c'" in err
    assert "first seen at" in err and "row 3" in err


def test_unknown_edge_endpoint_is_an_error(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, edges_csv=EDGES_CSV + "a,zz,1.0\n")
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'edges.csv'}, row 6, column 'dst': node id 'zz' is not in node table 'item'" in err


def test_unknown_edge_endpoint_dropped_and_counted(tmp_path):
    raw = config_dict("nodes.csv", "edges.csv")
    raw["graph"]["edges"][0]["on_unknown_endpoint"] = "drop"
    config = write_tiny_graph(tmp_path, edges_csv=EDGES_CSV + "a,zz,1.0\nyy,b,1.0\n", config=raw)
    assert run_cli(preprocess_main, ["--config", str(config), "--output", str(tmp_path / "out")]) == 0
    published = storage.open_published(tmp_path / "out")
    schema = published.read_json("graph_schema.json")["edge_types"]["item__link__item"]
    assert schema["count"] == 5 and schema["dropped_unknown_endpoints"] == 2


def test_label_table_with_an_unknown_endpoint_is_an_error(tmp_path, capsys):
    raw = config_dict("nodes.csv", "edges.csv")
    raw["task"] = {"type": "link_prediction", "target": "link"}
    (tmp_path / "positives.csv").write_text("src,dst,split\na,b,train\nb,qq,test\n")
    raw["graph"]["edges"].append(
        {
            "type": "link_positive",
            "uri": "positives.csv",
            "src_type": "item",
            "dst_type": "item",
            "split_column": "split",
            "role": "positive_label",
        }
    )
    config = write_tiny_graph(tmp_path, config=raw)
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'positives.csv'}, row 2, column 'dst': node id 'qq' is not in node table 'item'" in err


def test_split_value_outside_the_configured_ones(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, NODES_CSV.replace("c,red,val", "c,red,vla"))
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'nodes.csv'}, row 3, column 'split': split value 'vla' is not one of ['train', 'val', 'test']" in err
    assert "task.split.none_values ['', 'none']" in err


def test_split_none_values_are_configurable(tmp_path):
    raw = config_dict("nodes.csv", "edges.csv")
    raw["task"] = {"split": {"none_values": ["", "none", "holdout"]}}
    config = write_tiny_graph(tmp_path, NODES_CSV.replace("e,,none", "e,,holdout"), config=raw)
    assert run_cli(preprocess_main, ["--config", str(config), "--output", str(tmp_path / "out")]) == 0
    schema = storage.open_published(tmp_path / "out").read_json("graph_schema.json")
    assert schema["node_types"]["item"]["split_sizes"] == {"train": 2, "val": 1, "test": 1}


def test_classification_without_labelled_training_nodes(tmp_path, capsys):
    no_labels = "\n".join(",".join([f[0], "", *f[2:]]) for f in (line.split(",") for line in NODES_CSV.strip().splitlines()[1:]))
    config = write_tiny_graph(tmp_path, NODES_CSV.splitlines()[0] + "\n" + no_labels + "\n")
    err = fails(capsys, config, tmp_path / "out")
    assert f"node table {tmp_path / 'nodes.csv'}, column 'label': node classification needs labelled training nodes" in err
    assert "train 0, val 0, test 0" in err
    # Labels, but none on a training row.
    config = write_tiny_graph(tmp_path / "b", NODES_CSV.replace("a,red,train", "a,red,val").replace("b,blue,train", "b,blue,test"))
    err = fails(capsys, config, tmp_path / "b" / "out")
    assert "train 0, val 2, test 2" in err


def test_nan_and_inf_are_errors_by_default(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, NODES_CSV.replace("3.0,30", "inf,30"))
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'nodes.csv'}, row 3, column 'x1': missing, NaN or infinite value" in err
    config = write_tiny_graph(tmp_path / "nan", NODES_CSV.replace("4.0,40", "4.0,NaN"))
    err = fails(capsys, config, tmp_path / "out")
    assert "row 4, column 'x2'" in err


def test_nan_filled_when_configured(tmp_path):
    features = [{"columns": ["x1", "x2"], "transform": "passthrough", "on_missing": "fill", "fill_value": -7.0}]
    config = write_tiny_graph(tmp_path, NODES_CSV.replace("3.0,30", "inf,").replace("1.0,10", ",10"), features=features)
    assert run_cli(preprocess_main, ["--config", str(config), "--output", str(tmp_path / "out")]) == 0
    published = storage.open_published(tmp_path / "out")
    table = pq.read_table(str(published.uri("nodes/item/part-00000.parquet")))
    x = table.column("features").combine_chunks().values.to_numpy().reshape(-1, 2)
    assert x.tolist() == [[-7, 10], [2, 20], [-7, -7], [4, 40], [5, 50]]


def test_text_in_numeric_column(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, NODES_CSV.replace("4.0,40", "4.0,forty"))
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'nodes.csv'}, row 4, column 'x2': 'forty' is not a number" in err


def test_text_in_numeric_parquet_column(tmp_path, capsys):
    pq.write_table(
        pa.table({"node_id": ["a", "b"], "label": ["x", "y"], "split": ["train", "val"], "x1": ["1.5", "oops"]}), tmp_path / "n.parquet"
    )
    (tmp_path / "e.csv").write_text("src,dst\na,b\n")
    raw = config_dict("n.parquet", "e.csv", features=[{"columns": ["x1"]}])
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'n.parquet'}, row 2, column 'x1': 'oops' is not a valid double" in err


@pytest.mark.parametrize("which", ["nodes", "edges"])
def test_empty_table(tmp_path, capsys, which):
    header_only = {"nodes": (NODES_CSV.splitlines()[0] + "\n", EDGES_CSV), "edges": (NODES_CSV, "src,dst,weight\n")}[which]
    config = write_tiny_graph(tmp_path, *header_only)
    err = fails(capsys, config, tmp_path / "out")
    assert f"{which[:-1]} table" in err and f"{which}.csv is empty" in err


def test_zero_byte_table(tmp_path, capsys):
    config = write_tiny_graph(tmp_path, "")
    err = fails(capsys, config, tmp_path / "out")
    assert f"table {tmp_path / 'nodes.csv'} is empty: no header row" in err


def test_truncated_gzip(tmp_path, capsys):
    big = NODES_CSV + "".join(f"n{i},red,train,{i}.0,{i},blue\n" for i in range(20000))
    config = write_tiny_graph(tmp_path, big, gzip_tables=True)
    data = (tmp_path / "nodes.csv.gz").read_bytes()
    (tmp_path / "nodes.csv.gz").write_bytes(data[: len(data) // 2])
    err = fails(capsys, config, tmp_path / "out")
    assert str(tmp_path / "nodes.csv.gz") in err and "truncated" in err


def test_corrupt_parquet(tmp_path, capsys):
    (tmp_path / "n.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 100)
    (tmp_path / "e.csv").write_text("src,dst\na,b\n")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(config_dict("n.parquet", "e.csv", features=[])))
    err = fails(capsys, config, tmp_path / "out")
    assert f"{tmp_path / 'n.parquet'} is not a readable Parquet file" in err


def test_input_uri_does_not_exist(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(config_dict("missing/nodes.csv", "edges.csv")))
    err = fails(capsys, config, tmp_path / "out")
    assert f"input {tmp_path / 'missing/nodes.csv'} does not exist" in err


def test_input_gcs_uri_does_not_exist(tmp_path, capsys, gcs_bucket):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(config_dict(f"gs://{gcs_bucket}/raw/nodes.csv", "edges.csv")))
    err = fails(capsys, config, tmp_path / "out")
    assert f"input gs://{gcs_bucket}/raw/nodes.csv does not exist" in err


def test_unknown_config_key(tmp_path, capsys):
    raw = config_dict("nodes.csv", "edges.csv")
    raw["graph"]["nodes"][0]["features"][0]["tranform"] = "standardize"
    config = write_tiny_graph(tmp_path, config=raw)
    err = fails_text(capsys, config, tmp_path / "out")
    assert f"invalid config {config}" in err
    assert "key 'graph.nodes[0].features[0].tranform': unknown key" in err


def test_wrong_config_type(tmp_path, capsys):
    raw = config_dict("nodes.csv", "edges.csv")
    raw["preprocess"] = {"csv_block_bytes": "lots"}
    config = write_tiny_graph(tmp_path, config=raw)
    err = fails_text(capsys, config, tmp_path / "out")
    assert f"invalid config {config}" in err and "key 'preprocess.csv_block_bytes'" in err and "integer" in err


def fails_text(capsys: pytest.CaptureFixture[str], config: pathlib.Path, output: pathlib.Path) -> str:
    """Like :func:`fails`, but returns the whole error (config errors span lines)."""
    code = run_cli(preprocess_main, ["--config", str(config), "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not (output / "manifest.json").exists()
    return err


def test_failed_rerun_keeps_previous_output(tmp_path, capsys):
    config = write_tiny_graph(tmp_path)
    out = tmp_path / "out"
    assert run_cli(preprocess_main, ["--config", str(config), "--output", str(out)]) == 0
    before = storage.open_published(out)
    (tmp_path / "nodes.csv").write_text(NODES_CSV + "a,red,train,1,1,blue\n")
    assert run_cli(preprocess_main, ["--config", str(config), "--output", str(out)]) == 2
    assert "duplicate node id 'a'" in capsys.readouterr().err
    after = storage.open_published(out)
    assert after.manifest == before.manifest
    assert pq.read_table(str(after.uri("nodes/item/part-00000.parquet"))).num_rows == 5
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", before.manifest.generation])


def test_serialize_refuses_unpublished_input(tmp_path, capsys):
    (tmp_path / "pre" / "gen-x").mkdir(parents=True)
    code = run_cli(serialize_main, ["--input", str(tmp_path / "pre"), "--output", str(tmp_path / "tfr")])
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path / 'pre'} is not a published output: manifest.json is missing" in err
    assert not (tmp_path / "tfr" / "manifest.json").exists()


def test_cli_exit_code_and_message_without_traceback(tmp_path):
    config = write_tiny_graph(tmp_path, NODES_CSV + "c,red,train,6.0,60,blue\n")
    result = subprocess.run(
        [sys.executable, "-m", "components.preprocess", "--config", str(config), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "duplicate node id 'c'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
