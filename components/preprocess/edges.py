"""Edge tables: map endpoint ids to node ids, transform edge features, split, and write."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa

from components.config import EdgeTableSpec, PreprocessSpec, SplitSpec
from components.errors import GnnflowError
from components.preprocess.nodes import open_table
from components.preprocess.parts import PartWriter
from components.runlog import progress, rate, timed
from components.schema import SPLIT_CODES, EdgeTypeSchema
from components.transforms import FeatureFitter, FittedFeatures, encode_features, encode_splits

log = logging.getLogger("gnnflow.preprocess")


def map_endpoints(values: pa.ChunkedArray, ids: pd.Index) -> np.ndarray:
    """Node ids (rows,) int64 of endpoint ids; -1 where the id is not in the node table."""
    return ids.get_indexer(values.to_numpy(zero_copy_only=False)).astype(np.int64)


def write_edges(
    spec: EdgeTableSpec,
    options: PreprocessSpec,
    src_ids: pd.Index,
    dst_ids: pd.Index,
    split: SplitSpec | None,
    reused: dict | None,
    writer: PartWriter,
) -> tuple[EdgeTypeSchema, list[FittedFeatures]]:
    """Writes one edge type; ``split`` is set when it is the link-prediction target.

    Edges whose endpoint is missing from the node table stop the step with the file and row,
    or, with ``on_unknown_endpoint: drop``, are dropped and counted.
    """
    base = [spec.src_column, spec.dst_column, *([spec.split_column] if spec.split_column else [])]
    source, groups = open_table(spec.uri, spec.format, base, spec.features)
    if reused is not None:
        features = [FittedFeatures.from_dict(f) for f in reused["features"]]
    elif spec.features:
        fitters = [FeatureFitter(fs, cols) for fs, cols in zip(spec.features, groups)]
        for chunk in source.chunks(options):
            for fitter in fitters:
                fitter.update(chunk.table, str(chunk.source), chunk.first_row)
        features = [f.finish() for f in fitters]
    else:
        features = []

    split_sizes = dict.fromkeys(SPLIT_CODES, 0)
    kept = dropped = rows = 0
    with timed() as elapsed, progress(f"write edges[{spec.name}]") as bar:
        for chunk in source.chunks(options):
            t = chunk.table
            src = map_endpoints(t.column(spec.src_column), src_ids)
            dst = map_endpoints(t.column(spec.dst_column), dst_ids)
            known = (src >= 0) & (dst >= 0)
            if not known.all():
                if spec.on_unknown_endpoint == "error":
                    row = int(np.flatnonzero(~known)[0])
                    column, node_type = (spec.src_column, spec.src_type) if src[row] < 0 else (spec.dst_column, spec.dst_type)
                    value = t.column(column)[row].as_py()
                    raise GnnflowError(
                        f"{chunk.source}, row {chunk.first_row + row}, column '{column}': node id {value!r} is not in "
                        f"node table '{node_type}' ({int((~known).sum())} such edges in this chunk; "
                        "set on_unknown_endpoint: drop to skip them)"
                    )
                dropped += int((~known).sum())
            x = encode_features(t, features, str(chunk.source), chunk.first_row)
            edge_rows = np.arange(rows, rows + t.num_rows, dtype=np.int64)
            if split is not None:
                codes = encode_splits(edge_rows, split, t.column(spec.split_column) if spec.split_column else None, None)
            else:
                codes = np.full(t.num_rows, -1, dtype=np.int8)
            keep = np.flatnonzero(known)
            columns: dict[str, pa.Array] = {"src": pa.array(src[keep]), "dst": pa.array(dst[keep])}
            if x.shape[1]:
                columns["features"] = pa.FixedSizeListArray.from_arrays(pa.array(x[keep].ravel()), x.shape[1])
            columns["split"] = pa.array(codes[keep])
            if split is not None:
                for name, code in SPLIT_CODES.items():
                    split_sizes[name] += int((codes[keep] == code).sum())
            writer.write(f"edges/{spec.name}", pa.table(columns))
            rows += t.num_rows
            kept += len(keep)
            bar.update(t.num_rows)
    if rows == 0:
        raise GnnflowError(f"edge table {spec.uri} is empty: it has a header but no rows")
    if dropped:
        log.warning("edges[%s]: dropped %d of %d edges whose endpoint is not in the node table", spec.name, dropped, rows)
    log.info("edges[%s]: wrote %d edges (%s)", spec.name, kept, rate(rows, elapsed[0]))
    schema = EdgeTypeSchema(
        src_type=spec.src_type,
        relation=spec.type,
        dst_type=spec.dst_type,
        count=kept,
        feature_names=[n for f in features for n in f.output_names],
        undirected=spec.undirected,
        split_sizes=split_sizes if split is not None else {},
        files=writer.files(f"edges/{spec.name}"),
        dropped_unknown_endpoints=dropped,
    )
    return schema, features
