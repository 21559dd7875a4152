"""Correct & Smooth in infer (``infer.smoothing: correct_and_smooth``, its defaults) on CiteSeer,
standard split, 2 workers: validation and test accuracy before and after smoothing, and what it
costs beside the train step.

    .venv/bin/python benchmarks/correct_smooth.py [--seeds 0 1 2] [--configs default proposal]

  default   the default config over the CiteSeer tables (GraphSAGE, 2 layers, fan-outs [15, 10])
  proposal  what `gnnflow init-config` proposes for them (benchmarks/citeseer_acceptance.py)

Per seed: train once (wall seconds of the train step), then infer with smoothing in sampled and
exact mode (the metrics hold both accuracies and ``smoothing_seconds``, the slowest worker's time
for building the ring over the citations, both propagations and nothing else). Prints one JSON
line per run and a table of means.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.citeseer_acceptance import CITESEER, sampled_config  # noqa: E402
from components import storage  # noqa: E402
from components.config import GnnflowConfig  # noqa: E402
from components.infer.step import infer  # noqa: E402
from components.partition.step import partition  # noqa: E402
from components.preprocess.step import preprocess  # noqa: E402
from components.runtime.runlog import configure  # noqa: E402
from components.serialize.step import serialize  # noqa: E402
from components.train.step import train  # noqa: E402

SMOOTHING = {"smoothing": "correct_and_smooth"}


def default_config() -> GnnflowConfig:
    paper = {"type": "paper", "uri": str(CITESEER / "nodes.csv.gz"), "label_column": "label", "split_column": "split"}
    return GnnflowConfig.model_validate(
        {
            "graph": {
                "nodes": [paper | {"features": [{"columns": ["f*"]}]}],
                "edges": [{"type": "cites", "uri": str(CITESEER / "edges.csv.gz"), "src_type": "paper", "dst_type": "paper"}],
            },
            "resources": {"world_size": 2},
        }
    )


CONFIGS = {"default": default_config, "proposal": sampled_config}


def with_sections(config: GnnflowConfig, **sections: dict) -> GnnflowConfig:
    raw = config.model_dump(mode="json")
    for name, values in sections.items():
        raw[name] = {**raw[name], **values}
    return GnnflowConfig.model_validate(raw)


def run(name: str, seed: int, root: pathlib.Path) -> list[dict]:
    config = with_sections(CONFIGS[name](), training={"seed": seed})
    base = storage.parse_uri(root / f"{name}-{seed}")
    preprocess(config, base.join("pre"))
    serialize(config, base.join("pre"), base.join("tfr"))
    parts = partition(base.join("tfr"), base.join("parts"), config.partition, world_size=2).root
    start = time.perf_counter()
    model = train(config, parts, base.join("model"))
    train_seconds = time.perf_counter() - start
    rows = []
    for mode in ("sampled", "exact"):
        start = time.perf_counter()
        published = infer(with_sections(config, infer=SMOOTHING), parts, model.root, base.join(f"infer-{mode}"), mode=mode)
        metrics = published.read_json("metrics.json")
        row = {
            "config": name,
            "seed": seed,
            "mode": mode,
            "train_seconds": round(train_seconds, 2),
            "infer_seconds": round(time.perf_counter() - start, 2),
            **{k: metrics[k] for k in ("val_accuracy_base", "val_accuracy", "test_accuracy_base", "test_accuracy", "smoothing_seconds")},
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["default"])
    args = parser.parse_args()
    configure(logging.WARNING)
    print(f"# {platform.node()}, python {platform.python_version()}, seeds {args.seeds}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="correct_smooth_") as tmp:
        for name in args.configs:
            for seed in args.seeds:
                rows += run(name, seed, pathlib.Path(tmp))
    print("\n| config | mode | val base | val C&S | test base | test C&S | smoothing s | train s | smoothing / train |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.configs:
        for mode in ("sampled", "exact"):
            chosen = [r for r in rows if r["config"] == name and r["mode"] == mode]

            def mean(key: str, chosen: list[dict] = chosen) -> float:
                return statistics.mean(r[key] for r in chosen)

            print(
                f"| {name} | {mode} | {mean('val_accuracy_base'):.4f} | {mean('val_accuracy'):.4f} | {mean('test_accuracy_base'):.4f} | "
                f"{mean('test_accuracy'):.4f} | {mean('smoothing_seconds'):.2f} | {mean('train_seconds'):.1f} | "
                f"{mean('smoothing_seconds') / mean('train_seconds'):.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
