"""``preprocess.engine: beam``: the step as one Apache Beam pipeline, then the same publication.

The launcher opens every table (headers and columns are checked here, before any job starts),
builds the pipeline from :mod:`components.preprocess.beam_transforms`, and runs it locally on
N processes or on Dataflow. Workers write their Parquet parts straight into the staged
generation; the pipeline's last step writes a small result file there (per-block counts and
file checksums, fitted transforms, data errors). The launcher reads it, raises the first data
error in the order the one-process engine would have met it, or assembles the schema and
publishes: the manifest is written last, as in every step.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from components import storage
from components.beam_pipeline import Problem, first_problem, put_result, run_pipeline, take_result
from components.beam_pipeline.bigquery_endpoints import follow_emulator_variables
from components.config import GnnflowConfig
from components.preprocess.beam_bigquery import bigquery_reads, read_row_blocks
from components.preprocess.beam_transforms import (
    NODE_WRITE,
    STEP,
    Block,
    Layout,
    Plan,
    RowBlock,
    Scan,
    TablePlan,
    Written,
    build_layout,
    resolve_bucket,
    scan_block,
    write_edge_block,
    write_node_block,
)
from components.preprocess.edges import edge_type_schema, open_edge_table
from components.preprocess.nodes import node_type_schema, open_node_table, unlabelled_error
from components.preprocess.output import publish_preprocessed
from components.preprocess.parts import part_path
from components.preprocess.splits import edge_split, node_split
from components.schema import SPLIT_CODES
from components.tables.transforms import FittedFeatures

log = logging.getLogger("gnnflow.preprocess")

_BUCKET_BYTES = 32 << 20  # input bytes per join bucket: a bucket's ids stay far below a worker's memory


def plan_tables(config: GnnflowConfig, output: storage.Uri, generation: str, fitted_state: dict | None) -> Plan:
    """Opens every table (an error naming file and column on a bad header) and sizes the join."""
    nodes = [TablePlan(*open_node_table(s)) for s in config.graph.nodes]
    edges = [TablePlan(*open_edge_table(s)) for s in config.graph.edges]
    beam = config.preprocess.beam
    buckets = beam.join_buckets
    if buckets is None:
        total = sum(storage.size(f) for t in [*nodes, *edges] for f in t.source.files) + _bigquery_bytes([*nodes, *edges])
        workers = beam.num_workers if beam.runner == "local" else beam.dataflow.max_num_workers
        buckets = max(4 * workers, math.ceil(total / _BUCKET_BYTES))
    return Plan(config, str(output), generation, nodes, edges, fitted_state, buckets)


def _bigquery_bytes(tables: list[TablePlan]) -> int:
    """The stored size of the ``bq://`` tables (before the row filter: an upper bound)."""
    from components.warehouse.reading import table_metadata

    return sum(table_metadata(t.source.bigquery.table).num_bytes or 0 for t in tables if t.source.bigquery is not None)


def build_pipeline(pipeline: Any, plan: Plan) -> None:
    """The Beam graph of the step (see :mod:`components.preprocess.beam_transforms`)."""
    import apache_beam as beam

    def blocks(kind: str, tables: list[TablePlan]) -> Any:
        """A table's files, or for a ``bq://`` table its rows as blocks (:mod:`components.preprocess.beam_bigquery`)."""
        files = pipeline | f"{kind} files" >> beam.Create(
            [Block(kind, t, f) for t, table in enumerate(tables) for f in range(len(table.source.files))]
        )
        read = [read_row_blocks(pipeline, r) for r in bigquery_reads(plan) if r.kind == kind]
        return (files, *read) | f"{kind} blocks" >> beam.Flatten() if read else files

    if any(t.source.bigquery is not None for t in [*plan.nodes, *plan.edges]):
        follow_emulator_variables()
    node_blocks, edge_blocks = blocks("node", plan.nodes), blocks("edge", plan.edges)
    scanned = (node_blocks, edge_blocks) | "all files" >> beam.Flatten() | "scan" >> beam.FlatMap(scan_block, plan)
    # (Beam annotates Partition as taking a PartitionFn; it takes plain callables too.)
    scans, scan_problems, id_batches = scanned | "sort scan output" >> beam.Partition(
        lambda e, _: 0 if isinstance(e, Scan) else 1 if isinstance(e, Problem) else 2,  # type: ignore[arg-type]
        3,
    )
    layout = scans | "all scans" >> beam.combiners.ToList() | "layout" >> beam.Map(build_layout, plan)
    layout_side = beam.pvalue.AsSingleton(layout)

    resolved = (
        id_batches
        | "group ids by bucket" >> beam.GroupByKey()
        | "resolve buckets" >> beam.FlatMap(lambda kv, lay: resolve_bucket(kv[0], list(kv[1]), lay, plan), layout_side)
    )
    join_problems, endpoints = resolved | "sort join output" >> beam.Partition(lambda e, _: 0 if isinstance(e, Problem) else 1, 2)  # type: ignore[arg-type]
    # A block of rows travels with its endpoints to its writer; a file is read there.
    every_edge_block = edge_blocks | "edge block markers" >> beam.Map(
        lambda b: ((b.block.table, b.block.file), b) if isinstance(b, RowBlock) else ((b.table, b.file), None)
    )
    edges_written = (
        (endpoints, every_edge_block)
        | "endpoints and blocks" >> beam.Flatten()
        | "group endpoints by file" >> beam.GroupByKey()
        | "write edges" >> beam.FlatMap(lambda kv, lay: write_edge_block(kv[0], list(kv[1]), lay, plan), layout_side)
    )
    nodes_written = node_blocks | "write nodes" >> beam.FlatMap(write_node_block, layout_side, plan)
    (
        (layout, scan_problems, join_problems, nodes_written, edges_written)
        | "results" >> beam.Flatten()
        | "all results" >> beam.combiners.ToList()
        | "write result" >> beam.Map(write_result, plan)
    )


def write_result(results: list[Layout | Problem | Written], plan: Plan) -> None:
    """The pipeline's last step: everything the launcher needs, as one small JSON file."""
    layout = next(r for r in results if isinstance(r, Layout))
    problems = [*layout.problems, *(r for r in results if isinstance(r, Problem))]
    written = sorted((r for r in results if isinstance(r, Written)), key=lambda w: (w.block.kind, w.block.table, w.block.file))
    result = {
        "problems": [[list(p.order), p.message] for p in problems],
        "written": [
            {
                "kind": w.block.kind,
                "table": w.block.table,
                "file": w.block.file,
                "parts": w.parts,
                "count": w.count,
                "dropped": w.dropped,
                "split_sizes": w.split_sizes,
                "labelled_sizes": w.labelled_sizes,
                "entries": {path: [e.size, e.crc32c] for path, e in w.entries.items()},
            }
            for w in written
        ],
        "node_features": {t: [f.to_dict() for f in fs] for t, fs in layout.node_features.items()},
        "vocabularies": layout.vocabularies,
        "edge_features": {t: [f.to_dict() for f in fs] for t, fs in layout.edge_features.items()},
    }
    put_result(plan.staging(), result)


def preprocess_with_beam(
    config: GnnflowConfig, output: storage.Uri, fitted_state: dict | None, image: str | None
) -> storage.PublishedOutput:
    """Runs the step on Beam; the published output equals the one-process engine's."""
    with storage.staged_output(output, STEP) as staging:
        plan = plan_tables(config, output, staging.generation, fitted_state)
        files = sum(len(t.source.files) for t in [*plan.nodes, *plan.edges])
        log.info("preprocess: %d table file(s), node ids hashed into %d join bucket(s)", files, plan.buckets)
        run_pipeline(lambda pipeline: build_pipeline(pipeline, plan), config.preprocess.beam, STEP, image)
        result = take_result(staging, STEP)
        problems = [Problem(tuple(order), message) for order, message in result["problems"]]
        if fitted_state is None:  # as the one-process engine: data for an earlier run's transforms may be inference-only
            problems += _label_problems(config, result)
        error = first_problem(problems)
        if error is not None:
            raise error
        return _publish(staging, config, plan, result)


def _label_problems(config: GnnflowConfig, result: dict) -> list[Problem]:
    """The node-classification target without labelled training rows, where the one-process
    engine meets it: after writing that node table, before any edge table."""
    problems = []
    for t, spec in enumerate(config.graph.nodes):
        if node_split(config, spec.type) is None:
            continue
        written = [w for w in result["written"] if w["kind"] == "node" and w["table"] == t]
        labelled = {name: sum(w["labelled_sizes"][name] for w in written) for name in SPLIT_CODES}
        if written and (error := unlabelled_error(spec, labelled)):
            problems.append(Problem((NODE_WRITE, t, 1 << 62), str(error)))
    return problems


def _publish(staging: storage.OutputStaging, config: GnnflowConfig, plan: Plan, result: dict) -> storage.PublishedOutput:
    blocks: dict[tuple[str, int], list[dict]] = {}
    for w in result["written"]:
        blocks.setdefault((w["kind"], w["table"]), []).append(w)
        staging.add_entries({path: storage.FileEntry(size, crc) for path, (size, crc) in w["entries"].items()})

    def totals(kind: str, t: int) -> tuple[list[str], list[int], int, int, dict[str, int]]:
        written = sorted(blocks.get((kind, t), []), key=lambda w: w["file"])
        parts = [(path, rows) for w in written for path, rows in w["parts"]]
        sizes = {name: sum(w["split_sizes"][name] for w in written) for name in SPLIT_CODES}
        return [p for p, _ in parts], [r for _, r in parts], sum(w["count"] for w in written), sum(w["dropped"] for w in written), sizes

    node_schemas, node_state = {}, {}
    for t, node in enumerate(config.graph.nodes):
        files, rows, count, _, sizes = totals("node", t)
        features = [FittedFeatures.from_dict(f) for f in result["node_features"][str(t)]]
        vocabulary = result["vocabularies"][str(t)]
        id_maps = [part_path(f"id_maps/{node.type}", i) for i in range(len(files))]
        split = node_split(config, node.type)
        node_schemas[node.type] = node_type_schema(node, features, vocabulary, count, sizes if split else None, files, id_maps, rows)
        node_state[node.type] = (features, vocabulary)
        log.info("nodes[%s]: wrote %d nodes, %d features, splits %s", node.type, count, len(node_schemas[node.type].feature_names), sizes)
    edge_schemas, edge_features = {}, {}
    for t, edge in enumerate(config.graph.edges):
        files, rows, count, dropped, sizes = totals("edge", t)
        features = [FittedFeatures.from_dict(f) for f in result["edge_features"][str(t)]]
        split = edge_split(config, edge)
        edge_schemas[edge.name] = edge_type_schema(edge, features, count, sizes if split else None, files, rows, dropped)
        edge_features[edge.name] = features
        if dropped:
            log.warning("edges[%s]: dropped %d of %d edges whose endpoint is not in the node table", edge.name, dropped, count + dropped)
        log.info("edges[%s]: wrote %d edges", edge.name, count)
    return publish_preprocessed(staging, config, node_schemas, edge_schemas, node_state, edge_features)
