"""How `gnnflow init-config` chooses the model type, the training mode and infer's smoothing: on
validation accuracy, over the graphs of benchmarks/init_config_constants.py (issue 40 item 3).

    .venv/bin/python benchmarks/init_config_models.py --timing                  # epoch seconds on the demo graph, no accuracy
    .venv/bin/python benchmarks/init_config_models.py [--graphs ...] [--seeds 0] [--combos graphsage/sampled ...]
        [--smoothing] [--log runs.jsonl]                                        # runs, one JSON line each, appended to --log
    .venv/bin/python benchmarks/init_config_models.py --summarize runs.jsonl    # the tables and the rule's choices

The graphs (``GRAPHS`` of init_config_constants.py): citeseer (standard split), demo, few_labels (20
labels a class) and weak_homophily (homophily 0.5). Every run starts from the proposal with
``LearningChoice(model_type, training_mode)`` and goes through the real steps (preprocess,
serialize, partition once a graph; train a run; one worker, the proposal's default). Each model keeps
its defaults in the code (appnp: 2-layer MLP, K 10, teleport 0.1; gcnii: 16 layers, alpha 0.1,
lambda 0.5). With ``--smoothing``, infer runs after train with ``infer.smoothing:
correct_and_smooth`` (its alphas chosen on the validation split, "none" among the candidates),
``--mode sampled`` for a sampled model and ``exact`` for a full-graph one, as the pipeline would be
run. Only validation accuracy is read and printed (train's at its best epoch; infer's before and
after smoothing): the test split plays no part (training.evaluate_test false).

The rule, fixed before the runs (/work/notes/init40-readme.md): a candidate's score is its mean
validation accuracy over the graphs (each graph's figure the mean over its seeds); among candidates
listed cheapest first, the first within MARGIN (0.005) of the best score is chosen.
  1. model type and training mode together, the six combinations in COMBOS' cost order, smoothing
     none, scored by train's validation accuracy;
  2. smoothing on the models of 1's choice: none (infer's val_accuracy_base) before
     correct_and_smooth (infer's val_accuracy), which is optimistic by construction (its alphas are
     chosen on the same validation nodes, none among them): the margin stands between that and a choice;
  3. the whole, checked around itself: the twelve cells (each combination, none before
     correct_and_smooth), scored by infer's validation accuracy; if it picks otherwise, it wins.
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
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.init_config_constants import GRAPHS, MARGIN  # noqa: E402
from components import storage  # noqa: E402
from components.config import GnnflowConfig  # noqa: E402
from components.config.inference import InferSpec  # noqa: E402
from components.infer.step import infer  # noqa: E402
from components.partition.step import partition  # noqa: E402
from components.preprocess.step import preprocess  # noqa: E402
from components.runtime.runlog import configure  # noqa: E402
from components.serialize.step import serialize  # noqa: E402
from components.tables.learning_choice import FALLBACK_REGULARISATION, LearningChoice  # noqa: E402
from components.tables.proposal import propose_config  # noqa: E402
from components.train.step import train  # noqa: E402

# Cheapest first (the rule's cost order): seconds a proposed run takes on the demo graph, measured
# by --timing before any accuracy run (2026-11-28: 4.1, 10.9, 32.0, 32.3, 66.4, 620.5 s; the a-priori
# order from CiteSeer's epoch times had gcnii/sampled before graphsage/full_graph, a tie here).
COMBOS = (
    "graphsage/sampled",
    "appnp/sampled",
    "graphsage/full_graph",
    "gcnii/sampled",
    "appnp/full_graph",
    "gcnii/full_graph",
)
TIMING_EPOCHS = 10
PAPER_ALPHAS = {"correction_alpha": InferSpec().correction_alpha, "smoothing_alpha": InferSpec().smoothing_alpha}


def proposed(graph: tuple[str, str, str | None], combo: str, seed: int, **training: object) -> GnnflowConfig:
    """The proposal for ``graph`` with the combination's model type and mode, seeded, test split never evaluated."""
    nodes, edges, split = graph
    model_type, mode = combo.split("/")
    config = propose_config(
        nodes,
        edges,
        id_column="node_id",
        src_column="src",
        dst_column="dst",
        label_column="label",
        split_column=split,
        # Steps 1-3 compared the types and modes with the configs' default regularisation (step 4:
        # benchmarks/init_config_regularisation.py).
        choice=LearningChoice(model_type=model_type, training_mode=mode, regularisation=FALLBACK_REGULARISATION),  # type: ignore[arg-type]
    )
    assert (config.model.type, config.training.mode) == (model_type, mode), "the proposal fell back on a graph it was meant for"
    update = {"seed": seed, "evaluate_test": False, **training}
    return config.model_copy(update={"training": config.training.model_copy(update=update)})


def _prepare(name: str, work: pathlib.Path) -> tuple[tuple[str, str, str | None], storage.Uri]:
    """The graph's tables and its one-worker partitions (the same features for every combination),
    reused when an earlier run with the same --out made them."""
    graph = GRAPHS[name](work / "tables")
    root = storage.parse_uri(work / "data")
    if (work / "data" / "parts" / storage.MANIFEST_NAME).exists():
        return graph, root.join("parts")
    config = proposed(graph, COMBOS[0], 0)
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    parts = partition(root.join("tfr"), root.join("parts"), config.partition, world_size=1)
    assert parts is not None
    return graph, parts.root


def _median_epoch(published: storage.PublishedOutput) -> float:
    history = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
    return statistics.median(h["seconds"] for h in history)


def _trained(config: GnnflowConfig, parts: storage.Uri, name: str, combo: str, work: pathlib.Path) -> tuple[dict, storage.Uri]:
    """Train's row and model; a model an earlier run with the same --out trained (and its row) is reused."""
    folder = work / f"{combo.replace('/', '-')}-{config.training.seed}"
    saved = folder.with_suffix(".json")
    if saved.exists() and (folder / storage.MANIFEST_NAME).exists():
        return json.loads(saved.read_text()), storage.parse_uri(folder)
    began = time.perf_counter()
    published = train(config, parts, storage.parse_uri(folder))
    assert published is not None
    metrics = published.read_json("metrics.json")
    row = {
        "graph": name,
        "combo": combo,
        "seed": config.training.seed,
        "val_accuracy": metrics["val_accuracy"],
        "best_epoch": metrics["best_epoch"],
        "epochs": config.training.epochs,
        "epochs_run": metrics["epochs_run"],
        "epoch_s": round(_median_epoch(published), 4),
        "train_s": round(time.perf_counter() - began, 1),
    }
    saved.write_text(json.dumps(row))
    return row, published.root


def _smoothed(config: GnnflowConfig, parts: storage.Uri, model: storage.Uri, folder: pathlib.Path) -> dict:
    """Infer with correct_and_smooth, as the pipeline would run it: its validation figures only."""
    smoothed = config.model_copy(update={"infer": config.infer.model_copy(update={"smoothing": "correct_and_smooth"})})
    mode = "exact" if config.training.mode == "full_graph" else "sampled"
    began = time.perf_counter()
    inferred = infer(smoothed, parts, model, storage.parse_uri(folder), mode=mode)
    assert inferred is not None
    found = inferred.read_json("metrics.json")
    return {
        "infer_mode": mode,
        "val_accuracy_base": found["val_accuracy_base"],
        "val_accuracy_smoothed": found["val_accuracy"],
        "smoothing_s": found["smoothing_seconds"],
        "infer_s": round(time.perf_counter() - began, 1),
        "smoothing_selected": found.get("smoothing_selected"),
        # The configured (paper's) alphas' validation accuracy among the candidates: C&S without the
        # choice, so without its optimism (shown beside the rule's figure, not used by it).
        "val_accuracy_paper_alphas": next(
            (c["val_accuracy"] for c in found.get("smoothing_candidates", []) if c["candidate"] == PAPER_ALPHAS), None
        ),
    }


def run_graph(name: str, work: pathlib.Path, seeds: list[int], combos: list[str], smoothing: bool, log: pathlib.Path | None) -> None:
    """Trains (and with ``smoothing`` infers) every combination and seed on one graph; a JSON line a run."""
    graph, parts = _prepare(name, work)
    for combo in combos:
        for seed in seeds:
            config = proposed(graph, combo, seed)
            row, model = _trained(config, parts, name, combo, work)
            if smoothing:
                row |= _smoothed(config, parts, model, work / f"{combo.replace('/', '-')}-{seed}-infer")
            line = json.dumps(row)
            print(line, flush=True)
            if log is not None:
                with log.open("a") as out:
                    out.write(line + "\n")


def timing(work: pathlib.Path) -> None:
    """Median epoch seconds of each combination on the demo graph (seed 0, TIMING_EPOCHS epochs) and
    the seconds a proposed run would take (times its proposed epochs); reads no accuracy."""
    graph, parts = _prepare("demo", work)
    print("| combination | median epoch s | proposed epochs | seconds a proposed run |")
    print("|---|---:|---:|---:|")
    for combo in COMBOS:
        epochs = proposed(graph, combo, 0).training.epochs
        config = proposed(graph, combo, 0, epochs=TIMING_EPOCHS, early_stopping_patience=None)
        published = train(config, parts, storage.parse_uri(work / f"timing-{combo.replace('/', '-')}"))
        assert published is not None
        epoch = _median_epoch(published)
        print(f"| {combo} | {epoch:.4f} | {epochs} | {epoch * epochs:.1f} |", flush=True)


def score(rows: list[dict], key: str, graphs: list[str]) -> float:
    """Mean over graphs of the mean over seeds of ``key``."""
    return statistics.mean(statistics.mean(r[key] for r in rows if r["graph"] == g) for g in graphs)


def choose(scores: dict[str, float]) -> str:
    """The first candidate (cheapest first) within MARGIN of the best score."""
    best = max(scores.values())
    return next(c for c, s in scores.items() if s >= best - MARGIN)


def _table(title: str, cells: dict[str, dict[str, list[float]]], graphs: list[str]) -> None:
    print(f"\n{title}\n| candidate | " + " | ".join(graphs) + " | mean | seeds |")
    print("|---" * (len(graphs) + 3) + "|")
    for name, per_graph in cells.items():
        means = [statistics.mean(per_graph[g]) for g in graphs]
        seeds = sorted({len(per_graph[g]) for g in graphs})
        print(f"| {name} | " + " | ".join(f"{m:.4f}" for m in means) + f" | {statistics.mean(means):.4f} | {seeds} |")


def read_runs(paths: list[str], key: str) -> tuple[list[str], dict[str, list[dict]]]:
    """The graphs run and the rows of each ``key`` value (a combination, a candidate) from the JSON
    lines of earlier runs, the last line of a (graph, value, seed) winning."""
    runs: dict[tuple[str, str, int], dict] = {}
    for path in paths:
        for line in pathlib.Path(path).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                runs[(row["graph"], row[key], row["seed"])] = row
    grouped: dict[str, list[dict]] = defaultdict(list)
    for (_, value, _), row in runs.items():
        grouped[value].append(row)
    return [g for g in GRAPHS if any(k[0] == g for k in runs)], grouped


def summarize(paths: list[str]) -> None:
    """The tables and the rule's three steps from the JSON lines of earlier runs (the last line of a run wins)."""
    graphs, by_combo = read_runs(paths, "combo")
    complete = [c for c in COMBOS if {r["graph"] for r in by_combo[c]} == set(graphs)]
    trained = {c: {g: [r["val_accuracy"] for r in by_combo[c] if r["graph"] == g] for g in graphs} for c in complete}
    _table("train's validation accuracy (smoothing none)", trained, graphs)
    first = choose({c: score(by_combo[c], "val_accuracy", graphs) for c in complete})
    print(f"1. model type and mode: {first}")
    inferred = [c for c in complete if all("val_accuracy_smoothed" in r for r in by_combo[c])]
    if not inferred:
        return
    cells: dict[str, dict[str, list[float]]] = {}
    scores: dict[str, float] = {}
    for combo in inferred:
        for option, key in (("none", "val_accuracy_base"), ("correct_and_smooth", "val_accuracy_smoothed")):
            cells[f"{combo}/{option}"] = {g: [r[key] for r in by_combo[combo] if r["graph"] == g] for g in graphs}
            scores[f"{combo}/{option}"] = score(by_combo[combo], key, graphs)
    _table("infer's validation accuracy, before (none) and after Correct & Smooth", cells, graphs)
    paper = [c for c in inferred if all(r.get("val_accuracy_paper_alphas") is not None for r in by_combo[c])]
    _table(
        "for reference (not the rule's): Correct & Smooth with the paper's alphas, no choice on validation",
        {c: {g: [r["val_accuracy_paper_alphas"] for r in by_combo[c] if r["graph"] == g] for g in graphs} for c in paper},
        graphs,
    )
    sequential = None
    if first in inferred:
        second = choose({o: scores[f"{first}/{o}"] for o in ("none", "correct_and_smooth")})
        sequential = f"{first}/{second}"
        print(f"2. smoothing on {first}: {second}")
    whole = choose(scores)
    print(f"3. the twelve cells: {whole} ({'agrees with' if whole == sequential else 'differs from'} 1 and 2)")
    seconds = {c: statistics.mean(float(r["train_s"]) for r in by_combo[c]) for c in complete}
    print("mean train seconds:", {c: round(s, 1) for c, s in seconds.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--combos", nargs="+", default=list(COMBOS), choices=list(COMBOS))
    parser.add_argument("--smoothing", action="store_true", help="infer with correct_and_smooth after each train")
    parser.add_argument("--timing", action="store_true", help="epoch seconds of each combination on the demo graph only")
    parser.add_argument("--log", help="append each run's JSON line to this file")
    parser.add_argument("--summarize", nargs="+", metavar="JSONL", help="print the tables and choices of earlier runs")
    parser.add_argument("--out", help="work folder (default: a temporary folder, deleted at the end); models trained there are reused")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    configure(logging.WARNING)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnflow-models-") as scratch:
        work = pathlib.Path(args.out or scratch)
        if args.timing:
            timing(work / "timing")
        else:
            log = pathlib.Path(args.log) if args.log else None
            for name in args.graphs:
                run_graph(name, work / name, args.seeds, args.combos, args.smoothing, log)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}, {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
