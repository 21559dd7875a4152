"""What a sampled train or infer worker places in shared memory, counted before it loads anything.

GLT moves every tensor it samples from into ``/dev/shm`` (a tmpfs), whatever the sampling mode:
its ``Graph`` shares the CSR adjacency it builds from a partition's edges (``indptr`` over every
id of the compressed side, ``indices`` and edge ids), and its ``Feature`` shares node and edge
feature tables. Besides these a worker places there the whole feature tables (and labels) it
copies from its peers (``training.feature_cache_ratio``, :mod:`.feature_cache`), its shard of
learnt embeddings (:mod:`.learnt_embeddings`), and with ``training.sampling: multiprocess`` the
labels, split ids and seeds its sampling subprocesses read. All of it is known from the
partition metadata: :func:`sampled_worker_need` is that arithmetic, pure; :func:`check_worker_memory`
runs it for the workers of this machine at their start, against ``/dev/shm``'s free space.

The sampling channel that multiprocess loaders fill with batches is a System V segment (GLT's
``SampleQueue`` calls ``shmget``), outside ``/dev/shm``: it is checked against ``kernel.shmall``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from components import storage
from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.feature_storage.codec import codec_of
from components.partition.output import STEP as PARTITION_STEP
from components.partition.output import PartitionMetadata, read_metadata
from components.runtime.launcher import WorkerContext
from components.runtime.shm_budget import SHM_PATH, ShmItem, ShmNeed, check_room, overhead
from components.schema import EdgeTypeSchema, GraphSchema, stored_edge_types

CHANNEL_BYTES = 256 * 2**20  # one loader's sampling channel (GLT's default size)
_MiB = 2**20
_INT64, _FLOAT32 = 8, 4  # GLT converts ids to int64; features stay in their stored type (feature_storage)


@dataclass(frozen=True)
class WorkerShape:
    """What decides a worker's shared memory, read from the partition metadata and the config."""

    node_counts: dict[str, list[int]]  # type → nodes per partition
    feature_dims: dict[str, int]  # node type → input feature width (0: featureless)
    labeled: frozenset[str]  # node types with labels
    # stored message edge type → (edges per partition, feature width, node type GLT compresses)
    edges: dict[str, tuple[list[int], int, str]]
    label_edge_counts: dict[str, list[int]]  # supervision-only edge tables (link prediction seeds)
    heterogeneous: bool
    # Bytes of one stored feature value (feature_storage) per node type / stored edge type; absent: float32.
    feature_bytes: dict[str, int] = field(default_factory=dict)
    edge_feature_bytes: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of(metadata: PartitionMetadata) -> WorkerShape:
        schema = metadata.schema
        compressed = 0 if metadata.edge_assignment == "src" else 2  # CSR by source ("out"), CSC by destination
        edges, edge_bytes = {}, {}
        for name, ends in stored_edge_types(schema).items():
            edges[name] = (metadata.edge_counts[name], _edge_feature_dim(schema, name), ends[compressed])
            edge_bytes[name] = codec_of(_forward_edge(schema, name)).value_bytes
        return WorkerShape(
            node_counts=metadata.node_counts,
            feature_dims={t: n.feature_dim for t, n in schema.node_types.items()},
            labeled=frozenset(t for t, n in schema.node_types.items() if n.label_vocabulary),
            edges=edges,
            label_edge_counts={t: c for t, c in metadata.edge_counts.items() if t not in edges},
            heterogeneous=schema.is_heterogeneous,
            feature_bytes={t: codec_of(n).value_bytes for t, n in schema.node_types.items()},
            edge_feature_bytes=edge_bytes,
        )


def whole_table_types(shape: WorkerShape, rank: int, ratio: float) -> list[str]:
    """The node types whose whole tables worker ``rank`` may copy (:mod:`.feature_cache`'s rule,
    without its cut at half the free memory, which only ever copies fewer)."""
    if len(next(iter(shape.node_counts.values()), [])) <= 1 or ratio <= 0:
        return []
    chosen = []
    for node_type, counts in shape.node_counts.items():
        own = counts[rank]
        if shape.feature_dims[node_type] and 0 < sum(counts) - own <= ratio * own:
            chosen.append(node_type)
    return chosen


def sampled_worker_need(
    shape: WorkerShape, ranks: Iterable[int], *, feature_cache_ratio: float, learnt_width: int, multiprocess: bool, step: str
) -> ShmNeed:
    """At most what the sampled workers ``ranks`` of one machine place in ``/dev/shm`` together.

    ``learnt_width``: columns of a featureless type's learnt embedding rows (sharded embeddings),
    0 where featureless types have none there. An upper bound: GLT's ``indptr`` is counted over
    every node of the compressed type, and every labelled node as a seed.
    """
    ranks = list(ranks)
    whole = adjacency = features = learnt = edge_features = mp_extra = 0
    for rank in ranks:
        copied = whole_table_types(shape, rank, feature_cache_ratio)
        for node_type, counts in shape.node_counts.items():
            own, width = counts[rank], shape.feature_dims[node_type]
            value = shape.feature_bytes.get(node_type, _FLOAT32)
            if node_type in copied:
                whole += sum(counts) * (width * value + (_INT64 if node_type in shape.labeled else 0))
            elif width:
                features += own * width * value
            else:
                learnt += own * learnt_width * _FLOAT32
            if multiprocess:  # labels (or placeholders), split ids, seeds and their shuffled order
                labels = own * _INT64 if node_type not in copied and (node_type in shape.labeled or shape.heterogeneous) else 0
                mp_extra += labels + 3 * own * _INT64
        for name, (counts, width, compressed) in shape.edges.items():
            adjacency += 2 * counts[rank] * _INT64 + (sum(shape.node_counts[compressed]) + 1) * _INT64
            edge_features += counts[rank] * width * shape.edge_feature_bytes.get(name, _FLOAT32)
            if multiprocess:  # link prediction seeds: source, destination, label, shuffled order
                mp_extra += 4 * counts[rank] * _INT64
        if multiprocess:
            mp_extra += sum(4 * counts[rank] * _INT64 for counts in shape.label_edge_counts.values())
    remedies = []
    if whole:
        remedies.append("lower training.feature_cache_ratio (0 copies no whole feature table)")
    if mp_extra:
        remedies.append("set training.sampling: collocated")
    items = (
        ShmItem("whole feature tables", whole),
        ShmItem("node features", features),
        ShmItem("learnt-embedding shards", learnt),
        ShmItem("adjacency", adjacency),
        ShmItem("edge features", edge_features),
        ShmItem("sampling subprocesses' labels, splits and seeds", mp_extra),
        overhead(len(ranks)),
    )
    return ShmNeed(step, len(ranks), items, tuple(remedies))


def check_worker_memory(
    metadata: PartitionMetadata,
    config: GnnflowConfig,
    first_rank: int,
    local_world_size: int,
    *,
    step: str,
    learnt_width: int,
    loaders: int,
    shm_path: str = SHM_PATH,
    sysv_table: str = "/proc/sys/kernel",
) -> ShmNeed:
    """Refuses to start sampled workers ``first_rank .. first_rank + local_world_size - 1`` (this
    machine's) whose shared memory would not fit; returns the need. Call it in every worker
    before it joins the process group: no worker places anything there before that rendezvous,
    so each sees the free space as it was before the step. ``loaders``: GLT loaders a worker
    keeps open at once (one System V channel each with multiprocess sampling)."""
    multiprocess = config.training.sampling == "multiprocess"
    need = sampled_worker_need(
        WorkerShape.of(metadata),
        range(first_rank, first_rank + local_world_size),
        feature_cache_ratio=config.training.feature_cache_ratio,
        learnt_width=learnt_width,
        multiprocess=multiprocess,
        step=step,
    )
    check_room(need, shm_path, mounted=config.resources.shm_size)
    if multiprocess:
        check_channels(loaders, local_world_size, sysv_table)
    return need


def check_at_worker_start(ctx: WorkerContext, partitions: str, config: GnnflowConfig, *, step: str, loaders: int) -> None:
    """:func:`check_worker_memory` for a sampled train or infer worker of the published
    ``partitions`` (nothing for full-graph training and exact inference, which place nothing
    there); call before ``ctx.init_process_group``."""
    metadata = read_metadata(storage.open_published(partitions, step=PARTITION_STEP))
    learnt_width = config.model.hidden_channels if config.model.learnt_embeddings == "sharded" else 0
    first = ctx.rank - ctx.local_rank
    check_worker_memory(metadata, config, first, ctx.local_world_size, step=step, learnt_width=learnt_width, loaders=loaders)


def check_channels(loaders: int, local_world_size: int, sysv_table: str = "/proc/sys/kernel") -> None:
    """Refuses multiprocess loaders whose System V sampling channels exceed ``kernel.shmall``."""
    channels = CHANNEL_BYTES * loaders * local_world_size
    limit = _sysv_limit(sysv_table)
    if limit is not None and channels > limit:
        raise GnnflowError(
            f"System V shared memory (kernel.shmall) allows {limit / _MiB:.0f} MiB, but {local_world_size} worker(s) x "
            f"{loaders} loader(s) open {CHANNEL_BYTES // _MiB} MiB sampling channels each ({channels / _MiB:.0f} MiB): raise "
            "kernel.shmall (sysctl, or docker/podman run --sysctl kernel.shmall=...), or set training.sampling: collocated"
        )


def _edge_feature_dim(schema: GraphSchema, stored: str) -> int:
    """Feature width of a stored edge type (a reverse type has its forward type's)."""
    return _forward_edge(schema, stored).feature_dim


def _forward_edge(schema: GraphSchema, stored: str) -> EdgeTypeSchema:
    """The schema edge type whose rows a stored edge type holds (a reverse type: its forward type's)."""
    if stored in schema.edge_types:
        return schema.edge_types[stored]
    dst, relation, src = stored.split("__")
    return schema.edge_types[f"{src}__{relation.removeprefix('rev_')}__{dst}"]


def _sysv_limit(table: str) -> int | None:
    """Bytes of System V shared memory this IPC namespace allows in all, or None if unknown."""
    try:
        with open(os.path.join(table, "shmall")) as file:
            pages = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")
