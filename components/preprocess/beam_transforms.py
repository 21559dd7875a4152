"""The preprocess step as Beam transforms: each table file is a block that one worker reads.

Data flow (every element is a batch of rows as numpy / Arrow arrays, never one row)::

    node files ─ScanNodes─▶ per-file counts, feature statistics, labels ─┐
               └─▶ id batches keyed by (node type, hash bucket) ──────┐ ├─▶ Layout (one small value:
    edge files ─ScanEdges─▶ per-file counts, edge feature statistics ─┼─┘   id offsets, fitted transforms)
               └─▶ endpoint batches keyed by (node type, bucket) ─────┤
                                     ResolveBucket (per bucket: duplicate ids, endpoint → node id)
                                                       ▼
    node files ─WriteNodes(Layout)─▶ nodes/, id_maps/ parts    (edge file, resolved endpoints)
                                     edge files ─WriteEdges(Layout)─▶ edges/ parts

No process holds more than one file's rows or one bucket's ids. Node ids are the file's first id
(from the per-file counts, in file order) plus the row in the file: the numbering of the
one-process engine. Part numbers follow the same rule, so both engines write the same files.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from components import storage
from components.beam_pipeline import Problem
from components.config import EdgeTableSpec, GnnflowConfig, NodeTableSpec
from components.errors import GnnflowError
from components.preprocess.edges import encode_edge_chunk
from components.preprocess.nodes import (
    TableSource,
    checked_node_ids,
    count_splits,
    duplicate_id_error,
    empty_table_error,
    encode_node_chunk,
)
from components.preprocess.output import STEP
from components.preprocess.parts import write_part
from components.preprocess.splits import edge_split, node_split
from components.schema import SPLIT_CODES
from components.tables import reading as tables
from components.tables.transforms import FeatureFitter, FittedFeatures, PerFileFitters, fit_label_vocabulary, label_values

# Problem order, as the one-process engine meets errors: node tables one by one (scan, empty,
# duplicates), then writing every node table, then edge tables one by one (fit, write, empty).
NODE_SCAN, NODE_EMPTY, NODE_DUPLICATE, NODE_WRITE, EDGE = 0, 1, 2, 3, 4
EDGE_FIT, EDGE_WRITE, EDGE_EMPTY = 0, 1, 2


@dataclass(frozen=True)
class TablePlan:
    """One table as the launcher opened it: its files (checked headers) and feature columns."""

    source: TableSource
    groups: list[list[str]]


@dataclass(frozen=True)
class Plan:
    """Everything the workers need besides their block; small (O(files))."""

    config: GnnflowConfig
    output: str
    generation: str
    nodes: list[TablePlan]
    edges: list[TablePlan]
    fitted_state: dict | None
    buckets: int

    def staging(self) -> storage.OutputStaging:
        return storage.OutputStaging(storage.parse_uri(self.output), STEP, self.generation)

    def chunks(self, table: TablePlan, file: int) -> Iterator[tables.TableChunk]:
        return table.source.chunks(self.config.preprocess, file)


@dataclass(frozen=True)
class Block:
    """One file of one table: the unit of work."""

    kind: str  # "node" or "edge"
    table: int  # index in config.graph.nodes / .edges
    file: int  # index in that table's files


@dataclass(frozen=True)
class RowBlock:
    """A block that arrives with its rows: a ``bq://`` table's block ``block.file`` is its
    rows numbered from ``block.file * parquet_batch_rows`` (see :mod:`components.preprocess.beam_bigquery`)."""

    block: Block
    chunk: tables.TableChunk  # the whole block, its first row numbered 1


def _open_block(item: Block | RowBlock, plan: Plan) -> tuple[Block, Iterator[tables.TableChunk]]:
    """The block and its chunks: read from its file, or the rows it carries."""
    if isinstance(item, RowBlock):
        return item.block, iter([item.chunk])
    table = (plan.nodes if item.kind == "node" else plan.edges)[item.table]
    return item, plan.chunks(table, item.file)


def block_count(kind: str, table: int, plan: Plan, scans: Sequence[Scan]) -> int:
    """Blocks of a table: its files, or for a ``bq://`` table as many as its rows filled."""
    source = (plan.nodes if kind == "node" else plan.edges)[table].source
    if source.bigquery is None:
        return len(source.files)
    return 1 + max((s.block.file for s in scans if (s.block.kind, s.block.table) == (kind, table)), default=-1)


@dataclass
class Scan:
    """What reading one block found."""

    block: Block
    rows: int
    chunks: int
    fitters: list[FeatureFitter] | None  # None: statistics reused from an earlier run
    labels: list[str] = field(default_factory=list)


@dataclass
class Written:
    """What writing one block produced."""

    block: Block
    parts: list[tuple[str, int]]  # (path, rows) per part
    entries: dict[str, storage.FileEntry]
    count: int  # rows written
    dropped: int = 0
    split_sizes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLIT_CODES, 0))
    labelled_sizes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLIT_CODES, 0))


@dataclass(frozen=True)
class IdBatch:
    """Ids of some rows of one block that hash to one bucket; ``role`` is src/dst for endpoints."""

    block: Block
    role: str
    positions: np.ndarray  # (k,) int64 rows within the block, 0-based
    ids: pa.Array  # (k,) string


def bucket_batches(ids: pa.ChunkedArray, first_position: int, buckets: int) -> Iterator[tuple[int, np.ndarray, pa.Array]]:
    """Splits a chunk's ids by hash bucket: (bucket, positions in the block, ids) per bucket present."""
    values = ids.combine_chunks()
    bucket = (pd.util.hash_array(values.to_numpy(zero_copy_only=False)) % np.uint64(buckets)).astype(np.int64)
    order = np.argsort(bucket, kind="stable")
    present, starts = np.unique(bucket[order], return_index=True)
    for b, rows in zip(present, np.split(order, starts[1:])):
        yield int(b), rows.astype(np.int64) + first_position, values.take(pa.array(rows))


@dataclass
class Layout:
    """The one small value every writer needs: where each block's ids and parts start, and the
    fitted transforms. Built from all scans in file order."""

    first_id: dict[tuple[int, int], int] = field(default_factory=dict)  # (node table, file) → first node id
    first_row: dict[tuple[int, int], int] = field(default_factory=dict)  # (edge table, file) → first edge row
    first_part: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (kind, table, file) → first part
    block_rows: dict[tuple[str, int, int], int] = field(default_factory=dict)
    node_features: dict[int, list[FittedFeatures]] = field(default_factory=dict)
    vocabularies: dict[int, list[str] | None] = field(default_factory=dict)
    edge_features: dict[int, list[FittedFeatures]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def build_layout(scans: list[Scan], plan: Plan) -> Layout:
    layout = Layout()
    found = {(s.block.kind, s.block.table, s.block.file): s for s in scans}
    reused = plan.fitted_state or {}
    kinds: list[tuple[str, Sequence[NodeTableSpec | EdgeTableSpec], Sequence[Any]]] = [
        ("node", plan.config.graph.nodes, plan.nodes),
        ("edge", plan.config.graph.edges, plan.edges),
    ]
    for kind, specs, tables_ in kinds:
        for t, (spec, table) in enumerate(zip(specs, tables_)):
            rows = parts = 0
            fitters = PerFileFitters(spec.features, table.groups)
            labels: set[str] = set()
            for f in range(block_count(kind, t, plan, scans)):
                scan = found.get((kind, t, f))
                (layout.first_id if kind == "node" else layout.first_row)[(t, f)] = rows
                layout.first_part[(kind, t, f)] = parts
                if scan is None:  # the block failed; its problem will be reported
                    continue
                layout.block_rows[(kind, t, f)] = scan.rows
                rows, parts = rows + scan.rows, parts + scan.chunks
                if scan.fitters is not None:
                    fitters.add_file(scan.fitters)
                labels.update(scan.labels)
            name = spec.type if isinstance(spec, NodeTableSpec) else spec.name
            state = reused.get("node_types" if kind == "node" else "edge_types", {}).get(name)
            features = [FittedFeatures.from_dict(f) for f in state["features"]] if state else fitters.finish()
            if kind == "node":
                layout.node_features[t] = features
                label_column = plan.config.graph.nodes[t].label_column
                layout.vocabularies[t] = (
                    state.get("label_vocabulary") if state else (fit_label_vocabulary(labels) if label_column else None)
                )
                if rows == 0:
                    layout.problems.append(Problem((NODE_SCAN, t, NODE_EMPTY), str(empty_table_error("node", spec.uri))))
            else:
                layout.edge_features[t] = features
                if rows == 0:
                    layout.problems.append(Problem((EDGE, t, EDGE_EMPTY), str(empty_table_error("edge", spec.uri))))
    return layout


def scan_block(item: Block | RowBlock, plan: Plan) -> Iterator[Scan | Problem | tuple[tuple[str, int], IdBatch]]:
    """Reads one file (or block of rows): counts, statistics, labels, and its ids bucketed for the join."""
    graph = plan.config.graph
    block, block_chunks = _open_block(item, plan)
    spec = graph.nodes[block.table] if block.kind == "node" else graph.edges[block.table]
    table = (plan.nodes if block.kind == "node" else plan.edges)[block.table]
    fitters = None if plan.fitted_state is not None else PerFileFitters(spec.features, table.groups).new_file()
    labels: set[str] = set()
    rows = chunks = 0
    try:
        for chunk in block_chunks:
            if block.kind == "node":
                ends = [("id", spec.type, checked_node_ids(chunk, spec.id_column))]  # type: ignore[union-attr]
            else:
                ends = [
                    (role, getattr(spec, f"{role}_type"), chunk.table.column(getattr(spec, f"{role}_column"))) for role in ("src", "dst")
                ]
            for fitter in fitters or []:
                fitter.update(chunk.table, chunk.row)
            if block.kind == "node" and spec.label_column:  # type: ignore[union-attr]
                labels |= label_values(chunk.table, spec.label_column)  # type: ignore[union-attr]
            for role, node_type, ids in ends:
                for bucket, positions, values in bucket_batches(ids, rows, plan.buckets):
                    yield (node_type, bucket), IdBatch(block, role, positions, values)
            rows += chunk.table.num_rows
            chunks += 1
    except GnnflowError as exc:
        order = (NODE_SCAN, block.table, 0, block.file) if block.kind == "node" else (EDGE, block.table, EDGE_FIT, block.file)
        yield Problem(order, str(exc))
        return
    yield Scan(block, rows, chunks, fitters, sorted(labels))


def resolve_bucket(
    key: tuple[str, int], batches: list[IdBatch], layout: Layout, plan: Plan
) -> Iterator[Problem | tuple[tuple[int, int], IdBatch]]:
    """One bucket of one node type: its node ids checked for duplicates, then every endpoint
    batch hashed here resolved to node ids (-1: not in the node table)."""
    node_batches = sorted((b for b in batches if b.block.kind == "node"), key=lambda b: b.block.file)
    values = np.concatenate([b.ids.to_numpy(zero_copy_only=False) for b in node_batches]) if node_batches else np.empty(0, object)
    files = np.concatenate([np.full(len(b.positions), b.block.file) for b in node_batches]) if node_batches else np.empty(0, np.int64)
    positions = np.concatenate([b.positions for b in node_batches]) if node_batches else np.empty(0, np.int64)
    order = np.lexsort((positions, files))  # file order, then row: the order the one-process engine reads
    values, files, positions = values[order], files[order], positions[order]
    index = pd.Index(values)
    if node_batches and not index.is_unique:
        table = node_batches[0].block.table
        spec, source = plan.config.graph.nodes[table], plan.nodes[table].source
        duplicated = index.duplicated(keep="first")
        k = int(np.flatnonzero(duplicated)[0])
        first = int(np.flatnonzero(values == values[k])[0])
        if source.bigquery is not None:  # its rows have no numbers to point at: the one-process engine's words
            error = GnnflowError(f"{spec.uri}, column '{spec.id_column}': duplicate node id {values[k]!r} (in at least two rows)")
        else:
            where = [f"{source.files[files[i]]}, row {positions[i] + 1}" for i in (k, first)]
            error = duplicate_id_error(values[k], spec.id_column, *where)
        yield Problem((NODE_SCAN, table, NODE_DUPLICATE, int(files[k]), int(positions[k])), str(error))
        index, files, positions = index[~duplicated], files[~duplicated], positions[~duplicated]
    if node_batches:  # a node's id: its file's first id plus its row in the file
        table = node_batches[0].block.table
        first_ids = np.asarray([layout.first_id.get((table, f), 0) for f in range(int(files.max()) + 1)], dtype=np.int64)
        node_ids = first_ids[files] + positions
    else:
        node_ids = np.empty(0, np.int64)
    for batch in batches:
        if batch.block.kind == "edge":
            found = index.get_indexer(batch.ids.to_numpy(zero_copy_only=False)) if len(index) else np.full(len(batch.positions), -1)
            resolved = np.where(found >= 0, node_ids[np.maximum(found, 0)] if len(node_ids) else -1, -1).astype(np.int64)
            yield (batch.block.table, batch.block.file), IdBatch(batch.block, batch.role, batch.positions, pa.array(resolved))


def write_node_block(item: Block | RowBlock, layout: Layout, plan: Plan) -> Iterator[Written | Problem]:
    """Transforms and writes one node file or block of rows (node parts and id-map parts)."""
    block, chunks = _open_block(item, plan)
    if ("node", block.table, block.file) not in layout.block_rows:
        return  # its scan failed
    spec = plan.config.graph.nodes[block.table]
    staging = plan.staging()
    written = Written(block, [], {}, 0)
    first_id, first_part = layout.first_id[(block.table, block.file)], layout.first_part[("node", block.table, block.file)]
    split = node_split(plan.config, spec.type)
    try:
        for i, chunk in enumerate(chunks):
            encoded = encode_node_chunk(
                spec, layout.node_features[block.table], layout.vocabularies[block.table], split, chunk, first_id + chunk.first_row - 1
            )
            count_splits(encoded.split_codes, written.split_sizes)
            count_splits(encoded.labelled_split_codes, written.labelled_sizes)
            written.parts.append((write_part(staging, f"nodes/{spec.type}", first_part + i, encoded.nodes), encoded.nodes.num_rows))
            write_part(staging, f"id_maps/{spec.type}", first_part + i, encoded.id_map)
            written.count += encoded.nodes.num_rows
    except GnnflowError as exc:
        yield Problem((NODE_WRITE, block.table, block.file), str(exc))
        return
    written.entries = dict(staging.entries)
    yield written


def write_edge_block(
    key: tuple[int, int], resolved: list[IdBatch | RowBlock | None], layout: Layout, plan: Plan
) -> Iterator[Written | Problem]:
    """Transforms and writes one edge file (or block of rows, which comes in ``resolved``), its
    endpoints resolved by :func:`resolve_bucket`."""
    carried = [r for r in resolved if isinstance(r, RowBlock)]
    block, chunks = _open_block(carried[0] if carried else Block("edge", *key), plan)
    rows = layout.block_rows.get(("edge", block.table, block.file))
    if rows is None:
        return  # its scan failed
    ends = {"src": np.full(rows, -1, dtype=np.int64), "dst": np.full(rows, -1, dtype=np.int64)}
    for batch in resolved:
        if isinstance(batch, IdBatch):
            ends[batch.role][batch.positions] = batch.ids.to_numpy()
    spec = plan.config.graph.edges[block.table]
    staging = plan.staging()
    written = Written(block, [], {}, 0)
    first_row, first_part = layout.first_row[key], layout.first_part[("edge", *key)]
    split = edge_split(plan.config, spec)
    try:
        for i, chunk in enumerate(chunks):
            a, b = chunk.first_row - 1, chunk.first_row - 1 + chunk.table.num_rows
            encoded = encode_edge_chunk(
                spec, layout.edge_features[block.table], split, chunk, ends["src"][a:b], ends["dst"][a:b], first_row + a
            )
            count_splits(encoded.split_codes, written.split_sizes)
            written.parts.append((write_part(staging, f"edges/{spec.name}", first_part + i, encoded.table), encoded.table.num_rows))
            written.count += encoded.table.num_rows
            written.dropped += encoded.dropped
    except GnnflowError as exc:
        yield Problem((EDGE, block.table, EDGE_WRITE, block.file), str(exc))
        return
    written.entries = dict(staging.entries)
    yield written
