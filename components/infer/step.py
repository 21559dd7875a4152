"""Step ``infer``: N workers embed every node of their partitions with the trained model (and, for
node classification, predict the target type's class), write Parquet shards keyed by the
original node ids, and recompute the test metrics from those shards.

Modes: ``sampled`` (GLT distributed neighbor loader with the training fan-outs, any graph) and
``exact`` (full-neighbourhood GraphSAGE or GCN over the whole graph with the full-graph machinery,
homogeneous graphs; see :mod:`.layerwise`).
Link prediction embeds over the training edges only, as training sampled, so the test edges it
scores never carried messages.
With ``infer.smoothing: correct_and_smooth`` the classification target's rows are held, smoothed
with Correct & Smooth over the partitions and only then written (:mod:`.smoothing_stage`).


Output layout and names: :mod:`.output`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from components import storage
from components.config import GnnflowConfig
from components.config.steps import PROPAGATION_TYPES
from components.errors import GnnflowError
from components.gnn.device import Placement, check_device, worker_placement
from components.gnn.link_labels import hard_negative_pairs, positive_pairs, training_edges
from components.gnn.metrics import all_sum, classification_metrics
from components.gnn.shared_memory import check_at_worker_start
from components.infer import shards
from components.infer.cold_start import check_bundle, install_learnt_inputs, trained_elsewhere
from components.infer.layerwise import check_encoder, exact_outputs
from components.infer.link_eval import link_metrics
from components.infer.link_eval import own_embeddings as served_embeddings
from components.infer.metrics import shard_confusion
from components.infer.output import METRICS_FILE, STEP, resolved_mode
from components.infer.outputs import NodeOutputs
from components.infer.readback import own_embeddings, own_nodes, read_own
from components.infer.restore import RestoredModel, model_config, restore_model
from components.infer.retrieval import write_retrieval
from components.infer.retrieval_metrics import retrieval_metrics
from components.infer.schema_fit import check_model_fits
from components.infer.sinks import OutputSinks, original_id_column
from components.infer.smoothing_stage import HoldingSinks, check_smoothing, smooth_and_write
from components.partition.output import STEP as PARTITION_STEP
from components.partition.output import StoredPartition, read_metadata
from components.runtime import watchdog
from components.runtime.allocator import reuse_freed_memory
from components.runtime.launcher import WorkerContext, launch_staged
from components.runtime.threads import ThreadPlan, Work, use_worker_threads
from components.train.output import STEP as TRAIN_STEP

log = logging.getLogger("gnnflow.infer")


@dataclass(frozen=True)
class InferJob:
    """Everything a worker needs, passed to each spawned process."""

    partitions: str  # a published partition output
    model: str  # a published train output
    output: str
    generation: str
    config: GnnflowConfig  # its model section is the one training used
    mode: str


def message_edges(part: StoredPartition, world_size: int) -> dict[str, torch.Tensor] | None:
    """Edge masks per type of the graph messages flow over (None: every edge); collective.

    Link prediction holds out the validation and test positives, as training did: embeddings
    that saw a test edge would score it too well.
    """
    schema = part.metadata.schema
    if schema.task_type != "link_prediction":
        return None
    return training_edges(part, schema, world_size)


def _sampled(
    ctx: WorkerContext,
    job: InferJob,
    part: StoredPartition,
    model: RestoredModel,
    placement: Placement,
    threads: ThreadPlan,
    sinks: OutputSinks,
) -> dict[str, int]:
    import graphlearn_torch as glt

    from components.gnn.feature_cache import fetch_whole_tables
    from components.gnn.glt_dataset import to_dist_dataset
    from components.gnn.sampling import RPC_THREADS, SamplingSetup
    from components.infer.sampled import sampled_outputs

    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="gnnflow-infer")
    ctx.init_rpc(num_rpc_threads=RPC_THREADS)
    whole = fetch_whole_tables(part, job.config.training.feature_cache_ratio, ctx.rank, ctx.world_size, ctx.local_world_size)
    dataset = to_dist_dataset(part, edge_filter=message_edges(part, ctx.world_size), placement=placement, whole=whole)
    setup = SamplingSetup.of(ctx, job.config, part.metadata.schema, edge_dir, placement, threads.sampling_workers)
    counts = sampled_outputs(setup, dataset, part, model, job.config.training.eval_batch_size, sinks)
    glt.distributed.barrier()  # peers may still sample from this partition
    glt.distributed.shutdown_rpc()
    return counts


def _exact(
    ctx: WorkerContext, part: StoredPartition, model: RestoredModel, placement: Placement, config: GnnflowConfig, sinks: OutputSinks
) -> dict[str, int]:
    """Exact mode computes the whole partition's outputs at once (the full-graph machinery holds
    every node's rows of each layer anyway), then writes them through the same streams."""
    keep = message_edges(part, ctx.world_size)
    outputs = exact_outputs(
        part,
        model,
        ctx.rank,
        keep[part.metadata.schema.target] if keep else None,
        device=placement.device,
        block_rows=config.training.full_graph_block_rows,
    )
    counts = {}
    for node_type, out in outputs.items():
        if model.task_type == "link_prediction":  # in the decoder's space: their inner product is the dot score
            with torch.no_grad():
                out = NodeOutputs(out.node_ids, model.module.cpu().embed(out.embeddings), out.probabilities)
        with sinks.open(node_type) as sink:
            sink.add(out)
        counts[node_type] = len(out.node_ids)
    return counts


def _classification_metrics(
    staging: storage.OutputStaging, part: StoredPartition, originals: dict, rank: int, splits: tuple[str, ...] = ("test",)
) -> dict[str, float]:
    """Every worker reads its own target shard back; the confusion matrices are summed.
    ``<split>_accuracy``, ``_macro_f1`` and ``_count`` of each of ``splits``."""
    schema = part.metadata.schema
    target, nodes = schema.target, part.nodes[schema.target]
    table, rows = read_own(staging, rank, target, ["prediction"], originals[target])
    vocabulary = schema.node_types[target].label_vocabulary or []
    where = str(staging.uri(shards.shard_path(target, rank)))
    figures: dict[str, float] = {}
    for split in splits:
        metrics = classification_metrics(all_sum(shard_confusion(table, rows, nodes["label"], nodes["split"], vocabulary, where, split)))
        figures |= {f"{split}_accuracy": metrics["accuracy"], f"{split}_macro_f1": metrics["macro_f1"], f"{split}_count": metrics["count"]}
    return figures


def _link_metrics(
    staging: storage.OutputStaging, part: StoredPartition, originals: dict, model: RestoredModel, ctx: WorkerContext, seed: int
) -> dict[str, float]:
    """Every worker reads its own endpoint shards back and scores its own test edges, fetching
    other partitions' embeddings from their owners (see :mod:`.link_eval`)."""
    schema = part.metadata.schema
    edge = schema.edge_types[schema.target]
    embeddings = {}
    for node_type in dict.fromkeys([edge.src_type, edge.dst_type]):
        own = own_embeddings(staging, ctx.rank, node_type, originals[node_type])
        nodes = part.nodes[node_type]
        embeddings[node_type] = served_embeddings(
            own, part.metadata.node_counts[node_type], part.index, nodes["source_id"], nodes["node_id"], ctx.world_size
        )
    positives, edge_ids = positive_pairs(part, "test")
    return link_metrics(
        model.module,
        embeddings[edge.src_type],
        embeddings[edge.dst_type],
        positives,
        edge_ids,
        seed,
        ctx.world_size,
        hard_negative_pairs(part, "test"),
    )


def _retrieval(
    staging: storage.OutputStaging,
    part: StoredPartition,
    originals: dict,
    ctx: WorkerContext,
    config: GnnflowConfig,
    threads: ThreadPlan,
) -> dict:
    """Writes this worker's candidates and index shard from its embedding shards read back, then
    scores them from the files (collective)."""
    schema = part.metadata.schema
    edge = schema.edge_types[schema.target]
    sources = own_nodes(staging, part, edge.src_type, originals[edge.src_type])
    targets = sources if edge.dst_type == edge.src_type else own_nodes(staging, part, edge.dst_type, originals[edge.dst_type])
    figures = write_retrieval(
        staging,
        ctx.rank,
        sources,
        targets,
        part.metadata.node_counts[edge.dst_type],
        config.retrieval,
        edge.src_type == edge.dst_type,
        ctx.world_size,
        threads.faiss,
    )
    return figures | retrieval_metrics(
        staging,
        ctx.rank,
        positive_pairs(part, "test")[0],
        part.metadata.node_counts,
        originals,
        edge.src_type,
        edge.dst_type,
        figures["retrieval_k"],
        ctx.world_size,
    )


def infer_worker(ctx: WorkerContext, job: InferJob) -> dict | None:
    """One worker; returns the written files, metrics and counts on rank 0, None elsewhere.

    It ends with a barrier and leaves the process group as it is: the launcher ends the process
    once the result is sent. (In torch 2.3 ``destroy_process_group`` right after a gloo
    collective can deadlock: its destructor holds the GIL while a gloo thread needs it to free
    the collective's tensors; a worker stuck there with its result unsent stalls the step.)
    """
    if job.mode == "sampled":  # before the rendezvous: no peer has placed anything in /dev/shm yet
        check_at_worker_start(ctx, job.partitions, job.config, step="infer", loaders=1)  # one node type's loader at a time
    placement = worker_placement(job.config.training, ctx)
    ctx.init_process_group(backend=placement.backend)
    # Inference samples a batch, then computes it: its share of the cores goes to the computation.
    training = job.config.training
    work: Work = "multiprocess" if job.mode == "sampled" and training.sampling == "multiprocess" else "compute"
    threads = use_worker_threads(job.config.resources.threads, ctx.local_world_size, ctx.rank, work, training.sampling_workers)
    generation = [job.generation]  # on a cluster every replica's launcher named its own: rank 0's wins
    dist.broadcast_object_list(generation, src=0)
    staging = storage.OutputStaging(storage.parse_uri(job.output), STEP, generation=generation[0])
    watchdog.mark("loading")
    partitions = storage.open_published(job.partitions, step=PARTITION_STEP)
    from components.gnn.glt_dataset import read_for_worker

    part = read_for_worker(partitions, ctx.rank, sampled=job.mode == "sampled", placement=placement)
    schema = part.metadata.schema
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    published_model = storage.open_published(job.model, step=TRAIN_STEP)
    elsewhere = trained_elsewhere(published_model, partitions)
    model = restore_model(published_model, schema, job.config, edge_dir, trained_elsewhere=elsewhere)
    cold = install_learnt_inputs(published_model, model, part, partitions, elsewhere)  # featureless types: which nodes are new
    if job.config.resources.reuse_freed_memory:
        reuse_freed_memory()
    originals = {t: original_id_column(partitions, ctx.rank, t) for t in schema.node_types}  # this partition's only
    # Each node type's shard is written while it is embedded, and checked to hold every node once.
    smoothing = job.config.infer.smoothing != "none"  # then the target's rows are held, smoothed, then written
    sinks = HoldingSinks(staging, part, originals, cold, hold=schema.target) if smoothing else OutputSinks(staging, part, originals, cold)
    start = time.perf_counter()
    model.module.to(placement.device)
    if job.mode == "exact":
        counts = _exact(ctx, part, model, placement, job.config, sinks)
    else:
        counts = _sampled(ctx, job, part, model, placement, threads, sinks)
    model.module.cpu()  # the link metrics below score host embeddings
    smoothed: dict[str, object] = {}  # the metrics of the model's own predictions, before smoothing, and the alphas chosen
    if isinstance(sinks, HoldingSinks):
        watchdog.mark("computing")
        smoothed = smooth_and_write(sinks, job.config.infer, ctx.world_size, job.config.training.full_graph_block_rows)
    seconds = time.perf_counter() - start  # embedding (smoothing) and writing
    watchdog.mark("writing")
    retrieval = _retrieval(staging, part, originals, ctx, job.config, threads) if job.config.retrieval_on else {}
    # After this every shard is written: rank 0 may read any of them.
    gathered: list = [None] * ctx.world_size
    cold_counts = {t: int(flags.sum()) for t, flags in cold.items()} if cold is not None else None
    dist.all_gather_object(gathered, (staging.entries, counts, seconds, cold_counts))
    metrics: dict[str, object]  # floats, and smoothing's choice of alphas
    if schema.task_type == "node_classification" and smoothing:  # the shards' accuracies are the smoothed ones
        metrics = _classification_metrics(staging, part, originals, ctx.rank, ("val", "test")) | smoothed
    elif schema.task_type == "node_classification":
        metrics = dict(_classification_metrics(staging, part, originals, ctx.rank))
    else:
        metrics = dict(_link_metrics(staging, part, originals, model, ctx, job.config.training.seed) | retrieval)
    watchdog.mark("publishing")
    if ctx.rank != 0:
        dist.barrier()  # nobody leaves while rank 0 may still talk to it
        return None
    named = {"mode": job.mode, **({"smoothing": job.config.infer.smoothing} if smoothing else {})}
    metrics = {**named, **(metrics or {})}  # mode (and smoothing) beside the floats
    if cold is not None:  # partitions other than the model's own: how many nodes it had no row of
        metrics |= cold_metrics([g[3] for g in gathered])
    staging.write_json(METRICS_FILE, metrics)
    staging.write_bytes("config.resolved.yaml", job.config.to_yaml().encode())
    for entries, *_ in gathered:
        staging.add_entries(entries)
    counts = {f"nodes.{t}": sum(g[1][t] for g in gathered) for t in schema.node_types}
    dist.barrier()
    return {"entries": dict(staging.entries), "metrics": metrics, "counts": counts, "seconds": max(g[2] for g in gathered)}


def cold_metrics(per_worker: list[dict[str, int]]) -> dict[str, int]:
    """``cold_nodes`` (all types) and ``cold_nodes.<type>`` of each featureless type, summed over workers."""
    by_type = {t: sum(w[t] for w in per_worker) for t in per_worker[0]}
    return {"cold_nodes": sum(by_type.values()), **{f"cold_nodes.{t}": n for t, n in by_type.items()}}


def _open(uri: storage.Uri | str, step: str, what: str) -> storage.PublishedOutput:
    try:
        return storage.open_published(uri, step=step)
    except GnnflowError as exc:
        raise GnnflowError(f"{what}: {exc}") from None


def infer(
    config: GnnflowConfig, partitions_uri: storage.Uri | str, model_uri: storage.Uri | str, output: storage.Uri | str, mode: str = "auto"
) -> storage.PublishedOutput | None:
    """Runs the step; returns the published output (None on cluster replicas other than the first).
    ``mode``: sampled, exact, or auto (exact for a config that trains full-graph, else sampled)."""
    mode = resolved_mode(mode, config.training.mode)
    output = storage.parse_uri(output)
    # Everything a user can get wrong fails here, before any worker starts.
    partitions = _open(partitions_uri, PARTITION_STEP, "the partitions")
    model_output = _open(model_uri, TRAIN_STEP, "the model")
    metadata = read_metadata(partitions)
    schema = metadata.schema
    world_size = config.resources.world_size
    if world_size != metadata.num_partitions:
        raise GnnflowError(
            f"world size {world_size} does not match the {metadata.num_partitions} partitions of {partitions.root}: "
            f"infer runs one worker per partition (set resources.world_size or --world-size to {metadata.num_partitions})"
        )
    if mode == "exact" and schema.is_heterogeneous:
        raise GnnflowError(
            f"--mode exact supports homogeneous graphs; {partitions.root} holds {len(schema.node_types)} node types "
            f"and {len(schema.message_edge_types)} edge types: use --mode sampled"
        )
    check_device(config.training)
    check_smoothing(config.infer, schema, str(partitions.root))
    check_model_fits(model_output, schema, partitions.root)
    elsewhere = trained_elsewhere(model_output, partitions)
    if elsewhere:
        check_bundle(model_output, schema)
        log.info("infer: %s was trained on other partitions: featureless nodes are found by their original ids", model_output.root)
    restored = restore_model(model_output, schema, config, "out" if metadata.edge_assignment == "src" else "in", elsewhere)
    if mode == "exact":
        check_encoder(restored.module.encoder)
    fan_outs = config.training.fan_outs
    lengths = {len(v) for v in (fan_outs.values() if isinstance(fan_outs, dict) else [fan_outs])}
    reasons = sorted({reason for n in lengths if (reason := restored.spec.hops_error(n))})
    if mode == "sampled" and reasons and restored.spec.type in PROPAGATION_TYPES:
        raise GnnflowError(f"training.fan_outs has {'/'.join(map(str, sorted(lengths)))} entries but {reasons[0]}")
    if mode == "sampled" and reasons:
        raise GnnflowError(
            f"training.fan_outs has {'/'.join(map(str, sorted(lengths)))} entries, the model has {restored.spec.num_layers} "
            "layers: give one fan-out per layer"
        )
    if restored.spec != config.model:
        log.warning("the config's model section differs from the one %s was trained with; using the trained one", model_output.root)
    staging = storage.OutputStaging(output, STEP)
    job = InferJob(str(partitions.root), str(model_output.root), str(output), staging.generation, model_config(config, restored.spec), mode)
    log.info("infer: %s with %s → %s, %d worker(s), %s mode", partitions.root, model_output.root, output, world_size, mode)
    start = time.perf_counter()
    result = launch_staged(
        staging,
        infer_worker,
        (job,),
        world_size=world_size,
        processes_per_replica=config.resources.processes_per_replica,
        timeouts=config.resources.worker_timeouts,
    )
    if result is None:
        return None
    staging.add_entries(result["entries"])
    metrics, counts = result["metrics"], result["counts"]
    metadata_out = {"partitions": str(partitions.root), "model": str(model_output.root), "mode": mode, "metrics": metrics}
    published = staging.publish(counts={**counts, "workers": world_size}, metadata=metadata_out)
    total = sum(counts.values())
    log.info(
        "infer: %d nodes embedded in %.1fs (%.0f nodes/s, slowest worker) out of %.1fs in all; published %s (shards in %s)",
        total,
        result["seconds"],
        total / max(result["seconds"], 1e-9),
        time.perf_counter() - start,
        output,
        published.root.join(published.manifest.generation, shards.EMBEDDINGS_FOLDER),
    )
    log.info("infer: %s", ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
    return published
