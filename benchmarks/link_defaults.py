"""Whether link prediction learns with the defaults on graphs it was not shaped on, and the dot decoder's starting scale.

    .venv/bin/python benchmarks/link_defaults.py [--scales 1 5 10] [--seeds 0] [--epochs 12] [--graphs ...]
    .venv/bin/python benchmarks/link_defaults.py --embeddings --world-size 2 --seeds 0 1 2 --graphs citeseer_words demo_authors

Every run goes through the real steps (preprocess, serialize, partition, train; one worker) with
the defaults (model.decoder dot, dropout 0.5, lr 0.01, weight decay 5e-4) and only
``model.dot_scale`` varied; the mlp decoder runs once as a reference. Only validation ROC-AUC
(at the best validation epoch) and the training loss are read: the test split plays no part.
The graphs, two with a featureless node type:

  citeseer_words   CiteSeer papers (word features) + featureless word nodes, paper-cites-paper
  demo_authors     the heterogeneous demo generator, authors without features, paper-cites-paper
  citeseer         CiteSeer alone (homogeneous), its citations
  demo             the homogeneous demo generator (3,000 nodes), its edges

The rule for the starting scale: the best mean validation ROC-AUC over the graphs.

``--embeddings`` varies how featureless types' learnt embeddings train instead (on the graphs
that have one): replicated (one table per worker, dense Adam under DDP) against sharded with
each sparse optimizer and learning rate; ``--world-size 2`` shards them over two workers. The
rule for the sharded default: the best mean validation ROC-AUC; a cheaper optimizer (less state)
is kept when within 0.005 of it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from components import storage  # noqa: E402
from components.config import GnnflowConfig  # noqa: E402
from components.demo.graph import generate_demo_graph, write_demo_graph  # noqa: E402
from components.demo.hetero_graph import generate_hetero_demo_graph, write_hetero_demo_graph  # noqa: E402
from components.partition.step import partition  # noqa: E402
from components.preprocess.step import preprocess  # noqa: E402
from components.runtime.runlog import configure  # noqa: E402
from components.serialize.step import serialize  # noqa: E402
from components.train.step import train  # noqa: E402

CITESEER = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "citeseer"
SPLIT = {"train": 0.85, "val": 0.05, "test": 0.10, "seed": 1}


def _citeseer_words(folder: pathlib.Path) -> dict:
    from tests.hetero_citeseer import hetero_link_config, write_hetero_citeseer

    raw = hetero_link_config(write_hetero_citeseer(folder))
    raw.pop("model")
    raw["training"] = {"fan_outs": {"cites": [10, 10], "has_word": [5, 5]}}
    return raw


def _demo_authors(folder: pathlib.Path) -> dict:
    tables = write_hetero_demo_graph(generate_hetero_demo_graph(2000, 800, seed=4), folder)
    return {
        "graph": {
            "nodes": [
                {"type": "paper", "uri": str(tables["papers"]), "id_column": "paper_id", "features": [{"columns": ["w*"]}]},
                {"type": "author", "uri": str(tables["authors"]), "id_column": "author_id"},  # no features: learnt embeddings
            ],
            "edges": [
                {"type": "cites", "uri": str(tables["cites"]), "src_type": "paper", "dst_type": "paper"},
                {
                    "type": "writes",
                    "uri": str(tables["writes"]),
                    "src_column": "author_id",
                    "dst_column": "paper_id",
                    "src_type": "author",
                    "dst_type": "paper",
                },
            ],
        },
        "task": {"type": "link_prediction", "target": "cites", "split": SPLIT},
    }


def _citeseer(folder: pathlib.Path) -> dict:
    return {
        "graph": {
            "nodes": [{"type": "paper", "uri": str(CITESEER / "nodes.csv.gz"), "features": [{"columns": ["f*"]}]}],
            "edges": [{"type": "cites", "uri": str(CITESEER / "edges.csv.gz"), "src_type": "paper", "dst_type": "paper"}],
        },
        "task": {"type": "link_prediction", "split": SPLIT},
    }


def _demo(folder: pathlib.Path) -> dict:
    nodes, edges = write_demo_graph(generate_demo_graph(3000, seed=5), folder)
    return {
        "graph": {
            "nodes": [
                {"type": "node", "uri": str(nodes), "features": [{"columns": ["w*"]}, {"columns": ["score"], "transform": "standardize"}]}
            ],
            "edges": [{"type": "edge", "uri": str(edges), "src_type": "node", "dst_type": "node"}],
        },
        "task": {"type": "link_prediction", "split": SPLIT},
    }


GRAPHS: dict[str, Callable[[pathlib.Path], dict]] = {
    "citeseer_words": _citeseer_words,
    "demo_authors": _demo_authors,
    "citeseer": _citeseer,
    "demo": _demo,
}


def run_graph(
    name: str, work: pathlib.Path, variants: dict[str, dict], seeds: list[int], epochs: int, world_size: int = 1
) -> dict[str, list[float]]:
    raw = GRAPHS[name](work / "tables")
    raw["resources"] = {"world_size": world_size}
    raw.setdefault("training", {})
    root = storage.parse_uri(work)
    base = GnnflowConfig.model_validate(raw)
    preprocess(base, root.join("pre"))
    serialize(base, root.join("pre"), root.join("tfr"))
    partition(root.join("tfr"), root.join("parts"), base.partition, world_size=world_size)
    found: dict[str, list[float]] = {}
    for variant, change in variants.items():
        for seed in seeds:
            training = {**raw["training"], **change.get("training", {}), "epochs": epochs, "early_stopping_patience": None, "seed": seed}
            config = GnnflowConfig.model_validate({**raw, "model": change.get("model", {}), "training": training})
            published = train(config, root.join("parts"), work / f"{variant}-{seed}")
            assert published is not None
            metrics = published.read_json("metrics.json")
            losses = [json.loads(line)["loss"] for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
            found.setdefault(variant, []).append(metrics["val_roc_auc"])
            print(
                json.dumps(
                    {"graph": name, "variant": variant, "seed": seed, "val_roc_auc": metrics["val_roc_auc"], "last_loss": losses[-1]}
                ),
                flush=True,
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    parser.add_argument("--scales", nargs="+", type=float, default=[1.0, 5.0, 10.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--embeddings", action="store_true", help="vary the learnt embeddings' storage and optimizer instead")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end)")
    args = parser.parse_args()
    configure(logging.WARNING)
    if args.embeddings:
        sharded = {"model": {"learnt_embeddings": "sharded"}}
        variants = {"replicated": {"model": {"learnt_embeddings": "replicated"}}} | {
            f"{name} lr={lr:g}": sharded | {"training": {"embedding_optimizer": name, "embedding_learning_rate": lr}}
            for name, lr in [("sparse_adam", 0.01), ("row_adagrad", 0.01), ("row_adagrad", 0.1)]
        }
    else:
        variants = {f"dot_scale={s:g}": {"model": {"dot_scale": s}} for s in args.scales} | {"mlp": {"model": {"decoder": "mlp"}}}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnflow-link-defaults-") as scratch:
        work = pathlib.Path(args.out or scratch)
        table = {g: run_graph(g, work / g, variants, args.seeds, args.epochs, args.world_size) for g in args.graphs}
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.perf_counter() - start:.0f} s, seeds {args.seeds}")
    print("| variant | " + " | ".join(args.graphs) + " | mean |")
    print("|---" * (len(args.graphs) + 2) + "|")
    means = {}
    for variant in variants:
        cells = [statistics.mean(table[g][variant]) for g in args.graphs]
        means[variant] = statistics.mean(cells)
        print(f"| {variant} | " + " | ".join(f"{c:.4f}" for c in cells) + f" | {means[variant]:.4f} |")
    if not args.embeddings:
        dot = {v: m for v, m in means.items() if v.startswith("dot_scale=")}
        print("chosen (best mean validation ROC-AUC):", max(dot, key=dot.__getitem__))


if __name__ == "__main__":
    main()
