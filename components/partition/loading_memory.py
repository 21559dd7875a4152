"""What partitioned loading places in shared memory, counted from ``graph_metadata.json`` before it starts.

Each entity read in a subprocess (:mod:`.loading`) comes back to its worker as shared-memory
tensors (``/dev/shm``), which the worker holds until the graph is partitioned: its whole share of
those entities' records, decoded (ids and labels as int64, features in their stored type, the
split as int8). :func:`loading_need` is that arithmetic, pure, for the workers of one machine;
:func:`check_loading_memory` compares it with ``/dev/shm``'s free space at the worker's start.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from components.feature_storage.codec import codec_of
from components.partition.loading import assign_shards
from components.runtime.shm_budget import SHM_PATH, ShmItem, ShmNeed, check_room, overhead
from components.schema import GraphSchema

_INT64, _FLOAT32, _INT8 = 8, 4, 1


def record_bytes(layout: Mapping[str, Mapping[str, int]], value_bytes: int = _FLOAT32) -> int:
    """Bytes of one decoded record of a ``record_format`` entry ({"int64": {key: width}, "float": {...}}),
    its features held as ``value_bytes`` each (the type's ``feature_storage``: loading encodes them)."""
    widths = {**layout.get("int64", {}), **dict.fromkeys(layout.get("constant", {}), 1)}  # constants: filled in on loading
    ints = sum(width * (_INT8 if key == "split" else _INT64) for key, width in widths.items())
    return ints + sum(width * value_bytes for width in layout.get("float", {}).values())


def worker_rows(files: list[str], file_rows: list[int], count: int, sizes: Mapping[str, int], rank: int, world_size: int) -> int:
    """Records worker ``rank`` reads of one entity: exact where the metadata has records per
    shard, else the entity's count in proportion to its shards' bytes, rounded up."""
    mine = assign_shards(files, [sizes[f] for f in files], rank, world_size)
    if len(file_rows) == len(files):
        rows = dict(zip(files, file_rows, strict=True))
        return sum(rows[f] for f in mine)
    total = sum(sizes[f] for f in files)
    return min(count, math.ceil(count * sum(sizes[f] for f in mine) / total)) if total else 0


def loading_need(
    metadata: GraphSchema, sizes: Mapping[str, int], ranks: Iterable[int], world_size: int, subprocess_min_bytes: int
) -> ShmNeed:
    """At most what the partition workers ``ranks`` of one machine hold in ``/dev/shm`` together
    once loaded (``sizes``: bytes of each shard, from the serialize manifest)."""
    ranks = list(ranks)
    nodes = edges = 0
    entities = [("node", n.name, n.files, n.file_rows, n.count, codec_of(n).value_bytes) for n in metadata.node_types.values()]
    entities += [("edge", e.name, e.files, e.file_rows, e.count, codec_of(e).value_bytes) for e in metadata.edge_types.values()]
    for rank in ranks:
        for kind, name, files, file_rows, count, value_bytes in entities:
            mine = assign_shards(files, [sizes[f] for f in files], rank, world_size)
            if sum(sizes[f] for f in mine) < subprocess_min_bytes:  # read in the worker itself: private memory
                continue
            layout = metadata.record_format[f"{kind}_types"][name]
            held = worker_rows(files, file_rows, count, sizes, rank, world_size) * record_bytes(layout, value_bytes)
            if kind == "node":
                nodes += held
            else:
                edges += held
    items = (ShmItem("loaded node records", nodes), ShmItem("loaded edge records", edges), overhead(len(ranks)))
    remedy = "raise partition.subprocess_min_bytes above the largest entity's share (it is then read without shared memory)"
    return ShmNeed("partition", len(ranks), items, (remedy,))


def check_loading_memory(
    metadata: GraphSchema,
    sizes: Mapping[str, int],
    first_rank: int,
    local_world_size: int,
    world_size: int,
    subprocess_min_bytes: int,
    shm_path: str = SHM_PATH,
) -> ShmNeed:
    """Refuses to start loading on this machine (ranks ``first_rank`` on) where ``/dev/shm``
    cannot hold it; returns the need. Call before the workers' rendezvous (see
    :func:`components.gnn.shared_memory.check_worker_memory`)."""
    need = loading_need(metadata, sizes, range(first_rank, first_rank + local_world_size), world_size, subprocess_min_bytes)
    check_room(need, shm_path)
    return need
