"""Partitioned loading: one worker's disjoint share of the TFRecord shards → torch tensors.

Each large entity (a node type or an edge type) is read in a spawned subprocess, so decoding
runs in parallel and the memory it churns through is returned to the OS when the child exits;
the tensors come back through shared memory (no copy). In sequence mode, edges load first: they
are the biggest entity, so loading them while nothing else is resident lowers peak memory.
Small entities are read in the worker itself: a subprocess's start (seconds of imports) costs
more than decoding them (about 0.2 s for CiteSeer's 50 MB of node records).
"""

from __future__ import annotations

import logging
import multiprocessing.synchronize
import queue as queue_module
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.multiprocessing as torch_mp

from components import storage
from components.errors import GnnflowError
from components.feature_storage.codec import FLOAT32, FeatureCodec, codec_of, log_clipped
from components.schema import GraphSchema
from components.serialize.output import STORED_BYTES

log = logging.getLogger("gnnflow.partition")

# Tensors leave the child as shared-memory file descriptors; the child must stay alive until
# the parent has taken them, so it waits for this long for the parent's acknowledgement.
_ACK_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class EntityLoad:
    """What one child loads: the shards of one node or edge type."""

    kind: str  # "node" or "edge"
    name: str
    root: str  # the serialized output's generation folder URI
    files: tuple[str, ...]
    expected: tuple[storage.Expected, ...]  # what the manifest records for each of ``files``
    int64_keys: dict[str, int]
    float_keys: dict[str, int]
    size: int = 0  # bytes of its shards
    codec: FeatureCodec = FLOAT32  # how its feature rows are stored
    # True: the records hold the rows already stored (serialize encoded them: read as they are);
    # False (float32 records, older outputs): each shard's rows are encoded as it is decoded.
    stored_bytes: bool = False
    constants: dict[str, int] = field(default_factory=dict)  # int keys the records leave out, with their value


@dataclass
class LoadedGraph:
    """One worker's share of the graph, as int64 / int8 tensors and features in their stored type, keyed by record key.

    nodes[type]: node_id (n,), features (n, d), label (n,) if labeled, split (n,)
    edges[type]: edge_id (e,), src (e,), dst (e,), features (e, d_e), split (e,)
    """

    nodes: dict[str, dict[str, torch.Tensor]]
    edges: dict[str, dict[str, torch.Tensor]]


def assign_shards(files: Sequence[str], sizes: Sequence[int], rank: int, world_size: int) -> list[str]:
    """The shards worker ``rank`` reads: a balanced, disjoint split by size.

    Largest shards are dealt first, each to the least-loaded worker (ties to the lower rank),
    so every worker computes the same assignment without talking to the others.
    """
    loads = [0] * world_size
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(files)), key=lambda i: (-sizes[i], i)):
        target = min(range(world_size), key=lambda r: (loads[r], r))
        loads[target] += sizes[i]
        owned[target].append(i)
    return [files[i] for i in sorted(owned[rank])]


# Stored bytes → numpy dtype of the stored values (little-endian as written; bfloat16 as its raw bits).
_STORED_NUMPY = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int8": "i1"}


def _stored_rows(raw: np.ndarray, rows: int, width: int, codec: FeatureCodec) -> torch.Tensor:
    """(rows, width * value bytes) uint8 of stored rows → (rows, width) tensor of the codec's dtype."""
    values = raw.reshape(rows, -1).view(_STORED_NUMPY[codec.storage])
    rows_tensor = torch.from_numpy(values.astype(values.dtype.newbyteorder("="), copy=False))
    return (rows_tensor.view(torch.bfloat16) if codec.storage == "bfloat16" else rows_tensor).reshape(rows, width)


def read_entity(job: EntityLoad) -> dict[str, torch.Tensor]:
    """Reads and decodes the shards of one entity (runs in the child)."""
    from components.tfrecord import decode_tfrecord_file  # noqa: PLC0415 - this function is the one place it is used

    root = storage.parse_uri(job.root)
    parts: list[dict[str, torch.Tensor]] = []
    clipped = 0
    float_keys = {} if job.stored_bytes else job.float_keys
    bytes_keys = {k: w * job.codec.value_bytes for k, w in job.float_keys.items()} if job.stored_bytes else {}
    for rel, expected in zip(job.files, job.expected, strict=True):
        # The whole shard at once: its records decode as numpy views of these bytes. The check
        # against the manifest covers every byte, so the per-record crcs need no second pass.
        data = storage.read_verified(root.join(rel), expected)
        source = str(root.join(rel))
        decoded = decode_tfrecord_file(data, job.int64_keys, float_keys, bytes_keys=bytes_keys, source=source, verify_crc=False)
        rows = len(next(iter(decoded.values()), ()))
        part = {k: torch.from_numpy(v) for k, v in decoded.items() if k not in job.float_keys}
        for key, width in job.float_keys.items():
            if job.stored_bytes:  # serialize encoded (and counted clipped values): the rows as they are
                part[key] = _stored_rows(decoded[key], rows, width, job.codec)
                continue
            # Stored form right away: only this shard's float32 rows are ever held.
            part[key], lost = job.codec.encode(torch.from_numpy(decoded[key]).reshape(rows, width))
            clipped += lost
        del data, decoded
        if rows:
            parts.append(part)
    log_clipped(clipped, f"{job.kind} type '{job.name}' ({len(job.files)} shard(s))")
    keys = [*job.int64_keys, *job.float_keys]
    if not parts:
        empty = {k: torch.zeros((0,) if w == 1 else (0, w), dtype=torch.int64) for k, w in job.int64_keys.items()}
        empty |= {k: torch.zeros((0, w), dtype=job.codec.dtype) for k, w in job.float_keys.items()}
        parts = [empty]
    out = {k: torch.cat([p[k] for p in parts]) for k in keys}  # copies: a part may be a view of its shard's bytes
    n = sum(len(p[keys[0]]) for p in parts) if keys else 0
    # split straight as the int8 it becomes: an int64 column first would be 8 bytes a row of transient memory
    out |= {k: torch.full((n,), v, dtype=torch.int8 if k == "split" else torch.int64) for k, v in job.constants.items()}
    if "features" not in out:  # records without features (an edge type with none): no column to read
        out["features"] = torch.zeros((n, 0), dtype=job.codec.dtype)
    if "split" in out:
        out["split"] = out["split"].to(torch.int8)
    return out


def _child(job: EntityLoad, results: torch_mp.Queue, ack: multiprocessing.synchronize.Event) -> None:
    try:
        tensors = {k: v.share_memory_() for k, v in read_entity(job).items()}
        results.put((job.kind, job.name, tensors, None))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent, named
        message = str(exc) if isinstance(exc, GnnflowError) else traceback.format_exc()
        results.put((job.kind, job.name, None, message))
        return
    ack.wait(_ACK_TIMEOUT_S)


def _read_here(job: EntityLoad) -> dict[str, torch.Tensor]:
    try:
        return read_entity(job)
    except GnnflowError as error:
        raise GnnflowError(f"loading {job.kind} type '{job.name}' failed: {error}") from None


def _collect(jobs: Sequence[EntityLoad], parallel: bool) -> dict[tuple[str, str], dict[str, torch.Tensor]]:
    if not jobs:
        return {}
    context = torch_mp.get_context("spawn")
    results = context.Queue()
    ack = context.Event()
    loaded: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    waves = [list(jobs)] if parallel else [[job] for job in jobs]
    try:
        for wave in waves:
            children = {(j.kind, j.name): context.Process(target=_child, args=(j, results, ack), daemon=True) for j in wave}
            for child in children.values():
                child.start()
            try:
                while len([k for k in children if k in loaded]) < len(children):
                    try:
                        kind, name, tensors, error = results.get(timeout=1.0)
                    except queue_module.Empty:
                        for (kind, name), child in children.items():
                            if (kind, name) not in loaded and not child.is_alive():
                                raise GnnflowError(
                                    f"loading {kind} type '{name}' failed: its subprocess exited with code {child.exitcode}"
                                ) from None
                        continue
                    if error is not None:
                        raise GnnflowError(f"loading {kind} type '{name}' failed in its subprocess: {error}")
                    loaded[(kind, name)] = tensors
            finally:
                ack.set()
                for child in children.values():
                    child.join(timeout=10)
                    if child.is_alive():
                        child.kill()
                        child.join()
                ack.clear()
    finally:
        results.close()
    return loaded


def load_graph(
    serialized: storage.PublishedOutput,
    metadata: GraphSchema,
    rank: int,
    world_size: int,
    *,
    parallel: bool = True,
    subprocess_min_bytes: int = 0,
) -> LoadedGraph:
    """Worker ``rank``'s share of every node and edge type; entities whose shards hold fewer than
    ``subprocess_min_bytes`` are decoded in this process, the others in subprocesses."""
    start = time.perf_counter()
    root = str(serialized.root.join(serialized.manifest.generation))
    sizes = {name: entry.size for name, entry in serialized.manifest.files.items()}

    def job(kind: str, name: str, all_files: Sequence[str]) -> EntityLoad:
        spec = metadata.record_format[f"{kind}_types"][name]
        files = assign_shards(all_files, [sizes[f] for f in all_files], rank, world_size)
        expected = tuple(serialized.expected(f) for f in files)
        entity = metadata.node_types[name] if kind == "node" else metadata.edge_types[name]
        codec = codec_of(entity, f"graph_metadata.json, {kind} type {name!r}")
        return EntityLoad(
            kind,
            name,
            root,
            tuple(files),
            expected,
            spec["int64"],
            spec["float"],
            sum(sizes[f] for f in files),
            codec,
            stored_bytes=spec.get("features_encoding") == STORED_BYTES,
            constants=dict(spec.get("constant", {})),
        )

    jobs = [job("edge", name, edge.files) for name, edge in metadata.edge_types.items()]
    jobs += [job("node", name, node.files) for name, node in metadata.node_types.items()]
    loaded = _collect([j for j in jobs if j.size >= subprocess_min_bytes], parallel)
    loaded |= {(j.kind, j.name): _read_here(j) for j in jobs if j.size < subprocess_min_bytes}
    graph = LoadedGraph(
        nodes={j.name: loaded[("node", j.name)] for j in jobs if j.kind == "node"},
        edges={j.name: loaded[("edge", j.name)] for j in jobs if j.kind == "edge"},
    )
    rows = sum(len(t["node_id"]) for t in graph.nodes.values()) + sum(len(t["edge_id"]) for t in graph.edges.values())
    seconds = time.perf_counter() - start
    log.info(
        "rank %d: loaded %d records from %d shard(s) in %.1fs (%s)",
        rank,
        rows,
        sum(len(j.files) for j in jobs),
        seconds,
        f"{rows / seconds:,.0f} rows/s" if seconds else "n/a",
    )
    return graph
