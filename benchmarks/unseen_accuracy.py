"""Issue 40 item 4: gnnflow against full-batch PyG on graphs development never tuned on, in one run.

    .venv/bin/python benchmarks/unseen_accuracy.py --out /work/scratch/measure40/run.json
        [--graphs citeseer demo few_labels weak_homophily] [--seeds 0 1 2] [--methods gcn gat appnp sampled ...]
        [--trials 12] [--work FOLDER]

Graphs: those of benchmarks/init_config_constants.py (imported, not copied): citeseer (its
standard split, 120 training labels), demo, few_labels (20 training labels a class, planted) and
weak_homophily (homophily 0.5). Every gnnflow row starts from the config `gnnflow init-config`
proposes for the graph's tables (propose_config, as the CLI calls it; whatever it proposes today)
on 2 workers (resources.world_size 2), and runs through the real steps: preprocess, serialize and
partition once per graph, then train and infer per seed.

Methods (rows):
  gcn, gat, appnp  full-batch PyG, each with its paper's hyperparameters (benchmarks/full_batch_baselines.py
                   says which and from where), on the nodes, undirected edges, features and split of the
                   graph's preprocess output: the tables gnnflow trains on
  sampled          the proposal with training.mode sampled; infer --mode sampled
  sampled_cs       the same model, infer with infer.smoothing correct_and_smooth (its default steps and
                   alphas, or infer.alpha_selection validation where the config has that field)
  full_graph       the proposal with training.mode full_graph (what init-config proposes for these
                   graphs since issue 40); infer --mode exact
  full_graph_cs    the same model, exact inference with Correct & Smooth
  tuned            a study as `gnnflow tune` runs it (pipelines/tune: the default space of the proposal,
                   trial 0 the proposal, seeded TPE, trials trained with training.evaluate_test false and
                   scored by their best epoch's validation accuracy), --trials N on seed 0, once per graph;
                   its best config then trains on every seed and infers (exact when it chose full_graph)
  tuned_cs         the tuned model, inferred with Correct & Smooth (an extra row: one more infer)

Validation accuracy: train's metrics (the best validation epoch, which selects the model), except in
the *_cs rows, where it is infer's after smoothing (the choice of alphas, where made, is on
validation). Test accuracy: infer's metrics, read once per model. Train seconds: the wall clock of
step train (gnnflow: workers' start included) or of the PyG training loop; smoothing seconds:
infer's ``smoothing_seconds`` (the slowest worker's). The tuned rows' train seconds are those of the
best config's training; the study's own cost is printed beside the table.

Resumable: every finished cell (graph, method, seed) and study is written to --out at once; a rerun
skips them when the proposal (and, for *_cs, the infer section) is what it was; a PyG cell, when the
proposal's data sections (all but model, training and infer) and the baseline's code are. Models and data live
under --work (default: beside --out), in a folder named for the proposal's digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.full_batch_baselines import RECIPES, Graph, load_preprocessed, train_and_test, version  # noqa: E402
from benchmarks.init_config_constants import GRAPHS  # noqa: E402
from components import storage  # noqa: E402
from components.config import GnnflowConfig, apply_overrides  # noqa: E402
from components.config.inference import InferSpec  # noqa: E402
from components.errors import GnnflowError  # noqa: E402
from components.infer.step import infer  # noqa: E402
from components.runtime.runlog import configure  # noqa: E402
from components.tables.proposal import propose_config  # noqa: E402
from components.train.step import train  # noqa: E402
from pipelines.local_run import RunOutputs, run_steps  # noqa: E402
from pipelines.tune.space import default_space, holding_config  # noqa: E402
from pipelines.tune.study import DATA_STEPS, TuneOptions, run_study  # noqa: E402

PYG = list(RECIPES)
GNNFLOW = ["sampled", "sampled_cs", "full_graph", "full_graph_cs", "tuned", "tuned_cs"]
METHODS = PYG + GNNFLOW
LABELS = {
    "gcn": "PyG GCN (full batch)",
    "gat": "PyG GAT (full batch)",
    "appnp": "PyG APPNP (full batch)",
    "sampled": "gnnflow sampled (the proposal, mode sampled)",
    "sampled_cs": "gnnflow sampled + C&S",
    "full_graph": "gnnflow full-graph (the proposal)",
    "full_graph_cs": "gnnflow full-graph + C&S",
    "tuned": "gnnflow tuned best",
    "tuned_cs": "gnnflow tuned best + C&S",
}


def smoothing_overrides() -> dict[str, object]:
    """Correct & Smooth with its defaults; alphas chosen on validation once the config can say so."""
    overrides: dict[str, object] = {"infer.smoothing": "correct_and_smooth"}
    if "alpha_selection" in InferSpec.model_fields:
        overrides["infer.alpha_selection"] = "validation"
    return overrides


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Results:
    """The --out JSON: finished cells, models and studies, rewritten (atomically) after each."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.data: dict = json.loads(path.read_text()) if path.exists() else {}
        for key in ("cells", "models", "studies", "graphs"):
            self.data.setdefault(key, {})

    def get(self, section: str, key: str, basis: str) -> dict | None:
        found = self.data[section].get(key)
        return found if found is not None and found.get("basis") == basis else None

    def put(self, section: str, key: str, basis: str, value: dict) -> dict:
        self.data[section][key] = {**value, "basis": basis}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_suffix(".tmp")
        staging.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(staging, self.path)
        return self.data[section][key]


class GraphRun:
    """One graph: its proposal, data steps, and the cells of each method and seed."""

    def __init__(self, name: str, work: pathlib.Path, results: Results, trials: int) -> None:
        self.name, self.results, self.trials = name, results, trials
        nodes, edges, split = GRAPHS[name](work / name / "tables")
        proposed = propose_config(
            nodes, edges, id_column="node_id", src_column="src", dst_column="dst", label_column="label", split_column=split
        )
        self.base = apply_overrides(proposed, {"resources.world_size": 2}, "2 workers")
        self.basis = digest(self.base.model_dump(mode="json"))
        # The PyG rows read only the preprocess output: a new model, training or infer proposal keeps them.
        self.data_basis = digest(self.base.model_dump(mode="json", exclude={"model", "training", "infer"}))
        self.root = storage.parse_uri(work / name / self.basis)  # tune's output folder: data/ and trials/ below it
        self.cs = smoothing_overrides()
        model = self.base.model
        results.put(
            "graphs",
            name,
            self.basis,
            {
                "proposal": {
                    "model": model.model_dump(mode="json"),
                    "training": self.base.training.model_dump(mode="json", include={"epochs", "batch_size", "fan_outs", "learning_rate"}),
                },
                "smoothing": self.cs,
            },
        )
        self._data: RunOutputs | None = None
        self._graph: Graph | None = None

    @property
    def data(self) -> RunOutputs:
        if self._data is None:
            root = self.root.join("data")
            ran, skipped, _ = run_steps(self.base, root, DATA_STEPS)
            print(f"# {self.name}: data steps ran {ran or 'none'}, up to date {skipped or 'none'}", flush=True)
            self._data = RunOutputs.under(root)
        return self._data

    def cell(self, method: str, seed: int) -> dict:
        if method in PYG:
            basis = self.data_basis + version(method)
        else:
            mode = {"sampled": "-s", "full_graph": "-f"}.get(method.removesuffix("_cs"), "")  # the row's own mode, whatever the proposal's
            basis = self.basis + mode + (digest(self.cs) if method.endswith("_cs") else "")
        key = f"{self.name}/{method}/{seed}"
        done = self.results.get("cells", key, basis)
        if done is not None:
            return done
        if method in PYG:
            if self._graph is None:
                self._graph = load_preprocessed(self.data.preprocessed)
            value = train_and_test(method, self._graph, seed)
        else:
            value = self._gnnflow(method, seed)
        print(json.dumps({"graph": self.name, "method": method, "seed": seed, **value}), flush=True)
        return self.results.put("cells", key, basis, value)

    def _config(self, kind: str) -> GnnflowConfig:
        if kind in ("sampled", "full_graph"):
            return apply_overrides(self.base, {"training.mode": kind}, kind)
        return apply_overrides(self.base, self.study()["best_params"], "the study's best trial")

    def _model(self, kind: str, seed: int) -> tuple[GnnflowConfig, dict]:
        """A trained model of ``kind`` (sampled, full_graph, tuned) with ``seed``, trained unless one is recorded."""
        config = apply_overrides(self._config(kind), {"training.seed": seed}, f"seed {seed}")
        key = f"{self.name}/{kind}/{seed}"
        basis = digest(config.model_dump(mode="json"))
        found = self.results.get("models", key, basis)
        if found is not None and storage.exists(storage.parse_uri(found["uri"]).join("manifest.json")):
            return config, found
        output = self.root.join(f"models/{kind}-{seed}")
        storage.delete_prefix(output)  # no checkpoint of an earlier run to resume from: train's seconds are a whole training's
        start = time.perf_counter()
        published = train(config, self.data.partitions, output)
        seconds = time.perf_counter() - start
        if published is None:
            raise GnnflowError(f"{key}: train published nothing")
        metrics = published.read_json("metrics.json")
        value = {
            "uri": str(output),
            "train_seconds": round(seconds, 2),
            **{k: metrics[k] for k in ("val_accuracy", "best_epoch", "epochs_run")},
        }
        return config, self.results.put("models", key, basis, value)

    def _gnnflow(self, method: str, seed: int) -> dict:
        kind = method.removesuffix("_cs")
        config, model = self._model(kind, seed)
        smoothed = method.endswith("_cs")
        if smoothed:
            config = apply_overrides(config, self.cs, "Correct & Smooth")
        mode = "exact" if config.training.mode == "full_graph" else "sampled"
        output = self.root.join(f"infer/{method}-{seed}")
        storage.delete_prefix(output)
        start = time.perf_counter()
        published = infer(config, self.data.partitions, model["uri"], output, mode=mode)
        seconds = time.perf_counter() - start
        if published is None:
            raise GnnflowError(f"{self.name}/{method}/{seed}: infer published nothing")
        metrics = published.read_json("metrics.json")
        value = {
            "val_accuracy": metrics["val_accuracy"] if smoothed else model["val_accuracy"],
            "test_accuracy": metrics["test_accuracy"],
            "train_seconds": model["train_seconds"],
            "infer_seconds": round(seconds, 2),
            "infer_mode": mode,
            "best_epoch": model["best_epoch"],
            "epochs_run": model["epochs_run"],
        }
        if smoothed:
            value |= {k: metrics[k] for k in metrics if k.endswith("_base") or k == "smoothing_seconds" or "alpha" in k}
        return value

    def study(self) -> dict:
        """The study (seed 0, --trials), run once per graph and proposal."""
        basis = self.basis + f"-{self.trials}"
        found = self.results.get("studies", self.name, basis)
        if found is not None:
            return found
        self.data  # noqa: B018  # the data steps, so the study finds them up to date
        space, widened = holding_config(default_space(self.base), self.base)
        start = time.perf_counter()
        result = run_study(self.base, self.root, space, TuneOptions(trials=self.trials))
        seconds = time.perf_counter() - start
        trials = [
            {"number": t.number, "params": t.params, "metric": t.metric, "seconds": t.seconds, "error": t.error} for t in result.trials
        ]
        value = {
            "best_trial": result.best.number,
            "best_val_accuracy": result.best.metric,
            "best_params": result.best.params,
            "seconds": round(seconds, 1),
            "trials": trials,
            "space": [p.describe() for p in space.params],
            "widened": widened,
        }
        print(
            f"# {self.name}: study of {self.trials} trials in {seconds:.0f} s; best trial {result.best.number} "
            f"(val {result.best.metric:.4f}): {result.best.params}",
            flush=True,
        )
        return self.results.put("studies", self.name, basis, value)


def _mean(cells: list[dict], key: str) -> float | None:
    values = [c[key] for c in cells if c.get(key) is not None]
    return statistics.mean(values) if values else None


def _shown(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(name: str, cells: dict[str, list[dict]], results: Results) -> list[str]:
    lines = [
        f"\n### {name}",
        "| method | mean val | mean test | test per seed | train s | smoothing s |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for method, runs in cells.items():
        per_seed = " / ".join(f"{c['test_accuracy']:.3f}" for c in runs)
        lines.append(
            f"| {LABELS[method]} | {_shown(_mean(runs, 'val_accuracy'), 4)} | {_shown(_mean(runs, 'test_accuracy'), 4)} | {per_seed} | "
            f"{_shown(_mean(runs, 'train_seconds'), 1)} | {_shown(_mean(runs, 'smoothing_seconds'), 2)} |"
        )
    study = results.data["studies"].get(name)
    if study is not None and any(m.startswith("tuned") for m in cells):
        lines.append(
            f"study: {len(study['trials'])} trials on seed 0 in {study['seconds']:.0f} s; best trial {study['best_trial']} "
            f"(val {study['best_val_accuracy']:.4f}): {json.dumps(study['best_params'])}"
        )
    return lines


def verdicts(name: str, cells: dict[str, list[dict]]) -> list[str]:
    """The issue's targets on one graph, for the methods measured (means over the seeds run)."""
    out = []
    pyg = {m: _mean(cells[m], "test_accuracy") for m in PYG if m in cells}
    if "tuned" in cells and pyg:
        best = max(pyg, key=lambda m: pyg[m])  # type: ignore[arg-type, return-value]
        tuned = _mean(cells["tuned"], "test_accuracy")
        met = "met" if tuned >= pyg[best] else "NOT met"  # type: ignore[operator]
        out.append(f"{name}: tuned test {tuned:.4f} vs best PyG ({best}) {pyg[best]:.4f}: {met}")
    for kind in ("sampled", "full_graph", "tuned"):
        if kind in cells and f"{kind}_cs" in cells:
            gains = {s: _mean(cells[f"{kind}_cs"], f"{s}_accuracy") - _mean(cells[kind], f"{s}_accuracy") for s in ("val", "test")}  # type: ignore[operator]
            met = "met" if min(gains.values()) >= 0.01 else "NOT met"
            ratio = _mean(cells[f"{kind}_cs"], "smoothing_seconds") / _mean(cells[kind], "train_seconds")  # type: ignore[operator]
            out.append(
                f"{name}: {kind} + C&S gains val {gains['val']:+.4f}, test {gains['test']:+.4f} (one point: {met}); "
                f"smoothing / training {ratio:.3f} ({'met' if ratio < 0.1 else 'NOT met'})"
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--trials", type=int, default=12, help="trials of each graph's study (default 12)")
    parser.add_argument("--out", required=True, help="results JSON (read first: finished cells are skipped)")
    parser.add_argument("--work", help="models and data (default: a folder 'work' beside --out)")
    args = parser.parse_args()
    configure(logging.WARNING)
    out = pathlib.Path(args.out)
    work = pathlib.Path(args.work) if args.work else out.parent / "work"
    results = Results(out)
    start = time.perf_counter()
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    print(f"# Correct & Smooth overrides: {smoothing_overrides()}", flush=True)
    report: list[str] = []
    for name in args.graphs:
        run = GraphRun(name, work.resolve(), results, args.trials)
        cells: dict[str, list[dict]] = {}
        for method in [m for m in METHODS if m in args.methods]:  # the table's order, whatever the flag's
            cells[method] = [run.cell(method, seed) for seed in args.seeds]
        report += table(name, cells, results)
        report += verdicts(name, cells)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.perf_counter() - start:.0f} s, seeds {args.seeds}")
    print("\n".join(report), flush=True)


if __name__ == "__main__":
    main()
