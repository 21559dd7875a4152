"""The Dataflow-worker proof's Python half (run by containers/check_dataflow_worker.sh).

Runs preprocess and serialize of the bundled demo graph, into WORK:
  local/   with ``preprocess.engine: local`` (one process, no Beam);
  docker/  with ``preprocess.engine: beam`` through Beam's PortableRunner (``job_endpoint=embed``,
           ``environment_type=DOCKER``, ``environment_config=IMAGE``): the runner stays in this
           process and every SDK harness runs in a container of IMAGE, started by Beam with
           ``docker run IMAGE --id=... --provision_endpoint=...``, i.e. through the image's entry
           point and Beam's boot program, as Dataflow starts its workers; as the image's user;
  docker-user-U/  the same, once for each USER given, with ``GNNFLOW_DOCKER_USER=U`` in the
           environment: the ``docker`` wrapper of check_dataflow_worker.sh then adds ``--user U``
           (``0``: root, as Dataflow runs boot);
then compares each Beam run's published outputs with the local ones file by file, byte for byte
(the resolved config, which names the engine, aside). The pipelines are the project's own (the step functions Dataflow jobs
run); only the runner is swapped, here, by replacing the options and runner the launcher picks
for ``runner: local``: no product code changes for the check.

Usage: python containers/dataflow_worker_check.py IMAGE WORK [USER ...]
Exit status 0 when the steps ran in the containers and every output is identical to the local one.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import sys
import time

from components import storage
from components.config import apply_overrides
from pipelines.local_run import demo_config


def _portable_docker(image: str) -> None:
    """Makes the Beam launcher run ``runner: local`` pipelines on PortableRunner + DOCKER."""
    import apache_beam.runners.portability.fn_api_runner as fn_api_runner
    from apache_beam.runners.portability.portable_runner import PortableRunner

    from components.beam_pipeline import launch

    def options(spec, step, image_arg=None):  # noqa: ANN001, ANN202 - launch.pipeline_options' signature
        return {
            "save_main_session": False,
            "pickle_library": "cloudpickle",
            "job_endpoint": "embed",
            "environment_type": "DOCKER",
            "environment_config": image,
            # The image holds Beam and gnnflow: nothing is staged or installed by boot.
            "sdk_location": "container",
        }

    launch.pipeline_options = options
    fn_api_runner.FnApiRunner = PortableRunner  # launch imports it by name when it runs


class _BootLog(logging.Handler):
    """Prints the log entries Beam's boot program sends over the Fn API logging service.

    Boot logs at DEBUG severity (``Initializing python harness: ...``, ``Executing Python ...``);
    the runner's logging service re-logs every entry on the root logger at the entry's level, so
    at INFO they would be dropped. They are printed as ``boot: MESSAGE`` lines instead.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.levelno == logging.DEBUG and text.startswith("severity: DEBUG"):
            found = re.search(r'^message: "(.*)"$', text, re.MULTILINE)
            print("boot:", found.group(1) if found else text.replace("\n", " "), flush=True)


def _same(left: storage.PublishedOutput, right: storage.PublishedOutput, what: str) -> list[str]:
    """The differences between two published outputs, read file by file."""
    problems = []
    a = {k for k in left.manifest.files if k != "config.resolved.yaml"}
    b = {k for k in right.manifest.files if k != "config.resolved.yaml"}
    if a != b:
        problems.append(f"{what}: files differ: only local {sorted(a - b)[:5]}, only docker {sorted(b - a)[:5]}")
    for name in sorted(a & b):
        if storage.read_bytes(left.uri(name)) != storage.read_bytes(right.uri(name)):
            problems.append(f"{what}: {name} differs")
    if left.manifest.counts != right.manifest.counts:
        problems.append(f"{what}: counts differ: {left.manifest.counts} vs {right.manifest.counts}")
    print(f"{what}: {len(a & b)} files compared byte for byte, {len(problems)} difference(s)")
    return problems


def main(image: str, work: pathlib.Path, users: list[str]) -> int:
    from components.preprocess.step import preprocess
    from components.serialize.step import serialize

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.INFO)
    logging.getLogger().setLevel(logging.DEBUG)  # for boot's entries only: see _BootLog
    logging.getLogger().addHandler(_BootLog())
    root = storage.parse_uri(str(work))
    config = demo_config(root)
    outputs, seconds = {}, {}
    runs = ["local", "docker"] + [f"docker-user-{user}" for user in users]
    for run, user in zip(runs, [None, None, *users]):
        c = config if run == "local" else apply_overrides(config, {"preprocess.engine": "beam"})
        if run != "local":
            _portable_docker(image)
            os.environ.pop("GNNFLOW_DOCKER_USER", None)
            if user is not None:
                os.environ["GNNFLOW_DOCKER_USER"] = user
        started = time.monotonic()
        pre = preprocess(c, f"{work}/{run}/preprocessed", image=image)
        seconds[f"{run} preprocess"] = time.monotonic() - started
        started = time.monotonic()
        ser = serialize(c, f"{work}/{run}/preprocessed", f"{work}/{run}/tfrecords", image=image)
        seconds[f"{run} serialize"] = time.monotonic() - started
        outputs[run] = (pre, ser)
    pre_local, ser_local = outputs["local"]
    problems = []
    for run in runs[1:]:
        pre, ser = outputs[run]
        label = "" if run == "docker" else f" ({run})"
        problems += _same(pre_local, pre, "preprocess" + label) + _same(ser_local, ser, "serialize" + label)
    for line in problems:
        print("DIFFERENCE:", line)
    print("durations:", json.dumps({k: round(v, 1) for k, v in seconds.items()}))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], pathlib.Path(sys.argv[2]).resolve(), sys.argv[3:]))
