"""The folder and gs:// model registry, its conditional-write primitives, the evaluation gate, model
references and ``gnnflow models list|promote|rollback``: each on a tmp folder and on the
fake-gcs-server (the ``root`` fixture), races included."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest

from components import storage
from components.errors import GnnflowError
from components.registry.base import AliasChange, ModelVersion
from components.registry.commands import list_versions, promote, rollback, rollback_target
from components.registry.gate import evaluate_gate
from components.registry.open import check_registry_location, open_registry, resolve_model_reference
from components.registry.store import FolderRegistry
from components.storage import DamagedFile, Uri

METRICS = {"val_accuracy": 0.8, "val_macro_f1": 0.7, "test_accuracy": 0.79, "best_epoch": 3}


def publish_model(uri: Uri, metrics: dict[str, Any], payload: bytes = b"weights") -> storage.PublishedOutput:
    """A minimal published train output: model.pt, metrics.json and a nested file."""
    staging = storage.OutputStaging(uri, "train")
    staging.write_bytes("model.pt", payload)
    staging.write_json("metrics.json", metrics)
    staging.write_bytes("learnt_embeddings/user/shard-00000.pt", b"rows")
    return staging.publish(counts={"epochs": 3}, metadata={"task": "node_classification"})


def register(registry: FolderRegistry, root: Uri, name: str, metrics: dict[str, Any] | None = None) -> ModelVersion:
    model = publish_model(root.join("runs", name, "model"), metrics or METRICS, payload=name.encode())
    return registry.register(str(model.root), metrics or METRICS, data_version="sha256:d", lineage={"t": "f"}, config_yaml="a: 1\n")


def run_together(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Runs ``work(i)`` on ``count`` threads released at once; returns their results in order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def body(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# ----------------------------------------------------------------------- conditional writes


def test_create_exclusive_creates_once_and_never_overwrites(root: Uri) -> None:
    target = root.join("a", "claim.json")
    assert storage.create_exclusive(target, b"first")
    assert not storage.create_exclusive(target, b"second")
    assert storage.read_bytes(target) == b"first"
    assert storage.create_exclusive(target, b"first")  # what a retry of the same write finds: its own bytes


def test_write_if_version_refuses_a_stale_token(root: Uri) -> None:
    target = root.join("aliases.json")
    assert storage.read_with_version(target) is None
    assert storage.write_if_version(target, b"1", None)
    assert not storage.write_if_version(target, b"x", None)  # None: only while there is no file
    data, token = storage.read_with_version(target)  # type: ignore[misc]
    assert data == b"1"
    assert storage.write_if_version(target, b"2", token)
    assert not storage.write_if_version(target, b"3", token)  # the token of a version that is gone
    assert storage.read_bytes(target) == b"2"


def test_racing_creators_get_exactly_one_success(root: Uri) -> None:
    target = root.join("v1", "version.json")
    won = run_together(6, lambda i: storage.create_exclusive(target, f"writer {i}".encode()))
    assert sum(won) == 1
    assert storage.read_bytes(target) == f"writer {won.index(True)}".encode()


def test_racing_updates_lose_no_change(root: Uri) -> None:
    target = root.join("history.jsonl")
    run_together(
        5, lambda i: [storage.update_atomically(target, lambda cur, i=i, k=k: (cur or b"") + f"{i}-{k}\n".encode()) for k in range(3)]
    )
    lines = storage.read_text(target).splitlines()
    assert sorted(lines) == sorted(f"{i}-{k}" for i in range(5) for k in range(3))


# ----------------------------------------------------------------------- the folder registry


def test_register_copies_the_model_and_records_the_version(root: Uri) -> None:
    registry = FolderRegistry.open(str(root.join("registry")), create=True)
    version = register(registry, root, "run1")
    assert (version.version, version.name, version.aliases) == (1, "v1", ())
    assert version.model_uri == str(root.join("registry", "versions", "v1", "model"))
    assert version.source_model_uri == str(root.join("runs", "run1", "model"))
    assert (version.metrics, version.data_version, version.lineage, version.config_yaml) == (METRICS, "sha256:d", {"t": "f"}, "a: 1\n")
    record = json.loads(storage.read_bytes(root.join("registry", "versions", "v1", "version.json")))
    assert "aliases" not in record and record["version"] == 1
    assert json.loads(storage.read_bytes(root.join("registry", "aliases.json"))) == {}
    # The registry's copy is a published output of its own, checked as read, and outlives the run.
    storage.delete_prefix(root.join("runs"))
    copy = storage.open_published(version.model_uri, step="train")
    assert copy.read_bytes("model.pt") == b"run1"
    assert copy.read_bytes("learnt_embeddings/user/shard-00000.pt") == b"rows"
    assert copy.manifest.counts == {"epochs": 3}
    assert registry.versions() == [version]


def test_registering_the_same_generation_again_returns_its_version(root: Uri) -> None:
    registry = FolderRegistry.open(str(root.join("registry")), create=True)
    model = publish_model(root.join("model"), METRICS)
    first = registry.register(str(model.root), METRICS, data_version="", lineage={}, config_yaml="")
    again = registry.register(str(model.root), METRICS, data_version="", lineage={}, config_yaml="")
    publish_model(root.join("model"), METRICS)  # a new generation at the same URI is a new model
    third = registry.register(str(model.root), METRICS, data_version="", lineage={}, config_yaml="")
    assert (first.version, again.version, third.version) == (1, 1, 2)


def test_racing_registrations_get_distinct_versions(root: Uri) -> None:
    registry_uri = str(root.join("registry"))
    FolderRegistry.open(registry_uri, create=True)
    models = [publish_model(root.join("runs", f"r{i}"), METRICS, payload=f"m{i}".encode()) for i in range(4)]

    def register_one(i: int) -> int:
        registry = FolderRegistry.open(registry_uri, create=False)
        return registry.register(str(models[i].root), METRICS, data_version="", lineage={}, config_yaml="").version

    numbers = run_together(4, register_one)
    assert sorted(numbers) == [1, 2, 3, 4]
    versions = FolderRegistry.open(registry_uri, create=False).versions()
    for v in versions:  # each number holds the model of the writer that claimed it
        assert storage.open_published(v.model_uri).read_bytes("model.pt") == f"m{numbers.index(v.version)}".encode()


def test_racing_alias_moves_are_all_recorded(root: Uri) -> None:
    registry = FolderRegistry.open(str(root.join("registry")), create=True)
    for i in range(3):
        register(registry, root, f"r{i}")
    changes = run_together(3, lambda i: registry.set_alias(f"alias{i}", i + 1, f"reason {i}"))
    assert json.loads(storage.read_bytes(root.join("registry", "aliases.json"))) == {"alias0": 1, "alias1": 2, "alias2": 3}
    assert sorted(registry.history(), key=lambda c: c.alias) == changes


def test_a_damaged_model_is_not_registered(root: Uri) -> None:
    registry = FolderRegistry.open(str(root.join("registry")), create=True)
    model = publish_model(root.join("model"), METRICS)
    storage.write_bytes(model.uri("model.pt"), b"WEIGHTS")  # same size, other bytes
    with pytest.raises(DamagedFile, match=r"model\.pt is damaged"):
        registry.register(str(model.root), METRICS, data_version="", lineage={}, config_yaml="")
    assert storage.list_files(root.join("registry", "versions")) == []
    assert register(registry, root, "good").version == 1  # the number was given back


def test_resolve_versions_aliases_and_latest(root: Uri) -> None:
    uri = str(root.join("registry"))
    registry = FolderRegistry.open(uri, create=True)
    with pytest.raises(GnnflowError, match=rf"^{uri}@latest: the registry holds no versions yet$"):
        registry.resolve("latest")
    for name in ("a", "b", "c"):
        register(registry, root, name)
    registry.set_alias("blessed", 2, "first")
    assert registry.resolve("v3").version == 3
    assert registry.resolve("latest").version == 3
    assert registry.resolve("blessed").aliases == ("blessed",)
    assert resolve_model_reference(f"{uri}@blessed") == registry.resolve("v2").model_uri
    assert resolve_model_reference(f"{uri}@v1") == str(root.join("registry", "versions", "v1", "model"))
    assert resolve_model_reference(str(root.join("runs", "a", "model"))) == str(root.join("runs", "a", "model"))
    with pytest.raises(GnnflowError, match=rf"^{uri}@v7: no such version \(the registry holds v1, v2, v3\)$"):
        resolve_model_reference(f"{uri}@v7")
    with pytest.raises(GnnflowError, match=rf"^{uri}@candidate: no version has the alias 'candidate' yet \(aliases set: blessed\)$"):
        resolve_model_reference(f"{uri}@candidate")
    with pytest.raises(GnnflowError, match=rf"^{uri}@v0: versions are numbered from v1$"):
        registry.resolve("v0")
    with pytest.raises(GnnflowError, match=r"^.*@v9: no such version \(the registry holds v1, v2, v3\)$"):
        registry.set_alias("blessed", 9, "nope")


def test_a_registry_that_does_not_exist_is_named(root: Uri) -> None:
    missing = str(root.join("nowhere"))
    with pytest.raises(GnnflowError, match=rf"^model registry {missing} does not exist: no aliases.json there"):
        open_registry(missing, create=False)
    with pytest.raises(GnnflowError, match=rf"^model registry {missing} does not exist"):
        resolve_model_reference(f"{missing}@blessed")
    assert storage.list_files(root) == []  # opening without create writes nothing


def test_a_registry_is_not_made_inside_other_files(root: Uri) -> None:
    publish_model(root.join("run"), METRICS)
    with pytest.raises(GnnflowError, match=r"cannot be created: it already holds other files .* but no aliases.json"):
        open_registry(str(root.join("run")), create=True)
    with pytest.raises(GnnflowError, match=r"cannot be created: it already holds other files"):
        check_registry_location(str(root.join("run")))


def test_a_missing_bucket_is_named(gcs_emulator: object) -> None:
    uri = "gs://no-such-bucket-for-registry/models"
    with pytest.raises(GnnflowError, match=rf"^model registry {uri} does not exist: there is no bucket gs://no-such-bucket-for-registry$"):
        open_registry(uri, create=False)
    with pytest.raises(
        GnnflowError, match=rf"^model registry {uri} cannot be created: bucket gs://no-such-bucket-for-registry does not exist$"
    ):
        open_registry(uri, create=True)
    with pytest.raises(GnnflowError, match=r"bucket gs://no-such-bucket-for-registry does not exist"):
        check_registry_location(uri)


def test_a_local_registry_under_a_file_is_refused(tmp_path: Any) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(GnnflowError, match=rf"^model registry {tmp_path}/file/reg cannot be created: {tmp_path}/file is a file$"):
        check_registry_location(str(tmp_path / "file" / "reg"))
    check_registry_location(str(tmp_path / "new" / "reg"))  # creatable: nothing raised, nothing written
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------- the gate


def blessed_version(number: int, **metrics: float) -> ModelVersion:
    return ModelVersion(version=number, model_uri="m", metrics=metrics, created="t", aliases=("blessed",))


def test_gate_passes_when_nothing_is_blessed() -> None:
    decision = evaluate_gate(METRICS, None, "val_accuracy", 0.0, candidate_version=1)
    assert (decision.passed, decision.candidate, decision.blessed, decision.blessed_version) == (True, 0.8, None, None)
    assert decision.reason == "v1 passes the gate: nothing is blessed yet (val_accuracy 0.8)"


def test_gate_compares_against_the_blessed_version_with_the_allowed_drop() -> None:
    blessed = blessed_version(2, val_accuracy=0.82)
    worse = evaluate_gate(METRICS, blessed, "val_accuracy", 0.0, candidate_version=3)
    assert (worse.passed, worse.blessed, worse.blessed_version) == (False, 0.82, 2)
    assert worse.reason == "v3 fails the gate: val_accuracy 0.8 < blessed v2's 0.82"
    within = evaluate_gate(METRICS, blessed, "val_accuracy", 0.02, candidate_version=3)
    assert within.passed  # 0.8 >= 0.82 - 0.02, exactly at the edge
    assert within.reason == "v3 passes the gate: val_accuracy 0.8 >= blessed v2's 0.82 - max_drop 0.02 = 0.8"
    beyond = evaluate_gate(METRICS, blessed, "val_accuracy", 0.019, candidate_version=3)
    assert not beyond.passed and "< blessed v2's 0.82 - max_drop 0.019 = 0.801" in beyond.reason
    better = evaluate_gate({"val_roc_auc": 0.9}, blessed_version(1, val_roc_auc=0.85), "val_roc_auc", 0.0)
    assert better.passed and better.reason == "the candidate passes the gate: val_roc_auc 0.9 >= blessed v1's 0.85"


def test_gate_refuses_what_it_cannot_compare() -> None:
    with pytest.raises(
        GnnflowError, match=r"^v4 has no 'val_roc_auc' in its metrics \(validation metrics there: val_accuracy, val_macro_f1\)$"
    ):
        evaluate_gate(METRICS, None, "val_roc_auc", 0.0, candidate_version=4)
    nan = evaluate_gate({"val_accuracy": math.nan}, None, "val_accuracy", 0.0)
    assert not nan.passed and nan.reason == "the candidate fails the gate: its val_accuracy is NaN"
    unrecorded = evaluate_gate(METRICS, blessed_version(1, val_roc_auc=0.9), "val_accuracy", 0.0, candidate_version=2)
    assert not unrecorded.passed and "the blessed v1 records no val_accuracy" in unrecorded.reason


# ----------------------------------------------------------------------- gnnflow models


def test_list_prints_versions_metrics_and_aliases(root: Uri) -> None:
    uri = str(root.join("registry"))
    registry = FolderRegistry.open(uri, create=True)
    assert list_versions(uri) == f"{uri} holds no versions yet"
    assert json.loads(list_versions(uri, as_json=True)) == []
    register(registry, root, "a")
    register(registry, root, "b", {**METRICS, "val_accuracy": 0.85})
    registry.set_alias("blessed", 2, "better")
    lines = list_versions(uri).splitlines()
    assert lines[0].split() == ["version", "created", "val_accuracy", "val_macro_f1", "aliases", "model_uri"]
    assert lines[1].split()[0] == "v1" and lines[1].split()[3:] == ["0.8000", "0.7000", "-", f"{uri}/versions/v1/model"]
    assert lines[2].split()[3:] == ["0.8500", "0.7000", "blessed", f"{uri}/versions/v2/model"]
    listed = json.loads(list_versions(uri, as_json=True))
    assert [(v["version"], v["aliases"], v["metrics"]["val_accuracy"]) for v in listed] == [("v1", [], 0.8), ("v2", ["blessed"], 0.85)]
    assert listed[0]["model_uri"] == f"{uri}/versions/v1/model" and listed[0]["lineage"] == {"t": "f"}


def test_promote_and_rollback_move_the_alias_and_record_why(root: Uri) -> None:
    uri = str(root.join("registry"))
    registry = FolderRegistry.open(uri, create=True)
    for name in ("a", "b", "c", "d"):
        register(registry, root, name)
    assert promote(uri, "v1", "first") == f"{uri}: blessed moved from unset to v1 (first)"
    assert promote(uri, "v2", "better") == f"{uri}: blessed moved from v1 to v2 (better)"
    assert promote(uri, "v3", "better still") == f"{uri}: blessed moved from v2 to v3 (better still)"
    assert promote(uri, "v3", "again") == f"{uri}: blessed already points at v3; nothing moved"
    assert rollback(uri, None, "v3 drifts") == f"{uri}: blessed moved from v3 to v2 (v3 drifts)"
    assert promote(uri, "v4", "new") == f"{uri}: blessed moved from v2 to v4 (new)"
    # Rolled back from v3 earlier: the rollback from v4 returns to v2, then to v1.
    assert rollback(uri, None, "v4 too") == f"{uri}: blessed moved from v4 to v2 (v4 too)"
    assert rollback(uri, None, "and v2") == f"{uri}: blessed moved from v2 to v1 (and v2)"
    with pytest.raises(GnnflowError, match=rf"^{uri}: no version was blessed before v1; give --to vN to choose one$"):
        rollback(uri, None, "nothing left")
    assert rollback(uri, "v3", "by hand") == f"{uri}: blessed moved from v1 to v3 (by hand)"
    history = [json.loads(line) for line in storage.read_text(root.join("registry", "history.jsonl")).splitlines()]
    assert [(h["version"], h["previous"], h["reason"]) for h in history] == [
        (1, None, "first"),
        (2, 1, "better"),
        (3, 2, "better still"),
        (2, 3, "v3 drifts"),
        (4, 2, "new"),
        (2, 4, "v4 too"),
        (1, 2, "and v2"),
        (3, 1, "by hand"),
    ]
    assert all(h["alias"] == "blessed" and h["at"] for h in history)


def test_moves_need_a_reason_and_an_existing_version(root: Uri) -> None:
    uri = str(root.join("registry"))
    registry = FolderRegistry.open(uri, create=True)
    register(registry, root, "a")
    for reason in (None, "  "):
        with pytest.raises(GnnflowError, match=r"^give --reason TEXT: why the alias moves \(it is recorded in the registry's history\)$"):
            promote(uri, "v1", reason)
        with pytest.raises(GnnflowError, match=r"^give --reason TEXT"):
            rollback(uri, None, reason)
    with pytest.raises(GnnflowError, match=rf"^{uri}@v5: no such version \(the registry holds v1\)$"):
        promote(uri, "v5", "why")
    with pytest.raises(GnnflowError, match=r"^'blessed' is not a version: give vN"):
        promote(uri, "blessed", "why")
    with pytest.raises(GnnflowError, match=rf"^{uri}: no version is blessed, so there is nothing to roll back$"):
        rollback(uri, None, "why")
    with pytest.raises(GnnflowError, match=rf"^model registry {uri}x does not exist"):
        promote(uri + "x", "v1", "why")
    assert registry.history() == []


def test_rollback_target_reads_the_history_as_a_stack() -> None:
    def moves(*versions: int) -> list[AliasChange]:
        return [AliasChange("blessed", v, None, "r", "t") for v in versions]

    assert rollback_target(moves(1, 2, 3), "blessed", 3) == 2
    assert rollback_target(moves(1, 2, 3, 2), "blessed", 2) == 1
    assert rollback_target(moves(1, 2, 3, 1), "blessed", 1) is None  # promoting v1 again popped v2 and v3
    assert rollback_target(moves(1), "blessed", 1) is None
    other = [AliasChange("blessed", 1, None, "r", "t"), AliasChange("canary", 2, None, "r", "t")]
    assert rollback_target(other, "blessed", 1) is None
    # A history that does not end at the alias (moved elsewhere): the move that brought it here.
    assert rollback_target([AliasChange("blessed", 5, 4, "r", "t")], "blessed", 5) == 4


def test_vertex_uris_open_the_vertex_backend() -> None:
    """``vertex://`` goes to components.registry.vertex (its own tests run it against the recorder)."""
    pytest.importorskip("components.registry.vertex")
    with pytest.raises(GnnflowError, match=r"^registry 'vertex://nowhere': not a Vertex AI Model Registry model"):
        open_registry("vertex://nowhere", create=False)
    check_registry_location("vertex://projects/p/locations/r/models/m")  # checked where it is opened: nothing here
