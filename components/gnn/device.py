"""Where a train or infer worker computes: every device decision in one place.

``training.device`` (auto, cpu, cuda), the worker's local rank and what the machine offers
(:class:`CudaProbe`: CUDA usable, GPUs visible, ``CUDA_VISIBLE_DEVICES``) resolve into one
frozen :class:`Placement`: the torch device, the process-group backend, and how GLT holds the
partition (graph mode, feature placement, the GPU/pinned-host split of feature rows). The steps
only read it. On the CPU it is exactly the setting gnnflow always used (gloo, GLT graph mode
``CPU``, features as plain CPU tensors), so CPU runs stay bit-identical.

On CUDA the default process group is ``cpu:gloo,cuda:nccl``: DDP's gradient all-reduce on GPU
tensors goes over nccl, while everything the steps reduce on host tensors (metrics, the
collectives of ``components/runtime/collectives.py``, object broadcasts, barriers) keeps going over gloo
in the same group. NCCL refuses two ranks on one GPU, so where a machine runs more workers than
it has GPUs the group is gloo alone (gloo all-reduces GPU tensors too, through the host). GLT's
RPC is torch RPC (TensorPipe) and needs no process group either way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from components.config import TrainingSpec
from components.config.steps import GPU_SAMPLER_LIMITS
from components.errors import GnnflowError

if TYPE_CHECKING:
    from components.runtime.launcher import WorkerContext

log = logging.getLogger("gnnflow.device")

CPU_BACKEND = "gloo"
CUDA_BACKEND = "cpu:gloo,cuda:nccl"  # torch dispatches each collective by its tensors' device
_GRAPH_MODES = {"pinned_host": "ZERO_COPY", "gpu": "CUDA"}  # training.gpu_graph_placement → GLT graph mode
ASK_FOR_ACCELERATORS = (
    "request accelerators (resources.requests / resources.custom_job accelerator_type) or set training.device to auto or cpu"
)


@dataclass(frozen=True)
class CudaProbe:
    """What this process sees of the machine's GPUs."""

    available: bool  # torch.cuda.is_available()
    device_count: int  # GPUs visible (after CUDA_VISIBLE_DEVICES)
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as set, None when unset

    @staticmethod
    def of_this_process(environ: Mapping[str, str] = os.environ) -> CudaProbe:
        available = torch.cuda.is_available()
        return CudaProbe(available, torch.cuda.device_count() if available else 0, environ.get("CUDA_VISIBLE_DEVICES"))


@dataclass(frozen=True)
class Placement:
    """Where one worker computes and how GLT holds its partition.

    device: the torch device of the model and batches (``cuda:<i>`` or ``cpu``).
    backend: what ``torch.distributed.init_process_group`` is given (see the module docstring).
    graph_mode: GLT ``Graph`` mode of the partition's adjacency: CPU, ZERO_COPY or CUDA.
    feature_with_gpu: GLT features as ``UnifiedTensor`` looked up on the GPU (False: CPU tensors).
    gpu_feature_fraction: share of feature rows in GPU memory (GLT ``split_ratio``); the rest is
        pinned host memory. 0 on the CPU.
    shared_by: workers of this machine that use the same GPU (1 on the CPU).
    """

    device: torch.device
    backend: str
    graph_mode: str
    feature_with_gpu: bool
    gpu_feature_fraction: float
    visible_devices: str | None = None
    shared_by: int = 1

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def cuda_index(self) -> int | None:
        """The GPU's index among the visible ones (None on the CPU)."""
        return self.device.index if self.on_cuda else None

    @property
    def ddp_device_ids(self) -> list[int] | None:
        """``DistributedDataParallel(device_ids=...)``: this worker's GPU, None on the CPU."""
        return [self.cuda_index] if self.on_cuda else None  # type: ignore[list-item]

    def activate(self) -> None:
        """Makes the worker's GPU the current one (before nccl and GLT pick "the current device")."""
        if self.on_cuda:
            torch.cuda.set_device(self.device)

    def glt_graph_args(self) -> dict[str, Any]:
        """Keyword arguments of GLT's ``init_graph`` that place the adjacency."""
        return {"graph_mode": self.graph_mode, **({"device": self.cuda_index} if self.on_cuda else {})}

    def glt_feature_args(self) -> dict[str, Any]:
        """Keyword arguments of GLT's ``init_node_features`` / ``init_edge_features``.

        Without device groups GLT would copy the GPU part to every visible GPU; a worker needs
        it on its own only (its peers hold other partitions).
        """
        if not self.feature_with_gpu:
            return {"with_gpu": False}
        from graphlearn_torch.data.feature import DeviceGroup

        index = self.cuda_index
        return {
            "with_gpu": True,
            "split_ratio": self.gpu_feature_fraction,
            "device": index,
            "device_group_list": [DeviceGroup(index, [index])],
        }

    def sampling_devices(self, count: int) -> list[torch.device]:
        """Devices of a loader's ``count`` GLT sampling subprocesses (multiprocess sampling)."""
        return [self.device] * count

    def to_host(self, value: Any) -> Any:
        """``value`` (a tensor, or dicts/lists of them, e.g. a state_dict) with every tensor on the
        CPU, for writing; ``value`` itself when this worker computes on the CPU."""
        return _host_copy(value) if self.on_cuda else value

    def describe(self) -> str:
        """One line for the log."""
        if not self.on_cuda:
            return "device cpu, process group gloo, GLT sampling on the CPU"
        physical = physical_gpu(self.cuda_index or 0, self.visible_devices)
        named = f" (GPU {physical} of CUDA_VISIBLE_DEVICES={self.visible_devices})" if physical is not None else ""
        where = f"{self.device}{named}"
        shared = f", shared by {self.shared_by} workers" if self.shared_by > 1 else ""
        graph = {"ZERO_COPY": "pinned host memory", "CUDA": "GPU memory"}[self.graph_mode]
        ddp = (
            "DDP over nccl (host collectives over gloo)" if self.backend == CUDA_BACKEND else "DDP over gloo (nccl needs a GPU per worker)"
        )
        return (
            f"device {where}{shared}, {ddp}, GLT sampling on the GPU with the graph in {graph} and "
            f"{self.gpu_feature_fraction:.0%} of the feature rows in GPU memory"
        )


CPU_PLACEMENT = Placement(torch.device("cpu"), CPU_BACKEND, "CPU", False, 0.0)


def cuda_index(local_rank: int, device_count: int) -> int:
    """The visible GPU a worker uses: its local rank modulo the GPUs visible (workers share
    GPUs round-robin when a machine runs more workers than it has GPUs)."""
    if device_count < 1:
        raise ValueError(f"no GPU visible (device_count {device_count})")
    return local_rank % device_count


def physical_gpu(index: int, visible_devices: str | None) -> str | None:
    """The entry of ``CUDA_VISIBLE_DEVICES`` (a GPU number or UUID) behind visible GPU ``index``;
    None where the variable is unset or does not list that many."""
    if not visible_devices:
        return None
    entries = [entry.strip() for entry in visible_devices.split(",") if entry.strip()]
    return entries[index] if index < len(entries) else None


def resolve_placement(
    training: TrainingSpec, local_rank: int, local_world_size: int = 1, probe: CudaProbe | None = None, rank: int | None = None
) -> Placement:
    """The placement of the worker with ``local_rank`` on its machine (``local_world_size``
    workers there), for ``training.device`` and what ``probe`` (default: this process) sees.

    Raises:
        GnnflowError: ``training.device`` is cuda and no GPU is visible.
    """
    probe = probe if probe is not None else CudaProbe.of_this_process()
    usable = probe.available and probe.device_count > 0
    if training.device == "cpu" or (training.device == "auto" and not usable):
        return CPU_PLACEMENT
    if not usable:
        raise _no_gpu(f"worker rank {rank}" if rank is not None else "this process", probe, ASK_FOR_ACCELERATORS)
    index = cuda_index(local_rank, probe.device_count)
    shared_by = len([r for r in range(max(local_world_size, 1)) if r % probe.device_count == index])
    # Every machine of a job runs as many workers on as many GPUs, so all ranks pick the same backend.
    backend = CUDA_BACKEND if local_world_size <= probe.device_count else CPU_BACKEND
    return Placement(
        torch.device("cuda", index),
        backend,
        _GRAPH_MODES[training.gpu_graph_placement],
        True,
        training.gpu_feature_fraction,
        probe.visible_devices,
        shared_by,
    )


def worker_placement(training: TrainingSpec, ctx: WorkerContext) -> Placement:
    """The placement of a train or infer worker, its GPU made current and the choice logged;
    call it before joining the process group (its backend depends on it)."""
    placement = resolve_placement(training, ctx.local_rank, ctx.local_world_size, rank=ctx.rank)
    placement.activate()
    log.info("placement: %s", placement.describe())
    return placement


def check_device(training: TrainingSpec, probe: CudaProbe | None = None, local_run: bool = False) -> None:
    """Fails before any worker starts when ``training.device`` is cuda and this machine (where
    the step's workers run) shows no GPU, or when ``auto`` finds one for sampled training that
    asks for distinct neighbours, which only the CPU sampler draws; workers check again themselves.

    ``local_run``: asked by a local run (``gnnflow run``) before its first step, whose train and
    infer workers will run on this machine: the message says so, and asks for no accelerators.
    """
    if training.device == "cuda" and local_run:
        probe = probe if probe is not None else CudaProbe.of_this_process()
        if not (probe.available and probe.device_count > 0):
            raise _no_gpu("this machine, where a local run's train and infer workers run,", probe, "set training.device to auto or cpu")
    if training.device == "cuda":
        resolve_placement(training, 0, probe=probe)
    elif training.device == "auto" and training.mode == "sampled" and not training.replace:
        if resolve_placement(training, 0, probe=probe).on_cuda:
            raise GnnflowError(f"training.device auto found a GPU: {GPU_SAMPLER_LIMITS}")


def _no_gpu(who: str, probe: CudaProbe, remedy: str) -> GnnflowError:
    hidden = f"; CUDA_VISIBLE_DEVICES={probe.visible_devices!r}" if probe.visible_devices is not None else ""
    return GnnflowError(f"training.device is cuda but {who} sees no GPU (torch.cuda.is_available() is {probe.available}{hidden}): {remedy}")


def _host_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        copied = type(value)((key, _host_copy(item)) for key, item in value.items())
        if hasattr(value, "_metadata"):  # a state_dict's module versions, read back by load_state_dict
            copied._metadata = value._metadata  # type: ignore[attr-defined]
        return copied
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(item) for item in value)
    return value
