"""Device placement (components/gnn/device.py) as pure functions of the config and what the machine
shows, and the config check that refuses accelerators left idle by ``training.device: cpu``.
Runs without a GPU: the CUDA branches are resolved from a described machine (``CudaProbe``)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from components.config import TrainingSpec, parse_config
from components.errors import GnnflowError
from components.gnn.device import (
    CPU_BACKEND,
    CPU_PLACEMENT,
    CUDA_BACKEND,
    CudaProbe,
    check_device,
    cuda_index,
    physical_gpu,
    resolve_placement,
    worker_placement,
)
from components.runtime.launcher import WorkerContext, WorkerFailed, launch

pytestmark = pytest.mark.multiworker

NO_GPU = CudaProbe(available=False, device_count=0)
TWO_GPUS = CudaProbe(available=True, device_count=2, visible_devices="2,3")
MINIMAL = "graph:\n  nodes: [{uri: n.csv, label_column: y}]\n  edges: [{uri: e.csv}]\n"


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_without_a_gpu_auto_and_cpu_keep_the_cpu_setting(device):
    placement = resolve_placement(TrainingSpec(device=device), local_rank=1, local_world_size=2, probe=NO_GPU)
    assert placement == CPU_PLACEMENT
    assert placement.device == torch.device("cpu") and placement.backend == CPU_BACKEND == "gloo"
    # Exactly what the steps passed GLT before placements existed.
    assert placement.glt_graph_args() == {"graph_mode": "CPU"}
    assert placement.glt_feature_args() == {"with_gpu": False}
    assert placement.ddp_device_ids is None and placement.sampling_devices(2) == [torch.device("cpu")] * 2


def test_cpu_wins_over_visible_gpus():
    assert resolve_placement(TrainingSpec(device="cpu"), 0, probe=TWO_GPUS) == CPU_PLACEMENT


@pytest.mark.parametrize(("local_rank", "workers", "index", "shared_by"), [(0, 2, 0, 1), (1, 2, 1, 1), (2, 4, 0, 2), (3, 4, 1, 2)])
def test_workers_take_visible_gpus_by_local_rank(local_rank, workers, index, shared_by):
    placement = resolve_placement(TrainingSpec(device="auto"), local_rank, local_world_size=workers, probe=TWO_GPUS)
    assert placement.device == torch.device("cuda", index) and placement.cuda_index == index
    assert placement.shared_by == shared_by
    # nccl for DDP, gloo for host collectives; gloo alone where workers share a GPU (nccl refuses that).
    assert placement.backend == (CUDA_BACKEND if shared_by == 1 else CPU_BACKEND)
    assert CUDA_BACKEND == "cpu:gloo,cuda:nccl"
    assert placement.ddp_device_ids == [index]
    assert placement.sampling_devices(3) == [torch.device("cuda", index)] * 3
    assert placement.glt_graph_args() == {"graph_mode": "ZERO_COPY", "device": index}
    assert f"GPU {index + 2} of CUDA_VISIBLE_DEVICES=2,3" in placement.describe()


def test_gpu_settings_reach_glt():
    training = TrainingSpec(device="cuda", replace=True, gpu_feature_fraction=0.25, gpu_graph_placement="gpu")
    placement = resolve_placement(training, 1, local_world_size=2, probe=TWO_GPUS)
    assert placement.graph_mode == "CUDA" and placement.shared_by == 1
    features = placement.glt_feature_args()
    assert {k: features[k] for k in ("with_gpu", "split_ratio", "device")} == {"with_gpu": True, "split_ratio": 0.25, "device": 1}
    # The GPU part goes to this worker's GPU only, not to every visible one (GLT's default).
    (group,) = features["device_group_list"]
    assert (group.group_id, group.device_list) == (1, [1])


def test_cuda_without_a_gpu_is_an_error_naming_the_key():
    hidden = CudaProbe(available=False, device_count=0, visible_devices="")
    with pytest.raises(GnnflowError, match=r"training\.device is cuda but worker rank 3 sees no GPU .*CUDA_VISIBLE_DEVICES=''"):
        resolve_placement(TrainingSpec(device="cuda", replace=True), 1, probe=hidden, rank=3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_this_machine_fails_before_workers_start():
    assert not CudaProbe.of_this_process().available
    check_device(TrainingSpec(device="auto"))  # auto and cpu never fail
    with pytest.raises(GnnflowError, match="training.device is cuda but this process sees no GPU"):
        check_device(TrainingSpec(device="cuda", replace=True))


def placement_worker(ctx: WorkerContext, training: TrainingSpec) -> str:
    return worker_placement(training, ctx).describe()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_worker_without_a_gpu_fails_at_start_naming_the_key():
    with pytest.raises(WorkerFailed, match="worker rank 0 failed: training.device is cuda but worker rank 0 sees no GPU"):
        launch(placement_worker, (TrainingSpec(device="cuda", replace=True),), world_size=1)


def test_rank_to_gpu_and_visible_device_names():
    assert [cuda_index(rank, 3) for rank in range(5)] == [0, 1, 2, 0, 1]
    with pytest.raises(ValueError):
        cuda_index(0, 0)
    assert physical_gpu(1, "4,6") == "6"
    assert physical_gpu(0, "GPU-8f2a, GPU-11c0") == "GPU-8f2a"
    assert physical_gpu(0, None) is None and physical_gpu(2, "0,1") is None


def test_state_comes_to_the_host_with_its_metadata():
    state = OrderedDict(weight=torch.ones(2), nested={"step": torch.tensor(3)})
    state._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    assert CPU_PLACEMENT.to_host(state) is state  # on the CPU nothing is copied
    gpu = resolve_placement(TrainingSpec(device="cuda", replace=True), 0, probe=TWO_GPUS)
    copied = gpu.to_host(state)  # host tensors here, but the copy path runs all the same
    assert type(copied) is OrderedDict and copied._metadata == {"": {"version": 1}}
    assert torch.equal(copied["weight"], state["weight"]) and int(copied["nested"]["step"]) == 3
    assert gpu.to_host((torch.zeros(1), None))[1] is None


@pytest.mark.parametrize(
    ("resources", "key"),
    [
        ("requests: {accelerator_type: NVIDIA_L4}", "resources.requests.accelerator_type requests NVIDIA_L4"),
        (
            "step_requests: {train: {accelerator_type: nvidia.com/gpu, accelerator_count: 2}}",
            "resources.step_requests.train.accelerator_type requests nvidia.com/gpu",
        ),
        ("custom_job: {accelerator_type: NVIDIA_TESLA_T4}", "resources.custom_job.accelerator_type requests NVIDIA_TESLA_T4"),
    ],
)
def test_accelerators_with_device_cpu_are_refused(resources, key):
    text = MINIMAL + f"resources: {{{resources}}}\n"
    with pytest.raises(GnnflowError, match=f"{key} but training.device is cpu"):
        parse_config(text + "training: {device: cpu}\n", "gpu.yaml")
    for device in ("auto", "cuda"):  # the accelerators are used
        assert parse_config(text + f"training: {{device: {device}, replace: true}}\n", "gpu.yaml").training.device == device


def test_device_defaults():
    training = parse_config(MINIMAL, "mem.yaml").training
    assert (training.device, training.gpu_feature_fraction, training.gpu_graph_placement) == ("auto", 1.0, "pinned_host")
    with pytest.raises(GnnflowError, match="training.gpu_feature_fraction"):
        parse_config(MINIMAL + "training: {gpu_feature_fraction: 1.5}\n", "mem.yaml")


def test_types_without_feature_values_are_held_on_the_host_when_features_go_to_the_gpu():
    """GLT's GPU feature split creates no store for an empty tensor, and every lookup of such a
    type raised KeyError: a partition without nodes of a type, a featureless type (also with
    gpu_feature_fraction 0). Those types get a host ``Feature``; the rest keep GLT's stores."""
    from graphlearn_torch.data.feature import Feature

    from components.gnn.glt_dataset import _on_host_where_empty, empty_feature_types

    features = {"paper": torch.rand(4, 3), "word": torch.zeros(5, 0), "venue": torch.zeros(0, 2)}
    id2idx = {"paper": None, "word": None, "venue": None}
    assert empty_feature_types(features) == ["word", "venue"]
    gpu = resolve_placement(
        TrainingSpec(device="cuda", replace=True, gpu_feature_fraction=0.0), local_rank=0, local_world_size=1, probe=TWO_GPUS
    )
    glt_stores = {t: f"GLT's store of {t}" for t in features}
    stores = _on_host_where_empty(glt_stores, features, id2idx, gpu)
    assert stores["paper"] == "GLT's store of paper"
    assert isinstance(stores["word"], Feature) and not stores["word"].with_gpu
    assert stores["word"][torch.tensor([0, 4])].shape == (2, 0)  # the lookup that raised KeyError
    assert stores["venue"][torch.tensor([], dtype=torch.int64)].shape == (0, 2)
    homogeneous = _on_host_where_empty("GLT's store", {"paper": torch.zeros(0, 3)}, {"paper": None}, gpu)
    assert isinstance(homogeneous, Feature) and homogeneous[torch.tensor([], dtype=torch.int64)].shape == (0, 3)
    assert _on_host_where_empty(glt_stores, features, id2idx, CPU_PLACEMENT) is glt_stores  # the CPU: GLT's as they are


def test_distinct_neighbours_on_a_gpu_are_refused_naming_the_keys():
    """GLT 0.2.4's GPU sampler draws with replacement and unseeded: sampled training that asks
    for distinct neighbours (the default) on a GPU is refused, at config validation for cuda and
    before any worker starts where auto finds a GPU."""
    with pytest.raises(ValueError, match="training.replace: false needs the CPU sampler.*training.replace: true"):
        TrainingSpec(device="cuda")
    assert TrainingSpec(device="cuda", mode="full_graph").mode == "full_graph"  # samples nothing
    with pytest.raises(GnnflowError, match="training.device auto found a GPU: training.replace: false needs the CPU sampler"):
        check_device(TrainingSpec(device="auto"), probe=TWO_GPUS)
    check_device(TrainingSpec(device="auto", replace=True), probe=TWO_GPUS)
    check_device(TrainingSpec(device="auto"), probe=NO_GPU)
