"""What ``gnnflow init-config`` proposes as model type, training mode and infer's smoothing: the
options chosen on validation (components/tables/learning_choice.py) for a homogeneous node-classification
graph with node features, and what works everywhere for the graphs and tasks they were not chosen on."""

from __future__ import annotations

import pathlib

from components.config import TrainingSpec, parse_config
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.tables.learning_choice import (
    FALLBACK_MODEL_TYPE,
    FALLBACK_SMOOTHING,
    FALLBACK_TRAINING_MODE,
    PROPOSED,
    LearningChoice,
    Regularisation,
)
from components.tables.proposal import EdgeTable, NodeTable, propose_config, propose_graph_config, render, size_epochs

# Every option other than the fallbacks: what a graph that allows none of them must not get.
EVERYTHING = LearningChoice(
    model_type="appnp", training_mode="full_graph", smoothing="correct_and_smooth", regularisation=Regularisation("input_layer", 0.05, 1)
)


def _regularisation(config) -> tuple[str, float, int]:  # noqa: ANN001
    return config.training.weight_decay_scope, config.training.weight_decay, config.model.num_layers


def _learning(config) -> tuple[str, str, str]:  # noqa: ANN001
    return config.model.type, config.training.mode, config.infer.smoothing


def _demo(folder: pathlib.Path, **shape: object) -> tuple[str, str]:
    nodes, edges = write_demo_graph(generate_demo_graph(300, num_word_features=16, **shape), folder)  # type: ignore[arg-type]
    return str(nodes), str(edges)


def _columns(**more: object) -> dict:
    return {"id_column": "node_id", "src_column": "src", "dst_column": "dst", **more}


def test_a_homogeneous_featured_node_classification_graph_gets_the_choice(tmp_path):
    nodes, edges = _demo(tmp_path)
    proposed = propose_config(nodes, edges, **_columns(label_column="label"))
    assert _learning(proposed) == (PROPOSED.model_type, PROPOSED.training_mode, PROPOSED.smoothing)

    config = propose_config(nodes, edges, **_columns(label_column="label"), choice=EVERYTHING)
    assert _learning(config) == ("appnp", "full_graph", "correct_and_smooth")
    assert _regularisation(config) == ("input_layer", 0.05, 1)
    # Full-graph training is one optimizer step an epoch: 200 epochs make the 200 steps, where the
    # 240 sampled training nodes would have needed the same (one batch), and 20,000 would not.
    assert (config.training.epochs, config.training.early_stopping_patience) == (200, 200)
    many = size_epochs(20_000, TrainingSpec(mode="full_graph"), 2)
    assert (many.epochs, many.early_stopping_patience) == (200, 200)
    assert (size_epochs(20_000, TrainingSpec(), 2).epochs, size_epochs(20_000, TrainingSpec(), 2).early_stopping_patience) == (50, 10)
    assert parse_config(config.to_yaml(), "round-trip") == config
    text = render(config, "n.csv and e.csv")
    sampled = propose_config(nodes, edges, **_columns(label_column="label"), choice=LearningChoice("graphsage", "sampled"))
    assert "infer computes the same way, exactly" in text and "exactly" not in render(sampled, "n.csv and e.csv")

    gcnii = propose_config(
        nodes, edges, **_columns(label_column="label"), choice=LearningChoice(model_type="gcnii", training_mode="sampled")
    )
    # The MLP depth is appnp's: gcnii keeps its own default depth.
    assert (gcnii.model.type, gcnii.model.num_layers, gcnii.training.mode) == ("gcnii", 16, "sampled")
    deep = LearningChoice(model_type="gcnii", training_mode="sampled", regularisation=Regularisation("input_layer", 0.05, 1))
    assert propose_config(nodes, edges, **_columns(label_column="label"), choice=deep).model.num_layers == 16


def test_a_heterogeneous_graph_falls_back_to_what_works_everywhere(tmp_path):
    (tmp_path / "papers.csv").write_text("paper_id,label,f0,f1\n" + "".join(f"p{i},c{i % 2},{i % 3},{i % 5}\n" for i in range(40)))
    (tmp_path / "authors.csv").write_text("author_id\n" + "".join(f"a{i}\n" for i in range(10)))
    (tmp_path / "cites.csv").write_text("src,dst\n" + "".join(f"p{i},p{(i + 1) % 40}\n" for i in range(40)))
    (tmp_path / "writes.csv").write_text("src,dst\n" + "".join(f"a{i % 10},p{i}\n" for i in range(40)))
    papers = NodeTable("paper", str(tmp_path / "papers.csv"), "paper_id", "label")
    authors = NodeTable("author", str(tmp_path / "authors.csv"), "author_id")
    cites = EdgeTable("cites", str(tmp_path / "cites.csv"), "src", "dst", "paper", "paper")
    writes = EdgeTable("writes", str(tmp_path / "writes.csv"), "src", "dst", "author", "paper")

    config = propose_graph_config([papers, authors], [cites, writes], target="paper", choice=EVERYTHING)
    # The model and the mode fall back (several types; the choice was made on homogeneous graphs);
    # smoothing stays: the papers cite papers, so labels can spread along the citations.
    assert _learning(config) == (FALLBACK_MODEL_TYPE, FALLBACK_TRAINING_MODE, "correct_and_smooth")
    assert _regularisation(config) == ("all", 5e-4, 2)  # the regularisation was chosen with the model: it falls back too
    assert parse_config(config.to_yaml(), "round-trip") == config

    only_written = propose_graph_config([papers, authors], [writes], target="paper", choice=EVERYTHING)
    assert _learning(only_written) == (FALLBACK_MODEL_TYPE, FALLBACK_TRAINING_MODE, FALLBACK_SMOOTHING)  # no paper-paper edges


def test_link_prediction_and_featureless_graphs_fall_back(tmp_path):
    nodes, edges = _demo(tmp_path)
    link = propose_config(nodes, edges, **_columns(), task="link_prediction", choice=EVERYTHING)
    assert _learning(link) == (FALLBACK_MODEL_TYPE, FALLBACK_TRAINING_MODE, FALLBACK_SMOOTHING)
    assert parse_config(link.to_yaml(), "round-trip") == link

    (tmp_path / "bare.csv").write_text("node_id,label\n" + "".join(f"n{i},c{i % 2}\n" for i in range(30)))
    (tmp_path / "ring.csv").write_text("src,dst\n" + "".join(f"n{i},n{(i + 1) % 30}\n" for i in range(30)))
    bare = propose_config(str(tmp_path / "bare.csv"), str(tmp_path / "ring.csv"), **_columns(label_column="label"), choice=EVERYTHING)
    assert not bare.graph.nodes[0].features
    # No features: a learnt embedding per node, which only the sampled graphsage learns; smoothing
    # needs no features and stays.
    assert _learning(bare) == (FALLBACK_MODEL_TYPE, FALLBACK_TRAINING_MODE, "correct_and_smooth")
    assert parse_config(bare.to_yaml(), "round-trip") == bare


def test_a_graph_too_large_for_full_graph_training_falls_back_to_sampled(tmp_path, monkeypatch):
    from components.config import ModelSpec
    from components.tables import learning_choice
    from components.tables.learning_choice import full_graph_bytes_per_row, full_graph_fits
    from components.tables.row_counts import feature_width

    appnp = ModelSpec(type="appnp")
    # 128 features, 64 wide, 2 layers + 10 steps + 2: (128 + 2 * 64 * 14) * 4 bytes a row, so the
    # budget's 7.5 GiB hold 2**20 rows a worker.
    assert full_graph_bytes_per_row(128, appnp) == 7680
    assert full_graph_fits(2**20, 1, 128, appnp) and not full_graph_fits(2**20 + 1, 1, 128, appnp)
    assert full_graph_fits(2**21, 2, 128, appnp)
    assert full_graph_bytes_per_row(128, ModelSpec(type="graphsage")) == 4 * (128 + 2 * 64 * 4)

    nodes, edges = _demo(tmp_path)  # 300 nodes
    fits = propose_config(nodes, edges, **_columns(label_column="label"), choice=EVERYTHING)
    assert _learning(fits) == ("appnp", "full_graph", "correct_and_smooth")
    width, _ = feature_width(fits.graph.nodes[0])
    assert width == 16 + 1 + 9  # 16 words, the standardised score, 8 venues seen and one for any other
    row = full_graph_bytes_per_row(width, appnp)
    monkeypatch.setattr(learning_choice, "FULL_GRAPH_WORKER_BYTES", row * 300)
    assert _learning(propose_config(nodes, edges, **_columns(label_column="label"), choice=EVERYTHING))[1] == "full_graph"
    monkeypatch.setattr(learning_choice, "FULL_GRAPH_WORKER_BYTES", row * 299)
    # One node over: model and mode fall back together (the rule chose them as one); smoothing stays.
    too_large = propose_config(nodes, edges, **_columns(label_column="label"), choice=EVERYTHING)
    assert _learning(too_large) == (FALLBACK_MODEL_TYPE, FALLBACK_TRAINING_MODE, "correct_and_smooth")
    assert _regularisation(too_large) == ("all", 5e-4, 2)
