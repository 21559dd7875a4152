"""Memory and vCPUs of the Compute Engine machine types a CustomJob replica may run on.

Compute Engine's machine-type documentation gives each predefined type of the general-purpose
(N1, N2, N2D, E2) and compute-optimized (C2) families as vCPUs times a fixed memory per vCPU of
its class (standard, highmem, highcpu); it writes memory in "GB" meaning 2^30 bytes. The table
below is those ratios and the vCPU counts each series offers. :func:`smallest_fitting` picks the
smallest machine that holds a replica with :data:`MARGIN`: the least of vCPUs x
:data:`VCPU_WEIGHT` + GiB, a stand-in for its price.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# series → (GiB per vCPU, the vCPU counts it comes in)
_N1 = (1, 2, 4, 8, 16, 32, 64, 96)
_N2 = (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)
_E2 = (2, 4, 8, 16, 32)
SERIES: dict[str, tuple[float, tuple[int, ...]]] = {
    "n1-standard": (3.75, _N1),
    "n1-highmem": (6.5, _N1[1:]),
    "n1-highcpu": (0.9, _N1[1:]),
    "n2-standard": (4.0, _N2),
    "n2-highmem": (8.0, _N2),
    "n2-highcpu": (1.0, _N2[:-1]),
    "n2d-standard": (4.0, (*_N2, 224)),
    "n2d-highmem": (8.0, _N2[:-1]),
    "n2d-highcpu": (1.0, (*_N2, 224)),
    "e2-standard": (4.0, _E2),
    "e2-highmem": (8.0, _E2[:-1]),
    "e2-highcpu": (1.0, _E2),
    "c2-standard": (4.0, (4, 8, 16, 30, 60)),
}
# The sizes Vertex AI's custom training takes of each series (its "configure compute resources"
# page); smaller ones are Compute Engine types a CustomJob refuses, so they are never recommended.
# A series not named here (n2d) is offered whole.
VERTEX_SIZES: dict[str, tuple[int, ...]] = {
    "n1-standard": (4, 8, 16, 32, 64, 96),
    "n1-highmem": (2, 4, 8, 16, 32, 64, 96),
    "n1-highcpu": (16, 32, 64, 96),
    "n2-standard": (4, 8, 16, 32, 48, 64, 80),
    "n2-highmem": (2, 4, 8, 16, 32, 48, 64, 80),
    "n2-highcpu": (16, 32, 48, 64, 80),
    "e2-standard": (4, 8, 16, 32),
    "e2-highmem": (2, 4, 8, 16),
    "e2-highcpu": (16, 32),
    "c2-standard": (4, 8, 16, 30, 60),
}
# A replica's machine must hold the predicted peak with this much to spare: the sizing model aims
# at 20% error in memory (benchmarks/RESULTS.md, "Sizing model"), and a worker that crosses its
# machine's memory is killed, so the margin covers the model's error and a little more.
MARGIN = 1.25
# A vCPU weighs as much as this many GiB when machines are compared: N1 and N2 on-demand list
# prices charge about 7.5 times as much per vCPU-hour as per GiB-hour.
VCPU_WEIGHT = 7.5
# Kept off the workers on every machine: the kernel, the container runtime and Vertex AI's agent.
SYSTEM_RESERVE_GIB = 1.0


@dataclass(frozen=True)
class Machine:
    name: str
    vcpus: int
    memory_gib: float

    @property
    def series(self) -> str:
        return self.name.rsplit("-", 1)[0]


def all_machines(*, vertex: bool = False) -> list[Machine]:
    """Every machine of the table; ``vertex``: only the sizes Vertex AI's custom training takes."""
    return [
        Machine(f"{series}-{n}", n, per_vcpu * n)
        for series, (per_vcpu, counts) in SERIES.items()
        for n in counts
        if not vertex or n in VERTEX_SIZES.get(series, counts)
    ]


def machine(name: str) -> Machine | None:
    """The table's entry for ``name`` (None: a type the table does not know, such as a GPU family)."""
    match = re.fullmatch(r"([a-z0-9]+-[a-z]+)-(\d+)", name)
    if not match or match.group(1) not in SERIES:
        return None
    per_vcpu, counts = SERIES[match.group(1)]
    vcpus = int(match.group(2))
    return Machine(name, vcpus, per_vcpu * vcpus) if vcpus in counts else None


def usable_gib(machine: Machine) -> float:
    """What the workers of a replica may use: its memory less the system's reserve."""
    return machine.memory_gib - SYSTEM_RESERVE_GIB


def holds(machine: Machine, need_gib: float, processes: int, *, margin: float = MARGIN) -> bool:
    """Whether ``machine`` holds ``need_gib`` (a replica's workers together) with ``margin``, and
    a vCPU for each of its ``processes``."""
    return machine.vcpus >= processes and usable_gib(machine) >= need_gib * margin


def smallest_fitting(need_gib: float, processes: int, series: str | None = None) -> Machine | None:
    """The smallest machine of ``series`` (any series when None, or when ``series`` has none
    large enough) that holds ``need_gib`` with the margin; None if no machine in the table does."""
    fitting = [m for m in all_machines(vertex=True) if holds(m, need_gib, processes)]
    within = [m for m in fitting if m.series == series]
    chosen = within or fitting
    return min(chosen, key=lambda m: (m.vcpus * VCPU_WEIGHT + m.memory_gib, m.name)) if chosen else None
