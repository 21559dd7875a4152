"""What Vertex AI would refuse about a CustomJob's machines, found when the pipeline is compiled.

Vertex AI checks a replica's machine type, accelerators and boot disk only when the job is
created: in a pipeline that is after preprocess and serialize have run, often hours in. The
rules here are Compute Engine's (which accelerator attaches to which machine family and in
which counts; which families boot only from Hyperdisk) as its GPU and disk documentation
states them. Pairs the tables do not know (a newer family or accelerator) are let through for
Vertex AI to judge: these tables refuse only what is known to fail.
"""

from __future__ import annotations

import re

from components.config import ResourcesSpec
from components.config.resources import BootDiskType
from components.errors import GnnflowError

_KEY = "resources.custom_job"

# accelerator → {machine type pattern: accelerator counts it takes}
_ATTACHABLE = {1, 2, 4}  # GPUs attached to N1 machines
ACCELERATOR_MACHINES: dict[str, dict[str, set[int]]] = {
    "NVIDIA_TESLA_T4": {r"n1-.+": _ATTACHABLE},
    "NVIDIA_TESLA_P4": {r"n1-.+": _ATTACHABLE},
    "NVIDIA_TESLA_P100": {r"n1-.+": _ATTACHABLE},
    "NVIDIA_TESLA_V100": {r"n1-.+": {1, 2, 4, 8}},
    "NVIDIA_TESLA_K80": {r"n1-.+": {1, 2, 4, 8}},
    "NVIDIA_TESLA_A100": {**{f"a2-highgpu-{n}g": {n} for n in (1, 2, 4, 8)}, "a2-megagpu-16g": {16}},
    "NVIDIA_A100_80GB": {f"a2-ultragpu-{n}g": {n} for n in (1, 2, 4, 8)},
    "NVIDIA_L4": {
        **{f"g2-standard-{n}": {1} for n in (4, 8, 12, 16, 32)},
        "g2-standard-24": {2},
        "g2-standard-48": {4},
        "g2-standard-96": {8},
    },
    "NVIDIA_H100_80GB": {f"a3-highgpu-{n}g": {n} for n in (1, 2, 4, 8)},
    "NVIDIA_H100_MEGA_80GB": {"a3-megagpu-8g": {8}},
    "NVIDIA_H200_141GB": {"a3-ultragpu-8g": {8}},
    "NVIDIA_B200": {"a4-highgpu-8g": {8}},
}
# Families whose machines come with their GPUs: a replica of one without accelerator_type is refused.
GPU_FAMILIES = ("a2", "a3", "a4", "g2")
# Families (or machine type prefixes) that boot only from Hyperdisk, and families that cannot.
HYPERDISK_ONLY = ("c4", "c4a", "c4d", "n4", "a4", "a4x", "x4", "m4", "a3-ultragpu")
NO_HYPERDISK = ("n1", "e2", "a2")


def check_custom_job_machines(resources: ResourcesSpec) -> BootDiskType:
    """Refuses what Vertex AI would refuse about the replicas' machines; returns their boot disk type.

    Raises:
        GnnflowError: naming the key (``resources.custom_job.machine_type`` and so on) and what
            would work instead.
    """
    spec = resources.custom_job
    machine = spec.machine_type
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)+", machine):
        raise GnnflowError(f"{_KEY}.machine_type {machine!r} is not a Compute Engine machine type (like n1-standard-8, g2-standard-12)")
    family = machine.split("-")[0]
    _check_accelerator_pair(machine, family, spec.accelerator_type, spec.accelerator_count)
    _check_processes_fit(resources, machine, spec.accelerator_type, spec.accelerator_count)
    return _boot_disk_type(machine, family, spec.boot_disk_type)


def _check_accelerator_pair(machine: str, family: str, accelerator: str | None, count: int) -> None:
    if accelerator is None:
        if family in GPU_FAMILIES:
            fitting = [(name, counts) for name, machines in ACCELERATOR_MACHINES.items() if (counts := _counts(machines, machine))]
            hint = f"{_KEY}.accelerator_type {fitting[0][0]} with accelerator_count {_listed(fitting[0][1])}" if fitting else "its GPUs"
            raise GnnflowError(f"{_KEY}.machine_type {machine!r} comes with GPUs: set {hint}")
        return
    if accelerator.startswith("TPU_"):
        raise GnnflowError(f"{_KEY}.accelerator_type {accelerator!r}: gnnflow's steps run on CPUs or NVIDIA GPUs, not TPUs")
    machines = ACCELERATOR_MACHINES.get(accelerator)
    if machines is None:
        return  # an accelerator these tables do not know: Vertex AI judges the pair
    counts = _counts(machines, machine)
    if counts is None:
        hosts = ", ".join(pattern.replace(".+", "*") for pattern in machines)
        raise GnnflowError(
            f"{_KEY}.machine_type {machine!r} does not take {_KEY}.accelerator_type {accelerator}: {accelerator} runs on {hosts}"
        )
    if count not in counts:
        raise GnnflowError(f"{_KEY}.accelerator_count {count}: {machine} takes {_listed(counts)} {accelerator} per machine")


def _listed(counts: set[int]) -> str:
    return " or ".join(str(n) for n in sorted(counts))


def _counts(machines: dict[str, set[int]], machine: str) -> set[int] | None:
    return next((counts for pattern, counts in machines.items() if re.fullmatch(pattern, machine)), None)


def _check_processes_fit(resources: ResourcesSpec, machine: str, accelerator: str | None, count: int) -> None:
    """Each worker process of a replica needs a GPU of its own, and at least one vCPU."""
    per_replica = resources.processes_per_replica
    if accelerator is not None and per_replica > count:
        raise GnnflowError(
            f"resources.processes_per_replica {per_replica} is more than {_KEY}.accelerator_count {count}: "
            "each worker process of a replica takes one GPU"
        )
    vcpus = re.fullmatch(r"[a-z0-9]+-(?:standard|highmem|highcpu|megamem|ultramem)-(\d+)", machine)
    if vcpus and per_replica > int(vcpus.group(1)):
        raise GnnflowError(f"resources.processes_per_replica {per_replica} is more than the {vcpus.group(1)} vCPUs of {machine}")


def _boot_disk_type(machine: str, family: str, chosen: BootDiskType | None) -> BootDiskType:
    hyperdisk_only = family in HYPERDISK_ONLY or any(machine.startswith(prefix + "-") for prefix in HYPERDISK_ONLY if "-" in prefix)
    if chosen is None:
        return "hyperdisk-balanced" if hyperdisk_only else "pd-ssd"
    if hyperdisk_only and chosen != "hyperdisk-balanced":
        raise GnnflowError(f"{_KEY}.boot_disk_type {chosen!r}: {machine} boots only from Hyperdisk; use hyperdisk-balanced")
    if family in NO_HYPERDISK and chosen == "hyperdisk-balanced":
        raise GnnflowError(f"{_KEY}.boot_disk_type 'hyperdisk-balanced': {family} machines take no Hyperdisk; use pd-ssd or pd-standard")
    return chosen
