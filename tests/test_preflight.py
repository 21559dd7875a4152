"""What a run asks its steps before the first one starts (pipelines/preflight.py): a local run
refuses a GPU this machine lacks; a submitted run, whose workers run elsewhere, does not."""

from __future__ import annotations

import pytest
import torch

from components import storage
from components.config import TrainingSpec
from components.config.preflight import PlannedRun
from components.errors import GnnflowError
from components.gnn.device import CudaProbe, check_device
from pipelines.local_run import demo_config
from pipelines.preflight import STEP_CHECKS, check_before_run

NO_GPU = CudaProbe(available=False, device_count=0)


def test_a_local_run_names_the_key_and_asks_for_no_accelerators():
    with pytest.raises(GnnflowError) as refused:
        check_device(TrainingSpec(device="cuda", replace=True), probe=NO_GPU, local_run=True)
    message = str(refused.value)
    assert message.startswith("training.device is cuda but this machine, where a local run's train and infer workers run, sees no GPU")
    assert "request accelerators" not in message and message.endswith("set training.device to auto or cpu")
    # A step's own check (on a replica) keeps pointing at the accelerators it should request.
    with pytest.raises(GnnflowError, match="this process sees no GPU .*request accelerators"):
        check_device(TrainingSpec(device="cuda", replace=True), probe=NO_GPU)


def test_the_run_asks_the_steps_in_dag_order():
    assert list(STEP_CHECKS) == ["preprocess", "train", "register", "infer", "export"]


def _cuda_config(tmp_path):
    config = demo_config(storage.parse_uri(tmp_path), num_nodes=100)
    return config.model_copy(update={"training": TrainingSpec(device="cuda", replace=True)})


def test_a_submitted_run_is_not_refused_for_this_machines_gpus(tmp_path):
    check_before_run(PlannedRun(_cuda_config(tmp_path), local=False))  # Vertex AI's replicas have the GPUs


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_same_run_is_refused_here_when_local(tmp_path):
    with pytest.raises(GnnflowError, match=r"training\.device is cuda but this machine"):
        check_before_run(PlannedRun(_cuda_config(tmp_path), local=True))
