"""containers/dag_tasks_ran.py, the part of containers/check_kfp_docker.sh that requires every
task of the compiled DAG to have run in a container of the image: on the real compiled spec, and
on logs and run folders laid out as kfp.local leaves them."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest

from pipelines.dag import compile_pipeline

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "containers" / "dag_tasks_ran.py"
STEPS = ["infer", "partition", "preprocess", "report", "serialize", "train"]


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dag_tasks_ran", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while being defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    folder = tmp_path_factory.mktemp("specs")
    specs = {"plain": folder / "pipeline.yaml", "export": folder / "export.yaml"}
    compile_pipeline(str(specs["plain"]), "localhost/gnnflow-check/step:cpu")
    compile_pipeline(str(specs["export"]), "localhost/gnnflow-check/step:cpu", export=True)
    return specs


def test_reads_the_task_list_of_the_compiled_dag(compiled):
    check = load_check()
    assert check.dag_tasks(check.load_spec(compiled["plain"].read_text())) == STEPS
    assert check.dag_tasks(check.load_spec(compiled["export"].read_text())) == sorted([*STEPS, "export"])
    nested = {
        "components": {"comp-inner": {"dag": {"tasks": {"a": {}, "b": {"componentRef": {"name": "comp-leaf"}}}}}, "comp-leaf": {}},
        "root": {"dag": {"tasks": {"outer": {"componentRef": {"name": "comp-inner"}}, "c": {}}}},
    }
    assert check.dag_tasks(nested) == ["a", "b", "c"], "a task whose component is a DAG stands for its own tasks"


def kfp_local_run(root: pathlib.Path, tasks: list[str], containers: list[str], written: list[str]) -> pathlib.Path:
    """A log and a run folder as `gnnflow run --via kfp-docker` leaves them (colours removed):
    every task started; `Found image` for those in ``containers``; files in ``written``'s folders."""
    lines = ["INFO - Running pipeline: 'gnnflow'"]
    for task in tasks:
        lines.append(f"12:00:00.000 - INFO - Executing task '{task}'")
        if task in containers:
            lines += ["Found image 'localhost/gnnflow-check/step:cpu:latest'", "", f"step {task} output"]
        lines.append(f"12:00:01.000 - INFO - Task '{task}' finished with status SUCCESS")
    log = root / "kfp.plain.log"
    log.write_text("\n".join(lines) + "\n")
    run = root / "kfp" / "gnnflow-2026-11-27-12-00-00-000000"
    for task in tasks:
        (run / task).mkdir(parents=True)
        if task in written:
            (run / task / "output").write_text("x")
    return log


def run_check(spec: pathlib.Path, log: pathlib.Path, root: pathlib.Path, uid: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(spec), str(log), str(root / "kfp"), "--uid", str(uid)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_passes_when_every_task_ran_in_a_container(tmp_path, compiled):
    log = kfp_local_run(tmp_path, STEPS, containers=STEPS, written=STEPS)
    result = run_check(compiled["plain"], log, tmp_path, os.getuid())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == f"6 of 6 tasks of the DAG ran in a container: {', '.join(STEPS)}"


def test_fails_naming_the_tasks_without_a_container(tmp_path, compiled):
    """One container for the whole run is not enough: every task of the DAG must have had its own."""
    log = kfp_local_run(tmp_path, STEPS, containers=["preprocess"], written=STEPS)
    result = run_check(compiled["plain"], log, tmp_path, os.getuid())
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == (
        "missing: 1 of 6 tasks of the DAG ran in a container; none ran for: infer, partition, report, serialize, train"
    )
    assert "  train        container started by kfp.local: NO;" in result.stdout


def test_fails_when_a_task_of_the_spec_never_ran_or_wrote_as_the_image_user(tmp_path, compiled):
    ran = [s for s in STEPS if s != "report"]
    log = kfp_local_run(tmp_path, ran, containers=ran, written=[s for s in ran if s != "train"])
    result = run_check(compiled["export"], log, tmp_path, os.getuid())
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == ("missing: 4 of 7 tasks of the DAG ran in a container; none ran for: export, report, train")
    # Written by another user (this machine's, not the image's): not the image's doing.
    other = run_check(compiled["plain"], log, tmp_path, os.getuid() + 1)
    assert other.returncode == 1 and other.stdout.splitlines()[-1].startswith("missing: 0 of 6 tasks")
