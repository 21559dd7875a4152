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
from dataclasses import dataclass

import numpy as np
import torch
import torch.multiprocessing as torch_mp

from components import storage
from components.errors import GnnflowError
from components.schema import GraphSchema

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


@dataclass
class LoadedGraph:
    """One worker's share of the graph, as int64 / float32 / int8 tensors keyed by record key.

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


def read_entity(job: EntityLoad) -> dict[str, torch.Tensor]:
    """Reads and decodes the shards of one entity (runs in the child)."""
    from components.tfrecord import decode_tfrecord_file  # noqa: PLC0415 - this function is the one place it is used

    root = storage.parse_uri(job.root)
    parts: list[dict[str, np.ndarray]] = []
    for rel, expected in zip(job.files, job.expected, strict=True):
        # The whole shard at once: its records decode as numpy views of these bytes. The check
        # against the manifest covers every byte, so the per-record crcs need no second pass.
        data = storage.read_verified(root.join(rel), expected)
        part = decode_tfrecord_file(data, job.int64_keys, job.float_keys, source=str(root.join(rel)), verify_crc=False)
        del data
        if len(next(iter(part.values()), ())):
            parts.append(part)
    keys = [*job.int64_keys, *job.float_keys]
    if not parts:
        empty = {k: np.zeros((0,) if w == 1 else (0, w), np.int64) for k, w in job.int64_keys.items()}
        empty |= {k: np.zeros((0, w), np.float32) for k, w in job.float_keys.items()}
        parts = [empty]
    out = {k: torch.from_numpy(np.concatenate([p[k] for p in parts])) for k in keys}
    rows = len(next(iter(out.values())))
    for key, width in job.float_keys.items():
        out[key] = out[key].reshape(rows, width)
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
        return EntityLoad(kind, name, root, tuple(files), expected, spec["int64"], spec["float"], sum(sizes[f] for f in files))

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
