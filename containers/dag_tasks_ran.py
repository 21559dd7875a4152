"""Whether every task of a compiled pipeline ran in a container of the step image, for
``containers/check_kfp_docker.sh``: reads the spec (KFP IR YAML), the log of the
``gnnflow run --via kfp-docker`` that ran it (ANSI colours removed) and that run's root.

    python containers/dag_tasks_ran.py PIPELINE_YAML KFP_LOG RUN_ROOT [--uid 1000]

A task counts as run in a container when both hold:
  - kfp.local started it (``Executing task 'NAME'``) and its DockerRunner printed ``Found image``
    for it, which it does just before starting the task's container;
  - the task's folder of the run (kfp.local's layout: RUN_ROOT/gnnflow-<timestamp>/NAME/) holds
    something written by the image's user (uid 1000; the check itself runs as root).
The tasks are the leaves of the spec's root DAG, and of any DAG inside it. Prints one line per
task, then a last line that says all ran, or names the tasks that did not (exit 1).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

STARTED = re.compile(r"Executing task '([^']+)'")
CONTAINER = re.compile(r"^\s*Found image '")


@dataclass(frozen=True)
class TaskRun:
    """What the log and the run's files say about one task of the DAG."""

    name: str
    in_container: bool  # kfp.local's DockerRunner found the image and started the task's container
    written_by_image_user: bool  # the task's folder holds files of the image's uid

    @property
    def ran(self) -> bool:
        return self.in_container and self.written_by_image_user


def load_spec(text: str) -> dict[str, Any]:
    """The pipeline spec of a compiled file: its first YAML document (a second one, when there is
    one, holds platform settings such as kfp-kubernetes' volumes)."""
    for document in yaml.safe_load_all(text):
        if isinstance(document, dict) and "root" in document:
            return document
    raise ValueError("no pipeline spec (a document with a root DAG) in the compiled file")


def dag_tasks(spec: dict[str, Any]) -> list[str]:
    """The leaf tasks of the spec's root DAG (a task whose component is a DAG is replaced by its own tasks)."""
    components = spec.get("components", {})

    def leaves(dag: dict[str, Any]) -> Iterator[str]:
        for name, task in dag.get("tasks", {}).items():
            inner = components.get(task.get("componentRef", {}).get("name", ""), {}).get("dag")
            yield from leaves(inner) if inner else [name]

    return sorted(leaves(spec["root"]["dag"]))


def containerized_tasks(log: str) -> set[str]:
    """Tasks for which kfp.local printed ``Found image`` after ``Executing task`` (and before the next task)."""
    current, found = None, set()
    for line in log.splitlines():
        started = STARTED.search(line)
        if started:
            current = started.group(1)
        elif current is not None and CONTAINER.match(line):
            found.add(current)
    return found


def tasks_written_by(run_root: pathlib.Path, uid: int) -> set[str]:
    """The task folders of the newest kfp.local run under ``run_root`` that hold a path owned by ``uid``."""
    runs = sorted(run_root.glob("gnnflow-*"))
    if not runs:
        return set()
    return {
        folder.name for folder in runs[-1].iterdir() if folder.is_dir() and any(path.stat().st_uid == uid for path in folder.rglob("*"))
    }


def check(spec: dict[str, Any], log: str, run_root: pathlib.Path, uid: int = 1000) -> list[TaskRun]:
    """One ``TaskRun`` per task of the DAG, in name order."""
    in_container = containerized_tasks(log)
    written = tasks_written_by(run_root, uid)
    return [TaskRun(name, name in in_container, name in written) for name in dag_tasks(spec)]


def verdict(runs: list[TaskRun]) -> str:
    """The last line: every task ran in a container, or which did not (``missing: ...``)."""
    missing = [run.name for run in runs if not run.ran]
    if not runs:
        return "missing: the compiled pipeline has no tasks"
    if missing:
        return f"missing: {len(runs) - len(missing)} of {len(runs)} tasks of the DAG ran in a container; none ran for: {', '.join(missing)}"
    return f"{len(runs)} of {len(runs)} tasks of the DAG ran in a container: {', '.join(run.name for run in runs)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=pathlib.Path)
    parser.add_argument("log", type=pathlib.Path)
    parser.add_argument("run_root", type=pathlib.Path)
    parser.add_argument("--uid", type=int, default=1000, help="the image's user")
    args = parser.parse_args(argv)
    runs = check(load_spec(args.spec.read_text()), args.log.read_text(errors="replace"), args.run_root, args.uid)
    for run in runs:
        print(
            f"  {run.name:<12} container started by kfp.local: {'yes' if run.in_container else 'NO'}; "
            f"outputs written by uid {args.uid}: {'yes' if run.written_by_image_user else 'NO'}"
        )
    line = verdict(runs)
    print(line)
    return 1 if line.startswith("missing:") else 0


if __name__ == "__main__":
    sys.exit(main())
