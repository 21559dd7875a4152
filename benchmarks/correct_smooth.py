"""Correct & Smooth in infer (``infer.smoothing: correct_and_smooth``, its defaults) on CiteSeer,
standard split, 2 workers: validation and test accuracy before and after smoothing, the alphas
chosen, and what it costs beside the train step.

    .venv/bin/python benchmarks/correct_smooth.py [--seeds 0 1 2] [--configs default proposal]
        [--modes sampled exact] [--selections validation fixed]

  validation  infer.alpha_selection validation (the default): the model's own predictions or a
              pair of components/infer/alpha_grid.py, chosen on the validation split
  fixed       the configured alphas (InferSpec's defaults, the paper's ogbn-arxiv setting)

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
import os
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


def chosen(metrics: dict) -> str:
    """The selected candidate, short: none, or correction/smoothing alpha."""
    selected = metrics["smoothing_selected"]
    return "none" if selected == "none" else f"{selected['correction_alpha']:g}/{selected['smoothing_alpha']:g}"


def run(name: str, seed: int, root: pathlib.Path, modes: list[str], selections: list[str]) -> list[dict]:
    config = with_sections(CONFIGS[name](), training={"seed": seed})
    base = storage.parse_uri(root / f"{name}-{seed}")
    preprocess(config, base.join("pre"))
    serialize(config, base.join("pre"), base.join("tfr"))
    parts = partition(base.join("tfr"), base.join("parts"), config.partition, world_size=2).root
    start = time.perf_counter()
    model = train(config, parts, base.join("model"))
    train_seconds = time.perf_counter() - start
    rows = []
    for mode in modes:
        for selection in selections:
            start = time.perf_counter()
            smoothing = SMOOTHING | {"alpha_selection": selection}
            published = infer(with_sections(config, infer=smoothing), parts, model.root, base.join(f"infer-{mode}-{selection}"), mode=mode)
            metrics = published.read_json("metrics.json")
            row = {
                "config": name,
                "seed": seed,
                "mode": mode,
                "selection": selection,
                "train_seconds": round(train_seconds, 2),
                "infer_seconds": round(time.perf_counter() - start, 2),
                "chosen": chosen(metrics),
                **{
                    k: metrics[k] for k in ("val_accuracy_base", "val_accuracy", "test_accuracy_base", "test_accuracy", "smoothing_seconds")
                },
                "candidates": {chosen({"smoothing_selected": c["candidate"]}): c["val_accuracy"] for c in metrics["smoothing_candidates"]},
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["default"])
    parser.add_argument("--modes", nargs="+", choices=["sampled", "exact"], default=["sampled", "exact"])
    parser.add_argument("--selections", nargs="+", choices=["validation", "fixed"], default=["validation"])
    args = parser.parse_args()
    configure(logging.WARNING)
    print(f"# {platform.node()}, python {platform.python_version()}, seeds {args.seeds}, load average {os.getloadavg()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="correct_smooth_") as tmp:
        for name in args.configs:
            for seed in args.seeds:
                rows += run(name, seed, pathlib.Path(tmp), args.modes, args.selections)
    print(f"\n# load average at the end {os.getloadavg()}")
    print("\n| config | mode | alphas | val base | val C&S | test base | test C&S | chosen per seed | smoothing s | train s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.configs:
        for mode in args.modes:
            for selection in args.selections:
                picked = [r for r in rows if r["config"] == name and r["mode"] == mode and r["selection"] == selection]

                def mean(key: str, picked: list[dict] = picked) -> float:
                    return statistics.mean(r[key] for r in picked)

                print(
                    f"| {name} | {mode} | {selection} | {mean('val_accuracy_base'):.4f} | {mean('val_accuracy'):.4f} | "
                    f"{mean('test_accuracy_base'):.4f} | {mean('test_accuracy'):.4f} | {', '.join(r['chosen'] for r in picked)} | "
                    f"{mean('smoothing_seconds'):.2f} | {mean('train_seconds'):.1f} | "
                    f"{mean('smoothing_seconds') / mean('train_seconds'):.3f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
