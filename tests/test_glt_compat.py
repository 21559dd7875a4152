"""The GLT fixes refuse a GLT release other than the one whose private functions they replace."""

from __future__ import annotations

import importlib.metadata

import pytest

from components.errors import GnnflowError
from components.gnn import glt_compat


def test_the_locked_release_is_accepted():
    assert importlib.metadata.version("graphlearn-torch") == glt_compat.GLT_VERSION
    glt_compat.check_version()  # the installed one


@pytest.mark.parametrize("installed", ["0.2.5", "0.3.0", "none"])
def test_another_release_is_refused_naming_both(installed):
    with pytest.raises(GnnflowError) as error:
        glt_compat.check_version(installed)
    assert f"graphlearn-torch {installed} is installed" in str(error.value)
    assert "graphlearn-torch==0.2.4" in str(error.value)


def test_hetero_sample_keeps_its_node_order_and_edges():
    """Fix 3: the seeds-first node order that edges and labelled pairs index into survives;
    a node listed twice keeps its first place and the edges follow it."""
    from types import SimpleNamespace

    import torch

    sample = SimpleNamespace(
        node={"paper": torch.tensor([7, 3, 9, 3]), "word": torch.tensor([5, 1])},
        row={("paper", "cites", "paper"): torch.tensor([0, 1, 3]), ("paper", "has", "word"): torch.tensor([2])},
        col={("paper", "cites", "paper"): torch.tensor([2, 3, 0]), ("paper", "has", "word"): torch.tensor([1])},
        edge_types=[("paper", "cites", "paper"), ("paper", "has", "word")],
    )
    out = glt_compat.format_in_sampled_order(sample, edge_dir="out")
    assert out.node["paper"].tolist() == [7, 3, 9] and out.node["word"].tolist() == [5, 1]
    cites = ("paper", "cites", "paper")
    pairs = [(int(out.node["paper"][a]), int(out.node["paper"][b])) for a, b in zip(out.row[cites], out.col[cites])]
    assert pairs == [(7, 9), (3, 3), (3, 7)]  # the same global pairs as before
    assert out.edge_types == [cites, ("word", "rev_has", "paper")]
