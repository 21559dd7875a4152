"""Inference shards written as the batches come (components/infer/shard_stream.py): bounded row
groups with the same content as the one-table write, node order kept, every node checked once,
and nothing published when a worker fails half-way; on local disk and on GCS."""

from __future__ import annotations

import io
import pathlib
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from graphlearn_torch.distributed.dist_sampling_producer import DistMpSamplingProducer

from components import storage
from components.infer import shards
from components.infer.outputs import NodeOutputs
from components.infer.sampled import interleaved_seeds
from components.infer.shard_stream import EARLY_ROW_GROUPS, ShardSpec, shard_stream
from components.storage.uri import Uri

N, OFFSET, HIDDEN, CLASSES = 1000, 3000, 8, ["a", "b", "c"]


def outputs(n: int = N) -> NodeOutputs:
    generator = torch.Generator().manual_seed(0)
    probabilities = torch.softmax(torch.randn(n, len(CLASSES), generator=generator), dim=-1)
    return NodeOutputs(torch.arange(OFFSET, OFFSET + n), torch.randn(n, HIDDEN, generator=generator), probabilities)


def spec(n: int = N) -> ShardSpec:
    return ShardSpec("paper", 1, 1, OFFSET, pa.array([f"p{i}" for i in range(n)]), CLASSES, np.arange(n) % 7 == 0)


def batches(out: NodeOutputs, starts: list[int], size: int) -> list[NodeOutputs]:
    """The rows of ``out`` from each start, reversed inside (a loader owes no order within a batch)."""
    cut = [slice(s, s + size) for s in starts]
    return [NodeOutputs(out.node_ids[c].flip(0), out.embeddings[c].flip(0), out.probabilities[c].flip(0)) for c in cut]  # type: ignore[index]


def unbounded(out: NodeOutputs, n: int = N) -> pa.Table:
    """What a worker wrote before streaming: one table of every row in node order."""
    return shards.shard_table(np.array([f"p{i}" for i in range(n)], dtype=object), out, CLASSES, np.arange(n) % 7 == 0)


def read(root: Uri) -> pq.ParquetFile:
    return pq.ParquetFile(io.BytesIO(storage.read_bytes(root.join(shards.shard_path("paper", 1)))))


def test_small_row_groups_hold_the_unbounded_content_in_node_order(root: Uri) -> None:
    staging = storage.OutputStaging(root, "infer")
    out = outputs()
    arrival = [0, 200, 100, 300, 500, 400, 600, 700, 900, 800]  # a few batches ahead of their turn
    with shard_stream(staging, spec(), row_group_rows=128) as stream:
        for batch in batches(out, arrival, 100):
            stream.add(batch)
    written = read(staging.root)
    assert [written.metadata.row_group(i).num_rows for i in range(written.num_row_groups)] == [128] * 7 + [104]
    table = written.read()
    expected = unbounded(out)
    assert table.schema == expected.schema and table.column_names == ["node_id", "embedding", "prediction", "probability", "cold"]
    assert table.equals(expected)  # bit for bit: floats, class names, flags, order
    path = shards.shard_path("paper", 1)
    assert staging.entries[path].size == storage.size(staging.uri(path))


def test_batches_far_out_of_order_are_written_whole_in_arrival_order(tmp_path: pathlib.Path) -> None:
    staging = storage.OutputStaging(storage.parse_uri(tmp_path), "infer")
    out = outputs()
    late_first = list(range(100, 1000, 100)) + [0]  # 900 rows wait for the first batch: more than 2 row groups of 100
    with shard_stream(staging, spec(), row_group_rows=100) as stream:
        for batch in batches(out, late_first, 100):
            stream.add(batch)
    table = read(staging.root).read()
    assert EARLY_ROW_GROUPS * 100 < 900
    assert table.column("node_id").to_pylist()[-100:] == [f"p{i}" for i in range(100)]
    assert table.sort_by("node_id").equals(unbounded(out).sort_by("node_id"))


def test_a_worker_without_nodes_writes_an_empty_shard_with_every_column(tmp_path: pathlib.Path) -> None:
    staging = storage.OutputStaging(storage.parse_uri(tmp_path), "infer")
    with shard_stream(staging, spec(0), row_group_rows=16):
        pass
    table = read(staging.root).read()
    assert table.num_rows == 0 and table.schema == unbounded(outputs(0), 0).schema


def test_a_failure_half_way_publishes_nothing(root: Uri) -> None:
    staging = storage.OutputStaging(root, "infer")
    out = outputs()
    with pytest.raises(OSError, match="sampling subprocess died"), shard_stream(staging, spec(), row_group_rows=128) as stream:
        for number, batch in enumerate(batches(out, list(range(0, 1000, 100)), 100)):
            if number == 6:  # 4 row groups already written
                raise OSError("sampling subprocess died")
            stream.add(batch)
    assert stream.row_groups == 4
    assert staging.entries == {}
    assert storage.list_files(staging.root) == []  # no shard, no partial file beside it


@pytest.mark.parametrize(
    ("starts", "size"),
    [([0, 100, 300], 100), ([0, 100, 100], 100), ([0, 950], 100)],
    ids=["a batch missing", "a batch twice", "a node of another partition"],
)
def test_every_node_exactly_once_or_nothing_is_published(tmp_path: pathlib.Path, starts: list[int], size: int) -> None:
    staging = storage.OutputStaging(storage.parse_uri(tmp_path), "infer")
    out = outputs(N + 100)  # rows past N belong to the next partition
    with pytest.raises(RuntimeError, match="partition 1: inference did not cover each of its 'paper' nodes exactly once"):
        with shard_stream(staging, spec(400 if starts == [0, 100, 300] else N), row_group_rows=64) as stream:
            for batch in batches(out, starts, size):
                stream.add(batch)
    assert staging.entries == {} and [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(("count", "batch_size", "workers"), [(1000, 64, 3), (1024, 64, 4), (130, 64, 2), (50, 64, 3), (700, 100, 1)])
def test_glt_subprocesses_get_interleaved_batches(count: int, batch_size: int, workers: int) -> None:
    """GLT's own split of the (rearranged) seeds: subprocess r samples batches r, r + W, ... of the
    node order, each in order, so they arrive about in node order."""
    seeds = torch.arange(10, 10 + count)
    given = interleaved_seeds(seeds, batch_size, workers)
    assert torch.equal(torch.sort(given).values, seeds)
    producer = SimpleNamespace(input_len=count, num_workers=workers, sampling_config=SimpleNamespace(batch_size=batch_size))
    ranges = DistMpSamplingProducer._get_worker_seeds_ranges(producer)
    complete = count // batch_size
    for rank, (start, end) in enumerate(ranges):
        mine = given[start:end]
        got = [int(mine[i] - 10) // batch_size for i in range(0, len(mine), batch_size)]
        expected = list(range(rank, complete, workers)) if workers > 1 and complete > 1 else list(range(start // batch_size, complete))
        if rank == workers - 1 and count % batch_size:
            expected.append(complete)  # the partial batch: last, as GLT hands it out
        assert got == expected
        for i in range(0, len(mine), batch_size):  # each batch a run of consecutive seeds
            chunk = mine[i : i + batch_size]
            assert torch.equal(chunk, torch.arange(int(chunk[0]), int(chunk[0]) + len(chunk)))
