"""Step preprocess: enumeration, transforms, labels, splits, heterogeneous graphs, chunking."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from components import storage
from components.config import SplitSpec, load_config
from components.errors import GnnflowError
from components.preprocess.step import check_fitted_state, load_fitted_state, preprocess
from components.tables.transforms import encode_splits
from tests.tiny_graph import EDGES_CSV, NODES_CSV, config_dict, write_tiny_graph


def read_folder(published: storage.PublishedOutput, folder: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(io.BytesIO(published.read_bytes(f))) for f in published.files_under(folder))


def node_features(published: storage.PublishedOutput, node_type: str) -> np.ndarray:
    table = read_folder(published, f"nodes/{node_type}")
    dim = table.schema.field("features").type.list_size
    return table.column("features").combine_chunks().values.to_numpy().reshape(-1, dim)


def test_tiny_graph_values(tmp_path):
    config = load_config(write_tiny_graph(tmp_path))
    published = preprocess(config, tmp_path / "out")
    nodes = read_folder(published, "nodes/item")
    assert nodes.column("node_id").to_pylist() == [0, 1, 2, 3, 4]
    x = node_features(published, "item")
    # x1, x2 standardized with population statistics; then color one-hot over sorted categories + other.
    x1 = np.array([1, 2, 3, 4, 5.0])
    np.testing.assert_allclose(x[:, 0], (x1 - x1.mean()) / x1.std(), rtol=1e-6)
    np.testing.assert_allclose(x[:, 1], (10 * x1 - 10 * x1.mean()) / (10 * x1.std()), rtol=1e-6)
    assert x[:, 2:].tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]]
    schema = published.read_json("graph_schema.json")["node_types"]["item"]
    assert schema["feature_names"] == ["x1", "x2", "color=blue", "color=green", "color=red", "color=<other>"]
    assert schema["label_vocabulary"] == ["blue", "red"]
    assert nodes.column("label").to_pylist() == [1, 0, 1, 0, -1]
    assert nodes.column("split").to_pylist() == [0, 0, 1, 2, -1]
    assert schema["split_sizes"] == {"train": 2, "val": 1, "test": 1}
    id_map = read_folder(published, "id_maps/item")
    assert id_map.column("original_id").to_pylist() == ["a", "b", "c", "d", "e"]
    edges = read_folder(published, "edges/item__link__item")
    assert list(zip(edges.column("src").to_pylist(), edges.column("dst").to_pylist())) == [(0, 1), (1, 2), (2, 3), (3, 0), (4, 0)]
    assert published.manifest.counts == {"nodes.item": 5, "edges.item__link__item": 5}
    assert yaml.safe_load(published.read_bytes("config.resolved.yaml"))["graph"]["nodes"][0]["type"] == "item"


def test_hashing_is_stable_and_one_hot_has_other_slot(tmp_path):
    features = [{"columns": ["color"], "transform": "hashing", "num_buckets": 8}]
    first = preprocess(load_config(write_tiny_graph(tmp_path / "a", features=features)), tmp_path / "a" / "out")
    second = preprocess(load_config(write_tiny_graph(tmp_path / "b", features=features)), tmp_path / "b" / "out")
    x = node_features(first, "item")
    assert x.shape == (5, 8) and (x.sum(axis=1) == 1).all()
    assert (x[0] == x[2]).all() and (x[0] == x[4]).all() and not (x[0] == x[1]).all()
    np.testing.assert_array_equal(x, node_features(second, "item"))

    one_hot = [{"columns": ["color"], "transform": "one_hot", "max_categories": 1}]
    published = preprocess(load_config(write_tiny_graph(tmp_path / "c", features=one_hot)), tmp_path / "c" / "out")
    assert node_features(published, "item").tolist() == [[1, 0], [0, 1], [1, 0], [0, 1], [1, 0]]


def test_row_normalize_divides_each_row_by_its_l1_norm(tmp_path):
    nodes = "node_id,label,split,x1,x2,color\na,red,train,1,3,blue\nb,blue,train,0,0,red\nc,red,val,-2,2,blue\nd,blue,test,,4,red\n"
    features = [{"columns": ["x1", "x2"], "transform": "row_normalize", "on_missing": "fill", "fill_value": 0.0}]
    published = preprocess(load_config(write_tiny_graph(tmp_path, nodes, "src,dst,weight\na,b,1\n", features=features)), tmp_path / "out")
    # An all-zero row stays zero; signs are kept; a filled cell counts with its fill value.
    assert node_features(published, "item").tolist() == [[0.25, 0.75], [0.0, 0.0], [-0.5, 0.5], [0.0, 1.0]]
    assert published.read_json("graph_schema.json")["node_types"]["item"]["feature_names"] == ["x1", "x2"]


def test_fitted_state_is_reused_for_new_data(tmp_path):
    preprocess(load_config(write_tiny_graph(tmp_path / "fit")), tmp_path / "fit" / "out")
    new_nodes = "node_id,label,split,x1,x2,color\nq,red,test,3.0,30,purple\nr,blue,test,100.0,0,blue\n"
    config = load_config(write_tiny_graph(tmp_path / "new", new_nodes, "src,dst,weight\nq,r,1\n"))
    state = load_fitted_state(tmp_path / "fit" / "out")
    published = preprocess(config, tmp_path / "new" / "out", state)
    x = node_features(published, "item")
    x1 = np.array([1, 2, 3, 4, 5.0])
    np.testing.assert_allclose(x[:, 0], (np.array([3.0, 100.0]) - x1.mean()) / x1.std(), rtol=1e-6)
    assert x[:, 2:].tolist() == [[0, 0, 0, 1], [1, 0, 0, 0]]  # 'purple' was never fitted: other slot
    assert read_folder(published, "nodes/item").column("label").to_pylist() == [1, 0]
    assert published.manifest.metadata["unseen_categories"] == {"item.color": 1}  # the run reports what it met
    fitting = storage.open_published(tmp_path / "fit" / "out").manifest.metadata
    assert "unseen_categories" not in fitting  # a fitting run saw every value it encoded


def test_fitted_state_refuses_other_feature_columns(tmp_path):
    """Fresh tables read with other feature columns than the model's transforms were fitted on:
    one line naming the table and both column lists, nothing published."""
    preprocess(load_config(write_tiny_graph(tmp_path / "fit")), tmp_path / "fit" / "out")
    state = load_fitted_state(tmp_path / "fit" / "out")
    fewer = [{"columns": ["x1"], "transform": "standardize"}, {"columns": ["color"], "transform": "one_hot"}]
    config = load_config(write_tiny_graph(tmp_path / "new", features=fewer))
    with pytest.raises(GnnflowError) as error:
        preprocess(config, tmp_path / "new" / "out", state)
    message = str(error.value)
    assert "graph.nodes['item'].features: [standardize of ['x1']; one_hot of ['color']]" in message
    assert "were made for, [standardize of ['x*']; one_hot of ['color']]" in message and "\n" not in message
    assert not (tmp_path / "new" / "out" / "manifest.json").exists()
    # The same check answers before any step of an inference-only run starts (the model's folder holds the state).
    with pytest.raises(GnnflowError, match=r"graph.nodes\['item'\].features"):
        check_fitted_state(config, state)


def test_fitted_state_refuses_a_table_missing_a_fitted_column(tmp_path):
    """The config is the model's, the fresh table lacks a column: the reader names file and column."""
    preprocess(load_config(write_tiny_graph(tmp_path / "fit")), tmp_path / "fit" / "out")
    nodes = "node_id,label,split,x1,color\nq,red,test,3.0,blue\n"
    config = load_config(write_tiny_graph(tmp_path / "new", nodes, "src,dst,weight\nq,q,1\n"))
    with pytest.raises(GnnflowError, match=r"nodes.csv.*x2"):
        preprocess(config, tmp_path / "new" / "out", load_fitted_state(tmp_path / "fit" / "out"))
    assert not (tmp_path / "new" / "out" / "manifest.json").exists()


def test_random_split_is_seeded_and_independent_of_chunking():
    ids = np.arange(100_000)
    spec = SplitSpec(train=0.6, val=0.2, test=0.1, seed=7)
    whole = encode_splits(ids, spec, None, None)
    pieces = np.concatenate([encode_splits(ids[i : i + 333], spec, None, None) for i in range(0, len(ids), 333)])
    np.testing.assert_array_equal(whole, pieces)
    fractions = [float((whole == code).mean()) for code in (0, 1, 2, -1)]
    np.testing.assert_allclose(fractions, [0.6, 0.2, 0.1, 0.1], atol=0.01)
    assert not np.array_equal(whole, encode_splits(ids, spec.model_copy(update={"seed": 8}), None, None))


def test_node_classification_random_split_skips_unlabeled(tmp_path):
    config = load_config(write_tiny_graph(tmp_path, split_column=None))
    nodes = read_folder(preprocess(config, tmp_path / "out"), "nodes/item")
    assert nodes.column("split").to_pylist()[4] == -1  # 'e' has no label


def test_link_prediction_splits_edges(tmp_path):
    edges = "src,dst\n" + "".join(f"{a},{b}\n" for a in "abcde" for b in "abcde" if a < b)
    raw = config_dict("nodes.csv", "edges.csv")
    raw["task"] = {"type": "link_prediction", "split": {"train": 0.5, "val": 0.2, "test": 0.3}}
    config = load_config(write_tiny_graph(tmp_path, edges_csv=edges, config=raw))
    published = preprocess(config, tmp_path / "out")
    schema = published.read_json("graph_schema.json")
    assert schema["task_type"] == "link_prediction" and schema["target"] == "item__link__item"
    assert sum(schema["edge_types"]["item__link__item"]["split_sizes"].values()) == 10
    assert set(read_folder(published, "nodes/item").column("split").to_pylist()) == {-1}


def test_heterogeneous_graph_and_many_files_per_table(tmp_path):
    (tmp_path / "papers").mkdir()
    (tmp_path / "papers" / "part-0.csv").write_text("pid,topic,year\np1,ml,2001\np2,db,2002\n")
    (tmp_path / "papers" / "part-1.csv").write_text("pid,topic,year\np3,ml,2003\n")
    (tmp_path / "papers" / "_SUCCESS").write_text("")
    pq.write_table(pa.table({"aid": [10, 20], "h": [1.0, 2.0]}), tmp_path / "authors.parquet")
    (tmp_path / "writes.csv").write_text("author,paper\n10,p1\n20,p2\n20,p3\n")
    (tmp_path / "cites.csv").write_text("a,b\np1,p2\np3,p1\n")
    raw = {
        "graph": {
            "nodes": [
                {
                    "type": "paper",
                    "uri": "papers",
                    "id_column": "pid",
                    "label_column": "topic",
                    "features": [{"columns": ["year"], "transform": "standardize"}],
                },
                {"type": "author", "uri": "authors.parquet", "id_column": "aid", "features": [{"columns": ["h"]}]},
            ],
            "edges": [
                {
                    "type": "writes",
                    "uri": "writes.csv",
                    "src_column": "author",
                    "dst_column": "paper",
                    "src_type": "author",
                    "dst_type": "paper",
                    "undirected": False,
                },
                {"type": "cites", "uri": "cites.csv", "src_column": "a", "dst_column": "b", "src_type": "paper", "dst_type": "paper"},
            ],
        },
        "task": {"split": {"train": 1.0, "val": 0.0, "test": 0.0}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    published = preprocess(load_config(tmp_path / "config.yaml"), tmp_path / "out")
    schema = published.read_json("graph_schema.json")
    assert {k: v["count"] for k, v in schema["node_types"].items()} == {"paper": 3, "author": 2}
    assert schema["node_types"]["paper"]["split_sizes"] == {"train": 3, "val": 0, "test": 0}
    writes = read_folder(published, "edges/author__writes__paper")
    assert list(zip(writes.column("src").to_pylist(), writes.column("dst").to_pylist())) == [(0, 0), (1, 1), (1, 2)]
    assert schema["edge_types"]["author__writes__paper"]["undirected"] is False
    assert node_features(published, "author").ravel().tolist() == [1.0, 2.0]
    assert read_folder(published, "id_maps/author").column("original_id").to_pylist() == ["10", "20"]


def test_small_chunks_give_the_same_result(tmp_path):
    rows = "".join(f"n{i},{'red' if i % 3 else 'blue'},train,{i}.5,{i % 7},blue\n" for i in range(3000))
    nodes = "node_id,label,split,x1,x2,color\n" + rows
    edges = "src,dst,weight\n" + "".join(f"n{i},n{(i * 7) % 3000},1\n" for i in range(3000))
    big = load_config(write_tiny_graph(tmp_path / "big", nodes, edges))
    small = big.model_copy(update={"preprocess": big.preprocess.model_copy(update={"csv_block_bytes": 4096})})
    a = preprocess(big, tmp_path / "big" / "out")
    b = preprocess(small, tmp_path / "small" / "out")
    assert len(b.files_under("nodes/item")) > 10 and len(a.files_under("nodes/item")) == 1
    np.testing.assert_allclose(node_features(a, "item"), node_features(b, "item"), rtol=1e-6)
    assert read_folder(a, "edges/item__link__item").equals(read_folder(b, "edges/item__link__item"))


@pytest.mark.parametrize("transform", ["standardize", "one_hot"])
def test_features_on_gcs_inputs(tmp_path, gcs_bucket, transform):
    storage.write_text(f"gs://{gcs_bucket}/t/nodes.csv", NODES_CSV)
    storage.write_text(f"gs://{gcs_bucket}/t/edges.csv", EDGES_CSV)
    raw = config_dict(
        f"gs://{gcs_bucket}/t/nodes.csv",
        f"gs://{gcs_bucket}/t/edges.csv",
        features=[{"columns": ["color"], "transform": transform}]
        if transform == "one_hot"
        else [{"columns": ["x1"], "transform": transform}],
    )  # noqa: E501
    storage.write_text(f"gs://{gcs_bucket}/t/config.yaml", yaml.safe_dump(raw))
    published = preprocess(load_config(f"gs://{gcs_bucket}/t/config.yaml"), f"gs://{gcs_bucket}/out")
    assert published.manifest.counts["nodes.item"] == 5
    x = node_features(published, "item")
    if transform == "standardize":
        np.testing.assert_allclose(x.ravel(), (np.arange(1, 6) - 3) / np.sqrt(2), rtol=1e-6)
    else:
        assert x.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]]
