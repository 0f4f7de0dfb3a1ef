"""What one node's tools told us, before any guess: the common shape every source parses into.

Each source (NVML, `nvidia-smi`, sysfs, `rocm-smi`) fills what it can see and leaves the rest
None; `build.py` turns the facts into a topology and names every value it had to assume."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Fabric = Literal["nvlink", "xgmi", "pcie"]

# PCIe distance between a device pair as `nvidia-smi topo -m` names it, nearest first.
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass
class GpuFacts:
    name: str
    memory_mib: int | None = None
    pci: str | None = None               # bus id, e.g. 0000:18:00.0 (lower case, 4-digit domain)
    pcie_gen: int | None = None          # max PCIe generation of the GPU's link
    pcie_width: int | None = None        # max lanes


@dataclass
class NicFacts:
    name: str                            # mlx5_0, eth0, ...
    gbps: float | None = None            # line rate per direction, 1e9 B/s
    active: bool = True
    link_layer: str | None = None        # InfiniBand, Ethernet
    pci: str | None = None
    numa: int | None = None
    gpu_level: dict[int, str] = field(default_factory=dict)   # GPU index -> PIX/PXB/.../SYS


@dataclass
class NodeFacts:
    gpus: list[GpuFacts] = field(default_factory=list)
    fabric: Fabric | None = None
    links: dict[tuple[int, int], int] = field(default_factory=dict)   # (i<j) -> parallel links
    link_gbps: float | None = None       # one NVLink/xGMI link, per direction
    links_per_gpu: int | None = None     # active NVLink links of one GPU (switch systems)
    switch: bool | None = None           # NVSwitch seen (None: the source cannot tell)
    nics: list[NicFacts] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def normalize_pci(bus_id: str) -> str:
    """`00000000:18:00.0` (nvidia-smi), `0000:18:00.0` (sysfs) -> `0000:18:00.0`."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    return ":".join(parts)
