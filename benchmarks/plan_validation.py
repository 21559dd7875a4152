"""The sizing model (``gnnflow plan``) against measured peaks: predicted vs measured peak RSS per
worker for partition and train (and infer with ``--infer``), with the error in percent.

    .venv/bin/python benchmarks/plan_validation.py --nodes 1000000 4000000 8000000 --workers 2 4 --out DIR
    .venv/bin/python benchmarks/plan_validation.py --out DIR --probe-output probe.txt   # a probe already run

It runs ``benchmarks/scale_probe.py --out DIR`` (the demo graph; partition and train as their own
processes, peak RSS sampled every 0.2 s), then predicts each row from the probe's own config and
preprocessed output (exact counts and widths) with the model's constants as they are in the
repository. ``--infer`` also runs ``components.infer`` on each probe's partitions and model,
measured the same way. Target: every memory error within 20%.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.scale_probe import run_step  # noqa: E402
from components.config import load_config  # noqa: E402
from pipelines.sizing_report import plan_replicas, read_graph_size  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def probe_rows(args: argparse.Namespace) -> list[dict]:
    """The probe's JSON rows: read from ``--probe-output`` (its stdout) or from a new run."""
    if args.probe_output:
        text = pathlib.Path(args.probe_output).read_text()
    else:
        command = [sys.executable, "benchmarks/scale_probe.py", "--nodes", *map(str, args.nodes), "--workers", *map(str, args.workers)]
        text = subprocess.run([*command, "--out", args.out], cwd=REPO, check=True, capture_output=True, text=True).stdout
        print(text.rsplit("\n[", 1)[0], flush=True)  # the probe's own table
    return json.loads("[" + text.rsplit("\n[", 1)[1])


def infer_rows(out: pathlib.Path, rows: list[dict]) -> list[dict]:
    """components.infer on each probe's partitions and model, peak RSS per worker measured alike."""
    measured = []
    for row in rows:
        if row["step"] != "train":
            continue
        folder, workers = out / f"n{row['nodes']}", row["workers"]
        model = next(folder.glob(f"model-hash-{workers}-*"))
        result = run_step(
            [
                "components.infer",
                "--config",
                str(folder / "config.yaml"),
                "--partitions",
                str(folder / f"parts-hash-{workers}"),
                "--model",
                str(model),
                "--output",
                str(folder / f"emb-{workers}"),
                "--world-size",
                str(workers),
            ]
        )
        measured.append({"nodes": row["nodes"], "step": "infer", "workers": workers, **result})
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--out", required=True, help="the probe's work folder (kept: the model reads its config and preprocessed output)")
    parser.add_argument("--probe-output", help="stdout of a scale_probe.py run with --out OUT, instead of running it")
    parser.add_argument("--infer", action="store_true", help="also run and predict infer")
    args = parser.parse_args()
    rows = [r for r in probe_rows(args) if r["step"] in ("partition", "train")]
    if args.infer:
        rows += infer_rows(pathlib.Path(args.out), rows)
    print("| nodes | step | workers | predicted peak (GiB) | measured peak (GiB) | error |")
    print("|---:|---|---:|---:|---:|---:|")
    worst = 0.0
    for row in rows:
        folder = pathlib.Path(args.out) / f"n{row['nodes']}"
        config = load_config(str(folder / "config.yaml"))
        plan = plan_replicas(read_graph_size(config, str(folder / "pre")), config, row["workers"])
        predicted = plan.steps[row["step"]].peak_rss_mib_per_worker / 1024
        error = predicted / row["worker_gib"] - 1
        worst = max(worst, abs(error))
        print(
            f"| {row['nodes']:,} | {row['step']} | {row['workers']} | {predicted:.2f} | {row['worker_gib']:.2f} | {error:+.1%} |",
            flush=True,
        )
    print(f"largest memory error: {worst:.1%} (target: 20%)")


if __name__ == "__main__":
    main()
