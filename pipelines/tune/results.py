"""What ``gnnflow tune`` publishes under ``DIR``.

The result is a published output like any step's (``DIR/manifest.json``, step ``tune``, naming a
generation folder that holds every file)::

    trials.csv          trial, each parameter, the validation metric (the mean of --repeats seeds), the
                        metric per seed, epochs_run, seconds, state, error
    best_config.yaml    the config with the best trial's parameters: gnnflow run --config accepts it
                        (a trial's conditional parameters it did not search are the config's own)
    trials.png          the metric of every trial and the best so far (640 × 400)
    tuning.html         the plot, the best trial, the space and the trials table in one page
    study.json          the same figures, for scripts

Once the manifest is written, ``DIR/trials.csv``, ``DIR/trials.png``, ``DIR/tuning.html`` and
``DIR/best_config.yaml`` (last) are written as copies at the top of ``DIR``, the paths users and
scripts are promised; a failed study touches none of them.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from components import storage
from components.report.page import data_uri
from pipelines.tune.records import TrialRecord, TuneResult
from pipelines.tune.space import encode

STEP = "tune"
TRIALS_CSV, BEST_CONFIG, PLOT, PAGE, STUDY_JSON = "trials.csv", "best_config.yaml", "trials.png", "tuning.html", "study.json"
TOP_LEVEL = (TRIALS_CSV, PLOT, PAGE, BEST_CONFIG)  # copied to DIR in this order: the config last


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return encode(value)


def trials_csv(result: TuneResult) -> str:
    keys = result.space.keys
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["trial", *keys, result.metric, f"{result.metric}_per_seed", "epochs_run", "seconds", "state", "error"])
    for t in result.trials:
        per_seed = " ".join(_cell(m) for m in t.seed_metrics)
        metrics = [_cell(t.metric), per_seed, _cell(t.epochs_run)]
        writer.writerow([t.number, *(_cell(t.params.get(k)) for k in keys), *metrics, f"{t.seconds:.1f}", t.state, t.error])
    return buffer.getvalue()


def best_config_yaml(result: TuneResult) -> str:
    best = result.best
    lines = [
        f"# gnnflow tune: the best of {len(result.trials)} trial(s) by {result.metric} (validation):",
        f"# trial {best.number}, {best.metric:.4f}, with",
        *(f"#   {key}: {encode(value)}" for key, value in best.params.items()),
        "# Run it with: gnnflow run --config best_config.yaml",
    ]
    if result.best_config.training.mode == "full_graph":  # its validation figure came from whole-graph propagation
        lines.append("# It trains full-graph, validated over the whole graph: infer it the same way with --infer-mode exact")
    return "\n".join(lines) + "\n" + result.best_config.to_yaml()


def plot_trials(trials: list[TrialRecord], metric: str) -> bytes:
    """The metric per trial (dots; failed trials as crosses on the axis) and the best so far (a step line)."""
    figure = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    done = sorted((t.number, t.metric) for t in trials if t.metric is not None)
    axes.plot([n for n, _ in done], [v for _, v in done], "o", color="tab:blue", label=f"{metric} of a trial")
    best, xs, ys = -math.inf, [], []
    for number, value in done:
        best = max(best, value)
        xs.append(number)
        ys.append(best)
    axes.step(xs, ys, where="post", color="tab:orange", label="best so far")
    failed = [t.number for t in trials if t.metric is None]
    if failed:
        bottom = min((v for _, v in done), default=0.0)
        axes.plot(failed, [bottom] * len(failed), "x", color="tab:red", label="failed trial")
    axes.set_xlabel("trial")
    axes.set_ylabel(f"{metric} (validation)")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def page(result: TuneResult, png: bytes) -> str:
    best = result.best
    params = "".join(f"<li><code>{html.escape(k)}</code>: {html.escape(encode(v))}</li>" for k, v in best.params.items())
    space = "".join(f"<li>{html.escape(p.describe())}</li>" for p in result.space.params)
    headers = ["trial", *result.space.keys, result.metric, "epochs_run", "seconds", "state", "error"]
    rows = list(csv.reader(io.StringIO(trials_csv(result))))[1:]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gnnflow tune: {html.escape(result.metric)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:2px 6px}}</style>
</head><body>
<h1>Hyperparameter tuning</h1>
<p>{len(result.trials)} trial(s), {sum(t.state == "COMPLETE" for t in result.trials)} complete; maximised {html.escape(result.metric)}
on the validation split. Best: trial {best.number}, {best.metric:.4f} ({best.epochs_run} epochs).
Its config: <code>{BEST_CONFIG}</code>.</p>
<ul>{params}</ul>
<figure><img src="{data_uri(png)}" alt="{html.escape(result.metric)} per trial and the best so far"><figcaption>{PLOT}</figcaption></figure>
<h2>Search space ({html.escape(result.space.source)})</h2><ul>{space}</ul>
<h2>Trials</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
</body></html>
"""


def study_json(result: TuneResult) -> dict[str, Any]:
    return {
        "metric": result.metric,
        "space": result.space.source,
        "best_trial": result.best.number,
        "best_value": result.best.metric,
        "best_params": result.best.params,
        "trials": [
            {"number": t.number, "params": t.params, "value": t.metric, "epochs_run": t.epochs_run, "seconds": t.seconds, "state": t.state}
            | {"seed_values": list(t.seed_metrics)}
            | ({"error": t.error} if t.error else {})
            for t in result.trials
        ],
    }


def publish(result: TuneResult) -> storage.PublishedOutput:
    """Stages every file, publishes them (manifest last), then writes the top-level copies."""
    png = plot_trials(result.trials, result.metric)
    contents = {
        TRIALS_CSV: trials_csv(result).encode(),
        BEST_CONFIG: best_config_yaml(result).encode(),
        PLOT: png,
        PAGE: page(result, png).encode(),
        STUDY_JSON: json.dumps(study_json(result), indent=2, sort_keys=True).encode(),
    }
    with storage.staged_output(result.output, STEP) as staging:
        for name, data in contents.items():
            staging.write_bytes(name, data)
        complete = sum(t.state == "COMPLETE" for t in result.trials)
        published = staging.publish(
            counts={"trials": len(result.trials), "complete": complete},
            metadata={"metric": result.metric, "best_trial": result.best.number, "best_value": result.best.metric},
        )
    for name in TOP_LEVEL:
        storage.write_bytes(result.output.join(name), contents[name])
    return published
