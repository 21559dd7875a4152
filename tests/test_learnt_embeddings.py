"""Sharded learnt embeddings (components/gnn/learnt_embeddings.py): the sparse optimizers, the
owner's side of the exchange, and a two-worker run that trains, checkpoints, resumes, publishes
one shard per worker and infers from them (and refuses partitions the shards do not fit)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from components import storage
from components.config import ModelSpec
from components.errors import GnnflowError
from components.gnn.learnt_embeddings import EmbeddingShards, shard_path
from components.gnn.sparse_optimizers import RowAdagrad, SparseAdam, SparseRowOptimizer
from components.infer.restore import install_learnt_rows
from components.infer.step import infer
from components.partition.output import range_owner, read_partition
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.launcher import launch
from components.serialize.step import serialize
from components.train import checkpoint
from components.train.step import train
from tests.embedding_workers import served_after_owner_updates
from tests.planted_hetero import write_planted_hetero
from tests.small_graphs import with_updates


def test_sparse_adam_steps_the_rows_it_is_given_as_adam_steps_them():
    torch.manual_seed(0)
    table = torch.randn(6, 4)
    rows = torch.tensor([1, 3, 4])
    dense = torch.nn.Parameter(table[rows].clone())
    reference = torch.optim.Adam([dense], lr=0.05)
    untouched = table[[0, 2, 5]].clone()
    optimizer = SparseAdam(table, lr=0.05)
    for _ in range(3):
        grads = torch.randn(3, 4)
        optimizer.step(rows, grads)
        dense.grad = grads.clone()
        reference.step()
    assert torch.allclose(table[rows], dense.detach(), atol=1e-6)
    assert torch.equal(table[[0, 2, 5]], untouched)
    assert optimizer.steps.tolist() == [0, 3, 0, 3, 3, 0]


def test_row_adagrad_keeps_one_accumulator_per_row():
    table = torch.zeros(3, 2)
    optimizer = RowAdagrad(table, lr=0.5)
    optimizer.step(torch.tensor([2]), torch.tensor([[3.0, 4.0]]))  # mean square 12.5
    assert optimizer.sum.tolist() == [0.0, 0.0, 12.5]
    assert torch.allclose(table[2], -0.5 * torch.tensor([3.0, 4.0]) / 12.5**0.5)
    optimizer.step(torch.tensor([2]), torch.tensor([[1.0, 1.0]]))
    assert optimizer.sum[2] == pytest.approx(13.5)
    assert optimizer.nbytes() == 3 * 4  # one float per row


class _Sgd(SparseRowOptimizer):
    def step(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        self.table[rows] -= self.lr * grads

    def state(self) -> dict[str, torch.Tensor]:
        return {}


def _shards(rank: int = 1) -> EmbeddingShards:
    # Partition 1 of 2 owns ids 3..6 of the type (the range books' ends are 3 and 7).
    return EmbeddingShards({"user": torch.zeros(4, 2)}, {"user": torch.tensor([3, 7])}, rank, 2, lambda t: _Sgd(t, 1.0))


def test_the_owner_applies_gradients_by_global_id_summing_repeats():
    shards = _shards()
    shards.apply("user", torch.tensor([3, 5, 5]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 2.0]]))
    assert shards.tables["user"].tolist() == [[-1.0, 0.0], [0.0, 0.0], [0.0, -3.0], [0.0, 0.0]]


def test_a_shard_saved_for_other_ids_is_refused():
    saved = _shards(rank=1).state_dict()
    other = EmbeddingShards({"user": torch.zeros(3, 2)}, {"user": torch.tensor([3, 7])}, 0, 2, lambda t: _Sgd(t, 1.0))
    with pytest.raises(ValueError, match=r"shard.pt holds the rows of id ranges \{'user': 3\}, this worker owns \{'user': 0\}"):
        other.load_state_dict(saved, "shard.pt")


@pytest.fixture(scope="module")
def purchases(tmp_path_factory):
    """A planted users/items/tags graph (every type featureless), preprocessed and partitioned for 2 workers."""
    folder = tmp_path_factory.mktemp("purchases")
    raw = write_planted_hetero(folder / "tables", users=600, items=300, tags=60)
    raw["resources"] = {"world_size": 2}
    raw["training"] = {"batch_size": 128, "early_stopping_patience": None, "checkpoint_every_batches": 4}
    config = with_updates(raw)
    root = storage.parse_uri(folder)
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
    partition(root.join("tfr"), root.join("parts-1"), config.partition, world_size=1)
    return raw, root


@pytest.mark.multiworker
def test_two_workers_train_resume_publish_and_infer_from_their_own_shards(purchases):
    raw, root = purchases
    output = root.join("model")
    first = train(with_updates(raw, training={"epochs": 1}), root.join("parts"), output)
    first_history = first.read_bytes("metrics.jsonl").decode().splitlines()
    # Each rank wrote its shard beside the checkpoint, under the tag the state names; earlier ones are gone
    # but those of the previous checkpoint (the fallback, should this one be damaged).
    state = checkpoint.load(output, checkpoint.fingerprint(with_updates(raw, training={"epochs": 2}), _generation(root), 2))
    assert state is not None and state.embeddings_tag == "epoch-00001-batch-0000000"
    previous = output.join(checkpoint.PREVIOUS_RECORD_FILE)
    tags = {state.embeddings_tag, *(json.loads(storage.read_text(previous))["embeddings_tags"] if storage.exists(previous) else [])}
    shard_files = storage.list_files(output.join(checkpoint.SHARDS_DIR))
    assert sorted(storage.relative_to(f, output.join(checkpoint.SHARDS_DIR)) for f in shard_files) == sorted(
        f"{tag}/rank-{rank:05d}.pt" for tag in tags for rank in (0, 1)
    )
    # Each worker holds its own shard only: rows and optimizer state of its own nodes (the
    # checkpointed state is what it holds), never a replica of the table.
    counts = {"user": 600, "item": 300, "tag": 60}
    held = [_held_bytes(output, state.embeddings_tag, r, counts) for r in (0, 1)]
    published = train(with_updates(raw, training={"epochs": 2}), root.join("parts"), output)  # resumes at epoch 2
    lines = published.read_bytes("metrics.jsonl").decode().splitlines()
    assert lines[:1] == first_history  # the resumed run kept the first epoch (its timings too) and trained one more
    history = [json.loads(line) for line in lines]
    assert [line["epoch"] for line in history] == [0, 1]
    metrics = published.read_json("metrics.json")
    assert metrics["val_roc_auc"] >= 0.75, metrics

    # One shard per type and worker, together every node of the type once, each worker's own ids.
    for node_type, count in counts.items():
        shards = [torch.load(io.BytesIO(published.read_bytes(shard_path(node_type, r))), weights_only=True) for r in (0, 1)]
        assert shards[0]["start"] == 0 and shards[1]["start"] == len(shards[0]["rows"])
        assert sum(len(s["rows"]) for s in shards) == count and all(0 < len(s["rows"]) < count for s in shards)
        assert all(s["rows"].shape[1] == 64 for s in shards)
    model = torch.load(io.BytesIO(published.read_bytes("model.pt")), weights_only=True)
    assert not [k for k in model if "embedding" in k]  # no table in the dense model
    # Every epoch's line says what the embeddings cost: rows held and gradients moved.
    assert all(line["embedding_grad_mib_sent"] > 0 and line["embedding_rows_mib_fetched"] > 0 for line in history)
    # The figure is the largest worker's, in MiB rounded to 3 decimals: 1 KiB covers the rounding
    # (at most 0.0005 MiB, 524 bytes) and nothing else; a replicated table would add a whole
    # other shard (at least 30 x 260 bytes here).
    assert abs(history[0]["embedding_mib_per_worker"] * 2**20 - max(held)) <= 1024

    inferred = infer(with_updates(raw), root.join("parts"), output, root.join("emb"))
    users = [storage.read_bytes(inferred.uri(p)) for p in inferred.files_under("embeddings/user")]
    import pyarrow.parquet as pq

    ids = sorted(i for data in users for i in pq.read_table(io.BytesIO(data)).column("node_id").to_pylist())
    assert ids == sorted(f"u{u}" for u in range(600))
    assert inferred.read_json("metrics.json")["test_roc_auc"] >= 0.75

    # Partitions of another worker count do not fit the shards: an infer worker refuses them, naming the shard.
    other = read_partition(storage.open_published(root.join("parts-1"), step="partition"), 0)
    with pytest.raises(GnnflowError, match=r"learnt_embeddings/\w+/shard-00000\.pt holds \(\d+, 64\) rows from id 0, but partition 0 owns"):
        install_learnt_rows(published, ModelSpec.model_validate(json.loads(published.read_bytes("model_spec.json"))["model"]), other)


def _held_bytes(output: storage.Uri, tag: str, rank: int, counts: dict[str, int]) -> int:
    """Bytes of a worker's rows and optimizer state as its checkpoint holds them, after checking that
    every tensor covers its own rows only: fewer than the type's nodes, the two workers' together all
    of them (row_adagrad, the default: per row the hidden floats plus one accumulator)."""
    saved = checkpoint.load_shard(output, tag, rank)["shards"]
    total = 0
    for node_type, table in saved["tables"].items():
        own = table.shape[0]
        other = checkpoint.load_shard(output, tag, 1 - rank)["shards"]["tables"][node_type].shape[0]
        assert 0 < own < counts[node_type] and own + other == counts[node_type], (node_type, own, other)
        state = saved["optimizers"][node_type]
        assert all(t.shape[0] == own for t in state.values()), {k: tuple(v.shape) for k, v in state.items()}
        nbytes = table.numel() * table.element_size() + sum(t.numel() * t.element_size() for t in state.values())
        assert nbytes == own * (64 * 4 + 4), (node_type, nbytes, own)
        total += nbytes
    return total


@pytest.mark.multiworker
def test_the_owners_updates_reach_the_rows_its_peers_samplers_serve(purchases):
    """After the trainer's pushes, every row a sampler serves for a peer's node is the owner's row as
    it is now (the samplers read the table the optimizer updates in place), and most differ from the
    initial rows (the updates happened): a table whose optimizer never steps fails it."""
    raw, root = purchases
    results = launch(served_after_owner_updates, (str(root.join("parts")), raw, "user", False), world_size=2)
    checked = _check_served(results)
    assert checked["remote"] >= 100 and checked["updated"] >= 0.9 * checked["remote"], checked


def _check_served(results: list[dict]) -> dict[str, int]:
    """Every served row against its owner's table; counts of remote rows and of those the owner updated."""
    counts = {"remote": 0, "updated": 0}
    for rank, result in enumerate(results):
        for node_type, ids, rows in result["served"]:
            ends = torch.tensor([r["offsets"][node_type] + len(r["now"][node_type]) for r in results])
            owners = range_owner(torch.from_numpy(ids), ends).numpy()
            for owner in (0, 1):
                mine = owners == owner
                local = ids[mine] - results[owner]["offsets"][node_type]
                now, initial = results[owner]["now"][node_type][local], results[owner]["initial"][node_type][local]
                assert np.array_equal(rows[mine], now), f"rank {rank} served stale rows of {node_type} owned by rank {owner}"
                if owner != rank:
                    counts["remote"] += int(mine.sum())
                    counts["updated"] += int((now != initial).any(axis=1).sum())
    return counts


def _generation(root: storage.Uri) -> str:
    return storage.open_published(root.join("parts"), step="partition").manifest.generation
