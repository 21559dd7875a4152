"""Sharded against replicated learnt embeddings (``model.learnt_embeddings``) at 1M+ featureless
nodes, 2 and 4 workers: per-worker embedding memory, bytes communicated per step, trainer RSS.

    .venv/bin/python benchmarks/sharded_embeddings.py [--users 1000000] [--items 50000] [--workers 2 4] [--out DIR]

The graph: featureless users and items only (every node a learnt embedding row), users buy
items (``buys``, 2 per user, undirected: the message edges) and a ``likes`` positive_label table
of 40,000 user-item pairs that supervises (so an epoch is a few dozen steps, whatever the node
count). Each step runs as its own process (preprocess, serialize and partition once per worker
count); train runs 1 epoch, batch 1024, fan-outs [10, 5], once per mode and worker count.

Per run:
- **embedding MiB per worker**: sharded, from the step's history (the largest worker's rows and
  sparse-optimizer state); replicated, the whole table as DDP trains it: the parameter, its dense
  gradient and Adam's two moments (4 x nodes x hidden x 4 bytes).
- **sent per step and worker**: sharded, the gradient rows (ids and values) sent to their owners
  (history), plus the rows of remote nodes fetched with the subgraphs (remote sampled nodes x
  hidden x 4 bytes); replicated, the dense gradient each worker hands DDP's all-reduce every step
  (nodes x hidden x 4 bytes; a ring all-reduce sends 2 (P-1)/P of it); its rows are read locally.
- **trainer peak RSS**, the largest worker process (as benchmarks/scale_probe.py samples it).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import psutil
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.scale_probe import run_step  # noqa: E402

HIDDEN = 64
LABEL_PAIRS = 40_000


def write_graph(folder: pathlib.Path, users: int, items: int, seed: int = 0) -> dict:
    """Writes the tables; returns the raw config's graph and task sections."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    communities = 16
    user_c, item_c = rng.integers(communities, size=users), rng.integers(communities, size=items)
    order = np.argsort(item_c, kind="stable")
    starts = np.searchsorted(item_c[order], np.arange(communities))
    sizes = np.bincount(item_c, minlength=communities)

    def draws(who: np.ndarray) -> np.ndarray:  # an item of the user's community, 90% of the time
        own = order[starts[user_c[who]] + rng.integers(0, np.maximum(sizes[user_c[who]], 1))]
        return np.where(rng.random(len(who)) < 0.9, own, rng.integers(items, size=len(who)))

    buyers = np.repeat(np.arange(users), 2)
    likers = rng.integers(users, size=LABEL_PAIRS)
    ids = {"u": np.char.add("u", np.arange(users).astype(str)), "i": np.char.add("i", np.arange(items).astype(str))}
    pd.DataFrame({"user_id": ids["u"]}).to_csv(folder / "users.csv.gz", index=False)
    pd.DataFrame({"item_id": ids["i"]}).to_csv(folder / "items.csv.gz", index=False)
    pd.DataFrame({"user": ids["u"][buyers], "item": ids["i"][draws(buyers)]}).drop_duplicates().to_csv(folder / "buys.csv.gz", index=False)
    pd.DataFrame({"user": ids["u"][likers], "item": ids["i"][draws(likers)]}).drop_duplicates().to_csv(folder / "likes.csv.gz", index=False)
    edge = {"src_column": "user", "dst_column": "item", "src_type": "user", "dst_type": "item"}
    return {
        "graph": {
            "nodes": [
                {"type": "user", "uri": str(folder / "users.csv.gz"), "id_column": "user_id"},
                {"type": "item", "uri": str(folder / "items.csv.gz"), "id_column": "item_id"},
            ],
            "edges": [
                {"type": "buys", "uri": str(folder / "buys.csv.gz"), **edge},
                {"type": "likes", "uri": str(folder / "likes.csv.gz"), **edge, "role": "positive_label", "undirected": False},
            ],
        },
        "task": {"type": "link_prediction", "target": "buys", "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 1}},
    }


def _graph_of(work: pathlib.Path) -> dict:
    """The graph and task sections of an earlier run's config in ``work``."""
    raw = yaml.safe_load((work / "config.yaml").read_text())
    return {"graph": raw["graph"], "task": raw["task"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}")
    nodes = args.users + args.items
    table_mib = nodes * HIDDEN * 4 / 2**20
    print(f"{args.users:,} users + {args.items:,} items = {nodes:,} learnt rows of {HIDDEN} floats ({table_mib:,.0f} MiB as one table)")
    print("| workers | embeddings | steps | epoch s | embedding MiB per worker | gradient MiB sent per step and worker "
          "| remote rows MiB fetched per step and worker | trainer peak RSS GiB | val ROC-AUC |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    with tempfile.TemporaryDirectory(prefix="gnnflow-shards-") as scratch:
        work = pathlib.Path(args.out or scratch)
        raw = write_graph(work / "tables", args.users, args.items) if not (work / "tfr").exists() else _graph_of(work)
        raw |= {
            "model": {"hidden_channels": HIDDEN},
            "training": {"epochs": 1, "batch_size": 1024, "eval_batch_size": 4096, "fan_outs": [10, 5], "stop_at_chance_epochs": None},
            "serialize": {"num_shards": 4},
        }
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(raw))
        if not (work / "tfr").exists():  # a work folder of an earlier run (--out) keeps its tables and steps
            run_step(["components.preprocess", "--config", str(config), "--output", str(work / "pre")])
            run_step(["components.serialize", "--config", str(config), "--input", str(work / "pre"), "--output", str(work / "tfr")])
        for workers in args.workers:
            parts = work / f"parts-{workers}"
            if not parts.exists():
                run_step(["components.partition", "--config", str(config), "--input", str(work / "tfr"), "--output", str(parts),
                          "--world-size", str(workers)])
            for mode in ("replicated", "sharded"):
                raw["model"]["learnt_embeddings"] = mode
                config.write_text(yaml.safe_dump(raw))
                model = work / f"model-{mode}-{workers}"
                log = work / f"train-{mode}-{workers}.log"
                shutil.rmtree(model, ignore_errors=True)  # a model of an earlier run would be resumed, not trained
                measured = run_step(["components.train", "--config", str(config), "--input", str(parts), "--output", str(model),
                                     "--world-size", str(workers)], log)
                line = json.loads(next(model.glob("gen-*/metrics.jsonl")).read_text().splitlines()[-1])
                steps = round(line["batches_per_s"] * line["seconds"])
                per_worker_steps = steps / workers
                if mode == "sharded":
                    memory = line["embedding_mib_per_worker"]
                    sent = line["embedding_grad_mib_sent"] / workers / per_worker_steps
                    remote_text = re.findall(r"sampled nodes remote ([\d.]+)%", log.read_text())
                    fetched = line["embedding_rows_mib_fetched"] / workers / per_worker_steps
                else:
                    memory, sent, fetched = 4 * table_mib, table_mib, 0.0
                    remote_text = []
                row = {"workers": workers, "mode": mode, "steps": steps, "epoch_s": line["seconds"], "embedding_mib": memory,
                       "sent_mib_per_step": sent, "fetched_mib_per_step": fetched, "trainer_peak_gib": measured["worker_gib"],
                       "val_roc_auc": line["val_roc_auc"], "remote": remote_text[-1] if remote_text else ""}
                results.append(row)
                print(f"| {workers} | {mode} | {steps} | {line['seconds']:.1f} | {memory:,.1f} | {sent:,.2f} | {fetched:,.2f} | "
                      f"{measured['worker_gib']:.2f} | {line['val_roc_auc']:.3f} |", flush=True)
    for mode in ("replicated", "sharded"):
        by = {r["workers"]: r for r in results if r["mode"] == mode}
        if len(by) >= 2:
            low, high = min(by), max(by)
            memory = by[high]["embedding_mib"] / by[low]["embedding_mib"]
            peak = by[high]["trainer_peak_gib"] / by[low]["trainer_peak_gib"]
            print(f"{mode}: {high} vs {low} workers: embedding memory per worker {memory:.0%}, trainer peak RSS {peak:.0%}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
