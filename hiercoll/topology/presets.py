"""Built-in node types. A preset is a node type; the node count comes with it (`--nodes`).

Bandwidths are what transfers reach, not marketing numbers, where we have a measurement:
`h200x4` uses the copy-engine peer bandwidth measured on the 4xH200 host in
shared/measurements (380.5 GB/s of the 478 GB/s NVLink port); the NVSwitch presets apply the same
0.80 efficiency to their nominal NVLink bandwidth, and 0.92 to the NICs' line rate. A node is
one scale-up domain (gb200-nvl72: 72 GPUs). The tiered presets (dgx-b200, gb200-nvl72,
h100-rail-3tier) describe their scale-out fabric with `inter.tiers`; every value's public source
is in the comment above it.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.topology.model import Topology

NVLINK_EFFICIENCY = 380.5 / 478.0   # measured ring_put / nominal port on H200 (shared/measurements)
NIC_EFFICIENCY = 0.92
_RAILS_8 = {"num_nics": 8, "nic_gbps": 50.0 * NIC_EFFICIENCY, "latency_us": 3.0,
            "nic_affinity": list(range(8)), "gpu_nic_gbps": 55.0}

_NODE_TYPES: dict[str, dict[str, Any]] = {
    "h200x4": {
        "gpus_per_node": 4,
        "gpu": {"name": "H200", "hbm_gbps": 4800.0, "num_sms": 132, "memory_gib": 141.0},
        "intra": {"kind": "nvswitch", "gbps": 380.5, "latency_us": 1.0},
        "inter": _RAILS_8 | {"num_nics": 4, "nic_affinity": [0, 1, 2, 3]},
        # measured on this host (shared/measurements, ce.a2a_put at 256 MiB): copy-engine puts
        # to the three peers at once moved 199 GB/s per GPU in all, one put alone 380
        "costs": {"ce_concurrent_gbps": 199.0},
    },
    # one node of 2 H200s (the 2-GPU machines the device tool lends): bench/gpu/topologies/h200x2.yaml
    "h200x2": {
        "gpus_per_node": 2,
        "gpu": {"name": "H200", "hbm_gbps": 4800.0, "num_sms": 132, "memory_gib": 141.0},
        "intra": {"kind": "nvswitch", "gbps": 380.5, "latency_us": 1.0},
        "inter": _RAILS_8 | {"num_nics": 2, "nic_affinity": [0, 1]},
    },
    "dgx-h100": {
        "gpus_per_node": 8,
        "gpu": {"name": "H100", "hbm_gbps": 3350.0, "num_sms": 132, "memory_gib": 80.0},
        "intra": {"kind": "nvswitch", "gbps": round(450.0 * NVLINK_EFFICIENCY, 1), "latency_us": 1.0},
        "inter": _RAILS_8,
    },
    "dgx-h200": {
        "gpus_per_node": 8,
        "gpu": {"name": "H200", "hbm_gbps": 4800.0, "num_sms": 132, "memory_gib": 141.0},
        "intra": {"kind": "nvswitch", "gbps": 380.5, "latency_us": 1.0},
        "inter": _RAILS_8,
    },
    "mi300x": {
        "gpus_per_node": 8,
        "gpu": {"name": "MI300X", "hbm_gbps": 5300.0, "num_sms": 304, "memory_gib": 192.0},
        # 7 xGMI links per GPU, one to each peer, 64 GB/s per direction nominal
        "intra": {"kind": "mesh", "gbps": 64.0 * 0.8, "latency_us": 1.5, "links_per_pair": 1},
        "inter": _RAILS_8,
    },
    "pcie-8gpu": {
        "gpus_per_node": 8,
        "gpu": {"name": "L40S", "hbm_gbps": 864.0, "num_sms": 142, "memory_gib": 48.0},
        # PCIe Gen4 x16 per GPU; two GPUs' worth through the host bridge at once
        "intra": {"kind": "pcie", "gbps": 25.0, "latency_us": 3.0, "bridge_gbps": 50.0},
        "inter": {"num_nics": 2, "nic_gbps": 12.5 * NIC_EFFICIENCY, "latency_us": 5.0,
                  "nic_affinity": [0, 4], "gpu_nic_gbps": 25.0},
    },
    # DGX B200: 8 x B200 (180 GB, 8 TB/s HBM3e each: 1,440 GB and 64 TB/s per system), NVLink 5
    # at 1.8 TB/s per GPU (900 GB/s per direction) through 2 NVSwitch chips (14.4 TB/s aggregate),
    # 8 x ConnectX-7 400 Gb/s single-port cards for the compute fabric (NVIDIA DGX B200 user
    # guide, "Introduction to NVIDIA DGX B200 Systems"; nvidia.com/en-us/data-center/dgx-b200).
    # 148 SMs per B200 (Blackwell architecture whitepaper). Fabric: the DGX SuperPOD B200
    # reference architecture's rail-optimised compute fabric: a scalable unit (SU) of 32 nodes
    # with one leaf per rail (8 leaves per SU), as many leaf-spine as node-leaf cables
    # (non-blocking: 2 SU = 512 + 512 cables, 16 leaves, 8 spines); 64-port leaves (32 down, 32
    # up; Quantum-2 QM9700). The extra per-hop latency is an assumption.
    "dgx-b200": {
        "gpus_per_node": 8,
        "gpu": {"name": "B200", "hbm_gbps": 8000.0, "num_sms": 148, "memory_gib": 180.0},
        "intra": {"kind": "nvswitch", "gbps": round(900.0 * NVLINK_EFFICIENCY, 1), "latency_us": 1.0},
        "inter": _RAILS_8 | {"tiers": [
            {"name": "leaf", "group_size": 32, "rails": True, "uplinks": 32, "radix": 64,
             "latency_us": 0.5},
            {"name": "spine", "latency_us": 0.5}]},
    },
    # GB200 NVL72: one node = one NVLink domain of 72 B200 GPUs (36 GB200 superchips, 18 compute
    # trays) joined by NVLink 5 switch trays at 1.8 TB/s per GPU (900 GB/s per direction), 130
    # TB/s aggregate; about 13.4-13.8 TB HBM3e per rack (~186 GB per GPU), 8 TB/s per GPU
    # (nvidia.com/en-us/data-center/gb200-nvl72; DGX SuperPOD GB200 reference architecture).
    # Scale-out: one ConnectX-7 400 Gb/s NIC per GPU (72 per domain) into an NDR InfiniBand
    # compute fabric; the SuperPOD's scalable unit is 8 racks (576 GPUs). Modelled as a
    # non-blocking rail-optimised leaf per SU and a spine above (the RA's switch counts per SU
    # are not encoded); per-hop latencies are assumptions.
    "gb200-nvl72": {
        "gpus_per_node": 72,
        "gpu": {"name": "B200", "hbm_gbps": 8000.0, "num_sms": 148, "memory_gib": 186.0},
        "intra": {"kind": "nvswitch", "gbps": round(900.0 * NVLINK_EFFICIENCY, 1), "latency_us": 1.5},
        "inter": {"num_nics": 72, "nic_gbps": 50.0 * NIC_EFFICIENCY, "latency_us": 3.0,
                  "nic_affinity": list(range(72)), "gpu_nic_gbps": 55.0, "tiers": [
                      {"name": "leaf", "group_size": 8, "rails": True, "uplinks": 8,
                       "latency_us": 0.5},
                      {"name": "spine", "latency_us": 0.5}]},
    },
    # A rail-optimised three-layer Clos of H100 nodes (4096-24576 GPUs with --nodes 512-3072), the
    # shape of the clusters published for large training runs: rail-optimised leaves per SU of 32
    # DGX H100 nodes (one 64-port leaf per rail, 32 down / 32 up: DGX SuperPOD H100/B200 RA),
    # non-blocking pods of 8 SUs (2048 GPUs, the RA's two-tier limit of 256 nodes; Meta's pods
    # are 3072 GPUs, Llama 3 paper sec. 3.3.1), and an aggregation layer oversubscribed 7:1 as
    # in Meta's 24K-GPU RoCE cluster ("network connectivity at the aggregation layer ... has an
    # oversubscription ratio of 1:7", The Llama 3 Herd of Models, 2024). Nodes: dgx-h100's.
    # 8 spine uplinks per pod switch is a modelling choice (their speed follows from 7:1).
    "h100-rail-3tier": {
        "gpus_per_node": 8,
        "gpu": {"name": "H100", "hbm_gbps": 3350.0, "num_sms": 132, "memory_gib": 80.0},
        "intra": {"kind": "nvswitch", "gbps": round(450.0 * NVLINK_EFFICIENCY, 1), "latency_us": 1.0},
        "inter": _RAILS_8 | {"tiers": [
            {"name": "leaf", "group_size": 32, "rails": True, "uplinks": 32, "radix": 64,
             "latency_us": 0.5},
            {"name": "spine", "group_size": 8, "uplinks": 8, "oversubscription": 7.0,
             "latency_us": 0.5},
            {"name": "aggregation", "latency_us": 0.5}]},
    },
    # The one-GPU harness (`hiercoll stress/bench --one-gpu`): 4 ranks as processes on ONE H200,
    # sharing its HBM and SMs and launched by one host thread. A rank's "port" is what its
    # kernels (4 CTAs each) push; a guess of a quarter of HBM until calibrated
    # (bench/results/calibration/one_gpu_h200-2026-11-25).
    "one-gpu-h200x4": {
        "gpus_per_node": 4,
        "gpu": {"name": "H200", "hbm_gbps": 4800.0, "num_sms": 132, "memory_gib": 141.0},
        "intra": {"kind": "nvswitch", "gbps": 1200.0, "latency_us": 1.0},
        "shared_gpu": True,
    },
}

DEFAULT_NODES = {"h200x4": 1, "h200x2": 1, "one-gpu-h200x4": 1, "h100-rail-3tier": 512}


def preset_names() -> list[str]:
    return sorted(_NODE_TYPES)


# Presets whose costs were fitted to measurements (`python bench/calibration.py`): the
# calibrated topology file ships with the package and the preset takes its costs, latencies
# and provenance; `uncalibrated=True` gives the defaults back (what a re-calibration starts from).
CALIBRATED = {"h200x4": "h200x4.calibrated.yaml", "h200x2": "h200x2.calibrated.yaml",
              "one-gpu-h200x4": "one-gpu-h200x4.calibrated.yaml"}


@functools.cache
def _calibrated(name: str) -> dict[str, Any] | None:
    """The shipped calibration of a preset, read once per process (every load of the preset
    asks; callers only read the result)."""
    import importlib.resources

    import yaml
    file = CALIBRATED.get(name)
    if file is None:
        return None
    ref = importlib.resources.files("hiercoll.data") / file
    if not ref.is_file():
        return None
    data = yaml.safe_load(ref.read_text())
    return {"costs": data["costs"], "calibration": data["calibration"],
            "intra_latency_us": data["intra"]["latency_us"]}


def preset(name: str, num_nodes: int | None = None, uncalibrated: bool = False) -> Topology:
    """A preset node type times `num_nodes` (default: 1 for h200x4, else 2); calibrated where
    a calibration ships, unless `uncalibrated`."""
    if name not in _NODE_TYPES:
        raise HiercollError(f"--topology: unknown preset {name!r}; choose one of "
                            f"{', '.join(preset_names())} or give a YAML/JSON file")
    nodes = num_nodes if num_nodes is not None else DEFAULT_NODES.get(name, 2)
    if nodes < 1:
        raise HiercollError(f"--nodes: {nodes} must be >= 1")
    spec = dict(_NODE_TYPES[name])
    if spec.get("shared_gpu") and nodes != 1:
        raise HiercollError(f"--nodes: {name} is every rank on one GPU (one node); drop --nodes")
    label = name if nodes == 1 else f"{name}x{nodes}n"
    fitted = None if uncalibrated else _calibrated(name)
    if fitted is not None:
        spec |= {"costs": fitted["costs"], "calibration": fitted["calibration"],
                 "intra": spec["intra"] | {"latency_us": fitted["intra_latency_us"]}}
    try:
        return Topology.model_validate(spec | {"name": label, "num_nodes": nodes})
    except ValidationError as err:       # e.g. more ranks than MAX_WORLD_SIZE
        raise HiercollError(format_validation_error(err, "--nodes")) from None
