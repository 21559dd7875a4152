"""Training health: a run whose training loss stays at chance is stopped with the knobs to turn.

Chance is the loss of the best constant prediction on the labels an epoch trained on: the
entropy of their class shares (node classification: ln 6 for six balanced classes; link
prediction with one random negative per positive: ln 2). A model that stays within
``CHANCE_MARGIN`` of it has learnt nothing that generalises, and its embeddings would flow on to
infer, retrieval and exports. The step fails rather than warns: a pipeline step that succeeds is
read as a model worth using, and a warning in a replica's log is seen after the cost is paid.

A run must stay there for ``training.stop_at_chance_epochs`` epochs in a row that hold at least
``MIN_STEPS_AT_CHANCE`` optimizer steps: a label set of one batch takes one step per epoch, and
its first epochs sit near chance while it starts to learn (CiteSeer's 120 labels: within 2.5 %
for four steps; benchmarks/RESULTS.md).
"""

from __future__ import annotations

from components.errors import GnnflowError
from components.train.checkpoint import TrainingState

CHANCE_MARGIN = 0.02
MIN_STEPS_AT_CHANCE = 50


def at_chance(loss: float, chance: float) -> bool:
    """Whether an epoch's mean training loss is within CHANCE_MARGIN of chance (or above it)."""
    return chance > 0 and loss >= (1 - CHANCE_MARGIN) * chance


def count_epochs_at_chance(state: TrainingState, loss: float, chance: float, steps: int) -> None:
    """Updates ``state``'s epochs in a row (and their steps) whose training loss stayed at chance."""
    if at_chance(loss, chance):
        state.epochs_at_chance, state.steps_at_chance = state.epochs_at_chance + 1, state.steps_at_chance + steps
    else:
        state.epochs_at_chance = state.steps_at_chance = 0


def check_learning(epochs_at_chance: int, steps_at_chance: int, loss: float, chance: float, limit: int | None, task_type: str) -> None:
    """Raises when ``epochs_at_chance`` epochs in a row (``steps_at_chance`` steps) reached ``limit``."""
    if limit is None or epochs_at_chance < limit or steps_at_chance < MIN_STEPS_AT_CHANCE:
        return
    knobs = (
        "model.decoder (dot or mlp), model.dropout, training.learning_rate, training.negatives"
        if task_type == "link_prediction"
        else "training.learning_rate, model.dropout, training.weight_decay, the feature transforms"
    )
    raise GnnflowError(
        f"train: the training loss stayed within {CHANCE_MARGIN:.0%} of chance for the last {epochs_at_chance} epochs "
        f"({steps_at_chance} optimizer steps; loss {loss:.4f}, chance {chance:.4f}: what predicting the label shares "
        f"scores): the model is not learning. Likely knobs: {knobs}. Set training.stop_at_chance_epochs: null to train on."
    )
