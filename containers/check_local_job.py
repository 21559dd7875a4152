"""Evidence for the Vertex CustomJob contract: the demo's partition, train and infer, each as 2
replicas in containers of the built step image, started from the compiled pipeline spec by
``gnnflow local-job --containers``, must give the metrics of ``gnnflow run`` with the same config.

Run as root from the repository root after ``containers/check_image.sh`` built the image:

    .venv/bin/python containers/check_local_job.py [--image localhost/gnnflow-check/step:cpu] [--workdir DIR] [--processes]

What runs: a GCS emulator (fake-gcs-server) on this machine's own address, which the containers
reach over their podman network; the bundled demo graph (2 workers) preprocessed and serialized
on the host into the emulator; the pipeline compiled with ``resources.runner: vertex`` for the
image; then ``gnnflow local-job PIPELINE --task T --containers`` for partition, train and infer
(2 containers each: workerpool0-0 and workerpool1-0, ``--shm-size 2g``, ulimits nofile/nproc
4096, on a podman network of their own, host names in CLUSTER_SPEC); and last ``gnnflow run``
of the same config on the host (runner local, 2 worker processes). Prints PASS or FAIL and
writes ``WORKDIR/result.txt``. Podman must run containers here (the runc runtime, ulimits no
higher than the machine's: see ../shared/STACK.md); without ``CONTAINERS_CONF`` the script
writes such a file into WORKDIR and uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components import storage  # noqa: E402
from components.config import apply_overrides  # noqa: E402
from components.preprocess.step import preprocess  # noqa: E402
from components.serialize.step import serialize  # noqa: E402
from pipelines.cli import main as gnnflow  # noqa: E402
from pipelines.local_run import demo_config  # noqa: E402
from pipelines.local_run import run as gnnflow_run  # noqa: E402
from tests.gcs_emulator import GcsEmulator  # noqa: E402

QUIET_CLOUD = {"GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "GOOGLE_CLOUD_PROJECT": "test"}


def host_address() -> str:
    """This machine's first non-loopback IPv4 address: the containers reach the emulator there."""
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()
    found = [a for a in addresses if "." in a and not a.startswith("127.")]
    if not found:
        raise SystemExit("check_local_job.py: no non-loopback IPv4 address for the emulator")
    return found[0]


def select_runtime(work: Path, engine: str, processes: bool) -> None:
    """Makes ``work``; for podman containers, points ``CONTAINERS_CONF`` at runc with ulimits this
    machine allows, unless it is set (crun and the default ulimits fail here: ../shared/STACK.md)."""
    work.mkdir(parents=True, exist_ok=True)
    if not processes and engine == "podman" and "CONTAINERS_CONF" not in os.environ:
        conf = work / "containers.conf"
        conf.write_text('[containers]\ndefault_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n\n[engine]\nruntime = "runc"\n')
        os.environ["CONTAINERS_CONF"] = str(conf)


def staged_demo(emulator: GcsEmulator, work: Path, image: str, overrides: dict[str, object]) -> tuple[storage.Uri, Path, Path]:
    """The demo with 2 workers and ``runner: vertex`` (plus ``overrides``), preprocessed and
    serialized on this host into a new bucket of ``emulator``, and the pipeline compiled for
    ``image``: (run root, config file, compiled pipeline)."""
    os.environ.update(QUIET_CLOUD, STORAGE_EMULATOR_HOST=emulator.url)
    bucket = f"check-{uuid.uuid4().hex[:8]}"
    emulator.create_bucket(bucket)
    root = storage.parse_uri(f"gs://{bucket}/run")
    layout: dict[str, object] = {"resources.world_size": 2, "resources.runner": "vertex", **overrides}
    config = apply_overrides(demo_config(storage.parse_uri(str(work / "demo"))), layout)
    config_file = work / "config.yaml"
    config_file.write_text(config.to_yaml())
    preprocess(config, root.join("preprocess/preprocessed"))
    serialize(config, root.join("preprocess/preprocessed"), root.join("serialize/tfrecords"))
    pipeline = work / "pipeline.yaml"
    assert gnnflow(["compile", "-o", str(pipeline), "--image", image, "--config", str(config_file)]) == 0
    return root, config_file, pipeline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="localhost/gnnflow-check/step:cpu")
    parser.add_argument("--workdir", default="/var/tmp/gnnflow-local-job")
    parser.add_argument("--engine", default="podman")
    parser.add_argument("--processes", action="store_true", help="replicas as local processes instead (what CI runs, at test size)")
    args = parser.parse_args()
    mode = ["--processes"] if args.processes else ["--containers", "--engine", args.engine, "--shm-size", "2g"]
    work = Path(args.workdir)
    select_runtime(work, args.engine, args.processes)
    started = time.time()
    with GcsEmulator(host=host_address()) as emulator:
        root, config_file, pipeline = staged_demo(emulator, work, args.image, {})
        seconds = {}
        for task in ("partition", "train", "infer"):
            begun = time.time()
            code = gnnflow(
                ["local-job", str(pipeline), "--task", task, "--root", str(root), "--config", str(config_file), *mode]
                + ([] if args.processes else [f"--env={name}" for name in ("STORAGE_EMULATOR_HOST", *QUIET_CLOUD)])
            )
            if code:
                print(f"RESULT: FAIL ({task} exited {code})")
                return 1
            seconds[task] = round(time.time() - begun, 1)
        job_train = storage.open_published(root.join("train/model"), step="train").read_json("metrics.json")
        job_infer = storage.open_published(root.join("infer/embeddings"), step="infer").read_json("metrics.json")
        direct = storage.parse_uri(str(work / f"direct-{uuid.uuid4().hex[:6]}"))
        gnnflow_run(str(config_file), str(direct), {"resources.runner": "local"})
        run_train = storage.open_published(direct.join("model"), step="train").read_json("metrics.json")
        run_infer = storage.open_published(direct.join("embeddings"), step="infer").read_json("metrics.json")
    same = job_infer == run_infer and job_train.get("val_accuracy") == run_train.get("val_accuracy")
    lines = [
        f"date:        {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} on {os.uname().machine}, {os.cpu_count()} cores",
        f"replicas:    {'processes' if args.processes else 'containers of ' + args.image + ', --shm-size 2g'}, 2 per task "
        f"(workerpool0-0, workerpool1-0); seconds per task {json.dumps(seconds)}",
        f"local-job:   infer metrics {json.dumps(job_infer, sort_keys=True)}",
        f"gnnflow run: infer metrics {json.dumps(run_infer, sort_keys=True)}",
        f"train:       epochs {job_train.get('epochs_run')} vs {run_train.get('epochs_run')}, "
        f"val_accuracy {job_train.get('val_accuracy')} vs {run_train.get('val_accuracy')}",
        f"total:       {time.time() - started:.0f} s",
        f"RESULT:      {'PASS' if same else 'FAIL'}",
    ]
    (work / "result.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
