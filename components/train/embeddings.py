"""A trainer's shard of the learnt embeddings across a run: checkpointed and resumed by its own
rank (never gathered), its rows at the best epoch kept beside the live ones, and published by
each rank into the staged output as ``learnt_embeddings/<type>/shard-<rank>.pt``."""

from __future__ import annotations

import io

import torch
import torch.distributed as dist

from components import storage
from components.gnn.learnt_embeddings import EmbeddingShards, shard_path
from components.train import checkpoint


class TrainedEmbeddings:
    def __init__(self, shards: EmbeddingShards) -> None:
        self.shards = shards
        self.best: dict[str, torch.Tensor] | None = None  # rows at the best validation epoch so far
        self._before = (0, 0)  # bytes sent and fetched at the last epoch's figures

    def epoch_figures(self) -> dict[str, float]:
        """The epoch's line of the history: the largest worker's rows and optimizer state (MiB),
        the gradients every worker sent to other workers during the epoch, and the rows of other
        workers' nodes its training batches carried (MiB, summed over workers); collective."""
        held = torch.tensor([float(self.shards.nbytes())])
        moved = torch.tensor([float(self.shards.bytes_sent - self._before[0]), float(self.shards.bytes_fetched - self._before[1])])
        self._before = (self.shards.bytes_sent, self.shards.bytes_fetched)
        dist.all_reduce(held, op=dist.ReduceOp.MAX)
        dist.all_reduce(moved)
        mib = 2**20
        return {
            "embedding_mib_per_worker": round(float(held) / mib, 3),
            "embedding_grad_mib_sent": round(float(moved[0]) / mib, 3),
            "embedding_rows_mib_fetched": round(float(moved[1]) / mib, 3),
        }

    def checkpoint(self, output: storage.Uri, tag: str, rank: int) -> None:
        """Writes this rank's rows, optimizer state and best rows under ``tag``."""
        checkpoint.save_shard(output, tag, rank, {"shards": self.shards.state_dict(), "best": self.best})

    def resume(self, saved: dict, where: str) -> None:
        self.shards.load_state_dict(saved["shards"], where)
        self.best = saved["best"]

    def improved(self) -> None:
        self.best = self.shards.tables_copy()

    def restore_best(self) -> None:
        if self.best is not None:
            self.shards.load_tables(self.best, "the best epoch's rows")

    def stage(self, output: storage.Uri, generation: str, step: str) -> dict[str, storage.FileEntry]:
        """Writes this rank's rows ({"start": first id, "rows": (n, hidden)}) into the staged
        generation; returns the entries for the manifest."""
        staging = storage.OutputStaging(output, step, generation=generation)
        for node_type, table in self.shards.tables.items():
            buffer = io.BytesIO()
            torch.save({"start": self.shards.offsets[node_type], "rows": table.clone()}, buffer)
            staging.write_bytes(shard_path(node_type, self.shards.rank), buffer.getvalue())
        return staging.entries
