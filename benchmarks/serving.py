"""`gnnflow serve` under load on loopback: new-node latency and throughput against batch infer, and the server's memory.

    .venv/bin/python benchmarks/serving.py [--out DIR] [--requests 3000] [--seconds 20] [--concurrency 1 4 16 64]
        [--large-nodes 4000000] [--profile] [--server-args --max-wait-ms 2]

The run it serves is benchmarks/pipeline_end_to_end.py's ogbn-arxiv-sized demo (169,343 nodes,
1,166,243 undirected edges, 128 features, 40 classes), 2 workers, 2 epochs, ``infer --mode exact``,
built once under --out (benchmarks/serving_run.py; a rerun reuses it). ``gnnflow serve --run``
starts as a real subprocess on 127.0.0.1 and a bounded aiohttp load generator (in this process,
on the same 2 cores) sends single NEW-node requests: the raw columns of a seeded sample of the
table's rows, with up to 5 of that row's own neighbours as ``"out"`` edges. For each in-flight
concurrency it sends --requests requests (after 100 unmeasured ones), or stops at --seconds,
and records p50/p95/p99 latency, nodes/s, the error rate and the load average. The server's
RSS (RssAnon / RssFile) is read from /proc once it is healthy and after the sweep.

Batch infer's nodes/s on the same graph: the run's ``infer --mode exact`` step, and the same
model's ``--mode sampled`` infer (a subgraph per seed, as serving draws), each as nodes / the
step's seconds and nodes / the slowest worker's compute seconds from infer's own log line.
The served ÷ batch ratios use the best sweep level's nodes/s.

--large-nodes (default 4,000,000) also serves a graph that large (benchmarks/serving_large.py: the
arxiv model over a bigger demo graph, preprocessed with its fitted transforms and partitioned, as
``gnnflow run --from-model`` does; built once under --out, about 4 minutes here) at
--large-concurrency, for its memory and speed; 0 skips it.

--profile adds an in-process breakdown of one new-node request (the same Predictor, parse and
serialisation functions the server runs; cProfile for the predictor's parts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time

import aiohttp
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.serving_large import build_large  # noqa: E402
from benchmarks.serving_profile import profile_request  # noqa: E402
from benchmarks.serving_run import build_run  # noqa: E402
from components.runtime.runlog import configure  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
WARMUP = 100
MAX_EDGES = 5


def _read(path: pathlib.Path) -> pa.Table:
    return pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path, convert_options=_AS_TEXT)


_AS_TEXT = pacsv.ConvertOptions(column_types={"node_id": pa.string(), "src": pa.string(), "dst": pa.string(), "venue": pa.string(),
                                              "label": pa.string()})  # fmt: skip


def new_node_bodies(nodes_path: pathlib.Path, edges_path: pathlib.Path, count: int, seed: int = 3) -> list[bytes]:
    """``count`` request bodies, each one new node: a sampled row's raw columns and up to
    MAX_EDGES of its neighbours (2 random nodes for a row without any)."""
    table = _read(nodes_path)
    rng = np.random.default_rng(seed)
    rows = table.take(pa.array(np.sort(rng.choice(table.num_rows, count, replace=False)))).to_pandas()
    ids = table.column("node_id")
    chosen = pa.array(rows["node_id"].tolist(), pa.string())
    edges = _read(edges_path)
    neighbours: dict[str, list[str]] = {}
    for own, other in (("src", "dst"), ("dst", "src")):
        near = edges.filter(pc.is_in(edges.column(own), value_set=chosen)).select([own, other]).to_pydict()
        for a, b in zip(near[own], near[other]):
            neighbours.setdefault(a, []).append(b)
    columns = [c for c in rows.columns if c not in ("node_id", "label")]
    bodies = []
    for record in rows.to_dict("records"):
        features = {c: (None if isinstance(record[c], float) and np.isnan(record[c]) else record[c]) for c in columns}
        features = {c: (v.item() if isinstance(v, np.generic) else v) for c, v in features.items()}
        near = neighbours.get(record["node_id"]) or [ids[int(j)].as_py() for j in rng.choice(len(ids), 2, replace=False)]
        instance = {"features": features, "edges": [{"node_id": str(n), "direction": "out"} for n in near[:MAX_EDGES]]}
        bodies.append(json.dumps({"instances": [instance]}).encode())
    return bodies


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon, RssFile of a process, in MiB (/proc/PID/status)."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {name: int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "RssAnon", "RssFile")}


class Server:
    """``gnnflow serve`` with ``sources`` (``--run ROOT``, or ``--model M --partitions P``) as a
    subprocess on a free loopback port; its log goes to a file."""

    def __init__(self, sources: list[str], cache: pathlib.Path, log_file: pathlib.Path, extra: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "pipelines.cli", "serve", *sources, "--port", str(self.port), "--cache-dir", str(cache), *extra]
        self._log = open(log_file, "w")  # noqa: SIM115 - closed in stop
        self.process = subprocess.Popen(command, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.process.pid

    async def wait_healthy(self, timeout_s: float = 300) -> float:
        start = time.perf_counter()
        async with aiohttp.ClientSession() as session:
            while time.perf_counter() - start < timeout_s:
                if self.process.poll() is not None:
                    raise SystemExit(f"the server exited with status {self.process.returncode}: see {self._log.name}")
                try:
                    async with session.get(f"{self.url}/health") as answer:
                        if answer.status == 200:
                            return time.perf_counter() - start
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise SystemExit(f"the server was not healthy within {timeout_s:.0f} s: see {self._log.name}")

    def stop(self) -> int:
        self.process.terminate()
        code = self.process.wait(60)
        self._log.close()
        return code


async def sweep_level(url: str, bodies: list[bytes], concurrency: int, requests: int, seconds: float) -> dict:
    """``requests`` POSTs (after WARMUP unmeasured ones), ``concurrency`` in flight, stopping at ``seconds``."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        latencies: list[float] = []
        errors = 0
        counter = iter(range(10**9))

        async def one(body: bytes, record: bool) -> None:
            nonlocal errors
            start = time.perf_counter()
            try:
                async with session.post(f"{url}/predict", data=body) as answer:
                    await answer.read()
                    ok = answer.status == 200
            except aiohttp.ClientError:
                ok = False
            if record:
                latencies.append(time.perf_counter() - start)
                errors += not ok

        async def worker(total: int, deadline: float, record: bool) -> None:
            while True:
                n = next(counter)
                if n >= total or time.perf_counter() > deadline:
                    return
                await one(bodies[n % len(bodies)], record)

        await asyncio.gather(*(worker(WARMUP, time.perf_counter() + seconds, False) for _ in range(concurrency)))
        counter = iter(range(10**9))
        cpu = psutil.Process().cpu_times()
        start = time.perf_counter()
        await asyncio.gather(*(worker(requests, start + seconds, True) for _ in range(concurrency)))
        wall = time.perf_counter() - start
        client_cpu = sum(psutil.Process().cpu_times()[:2]) - sum(cpu[:2])
    ms = np.array(latencies) * 1000
    return {"concurrency": concurrency, "requests": len(latencies), "seconds": wall, "nodes_per_s": len(latencies) / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)), "p99_ms": float(np.percentile(ms, 99)),
            "error_rate": errors / max(1, len(latencies)), "client_cpu_share": client_cpu / wall,
            "load": os.getloadavg()[0]}  # fmt: skip


async def measure(
    args: argparse.Namespace, sources: list[str], bodies: list[bytes], work: pathlib.Path, name: str, levels: list[int]
) -> dict:
    server = Server(sources, work / "serve-cache", work / f"serve-{name}.log", args.server_args)
    try:
        ready_s = await server.wait_healthy()
        loaded = memory(server.pid)
        results = []
        for concurrency in levels:
            cpu0 = sum(psutil.Process(server.pid).cpu_times()[:2])
            level = await sweep_level(server.url, bodies, concurrency, args.requests, args.seconds)
            level["server_cpu_share"] = (sum(psutil.Process(server.pid).cpu_times()[:2]) - cpu0) / level["seconds"]
            results.append(level)
            print(f"{name}, concurrency {concurrency}: {level['nodes_per_s']:,.0f} nodes/s, p99 {level['p99_ms']:.1f} ms", flush=True)
        after = memory(server.pid)
    finally:
        code = server.stop()
    return {"ready_s": ready_s, "memory_loaded": loaded, "memory_after": after, "levels": results, "exit_status": code}


def print_levels(levels: list[dict]) -> None:
    print("| concurrency | requests | p50 ms | p95 ms | p99 ms | nodes/s | errors | server CPU | client CPU | load 1 min |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for lv in levels:
        print(f"| {lv['concurrency']} | {lv['requests']:,} | {lv['p50_ms']:.1f} | {lv['p95_ms']:.1f} | {lv['p99_ms']:.1f} | "
              f"{lv['nodes_per_s']:,.0f} | {lv['error_rate']:.2%} | {lv['server_cpu_share']:.0%} | {lv['client_cpu_share']:.0%} | "
              f"{lv['load']:.2f} |")  # fmt: skip


def rounded(levels: list[dict]) -> list[dict]:
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in lv.items()} for lv in levels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/gnnflow-bench-serving", help="work folder; the demo run is cached here")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3000, help="measured requests per concurrency level")
    parser.add_argument("--seconds", type=float, default=20.0, help="at most this long per level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--bodies", type=int, default=2000, help="distinct new nodes (requests cycle through them)")
    parser.add_argument("--large-nodes", type=int, default=4_000_000, help="also serve a graph this large (0: skip)")
    parser.add_argument("--large-degree", type=float, default=8.0, help="its average degree")
    parser.add_argument("--large-concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--profile", action="store_true", help="also break one new-node request down in-process")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="passed on to gnnflow serve (last)")
    args = parser.parse_args()
    configure(logging.INFO)
    work = pathlib.Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    run = build_run(work, args.workers, args.epochs)
    large = build_large(work, args.large_nodes, args.large_degree, args.workers, args.epochs) if args.large_nodes else None
    bodies = new_node_bodies(work / "tables" / "nodes.csv.gz", work / "tables" / "edges.csv.gz", args.bodies)
    load_before = os.getloadavg()
    result = asyncio.run(measure(args, ["--run", str(work / "run")], bodies, work, "arxiv", args.concurrency))
    large_result = None
    if large is not None:
        large_bodies = new_node_bodies(pathlib.Path(large["nodes_table"]), pathlib.Path(large["edges_table"]), args.bodies)
        sources = ["--model", large["model"], "--partitions", large["partitions"]]
        large_result = asyncio.run(measure(args, sources, large_bodies, work, f"{args.large_nodes}-nodes", args.large_concurrency))
    breakdown = profile_request(work / "run", work / "serve-cache", bodies) if args.profile else None

    nodes = run["infer_nodes"]
    batch = {
        "exact_step": nodes / run["seconds"]["infer"],
        "exact_compute": nodes / max(run["infer_compute_s"], 1e-9),
        "sampled_step": nodes / run["sampled_infer_s"],
        "sampled_compute": nodes / max(run["sampled_infer_compute_s"], 1e-9),
    }
    best = max(level["nodes_per_s"] for level in result["levels"])
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; load average before {' / '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"run: {nodes:,} nodes, {args.workers} workers, {args.epochs} epochs, test accuracy {run['test_accuracy']:.4f}; "
          f"{len(bodies)} distinct new nodes, single-node requests")  # fmt: skip
    print_levels(result["levels"])
    print(
        "| batch infer (2 workers, all nodes) | step s | nodes/s | served ÷ batch | slowest worker's compute s | nodes/s | served ÷ batch |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, step_s, compute_s in (("exact", run["seconds"]["infer"], run["infer_compute_s"]),
                                    ("sampled", run["sampled_infer_s"], run["sampled_infer_compute_s"])):  # fmt: skip
        step, compute = batch[f"{mode}_step"], batch[f"{mode}_compute"]
        print(f"| {mode} | {step_s:.1f} | {step:,.0f} | {best / step:.0%} | {compute_s:.1f} | {compute:,.0f} | {best / compute:.0%} |")
    print(f"served nodes/s: {best:,.0f} (the best concurrency level)")
    print("| server | healthy after s | RSS loaded (anon / file) MiB | RSS after the load (anon / file) MiB |\n|---|---:|---:|---:|")
    for name, r in (("arxiv", result), (f"{args.large_nodes:,} nodes", large_result)):
        if r is not None:
            m, a = r["memory_loaded"], r["memory_after"]
            print(f"| {name} | {r['ready_s']:.1f} | {m['VmRSS']:.0f} ({m['RssAnon']:.0f} / {m['RssFile']:.0f}) | "
                  f"{a['VmRSS']:.0f} ({a['RssAnon']:.0f} / {a['RssFile']:.0f}) |")  # fmt: skip
    if large is not None and large_result is not None:
        print(f"{args.large_nodes:,}-node graph ({large['edges']:,} undirected edges; built in "
              f"{', '.join(f'{k} {v:.0f} s' for k, v in large['seconds'].items())}), the arxiv model, no --embeddings:")  # fmt: skip
        print_levels(large_result["levels"])
    if breakdown:
        print("| part of one new-node request (in-process) | ms |\n|---|---:|")
        for name, value in breakdown.items():
            print(f"| {name} | {value:.2f} |")
    print(json.dumps({"levels": rounded(result["levels"]), "batch_nodes_per_s": {k: round(v) for k, v in batch.items()},
                      "served_over_batch": {k: round(best / v, 3) for k, v in batch.items()},
                      "memory_mib": {"loaded": result["memory_loaded"], "after": result["memory_after"]},
                      "large": large_result and {"nodes": args.large_nodes, "levels": rounded(large_result["levels"]),
                                                 "memory_mib": {k: large_result[f"memory_{k}"] for k in ("loaded", "after")}},
                      "breakdown_ms": breakdown, "load_before": load_before,
                      "exit_status": [r["exit_status"] for r in (result, large_result) if r]}))  # fmt: skip


if __name__ == "__main__":
    main()
