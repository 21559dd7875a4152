"""The heterogeneous demo graph is deterministic, well-formed and carries class signal where meant."""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
import pytest

from components.demo.hetero_graph import (
    AUTHORS_FILE,
    CITES_FILE,
    FIELDS,
    PAPERS_FILE,
    WRITES_FILE,
    HeteroDemoGraph,
    generate_hetero_demo_graph,
    main,
    write_hetero_demo_graph,
)

WORD_COLUMNS = [f"w{j}" for j in range(16)]


@pytest.fixture(scope="module")
def graph() -> HeteroDemoGraph:
    return generate_hetero_demo_graph(seed=7)


def _written_bytes(graph: HeteroDemoGraph, directory: pathlib.Path) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in write_hetero_demo_graph(graph, directory).items()}


def _home_label_share(graph: HeteroDemoGraph) -> pd.Series:
    """Per author: the share of its papers that have its most common label."""
    label_of = graph.papers.set_index("paper_id")["label"]
    labels = graph.writes.assign(label=graph.writes["paper_id"].map(label_of))
    return labels.groupby("author_id")["label"].agg(lambda s: s.value_counts().iloc[0] / len(s))


def test_same_seed_gives_identical_bytes(tmp_path: pathlib.Path) -> None:
    first = _written_bytes(generate_hetero_demo_graph(seed=3), tmp_path / "a")
    second = _written_bytes(generate_hetero_demo_graph(seed=3), tmp_path / "b")
    assert first == second


def test_different_seed_gives_different_tables(tmp_path: pathlib.Path) -> None:
    first = _written_bytes(generate_hetero_demo_graph(seed=3), tmp_path / "a")
    second = _written_bytes(generate_hetero_demo_graph(seed=4), tmp_path / "b")
    assert all(first[name] != second[name] for name in first)


def test_counts_and_columns(graph: HeteroDemoGraph) -> None:
    assert list(graph.papers.columns) == ["paper_id", "label", *WORD_COLUMNS]
    assert list(graph.authors.columns) == ["author_id", "h_index", "field"]
    assert list(graph.cites.columns) == ["src", "dst"]
    assert list(graph.writes.columns) == ["author_id", "paper_id"]
    assert (len(graph.papers), len(graph.authors)) == (2000, 800)
    assert len(graph.cites) == 6000
    papers_per_author = graph.writes["author_id"].value_counts()
    assert len(papers_per_author) == 800, "every author writes something"
    assert papers_per_author.between(2, 6).all()
    assert len(graph.writes) == papers_per_author.sum()
    assert set(graph.papers["label"]) == {f"class_{c}" for c in range(4)}
    assert graph.papers["label"].notna().all()
    assert set(np.unique(graph.papers[WORD_COLUMNS].to_numpy())) == {0, 1}
    assert pd.api.types.is_integer_dtype(graph.authors["h_index"]) and (graph.authors["h_index"] >= 0).all()
    assert set(graph.authors["field"]) <= set(FIELDS) and graph.authors["field"].nunique() > 1


def test_ids_are_unique_opaque_strings(graph: HeteroDemoGraph) -> None:
    assert graph.papers["paper_id"].is_unique and graph.papers["paper_id"].str.fullmatch(r"p[0-9a-f]{8}").all()
    assert graph.authors["author_id"].is_unique and graph.authors["author_id"].str.fullmatch(r"a[0-9a-f]{8}").all()


def test_edges_reference_known_nodes_and_are_simple(graph: HeteroDemoGraph) -> None:
    papers, authors = graph.papers["paper_id"], graph.authors["author_id"]
    assert graph.cites["src"].isin(papers).all() and graph.cites["dst"].isin(papers).all()
    assert graph.writes["author_id"].isin(authors).all() and graph.writes["paper_id"].isin(papers).all()
    src, dst = graph.cites["src"], graph.cites["dst"]
    assert not (src == dst).any()
    low, high = src.where(src < dst, dst), dst.where(src < dst, src)
    assert not pd.DataFrame({"low": low, "high": high}).duplicated().any(), "each undirected citation once"
    assert not graph.writes.duplicated().any()
    assert not graph.writes["author_id"].is_monotonic_increasing, "writes rows are not grouped by author"


def test_citations_are_homophilous(graph: HeteroDemoGraph) -> None:
    label_of = graph.papers.set_index("paper_id")["label"]
    same = (graph.cites["src"].map(label_of) == graph.cites["dst"].map(label_of)).mean()
    # Random pairs would agree about 0.26 of the time with these class sizes.
    assert same == pytest.approx(0.8, abs=0.02)


def test_authors_concentrate_on_one_class(graph: HeteroDemoGraph) -> None:
    share = _home_label_share(graph)
    # Authors of 2-6 papers with uniformly random labels would average well under 0.7.
    assert share.mean() > 0.9
    assert (share == 1.0).mean() > 0.7


def test_author_attributes_are_not_class_informative(graph: HeteroDemoGraph) -> None:
    label_of = graph.papers.set_index("paper_id")["label"]
    labels = graph.writes.assign(label=graph.writes["paper_id"].map(label_of))
    home = labels.groupby("author_id")["label"].agg(lambda s: s.value_counts().index[0])
    h_index = graph.authors.set_index("author_id")["h_index"]
    means = h_index.groupby(home).mean()
    assert means.max() - means.min() < 0.5 * h_index.std()


def test_words_alone_are_a_weak_signal(graph: HeteroDemoGraph) -> None:
    # Nearest class centroid on one half, scored on the other: better than chance (about
    # 0.3 for the largest class), far from perfect, so the graph has room to help.
    words = graph.papers[WORD_COLUMNS].to_numpy(dtype=float)
    labels = graph.papers["label"].to_numpy(dtype=str)
    half = len(labels) // 2
    classes = np.unique(labels)
    centroids = np.stack([words[:half][labels[:half] == c].mean(axis=0) for c in classes])
    distances = ((words[half:, None, :] - centroids[None, :, :]) ** 2).sum(axis=-1)
    accuracy = np.mean(classes[distances.argmin(axis=1)] == labels[half:])
    assert 0.35 < accuracy < 0.55


def test_author_votes_predict_the_class(graph: HeteroDemoGraph) -> None:
    # Each paper's label predicted as the majority label of its authors' *other* papers:
    # the signal a model can only get through the writes edges.
    label_of = graph.papers.set_index("paper_id")["label"]
    writes = graph.writes.assign(label=graph.writes["paper_id"].map(label_of))
    pairs = writes.merge(writes, on="author_id", suffixes=("", "_other"))
    pairs = pairs[pairs["paper_id"] != pairs["paper_id_other"]]
    votes = pairs.groupby(["paper_id", "label_other"]).size().reset_index(name="n")
    votes = votes.sort_values(["paper_id", "n", "label_other"], ascending=[True, False, True]).drop_duplicates("paper_id")
    accuracy = (votes["label_other"].to_numpy() == votes["paper_id"].map(label_of).to_numpy()).mean()
    assert len(votes) > 0.6 * len(graph.papers)
    assert accuracy > 0.85


def test_written_tables_read_back_unchanged(graph: HeteroDemoGraph, tmp_path: pathlib.Path) -> None:
    paths = write_hetero_demo_graph(graph, tmp_path)
    assert {name: p.name for name, p in paths.items()} == {
        "papers": PAPERS_FILE,
        "authors": AUTHORS_FILE,
        "cites": CITES_FILE,
        "writes": WRITES_FILE,
    }
    for name, path in paths.items():
        pd.testing.assert_frame_equal(pd.read_csv(path), getattr(graph, name), check_dtype=False)
    assert not list(tmp_path.glob("*.partial"))


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_papers"):
        generate_hetero_demo_graph(10, 5)
    with pytest.raises(ValueError, match="num_authors"):
        generate_hetero_demo_graph(500, 0)


def test_command_line_writes_all_tables(tmp_path: pathlib.Path) -> None:
    main(["--papers", "500", "--authors", "200", "--seed", "2", "-o", str(tmp_path / "demo")])
    assert len(pd.read_csv(tmp_path / "demo" / PAPERS_FILE)) == 500
    assert len(pd.read_csv(tmp_path / "demo" / AUTHORS_FILE)) == 200
    assert len(pd.read_csv(tmp_path / "demo" / CITES_FILE)) == 1500
    assert len(pd.read_csv(tmp_path / "demo" / WRITES_FILE)) > 400
