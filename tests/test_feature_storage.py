"""Feature storage (components.feature_storage): the int8 fit, the codecs' round trips, the config
key, the fitted ranges preprocess keeps, and what the stored width changes downstream."""

from __future__ import annotations

import json
from typing import get_args

import numpy as np
import pyarrow as pa
import pytest
import torch

from components.config import FeatureSpec, parse_config
from components.config.sections import FeatureStorage
from components.errors import GnnflowError
from components.feature_storage.codec import FLOAT32, FeatureCodec, codec_of
from components.feature_storage.quantization import STORAGE_TYPES, Int8Quantization, fit_int8, storage_fields
from components.gnn.shared_memory import WorkerShape, sampled_worker_need
from components.schema import GraphSchema, NodeTypeSchema
from components.tables.transforms import FeatureFitter, FittedFeatures, encode_features, feature_ranges


def _int8(low: list[float], high: list[float]) -> FeatureCodec:
    return FeatureCodec("int8", fit_int8(np.asarray(low), np.asarray(high)))


def test_the_config_literal_and_the_codec_agree_on_the_types():
    assert get_args(FeatureStorage) == STORAGE_TYPES == ("float32", "float16", "bfloat16", "int8")


def test_int8_round_trip_stays_within_half_a_step_per_column():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(5000, 6)).astype(np.float32) * np.array([1, 10, 0.01, 1e3, 5, 0.5], dtype=np.float32))
    x[:, 4] = x[:, 4].abs() + 7  # a column far from zero
    codec = _int8(x.min(0).values.tolist(), x.max(0).values.tolist())
    stored, clipped = codec.encode(x)
    assert stored.dtype == torch.int8 and stored.shape == x.shape and clipped == 0
    assert int(stored.min()) == -128 and int(stored.max()) == 127  # both ends of every range are used
    error = (codec.decode(stored) - x).abs().max(0).values
    assert codec.quantization is not None
    scale = torch.tensor(codec.quantization.scale, dtype=torch.float32)
    assert torch.all(error <= scale / 2 * (1 + 1e-4)), (error / scale).tolist()
    # The ends of each range come back (nearly) exactly.
    ends = torch.stack([x.min(0).values, x.max(0).values])
    assert torch.allclose(codec.round_trip(ends), ends, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("storage", "relative"), [("float16", 2**-11), ("bfloat16", 2**-8), ("float32", 0.0)])
def test_float_storage_round_trip_keeps_relative_precision(storage: str, relative: float):
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(2000, 8)).astype(np.float32))
    codec = FeatureCodec(storage)
    stored, clipped = codec.encode(x)
    assert stored.dtype == {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[storage]
    assert stored.element_size() == codec.value_bytes and clipped == 0
    assert torch.all((codec.decode(stored) - x).abs() <= x.abs() * relative + 1e-7)


def test_constant_and_empty_columns_are_exact():
    q = fit_int8(np.array([3.5, -2.0, 0.0, np.inf]), np.array([3.5, -2.0, 0.0, -np.inf]))  # the last: no values seen
    assert q.scale == (1.0, 1.0, 1.0, 1.0)
    codec = FeatureCodec("int8", q)
    x = torch.tensor([[3.5, -2.0, 0.0, 0.0]] * 3)
    stored, clipped = codec.encode(x)
    assert clipped == 0 and torch.equal(codec.decode(stored), x)


def test_values_outside_the_range_are_clipped_and_counted_never_wrapped():
    codec = _int8([0.0, -1.0], [1.0, 1.0])
    x = torch.tensor([[1e6, -1.0], [-50.0, 0.0], [1.0019, 1.0], [0.5, 3.0]])  # 1.0019 is within half a step of 1
    stored, clipped = codec.encode(x)
    assert clipped == 3
    assert stored[:, 0].tolist() == [127, -128, 127, stored[3, 0].item()] and stored[3, 1].item() == 127
    back = codec.decode(stored)
    assert back[0, 0].item() == pytest.approx(1.0) and back[1, 0].item() == pytest.approx(0.0, abs=1e-6)
    over = FeatureCodec("float16")
    stored, clipped = over.encode(torch.tensor([[7e4, -1e9, 1.0]]))
    assert clipped == 2 and torch.isfinite(stored.float()).all() and stored[0, 0].item() == 65504.0


def test_bfloat16_rows_mapped_as_raw_bits_decode_like_the_tensor():
    x = torch.tensor([[1.5, -3.25], [1e-3, 1e30]])
    codec = FeatureCodec("bfloat16")
    stored, _ = codec.encode(x)
    bits = stored.view(torch.int16).numpy().view(np.uint16)  # what serving maps from the safetensors file
    assert np.array_equal(codec.decode_array(bits), codec.decode(stored).numpy())


def test_codec_of_reads_the_schema_and_old_schemas_are_float32():
    node = NodeTypeSchema("paper", 3, ["a", "b"], None, {}, [])
    assert codec_of(node) is FLOAT32  # a schema written before feature_storage
    q = fit_int8(np.array([0.0, -1.0]), np.array([2.0, 1.0])).to_json()
    stored = NodeTypeSchema("paper", 3, ["a", "b"], None, {}, [], feature_storage="int8", feature_quantization=q)
    again = GraphSchema.from_json(GraphSchema("node_classification", "paper", {"paper": stored}, {}).to_json(), "test")
    codec = codec_of(again.node_types["paper"])
    assert codec.storage == "int8" and codec.quantization == Int8Quantization.from_json(q, 2, "test")
    featureless = NodeTypeSchema("user", 3, [], None, {}, [], feature_storage="int8")
    assert codec_of(featureless) is FLOAT32  # its rows are learnt embeddings
    broken = NodeTypeSchema("paper", 3, ["a", "b"], None, {}, [], feature_storage="int8", feature_quantization={"scale": [1.0]})
    with pytest.raises(GnnflowError, match=r"partition_metadata.json, node type 'paper': feature_quantization"):
        codec_of(broken, "partition_metadata.json, node type 'paper'")
    with pytest.raises(GnnflowError, match="feature_storage 'int4' is not one of"):
        codec_of(NodeTypeSchema("paper", 3, ["a"], None, {}, [], feature_storage="int4"))


def _config(storage: object, where: str = "nodes") -> str:
    nodes: dict[str, object] = {"type": "paper", "uri": "n.csv", "label_column": "label", "features": [{"columns": ["f*"]}]}
    edges: dict[str, object] = {"type": "cites", "uri": "e.csv", "src_type": "paper", "dst_type": "paper"}
    table = nodes if where == "nodes" else edges
    table["feature_storage"] = storage
    return json.dumps({"graph": {"nodes": [nodes], "edges": [edges]}})


def test_config_key_defaults_to_float32_and_takes_each_type():
    raw = json.loads(_config("float32"))
    for table in (*raw["graph"]["nodes"], *raw["graph"]["edges"]):
        table.pop("feature_storage", None)
    config = parse_config(json.dumps(raw), "test")
    assert config.graph.nodes[0].feature_storage == "float32" and config.graph.edges[0].feature_storage == "float32"
    for storage in STORAGE_TYPES:
        assert parse_config(_config(storage), "test").graph.nodes[0].feature_storage == storage
        assert parse_config(_config(storage, "edges"), "test").graph.edges[0].feature_storage == storage


@pytest.mark.parametrize(
    ("value", "where", "key"), [("int4", "nodes", "graph.nodes[0].feature_storage"), ("fp16", "edges", "graph.edges[0].feature_storage")]
)
def test_an_unknown_storage_type_is_a_config_error_naming_the_key(value: str, where: str, key: str):
    with pytest.raises(GnnflowError) as caught:
        parse_config(_config(value, where), "config.yaml")
    assert f"key '{key}'" in str(caught.value) and "int8" in str(caught.value)


def _fit(transform: str, columns: dict[str, list[float]], chunks: int = 2) -> FittedFeatures:
    spec = FeatureSpec(columns=list(columns), transform=transform)
    fitters = [FeatureFitter(spec, list(columns)) for _ in range(chunks)]
    rows = len(next(iter(columns.values())))
    for i, fitter in enumerate(fitters):  # each chunk fitted apart, then merged (as the beam engine does)
        part = slice(i * rows // chunks, (i + 1) * rows // chunks)
        fitter.update(pa.table({c: pa.array(v[part], pa.float64()) for c, v in columns.items()}), lambda r: f"row {r}")
    for other in fitters[1:]:
        fitters[0].merge(other)
    return fitters[0].finish()


@pytest.mark.parametrize("transform", ["standardize", "passthrough", "row_normalize"])
def test_fitted_ranges_are_those_of_the_transformed_values(transform: str):
    columns = {"a": [1.0, 4.0, -2.0, 8.0, 3.0, 0.5], "b": [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]}
    fitted = _fit(transform, columns)
    x = encode_features(pa.table({c: pa.array(v, pa.float64()) for c, v in columns.items()}), [fitted], lambda r: f"row {r}")
    ranges = feature_ranges([fitted])
    assert ranges is not None
    np.testing.assert_allclose(ranges[0], x.min(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ranges[1], x.max(0), rtol=1e-6, atol=1e-6)
    # Kept in the fitted state, so a run that reuses it quantizes the same way.
    assert FittedFeatures.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted


def test_categorical_slots_range_over_zero_and_one_and_old_states_have_no_ranges():
    one_hot = FittedFeatures(FeatureSpec(columns=["c"], transform="one_hot"), ["c"], categories=[["x", "y"]])
    old = FittedFeatures(FeatureSpec(columns=["a"], transform="standardize"), ["a"], means=[0.0], stds=[1.0])
    low, high = feature_ranges([one_hot])  # type: ignore[misc]
    assert low.tolist() == [0.0] * 3 and high.tolist() == [1.0] * 3
    assert feature_ranges([one_hot, old]) is None
    with pytest.raises(GnnflowError, match=r"graph.nodes\['paper'\].feature_storage: int8 needs the value range"):
        storage_fields("int8", None, 4, "graph.nodes['paper'].feature_storage")
    assert storage_fields("float16", None, 4, "k") == {"feature_storage": "float16", "feature_quantization": None}
    assert storage_fields("int8", None, 0, "k")["feature_storage"] == "float32"  # featureless: learnt rows


def test_shared_memory_counts_the_stored_width():
    def need(feature_bytes: dict[str, int]) -> dict[str, int]:
        shape = WorkerShape(
            node_counts={"paper": [1000, 1000]},
            feature_dims={"paper": 128},
            labeled=frozenset(),
            edges={"paper__cites__paper": ([5000, 5000], 16, "paper")},
            label_edge_counts={},
            heterogeneous=False,
            feature_bytes=feature_bytes,
            edge_feature_bytes={"paper__cites__paper": feature_bytes.get("paper", 4)},
        )
        result = sampled_worker_need(shape, [0], feature_cache_ratio=0.0, learnt_width=0, multiprocess=False, step="train")
        return {item.what: item.bytes for item in result.items}

    assert need({})["node features"] == 1000 * 128 * 4 and need({})["edge features"] == 5000 * 16 * 4
    assert need({"paper": 1})["node features"] == 1000 * 128 and need({"paper": 1})["edge features"] == 5000 * 16
    assert need({"paper": 2})["node features"] == 1000 * 128 * 2
