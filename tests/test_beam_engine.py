"""``preprocess.engine: beam``: the same published outputs as the one-process engine, the same
errors for bad input, and nothing published when the Beam pipeline finds one.

Beam runs for real: the portable FnApiRunner with 2 worker processes, reading and writing on
local paths and on the GCS emulator."""

from __future__ import annotations

import gzip
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from components import storage
from components.config import GnnflowConfig, apply_overrides, load_config
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from tests.test_bad_input import fails
from tests.test_citeseer import CITESEER, check_citeseer, needs_citeseer
from tests.tiny_graph import EDGES_CSV, NODES_CSV, config_dict, write_tiny_graph

BEAM = {"preprocess.engine": "beam", "preprocess.beam.num_workers": 2}


def same_files(a: storage.PublishedOutput, b: storage.PublishedOutput) -> None:
    """Every published file but the config (which names the engine) is byte for byte the same."""
    left = {k: v for k, v in a.manifest.files.items() if k != "config.resolved.yaml"}
    right = {k: v for k, v in b.manifest.files.items() if k != "config.resolved.yaml"}
    assert sorted(left) == sorted(right)
    assert [k for k in left if left[k] != right[k]] == []
    assert a.manifest.counts == b.manifest.counts


def run_both(config: GnnflowConfig, root: str) -> tuple[storage.PublishedOutput, storage.PublishedOutput]:
    """preprocess + serialize with each engine; returns the two serialized outputs."""
    outputs = []
    for engine, overrides in (("local", {}), ("beam", BEAM)):
        c = apply_overrides(config, overrides)
        pre = preprocess(c, f"{root}/{engine}/preprocessed")
        outputs.append((pre, serialize(c, f"{root}/{engine}/preprocessed", f"{root}/{engine}/tfrecords")))
    (pre_local, ser_local), (pre_beam, ser_beam) = outputs
    same_files(pre_local, pre_beam)
    same_files(ser_local, ser_beam)
    return ser_local, ser_beam


citeseer = needs_citeseer


def citeseer_config(nodes: str, edges: str) -> GnnflowConfig:
    raw = {
        "graph": {
            "nodes": [
                {
                    "type": "node",
                    "uri": nodes,
                    "label_column": "label",
                    "split_column": "split",
                    "features": [{"columns": ["f*"], "transform": "row_normalize"}],
                }
            ],  # a transform that reads every word column of a row
            "edges": [{"type": "edge", "uri": edges}],
        },
        "task": {"split": {"train_value": "train", "val_value": "val", "test_value": "test"}},
    }
    return GnnflowConfig.model_validate(raw)


@citeseer
def test_citeseer_on_gcs(tmp_path, gcs_bucket):
    """Both engines on CiteSeer read from gs:// (the local-path reading is the other tests' small graphs)."""
    import pandas as pd

    raw = f"gs://{gcs_bucket}/raw"
    storage.upload_file(CITESEER / "nodes.csv.gz", f"{raw}/nodes.csv.gz")
    storage.upload_file(CITESEER / "edges.csv.gz", f"{raw}/edges.csv.gz")
    ser_local, ser_beam = run_both(citeseer_config(f"{raw}/nodes.csv.gz", f"{raw}/edges.csv.gz"), f"gs://{gcs_bucket}/run")
    assert str(ser_beam.root) == f"gs://{gcs_bucket}/run/beam/tfrecords"
    assert ser_beam.manifest.counts == {"nodes.node": 3327, "edges.node__edge__node": 4552}
    csv = pd.read_csv(CITESEER / "nodes.csv.gz", dtype={"node_id": str, "label": str, "split": str})
    check_citeseer(ser_beam, csv, tmp_path / "read", row_normalized=True)  # per original id: features, label, split; edges


def write_sharded_graph(folder: pathlib.Path, seed: int = 0) -> dict:
    """Two node types in several files (CSV and gzipped CSV, many chunks each), edges of two
    types with features and unknown endpoints to drop: a config for link prediction."""
    rng = np.random.default_rng(seed)
    users = [f"u{i}" for i in rng.permutation(900)]
    items = [str(i * 7 + 3) for i in rng.permutation(400)]  # numeric-looking ids, kept as text
    (folder / "users").mkdir(parents=True)
    (folder / "items").mkdir()
    (folder / "clicks").mkdir()
    for k, part in enumerate(np.array_split(np.asarray(users), 3)):
        lines = ["id,age,country"] + [f"{u},{rng.integers(18, 80)},{rng.choice(['de', 'fr', 'us', ''])}" for u in part]
        data = ("\n".join(lines) + "\n").encode()
        name = folder / "users" / f"part-{k}.csv"
        name.with_suffix(".csv.gz").write_bytes(gzip.compress(data)) if k == 1 else name.write_bytes(data)
    pq.write_table(pa.table({"item": items, "price": rng.random(len(items)) * 100}), folder / "items.parquet")
    for k in range(4):
        src = rng.choice(users, 700).tolist() + ["ghost"]
        dst = rng.choice(items, 700).tolist() + ["404"]
        rows = ["user,item,weight"] + [f"{s},{d},{w:.3f}" for s, d, w in zip(src, dst, rng.random(len(src)))]
        (folder / "clicks" / f"clicks-{k}.csv").write_text("\n".join(rows) + "\n")
    (folder / "follows.csv").write_text("a,b\n" + "".join(f"{a},{b}\n" for a, b in zip(rng.choice(users, 500), rng.choice(users, 500))))
    return {
        "graph": {
            "nodes": [
                {
                    "type": "user",
                    "uri": str(folder / "users"),
                    "id_column": "id",
                    "features": [
                        {"columns": ["age"], "transform": "standardize"},
                        {"columns": ["country"], "transform": "one_hot", "on_missing": "fill"},
                    ],
                },
                {
                    "type": "item",
                    "uri": str(folder / "items.parquet"),
                    "id_column": "item",
                    "features": [{"columns": ["price"], "transform": "standardize"}],
                },
            ],
            "edges": [
                {
                    "type": "clicked",
                    "uri": str(folder / "clicks"),
                    "src_column": "user",
                    "dst_column": "item",
                    "src_type": "user",
                    "dst_type": "item",
                    "on_unknown_endpoint": "drop",
                    "features": [{"columns": ["weight"], "transform": "standardize"}],
                },
                {
                    "type": "follows",
                    "uri": str(folder / "follows.csv"),
                    "src_column": "a",
                    "dst_column": "b",
                    "src_type": "user",
                    "dst_type": "user",
                },
            ],
        },
        "task": {"type": "link_prediction", "target": "clicked", "split": {"train": 0.7, "val": 0.15, "test": 0.15}},
        # Small chunks: every file is read in several chunks, and the join has many buckets.
        "preprocess": {"csv_block_bytes": 1024, "parquet_batch_rows": 64, "beam": {"join_buckets": 7}},
        "serialize": {"num_shards": 3},
    }


def test_sharded_heterogeneous_graph_same_outputs(tmp_path):
    raw = write_sharded_graph(tmp_path / "tables")
    # Rows written in their stored type (serialize encodes them): the engines agree on those bytes too.
    for entry, storage_type in zip([*raw["graph"]["nodes"], raw["graph"]["edges"][0]], ["int8", "bfloat16", "float16"]):
        entry["feature_storage"] = storage_type
    config = GnnflowConfig.model_validate(raw)
    ser_local, ser_beam = run_both(config, str(tmp_path / "out"))
    schema = ser_beam.read_json("graph_metadata.json")
    layouts = schema["record_format"]
    assert [layouts[k][t].get("features_encoding") for k in ("node_types", "edge_types") for t in layouts[k]] == ["stored_bytes"] * 3 + [
        None
    ]
    assert layouts["edge_types"]["user__follows__user"] == {
        "int64": {"edge_id": 1, "src": 1, "dst": 1},
        "float": {},
        "constant": {"split": -1},
    }
    clicked = schema["edge_types"]["user__clicked__item"]
    assert clicked["dropped_unknown_endpoints"] == 4 and clicked["count"] == 2800
    assert sum(clicked["split_sizes"].values()) == 2800 and clicked["split_sizes"]["train"] > 1500
    assert schema["node_types"]["user"]["count"] == 900 and len(schema["node_types"]["user"]["id_map_files"]) > 3
    assert [len(t["files"]) for t in schema["node_types"].values()] == [3, 3]


# ----------------------------------------------------------------------------- bad input


def _duplicate_in_second_file(folder: pathlib.Path) -> pathlib.Path:
    (folder / "nodes").mkdir(parents=True)
    (folder / "nodes" / "a.csv").write_text(NODES_CSV)
    (folder / "nodes" / "b.csv").write_text(NODES_CSV.splitlines()[0] + "\nf,red,train,1,1,blue\nc,red,train,1,1,blue\n")
    (folder / "edges.csv").write_text(EDGES_CSV)
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(config_dict("nodes", "edges.csv")))
    return config


BAD_INPUTS = {
    "duplicate id": lambda d: write_tiny_graph(d, NODES_CSV + "c,red,train,6.0,60,blue\n"),
    "duplicate id in another file": _duplicate_in_second_file,
    "unknown endpoint": lambda d: write_tiny_graph(d, edges_csv=EDGES_CSV + "a,zz,1.0\n"),
    "infinite value": lambda d: write_tiny_graph(d, NODES_CSV.replace("3.0,30", "inf,30")),
    "text in a number column": lambda d: write_tiny_graph(d, NODES_CSV.replace("4.0,40", "4.0,forty")),
    "empty id": lambda d: write_tiny_graph(d, NODES_CSV.replace("d,blue", ",blue")),
    "empty node table": lambda d: write_tiny_graph(d, NODES_CSV.splitlines()[0] + "\n"),
    "empty edge table": lambda d: write_tiny_graph(d, edges_csv="src,dst,weight\n"),
    "missing column": lambda d: write_tiny_graph(d, label_column="category"),
    "no labelled training node": lambda d: write_tiny_graph(
        d, NODES_CSV.replace("a,red,train", "a,red,val").replace("b,blue,train", "b,blue,test")
    ),
    "split value typo": lambda d: write_tiny_graph(d, NODES_CSV.replace("c,red,val", "c,red,vla")),
    "truncated gzip": lambda d: _truncated(
        write_tiny_graph(d, NODES_CSV + "".join(f"n{i},red,train,{i}.0,{i},blue\n" for i in range(20000)), gzip_tables=True)
    ),
}


def _truncated(config: pathlib.Path) -> pathlib.Path:
    table = config.parent / "nodes.csv.gz"
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    return config


def with_beam(config: pathlib.Path, workers: int = 2) -> pathlib.Path:
    """A copy of the config beside it (relative table paths still resolve) with engine beam and
    ``workers`` Beam workers (1: Beam's in-process runner; more: worker processes)."""
    raw = yaml.safe_load(config.read_text())
    raw.setdefault("preprocess", {})["engine"] = "beam"
    raw["preprocess"].setdefault("beam", {})["num_workers"] = workers
    beam = config.with_name("config.beam.yaml")
    beam.write_text(yaml.safe_dump(raw))
    return beam


# Errors raised in Beam's worker processes, which must reach the step's message unchanged; the
# other cases run Beam's in-process runner (the same transforms, no process to start).
IN_WORKER_PROCESSES = {"duplicate id in another file", "truncated gzip", "text in a number column"}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_same_error_under_beam(tmp_path, capsys, case):
    config = BAD_INPUTS[case](tmp_path / "tables")
    local = fails(capsys, config, tmp_path / "local")
    beam = fails(capsys, with_beam(config, workers=2 if case in IN_WORKER_PROCESSES else 1), tmp_path / "beam")
    assert beam == local
    assert str(tmp_path / "tables") in beam  # names the file


def test_fitted_state_reused_under_beam(tmp_path):
    config = load_config(str(write_tiny_graph(tmp_path / "tables")))
    first = preprocess(config, tmp_path / "first")
    state = first.read_json("transform_state.json")
    local = preprocess(config, tmp_path / "local", state)
    beam = preprocess(apply_overrides(config, BEAM), tmp_path / "beam", state)
    same_files(local, beam)


def test_inference_only_data_with_fitted_state_under_beam(tmp_path):
    """New data run through an earlier run's transforms may hold no training rows at all."""
    config = load_config(str(write_tiny_graph(tmp_path / "tables")))
    state = preprocess(config, tmp_path / "first").read_json("transform_state.json")
    new_nodes = "node_id,label,split,x1,x2,color\nq,red,test,3.0,30,purple\nr,blue,test,100.0,0,blue\n"
    new = load_config(str(write_tiny_graph(tmp_path / "new", new_nodes, "src,dst,weight\nq,r,1\n")))
    same_files(preprocess(new, tmp_path / "local", state), preprocess(apply_overrides(new, BEAM), tmp_path / "beam", state))
