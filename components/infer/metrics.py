"""Test metrics recomputed from the written Parquet shards (read back, not from memory), so the
reported numbers describe the published embeddings and predictions themselves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from torch import nn

from components.errors import GnnflowError
from components.infer.shards import embedding_matrix, rows_of
from components.schema import NO_LABEL, SPLIT_CODES
from components.train.metrics import confusion_matrix, ranking_metrics, roc_auc

RANKING_NEGATIVES = 100  # random destinations ranked against each positive (MRR, hits@10)
_SCORE_CHUNK = 1024  # positives scored at once for ranking: bounds (chunk, negatives, hidden) memory


def shard_confusion(table: pa.Table, own_originals: np.ndarray, labels: torch.Tensor, splits: torch.Tensor,
                    vocabulary: list[str], where: str) -> torch.Tensor:
    """(classes, classes) confusion of one shard's test nodes.

    table: the shard read back (node_id, prediction); own_originals: (n,) original ids of the
    worker's nodes, aligned with labels (n,) class indices (-1 unlabeled) and splits (n,) codes.
    """
    if table.num_rows != len(own_originals):
        raise GnnflowError(f"{where} holds {table.num_rows} rows, the worker owns {len(own_originals)} nodes")
    rows = torch.from_numpy(rows_of(own_originals, table.column("node_id"), where))
    predicted = pd.Index(vocabulary).get_indexer(np.asarray(table.column("prediction").to_numpy(zero_copy_only=False), dtype=object))
    if (predicted < 0).any():
        raise GnnflowError(f"{where}: predictions that are not class names of the label vocabulary")
    label, split = labels[rows].to(torch.int64), splits[rows].to(torch.int64)
    test = (split == SPLIT_CODES["test"]) & (label != NO_LABEL)
    return confusion_matrix(torch.from_numpy(predicted)[test], label[test], len(vocabulary))


def embeddings_by_id(tables: list[pa.Table], originals: np.ndarray, where: str) -> torch.Tensor:
    """(count, hidden) embeddings indexed by int id, from every shard of one node type."""
    table = pa.concat_tables(tables)
    rows = rows_of(originals, table.column("node_id"), where)
    if len(rows) != len(originals):
        raise GnnflowError(f"{where}: {len(rows)} nodes embedded, the graph has {len(originals)}")
    z = embedding_matrix(table)
    out = torch.empty_like(z)
    out[torch.from_numpy(rows)] = z
    return out


def _scores(model: nn.Module, z_src: torch.Tensor, z_dst: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """(m,) logits of pairs (src[i], dst[i]) with the model's decoder; src/dst index z_src/z_dst."""
    if z_src is z_dst:
        return model.score(z_src, torch.stack([src, dst]))
    # LinkPredictor.score takes one table: stack both, shifting destination rows past the sources.
    return model.score(torch.cat([z_src, z_dst]), torch.stack([src, dst + len(z_src)]))


@torch.no_grad()
def link_metrics(model: nn.Module, z_src: torch.Tensor, z_dst: torch.Tensor, positives: torch.Tensor, seed: int) -> dict[str, float]:
    """ROC-AUC against as many uniformly random pairs, MRR and hits@10 against RANKING_NEGATIVES
    random destinations per positive source; positives: (2, m) int ids [src; dst]."""
    model.eval()
    m = positives.shape[1]
    if m == 0:
        return {"test_roc_auc": float("nan"), "test_mrr": float("nan"), "test_hits@10": float("nan"), "test_count": 0}
    generator = torch.Generator().manual_seed(seed)
    negatives = torch.stack([torch.randint(len(z_src), (m,), generator=generator), torch.randint(len(z_dst), (m,), generator=generator)])
    positive_scores = _scores(model, z_src, z_dst, positives[0], positives[1])
    negative_scores = _scores(model, z_src, z_dst, negatives[0], negatives[1])
    labels = torch.cat([torch.ones(m), torch.zeros(m)])
    auc = roc_auc(torch.cat([positive_scores, negative_scores]), labels)
    ranked = []
    for start in range(0, m, _SCORE_CHUNK):
        src = positives[0, start:start + _SCORE_CHUNK]
        dst = torch.randint(len(z_dst), (len(src), RANKING_NEGATIVES), generator=generator)
        ranked.append(_scores(model, z_src, z_dst, src.repeat_interleave(RANKING_NEGATIVES), dst.reshape(-1)).reshape(len(src), -1))
    ranking = ranking_metrics(positive_scores, torch.cat(ranked), ks=(10,))
    return {"test_roc_auc": auc, "test_mrr": ranking["mrr"], "test_hits@10": ranking["hits@10"], "test_count": m}
