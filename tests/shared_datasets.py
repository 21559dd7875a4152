"""The real graphs in ../shared/datasets that tests read, and what a test does where they are absent.

Locally a missing ../shared skips those tests with the reason; under ``CI=true`` it fails them,
so that CI never passes without having run them.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

CITESEER = pathlib.Path(__file__).resolve().parents[2] / "shared" / "datasets" / "citeseer"
_MISSING = f"CiteSeer tables not found at {CITESEER} (../shared is absent)"
_REQUIRED = os.environ.get("CI", "").lower() in ("true", "1")


def require_citeseer() -> None:
    """Skips the calling test or fixture where CiteSeer is absent; fails it under CI=true."""
    if not (CITESEER / "nodes.csv.gz").exists():
        if _REQUIRED:
            pytest.fail(f"{_MISSING}, and CI=true requires it")
        pytest.skip(_MISSING)


# Marks a test (or, as ``pytestmark``, a module) ``citeseer``: tests/conftest.py runs
# require_citeseer() before any fixture of such a test is set up.
needs_citeseer = pytest.mark.citeseer


def citeseer_test_chance() -> float:
    """The share of CiteSeer's commonest test class: the accuracy of always answering it."""
    import pandas as pd  # noqa: PLC0415 - only tests that score CiteSeer runs need it

    labels = pd.read_csv(CITESEER / "nodes.csv.gz", usecols=["label", "split"], dtype=str).query("split == 'test'")["label"]
    return float(labels.value_counts(normalize=True).max())


def citeseer_graph() -> dict:
    """A config's ``graph`` section over the CiteSeer tables: papers with features ``f*``, labels and the
    standard split, and citations (a new dict each call: tests change their copies)."""
    return {
        "nodes": [
            {
                "type": "paper",
                "uri": str(CITESEER / "nodes.csv.gz"),
                "label_column": "label",
                "split_column": "split",
                "features": [{"columns": ["f*"]}],
            }
        ],
        "edges": [{"type": "cites", "uri": str(CITESEER / "edges.csv.gz"), "src_type": "paper", "dst_type": "paper"}],
    }


def build_citeseer_node_partitions(root: pathlib.Path) -> dict[int, object]:
    """CiteSeer for node classification (standard split, 2 shards a type), preprocessed once and
    partitioned for 1 and for 2 workers: {workers: partition output URI}."""
    from components import storage
    from components.config import parse_config
    from components.partition.step import partition
    from components.preprocess.step import preprocess
    from components.serialize.step import serialize

    require_citeseer()
    config = parse_config(json.dumps({"graph": citeseer_graph(), "serialize": {"num_shards": 2}}), "CiteSeer node classification")
    base = storage.parse_uri(root)
    preprocess(config, base.join("pre"))
    serialize(config, base.join("pre"), base.join("tfr"))
    return {n: partition(base.join("tfr"), base.join(f"parts{n}"), config.partition, world_size=n).root for n in (1, 2)}
