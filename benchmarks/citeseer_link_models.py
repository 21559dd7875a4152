"""Link prediction on CiteSeer, homogeneous (papers only) and heterogeneous (papers and words,
tests/hetero_citeseer.py), with every model type, 2 workers, the same 85/5/10 split of the
citations; prints markdown: infer's test ROC-AUC, MRR and hits@10 (each test citation ranked
against 100 seeded random papers) and train's epochs and seconds per epoch.

The training recipe is the one of tests/test_link_hetero.py (hidden 64, dropout 0.1, MLP decoder,
lr 0.005, up to 60 epochs, early stopping after 20), for every row.

    python benchmarks/citeseer_link_models.py [--models graphsage,gat,rgcn]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def homogeneous(raw: dict) -> dict:
    """The heterogeneous config without words: papers and citations only."""
    graph = raw["graph"]
    return {**raw, "graph": {"nodes": graph["nodes"][:1], "edges": graph["edges"][:1]},
            "training": {**raw["training"], "fan_outs": [10, 10]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="graphsage,gat,rgcn")
    args = parser.parse_args()

    from components import storage
    from components.config import GnnflowConfig
    from components.infer.step import infer
    from components.partition.step import partition
    from components.preprocess.step import preprocess
    from components.serialize.step import serialize
    from components.train.step import train
    from tests.hetero_citeseer import hetero_link_config, write_hetero_citeseer

    logging.basicConfig(level=logging.WARNING)
    root = storage.parse_uri(tempfile.mkdtemp(prefix="gnnflow-citeseer-link-"))
    tables = write_hetero_citeseer(Path(root.path) / "tables")
    rows = []
    for graph in ("homogeneous", "heterogeneous"):
        for model_type in args.models.split(","):
            raw = hetero_link_config(tables, model={"type": model_type, "dropout": 0.1})
            config = GnnflowConfig.model_validate(homogeneous(raw) if graph == "homogeneous" else raw)
            base = root.join(graph)
            if not Path(base.join("parts").path).exists():
                preprocess(config, base.join("pre"))
                serialize(config, base.join("pre"), base.join("tfr"))
                partition(base.join("tfr"), base.join("parts"), config.partition, world_size=2)
            start = time.perf_counter()
            model = train(config, base.join("parts"), base.join(f"model-{model_type}"))
            seconds = time.perf_counter() - start
            history = [json.loads(line) for line in model.read_bytes("metrics.jsonl").decode().splitlines()]
            metrics = infer(config, base.join("parts"), model.root, base.join(f"emb-{model_type}")).read_json("metrics.json")
            rows.append((graph, model_type, metrics, len(history), sum(h["seconds"] for h in history) / len(history), seconds))
            print(json.dumps(rows[-1][:3]), flush=True)
    print(f"\nCiteSeer link prediction, 2 workers; {platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print("| graph | model | test ROC-AUC | test MRR | hits@10 | epochs | s/epoch | train step (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for graph, model_type, m, epochs, per_epoch, seconds in rows:
        print(f"| {graph} | {model_type} | {m['test_roc_auc']:.3f} | {m['test_mrr']:.3f} | {m['test_hits@10']:.3f} | {epochs} | "
              f"{per_epoch:.1f} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
