"""Step ``train``: N workers sample their partitions with GLT and train one model (``model.type``) under
DistributedDataParallel, or with ``training.mode: full_graph`` train on the whole graph, each
holding its partition (see :mod:`.full_graph`); rank 0 checkpoints every epoch and writes the
model and metrics.


Output layout and names: :mod:`.output`.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import logging
import math
import resource
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from components import storage
from components.config import GnnflowConfig
from components.gnn import interruption
from components.gnn.build import build_model
from components.gnn.device import Placement, check_device, worker_placement
from components.gnn.epoch import EpochStart, random_state
from components.gnn.feature_cache import fetch_whole_tables
from components.gnn.glt_dataset import node_splits, read_for_worker, to_dist_dataset
from components.gnn.interruption import BatchAgreement
from components.gnn.learnt_embeddings import EmbeddingShards, learnt_types, uses_sharded_embeddings
from components.gnn.link_labels import training_edges
from components.gnn.link_task import LinkTask
from components.gnn.metrics import all_sum
from components.gnn.model import HomogeneousGCN, HomogeneousSAGE
from components.gnn.node_task import NodeTask
from components.gnn.propagation import PropagationEncoder
from components.gnn.sampling import RPC_THREADS, SamplingSetup
from components.gnn.shared_memory import check_at_worker_start
from components.partition.output import STEP as PARTITION_STEP
from components.partition.output import StoredPartition
from components.runtime import watchdog
from components.runtime.allocator import reuse_freed_memory
from components.runtime.collectives import all_max_int, gather_to_rank_zero
from components.runtime.launcher import WorkerContext, launch_staged, publishes_here
from components.runtime.threads import ThreadPlan, Work, use_worker_threads
from components.train import attempts, bundle, checkpoint, curves, health
from components.train.embeddings import TrainedEmbeddings
from components.train.full_graph import full_graph_setup
from components.train.optimizer import dense_optimizer
from components.train.output import HISTORY_FILE, METRICS_FILE, MODEL_FILE, SPEC_FILE, STEP, VALIDATION_METRIC
from components.train.resume import epoch_start, restore_task_random_state, resumed_state, task_loaders

log = logging.getLogger("gnnflow.train")


@dataclass(frozen=True)
class TrainJob:
    input: str  # a published partition output
    output: str
    generation: str
    config: GnnflowConfig


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _sampled_setup(
    ctx: WorkerContext, part: StoredPartition, config: GnnflowConfig, edge_dir: str, placement: Placement, threads: ThreadPlan
):
    """(task, model, the DDP module an epoch trains, what to call once training is over) for
    sampled mini-batches: the partition as a GLT dataset, RPC to the peers, the loaders."""
    import graphlearn_torch as glt

    schema = part.metadata.schema
    link = schema.task_type == "link_prediction"
    shards = EmbeddingShards.initial(part, config, ctx.world_size) if uses_sharded_embeddings(config) and learnt_types(part) else None
    if shards is not None:
        shards.install(part)  # the rows are the featureless types' features: batches carry them
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="gnnflow-train")
    ctx.init_rpc(num_rpc_threads=RPC_THREADS)
    whole = fetch_whole_tables(part, config.training.feature_cache_ratio, ctx.rank, ctx.world_size, ctx.local_world_size)
    dataset = to_dist_dataset(
        part, edge_filter=training_edges(part, schema, ctx.world_size) if link else None, placement=placement, whole=whole
    )
    if shards is not None:
        shards.register()
    setup = SamplingSetup.of(ctx, config, schema, edge_dir, placement, threads.sampling_workers)
    task = LinkTask(setup, dataset, part, config, shards) if link else NodeTask(setup, dataset, part, node_splits(part), config, shards)
    part.edges.clear()  # GLT holds its own adjacency now: keep one copy of the partition's topology, not two
    _seed_everything(config.training.seed)
    model = build_model(schema, config, edge_dir).to(placement.device)  # initialised on the CPU: the same weights anywhere
    # Typed encoders leave parameters unused in a batch (an edge type or node type it lacks).
    ddp = DistributedDataParallel(
        model,
        device_ids=placement.ddp_device_ids,
        find_unused_parameters=not isinstance(model.encoder, (HomogeneousSAGE, HomogeneousGCN, PropagationEncoder)),
    )

    def stop() -> None:
        glt.distributed.barrier()
        glt.distributed.shutdown_rpc()

    return task, model, ddp, stop


def _agreement(
    config: GnnflowConfig,
    state: checkpoint.TrainingState,
    start: EpochStart,
    epoch_rng: dict,
    task,
    model,
    optimizer,
    output: storage.Uri,
    embeddings: TrainedEmbeddings | None,
    rank: int,
) -> BatchAgreement:
    """The epoch's stop-and-checkpoint agreement: every rank snapshots itself (and writes its own
    shard of the learnt embeddings, before the gather that lets rank 0 write the state)."""

    def snapshot() -> dict:
        batches = start.skip + agreement.batches
        tag = checkpoint.shards_tag(state, batches) if embeddings is not None else ""
        if embeddings is not None:
            with watchdog.phase("writing"):
                embeddings.checkpoint(output, tag, rank)
        return {
            "model": model.state_dict(),  # pickled (gathered or saved) before training goes on
            "optimizer": optimizer.state_dict(),
            "batches": batches,
            "epoch_rng": epoch_rng,
            "sums": task.epoch_sums(),
            "embeddings_tag": tag,
        } | random_state(task_loaders(task))

    def write(snapshots: list[dict], stopping: bool) -> None:
        began = time.perf_counter()
        saved = dataclasses.replace(state, ranks=snapshots, mid_epoch=True, embeddings_tag="")
        with watchdog.phase("writing"):
            checkpoint.save(saved, output)
            if embeddings is not None:
                checkpoint.drop_other_shards(output, keep={s["embeddings_tag"] for s in snapshots})
        kind = "SIGTERM" if stopping else "periodic"
        log.info("%s: checkpoint at %s written in %.2f s", kind, checkpoint.position(saved), time.perf_counter() - began)

    training = config.training
    agreement = BatchAgreement(training.checkpoint_every_batches, training.checkpoint_every_seconds, snapshot, write)
    return agreement


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on some rank (collective)."""
    return bool(all_sum(torch.tensor([int(flag)])))


def _largest_peak_memory_mib() -> int:
    """The largest peak resident memory of any worker process so far, in MiB (collective): what a
    replica must hold per worker, watched epoch by epoch (its own sampling processes not counted)."""
    return all_max_int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)  # ru_maxrss: KiB on Linux


def _preempted(ctx: WorkerContext, epoch: int, batches: int, output: storage.Uri) -> interruption.Preempted:
    """What every rank returns when they stopped on SIGTERM: the step ends with it (exit 75)."""
    where = f"batch {batches} of epoch {epoch + 1}" if batches else f"the end of epoch {epoch}"
    if ctx.rank == 0:
        log.warning("train: stopped on SIGTERM at %s; a rerun resumes from there", where)
    return interruption.Preempted(
        f"train was stopped by SIGTERM (preemption) at {where}; its checkpoint is under {output.join('_checkpoints')}: "
        f"run the step again to resume (exit code {interruption.PREEMPTED_EXIT_CODE})"
    )


def _train_epochs(
    ctx: WorkerContext,
    config: GnnflowConfig,
    task_type: str,
    task,
    model: torch.nn.Module,
    ddp: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: checkpoint.TrainingState,
    output: storage.Uri,
    live: curves.LiveCurves | None,
    embeddings: TrainedEmbeddings | None,
) -> interruption.Preempted | None:
    """Trains epochs from ``state`` on, checkpointing each (and, on rank 0, writing the curves to
    ``live``), until the last, early stopping, or a SIGTERM (then returns what the step ends with)."""
    metric = VALIDATION_METRIC[task_type]
    patience = config.training.early_stopping_patience
    stopped_early = patience is not None and state.epochs_without_improvement >= patience  # a resumed run that had stopped
    # A checkpoint that holds this rank's random state continues its streams (a resumed run draws
    # what an uninterrupted one did); an older one, or none, seeds them.
    if state.mid_epoch or not restore_task_random_state(task, checkpoint.for_rank(state, ctx.rank)):
        _seed_everything(config.training.seed + 1000 * state.next_epoch + ctx.rank)
    for epoch in range(state.next_epoch, 0 if stopped_early else config.training.epochs):
        start = epoch_start(state, ctx.rank)
        epoch_rng = start.epoch_rng or interruption.rng_states()  # what this epoch's seed order is drawn from
        state.mid_epoch = False
        sampled = config.training.mode == "sampled"
        agreement = _agreement(config, state, start, epoch_rng, task, model, optimizer, output, embeddings, ctx.rank) if sampled else None
        result = task.train_epoch(ddp, optimizer, show_progress=ctx.rank == 0, agreement=agreement, start=start)
        if agreement is not None and agreement.stopped:
            return _preempted(ctx, epoch, start.skip + agreement.batches, output)
        val = task.evaluate(model, "val")
        slowest = torch.tensor([result.seconds])
        with watchdog.phase("all-reduce"):
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            peak_memory_mib = _largest_peak_memory_mib()
        seconds = float(slowest)
        line = {
            "epoch": epoch,
            "loss": round(result.loss, 6),
            **{f"train_{k}": v for k, v in result.train.items() if k != "count"},
            **{f"val_{k}": v for k, v in val.items() if k != "count"},
            "seconds": round(seconds, 3),
            "batches_per_s": round(result.batches / seconds, 2) if seconds else 0.0,
            "remote_fraction": round(result.remote_fraction, 4),
            "peak_memory_mib": peak_memory_mib,
        } | (embeddings.epoch_figures() if embeddings is not None else {})
        state.history.append(line)
        state.wall_times.append(time.time())
        health.count_epochs_at_chance(state, result.loss, result.chance_loss, math.ceil(result.batches / ctx.world_size))
        improved = val[metric] > state.best_metric
        if improved:
            state.best_metric, state.best_epoch, state.epochs_without_improvement = val[metric], epoch, 0
            state.best_model = copy.deepcopy(model.state_dict())
            if embeddings is not None:
                embeddings.improved()
        else:
            state.epochs_without_improvement += 1
        state.next_epoch = epoch + 1
        state.model = model.state_dict()
        if embeddings is not None:  # each rank's own shard, written before the gather lets rank 0 write the state
            state.embeddings_tag = checkpoint.shards_tag(state)
            with watchdog.phase("writing"):
                embeddings.checkpoint(output, state.embeddings_tag, ctx.rank)
        state.ranks = gather_to_rank_zero({"optimizer": optimizer.state_dict()} | random_state(task_loaders(task)))
        if live is not None:
            with watchdog.phase("writing"):
                checkpoint.save(state, output)
                if embeddings is not None:
                    checkpoint.drop_other_shards(output, keep={state.embeddings_tag})
                live.update(state.history, state.wall_times)
            train_part = f", train {metric} {result.train[metric]:.4f}" if metric in result.train else ""
            remote = "edges read from other workers" if config.training.mode == "full_graph" else "sampled nodes remote"
            log.info(
                "epoch %d/%d: loss %.4f%s, val %s %.4f%s in %.1fs (%d batches, %s %.1f%%, peak memory %.2f GiB on the largest worker)",
                epoch + 1,
                config.training.epochs,
                result.loss,
                train_part,
                metric,
                val[metric],
                " *" if improved else "",
                seconds,
                result.batches,
                remote,
                100 * result.remote_fraction,
                line["peak_memory_mib"] / 1024,
            )
        limit = config.training.stop_at_chance_epochs
        health.check_learning(state.epochs_at_chance, state.steps_at_chance, result.loss, result.chance_loss, limit, task_type)
        # Nobody starts the next epoch before the checkpoint of this one exists; a SIGTERM that came
        # during evaluation stops every rank here, the checkpoint being this epoch's.
        if _any_rank(interruption.stop_requested()):
            return _preempted(ctx, epoch + 1, 0, output)
        if patience is not None and state.epochs_without_improvement >= patience:
            if ctx.rank == 0:
                log.info("early stopping: no better validation %s for %d epochs", metric, patience)
            break
    return None


def train_worker(ctx: WorkerContext, job: TrainJob) -> dict | interruption.Preempted | None:
    """One trainer; returns the final metrics on rank 0, None elsewhere, or on every rank, when
    stopped by SIGTERM, the :class:`~components.gnn.interruption.Preempted` the step raises."""
    config = job.config
    interruption.stop_on_sigterm()  # from here on, SIGTERM stops training at a batch boundary, with a checkpoint
    if config.training.mode == "sampled":  # before the rendezvous: no peer has placed anything in /dev/shm yet
        check_at_worker_start(ctx, job.input, config, step="train", loaders=3)  # train, val and test loaders
    placement = worker_placement(config.training, ctx)
    ctx.init_process_group(backend=placement.backend)
    training = config.training
    # A lone trainer samples its own batches between steps and serves no peer: its whole share computes.
    alone = training.sampling == "collocated" and ctx.world_size == 1
    work: Work = "compute" if training.mode == "full_graph" or alone else training.sampling
    threads = use_worker_threads(config.resources.threads, ctx.local_world_size, ctx.rank, work, training.sampling_workers)
    watchdog.mark("loading")
    partitions = storage.open_published(job.input, step=PARTITION_STEP)
    part = read_for_worker(partitions, ctx.rank, sampled=config.training.mode == "sampled", placement=placement)
    schema = part.metadata.schema
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    if config.training.mode == "full_graph":
        task, model, ddp, stop = full_graph_setup(ctx, part, config, edge_dir, _seed_everything)
    else:
        task, model, ddp, stop = _sampled_setup(ctx, part, config, edge_dir, placement, threads)
    if config.resources.reuse_freed_memory:
        reuse_freed_memory()  # after loading: the batches' blocks are what gets reused
    optimizer = dense_optimizer(model, config.training)
    output = storage.parse_uri(job.output)
    task_embeddings = getattr(task, "embeddings", None)
    embeddings = TrainedEmbeddings(task_embeddings) if task_embeddings is not None else None
    state = resumed_state(ctx, config, output, partitions.manifest.generation, model, optimizer, embeddings)
    live = curves.LiveCurves(output.join(job.generation), state.curves_name, state.started) if ctx.rank == 0 else None
    preempted = _train_epochs(ctx, config, schema.task_type, task, model, ddp, optimizer, state, output, live, embeddings)
    if preempted is not None:
        # The checkpoint exists on every rank's word: no orderly shutdown of loaders and RPC (a
        # Spot VM's 30 s are short); the launcher ends the sampling processes and frees their memory.
        return preempted
    model.load_state_dict(state.best_model or model.state_dict())
    if embeddings is not None:
        embeddings.restore_best()
    final: dict[str, float] = {"best_epoch": state.best_epoch, "epochs_run": state.next_epoch}
    final |= {f"val_{k}": v for k, v in task.evaluate(model, "val").items()}
    if config.training.evaluate_test:  # off in tuning trials: selection must never see the test split
        final |= {f"test_{k}": v for k, v in task.evaluate(model, "test").items()}
    task.shutdown()
    stop()
    watchdog.mark("publishing")
    shard_entries = embeddings.stage(output, job.generation, STEP) if embeddings is not None else {}
    shard_entries |= bundle.stage_learnt_ids(partitions, ctx.rank, learnt_types(part), output, job.generation, STEP)
    shard_entries_by_rank = gather_to_rank_zero(shard_entries)  # also: every shard is written before rank 0 returns
    if live is not None:
        staging = storage.OutputStaging(output, STEP, generation=job.generation)
        buffer = io.BytesIO()
        torch.save(placement.to_host(model.state_dict()), buffer)
        staging.write_bytes(MODEL_FILE, buffer.getvalue())
        staging.write_json(SPEC_FILE, bundle.model_spec(schema, edge_dir, config.model))
        staging.write_bytes(HISTORY_FILE, "".join(json.dumps(line) + "\n" for line in state.history).encode())
        curves.stage_curves(staging, live, state.history, state.wall_times)
        staging.write_json(METRICS_FILE, final)
        staging.write_bytes("config.resolved.yaml", config.to_yaml().encode())
        result_entries = dict(staging.entries)
        for entries in shard_entries_by_rank:
            result_entries |= entries
    dist.barrier()
    return {"metrics": final, "entries": result_entries} if ctx.rank == 0 else None


def train(config: GnnflowConfig, input_uri: storage.Uri | str, output: storage.Uri | str) -> storage.PublishedOutput | None:
    """Runs the step; returns the published model (None on cluster replicas other than the first)."""
    output = storage.parse_uri(output)
    # Fail here, before any worker starts: the partitions, and the preprocess run the model carries the transforms of.
    trained_from = bundle.trace_lineage(storage.open_published(input_uri, step=PARTITION_STEP))
    check_device(config.training)
    attempts.refuse_a_looping_retry(output)
    staging = storage.OutputStaging(output, STEP)
    world_size = config.resources.world_size
    job = TrainJob(str(storage.parse_uri(input_uri)), str(output), staging.generation, config)
    log.info("train: %s → %s, %d worker(s), %s", input_uri, output, world_size, config.task.type)
    start = time.perf_counter()
    records_attempts = publishes_here()  # one writer of the failure record
    point = attempts.resume_point(output)
    try:
        result = launch_staged(
            staging,
            train_worker,
            (job,),
            world_size=world_size,
            processes_per_replica=config.resources.processes_per_replica,
            timeouts=config.resources.worker_timeouts,
        )
    except interruption.Preempted:
        raise  # not a failure: the rerun resumes
    except Exception as error:
        if records_attempts:
            attempts.record_failure(output, point, error)
        raise
    if not isinstance(result, dict):  # a cluster replica that does not publish (launch_staged raised a Preempted)
        return None
    staging.add_entries(result["entries"])
    bundle.stage_lineage(staging, trained_from)
    metrics = result["metrics"]
    lineage = {"source": str(input_uri), "source_generation": trained_from.partitions_generation, "preprocessed": trained_from.preprocessed}
    published = staging.publish(counts={"epochs": metrics["epochs_run"]}, metadata={**lineage, "metrics": metrics})
    attempts.clear(output)
    log.info(
        "train: published %s in %.1fs: %s",
        output,
        time.perf_counter() - start,
        ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()),
    )
    return published
