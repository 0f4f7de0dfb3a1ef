"""The simulator's own model constants, in one place, with units in their names.

Everything a calibration should fit (bandwidths, latencies, launch cost, reduce efficiency) is a
topology parameter; this holds only what the simulator must assume when the topology is silent,
and its numerical tolerances.
"""

from __future__ import annotations

from hiercoll.topology.model import InterFabric

# GPU -> NIC path when the topology gives none (the topology model documents nic_gbps * 2):
# the NIC, not its PCIe path, is then the bottleneck.
DEFAULT_GPU_NIC_PER_NIC_RATIO = 2.0
EPS_BYTES = 1e-6          # a transfer this small completes instantly (no flow is created)
RATE_RTOL = 1e-12         # a recomputed rate this close to the old one keeps its wake-up
SATURATED_RTOL = 1e-12    # a link with less than this fraction of capacity left is full


def gpu_nic_gbps(inter: InterFabric) -> float:
    """GB/s of one GPU's path to its NIC."""
    return inter.gpu_nic_gbps or DEFAULT_GPU_NIC_PER_NIC_RATIO * inter.nic_gbps
