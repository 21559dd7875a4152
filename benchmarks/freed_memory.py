"""What reusing freed memory (``resources.reuse_freed_memory``) and ``index_select`` give a batch's
feature gather and a GraphSAGE layer, on one thread.

    .venv/bin/python benchmarks/freed_memory.py [--repeats 20]

Shapes of an arxiv-sized [15, 10] batch of 1,024 seeds: a 169,343 x 128 float32 feature table, 89,000
rows gathered; the first layer's 150,000 edges from those rows into 16,000 targets (mean of the
sources: gather + scatter, as PyG's SAGEConv does it), forward alone and forward + backward. Each
setup runs in its own process: glibc's defaults (``plain``) and after
``components.runtime.allocator.reuse_freed_memory`` (``reuse``). Prints milliseconds per call and the
ratio reuse / plain.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys, time
import torch
if sys.argv[1] == "reuse":
    from components.runtime.allocator import reuse_freed_memory
    assert reuse_freed_memory()
torch.set_num_threads(1)
repeats = int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
table = torch.randn(169_343, 128, generator=gen)
rows = torch.randint(0, 169_343, (89_000,), generator=gen)
src = torch.randint(0, 89_000, (150_000,), generator=gen)
dst = torch.sort(torch.randint(0, 16_000, (150_000,), generator=gen)).values
h = table[:89_000].clone().requires_grad_()

def timed(step):
    step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1000

def layer(backward):
    out = torch.zeros(16_000, 128).index_add_(0, dst, h.index_select(0, src))
    if backward:
        out.sum().backward()

print(json.dumps({
    "gather, advanced indexing (GLT's)": timed(lambda: table[rows]),
    "gather, index_select": timed(lambda: torch.index_select(table, 0, rows)),
    "layer forward (gather + scatter)": timed(lambda: layer(False)),
    "layer forward + backward": timed(lambda: layer(True)),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    results = {}
    for mode in ("plain", "reuse"):
        done = subprocess.run([sys.executable, "-c", PROBE, mode, str(args.repeats)], capture_output=True, text=True, env=env, check=True)
        results[mode] = json.loads(done.stdout)
    print(f"load average {os.getloadavg()[0]:.2f}; one thread; ms per call over {args.repeats} calls\n")
    print("| call | glibc defaults (ms) | freed memory reused (ms) | reused / defaults |\n|---|---:|---:|---:|")
    for name, plain in results["plain"].items():
        reuse = results["reuse"][name]
        print(f"| {name} | {plain:.1f} | {reuse:.1f} | {reuse / plain:.2f}x |")


if __name__ == "__main__":
    main()
