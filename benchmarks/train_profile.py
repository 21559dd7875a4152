"""Where a training epoch's time goes, per rank: `python benchmarks/train_throughput.py --profile 2`.

A worker that mirrors `components.train.step.train_worker` up to the training loop, then times
(a) a sampling-only pass (collect_features False), (b) a sampling pass with features, (c)
forward + backward + step on cached batches, (d) one full training epoch as the train step runs
it; rank 0's cProfile of (d) is printed (top functions by own time).
"""

from __future__ import annotations

import time


def profile_worker(ctx, partitions_uri: str, config, collect_batches: int, num_rpc_threads: int) -> dict:
    """One rank of the profile run; returns its timings and (rank 0) its cProfile text."""
    import cProfile
    import io
    import pstats

    import graphlearn_torch as glt
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from components import storage
    from components.gnn.build import build_model
    from components.gnn.node_task import NodeTask
    from components.gnn.sampling import SamplingSetup
    from components.gnn.glt_dataset import node_splits, to_dist_dataset
    from components.partition.output import STEP as PARTITION_STEP
    from components.partition.output import read_partition

    ctx.init_process_group()
    torch.set_num_threads(1)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    part = read_partition(storage.open_published(partitions_uri, step=PARTITION_STEP), ctx.rank)
    schema = part.metadata.schema
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    dataset = to_dist_dataset(part)
    timings["load_partition_s"] = time.perf_counter() - start
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="gnnflow-bench")
    ctx.init_rpc(num_rpc_threads=num_rpc_threads)
    setup = SamplingSetup.of(ctx, config, schema, edge_dir)
    task = NodeTask(setup, dataset, part, node_splits(part), config)
    torch.manual_seed(0)
    model = build_model(schema, config, edge_dir)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    loader = task.loaders["train"]
    barrier = torch.distributed.barrier

    # (a) sampling alone, without features (a loader of its own, same seeds and options).
    bare = glt.distributed.DistNeighborLoader(
        dataset, config.training.fan_outs, node_splits(part).train["paper"], batch_size=config.training.batch_size,
        shuffle=True, collect_features=False, edge_dir=edge_dir, random_seed=ctx.rank, worker_options=setup.worker_options(),
    )
    barrier()
    start = time.perf_counter()
    nodes_sampled, n_bare = 0, 0
    for batch in bare:
        nodes_sampled += batch.node.numel()
        n_bare += 1
    timings["sample_no_features_s"] = time.perf_counter() - start
    bare.shutdown()
    # (b) sampling with features (the train loader itself); keep a few batches for (c).
    barrier()
    start = time.perf_counter()
    cached, n_feat = [], 0
    for batch in loader:
        n_feat += 1
        if len(cached) < collect_batches:
            cached.append(batch)
    timings["sample_with_features_s"] = time.perf_counter() - start
    # (c) forward + backward + step on cached batches, no sampling.
    barrier()
    model.train()
    start = time.perf_counter()
    for batch in cached:
        optimizer.zero_grad()
        logits = ddp(batch)[: batch.batch_size]  # the train step's forward (layer-trimmed)
        loss = F.cross_entropy(logits, batch.y.reshape(-1)[: batch.batch_size])
        loss.backward()
        optimizer.step()
    timings["compute_per_batch_s"] = (time.perf_counter() - start) / max(len(cached), 1)
    # (d) a full training epoch as the train step runs it, under cProfile.
    barrier()
    profiler = cProfile.Profile()
    profiler.enable()
    result = task.train_epoch(ddp, optimizer, show_progress=False)
    profiler.disable()
    timings["train_epoch_s"] = result.seconds
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(18)
    barrier()
    task.shutdown()
    glt.distributed.barrier()
    glt.distributed.shutdown_rpc()
    return {"rank": ctx.rank, "seeds": task.seed_counts["train"], "batches_bare": n_bare, "batches": n_feat,
            "mean_nodes_per_batch": nodes_sampled / max(n_bare, 1), "local_nodes": len(part.nodes["paper"]["node_id"]),
            **timings, "profile": stream.getvalue()}


def print_profile(world_size: int, num_rpc_threads: int, load: tuple[float, float], results: list[dict]) -> None:
    """Markdown: one row per rank, then rank 0's cProfile."""
    print(f"### profile: {world_size} worker(s), num_rpc_threads {num_rpc_threads}, load {load[0]:.2f} -> {load[1]:.2f}\n")
    print("| rank | train seeds | local nodes | nodes/batch | sampling alone, no features | sampling + features | "
          "compute (fwd+bwd+step) per batch | full epoch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rank']} | {r['seeds']:,} | {r['local_nodes']:,} | {r['mean_nodes_per_batch']:,.0f} | "
              f"{r['sample_no_features_s']:.1f} s ({r['batches_bare'] / r['sample_no_features_s']:.2f} b/s) | "
              f"{r['sample_with_features_s']:.1f} s ({r['batches'] / r['sample_with_features_s']:.2f} b/s) | "
              f"{r['compute_per_batch_s'] * 1000:.0f} ms | {r['train_epoch_s']:.1f} s |")
    print("\nrank 0 cProfile of the full epoch (main thread):\n\n```\n" + results[0]["profile"].strip() + "\n```\n", flush=True)
