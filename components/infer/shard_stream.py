"""Writing one worker's shard of one node type while inference runs, in bounded memory.

Batches come in as the loader delivers them; rows go out in node order, a Parquet row group of
``row_group_rows`` at a time, through the staging's ``open_write`` (a local file renamed into place,
or a spool uploaded to GCS, only once the shard is complete: a failure publishes nothing). The
stream holds one row group being filled plus the batches that arrived ahead of their turn, never
the worker's whole output, so its memory does not grow with the graph.

It also checks what ``_check_complete`` checked on the whole output: every node of the partition
exactly once (a byte a node, not a copy of the rows).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from components import storage
from components.infer import shards
from components.infer.outputs import NodeOutputs

log = logging.getLogger("gnnflow.infer")

# 256k rows of a 64-wide embedding: 64 MiB of floats (and about as much again while Arrow builds
# the row group); readers still get row groups large enough to scan quickly.
ROW_GROUP_ROWS = 262_144
# Rows that may wait for an earlier batch before the stream stops keeping node order (see ``add``).
EARLY_ROW_GROUPS = 2


@dataclass(frozen=True)
class ShardSpec:
    """What one shard holds: the partition's nodes of ``node_type`` (partition ids ``offset`` ..
    ``offset + len(originals) - 1``), their original ids in node order, the label vocabulary of the
    classification target (None elsewhere: no prediction columns) and, on partitions other than
    the model's own, the (n,) cold flags of the partition's nodes (None: no ``cold`` column)."""

    node_type: str
    rank: int
    partition: int
    offset: int
    originals: pa.Array
    vocabulary: list[str] | None = None
    cold: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.originals)

    def incomplete(self) -> RuntimeError:
        return RuntimeError(f"partition {self.partition}: inference did not cover each of its {self.node_type!r} nodes exactly once")


class _Sink:
    """The file-like object pyarrow writes to: the staging's stream plus the position Parquet asks
    for. Closing it is left to ``open_write`` (which publishes the file); once ``discard`` is
    called, writes are dropped (a writer's footer after a failure must not reach the file)."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._position = 0
        self._discarded = False
        self.closed = False

    def write(self, data: bytes) -> int:
        if self._discarded:
            return len(data)
        self._position += len(data)
        return self._inner.write(data)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def discard(self) -> None:
        self._discarded = True


class ShardStream:
    """Batches of :class:`NodeOutputs` in, row groups out; see the module docstring."""

    def __init__(self, spec: ShardSpec, sink: _Sink, row_group_rows: int = ROW_GROUP_ROWS) -> None:
        if row_group_rows < 1:
            raise ValueError("row_group_rows must be positive")
        self.spec = spec
        self.row_group_rows = row_group_rows
        self.rows_written = 0
        self.row_groups = 0
        self.most_early_rows = 0  # the most rows that waited for an earlier batch at once
        self._sink = sink
        self._writer: pq.ParquetWriter | None = None
        self._seen = torch.zeros(spec.count, dtype=torch.bool)
        self._cursor: int | None = 0  # next node position to write; None once node order is given up
        self._early: dict[int, tuple[torch.Tensor, NodeOutputs]] = {}  # first position → batch
        self._early_rows = 0
        self._filling: list[pa.Table] = []  # the rows of the next row group
        self._filling_rows = 0

    def add(self, out: NodeOutputs) -> None:
        """One batch (host tensors, any order of ids). Kept in node order while the batches that
        arrive early fit in ``EARLY_ROW_GROUPS`` row groups (always, for batches in order; GLT's
        sampling subprocesses deliver about in order, see ``sampled``); past that the rows are
        written as they come, which readers allow (they match rows by ``node_id``)."""
        if len(out.node_ids) == 0:
            return
        batch = _compact(out) if bool((out.node_ids[1:] > out.node_ids[:-1]).all()) else _sorted(out)
        positions = batch.node_ids - self.spec.offset
        self._mark_seen(positions)
        contiguous = int(positions[-1] - positions[0]) == len(positions) - 1
        if self._cursor is None:
            self._emit(positions, batch)
        elif contiguous and int(positions[0]) == self._cursor:
            self._emit(positions, batch)
            self._drain_early()
        else:
            self._early[int(positions[0])] = (positions, batch)
            self._early_rows += len(positions)
            self.most_early_rows = max(self.most_early_rows, self._early_rows)
            if not contiguous or self._early_rows > EARLY_ROW_GROUPS * self.row_group_rows:
                self._give_up_order()

    def finish(self) -> None:
        """Writes the last row group and the footer; raises unless every node came exactly once."""
        if self._early or not bool(self._seen.all()):
            raise self.spec.incomplete()
        self._write(final=True)
        if self._writer is None:  # no rows: an empty shard with the same columns
            self._writer = self._open(self._table(torch.zeros(0, dtype=torch.int64), _empty(self.spec)).schema)
        self._writer.close()

    def discard(self) -> None:
        """After a failure: nothing more reaches the file."""
        self._sink.discard()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()

    def _mark_seen(self, positions: torch.Tensor) -> None:
        first, last = int(positions[0]), int(positions[-1])
        if first < 0 or last >= self.spec.count:
            raise self.spec.incomplete()  # a node of another partition
        if last - first == len(positions) - 1:  # sorted and consecutive: a run of distinct nodes
            seen: torch.Tensor | slice = slice(first, last + 1)
        elif bool((positions[1:] == positions[:-1]).any()):
            raise self.spec.incomplete()  # a node twice in the batch
        else:
            seen = positions
        if bool(self._seen[seen].any()):
            raise self.spec.incomplete()  # a node again
        self._seen[seen] = True

    def _drain_early(self) -> None:
        while self._cursor in self._early:
            positions, batch = self._early.pop(self._cursor)
            self._early_rows -= len(positions)
            self._emit(positions, batch)

    def _give_up_order(self) -> None:
        log.warning(
            "rank %d: %s: %d rows arrived ahead of earlier ones; the rest of the shard is written in arrival order",
            self.spec.rank,
            self.spec.node_type,
            self._early_rows,
        )
        self._cursor = None
        for start in sorted(self._early):
            self._emit(*self._early.pop(start))
        self._early_rows = 0

    def _emit(self, positions: torch.Tensor, batch: NodeOutputs) -> None:
        if self._cursor is not None:
            self._cursor += len(positions)
        self._filling.append(self._table(positions, batch))  # Arrow over the batch's own buffers
        self._filling_rows += len(positions)
        if self._filling_rows >= self.row_group_rows:
            self._write(final=False)

    def _write(self, final: bool) -> None:
        """Writes the filled row groups (all rows when ``final``), keeping the remainder. The
        batches' tables are chained, not copied: Parquet encodes straight from them."""
        if not self._filling:
            return
        table = pa.concat_tables(self._filling)
        full = table.num_rows if final else table.num_rows // self.row_group_rows * self.row_group_rows
        self._filling = [table.slice(full)] if full < table.num_rows else []
        self._filling_rows = table.num_rows - full
        for start in range(0, full, self.row_group_rows):
            group = table.slice(start, min(self.row_group_rows, full - start))
            if self._writer is None:
                self._writer = self._open(group.schema)
            self._writer.write_table(group, row_group_size=self.row_group_rows)
            self.rows_written += group.num_rows
            self.row_groups += 1

    def _table(self, positions: torch.Tensor, batch: NodeOutputs) -> pa.Table:
        index = positions.numpy()
        contiguous = len(index) > 0 and int(index[-1] - index[0]) == len(index) - 1
        originals = self.spec.originals.slice(int(index[0]), len(index)) if contiguous else self.spec.originals.take(pa.array(index))
        cold = None if self.spec.cold is None else self.spec.cold[index]
        table = shards.shard_table(originals, batch, self.spec.vocabulary, cold)
        # A copy in Arrow's own pool: zero-copy columns would keep each batch's tensors alive in
        # the C heap until the row group is written, scattered among the next batches' short-lived
        # blocks, and (with resources.reuse_freed_memory) that heap never shrinks or reuses well.
        return table.take(pa.array(np.arange(table.num_rows)))

    def _open(self, schema: pa.Schema) -> pq.ParquetWriter:
        return pq.ParquetWriter(self._sink, schema, compression=shards.COMPRESSION)


def _sorted(out: NodeOutputs) -> NodeOutputs:
    order = torch.argsort(out.node_ids)
    return NodeOutputs(out.node_ids[order], out.embeddings[order], None if out.probabilities is None else out.probabilities[order])


def _compact(out: NodeOutputs) -> NodeOutputs:
    """``out`` with tensors of their own: a batch's rows are often a view of a larger tensor (an
    untrimmed encoder's output over the whole sampled subgraph), which the row group being filled
    would otherwise keep alive whole."""

    def own(t: torch.Tensor) -> torch.Tensor:
        return t if t.untyped_storage().nbytes() == t.nbytes else t.clone()

    return NodeOutputs(own(out.node_ids), own(out.embeddings), None if out.probabilities is None else own(out.probabilities))


def _empty(spec: ShardSpec) -> NodeOutputs:
    """No rows, with the probability column when the shard has predictions."""
    return NodeOutputs(torch.zeros(0, dtype=torch.int64), torch.zeros((0, 0)), torch.zeros((0, 1)) if spec.vocabulary is not None else None)


@contextlib.contextmanager
def shard_stream(staging: storage.OutputStaging, spec: ShardSpec, row_group_rows: int = ROW_GROUP_ROWS) -> Iterator[ShardStream]:
    """A stream into ``spec``'s shard of ``staging``; the shard is recorded in ``staging.entries``
    when the block ends without error and every node was written, and published nowhere otherwise."""
    with staging.open_write(shards.shard_path(spec.node_type, spec.rank)) as raw:
        stream = ShardStream(spec, _Sink(raw), row_group_rows)  # type: ignore[arg-type]
        try:
            yield stream
            stream.finish()
        except BaseException:
            stream.discard()
            raise
