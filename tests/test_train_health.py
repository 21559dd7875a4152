"""Training health (components/train/health.py): a run whose training loss stays at chance, what
predicting the trained labels' shares scores, fails the step naming the knobs, and publishes nothing."""

from __future__ import annotations

import math

import pytest
import torch

from components import storage
from components.errors import GnnflowError
from components.gnn.metrics import label_entropy
from components.runtime.launcher import WorkerFailed
from components.train import health
from components.train.step import train
from tests.small_graphs import with_updates

pytestmark = pytest.mark.multiworker


def test_chance_is_the_entropy_of_the_label_shares():
    assert label_entropy(torch.tensor([5, 5])) == pytest.approx(math.log(2))
    assert label_entropy(torch.tensor([20] * 6)) == pytest.approx(math.log(6))
    assert label_entropy(torch.tensor([0, 7, 0])) == 0.0
    assert label_entropy(torch.tensor([1, 3])) == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def test_the_check_needs_epochs_and_steps_at_chance():
    chance = math.log(2)
    assert health.at_chance(0.6931, chance) and health.at_chance(0.98 * chance, chance) and health.at_chance(0.8, chance)
    assert not health.at_chance(0.97 * chance, chance) and not health.at_chance(0.5, 0.0)
    health.check_learning(4, 400, 0.6931, chance, 5, "link_prediction")  # fewer epochs than the limit
    health.check_learning(5, 49, 0.6931, chance, 5, "link_prediction")  # one step an epoch: too few steps yet
    health.check_learning(50, 400, 0.6931, chance, None, "link_prediction")  # switched off
    with pytest.raises(GnnflowError) as raised:
        health.check_learning(5, 50, 0.6931, chance, 5, "link_prediction")
    message = str(raised.value)
    assert "within 2% of chance for the last 5 epochs (50 optimizer steps; loss 0.6931, chance 0.6931" in message
    assert "model.decoder" in message and "training.stop_at_chance_epochs: null" in message


def test_a_model_that_does_not_learn_fails_the_step_and_publishes_nothing(tmp_path, one_sided_validation):
    raw, partitions, _ = one_sided_validation
    # A learning rate of 1e-7 leaves the model where it started: the loss stays at chance (about
    # ln 5). About 35 batches an epoch and worker: 5 epochs hold well over 50 steps.
    config = with_updates(raw, training={"learning_rate": 1e-7, "batch_size": 4, "epochs": 20})
    with pytest.raises(WorkerFailed) as raised:
        train(config, partitions, tmp_path / "model")
    message = str(raised.value)
    assert "the training loss stayed within 2% of chance for the last 5 epochs" in message, message
    assert "training.learning_rate" in message and "training.stop_at_chance_epochs: null" in message, message
    with pytest.raises(GnnflowError, match="is not a published output"):
        storage.open_published(tmp_path / "model", step="train")


def test_a_batch_without_a_labelled_seed_adds_nothing_to_the_loss(tmp_path, one_sided_validation):
    """The demo graph's training split holds unlabelled nodes; one seed a batch makes some batches
    hold no label at all. Their loss is 0 (an empty mean would be nan and poison the epoch's)."""
    from components.partition.output import read_partition
    from components.schema import NO_LABEL, SPLIT_CODES

    raw, partitions, _ = one_sided_validation
    published = storage.open_published(partitions, step="partition")
    unlabelled = 0
    for index in range(2):
        nodes = read_partition(published, index).nodes["paper"]
        unlabelled += int(((nodes["split"] == SPLIT_CODES["train"]) & (nodes["label"].reshape(-1) == NO_LABEL)).sum())
    assert unlabelled > 0
    model = train(with_updates(raw, training={"batch_size": 1, "epochs": 1}), partitions, tmp_path / "model")
    lines = model.read_bytes("metrics.jsonl").decode().splitlines()
    losses = [float(line.split('"loss": ')[1].split(",")[0]) for line in lines]
    assert len(losses) == 1 and all(math.isfinite(loss) and loss > 0 for loss in losses), losses
