"""Test metrics recomputed from the written Parquet shards (read back, not from memory), so the
reported numbers describe the published embeddings and predictions themselves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from components.errors import GnnflowError
from components.gnn.metrics import confusion_matrix
from components.schema import NO_LABEL, SPLIT_CODES


def shard_confusion(
    table: pa.Table, rows: torch.Tensor, labels: torch.Tensor, splits: torch.Tensor, vocabulary: list[str], where: str, split: str = "test"
) -> torch.Tensor:
    """(classes, classes) confusion of one shard's nodes of ``split`` (test by default).

    table: the shard read back (prediction); rows: (n,) position of each shard row among the
    worker's nodes, aligned with labels (n,) class indices (-1 unlabeled) and splits (n,) codes.
    """
    predicted = pd.Index(vocabulary).get_indexer(np.asarray(table.column("prediction").to_numpy(zero_copy_only=False), dtype=object))
    if (predicted < 0).any():
        raise GnnflowError(f"{where}: predictions that are not class names of the label vocabulary")
    label, code = labels[rows].to(torch.int64), splits[rows].to(torch.int64)
    chosen = (code == SPLIT_CODES[split]) & (label != NO_LABEL)
    return confusion_matrix(torch.from_numpy(predicted)[chosen], label[chosen], len(vocabulary))
