"""Heterogeneous graphs with planted structure, for link prediction with the defaults.

Users, items and (optionally) tags, each node in one of ``communities`` hidden communities.
Users buy items, mostly (``affinity``) of their own community; items carry tags of their
community. Only the item type may have features, weak community indicators (``item_features``);
users and tags never do, so they are learnt embeddings. The target is user-buys-item: who buys
what is recoverable only through the graph (a user's other purchases, an item's tags).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def write_planted_hetero(
    folder: Path,
    *,
    users: int,
    items: int,
    tags: int = 0,
    communities: int = 8,
    purchases_per_user: int = 8,
    tags_per_item: int = 3,
    affinity: float = 0.9,
    item_features: bool = False,
    seed: int = 0,
) -> dict:
    """Writes the tables under ``folder``; returns a raw link-prediction config (defaults elsewhere)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    user_c, item_c = rng.integers(communities, size=users), rng.integers(communities, size=items)
    items_of = [np.flatnonzero(item_c == c) for c in range(communities)]
    buyer = np.repeat(np.arange(users), purchases_per_user)
    own = rng.random(len(buyer)) < affinity
    bought = np.where(
        own,
        [rng.choice(items_of[user_c[u]]) if len(items_of[user_c[u]]) else rng.integers(items) for u in buyer],
        rng.integers(items, size=len(buyer)),
    )
    buys = pd.DataFrame({"user": [f"u{u}" for u in buyer], "item": [f"i{i}" for i in bought]}).drop_duplicates()
    item_table = pd.DataFrame({"item_id": [f"i{i}" for i in range(items)]})
    if item_features:  # weak: the community's indicator is on with probability 0.3, any other with 0.1
        on = rng.random((items, communities)) < np.where(np.arange(communities) == item_c[:, None], 0.3, 0.1)
        item_table = item_table.join(pd.DataFrame(on.astype(int), columns=[f"c{j}" for j in range(communities)]))
    paths = {"users": folder / "users.csv", "items": folder / "items.csv", "buys": folder / "buys.csv"}
    pd.DataFrame({"user_id": [f"u{u}" for u in range(users)]}).to_csv(paths["users"], index=False)
    item_table.to_csv(paths["items"], index=False)
    buys.to_csv(paths["buys"], index=False)
    nodes = [
        {"type": "user", "uri": str(paths["users"]), "id_column": "user_id"},
        {
            "type": "item",
            "uri": str(paths["items"]),
            "id_column": "item_id",
            **({"features": [{"columns": ["c*"]}]} if item_features else {}),
        },
    ]
    edges = [
        {"type": "buys", "uri": str(paths["buys"]), "src_column": "user", "dst_column": "item", "src_type": "user", "dst_type": "item"}
    ]
    if tags:
        tag_c = rng.integers(communities, size=tags)
        tags_of = [np.flatnonzero(tag_c == c) for c in range(communities)]
        owner = np.repeat(np.arange(items), tags_per_item)
        tagged = [rng.choice(tags_of[item_c[i]]) if len(tags_of[item_c[i]]) else rng.integers(tags) for i in owner]
        paths["tags"], paths["tagged"] = folder / "tags.csv", folder / "tagged.csv"
        pd.DataFrame({"tag_id": [f"t{t}" for t in range(tags)]}).to_csv(paths["tags"], index=False)
        pd.DataFrame({"item": [f"i{i}" for i in owner], "tag": [f"t{t}" for t in tagged]}).drop_duplicates().to_csv(
            paths["tagged"], index=False
        )
        nodes.append({"type": "tag", "uri": str(paths["tags"]), "id_column": "tag_id"})
        edges.append(
            {
                "type": "tagged",
                "uri": str(paths["tagged"]),
                "src_column": "item",
                "dst_column": "tag",
                "src_type": "item",
                "dst_type": "tag",
            }
        )
    return {
        "graph": {"nodes": nodes, "edges": edges},
        "task": {"type": "link_prediction", "target": "buys", "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 1}},
    }


def write_planted_documents(
    folder: Path,
    *,
    docs: int,
    words: int = 500,
    communities: int = 6,
    words_per_doc: int = 20,
    cites_per_doc: int = 3,
    affinity: float = 0.85,
    seed: int = 0,
) -> dict:
    """CiteSeer's shape with planted communities: documents with 0/1 word columns ``w0..``, the same
    words as featureless nodes (doc-has_word-word), and the target doc-cites-doc. Each community
    prefers a tenth of the vocabulary (half a document's words come from it), and cites within
    itself with probability ``affinity``. Returns a raw link-prediction config."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    community = rng.integers(communities, size=docs)
    preferred = rng.integers(words, size=(communities, max(1, words // 10)))
    own = rng.random((docs, words_per_doc)) < 0.5
    drawn = np.where(
        own,
        preferred[community][np.arange(docs)[:, None], rng.integers(preferred.shape[1], size=(docs, words_per_doc))],
        rng.integers(words, size=(docs, words_per_doc)),
    )
    present = np.zeros((docs, words), dtype=np.int8)
    present[np.arange(docs)[:, None], drawn] = 1
    members = [np.flatnonzero(community == c) for c in range(communities)]
    citing = np.repeat(np.arange(docs), cites_per_doc)
    inside = rng.random(len(citing)) < affinity
    cited = np.where(inside, [rng.choice(members[community[d]]) for d in citing], rng.integers(docs, size=len(citing)))
    keep = citing != cited
    paths = {name: folder / f"{name}.csv" for name in ("docs", "words", "cites", "has_word")}
    table = pd.DataFrame(present, columns=[f"w{j}" for j in range(words)])
    table.insert(0, "doc_id", [f"d{d}" for d in range(docs)])
    table.to_csv(paths["docs"], index=False)
    pd.DataFrame({"word_id": [f"w{j}" for j in range(words)]}).to_csv(paths["words"], index=False)
    pairs = pd.DataFrame({"src": [f"d{d}" for d in citing[keep]], "dst": [f"d{d}" for d in cited[keep]]}).drop_duplicates()
    pairs.to_csv(paths["cites"], index=False)
    rows, cols = present.nonzero()
    pd.DataFrame({"doc": [f"d{d}" for d in rows], "word": [f"w{j}" for j in cols]}).to_csv(paths["has_word"], index=False)
    return {
        "graph": {
            "nodes": [
                {"type": "doc", "uri": str(paths["docs"]), "id_column": "doc_id", "features": [{"columns": ["w*"]}]},
                {"type": "word", "uri": str(paths["words"]), "id_column": "word_id"},
            ],
            "edges": [
                {"type": "cites", "uri": str(paths["cites"]), "src_type": "doc", "dst_type": "doc"},
                {
                    "type": "has_word",
                    "uri": str(paths["has_word"]),
                    "src_column": "doc",
                    "dst_column": "word",
                    "src_type": "doc",
                    "dst_type": "word",
                },
            ],
        },
        "task": {"type": "link_prediction", "target": "cites", "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 1}},
    }
