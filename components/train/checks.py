"""What ``train`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun
from components.errors import GnnflowError

# What only training reads: an inference-only run (``--from-model``) refuses them on the command
# line, since they would change nothing (the model's architecture comes from model_spec.json).
TRAIN_ONLY_SECTIONS = ("model", "registry")
TRAIN_ONLY_KEYS = (
    "training.mode",
    "training.epochs",
    "training.batch_size",
    "training.learning_rate",
    "training.weight_decay",
    "training.weight_decay_scope",
    "training.embedding_optimizer",
    "training.embedding_learning_rate",
    "training.early_stopping_patience",
    "training.evaluate_test",
    "training.stop_at_chance_epochs",
    "training.checkpoint_every_batches",
    "training.checkpoint_every_seconds",
    "training.negative_ratio",
    "training.negatives",
)


def train_only(keys: tuple[str, ...]) -> list[str]:
    """The keys among ``keys`` that only training reads."""
    return [k for k in keys if k.split(".")[0] in TRAIN_ONLY_SECTIONS or k in TRAIN_ONLY_KEYS]


def before_run(run: PlannedRun) -> None:
    """On a local run, ``training.device`` against this machine's GPUs (the step checks again
    when it starts, where its workers run; a submitted run's workers run elsewhere). An
    inference-only run refuses overrides of what only training reads."""
    if run.model is not None and (keys := train_only(run.overridden)):
        raise GnnflowError(
            f"--from-model runs no training, so {', '.join(keys)} would change nothing: drop "
            f"{'them' if len(keys) > 1 else 'it'} (the architecture is the model's own, in its model_spec.json)"
        )
    if run.local:
        from components.gnn.device import check_device  # torch: only where a run is local, not for every `gnnflow submit`

        check_device(run.config.training, local_run=True)
