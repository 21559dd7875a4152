"""A deterministic heterogeneous demo graph: papers, authors, citations and authorship.

The homogeneous demo (`components.demo.graph`) exercises one node and one edge type; this one
exercises typed nodes with different feature columns and typed edges in both directions:

- papers have a class label (`class_0..class_3`) and a few binary word columns that carry
  only a weak class signal on their own;
- authors have no label, a numeric `h_index` unrelated to any class and a categorical
  `field`; each writes 2-6 papers, mostly of its own 'home' class, so an author's papers
  vote for one class and a paper's co-authors' other papers are informative;
- `cites` (paper - paper) is undirected and homophilous; `writes` (author -> paper) is
  directed.

The tables look like raw user input: opaque string ids, class names as strings, no split.

    python -m components.demo.hetero_graph --papers 2000 --authors 800 --seed 0 -o /tmp/hetero
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
from collections.abc import Sequence

import numpy as np
import pandas as pd

from components.demo.graph import _assign_classes, _homophilous_edges, _opaque_ids, _write_csv_gz

_log = logging.getLogger(__name__)

PAPERS_FILE = "papers.csv.gz"
AUTHORS_FILE = "authors.csv.gz"
CITES_FILE = "cites.csv.gz"
WRITES_FILE = "writes.csv.gz"

NUM_CLASSES = 4
NUM_WORD_FEATURES = 16
FIELDS: tuple[str, ...] = ("theory", "systems", "applications", "data", "interdisciplinary")

# Each class prefers 4 of the 16 words, and only mildly: a nearest-centroid classifier on the
# words alone lands well short of what the graph allows.
_PREFERRED_WORD_PROBABILITY = 0.16
_BACKGROUND_WORD_PROBABILITY = 0.07
_CITES_AVG_DEGREE = 6.0
_CITES_HOMOPHILY = 0.8
_MIN_PAPERS_PER_AUTHOR = 2
_MAX_PAPERS_PER_AUTHOR = 6
_HOME_CLASS_AFFINITY = 0.95  # probability that a paper an author writes is of the home class
_MAX_SAMPLING_ROUNDS = 100


@dataclasses.dataclass(frozen=True)
class HeteroDemoGraph:
    """Two node tables and two edge tables, shaped like raw user input.

    `papers`: `paper_id`, `label`, `w0..w15` (0/1). `authors`: `author_id`, `h_index`,
    `field`. `cites`: `src`, `dst` (paper ids, each undirected pair once). `writes`:
    `author_id`, `paper_id` (each pair once).
    """

    papers: pd.DataFrame
    authors: pd.DataFrame
    cites: pd.DataFrame
    writes: pd.DataFrame


def generate_hetero_demo_graph(num_papers: int = 2000, num_authors: int = 800, *, seed: int = 0) -> HeteroDemoGraph:
    """Generate the papers/authors graph; the same arguments always give the same tables."""
    if num_papers < 4 * NUM_CLASSES * _MAX_PAPERS_PER_AUTHOR:
        raise ValueError(f"num_papers must be at least {4 * NUM_CLASSES * _MAX_PAPERS_PER_AUTHOR}, got {num_papers}")
    if num_authors < 1:
        raise ValueError(f"num_authors must be at least 1, got {num_authors}")
    rng = np.random.default_rng(seed)

    classes = _assign_classes(num_papers, NUM_CLASSES, rng)
    paper_ids = _prefixed(_opaque_ids(num_papers, rng), "p")
    papers = _paper_table(paper_ids, classes, rng)

    num_cites = round(num_papers * _CITES_AVG_DEGREE / 2)
    src, dst = _homophilous_edges(classes, NUM_CLASSES, num_cites, _CITES_HOMOPHILY, rng)
    cites = pd.DataFrame({"src": paper_ids[src], "dst": paper_ids[dst]})

    author_ids = _prefixed(_opaque_ids(num_authors, rng), "a")
    home = rng.integers(NUM_CLASSES, size=num_authors)
    papers_per_author = rng.integers(_MIN_PAPERS_PER_AUTHOR, _MAX_PAPERS_PER_AUTHOR + 1, size=num_authors)
    author_of, paper_of = _authorship(classes, home, papers_per_author, rng)
    shuffled = rng.permutation(len(author_of))  # raw edge lists are rarely grouped by author
    writes = pd.DataFrame({"author_id": author_ids[author_of[shuffled]], "paper_id": paper_ids[paper_of[shuffled]]})

    # h_index grows with output (a real-looking dependency) but not with the home class.
    h_index = rng.poisson(1.0 + papers_per_author).astype(np.int64)
    field = np.array(FIELDS, dtype=object)[rng.integers(len(FIELDS), size=num_authors)]
    authors = pd.DataFrame({"author_id": author_ids, "h_index": h_index, "field": field})
    return HeteroDemoGraph(papers=papers, authors=authors, cites=cites, writes=writes)


def write_hetero_demo_graph(graph: HeteroDemoGraph, directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """Write the four tables as gzipped CSV into `directory`; return their paths by table name.

    The bytes depend only on the tables (see `components.demo.graph.write_demo_graph`).
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "papers": directory / PAPERS_FILE,
        "authors": directory / AUTHORS_FILE,
        "cites": directory / CITES_FILE,
        "writes": directory / WRITES_FILE,
    }
    for name, path in paths.items():
        _write_csv_gz(getattr(graph, name), path)
    return paths


def _prefixed(ids: np.ndarray, prefix: str) -> np.ndarray:
    """'u3fa09c1b' → 'p3fa09c1b': one id alphabet per node type, easier to read in errors."""
    return pd.Series(ids).str.slice_replace(0, 1, prefix).to_numpy(dtype=object)


def _paper_table(paper_ids: np.ndarray, classes: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    labels = np.array([f"class_{c}" for c in range(NUM_CLASSES)], dtype=object)[classes]
    preferred = np.zeros((NUM_CLASSES, NUM_WORD_FEATURES), dtype=bool)
    preferred[np.arange(NUM_WORD_FEATURES) % NUM_CLASSES, rng.permutation(NUM_WORD_FEATURES)] = True
    probability = np.where(preferred, _PREFERRED_WORD_PROBABILITY, _BACKGROUND_WORD_PROBABILITY)
    words = (rng.random((len(classes), NUM_WORD_FEATURES)) < probability[classes]).astype(np.int8)
    columns: dict[str, object] = {"paper_id": paper_ids, "label": labels}
    columns.update({f"w{j}": words[:, j] for j in range(NUM_WORD_FEATURES)})
    return pd.DataFrame(columns)


def _authorship(
    classes: np.ndarray, home: np.ndarray, papers_per_author: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(author index, paper index) of every authorship, each pair once, grouped by author.

    Each of author `a`'s `papers_per_author[a]` papers is of class `home[a]` with probability
    `_HOME_CLASS_AFFINITY`, else of a uniformly chosen other class; within a class, papers
    are drawn uniformly. Duplicate pairs are re-drawn.
    """
    order = np.argsort(classes, kind="stable")  # papers grouped by class
    ends = np.cumsum(np.bincount(classes, minlength=NUM_CLASSES))
    starts = ends - np.bincount(classes, minlength=NUM_CLASSES)

    def draw(authors: np.ndarray) -> np.ndarray:
        stray = rng.random(len(authors)) >= _HOME_CLASS_AFFINITY
        wanted = np.where(stray, (home[authors] + rng.integers(1, NUM_CLASSES, size=len(authors))) % NUM_CLASSES, home[authors])
        positions = starts[wanted] + (rng.random(len(authors)) * (ends[wanted] - starts[wanted])).astype(np.int64)
        return order[positions]

    author_of = np.repeat(np.arange(len(home)), papers_per_author)
    paper_of = draw(author_of)
    num_papers = len(classes)
    for _ in range(_MAX_SAMPLING_ROUNDS):
        keys = author_of.astype(np.int64) * num_papers + paper_of
        _, first = np.unique(keys, return_index=True)
        repeated = np.ones(len(keys), dtype=bool)
        repeated[first] = False
        if not repeated.any():
            return author_of, paper_of
        paper_of[repeated] = draw(author_of[repeated])
    raise RuntimeError(f"could not draw distinct authorships in {_MAX_SAMPLING_ROUNDS} rounds")


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: generate the heterogeneous demo graph into a directory."""
    parser = argparse.ArgumentParser(prog="python -m components.demo.hetero_graph", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=pathlib.Path, required=True, help="directory to write into")
    parser.add_argument("--papers", type=int, default=2000, help="number of papers (default 2000)")
    parser.add_argument("--authors", type=int, default=800, help="number of authors (default 800)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        graph = generate_hetero_demo_graph(args.papers, args.authors, seed=args.seed)
    except ValueError as error:
        parser.error(str(error))
    for name, path in write_hetero_demo_graph(graph, args.output).items():
        _log.info("wrote %d %s rows to %s", len(getattr(graph, name)), name, path)


if __name__ == "__main__":
    main()
