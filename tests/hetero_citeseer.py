"""A heterogeneous CiteSeer built from the shared tables (no data files of its own): node types
``paper`` (the word-presence features) and ``word`` (no features: one node per feature column),
edge types ``paper-cites-paper`` and ``paper-has_word-word`` (one edge per non-zero cell)."""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

from tests.test_citeseer import CITESEER


def write_hetero_citeseer(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """Writes papers.csv, words.csv and has_word.csv into ``folder``; returns every table's path
    (``cites`` is the shared edge table itself)."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = pd.read_csv(CITESEER / "nodes.csv.gz")
    words = [c for c in nodes.columns if c.startswith("f")]
    cells = nodes[words].to_numpy()
    paper_rows, word_columns = cells.nonzero()
    tables = {
        "papers": folder / "papers.csv",
        "words": folder / "words.csv",
        "has_word": folder / "has_word.csv",
        "cites": CITESEER / "edges.csv.gz",
    }
    nodes.drop(columns=["label", "split"]).to_csv(tables["papers"], index=False)
    pd.DataFrame({"word_id": words}).to_csv(tables["words"], index=False)
    pd.DataFrame({"paper_id": nodes["node_id"].to_numpy()[paper_rows], "word_id": [words[c] for c in word_columns]}).to_csv(
        tables["has_word"], index=False
    )
    return tables


def hetero_link_config(tables: dict[str, pathlib.Path], **sections: dict) -> dict:
    """Link prediction on paper-cites-paper over the heterogeneous graph, 85/5/10 split, as a
    YAML file would hold it; ``sections`` update the named sections."""
    raw = {
        "graph": {
            "nodes": [
                {"type": "paper", "uri": str(tables["papers"]), "features": [{"columns": ["f*"]}]},
                {"type": "word", "uri": str(tables["words"]), "id_column": "word_id"},
            ],
            "edges": [
                {"type": "cites", "uri": str(tables["cites"]), "src_type": "paper", "dst_type": "paper"},
                {
                    "type": "has_word",
                    "uri": str(tables["has_word"]),
                    "src_column": "paper_id",
                    "dst_column": "word_id",
                    "src_type": "paper",
                    "dst_type": "word",
                },
            ],
        },
        "task": {"type": "link_prediction", "target": "cites", "split": {"train": 0.85, "val": 0.05, "test": 0.10, "seed": 1}},
        "serialize": {"num_shards": 2},
        "resources": {"world_size": 2},
        "model": {"hidden_channels": 64, "dropout": 0.1, "decoder": "mlp"},
        "training": {
            "epochs": 60,
            "batch_size": 512,
            "learning_rate": 0.005,
            "weight_decay": 0.0,
            "early_stopping_patience": 20,
            "fan_outs": {"cites": [10, 10], "has_word": [5, 5]},
        },
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return raw


def write_label_tables(
    folder: pathlib.Path, tables: dict[str, pathlib.Path], *, hard_per_anchor: int = 5, min_shared_words: int = 3, seed: int = 0
) -> dict[str, pathlib.Path]:
    """Recommendation-style supervision from the citations: half of them stay in the graph as
    message edges (``cites``, replaced), the other half are held out of it as positive labels,
    split 70/10/20 into train/val/test. Hard negatives: for each (citing paper, split) of the
    positives, ``hard_per_anchor`` papers that share at least ``min_shared_words`` words with it
    and neither cite it nor are cited by it, in that split. Returns ``tables`` with ``cites``,
    ``positive_labels`` and ``hard_negatives`` pointing at the new tables."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    nodes = pd.read_csv(CITESEER / "nodes.csv.gz")
    ids = nodes["node_id"].to_numpy()
    row_of = {paper: i for i, paper in enumerate(ids)}
    words = nodes[[c for c in nodes.columns if c.startswith("f")]].to_numpy(dtype=np.float32)
    shared = words @ words.T
    cites = pd.read_csv(tables["cites"])
    cites = cites[cites["src"].isin(row_of) & cites["dst"].isin(row_of)]
    held = rng.random(len(cites)) < 0.5
    positives = cites[held].assign(split=rng.choice(["train", "val", "test"], size=int(held.sum()), p=[0.7, 0.1, 0.2]))
    allowed = np.ones(shared.shape, dtype=bool)  # neither cited nor citing, nor the paper itself
    src_rows, dst_rows = cites["src"].map(row_of).to_numpy(), cites["dst"].map(row_of).to_numpy()
    allowed[src_rows, dst_rows] = allowed[dst_rows, src_rows] = False
    np.fill_diagonal(allowed, False)
    candidates = (shared >= min_shared_words) & allowed
    negatives = []
    for (anchor, split), _ in positives.groupby(["src", "split"]):
        pool = np.flatnonzero(candidates[row_of[anchor]])
        for chosen in rng.choice(pool, size=min(hard_per_anchor, len(pool)), replace=False):
            negatives.append((anchor, ids[chosen], split))
    tables = dict(tables)
    tables["cites"] = folder / "cites_messages.csv"
    tables["positive_labels"], tables["hard_negatives"] = folder / "positive_labels.csv", folder / "hard_negatives.csv"
    cites[~held].to_csv(tables["cites"], index=False)
    positives.to_csv(tables["positive_labels"], index=False)
    pd.DataFrame(negatives, columns=["src", "dst", "split"]).to_csv(tables["hard_negatives"], index=False)
    return tables


def with_label_tables(raw: dict, tables: dict[str, pathlib.Path]) -> dict:
    """``raw`` (hetero_link_config) with the two label tables of write_label_tables."""
    raw = {
        **raw,
        "graph": {
            **raw["graph"],
            "edges": [
                *raw["graph"]["edges"],
                {
                    "type": "cites_positive",
                    "uri": str(tables["positive_labels"]),
                    "src_type": "paper",
                    "dst_type": "paper",
                    "split_column": "split",
                    "role": "positive_label",
                },
                {
                    "type": "cites_hard_negative",
                    "uri": str(tables["hard_negatives"]),
                    "src_type": "paper",
                    "dst_type": "paper",
                    "split_column": "split",
                    "role": "negative_label",
                },
            ],
        },
    }
    return raw
