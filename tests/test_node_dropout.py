"""Full-graph dropout masks (components/gnn/full_graph/node_dropout.py): a pure function of (key,
node id, column), with the asked keep rate and no structure between rows or columns."""

from __future__ import annotations

import torch

from components.gnn.full_graph.node_dropout import node_dropout, node_keep


def test_a_nodes_mask_does_not_depend_on_which_other_nodes_are_held():
    ids = torch.arange(1_000)
    whole = node_keep(ids, 37, key=5, p=0.5)
    shuffled = torch.randperm(1_000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(node_keep(shuffled[:300], 37, key=5, p=0.5), whole[shuffled[:300]])
    assert not torch.equal(node_keep(ids, 37, key=6, p=0.5), whole)  # another key (epoch, layer), another mask


def test_the_keep_rate_is_one_minus_p_in_every_row_and_column_on_average():
    n, width = 4_000, 500
    for p in (0.1, 0.5, 0.8):
        keep = node_keep(torch.arange(n), width, key=11, p=p).to(torch.float64)
        assert abs(float(keep.mean()) - (1 - p)) < 0.003
        # rows and columns: binomial spread only (4 standard deviations of a binomial share)
        assert float((keep.mean(1) - (1 - p)).abs().max()) < 4 * ((p * (1 - p) / width) ** 0.5) * 1.6
        assert float((keep.mean(0) - (1 - p)).abs().max()) < 4 * ((p * (1 - p) / n) ** 0.5) * 1.6


def test_neighbouring_rows_and_columns_are_uncorrelated():
    keep = node_keep(torch.arange(2_000), 256, key=3, p=0.5).to(torch.float64) * 2 - 1  # ±1
    # correlation of consecutive node ids and of consecutive columns: ~N(0, 1/sqrt(units))
    for a, b in ((keep[1:], keep[:-1]), (keep[:, 1:], keep[:, :-1])):
        assert abs(float((a * b).mean())) < 4 / (a.numel() ** 0.5)


def test_dropout_scales_the_kept_units_and_is_off_in_evaluation():
    h = torch.ones(200, 30)
    out = node_dropout(h, torch.arange(200), 0.25, True, key=1, layer=0)
    assert torch.unique(out).tolist() == [0.0, torch.tensor(1 / 0.75).item()]
    assert node_dropout(h, torch.arange(200), 0.25, False, key=1, layer=0) is h
