"""Step serialize: shard layout, graph metadata, and records that plain tf.data reads back."""

from __future__ import annotations

import numpy as np
import pytest

from components import storage
from components.config import SerializeSpec, load_config
from components.preprocess.step import preprocess
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
