"""Evidence for preemption on the Vertex CustomJob path: the demo's train task, as 2 replicas
started from the compiled pipeline spec by ``gnnflow local-job``, gets SIGTERM mid-training (as
Vertex AI sends it to each replica's container), must exit 75 saying the replicas were
preempted, and the same command run again must resume from the mid-epoch checkpoint and finish.

Run as root from the repository root after ``containers/check_image.sh`` built the image:

    .venv/bin/python containers/check_local_job_preemption.py [--image localhost/gnnflow-check/step:cpu] [--workdir DIR] [--processes]

What runs: as ``containers/check_local_job.py`` (a GCS emulator on this machine's address, the
demo preprocessed and serialized on the host into it, the pipeline compiled with
``resources.runner: vertex``, 2 workers, for the image), then ``local-job --task partition``,
then ``gnnflow local-job PIPELINE --task train --containers`` as a process of its own: once a
replica logs a periodic checkpoint, the script sends that process SIGTERM (``local-job`` passes
it on with ``podman kill --signal TERM`` to each container, whose PID 1 is the step's executor),
and checks exit status 75, the one-line message and where train stopped; then the same command
again must log "resuming from the checkpoint of" that point and exit 0 with the model published.
Prints PASS or FAIL and writes ``WORKDIR/result.txt``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_local_job import QUIET_CLOUD, host_address, select_runtime, staged_demo  # noqa: E402

from components import storage  # noqa: E402
from tests.gcs_emulator import GcsEmulator  # noqa: E402

PREEMPTED = "local-job train: stopped by SIGTERM; replicas preempted (exit 75): rerun to resume from the checkpoint"
UNDER_WAY = "periodic: checkpoint at batch"  # a replica's log line: training has started batches
# Small batches and a checkpoint every 3 of them: a SIGTERM lands inside an epoch, not after the last.
TRAINING = {
    "training.epochs": 3,
    "training.batch_size": 8,
    "training.checkpoint_every_batches": 3,
    "training.early_stopping_patience": None,
}


def run_job(command: list[str], sigterm_after: str | None) -> tuple[int, str, float | None]:
    """Runs ``command``, echoing its output; sends it SIGTERM once a line holds ``sigterm_after``.
    Returns (exit status, output, seconds from the SIGTERM to the exit)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert process.stdout is not None
    seen, signalled = [], None
    for line in process.stdout:
        print(line, end="", flush=True)
        seen.append(line)
        if sigterm_after and signalled is None and sigterm_after in line:
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
    code = process.wait()
    return code, "".join(seen), None if signalled is None else round(time.monotonic() - signalled, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="localhost/gnnflow-check/step:cpu")
    parser.add_argument("--workdir", default="/var/tmp/gnnflow-local-job-preemption")
    parser.add_argument("--engine", default="podman")
    parser.add_argument("--processes", action="store_true", help="replicas as local processes instead (as CI's test does)")
    args = parser.parse_args()
    mode = ["--processes"] if args.processes else ["--containers", "--image", args.image, "--engine", args.engine, "--shm-size", "2g"]
    work = Path(args.workdir)
    select_runtime(work, args.engine, args.processes)
    started = time.time()
    with GcsEmulator(host=host_address()) as emulator:
        root, config_file, pipeline = staged_demo(emulator, work, args.image, TRAINING)
        passed = [] if args.processes else [f"--env={name}" for name in ("STORAGE_EMULATOR_HOST", *QUIET_CLOUD)]
        job = [sys.executable, "-m", "pipelines.cli", "local-job", str(pipeline), "--root", str(root), "--config", str(config_file)]
        if subprocess.run([*job, "--task", "partition", *mode, *passed], check=False).returncode:
            print("RESULT: FAIL (partition)")
            return 1
        stopped_code, stopped_output, stop_s = run_job([*job, "--task", "train", *mode, *passed], sigterm_after=UNDER_WAY)
        found = re.search(r"train: stopped on SIGTERM at (batch \d+ of epoch \d+)", stopped_output)
        where = found.group(1) if found else None
        rerun_code, rerun_output, _ = run_job([*job, "--task", "train", *mode, *passed], sigterm_after=None)
        resumed = where is not None and f"resuming from the checkpoint of {where}" in rerun_output
        published = storage.open_published(root.join("train/model"), step="train").read_json("metrics.json") if rerun_code == 0 else {}
    checks = {
        "SIGTERM → exit 75": stopped_code == 75,
        "the one-line message": PREEMPTED in stopped_output,
        "stopped inside an epoch": where is not None,
        "rerun exit 0": rerun_code == 0,
        "rerun resumed from that batch": resumed,
        "model published, every epoch run": published.get("epochs_run") == TRAINING["training.epochs"],
    }
    lines = [
        f"date:        {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} on {os.uname().machine}, {os.cpu_count()} cores",
        f"replicas:    {'processes' if args.processes else 'containers of ' + args.image}, 2 (workerpool0-0, workerpool1-0)",
        f"SIGTERM:     exit {stopped_code} after {stop_s} s; stopped at {where or '?'}",
        f"rerun:       exit {rerun_code}; resumed there: {resumed}; epochs_run {published.get('epochs_run')}",
        *(f"  {'ok ' if ok else 'BAD'} {name}" for name, ok in checks.items()),
        f"total:       {time.time() - started:.0f} s",
        f"RESULT:      {'PASS' if all(checks.values()) else 'FAIL'}",
    ]
    (work / "result.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
