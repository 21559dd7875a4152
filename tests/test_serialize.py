"""Step serialize: shard layout, graph metadata, and records that plain tf.data reads back."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from components import storage
from components.config import SerializeSpec, load_config
from components.errors import GnnflowError
from components.feature_storage.codec import codec_of
from components.partition.loading import load_graph
from components.preprocess.step import preprocess
from components.schema import NO_SPLIT
from components.serialize.output import read_graph_metadata
from components.serialize.shards import shard_count
from components.serialize.step import serialize
from components.tfrecord import decode_examples, iter_records
from tests.tiny_graph import write_tiny_graph


def read_records(published: storage.PublishedOutput, files: list[str], spec: dict) -> dict[str, np.ndarray]:
    records = []
    for rel in files:
        with storage.open_read(published.uri(rel)) as f:
            records.extend(iter_records(f, source=rel))
    return decode_examples(records, spec["int64"], spec["float"])


def test_shard_count():
    assert shard_count(1000, 10, SerializeSpec(num_shards=4)) == 4
    assert shard_count(3, 10, SerializeSpec(num_shards=4)) == 3
    assert shard_count(0, 10, SerializeSpec()) == 1
    # 1M rows of 100 floats is ~464 MB: 8 shards of 64 MB.
    assert shard_count(1_000_000, 100, SerializeSpec(target_shard_bytes=64 << 20)) == 7


@pytest.fixture
def tiny_preprocessed(tmp_path) -> tuple:
    rows = "".join(f"n{i},{'red' if i % 3 else 'blue'},train,{i}.5,{i % 7},blue\n" for i in range(1001))
    config = load_config(write_tiny_graph(tmp_path, "node_id,label,split,x1,x2,color\n" + rows, "src,dst,weight\nn1,n2,1\nn2,n3,1\n"))
    config = config.model_copy(update={"serialize": SerializeSpec(num_shards=4)})
    return config, preprocess(config, tmp_path / "pre")


def test_shards_are_balanced_and_complete(tmp_path, tiny_preprocessed):
    config, pre = tiny_preprocessed
    out = serialize(config, pre.root, tmp_path / "tfr")
    meta = read_graph_metadata(out)
    node = meta.node_types["item"]
    assert node.files == [f"nodes/item/shard-{i:05d}-of-00004.tfrecord" for i in range(4)]
    spec = meta.record_format["node_types"]["item"]
    assert spec == {"int64": {"node_id": 1, "label": 1, "split": 1}, "float": {"features": 4}}  # x1, x2, color=blue, color=<other>
    per_shard = [len(read_records(out, [f], spec)["node_id"]) for f in node.files]
    assert per_shard == [251, 251, 251, 248]
    nodes = read_records(out, node.files, spec)
    assert sorted(nodes["node_id"].tolist()) == list(range(1001))
    edge = meta.edge_types["item__link__item"]
    assert edge.count == 2 and len(edge.files) == 2  # 2 rows, 4 shards asked: one per row
    assert node.file_rows == per_shard and edge.file_rows == [1, 1]
    edges = read_records(out, edge.files, meta.record_format["edge_types"]["item__link__item"])
    assert edges["edge_id"].tolist() == [0, 1] and edges["src"].tolist() == [1, 2]
    assert out.manifest.counts == {"nodes.item": 1001, "edges.item__link__item": 2}
    assert out.files_under("id_maps/item") == node.id_map_files


def test_records_read_by_tf_data(tmp_path, tiny_preprocessed):
    tf = pytest.importorskip("tensorflow")
    config, pre = tiny_preprocessed
    out = serialize(config, pre.root, tmp_path / "tfr")
    meta = read_graph_metadata(out)
    files = [str(out.uri(f)) for f in meta.node_types["item"].files]
    spec = {
        "node_id": tf.io.FixedLenFeature([], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "split": tf.io.FixedLenFeature([], tf.int64),
        "features": tf.io.FixedLenFeature([4], tf.float32),
    }
    batches = list(tf.data.TFRecordDataset(files).batch(10_000).map(lambda b: tf.io.parse_example(b, spec)))
    got = {k: np.concatenate([b[k].numpy() for b in batches]) for k in spec}
    order = np.argsort(got["node_id"])
    ids = got["node_id"][order]
    assert ids.tolist() == list(range(1001))
    assert got["label"][order].tolist() == [0 if i % 3 == 0 else 1 for i in range(1001)]
    x1 = np.arange(1001) + 0.5
    np.testing.assert_allclose(got["features"][order][:, 0], (x1 - x1.mean()) / x1.std(), rtol=1e-5, atol=1e-6)


def test_serialize_to_gcs(tmp_path, gcs_bucket, tiny_preprocessed):
    config, pre = tiny_preprocessed
    out = serialize(config, pre.root, f"gs://{gcs_bucket}/tfr")
    meta = read_graph_metadata(storage.open_published(f"gs://{gcs_bucket}/tfr", step="serialize"))
    nodes = read_records(out, meta.node_types["item"].files, meta.record_format["node_types"]["item"])
    assert sorted(nodes["node_id"].tolist()) == list(range(1001))
    for rel, entry in out.manifest.files.items():
        assert storage.size(out.uri(rel)) == entry.size


def test_int8_rows_are_written_stored_and_loaded_as_they_are(tmp_path, tiny_preprocessed, caplog):
    """int8 nodes: serialize writes the codec's bytes (and counts clipped values), partition's
    loader takes them as they are; edges without features or split carry neither."""
    config, pre = tiny_preprocessed
    rows = "".join(f"n{i},{'red' if i % 3 else 'blue'},train,{i}.5,{i % 7},blue\n" for i in range(1001))
    int8_config = load_config(
        write_tiny_graph(
            tmp_path / "int8", "node_id,label,split,x1,x2,color\n" + rows, "src,dst,weight\nn1,n2,1\nn2,n3,1\n", feature_storage="int8"
        )  # fmt: skip
    ).model_copy(update={"serialize": SerializeSpec(num_shards=4)})
    outputs = {"float32": serialize(config, pre.root, tmp_path / "f32")}
    with caplog.at_level(logging.WARNING, logger="gnnflow.features"):
        outputs["int8"] = serialize(int8_config, preprocess(int8_config, tmp_path / "pre8").root, tmp_path / "i8")
    assert "clipped" not in caplog.text  # the range is fitted on these very rows
    meta = {k: read_graph_metadata(v) for k, v in outputs.items()}
    layout = meta["int8"].record_format["node_types"]["item"]
    assert layout == {"int64": {"node_id": 1, "label": 1, "split": 1}, "float": {"features": 4}, "features_encoding": "stored_bytes"}
    edges_layout = {"int64": {"edge_id": 1, "src": 1, "dst": 1}, "float": {}, "constant": {"split": NO_SPLIT}}
    assert meta["int8"].record_format["edge_types"]["item__link__item"] == edges_layout
    sizes = {k: sum(v.manifest.files[f].size for f in meta[k].node_types["item"].files) for k, v in outputs.items()}
    assert sizes["float32"] - sizes["int8"] == 1001 * 4 * 3  # 4 features of 1 byte, not 4, a record
    loaded = {k: load_graph(v, meta[k], 0, 1, parallel=False, subprocess_min_bytes=1 << 40) for k, v in outputs.items()}
    codec = codec_of(meta["int8"].node_types["item"])
    nodes = {k: g.nodes["item"] for k, g in loaded.items()}
    assert nodes["int8"]["features"].dtype == torch.int8
    order = {k: torch.argsort(n["node_id"]) for k, n in nodes.items()}
    want, clipped = codec.encode(nodes["float32"]["features"][order["float32"]])
    assert clipped == 0 and torch.equal(nodes["int8"]["features"][order["int8"]], want)
    edges = loaded["int8"].edges["item__link__item"]
    assert edges["split"].tolist() == [NO_SPLIT, NO_SPLIT] and edges["split"].dtype == torch.int8
    assert edges["features"].shape == (2, 0) and edges["src"].tolist() == [1, 2]


def test_stored_bytes_read_as_float32_are_refused_naming_the_shard(tmp_path):
    """A graph_metadata.json whose layout does not say the shards hold stored bytes: the shard is named."""
    int8_config = load_config(write_tiny_graph(tmp_path / "t", feature_storage="int8"))
    out = serialize(int8_config, preprocess(int8_config, tmp_path / "pre8").root, tmp_path / "i8")
    meta = read_graph_metadata(out)
    meta.record_format["node_types"]["item"].pop("features_encoding")  # as a reader of float32 records would see them
    with pytest.raises(
        GnnflowError, match=r"shard-00000-of-00001\.tfrecord: record 0: feature 'features' is a bytes_list, expected float_list"
    ):
        load_graph(out, meta, 0, 1, parallel=False, subprocess_min_bytes=1 << 40)
