"""``preprocess.engine: beam`` reading ``bq://`` tables with ``ReadFromBigQuery`` (DIRECT_READ)
against the bqemulator on loopback: the same published bytes as the one-process engine on the
same tables, the row filter, bad values named by the row's id, and the project's datasets left
as they were.

Beam runs for real, with one worker inside the test process (``num_workers: 1``): Beam's
BigQuery IO reaches the emulator only where gnnflow redirected it, see
:mod:`components.beam_pipeline.bigquery_endpoints`. The tables hold their rows in the order the
Beam engine numbers them (by value, ids first), which is the emulator's read order, so the
one-process engine numbers them the same way."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from components import storage
from components.config import GnnflowConfig, apply_overrides
from components.errors import GnnflowError
from components.preprocess.step import preprocess
from components.warehouse.clients import bigquery_client
from tests.test_beam_engine import same_files
from tests.test_bigquery_input import _config, _load, _paper_spec, _papers

# Small blocks and a few sort ranges: every table spans several blocks and parts.
_READING = {"preprocess.parquet_batch_rows": 5, "preprocess.beam.join_buckets": 3}
_BEAM = {"preprocess.engine": "beam", "preprocess.beam.num_workers": 1}


def _cites(n: int = 24) -> pd.DataFrame:
    src = [f"p{i:02d}" for i in range(n)] + [f"p{i:02d}" for i in range(0, n, 2)]
    dst = [f"p{(i + 1) % n:02d}" for i in range(n)] + [f"p{(i + 5) % n:02d}" for i in range(0, n, 2)]
    frame = pd.DataFrame({"src": src, "dst": dst, "weight": [float(i % 4) for i in range(len(src))]})
    return frame.sort_values(["src", "dst", "weight"], ignore_index=True)


def _both(config: GnnflowConfig, root: Path) -> tuple[storage.PublishedOutput, storage.PublishedOutput]:
    """The step with each engine on the same tables."""
    local = preprocess(apply_overrides(config, _READING), root / "local")
    beam = preprocess(apply_overrides(config, {**_READING, **_BEAM}), root / "beam")
    return local, beam


def _datasets(project: str) -> set[str]:
    return {d.dataset_id for d in bigquery_client(project).list_datasets()}


def _edge(uri: str, **extra: object) -> dict:
    return {"type": "cites", "uri": uri, "src_type": "paper", "dst_type": "paper", **extra}


def test_beam_on_bigquery_tables_publishes_the_local_engines_bytes_and_leaves_the_datasets(bigquery_dataset: str, tmp_path: Path) -> None:
    project = bigquery_dataset.split(".")[0]
    bystander = f"bystander_{bigquery_dataset.split('.')[1]}"
    bigquery_client(project).create_dataset(bystander)
    before = _datasets(project)
    papers = _load(bigquery_dataset, "papers", _papers())
    cites = _load(bigquery_dataset, "cites", _cites())
    config = _config([_paper_spec(papers)], [_edge(cites, features=[{"columns": ["weight"], "transform": "standardize"}])])
    local, beam = _both(config, tmp_path)
    same_files(local, beam)
    assert beam.manifest.counts == {"nodes.paper": 24, "edges.paper__cites__paper": 36}
    schema = beam.read_json("graph_schema.json")
    assert len(schema["node_types"]["paper"]["files"]) == 5  # 24 rows in blocks of 5: five parts
    # No temp dataset is left behind, and Beam's clean-up deleted nothing else.
    assert _datasets(project) == before and bystander in before


def test_beam_on_bigquery_tables_with_a_row_filter(bigquery_dataset: str, tmp_path: Path) -> None:
    papers = _load(bigquery_dataset, "papers", _papers())
    cites = _load(bigquery_dataset, "cites", _cites())
    kept = sorted(set(_papers().query("keep")["paper_id"]))
    listed = ", ".join(repr(i) for i in kept)
    config = _config(
        [_paper_spec(papers, row_filter="keep")],
        [_edge(cites, row_filter=f"src IN ({listed}) AND dst IN ({listed})")],
    )
    local, beam = _both(config, tmp_path)
    same_files(local, beam)
    assert beam.manifest.counts["nodes.paper"] == len(kept) == 16


def _bad(case: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Tables with one bad value, and what the error must name."""
    papers, cites = _papers(6).drop(columns=["label"]), _cites(6)
    if case == "NULL id":
        papers.loc[0, "paper_id"] = None
        return papers, cites, "column 'paper_id': NULL or empty node id in 1 row(s)"
    if case == "NaN feature":
        papers["score"] = papers["score"].astype(float)
        papers.loc[3, "score"] = float("nan")  # NULL in BigQuery
        return papers, cites, "the row where paper_id = 'p03', column 'score': missing, NaN or infinite value"
    cites.loc[2, "dst"] = "nobody"
    return papers, cites.sort_values(["src", "dst"], ignore_index=True), "the row where src = 'p01' and dst = 'nobody', column 'dst'"


@pytest.mark.parametrize("case", ["NULL id", "NaN feature", "unknown endpoint"])
def test_a_bad_value_gives_the_local_engines_error_naming_the_row(bigquery_dataset: str, tmp_path: Path, case: str) -> None:
    papers, cites, named = _bad(case)
    spec = {**_paper_spec(_load(bigquery_dataset, "papers", papers)), "label_column": None}
    config = _config([spec], [_edge(_load(bigquery_dataset, "cites", cites))], task={"type": "link_prediction"})
    errors = []
    for engine, overrides in (("local", _READING), ("beam", {**_READING, **_BEAM})):
        with pytest.raises(GnnflowError) as caught:
            preprocess(apply_overrides(config, overrides), tmp_path / engine)
        errors.append(str(caught.value))
        assert not storage.exists(storage.parse_uri(str(tmp_path / engine / "manifest.json")))  # nothing published
    assert errors[0] == errors[1]
    assert f"bq://{bigquery_dataset}." in errors[1] and named in errors[1]
