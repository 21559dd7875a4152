"""Evidence for Vertex AI Prediction's custom-container contract: ``gnnflow serve`` in the built
step image, as a real container under podman, answering real HTTP requests from the host.

Run as root from the repository root after ``containers/check_image.sh`` built the image:

    .venv/bin/python containers/check_serving.py [--image localhost/gnnflow-check/step:cpu] [--workdir DIR]
        [--run ROOT] [--epochs 3] [--command image|deployed]

What runs: unless ``--run`` names one, a small trained run of the bundled demo on this host
(``gnnflow run --set training.epochs=N --infer-mode exact``); then one container of the image with
the runc runtime and explicit ulimits (../shared/STACK.md), as the image's own user, its port 8080
published on a loopback port of the host, the run folder mounted read-only at /mnt/run, and the
environment Vertex AI gives a serving container: AIP_HTTP_PORT=8080, AIP_HEALTH_ROUTE=/health,
AIP_PREDICT_ROUTE=/predict (the routes ``gnnflow deploy`` registers) and AIP_STORAGE_URI=the model
folder as seen inside. Its arguments are those of ``gnnflow deploy``'s container spec: ``gnnflow
serve --partitions ... --embeddings ...``, through the image's entry point (``--command image``) or
with ``gnnflow`` as the entry point, as Vertex AI starts the spec's command (``--command deployed``).
From the host: health polled until 200 (how long it answered 503 is printed), one predict with an
existing node (its embedding must equal the run's exact infer embedding, cosine >= 0.999, and its
label infer's prediction) and a new node citing three existing ones (a label of the vocabulary),
two bad requests (each a 400 naming the instance and the field), a good one after them, then
SIGTERM (``podman kill --signal TERM``): the container must exit 0. Two containers run so: the
first with ``--embeddings`` (existing nodes are answered from infer's stored rows), the second
without (the model computes them in the container over their full neighbourhoods). The server's
log must say it took the model from AIP_STORAGE_URI and how it answers existing nodes. Prints the
durations and PASS or FAIL, writes ``WORKDIR/result.txt`` and exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

MOUNT = "/mnt/run"
CONTAINER_PORT = 8080  # Vertex AI's default and the port gnnflow deploy registers
ROUTES = {"AIP_HEALTH_ROUTE": "/health", "AIP_PREDICT_ROUTE": "/predict"}
MIN_COSINE = 0.999


class CheckFailed(Exception):
    """One expectation the container did not meet."""


@dataclass(frozen=True)
class Health:
    """What polling the health route saw, in seconds since ``podman run`` started."""

    listening_s: float  # first HTTP answer of any kind
    ready_s: float  # first 200
    answers_503: int
    window_503_s: float  # first 503 to first 200


def cosine(a: list[float], b: np.ndarray) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise CheckFailed(f"embedding of {x.shape[0]} values, infer stored {y.shape[0]}")
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def check_existing(answer: dict, stored_embedding: np.ndarray, stored_label: str) -> float:
    """The cosine of the served and the stored embedding; raises unless they agree."""
    similarity = cosine(answer.get("embedding") or [], stored_embedding)
    if similarity < MIN_COSINE:
        raise CheckFailed(f"existing node: cosine {similarity:.6f} with infer's exact embedding, below {MIN_COSINE}")
    if answer.get("label") != stored_label:
        raise CheckFailed(f"existing node: label {answer.get('label')!r}, infer predicted {stored_label!r}")
    return similarity


def check_new(answer: dict, vocabulary: set[str], dimensions: int) -> None:
    if len(answer.get("embedding") or []) != dimensions:
        raise CheckFailed(f"new node: embedding of {len(answer.get('embedding') or [])} values, expected {dimensions}")
    if answer.get("label") not in vocabulary:
        raise CheckFailed(f"new node: label {answer.get('label')!r} is not in the vocabulary {sorted(vocabulary)}")
    if abs(sum((answer.get("probabilities") or {}).values()) - 1.0) > 1e-4:
        raise CheckFailed("new node: its probabilities do not sum to 1")


def check_error(response: httpx.Response, instance: int | None, field: str) -> str:
    """The 400's message; raises unless it names ``instance`` and ``field``."""
    if response.status_code != 400:
        raise CheckFailed(f"bad request answered {response.status_code}, not 400: {response.text[:200]}")
    error = response.json().get("error") or {}
    if (error.get("instance"), error.get("field")) != (instance, field):
        raise CheckFailed(f"400 names instance {error.get('instance')!r}, field {error.get('field')!r}; expected {instance!r}, {field!r}")
    return str(error.get("message"))


def trained_run(work: Path, epochs: int) -> tuple[Path, float]:
    """A new run of the demo with exact inference under ``work``, and its seconds."""
    root = work / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    started = time.monotonic()
    command = [sys.executable, "-m", "pipelines.cli", "run", "--output", str(root), "--set", f"training.epochs={epochs}"]
    subprocess.run([*command, "--set", "training.early_stopping_patience=null", "--infer-mode", "exact"], check=True)
    return root, time.monotonic() - started


def stored_embeddings(root: Path) -> pd.DataFrame:
    shards = sorted(root.glob("embeddings/gen-*/embeddings/paper/*.parquet"))
    if not shards:
        raise CheckFailed(f"no infer embeddings under {root}/embeddings (a demo run with infer published?)")
    return pd.concat(pq.read_table(f).to_pandas() for f in shards).set_index("node_id")


def new_node(row: pd.Series, neighbours: list[str]) -> dict[str, object]:
    """A new paper with ``row``'s raw columns, citing ``neighbours``."""
    features = {c: (row[c].item() if hasattr(row[c], "item") else row[c]) for c in row.index if c not in ("node_id", "label", "split")}
    edges = [{"edge_type": "cites", "node_id": n, "direction": "out"} for n in neighbours]
    return {"node_type": "paper", "features": features, "edges": edges}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def podman(*args: str, timeout: float = 120) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True, timeout=timeout).stdout.strip()


def run_command(image: str, name: str, root: Path, host_port: int, mode: str, embeddings: bool = True) -> list[str]:
    """``podman run`` of the serving container as Vertex AI would start it (see the docstring)."""
    environment = {"AIP_HTTP_PORT": str(CONTAINER_PORT), **ROUTES, "AIP_STORAGE_URI": f"{MOUNT}/model"}
    serve = ["serve", "--partitions", f"{MOUNT}/partitions"] + (["--embeddings", f"{MOUNT}/embeddings"] if embeddings else [])
    command = ["podman", "--runtime", "runc", "run", "-d", "--name", name]
    command += ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    command += ["-p", f"127.0.0.1:{host_port}:{CONTAINER_PORT}", "-v", f"{root}:{MOUNT}:ro"]
    command += [f"--env={k}={v}" for k, v in environment.items()]
    if mode == "deployed":
        return [*command, "--entrypoint", "gnnflow", image, *serve]
    return [*command, image, "gnnflow", *serve]


def wait_ready(url: str, started: float, name: str, timeout_s: float) -> Health:
    listening = first_503 = None
    count = 0
    while time.monotonic() - started < timeout_s:
        try:
            status = httpx.get(url + ROUTES["AIP_HEALTH_ROUTE"], timeout=5).status_code
        except httpx.TransportError:
            status = None
        now = time.monotonic() - started
        if status is not None and listening is None:
            listening = now
        if status == 503:
            count += 1
            first_503 = now if first_503 is None else first_503
        elif status == 200:
            return Health(listening or now, now, count, now - first_503 if first_503 is not None else 0.0)
        elif status is not None:
            raise CheckFailed(f"health answered {status}")
        # Asking podman takes a while: only while nothing answers, so that a short 503 is seen.
        if status is None and podman("inspect", "--format", "{{.State.Running}}", name) != "true":
            raise CheckFailed("the container stopped before it was healthy")
        time.sleep(0.01 if status else 0.1)
    raise CheckFailed(f"not healthy after {timeout_s:.0f} s")


def exercise(url: str, root: Path) -> list[str]:
    """The predictions and bad requests; returns the report's lines."""
    batch = stored_embeddings(root)
    nodes = pd.read_csv(root / "demo_data" / "nodes.csv.gz", dtype={"node_id": str})
    vocabulary = {str(v) for v in nodes["label"].dropna().unique()}
    existing = str(batch.index[7])
    neighbours = [str(n) for n in batch.index[20:23]]
    novel = new_node(nodes.iloc[3], neighbours)
    predict = url + ROUTES["AIP_PREDICT_ROUTE"]
    body = {"instances": [{"node_type": "paper", "node_id": existing}, novel]}
    begun = time.monotonic()
    response = httpx.post(predict, json=body, timeout=120)
    predict_ms = (time.monotonic() - begun) * 1000
    if response.status_code != 200:
        raise CheckFailed(f"predict answered {response.status_code}: {response.text[:300]}")
    answers = response.json()["predictions"]
    if len(answers) != 2:
        raise CheckFailed(f"{len(answers)} predictions for 2 instances")
    similarity = check_existing(answers[0], np.asarray(batch.loc[existing, "embedding"]), str(batch.loc[existing, "prediction"]))
    check_new(answers[1], vocabulary, len(answers[0]["embedding"]))
    unknown = httpx.post(predict, json={"instances": [{"node_id": existing}, {"node_id": "no-such-paper"}]}, timeout=60)
    unknown_message = check_error(unknown, 1, "node_id")
    wrong = {**novel, "features": {**novel["features"], "score": "high"}}  # type: ignore[dict-item]
    wrong_message = check_error(httpx.post(predict, json={"instances": [wrong]}, timeout=60), 0, "features.score")
    again = httpx.post(predict, json={"instances": [{"node_id": existing}]}, timeout=60)
    if again.status_code != 200 or cosine(again.json()["predictions"][0]["embedding"], np.asarray(answers[0]["embedding"])) < MIN_COSINE:
        raise CheckFailed(f"after the bad requests a good one answered {again.status_code}: {again.text[:200]}")
    top = max(answers[1]["probabilities"].values())
    return [
        f"existing:    {existing}: {len(answers[0]['embedding'])}-dim embedding, cosine {similarity:.6f} with infer --mode exact, "
        f"label {answers[0]['label']} (= infer's)",
        f"new node:    citing {', '.join(neighbours)}: label {answers[1]['label']} (p={top:.3f}; vocabulary of {len(vocabulary)})",
        f"predict:     {predict_ms:.0f} ms for the first request (2 instances), HTTP 200",
        f"bad:         400 instance=1 field=node_id: {unknown_message}",
        f"bad:         400 instance=0 field=features.score: {wrong_message}",
        "after:       a good request answered 200 with the same embedding",
    ]


def stop(name: str) -> tuple[int, float]:
    """SIGTERM, then the container's exit status and the seconds it took."""
    begun = time.monotonic()
    podman("kill", "--signal", "TERM", name)
    status = int(podman("wait", name, timeout=120))
    return status, time.monotonic() - begun


def serve_once(image: str, root: Path, mode: str, embeddings: bool, work: Path, timeout_s: float) -> tuple[list[str], str]:
    """One container, checked from the host: the report's lines and the failure ("" when none)."""
    name = f"gnnflow-serving-check-{uuid.uuid4().hex[:8]}"
    port = free_port()
    command = run_command(image, name, root, port, mode, embeddings)
    lines = [f"container:   {' '.join(command)}"]
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    failure = ""
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
        health = wait_ready(url, started, name, timeout_s)
        lines.append(
            f"health:      first answer {health.listening_s:.1f} s after podman run; 503 for {health.window_503_s:.1f} s "
            f"({health.answers_503} polls); 200 at {health.ready_s:.1f} s"
        )
        lines += exercise(url, root)
        status, seconds = stop(name)
        lines.append(f"SIGTERM:     podman kill --signal TERM: exit status {status} after {seconds:.1f} s")
        if status != 0:
            raise CheckFailed(f"the container exited {status} on SIGTERM")
    except (CheckFailed, subprocess.SubprocessError, httpx.HTTPError, KeyError, ValueError) as error:
        failure = f"{type(error).__name__}: {error}"
    finally:
        logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
        log = logs.stdout + logs.stderr
        (work / f"{name}.log").write_text(log)
        subprocess.run(["podman", "rm", "-f", name], capture_output=True)
    expected = {
        "model from": "(AIP_STORAGE_URI)",
        "existing nodes": EXISTING_FROM[embeddings],
        "load time": "gnnflow.serve: model loaded in ",
        "stopped": "gnnflow.serve: stopped: ",
    }
    found = {
        what: next((line.split(" INFO ", 1)[-1] for line in log.splitlines() if words in line), "") for what, words in expected.items()
    }
    lines += [f"server log:  {line}" for line in found.values() if line]
    lines.append(f"             (the whole log: {work / f'{name}.log'}; {time.monotonic() - started:.0f} s from podman run)")
    missing = [what for what, line in found.items() if not line]
    if missing and not failure:
        failure = f"the server's log lacks its line on {', '.join(missing)}"
    return lines, failure


# How the server's log says it answers existing nodes, with --embeddings and without.
EXISTING_FROM = {True: "existing nodes: stored exact embeddings", False: "existing nodes: computed over full neighbourhoods"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="localhost/gnnflow-check/step:cpu")
    parser.add_argument("--workdir", default="/var/tmp/gnnflow-serving-check")
    parser.add_argument("--run", help="a demo run root with model, partitions and exact embeddings (default: make one)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--command", choices=("image", "deployed"), default="image", help="how the container starts the server")
    parser.add_argument("--ready-timeout", type=float, default=300)
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"date:        {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} on {os.uname().machine}, {os.cpu_count()} cores"]
    if args.run:
        root = Path(args.run).resolve()
        lines.append(f"run:         {root} (reused)")
    else:
        root, seconds = trained_run(work, args.epochs)
        lines.append(f"run:         {root}: gnnflow run, demo, {args.epochs} epochs, --infer-mode exact, {seconds:.0f} s on the host")
    image_id = podman("image", "inspect", "--format", "{{.Id}}", args.image)[:12]
    size = int(podman("image", "inspect", "--format", "{{.Size}}", args.image))
    lines.append(f"image:       {args.image} {image_id}, {size / 1e9:.2f} GB")
    failures = []
    for embeddings in (True, False):
        lines.append(
            "-- with --embeddings (existing nodes from infer's rows)"
            if embeddings
            else "-- without --embeddings (existing nodes computed by the model in the container)"
        )
        part, failure = serve_once(args.image, root, args.command, embeddings, work, args.ready_timeout)
        lines += part
        if failure:
            failures.append(failure)
    lines.append(f"RESULT:      {'FAIL (' + '; '.join(failures) + ')' if failures else 'PASS'}")
    (work / "result.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
