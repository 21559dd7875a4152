"""Faster feature lookups in GLT 0.2.4's samplers (``glt_compat`` fix 8).

A sampled batch reads the feature rows of every node it holds (about 89,000 rows of 128 floats
for a [15, 10] batch of 1,024 on an arxiv-sized graph), and GLT does it in two full copies:

* ``Feature.cpu_get`` gathers with advanced indexing (``tensor[ids]``), which on the CPU runs
  a general strided kernel: 4x slower than ``index_select`` for the same rows (61 vs 15 ms for
  that batch, with freed memory reused: ``components.runtime.allocator``; ``benchmarks/freed_memory.py``).
* ``DistFeature.async_get`` splits the ids into local and remote ones and stitches the parts
  into a zeroed matrix, even when every id is local: with the feature cache
  (``components.gnn.feature_cache``) holding every remote row, that second copy is all it does.

The replacements return the same rows: the local fast path only where every id's owner, per the
feature partition book, is this partition.
"""

from __future__ import annotations

import torch

_installed = False


def install() -> None:
    """Patches GLT's ``Feature.cpu_get`` and ``DistFeature.async_get`` in this process (once)."""
    global _installed
    if _installed:
        return
    from graphlearn_torch.data.feature import Feature
    from graphlearn_torch.distributed.dist_feature import DistFeature

    def cpu_get(self, ids: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        self.lazy_init_with_ipc_handle()
        ids = ids.to("cpu")
        if self.id2index is not None:
            ids = self.id2index[ids]
        return torch.index_select(self.feature_tensor, 0, ids.to(torch.int64))

    glt_async_get = DistFeature.async_get

    def async_get(self, ids: torch.Tensor, input_type=None) -> torch.futures.Future:  # noqa: ANN001
        feature, book = self._get_local_store(input_type)
        if ids.numel() and bool((book[ids.to(book.device)] == self.partition_idx).all()):
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(feature[ids.to(torch.int64)].to(self.device))
            return done
        return glt_async_get(self, ids, input_type)

    Feature.cpu_get = cpu_get
    DistFeature.async_get = async_get
    _installed = True
