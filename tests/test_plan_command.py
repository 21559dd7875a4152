"""``gnnflow plan`` (pipelines/plan_command.py) and the sizing check of run, compile and submit
(pipelines/sizing_report.py, asked by pipelines/preflight.py)."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import pytest

from components import storage
from components.config.preflight import PlannedRun
from components.errors import GnnflowError
from components.runtime.entrypoint import run_cli
from pipelines import plan_command
from pipelines.local_run import demo_config
from pipelines.preflight import check_before_run
from pipelines.sizing_report import check_compile_machines

NODES = 120


@pytest.fixture
def config_file(tmp_path):
    config = demo_config(storage.parse_uri(tmp_path), num_nodes=NODES)
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    return path


def _plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gnnflow")
    plan_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    return run_cli(lambda _: args.handler(args), [])


def test_the_text_names_the_inputs_and_a_row_per_world_size(config_file, capsys):
    assert _plan(["--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert f"nodes paper {NODES:,} x " in out and "(from the tables" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == [1, 2, 4, 8, 16, 32]
    assert all(r.rstrip(" |").split("| ")[-1].startswith("n1-standard-") for r in rows)  # the config's series (n1-standard-8)
    assert "with 25% to spare" in out


def test_json_prints_one_world_size_in_the_promised_shape(config_file, capsys):
    assert _plan(["--config", str(config_file), "--world-size", "2", "--machine-type", "n2-highmem-4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 2 and set(data["steps"]) == {"partition", "train", "infer"}
    assert set(data["steps"]["train"]) == {"peak_rss_mib_per_worker", "shm_mib_per_worker", "disk_mib", "epoch_s"}
    assert data["machine_type"] == "n2-highmem-2"  # the smallest of the series asked for that holds a small graph
    assert 0.37 * 1024 < data["steps"]["train"]["peak_rss_mib_per_worker"] < 1024  # the import floor and little data


def test_a_preprocessed_output_gives_exact_counts_and_a_wrong_one_is_named(config_file, tmp_path, capsys):
    from components.config import load_config
    from components.preprocess.step import preprocess

    out = storage.parse_uri(tmp_path / "pre")
    preprocess(load_config(config_file), out)
    assert _plan(["--config", str(config_file), "--preprocessed", str(out), "--world-size", "2"]) == 0
    text = capsys.readouterr().out
    assert "(from the preprocessed output)" in text and f"{NODES:,} x " in text
    assert _plan(["--config", str(config_file), "--preprocessed", str(tmp_path / "nothing")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    missing = "manifest.json is missing (the step that writes it never ran or did not finish)"
    assert last == f"error: {tmp_path / 'nothing'} is not a published output: {missing}"


def test_a_bad_config_is_one_line_naming_it(tmp_path, capsys):
    assert _plan(["--config", str(tmp_path / "missing.yaml")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "missing.yaml" in errors[0]
    assert _plan(["--config", str(tmp_path / "missing.yaml"), "--world-size", "0"]) == 2
    assert "--world-size 0: give 1 or more workers" in capsys.readouterr().err


def _vertex(config_file, machine: str, processes: int):
    from components.config import load_config

    config = load_config(config_file)
    resources = config.resources.model_copy(
        update={
            "runner": "vertex",
            "world_size": processes,
            "processes_per_replica": processes,
            "custom_job": config.resources.custom_job.model_copy(update={"machine_type": machine}),
        }
    )
    return config.model_copy(update={"resources": resources})


def test_a_submitted_run_refuses_a_machine_that_cannot_hold_a_replica(config_file):
    # four workers of at least the 0.45 GiB import floor each do not fit n1-highcpu-2's 1.8 GiB
    with pytest.raises(GnnflowError) as refused:
        check_before_run(PlannedRun(_vertex(config_file, "n1-highcpu-2", 4), local=False))
    message = str(refused.value)
    assert message.startswith("resources.custom_job.machine_type n1-highcpu-2 (1.8 GiB) cannot hold a replica's ")
    assert "4 worker(s) x " in message and "holds it" in message and "\n" not in message


def test_a_submitted_run_on_a_machine_that_holds_it_logs_one_line(config_file, caplog):
    with caplog.at_level(logging.INFO, logger="gnnflow.plan"):
        check_before_run(PlannedRun(_vertex(config_file, "n1-standard-8", 2), local=False))
    lines = [r.getMessage() for r in caplog.records if r.name == "gnnflow.plan"]
    assert len(lines) == 1 and lines[0].startswith("sizing at 2 worker(s): peak GiB per worker partition ")


def test_a_local_run_warns_instead_of_refusing(config_file, caplog, monkeypatch):
    from pipelines import sizing_report

    monkeypatch.setattr(sizing_report, "_machine_memory_gib", lambda: 0.5)  # a machine clearly too small
    with caplog.at_level(logging.INFO, logger="gnnflow.plan"):
        check_before_run(PlannedRun(_vertex(config_file, "n1-highcpu-2", 4), local=True))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "gnnflow.plan"]
    assert len(warnings) == 1 and warnings[0].startswith("this machine has 0.5 GiB, the 4 workers of ")


def test_compile_sizes_a_whole_config_and_lets_a_resources_only_one_through(config_file, tmp_path):
    path = tmp_path / "vertex.yaml"
    path.write_text(_vertex(config_file, "n1-highcpu-2", 4).to_yaml())
    with pytest.raises(GnnflowError, match="resources.custom_job.machine_type n1-highcpu-2"):
        check_compile_machines(str(path))
    only = tmp_path / "resources.yaml"
    only.write_text("resources:\n  runner: vertex\n  custom_job:\n    machine_type: n1-highcpu-2\n")
    assert check_compile_machines(str(only)) is None


def test_a_parquet_split_column_is_counted_and_a_csv_one_estimated(tmp_path):
    """Training seeds drive the epoch's time: a Parquet table's split column is read (one
    column), a CSV one's is the random split's share, marked as an estimate."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.config import GnnflowConfig
    from components.tables.row_counts import graph_size_from_tables

    splits = ["train"] * 37 + ["val"] * 13 + ["none"] * 150
    table = pa.table({"node_id": list(range(200)), "label": ["a", "b"] * 100, "split": splits, "f0": [0.5] * 200})
    (tmp_path / "nodes").mkdir()
    pq.write_table(table.slice(0, 120), tmp_path / "nodes" / "part-0.parquet")
    pq.write_table(table.slice(120), tmp_path / "nodes" / "part-1.parquet")
    pq.write_table(pa.table({"src": [0, 1], "dst": [1, 2]}), tmp_path / "edges.parquet")
    node = {"uri": str(tmp_path / "nodes"), "id_column": "node_id", "label_column": "label", "split_column": "split"}
    raw: dict[str, Any] = {
        "graph": {
            "nodes": [node | {"features": [{"columns": ["f0"], "transform": "passthrough"}]}],
            "edges": [{"uri": str(tmp_path / "edges.parquet"), "src_column": "src", "dst_column": "dst"}],
        }
    }
    size = graph_size_from_tables(GnnflowConfig.model_validate(raw))
    assert (size.train_seeds, size.estimated) == (37, False)
    table.to_pandas().to_csv(tmp_path / "nodes.csv", index=False)
    raw["graph"]["nodes"][0]["uri"] = str(tmp_path / "nodes.csv")
    size = graph_size_from_tables(GnnflowConfig.model_validate(raw))
    assert size.estimated and size.train_seeds == round(200 * GnnflowConfig.model_validate(raw).task.split.train)
    pq.write_table(table.drop(["split"]), tmp_path / "nodes" / "part-1.parquet")
    raw["graph"]["nodes"][0]["uri"] = str(tmp_path / "nodes")
    with pytest.raises(GnnflowError, match=r"part-1.parquet has no column 'split' \(the split_column of its table\)"):
        graph_size_from_tables(GnnflowConfig.model_validate(raw))
