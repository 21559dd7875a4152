"""The demo graph is deterministic, well-formed and actually learnable."""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
import pytest

from components.demo.graph import (
    EDGES_FILE,
    NODES_FILE,
    DemoGraph,
    generate_demo_graph,
    main,
    write_demo_graph,
)

NUM_NODES = 3_000


@pytest.fixture(scope="module")
def graph() -> DemoGraph:
    return generate_demo_graph(NUM_NODES, seed=7)


def _written_bytes(graph: DemoGraph, directory: pathlib.Path) -> tuple[bytes, bytes]:
    nodes_path, edges_path = write_demo_graph(graph, directory)
    return nodes_path.read_bytes(), edges_path.read_bytes()


def test_same_seed_gives_identical_bytes(tmp_path: pathlib.Path) -> None:
    first = _written_bytes(generate_demo_graph(NUM_NODES, seed=3), tmp_path / "a")
    second = _written_bytes(generate_demo_graph(NUM_NODES, seed=3), tmp_path / "b")
    assert first == second


def test_different_seed_gives_different_tables(tmp_path: pathlib.Path) -> None:
    first = _written_bytes(generate_demo_graph(NUM_NODES, seed=3), tmp_path / "a")
    second = _written_bytes(generate_demo_graph(NUM_NODES, seed=4), tmp_path / "b")
    assert first[0] != second[0]
    assert first[1] != second[1]


def test_counts_and_columns() -> None:
    graph = generate_demo_graph(2_000, num_classes=4, num_word_features=10, avg_degree=6.0, seed=1)
    expected_columns = ["node_id", "label", *[f"w{j}" for j in range(10)], "score", "venue"]
    assert list(graph.nodes.columns) == expected_columns
    assert list(graph.edges.columns) == ["src", "dst"]
    assert len(graph.nodes) == 2_000
    assert len(graph.edges) == 6_000
    assert set(graph.nodes["label"].dropna()) == {f"class_{c}" for c in range(4)}
    assert graph.nodes["label"].isna().sum() == 20
    assert graph.nodes["score"].notna().all()
    assert 2 <= graph.nodes["venue"].nunique() <= 8


def test_word_features_are_binary(graph: DemoGraph) -> None:
    words = graph.nodes.filter(regex=r"^w\d+$").to_numpy()
    assert words.shape[1] == 64
    assert set(np.unique(words)) == {0, 1}


def test_node_ids_are_unique_opaque_strings(graph: DemoGraph) -> None:
    ids = graph.nodes["node_id"]
    assert ids.is_unique
    assert ids.str.fullmatch(r"u[0-9a-f]{8}").all()


def test_edges_are_simple_undirected_and_reference_known_nodes(graph: DemoGraph) -> None:
    src, dst = graph.edges["src"], graph.edges["dst"]
    assert src.isin(graph.nodes["node_id"]).all()
    assert dst.isin(graph.nodes["node_id"]).all()
    assert not (src == dst).any()
    first_is_low = src < dst
    low, high = src.where(first_is_low, dst), dst.where(first_is_low, src)
    assert not pd.DataFrame({"low": low, "high": high}).duplicated().any()


def test_edges_are_not_stored_in_sorted_order(graph: DemoGraph) -> None:
    # A generator emitting sorted or canonical-direction edges would hide loader bugs.
    assert 0.4 < (graph.edges["src"] < graph.edges["dst"]).mean() < 0.6
    assert not graph.edges["src"].is_monotonic_increasing


@pytest.mark.parametrize("homophily", [0.2, 0.8, 0.95])
def test_homophily_is_as_requested(homophily: float) -> None:
    graph = generate_demo_graph(NUM_NODES, homophily=homophily, seed=11)
    label_of = graph.nodes.set_index("node_id")["label"]
    src_label = graph.edges["src"].map(label_of)
    dst_label = graph.edges["dst"].map(label_of)
    both_labeled = src_label.notna() & dst_label.notna()
    measured = (src_label[both_labeled] == dst_label[both_labeled]).mean()
    assert measured == pytest.approx(homophily, abs=0.05)


def test_word_features_predict_the_class(graph: DemoGraph) -> None:
    # Nearest class centroid, fitted on one half and scored on the other: if words were
    # unrelated to labels this would sit near chance (0.2 with 5 classes).
    labeled = graph.nodes[graph.nodes["label"].notna()]
    words = labeled.filter(regex=r"^w\d+$").to_numpy(dtype=float)
    labels = labeled["label"].to_numpy(dtype=str)
    half = len(labeled) // 2
    classes = np.unique(labels[:half])
    centroids = np.stack([words[:half][labels[:half] == c].mean(axis=0) for c in classes])
    distances = ((words[half:, None, :] - centroids[None, :, :]) ** 2).sum(axis=-1)
    accuracy = np.mean(classes[distances.argmin(axis=1)] == labels[half:])
    assert accuracy > 0.6


def test_written_tables_read_back_unchanged(graph: DemoGraph, tmp_path: pathlib.Path) -> None:
    nodes_path, edges_path = write_demo_graph(graph, tmp_path)
    assert (nodes_path.name, edges_path.name) == (NODES_FILE, EDGES_FILE)
    nodes = pd.read_csv(nodes_path)
    edges = pd.read_csv(edges_path)
    expected_nodes = graph.nodes.astype({"label": object}).where(graph.nodes.notna(), np.nan)
    pd.testing.assert_frame_equal(nodes, expected_nodes, check_dtype=False)
    pd.testing.assert_frame_equal(edges, graph.edges)
    assert not list(tmp_path.glob("*.partial"))


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="homophily"):
        generate_demo_graph(100, homophily=1.5)
    with pytest.raises(ValueError, match="num_nodes"):
        generate_demo_graph(3, num_classes=5)
    with pytest.raises(ValueError, match="avg_degree"):
        generate_demo_graph(20, avg_degree=15.0)


def test_command_line_writes_both_tables(tmp_path: pathlib.Path) -> None:
    main(["--nodes", "500", "--seed", "2", "-o", str(tmp_path / "demo")])
    nodes = pd.read_csv(tmp_path / "demo" / NODES_FILE)
    edges = pd.read_csv(tmp_path / "demo" / EDGES_FILE)
    assert len(nodes) == 500
    assert len(edges) == 2_000
