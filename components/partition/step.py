"""Step ``partition``: TFRecords → one GLT graph partition per worker, published atomically.

N workers each load a disjoint share of the shards (:mod:`.loading`), meet at a barrier,
partition the graph together (:mod:`.partitioner`) and write partition ``rank``
(:mod:`.store`). Rank 0 also writes the partition books and the metadata; the launching
process publishes the manifest once every worker has finished.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import torch.distributed as dist

from components import storage
from components.config import PartitionSpec
from components.config.resources import DEFAULT_TIMEOUTS, DERIVED_THREADS, ThreadsSpec, WorkerTimeouts
from components.partition.loading import load_graph
from components.partition.loading_memory import check_loading_memory
from components.partition.original_ids import write_original_ids
from components.partition.output import STEP
from components.partition.partitioner import label_edge_types, partition_graph
from components.partition.store import METADATA_FILE, PartitionMetadata, part_folder, write_partition
from components.runtime import watchdog
from components.runtime.launcher import WorkerContext, launch_staged
from components.runtime.threads import use_worker_threads
from components.schema import stored_edge_types
from components.serialize.output import STEP as SERIALIZE_STEP
from components.serialize.output import read_graph_metadata

log = logging.getLogger("gnnflow.partition")


@dataclass(frozen=True)
class PartitionJob:
    """Everything a worker needs, passed to each spawned process."""

    input: str  # a published serialize output
    output: str
    generation: str
    options: PartitionSpec
    threads: ThreadsSpec = DERIVED_THREADS


def partition_worker(ctx: WorkerContext, job: PartitionJob) -> dict[str, storage.FileEntry] | None:
    """One worker; returns every written file's entry on rank 0, None elsewhere."""
    serialized = storage.open_published(job.input, step=SERIALIZE_STEP)
    metadata = read_graph_metadata(serialized)
    sizes = {name: entry.size for name, entry in serialized.manifest.files.items()}
    # Before the rendezvous: no peer has placed anything in /dev/shm yet.
    check_loading_memory(metadata, sizes, ctx.rank - ctx.local_rank, ctx.local_world_size, ctx.world_size, job.options.subprocess_min_bytes)
    ctx.init_process_group()
    use_worker_threads(job.threads, ctx.local_world_size, ctx.rank, "compute")
    # On a cluster every replica's launcher named its own generation: rank 0's wins.
    generation = [job.generation]
    dist.broadcast_object_list(generation, src=0)
    staging = storage.OutputStaging(storage.parse_uri(job.output), STEP, generation=generation[0])
    watchdog.mark("loading")
    options = job.options
    graph = load_graph(
        serialized, metadata, ctx.rank, ctx.world_size, parallel=options.load_in_parallel, subprocess_min_bytes=options.subprocess_min_bytes
    )
    dist.barrier()
    start = time.perf_counter()
    watchdog.mark("computing")
    part = partition_graph(graph, metadata, ctx.rank, ctx.world_size, job.options)
    del graph
    watchdog.mark("writing")
    entries = write_partition(part, staging)
    entries |= write_original_ids(serialized, metadata, part, staging, part_folder(ctx.rank))
    log.info(
        "rank %d: partition %d holds %s nodes and %s edges (%.1fs)",
        ctx.rank,
        ctx.rank,
        {t: c[ctx.rank] for t, c in part.node_counts.items()},
        {t: c[ctx.rank] for t, c in part.edge_counts.items()},
        time.perf_counter() - start,
    )
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, entries)
    watchdog.mark("publishing")
    if ctx.rank != 0:
        dist.barrier()
        return None
    for node in metadata.node_types.values():
        for rel in node.id_map_files:
            storage.copy_file(serialized.uri(rel), staging.uri(rel))
            staging.add_entries({rel: serialized.manifest.files[rel]})
    summary = PartitionMetadata(
        num_partitions=ctx.world_size,
        edge_assignment=job.options.edge_assignment,
        node_counts={t: part.node_counts[t] for t in metadata.node_types},
        edge_counts={t: part.edge_counts[t] for t in [*stored_edge_types(metadata), *label_edge_types(metadata)]},
        graph=json.loads(metadata.to_json()),
        method=job.options.method,
        edge_cut={t: part.cut_edges[t] / max(sum(part.edge_counts[t]), 1) for t in stored_edge_types(metadata)},
    )
    staging.write_bytes(METADATA_FILE, summary.to_json().encode())
    for worker_entries in gathered:
        staging.add_entries(worker_entries)
    dist.barrier()
    return dict(staging.entries)


def partition(
    input_uri: storage.Uri | str,
    output: storage.Uri | str,
    options: PartitionSpec,
    world_size: int,
    processes_per_replica: int = 1,
    timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS,
    threads: ThreadsSpec = DERIVED_THREADS,
) -> storage.PublishedOutput | None:
    """Runs the step; returns the published output (None on cluster replicas other than the first)."""
    output = storage.parse_uri(output)
    serialized = storage.open_published(input_uri, step=SERIALIZE_STEP)  # fail here, before any worker starts
    staging = storage.OutputStaging(output, STEP)
    job = PartitionJob(str(storage.parse_uri(input_uri)), str(output), staging.generation, options, threads)
    log.info("partition: %s → %s with %d worker(s)", input_uri, output, world_size)
    start = time.perf_counter()
    entries = launch_staged(
        staging,
        partition_worker,
        (job,),
        world_size=world_size,
        processes_per_replica=processes_per_replica,
        timeouts=timeouts,
    )
    if entries is None:
        return None
    staging.add_entries(entries)
    summary = PartitionMetadata.from_json(storage.read_text(staging.uri(METADATA_FILE)), METADATA_FILE)
    counts = {"partitions": summary.num_partitions}
    counts |= {f"nodes.{t}": sum(c) for t, c in summary.node_counts.items()}
    counts |= {f"edges.{t}": sum(c) for t, c in summary.edge_counts.items()}
    # What a trained model is traced back to its preprocess run by (components.partition.output.source_of).
    lineage = {"source": str(serialized.root), "source_generation": serialized.manifest.generation}
    published = staging.publish(counts=counts, metadata={**lineage, "edge_assignment": options.edge_assignment})
    log.info("partition: published %s (%s) in %.1fs", output, ", ".join(f"{k}={v}" for k, v in counts.items()), time.perf_counter() - start)
    return published
