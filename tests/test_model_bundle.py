"""A published model is self-contained (components/train/bundle.py), and infer embeds fresh
tables with it (components/infer/cold_start.py, components/infer/schema_fit.py).

One planted users/items/tags graph: users and tags are featureless (learnt embeddings), items
carry features. Two models (sharded and replicated rows) are trained on the tables without a
tenth of the users and their purchases; the full tables are then preprocessed with the model's
fitted transforms, serialized and partitioned afresh (other ids, other worker counts), and
embedded: the held-back users are the cold nodes."""

from __future__ import annotations

import io
import json
import re
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from components import storage
from components.errors import GnnflowError
from components.export.inputs import read_infer_results
from components.export.vector_search import write_vector_search
from components.gnn.learnt_embeddings import shard_path
from components.infer.cold_start import install_rows_by_original_id, trained_elsewhere
from components.infer.restore import restore_model
from components.infer.schema_fit import check_model_fits
from components.infer.step import infer
from components.partition.output import METADATA_FILE, PartitionMetadata, read_metadata, read_original_ids, read_partition
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.report.step import report
from components.serialize.step import serialize
from components.train.step import train
from tests.planted_hetero import write_planted_hetero
from tests.small_graphs import with_updates

pytestmark = pytest.mark.multiworker

USERS, HELD_BACK_EVERY = 400, 10  # users u9, u19, ... (a tenth) are new after training


def _held_back(user: str) -> bool:
    return int(user[1:]) % HELD_BACK_EVERY == HELD_BACK_EVERY - 1


def _without_held_back_users(raw: dict, folder) -> dict:
    """The same config over copies of the tables without the held-back users and their purchases."""
    folder.mkdir()
    reduced = json.loads(json.dumps(raw))
    for table in (*reduced["graph"]["nodes"], *reduced["graph"]["edges"]):
        frame = pd.read_csv(table["uri"])
        column = "user_id" if table["type"] == "user" else "user" if table["type"] == "buys" else None
        if column is not None:
            frame = frame[~frame[column].map(_held_back)]
        table["uri"] = str(folder / f"{table['type']}.csv")
        frame.to_csv(table["uri"], index=False)
    return reduced


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Two models trained on the reduced tables (2 workers), and partitions of the full tables
    made with their fitted transforms for 1 and 2 workers."""
    folder = tmp_path_factory.mktemp("bundle")
    raw = write_planted_hetero(folder / "tables", users=USERS, items=200, tags=30, item_features=True)
    raw["resources"] = {"world_size": 2}
    raw["training"] = {"epochs": 1, "batch_size": 256, "early_stopping_patience": None}
    reduced = _without_held_back_users(raw, folder / "reduced")
    root = storage.parse_uri(folder)
    config = with_updates(reduced)
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    parts = partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
    models = {
        "sharded": train(config, root.join("parts"), root.join("model-sharded")),
        "replicated": train(with_updates(reduced, model={"learnt_embeddings": "replicated"}), root.join("parts"), root.join("model-rep")),
    }
    full = with_updates(raw)
    fitted = models["sharded"].read_json("transform_state.json")
    preprocess(full, root.join("pre-full"), fitted_state=fitted)
    serialize(full, root.join("pre-full"), root.join("tfr-full"))
    fresh_parts = {n: partition(root.join("tfr-full"), root.join(f"parts-full-{n}"), full.partition, world_size=n) for n in (1, 2)}
    return {"raw": raw, "root": root, "parts": parts, "models": models, "fresh": fresh_parts}


def _config(raw: dict, world_size: int):
    return with_updates(raw, resources={"world_size": world_size})


def _trained_rows(model: storage.PublishedOutput, node_type: str, replicated: bool) -> dict[str, torch.Tensor]:
    """Original id → trained row, read independently of infer's code."""
    rows = {}
    if replicated:
        state = torch.load(io.BytesIO(model.read_bytes("model.pt")), weights_only=True)
        table = state[f"encoder.embedding.{node_type}.weight"]
    for path in model.files_under(f"learnt_embeddings/{node_type}"):
        if "/ids-" not in path:
            continue
        ids = pq.read_table(io.BytesIO(model.read_bytes(path))).to_pydict()
        if not replicated:
            saved = torch.load(io.BytesIO(model.read_bytes(path.replace("ids-", "shard-").replace(".parquet", ".pt"))), weights_only=True)
            table = torch.zeros(saved["start"] + len(saved["rows"]), saved["rows"].shape[1])
            table[saved["start"] :] = saved["rows"]
        rows |= {original: table[node_id] for node_id, original in zip(ids["node_id"], ids["original_id"], strict=True)}
    return rows


def test_a_published_model_holds_its_transforms_schema_and_id_maps(fresh):
    root, parts = fresh["root"], fresh["parts"]
    preprocessed = storage.open_published(root.join("pre"), step="preprocess")
    for kind, model in fresh["models"].items():
        assert model.read_bytes("transform_state.json") == preprocessed.read_bytes("transform_state.json"), kind
        assert model.read_bytes("graph_schema.json") == preprocessed.read_bytes("graph_schema.json"), kind
        assert model.manifest.metadata["source_generation"] == parts.manifest.generation
        counts = read_metadata(parts).node_counts
        for node_type in ("user", "tag"):  # the featureless types; items have features and no id map
            paths = [p for p in model.files_under(f"learnt_embeddings/{node_type}") if "/ids-" in p]
            assert paths == [f"learnt_embeddings/{node_type}/ids-{r:05d}.parquet" for r in (0, 1)], (kind, paths)
            first = 0
            for rank, path in enumerate(paths):
                table = pq.read_table(io.BytesIO(model.read_bytes(path)))
                assert table.schema.field("node_id").type == "int64" and table.schema.field("original_id").type == "string"
                assert table.column("node_id").to_pylist() == list(range(first, first + counts[node_type][rank]))
                assert table.column("original_id").to_pylist() == list(read_original_ids(parts, rank, node_type))
                if kind == "sharded":
                    saved = torch.load(io.BytesIO(model.read_bytes(shard_path(node_type, rank))), weights_only=True)
                    assert saved["start"] == first and len(saved["rows"]) == table.num_rows
                first += table.num_rows
            trained = USERS - USERS // HELD_BACK_EVERY if node_type == "user" else 30
            assert first == trained == sum(counts[node_type])
        assert not model.files_under("learnt_embeddings/item")
    assert not fresh["models"]["replicated"].files_under("learnt_embeddings/user")[0].endswith(".pt")


@pytest.mark.parametrize("kind", ["sharded", "replicated"])
def test_warm_nodes_get_their_trained_rows_and_cold_ones_the_mean(fresh, kind):
    """The rows a worker installs for its own nodes of fresh partitions (in process, both workers'
    partitions): a trained row by original id, or the mean of the type's trained rows."""
    model, partitions = fresh["models"][kind], fresh["fresh"][2]
    assert trained_elsewhere(model, partitions) and not trained_elsewhere(model, fresh["parts"])
    config = _config(fresh["raw"], 2)
    rows = _trained_rows(model, "user", kind == "replicated")
    mean = torch.stack(list(rows.values())).mean(dim=0)
    metadata = read_metadata(partitions)
    schema, edge_dir = metadata.schema, "out" if metadata.edge_assignment == "src" else "in"
    seen_cold = 0
    for rank in (0, 1):
        part = read_partition(partitions, rank)
        restored = restore_model(model, schema, config, edge_dir, trained_elsewhere=True)
        cold = install_rows_by_original_id(model, restored, part, partitions)
        assert set(cold) == {"user", "tag"} and not cold["tag"].any()
        originals = read_original_ids(partitions, rank, "user")
        if kind == "sharded":
            installed = part.nodes["user"]["features"]
        else:
            installed = restored.module.encoder.embedding["user"].weight[part.node_offset("user") :][: len(originals)]
        for original, row, is_cold in zip(originals, installed, cold["user"].tolist(), strict=True):
            assert is_cold == _held_back(original), original
            assert torch.allclose(row, mean, atol=1e-6) if is_cold else torch.equal(row, rows[original]), original
        seen_cold += int(cold["user"].sum())
    assert seen_cold == USERS // HELD_BACK_EVERY


@pytest.mark.parametrize(("kind", "world_size"), [("sharded", 2), ("replicated", 1)])
def test_infer_on_fresh_partitions_marks_and_counts_the_cold_nodes(fresh, kind, world_size, tmp_path):
    """The sharded model (trained on 2 workers) embeds fresh partitions of other ids with 2, the
    replicated one with 1: every node of the full tables once, keyed by its original id."""
    published = infer(_config(fresh["raw"], world_size), fresh["fresh"][world_size].root, fresh["models"][kind].root, tmp_path / "emb")
    metrics = published.read_json("metrics.json")
    held = USERS // HELD_BACK_EVERY
    assert metrics["cold_nodes"] == metrics["cold_nodes.user"] == held and metrics["cold_nodes.tag"] == 0, metrics
    assert "cold_nodes.item" not in metrics and metrics["test_count"] > 0
    tables = {
        t: pd.concat([pq.read_table(io.BytesIO(published.read_bytes(p))).to_pandas() for p in published.files_under(f"embeddings/{t}")])
        for t in ("user", "item", "tag")
    }
    assert sorted(tables["user"]["node_id"]) == sorted(f"u{u}" for u in range(USERS))
    assert (tables["user"]["cold"] == tables["user"]["node_id"].map(_held_back)).all()
    assert len(tables["item"]) == 200 and not tables["item"]["cold"].any() and not tables["tag"]["cold"].any()
    # Cold users start from one row; their neighbourhoods tell them apart.
    cold = np.stack(tables["user"][tables["user"]["cold"]]["embedding"].to_numpy())
    assert len(np.unique(cold.round(5), axis=0)) == held
    # Export and report read the shards with their extra column.
    results = read_infer_results(published.root)
    assert all(files.columns[-1] == "cold" for files in results.embeddings.values())
    written = write_vector_search(storage.OutputStaging(storage.parse_uri(tmp_path / "vs"), "export"), results)
    assert written.rows == USERS + 200 + 30
    page = report(_config(fresh["raw"], world_size), fresh["models"][kind].root, published.root, tmp_path / "report")
    assert page.read_json("metrics.json")["test_count"] == metrics["test_count"]


def _handmade(fresh, tmp_path, change) -> storage.Uri:
    """A partition output (metadata only: the check reads nothing else) of the fresh graph, changed."""
    real = read_metadata(fresh["fresh"][1])
    graph = json.loads(json.dumps(real.graph))
    change(graph)
    out = storage.parse_uri(tmp_path / "parts")
    with storage.staged_output(out, "partition") as staging:
        staging.write_bytes(METADATA_FILE, PartitionMetadata(1, "src", real.node_counts, real.edge_counts, graph).to_json().encode())
        staging.publish()
    return out


def _rename(graph: dict, old: str, new: list[str]) -> None:
    names = graph["node_types"]["item"]["feature_names"]
    at = names.index(old)
    graph["node_types"]["item"]["feature_names"] = [*names[:at], *new, *names[at + 1 :]]


MISFITS = {
    "missing column": (lambda g: _rename(g, "c7", []), r"feature column 'c7' of node type 'item' is missing from the data$"),
    "renamed column": (
        lambda g: _rename(g, "c7", ["d7"]),
        r"feature column 'c7' of node type 'item' is missing from the data \(the data has 'd7' instead\)$",
    ),
    "other width": (
        lambda g: _rename(g, "c7", ["c7=a", "c7=b", "c7=<other>"]),
        r"node type 'item', feature column 'c7': the model was trained on width 1, the data has width 3$",
    ),
    "node type gone": (
        lambda g: g["node_types"].pop("tag"),
        r"node type 'tag' is gone: the model was trained on it, the data has 'user', 'item'$",
    ),
    "relation gone": (lambda g: g["edge_types"].pop("item__tagged__tag"), r"relation 'item__tagged__tag' \(item -tagged-> tag\) is gone"),
}


@pytest.mark.parametrize("case", list(MISFITS))
def test_a_model_that_does_not_fit_the_data_is_refused_before_any_worker_starts(fresh, tmp_path, case):
    change, reason = MISFITS[case]
    parts = _handmade(fresh, tmp_path, change)
    model = fresh["models"]["sharded"]
    with pytest.raises(
        GnnflowError, match=f"^{re.escape(str(model.root))} does not fit the data of {re.escape(str(parts))}: {reason}"
    ) as error:
        infer(_config(fresh["raw"], 1), parts, model.root, tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_model_without_a_schema_keeps_the_checks_it_had(fresh, tmp_path):
    """A model published before models carried their schema and lineage: no schema check, and its
    partitions are taken to be its own (install_learnt_rows refuses others, as before)."""
    old = tmp_path / "old-model"
    shutil.copytree(str(fresh["models"]["sharded"].root), old)
    manifest = json.loads((old / "manifest.json").read_text())
    for name in ("graph_schema.json", "transform_state.json"):
        del manifest["files"][name]
    del manifest["metadata"]["source_generation"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    model, partitions = storage.open_published(old, step="train"), fresh["fresh"][1]
    changed = _handmade(fresh, tmp_path, lambda g: g["node_types"].pop("tag"))
    check_model_fits(model, read_metadata(storage.open_published(changed)).schema, changed)  # nothing to compare with
    assert not trained_elsewhere(model, partitions)


def test_train_refuses_partitions_it_cannot_trace_to_a_preprocess_run(fresh, tmp_path):
    """Before any worker starts: the partitions' source gone, its own source re-published since, or
    no source recorded (partitions made by hand)."""
    config = with_updates(fresh["raw"], training={"epochs": 1})
    copy = tmp_path / "parts"
    shutil.copytree(str(fresh["parts"].root), copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["metadata"]["source"] = str(tmp_path / "gone")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    gone = re.escape(str(tmp_path / "gone"))
    with pytest.raises(
        GnnflowError, match=f"^cannot open {gone}, the serialize output {re.escape(str(copy))} was made from: .*not a published"
    ):
        train(config, copy, tmp_path / "model")
    # The preprocess output re-published since the TFRecords were made from it: its transforms may not be theirs.
    tfrecords = tmp_path / "tfr"
    shutil.copytree(str(fresh["root"].join("tfr")), tfrecords)
    serialized = json.loads((tfrecords / "manifest.json").read_text())
    serialized["metadata"]["source_generation"] = "gen-earlier"
    (tfrecords / "manifest.json").write_text(json.dumps(serialized))
    manifest["metadata"]["source"] = str(tfrecords)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    preprocessed = re.escape(str(fresh["root"].join("pre")))
    with pytest.raises(
        GnnflowError,
        match=f"^{preprocessed} was published again .* after {re.escape(str(tfrecords))} was made from its generation gen-earlier",
    ):
        train(config, copy, tmp_path / "model")
    del manifest["metadata"]["source"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(GnnflowError, match=f"^{re.escape(str(copy / 'manifest.json'))} names no serialize output it was made from"):
        train(config, copy, tmp_path / "model")
    assert not (tmp_path / "model").exists()
