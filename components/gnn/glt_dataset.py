"""A stored partition as a GLT ``DistDataset``, on the CPU or a worker's GPU (what train and infer sample from)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from components import storage
from components.gnn.device import CPU_PLACEMENT, Placement
from components.gnn.feature_cache import WholeTable
from components.gnn.glt_topology import glt_graphs
from components.partition.output import PartitionMetadata, StoredPartition, range_ends, read_metadata, read_partition
from components.schema import SPLIT_CODES, stored_edge_types


def edge_type_tuple(name: str) -> tuple[str, str, str]:
    """'paper__cites__paper' → ('paper', 'cites', 'paper'), GLT's and PyG's edge type form."""
    src, relation, dst = name.split("__")
    return src, relation, dst


@dataclass(frozen=True)
class NodeSplits:
    """Partition ids of this partition's train / val / test nodes, per node type."""

    train: dict[str, torch.Tensor]
    val: dict[str, torch.Tensor]
    test: dict[str, torch.Tensor]


def node_splits(part: StoredPartition) -> NodeSplits:
    def pick(code: int) -> dict[str, torch.Tensor]:
        return {t: v["node_id"][v["split"] == code] for t, v in part.nodes.items()}

    return NodeSplits(pick(SPLIT_CODES["train"]), pick(SPLIT_CODES["val"]), pick(SPLIT_CODES["test"]))


GLT_GRAPHS = "glt_graphs"  # a partition's ``built`` entry: (placement, GLT graph per edge type)


def read_for_worker(
    partitions: storage.PublishedOutput, index: int, *, sampled: bool, placement: Placement = CPU_PLACEMENT
) -> StoredPartition:
    """Partition ``index`` as a train or infer worker needs it. A sampled node-classification
    worker reads only what its GLT dataset keeps, straight into shared memory, and builds GLT's
    graphs (for ``placement``) from the edges before it reads the node tables (see
    :func:`~.glt_topology.glt_graphs`); link prediction also needs the edges' ends and splits
    for its labels, full-graph work the whole edge list."""
    if not sampled or read_metadata(partitions).schema.task_type == "link_prediction":
        return read_partition(partitions, index)

    def build(metadata: PartitionMetadata, edges: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
        return {GLT_GRAPHS: (placement, glt_graphs(metadata, index, edges, placement))}

    return read_partition(partitions, index, for_sampling=True, after_edges=build)


def to_dist_dataset(
    part: StoredPartition,
    *,
    edge_filter: dict[str, torch.Tensor] | None = None,
    placement: Placement = CPU_PLACEMENT,
    whole: dict[str, WholeTable] | None = None,
):
    """Builds a ``graphlearn_torch.distributed.DistDataset`` from partition ``part.index``.

    Homogeneous graphs (one node type, one edge type) use GLT's plain-tensor form, others its
    dict form keyed by node type / ``(src, relation, dst)``. Features and labels are held by
    their owning partition and fetched over RPC by the samplers. ``placement`` says where GLT
    holds the adjacency and the features: plain CPU tensors (``with_gpu`` off, as GLT requires
    on the CPU), or for a worker on a GPU its graph mode and its split of feature rows between
    GPU and pinned host memory. Labels stay CPU tensors either way. ``edge_filter`` keeps only
    the masked edges of a type (e.g. the training edges for link prediction). ``whole``: node types
    whose whole tables this worker holds (``feature_cache``), answered locally by the feature book.
    The adjacency is the graphs :func:`read_for_worker` built while reading, where it did.
    """
    import graphlearn_torch as glt  # imported here: GLT loads CUDA-linked libraries

    from components.gnn.glt_books import LocalBook, RangeBook

    meta = part.metadata
    hetero = meta.schema.is_heterogeneous

    messages = stored_edge_types(meta.schema)  # label edge tables carry no messages: not in GLT's graph
    edge_dir = "out" if meta.edge_assignment == "src" else "in"
    built = part.built.get(GLT_GRAPHS)
    if built is not None and built[0] == placement and not edge_filter:
        graphs = built[1]
    else:
        graphs = glt_graphs(meta, part.index, part.edges, placement, edge_filter)
    node_pb = {t: RangeBook(range_ends(c), part.index) for t, c in meta.node_counts.items()}
    # Only edge features are looked up by edge id across partitions: types without them get no book.
    edge_pb = {
        edge_type_tuple(t): RangeBook(range_ends(meta.edge_counts[t]), part.index) for t in messages if part.edges[t]["features"].shape[1]
    }
    features = {t: v["features"] for t, v in part.nodes.items()}
    id2idx = {t: node_pb[t].id2index for t in part.nodes}
    # Labels are fetched like features (from their owner), which needs a 2-D (n, 1) tensor;
    # batches then carry y of shape (batch nodes, 1).
    # GLT's heterogeneous sampler fetches the labels of a loader's seed type and fails on a type
    # without any (link prediction seeds by edge, inference every type): those get -1 placeholders.
    labels = {t: _label_column(v.get("label"), len(v["node_id"])) for t, v in part.nodes.items() if "label" in v or hetero}
    feature_pb: dict = dict(node_pb)  # GLT finds labels by the feature book too
    for t, table in (whole or {}).items():
        features[t], id2idx[t], feature_pb[t] = table.features, None, LocalBook(part.index)  # rows in id order
        if t in labels:
            labels[t] = _label_column(table.labels, len(table.features))
    splits = node_splits(part)

    def plain(d: dict):  # the homogeneous form is the single value
        return d if hetero else next(iter(d.values()))

    dataset = glt.distributed.DistDataset(
        num_partitions=meta.num_partitions,
        partition_idx=part.index,
        node_pb=plain(node_pb),
        edge_pb=(plain(edge_pb) if edge_pb else None),  # no edge features, no edge book (GLT accepts None)
        edge_dir=edge_dir,
        node_feat_pb=plain(feature_pb) if whole else None,  # None: GLT uses node_pb
    )
    dataset.init_graph(edge_index=None, directed=True)  # GLT's flag only: the graphs are built (glt_graphs)
    dataset.graph = plain(graphs)
    if any(f.shape[1] for f in features.values()):
        dataset.init_node_features(node_feature_data=plain(features), id2idx=plain(id2idx), **placement.glt_feature_args())
        # Learnt embedding rows (a featureless type's features, components/gnn/learnt_embeddings.py)
        # stay on the host too: their owner updates them in place, which a GPU copy would not see.
        learnt = [t for t, f in features.items() if f.numel() and not meta.schema.node_types[t].feature_dim]
        dataset.node_features = _on_host_where_empty(dataset.node_features, features, id2idx, placement, learnt)
    if labels:
        label_ids = {t: id2idx[t] for t in labels}
        dataset.init_node_labels(node_label_data=plain(labels), id2idx=plain(label_ids))
    if edge_pb:
        # In their stored type (feature_storage), as node features: the model decodes a batch's rows.
        edge_features = {edge_type_tuple(t): part.edges[t]["features"] for t in messages if edge_type_tuple(t) in edge_pb}
        edge_id2idx = {e: edge_pb[e].id2index for e in edge_pb}
        dataset.init_edge_features(edge_feature_data=plain(edge_features), id2idx=plain(edge_id2idx), **placement.glt_feature_args())
        dataset.edge_features = _on_host_where_empty(dataset.edge_features, edge_features, edge_id2idx, placement)
    dataset.init_node_split((plain(splits.train), plain(splits.val), plain(splits.test)))
    return dataset


def _label_column(labels: torch.Tensor | None, count: int) -> torch.Tensor:
    """(count, 1) labels as GLT stores them; -1 for each of ``count`` nodes of a type without labels."""
    return (labels if labels is not None else torch.full((count,), -1, dtype=torch.int64)).reshape(-1, 1)


def empty_feature_types(features: dict[Any, torch.Tensor]) -> list[Any]:
    """Types whose feature tensor holds no value in this partition: no rows of the type here, or
    a featureless type (zero columns)."""
    return [t for t, f in features.items() if f.numel() == 0]


def _on_host_where_empty(
    stores: Any, features: dict[Any, torch.Tensor], id2idx: dict[Any, Any], placement: Placement, also: Sequence[Any] = ()
) -> Any:
    """GLT's stores (a ``Feature`` or a dict of them), with the empty types' held on the host.

    GLT splits a type's rows between the GPU and pinned host memory and creates neither part
    for an empty tensor, so every lookup of it raised KeyError (a partition without nodes of a
    type; a featureless type, also with ``gpu_feature_fraction: 0``). A plain host ``Feature``
    answers those lookups with (n, width) rows, and GLT's ``DistFeature`` moves every part to
    the sampling device when it stitches a batch together. ``also``: more types to hold there.
    """
    if not placement.feature_with_gpu or not (empty := empty_feature_types(features) + list(also)):
        return stores
    from graphlearn_torch.data.feature import Feature

    def on_host(t: Any) -> Any:
        return Feature(features[t], id2idx[t], with_gpu=False, dtype=features[t].dtype)

    if not isinstance(stores, dict):  # the homogeneous form: one type
        return on_host(empty[0])
    return {**stores, **{t: on_host(t) for t in empty}}
