"""model.type appnp and gcnii: full-graph propagation over 2 real workers (gloo) equals a dense
single-process reference of the same propagation with the same weights (embeddings, logits and
gradients); both train sampled and full-graph on a small planted graph well above chance, exact
inference runs them, link prediction trains with them; the configs they cannot serve are refused
with messages that say why."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import yaml

from components import storage
from components.config import ModelSpec, parse_config
from components.errors import GnnflowError
from components.infer.layerwise import check_exact_config
from components.infer.step import infer
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.launcher import launch
from components.serialize.step import serialize
from components.serving.predictor import ExistingNode, NewEdge, NewNode, Predictor
from components.train.step import train
from tests.full_graph_workers import classifier, full_graph_pass, random_case
from tests.small_graphs import demo_chance, with_updates

pytestmark = pytest.mark.multiworker

TOLERANCE = 1e-5
SPECS = {
    "appnp": ModelSpec(type="appnp", hidden_channels=6, num_layers=2, propagation_steps=7, teleport=0.15, dropout=0.0),
    "gcnii": ModelSpec(type="gcnii", hidden_channels=6, num_layers=4, teleport=0.2, identity_strength=0.6, dropout=0.0),
}


def propagation_case(counts: list[int], edge_assignment: str, block_rows: int) -> dict:
    """A random graph (tests/full_graph_workers.py) with both models at fixed weights."""
    return random_case(counts, edge_assignment, block_rows, SPECS, seed=11)


def dense_propagation(case: dict) -> torch.Tensor:
    """(n, n) D^-1/2 (A + I) D^-1/2 as a dense matrix: A[i, j] counts the edges node i aggregates
    over from j (self-loops dropped, then one added per node), D its row sums."""
    n = sum(case["counts"])
    src, dst = case["edge_index"]
    reader, neighbour = (dst, src) if case["edge_assignment"] == "dst" else (src, dst)
    keep = reader != neighbour
    a = torch.zeros(n, n).index_put_((reader[keep], neighbour[keep]), torch.ones(int(keep.sum())), accumulate=True) + torch.eye(n)
    inv_sqrt = a.sum(1).pow(-0.5)
    return inv_sqrt[:, None] * a * inv_sqrt[None, :]


def dense_reference(case: dict, name: str) -> dict:
    """One process, plain dense algebra with the model's weights (not PyG's propagation)."""
    spec, state = case["models"][name]
    model = classifier(spec, case["x"].shape[1], sum(case["counts"]), case["num_classes"])
    model.load_state_dict(state)
    a_hat, x, encoder = dense_propagation(case), case["x"], model.encoder
    if spec.type == "appnp":
        h0 = x
        for i, lin in enumerate(encoder.lins):
            h0 = lin(h0) if i == len(encoder.lins) - 1 else torch.relu(lin(h0))
        h = h0
        for _ in range(spec.propagation_steps):
            h = (1 - spec.teleport) * (a_hat @ h) + spec.teleport * h0
    else:
        h = h0 = torch.relu(encoder.lin(x))
        for layer, conv in enumerate(encoder.convs, start=1):
            beta = math.log(spec.identity_strength / layer + 1)
            mixed = (1 - spec.teleport) * (a_hat @ h) + spec.teleport * h0
            h = (1 - beta) * mixed + beta * mixed @ conv.weight1
            h = torch.relu(h) if layer < len(encoder.convs) else h
    logits = model.classify(h)
    train_mask = case["train"]
    F.cross_entropy(logits[train_mask], case["y"][train_mask]).backward()
    # The sampled form (PyG's APPNP / GCN2Conv over the edges) on the whole graph, for comparison.
    edge_index = case["edge_index"] if case["edge_assignment"] == "dst" else case["edge_index"].flip(0)
    with torch.no_grad():
        sampled_form = model.encoder(x, edge_index)
    grads = {k: p.grad for k, p in model.named_parameters()}
    return {"embeddings": h.detach(), "h0": h0.detach(), "logits": logits.detach(), "sampled_form": sampled_form, "grads": grads}


@pytest.mark.parametrize(("counts", "assignment", "block_rows"), [([17, 23], "dst", 4), ([21, 19], "src", 64)])
def test_full_graph_propagation_on_two_workers_equals_a_dense_reference(counts, assignment, block_rows):
    case = propagation_case(counts, assignment, block_rows)
    results = launch(full_graph_pass, (case,), world_size=2)
    worst: dict[str, dict[str, float]] = {}
    for name in SPECS:
        expected = dense_reference(case, name)
        differences = {"sampled_form": float((expected["sampled_form"] - expected["embeddings"]).abs().max())}
        for worker in results:
            got, ids = worker[name], torch.from_numpy(worker[name]["ids"])
            for key, reference_key in (("embeddings", "embeddings"), ("logits", "logits"), ("exact", "embeddings")):
                value = float((torch.from_numpy(got[key]) - expected[reference_key][ids]).abs().max())
                differences[key] = max(differences.get(key, 0.0), value)
            assert got["grads"].keys() == expected["grads"].keys()
            grad = max(float((torch.from_numpy(got["grads"][k]) - v).abs().max()) for k, v in expected["grads"].items())
            differences["grads"] = max(differences.get("grads", 0.0), grad)
        worst[name] = differences
        # Propagation moved the embeddings: they are not the per-node transform alone.
        assert float((expected["embeddings"] - expected["h0"]).abs().max()) > 0.05, name
    print("max abs differences from the dense reference:", json.dumps(worst))
    for name, differences in worst.items():
        assert all(v <= TOLERANCE for v in differences.values()), (name, differences)


def _raw(**sections) -> dict:
    raw = {
        "graph": {
            "nodes": [{"type": "paper", "uri": "nodes.csv", "label_column": "label", "features": [{"columns": ["f*"]}]}],
            "edges": [{"type": "cites", "uri": "edges.csv", "src_type": "paper", "dst_type": "paper"}],
        }
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return raw


HETEROGENEOUS = {
    "nodes": [
        {"type": "paper", "uri": "n.csv", "label_column": "label", "features": [{"columns": ["f*"]}]},
        {"type": "author", "uri": "a.csv", "features": [{"columns": ["g*"]}]},
    ],
    "edges": [{"type": "writes", "uri": "w.csv", "src_type": "author", "dst_type": "paper"}],
}


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"model": {"type": "appnp", "teleport": 0}}, "key 'model.teleport': Input should be greater than 0"),
        ({"model": {"type": "appnp", "teleport": 1.5}}, "key 'model.teleport': Input should be less than or equal to 1"),
        ({"model": {"type": "appnp", "propagation_steps": 0}}, "key 'model.propagation_steps': Input should be greater than or equal to 1"),
        (
            {"model": {"type": "appnp", "propagation_steps": 2}, "training": {"fan_outs": [5, 5, 5]}},
            "training.fan_outs has 3 entries but model.propagation_steps is 2: model.type appnp reads at most 2 hops, so sample at most 2",
        ),
        (
            {"model": {"type": "gcnii", "num_layers": 1}},
            "training.fan_outs has 2 entries but model.num_layers is 1: model.type gcnii reads at most 1 hops, so sample at most 1",
        ),
        (
            {"model": {"type": "appnp"}, "graph": HETEROGENEOUS, "training": {"mode": "full_graph"}},
            "training.mode full_graph supports homogeneous graphs (one node type, one edge type); "
            "this config has 2 node types and 1 edge types",
        ),
        (
            {"model": {"type": "gcnii"}, "graph": HETEROGENEOUS, "training": {"mode": "full_graph"}},
            "training.mode full_graph supports homogeneous graphs (one node type, one edge type); "
            "this config has 2 node types and 1 edge types",
        ),
        (
            {"model": {"type": "appnp"}, "training": {"mode": "full_graph"}, "task": {"type": "link_prediction"}},
            "training.mode full_graph supports task.type node_classification, not link_prediction",
        ),
    ],
)
def test_config_refuses_what_appnp_and_gcnii_cannot_do(sections, message):
    with pytest.raises(GnnflowError) as raised:
        parse_config(yaml.safe_dump(_raw(**sections)), "test config")
    assert message in str(raised.value)


def test_config_defaults_and_exact_inference_accepts_them():
    appnp = parse_config(yaml.safe_dump(_raw(model={"type": "appnp"})), "test config").model
    assert (appnp.num_layers, appnp.propagation_steps, appnp.teleport) == (2, 10, 0.1)
    gcnii = parse_config(yaml.safe_dump(_raw(model={"type": "gcnii"})), "test config").model
    assert (gcnii.num_layers, gcnii.teleport, gcnii.identity_strength) == (16, 0.1, 0.5)
    assert parse_config(yaml.safe_dump(_raw(model={"type": "gcnii", "num_layers": 3})), "test config").model.num_layers == 3
    assert parse_config(yaml.safe_dump(_raw()), "test config").model.num_layers == 2  # other models keep theirs
    # Sampling fewer hops than the propagation reaches is allowed; full-graph samples nothing.
    one_hop = parse_config(yaml.safe_dump(_raw(model={"type": "appnp"}, training={"fan_outs": [10]})), "test config")
    assert one_hop.training.fan_outs == [10]
    for model_type in ("appnp", "gcnii"):
        config = parse_config(yaml.safe_dump(_raw(model={"type": model_type}, training={"mode": "full_graph"})), "test config")
        check_exact_config(config)  # no error: exact inference propagates over the whole graph
    with pytest.raises(
        GnnflowError, match="infer --mode exact supports model.type graphsage, gcn, appnp or gcnii; this config has model.type gat"
    ):
        check_exact_config(parse_config(yaml.safe_dump(_raw(model={"type": "gat"})), "test config"))


@pytest.fixture(scope="module")
def demo_runs(one_sided_validation, tmp_path_factory) -> dict:
    """appnp and gcnii trained sampled (20 epochs of 5 batches) and full-graph (40 one-step epochs)
    on the 400-node demo graph with 2 workers, and exact inference of sampled appnp: metrics of each."""
    raw, partitions, _ = one_sided_validation
    root = storage.parse_uri(tmp_path_factory.mktemp("propagation_demo"))
    sampled, full_graph = {"epochs": 20}, {"mode": "full_graph", "epochs": 40}
    runs = {
        "appnp_sampled": with_updates(raw, model={"type": "appnp"}, training=sampled),
        "gcnii_sampled": with_updates(raw, model={"type": "gcnii", "num_layers": 4}, training=sampled),
        "appnp_full_graph": with_updates(raw, model={"type": "appnp"}, training=full_graph),
        "gcnii_full_graph": with_updates(raw, model={"type": "gcnii", "num_layers": 4}, training=full_graph),
    }
    metrics = {name: train(config, partitions, root.join(name)).read_json("metrics.json") for name, config in runs.items()}
    exact = infer(runs["appnp_sampled"], partitions, root.join("appnp_sampled"), root.join("appnp_exact"), mode="exact")
    assert exact is not None
    metrics["appnp_exact"] = exact.read_json("metrics.json")
    files = exact.files_under("embeddings/paper")
    shards = pd.concat([pq.read_table(io.BytesIO(exact.read_bytes(f))).to_pandas() for f in files], ignore_index=True)
    return {**metrics, "root": root, "appnp_exact_shards": shards}


@pytest.mark.parametrize("run", ["appnp_sampled", "gcnii_sampled", "appnp_full_graph", "gcnii_full_graph"])
def test_trains_well_above_chance_on_the_demo_graph(demo_runs, run):
    metrics = demo_runs[run]
    chance = demo_chance(400)
    print(run, {k: v for k, v in metrics.items() if k.endswith("accuracy")}, "chance", chance)
    assert metrics["val_accuracy"] >= max(2 * chance, 0.7), metrics


def test_exact_inference_runs_appnp(demo_runs):
    exact = demo_runs["appnp_exact"]
    print("appnp exact inference:", exact)
    assert exact["test_accuracy"] >= max(2 * demo_chance(400), 0.7), exact


def test_serving_answers_with_an_appnp_model(demo_runs, one_sided_validation):
    """Existing nodes: the exact infer output's rows when given, else propagation over their
    full 2-hop neighbourhoods (the depth training sampled); a new copy of a node: its sampled
    neighbourhood. Both close to what exact inference predicts."""
    raw, partitions, _ = one_sided_validation
    root = demo_runs["root"]
    exact = demo_runs["appnp_exact_shards"]
    model, cache = str(root.join("appnp_sampled")), str(root.join("cache"))
    stored = Predictor.load(model, str(partitions), str(root.join("appnp_exact")), cache_dir=cache)
    computed = Predictor.load(model, str(partitions), cache_dir=cache)
    instances = [ExistingNode("paper", i) for i in exact["node_id"]]
    truth = np.stack(exact["embedding"].to_numpy())
    assert np.array_equal(np.array([p.embedding for p in stored.predict(instances)], dtype=np.float32), truth)
    near = computed.predict(instances)
    nodes = pd.read_csv(raw["graph"]["nodes"][0]["uri"], dtype={"node_id": str})
    edges = pd.read_csv(raw["graph"]["edges"][0]["uri"], dtype={"src": str, "dst": str})
    news = []
    for node_id in exact["node_id"][:100]:
        row = nodes[nodes["node_id"] == node_id].iloc[0]
        out = [NewEdge("cites", d, "out") for d in edges.loc[edges["src"] == node_id, "dst"]]
        into = [NewEdge("cites", s, "in") for s in edges.loc[edges["dst"] == node_id, "src"]]
        news.append(NewNode("paper", {c: float(row[c]) for c in nodes.columns if c.startswith("w")}, tuple(out + into)))
    new = computed.predict(news)
    agree_existing = float(np.mean([p.label == label for p, label in zip(near, exact["prediction"])]))
    agree_new = float(np.mean([p.label == label for p, label in zip(new, exact["prediction"][:100])]))
    print("serving agrees with exact appnp:", agree_existing, agree_new)
    assert agree_existing >= 0.9 and agree_new >= 0.9, (agree_existing, agree_new)


def test_link_prediction_trains_with_appnp(one_sided_validation, tmp_path):
    raw, _, _ = one_sided_validation
    raw = json.loads(json.dumps(raw))
    raw["graph"]["nodes"][0].pop("split_column")
    raw["graph"]["nodes"][0].pop("label_column")
    raw["task"] = {"type": "link_prediction", "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 1}}
    config = with_updates(raw, model={"type": "appnp", "dropout": 0.1}, training={"epochs": 10, "learning_rate": 0.005})
    root = storage.parse_uri(tmp_path)
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
    metrics = train(config, root.join("parts"), root.join("model")).read_json("metrics.json")
    print("appnp link prediction:", {k: v for k, v in metrics.items() if "roc" in k})
    assert metrics["val_roc_auc"] >= 0.7, metrics  # chance: 0.5


def test_the_default_tune_space_samples_as_deep_as_the_config():
    """gcnii's 16 layers would otherwise make 16-hop fan-out choices."""
    from pipelines.tune.space import default_space

    config = parse_config(yaml.safe_dump(_raw(model={"type": "gcnii"})), "test config")
    fan_outs = next(p for p in default_space(config).params if p.key == "training.fan_outs")
    assert fan_outs.choices == ([5, 5], [10, 10], [15, 10], [25, 15])
