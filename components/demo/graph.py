"""A deterministic, class-structured demo graph, generated locally instead of downloaded.

`gnnflow run` with no arguments and the tests need a graph that exists on every machine
(no dataset downloads are possible here) and that a GNN can actually learn from: labels
are predictable from node features somewhat and from neighbours' labels more (edges are
homophilous), so a graph model measurably beats a feature-only one. The tables look like
user input, not like preprocessed data: opaque string ids, class names as strings, a
categorical column, a few unlabeled nodes, no split column.

    python -m components.demo.graph --nodes 10000 --seed 0 -o /tmp/demo
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import io
import logging
import os
import pathlib
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

_log = logging.getLogger(__name__)

NODES_FILE = "nodes.csv.gz"
EDGES_FILE = "edges.csv.gz"

VENUES: tuple[str, ...] = ("ICML", "NeurIPS", "KDD", "WWW", "SIGIR", "ACL", "CVPR", "VLDB")

# Chosen so that a nearest-centroid classifier on the words alone is clearly better than
# chance but far from perfect, which leaves room for the graph to help.
_PREFERRED_WORD_PROBABILITY = 0.2
_BACKGROUND_WORD_PROBABILITY = 0.04
_UNLABELED_FRACTION = 0.01
_VENUE_AFFINITY = 0.4  # probability a node's venue is its class's favourite
_SCORE_CLASS_SPREAD = 1.0  # distance between the extreme class means of `score`, in std units
_SCORE_DECIMALS = 4
# Node activity is log-normal so degrees are skewed like real graphs, but mildly so that
# rejection of duplicate pairs stays cheap.
_ACTIVITY_SIGMA = 0.6
_MAX_SAMPLING_ROUNDS = 200


@dataclasses.dataclass(frozen=True)
class DemoGraph:
    """A node table and an edge table, shaped like raw user input.

    `nodes` has `node_id`, `label` (None for unlabeled nodes), `w0..w{k-1}` (0/1),
    `score` and `venue`; `edges` has `src` and `dst`, each undirected pair once.
    """

    nodes: pd.DataFrame
    edges: pd.DataFrame


def generate_demo_graph(
    num_nodes: int = 10_000,
    *,
    num_classes: int = 5,
    num_word_features: int = 64,
    avg_degree: float = 8.0,
    homophily: float = 0.8,
    seed: int = 0,
) -> DemoGraph:
    """Generate a graph whose labels are learnable from features and neighbourhoods.

    The same arguments always give the same tables. `avg_degree` counts both ends of an
    undirected edge, so the graph has `round(num_nodes * avg_degree / 2)` edges, of
    which exactly `round(homophily * num_edges)` join two nodes of the same class.
    """
    _check_arguments(num_nodes, num_classes, num_word_features, avg_degree, homophily)
    rng = np.random.default_rng(seed)

    classes = _assign_classes(num_nodes, num_classes, rng)
    node_ids = _opaque_ids(num_nodes, rng)
    nodes = _node_table(node_ids, classes, num_classes, num_word_features, rng)

    num_edges = round(num_nodes * avg_degree / 2)
    src, dst = _homophilous_edges(classes, num_classes, num_edges, homophily, rng)
    edges = pd.DataFrame({"src": node_ids[src], "dst": node_ids[dst]})
    return DemoGraph(nodes=nodes, edges=edges)


def write_demo_graph(graph: DemoGraph, directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Write `nodes.csv.gz` and `edges.csv.gz` into `directory`; return their paths.

    The bytes depend only on the tables (gzip header without timestamp or file name), so
    a re-generated demo is byte-identical and caches keyed on file contents stay valid.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    nodes_path = directory / NODES_FILE
    edges_path = directory / EDGES_FILE
    _write_csv_gz(graph.nodes, nodes_path)
    _write_csv_gz(graph.edges, edges_path)
    return nodes_path, edges_path


def _check_arguments(num_nodes: int, num_classes: int, num_word_features: int, avg_degree: float, homophily: float) -> None:
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    if num_nodes < max(2, num_classes):
        raise ValueError(f"num_nodes must be at least max(2, num_classes), got {num_nodes}")
    if num_word_features < 1:
        raise ValueError(f"num_word_features must be at least 1, got {num_word_features}")
    if not avg_degree >= 0:
        raise ValueError(f"avg_degree must be non-negative, got {avg_degree}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    if num_classes == 1 and homophily < 1.0:
        raise ValueError("with a single class every edge is within class: use homophily=1.0")


def _assign_classes(num_nodes: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Class index per node, mildly imbalanced, every class non-empty, in random order."""
    # Exact sizes (rather than sampled labels) guarantee no class is empty on small graphs.
    weights = np.linspace(1.5, 0.75, num_classes)
    sizes = np.floor(weights / weights.sum() * (num_nodes - num_classes)).astype(np.int64) + 1
    sizes[: num_nodes - sizes.sum()] += 1
    return rng.permutation(np.repeat(np.arange(num_classes), sizes))


def _opaque_ids(num_nodes: int, rng: np.random.Generator) -> np.ndarray:
    """Unique ids like 'u3fa09c1b', so nothing downstream can rely on ids being 0..n-1."""
    numbers = rng.choice(np.uint64(1) << np.uint64(32), size=num_nodes, replace=False).astype(np.uint64)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    nibbles = (numbers[:, None] >> shifts) & np.uint64(0xF)
    hex_digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[nibbles]
    prefix = np.full((num_nodes, 1), ord("u"), dtype=np.uint8)
    as_bytes = np.ascontiguousarray(np.hstack([prefix, hex_digits])).view("S9").ravel()
    return as_bytes.astype(str).astype(object)


def _node_table(
    node_ids: np.ndarray,
    classes: np.ndarray,
    num_classes: int,
    num_word_features: int,
    rng: np.random.Generator,
) -> pd.DataFrame:
    num_nodes = len(classes)

    labels = np.array([f"class_{c}" for c in range(num_classes)], dtype=object)[classes]
    num_unlabeled = round(_UNLABELED_FRACTION * num_nodes)
    labels[rng.choice(num_nodes, size=num_unlabeled, replace=False)] = None

    words = _class_words(classes, num_classes, num_word_features, rng)

    class_means = np.linspace(-0.5, 0.5, num_classes) * _SCORE_CLASS_SPREAD if num_classes > 1 else np.zeros(1)
    score = np.round(class_means[classes] + rng.standard_normal(num_nodes), _SCORE_DECIMALS)

    favourite = classes % len(VENUES)
    random_venue = rng.integers(len(VENUES), size=num_nodes)
    venue_index = np.where(rng.random(num_nodes) < _VENUE_AFFINITY, favourite, random_venue)
    venue = np.array(VENUES, dtype=object)[venue_index]

    columns: dict[str, object] = {"node_id": node_ids, "label": labels}
    columns.update({f"w{j}": words[:, j] for j in range(num_word_features)})
    columns["score"] = score
    columns["venue"] = venue
    return pd.DataFrame(columns)


def _class_words(classes: np.ndarray, num_classes: int, num_word_features: int, rng: np.random.Generator) -> np.ndarray:
    """Binary word presence: each class uses its own preferred words more often."""
    # Deal the vocabulary out to the classes like cards, so preferred sets are disjoint
    # whenever there are at least as many words as classes.
    preferred = np.zeros((num_classes, num_word_features), dtype=bool)
    dealt = rng.permutation(num_word_features)
    preferred[np.arange(num_word_features) % num_classes, dealt] = True
    probability = np.where(preferred, _PREFERRED_WORD_PROBABILITY, _BACKGROUND_WORD_PROBABILITY)
    return (rng.random((len(classes), num_word_features)) < probability[classes]).astype(np.int8)


def _homophilous_edges(
    classes: np.ndarray,
    num_classes: int,
    num_edges: int,
    homophily: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Node indices of `num_edges` distinct undirected edges, shuffled, random direction."""
    num_nodes = len(classes)
    sizes = np.bincount(classes, minlength=num_classes).astype(np.int64)
    intra_capacity = int((sizes * (sizes - 1) // 2).sum())
    inter_capacity = num_nodes * (num_nodes - 1) // 2 - intra_capacity
    num_intra = round(homophily * num_edges)
    num_inter = num_edges - num_intra
    # Rejection sampling slows down as the graph fills up; demand plenty of headroom.
    if num_intra > intra_capacity // 2 or num_inter > inter_capacity // 2:
        raise ValueError(
            f"{num_edges} edges with homophily {homophily} do not fit comfortably in {num_nodes} nodes: lower avg_degree or add nodes"
        )

    sampler = _ClassSampler(classes, rng)
    intra = _distinct_pairs(num_intra, num_nodes, lambda k: sampler.pairs(k, same_class=True))
    inter = _distinct_pairs(num_inter, num_nodes, lambda k: sampler.pairs(k, same_class=False))
    pairs = rng.permutation(np.concatenate([intra, inter]))

    low, high = pairs // num_nodes, pairs % num_nodes
    # Raw edge lists rarely store the smaller id first; neither should the demo.
    flip = rng.random(len(pairs)) < 0.5
    return np.where(flip, high, low), np.where(flip, low, high)


class _ClassSampler:
    """Draws node pairs with probability proportional to node activity, by class."""

    def __init__(self, classes: np.ndarray, rng: np.random.Generator) -> None:
        self._rng = rng
        self._num_classes = int(classes.max()) + 1
        activity = rng.lognormal(0.0, _ACTIVITY_SIGMA, size=len(classes))
        # Nodes sorted by class make every class a contiguous slice of one cumulative sum,
        # so sampling "a node of class c" is one searchsorted for all draws at once.
        self._order = np.argsort(classes, kind="stable")
        self._cumulative = np.cumsum(activity[self._order])
        ends = np.cumsum(np.bincount(classes, minlength=self._num_classes))
        starts = np.concatenate([[0], ends[:-1]])
        self._class_low = np.where(starts > 0, self._cumulative[np.maximum(starts - 1, 0)], 0.0)
        self._class_high = self._cumulative[ends - 1]
        self._classes = classes

    def nodes_of(self, wanted_classes: np.ndarray) -> np.ndarray:
        low, high = self._class_low[wanted_classes], self._class_high[wanted_classes]
        targets = low + self._rng.random(len(wanted_classes)) * (high - low)
        positions = np.searchsorted(self._cumulative, targets, side="right")
        return self._order[np.minimum(positions, len(self._order) - 1)]

    def pairs(self, count: int, *, same_class: bool) -> tuple[np.ndarray, np.ndarray]:
        src = np.searchsorted(self._cumulative, self._rng.random(count) * self._cumulative[-1], side="right")
        src = self._order[np.minimum(src, len(self._order) - 1)]
        src_class = self._classes[src]
        if same_class:
            dst_class = src_class
        else:
            dst_class = (src_class + self._rng.integers(1, self._num_classes, size=count)) % self._num_classes
        return src, self.nodes_of(dst_class)


def _distinct_pairs(
    count: int,
    num_nodes: int,
    draw: Callable[[int], tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """`count` distinct undirected pairs without self loops, encoded as low * n + high."""
    kept = np.empty(0, dtype=np.int64)
    for _ in range(_MAX_SAMPLING_ROUNDS):
        missing = count - len(kept)
        if missing <= 0:
            break
        # Oversample a little so one or two rounds usually suffice.
        src, dst = draw(int(missing * 1.1) + 16)
        valid = src != dst
        low = np.minimum(src, dst)[valid].astype(np.int64)
        high = np.maximum(src, dst)[valid].astype(np.int64)
        candidates = np.concatenate([kept, low * num_nodes + high])
        # Keep first occurrences in draw order so the result does not depend on sorting.
        _, first = np.unique(candidates, return_index=True)
        kept = candidates[np.sort(first)]
    else:
        raise RuntimeError(f"could not draw {count} distinct edges in {_MAX_SAMPLING_ROUNDS} rounds")
    return kept[:count]


def _write_csv_gz(table: pd.DataFrame, path: pathlib.Path) -> None:
    text = table.to_csv(index=False, lineterminator="\n")
    buffer = io.BytesIO()
    # filename="" and mtime=0 keep the gzip header free of anything but the content.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=6, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    # Write then rename, so an interrupted run never leaves a truncated table behind.
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(buffer.getvalue())
    os.replace(partial, path)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: generate the demo graph and write it to a directory."""
    parser = argparse.ArgumentParser(prog="python -m components.demo.graph", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=pathlib.Path, required=True, help="directory to write into")
    parser.add_argument("--nodes", type=int, default=10_000, help="number of nodes (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--classes", type=int, default=5, help="number of classes (default 5)")
    parser.add_argument("--word-features", type=int, default=64, help="binary word columns (default 64)")
    parser.add_argument("--avg-degree", type=float, default=8.0, help="average node degree (default 8)")
    parser.add_argument("--homophily", type=float, default=0.8, help="within-class edge fraction (default 0.8)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        graph = generate_demo_graph(
            args.nodes,
            num_classes=args.classes,
            num_word_features=args.word_features,
            avg_degree=args.avg_degree,
            homophily=args.homophily,
            seed=args.seed,
        )
    except ValueError as error:
        parser.error(str(error))
    nodes_path, edges_path = write_demo_graph(graph, args.output)
    labeled = int(graph.nodes["label"].notna().sum())
    _log.info("wrote %d nodes (%d labeled) to %s", len(graph.nodes), labeled, nodes_path)
    _log.info("wrote %d undirected edges to %s", len(graph.edges), edges_path)


if __name__ == "__main__":
    main()
