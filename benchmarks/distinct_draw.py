"""The one-hop draw without replacement (components/gnn/distinct_sampling.py) against GLT 0.2.4's
own CPU draw (with replacement) on the same CSR, one thread: milliseconds per call.

    .venv/bin/python benchmarks/distinct_draw.py [--nodes 169343] [--repeats 20]

The CSR has ogbn-arxiv's node count and heavy-tailed degrees (2 x Pareto(1.7) draws, capped at
10,000; mean about 8.7); the calls are a sampled batch's two hops with fan-outs [15, 10]: 1,024
seeds drawing 15 neighbours, then 14,000 seeds drawing 10. Both draws get the same seeds.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from components.gnn.distinct_sampling import draw_distinct  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=169_343)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import graphlearn_torch as glt

    torch.manual_seed(0)
    torch.set_num_threads(1)
    degree = torch.distributions.Pareto(torch.tensor(2.0), torch.tensor(1.7)).sample((args.nodes,)).long().clamp(max=5000) * 2
    indptr = torch.zeros(args.nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(degree, 0)
    indices = torch.randint(args.nodes, (int(indptr[-1]),))
    rows = torch.repeat_interleave(torch.arange(args.nodes), degree)
    graph = glt.data.Graph(glt.data.Topology(torch.stack([rows, indices]), layout="CSR"), mode="CPU")
    glt_sampler = glt.sampler.NeighborSampler(graph, [15, 10], device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    print(f"{platform.node()}, {os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}; "
          f"{args.nodes:,} nodes, mean degree {degree.double().mean():.1f}, one thread")
    print("| call | distinct (ms) | GLT with replacement (ms) | distinct / GLT |")
    print("|---|---:|---:|---:|")
    total = {"distinct": 0.0, "glt": 0.0}
    for count, k in ((1024, 15), (14_000, 10)):
        seeds = torch.randint(args.nodes, (count,))
        draws = {
            "distinct": lambda seeds=seeds, k=k: draw_distinct(indptr, seeds, k, generator),
            "glt": lambda seeds=seeds, k=k: glt_sampler.sample_one_hop(seeds, k),
        }
        ms = {}
        for name, draw in draws.items():
            draw()  # warm-up
            began = time.perf_counter()
            for _ in range(args.repeats):
                draw()
            ms[name] = (time.perf_counter() - began) / args.repeats * 1000
            total[name] += ms[name]
        print(f"| {count:,} seeds, k {k} | {ms['distinct']:.2f} | {ms['glt']:.2f} | {ms['distinct'] / ms['glt']:.2f}x |")
    print(f"| a batch's two hops | {total['distinct']:.2f} | {total['glt']:.2f} | {total['distinct'] / total['glt']:.2f}x |")


if __name__ == "__main__":
    main()
