"""Link prediction test metrics over every worker, each holding only its own nodes' embeddings.

Each worker scores the test edges its partition holds. The embeddings of their endpoints and
of the sampled negatives are fetched from the partitions that own them, one chunk of positives
at a time, so no worker ever holds more than its own embeddings and one chunk of others'.
Negatives are drawn by hashing (seed, source edge id, draw) into *source* ids, so the same
negatives are scored whatever the number of workers. ROC-AUC comes from summed score
histograms, MRR and hits@10 from summed reciprocal ranks: nothing of O(edges) is gathered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from components.gnn.metrics import AUC_BINS, all_sum, histogram_auc, score_histogram
from components.partition.output import IdDirectory, hash_owner, range_ends, range_owner
from components.runtime.collectives import all_max_int, request

RANKING_NEGATIVES = 100  # random destinations ranked against each positive (MRR, hits@10)
SCORE_CHUNK = 1024  # positives scored per round: bounds the (chunk * negatives, hidden) rows fetched


@dataclass(frozen=True)
class OwnEmbeddings:
    """One node type's embeddings on this worker: rows (n, hidden) of partition ids
    offset..offset+n-1, the range ends (P,) of every partition, and the source → partition id
    directory (built collectively)."""

    rows: torch.Tensor
    offset: int
    ends: torch.Tensor
    directory: IdDirectory

    def fetch(self, ids: torch.Tensor, world_size: int) -> torch.Tensor:
        """(k, hidden) embeddings of partition ids ``ids`` (k,), from their owners; collective."""
        return request(ids, range_owner(ids, self.ends), world_size, lambda asked: self.rows[asked - self.offset])


def negative_source_ids(edge_ids: torch.Tensor, draws: int, count: int, seed: int, salt: int) -> torch.Tensor:
    """(m, draws) source ids in 0..count-1, a pure function of (seed, salt, edge id, draw)."""
    keys = edge_ids.reshape(-1, 1) * (RANKING_NEGATIVES + 2) + torch.arange(draws) + salt
    return hash_owner(keys.reshape(-1), count, seed).reshape(len(edge_ids), draws)


def _scores(model: nn.Module, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
    """(m,) logits of the pairs (z_src[i], z_dst[i]) with the model's decoder."""
    return model.score(z_src, z_dst)


@torch.no_grad()
def _hard_of(anchors: torch.Tensor, hard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For anchors (c,): (row in ``anchors``, hard negative id) of every hard pair (2, h) whose
    anchor it is (each anchor's hard negatives, once per positive of that anchor)."""
    order = torch.argsort(hard[0], stable=True)
    sorted_anchor, negative = hard[0][order], hard[1][order]
    lo = torch.searchsorted(sorted_anchor, anchors)
    counts = torch.searchsorted(sorted_anchor, anchors, right=True) - lo
    row = torch.repeat_interleave(torch.arange(len(anchors)), counts)
    starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return row, negative[lo[row] + torch.arange(len(row)) - starts]


def link_metrics(
    model: nn.Module,
    src: OwnEmbeddings,
    dst: OwnEmbeddings,
    positives: torch.Tensor,
    edge_ids: torch.Tensor,
    seed: int,
    world_size: int,
    hard: torch.Tensor | None = None,
) -> dict[str, float]:
    """Test ROC-AUC (each positive against one random pair), MRR and hits@10 (against
    RANKING_NEGATIVES random destinations of its source, and its source's hard negatives), over
    every worker; collective. With hard negatives, also ``test_mrr_hard``: each positive ranked
    against its source's hard negatives alone (positives whose source has some).

    positives: (2, m) partition ids [src; dst] of this worker's test edges; edge_ids: (m,) their
    source edge ids (the key their negatives are drawn from); hard: (2, h) [anchor; negative]
    partition ids of this worker's test hard negatives, anchors among the positives' sources.
    """
    hard = hard if hard is not None else torch.zeros((2, 0), dtype=torch.int64)
    model.eval()
    src_count, dst_count = int(src.ends[-1]), int(dst.ends[-1])
    m = positives.shape[1]
    rounds = all_max_int(-(-m // SCORE_CHUNK))
    positive_hist, negative_hist = torch.zeros(AUC_BINS, dtype=torch.int64), torch.zeros(AUC_BINS, dtype=torch.int64)
    sums = torch.zeros(5, dtype=torch.float64)  # reciprocal ranks, hits@10, positives; hard-only reciprocal ranks, positives
    for r in range(rounds):
        chunk = slice(r * SCORE_CHUNK, (r + 1) * SCORE_CHUNK)
        pos, ids = positives[:, chunk], edge_ids[chunk]
        c = pos.shape[1]
        # Every worker takes part in every lookup of every round, with or without positives left.
        ranked = dst.directory.lookup(negative_source_ids(ids, RANKING_NEGATIVES, dst_count, seed, 0).reshape(-1))
        pair_src = src.directory.lookup(negative_source_ids(ids, 1, src_count, seed, RANKING_NEGATIVES).reshape(-1))
        pair_dst = dst.directory.lookup(negative_source_ids(ids, 1, dst_count, seed, RANKING_NEGATIVES + 1).reshape(-1))
        z_src, z_pair_src = src.fetch(torch.cat([pos[0], pair_src]), world_size).split([c, c])
        hard_row, hard_dst = _hard_of(pos[0], hard)
        z_dst, z_pair_dst, z_ranked, z_hard = dst.fetch(torch.cat([pos[1], pair_dst, ranked, hard_dst]), world_size).split(
            [c, c, c * RANKING_NEGATIVES, len(hard_dst)]
        )
        positive = _scores(model, z_src, z_dst)
        hard_wins = torch.bincount(
            hard_row, weights=(_scores(model, z_src[hard_row], z_hard) >= positive[hard_row]).to(torch.float64), minlength=c
        )
        with_hard = torch.bincount(hard_row, minlength=c) > 0
        positive_hist += score_histogram(positive)
        negative_hist += score_histogram(_scores(model, z_pair_src, z_pair_dst))
        against = _scores(model, z_src.repeat_interleave(RANKING_NEGATIVES, 0), z_ranked).reshape(c, RANKING_NEGATIVES)
        rank = 1 + (against >= positive[:, None]).sum(dim=1).to(torch.float64) + hard_wins  # pessimistic on ties
        hard_rank = 1 + hard_wins[with_hard]
        sums += torch.tensor(
            [float((1 / rank).sum()), float((rank <= 10).sum()), c, float((1 / hard_rank).sum()), len(hard_rank)], dtype=torch.float64
        )
    positive_hist, negative_hist, sums = all_sum(positive_hist), all_sum(negative_hist), all_sum(sums)
    count = int(sums[2])
    if count == 0:
        return {"test_roc_auc": float("nan"), "test_mrr": float("nan"), "test_hits@10": float("nan"), "test_count": 0}
    metrics = {
        "test_roc_auc": histogram_auc(positive_hist, negative_hist),
        "test_mrr": float(sums[0] / count),
        "test_hits@10": float(sums[1] / count),
        "test_count": count,
    }
    if int(sums[4]):
        metrics |= {"test_mrr_hard": float(sums[3] / sums[4]), "test_hard_count": int(sums[4])}
    return metrics


def own_embeddings(
    rows: torch.Tensor, counts: list[int], index: int, source_ids: torch.Tensor, partition_ids: torch.Tensor, world_size: int
) -> OwnEmbeddings:
    """Builds one type's :class:`OwnEmbeddings` (collective: the directory is built here)."""
    ends = range_ends(counts)
    offset = int(ends[index - 1]) if index else 0
    return OwnEmbeddings(rows, offset, ends, IdDirectory(source_ids, partition_ids, world_size))
