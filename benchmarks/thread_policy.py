"""What the thread policy (components/runtime/threads.py) gives a replica: training steps per
second of W workers side by side, each with the intra-op threads the policy gives it, against
the rule it replaced (one thread per trainer wherever GLT samples in the trainer process).

    python benchmarks/thread_policy.py [--cores N] [--workers 1 2 4] [--steps 20]

Each worker is a process that trains a 2-layer GraphSAGE (PyG SAGEConv, 128 wide) on batches
the size of a sampled mini-batch (1,024 seeds, fan-outs [15, 10]: 40,000 nodes with 128
features, 160,000 edges), forward, backward and Adam step; all workers start together and the
figure is the workers' steps over the slowest one's seconds. Only torch and PyG are needed (no
GLT, no gnnflow config), so it also runs where the stack is not installed: it measures the
computation the threads are for; GLT's sampling, which the policy leaves a core for
(collocated) or gives subprocesses (multiprocess), is not in it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from components.runtime.threads import plan_threads, replica_cores  # noqa: E402

NODES, EDGES, FEATURES, HIDDEN, SEEDS, CLASSES = 40_000, 160_000, 128, 128, 1024, 40


def _worker(threads: int, steps: int, start, results) -> None:
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv

    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NODES, FEATURES, generator=generator)
    edge_index = torch.randint(NODES, (2, EDGES), generator=generator)
    y = torch.randint(CLASSES, (SEEDS,), generator=generator)
    convs = torch.nn.ModuleList([SAGEConv(FEATURES, HIDDEN), SAGEConv(HIDDEN, CLASSES)])
    optimizer = torch.optim.Adam(convs.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        h = F.relu(convs[0](x, edge_index))
        loss = F.cross_entropy(convs[1](h, edge_index)[:SEEDS], y)
        loss.backward()
        optimizer.step()

    for _ in range(3):  # warm-up
        step()
    start.wait()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    results.put(time.perf_counter() - began)


def measure(workers: int, threads: int, steps: int) -> float:
    """Steps per second of ``workers`` processes with ``threads`` intra-op threads each."""
    context = mp.get_context("spawn")
    start, results = context.Barrier(workers), context.Queue()
    processes = [context.Process(target=_worker, args=(threads, steps, start, results)) for _ in range(workers)]
    for process in processes:
        process.start()
    seconds = [results.get() for _ in processes]
    for process in processes:
        process.join()
    return workers * steps / max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=int, default=replica_cores(), help="cores the plan splits (default: this machine's)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"{platform.node()}, {platform.machine()}, {os.cpu_count()} cpus, plan for {args.cores} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}")
    print("| workers | threads each: old rule | policy | whole share | steps/s: old rule | policy | whole share | policy / old |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for workers in args.workers:
        # Collocated sampling (the default): the old rule gave every trainer one thread.
        new = plan_threads(args.cores, workers, "collocated").compute
        share = max(1, args.cores // workers)  # what oversubscribing by GLT's RPC thread would take
        rates = {threads: measure(workers, threads, args.steps) for threads in sorted({1, new, share})}
        rows.append({"workers": workers, "old_threads": 1, "policy_threads": new, "share": share,
                     "steps_per_s": {str(t): r for t, r in rates.items()}})
        print(f"| {workers} | 1 | {new} | {share} | {rates[1]:.2f} | {rates[new]:.2f} | {rates[share]:.2f} | "
              f"{rates[new] / rates[1]:.2f}x |", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
