"""The topology's cost parameters a calibration may fit: where each lives, its unit and bounds.

Each parameter is a dotted path into the topology file (`costs.eager.call_us`,
`intra.latency_us`, ...), so a fitted value is written back where a user would look for it and
the calibrated file has the same schema as any other. Bounds keep the fit physical; a parameter
the measurements cannot see is reported as such and keeps its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hiercoll.topology import Topology


@dataclass(frozen=True)
class FitParam:
    path: str          # dotted path in the topology (and its JSON/YAML file)
    unit: str
    lo: float
    hi: float
    doc: str
    log_scale: bool    # fitted as log(value): times and rates span decades

    def get(self, topology: Topology) -> float | None:
        """The value in `topology`; None where the parameter is unset (no limit)."""
        node: Any = topology
        for part in self.path.split("."):
            node = getattr(node, part)
        return None if node is None else float(node)


def _p(path: str, unit: str, lo: float, hi: float, doc: str, log_scale: bool = True) -> FitParam:
    return FitParam(path, unit, lo, hi, doc, log_scale)


# Time floors use lo > 0 so that log scale works; a fitted value at the floor means "about zero".
PARAMS: tuple[FitParam, ...] = (
    _p("costs.eager.call_us", "us", 0.05, 5000.0,
       "per call in eager mode: host launch of the call, argument checks, first kernel start"),
    _p("costs.graph.call_us", "us", 0.05, 5000.0,
       "per call replayed from a CUDA graph: graph launch and the first kernel's start"),
    _p("costs.eager.issue_us", "us", 0.01, 500.0,
       "host time per kernel launch in eager mode (consecutive SM ops of a channel share one; "
       "ranks that share a host thread add up)"),
    _p("costs.eager.ce_issue_us", "us", 0.01, 500.0,
       "host time per copy-engine op in eager mode (fence launch, copy, signal launch)"),
    _p("costs.launch_us", "us", 0.01, 200.0,
       "per op on the device: kernel or row start, signal wait round trip"),
    _p("costs.sync_us", "us", 0.01, 200.0,
       "per call of the cuda backend's simple protocol: its start and end barriers (rows whose "
       "lowering knobs say which protocol ran)"),
    _p("costs.barrier_row_us", "us", 0.01, 200.0,
       "per barrier half a simple call's fused kernel walks as a row of its own (its first or "
       "last level splits the grid)"),
    _p("costs.ll_unpack_us", "us", 0.01, 200.0,
       "per LL call whose receivers unpack pushes into their output (all-gather, all-to-all)"),
    _p("costs.ll_launch_us", "us", 0.01, 200.0,
       "per op of an LL call on the device: a row of pushes that waits for no reply (rows "
       "whose lowering knobs say LL ran)"),
    _p("costs.ce_launch_us", "us", 0.01, 200.0,
       "per copy-engine op on the device: fence kernel, copy start, signal kernel"),
    _p("intra.latency_us", "us", 0.01, 100.0, "one-hop latency of a transfer inside a node"),
    _p("inter.latency_us", "us", 0.01, 200.0, "one-way latency between nodes"),
    _p("costs.intra_efficiency", "fraction", 0.01, 1.0,
       "fraction of the intra-node port (NVSwitch) or link (xGMI, PCIe) bandwidth transfers reach"),
    _p("costs.nic_efficiency", "fraction", 0.01, 1.0,
       "fraction of the NIC bandwidth inter-node transfers reach"),
    _p("costs.pull_efficiency", "fraction", 0.01, 1.0,
       "fraction of a link's bandwidth a reduce's reads of peer memory reach"),
    _p("costs.reduce_efficiency", "fraction", 0.01, 1.0,
       "fraction of HBM bandwidth copies and reduces reach (HBM read + write traffic)"),
    _p("costs.sm_op_gbps", "GB/s", 1.0, 20000.0,
       "most one SM-driven op (a kernel's CTAs) moves; unset: only links limit it"),
    _p("costs.ce_op_gbps", "GB/s", 1.0, 20000.0,
       "most one copy-engine copy moves; unset: only links limit it"),
    _p("costs.library.launch_us", "us", 0.01, 200.0,
       "NCCL's own per-op cost (a ring step's start and wait): the library model's launch_us"),
    _p("costs.library.intra_efficiency", "fraction", 0.01, 1.0,
       "fraction of the intra-node bandwidth NCCL's kernels reach"),
    _p("costs.library.sync_us", "us", 0.01, 200.0,
       "NCCL's Simple protocol's per-call cost on top of its LL's (set: the model times both)"),
    _p("costs.library.graph_call_us", "us", 0.05, 5000.0,
       "NCCL's own per-call cost replayed from a CUDA graph"),
    _p("costs.library.eager_call_us", "us", 0.05, 5000.0,
       "NCCL's own per-call host cost in eager mode"),
    _p("costs.ce_concurrent_gbps", "GB/s", 1.0, 20000.0,
       "what a GPU's copy engines move in all while two or more of its copies run at once; "
       "unset: no such limit"),
)
# Where a parameter is unset (None: no limit) the fit starts here.
START = {"costs.sync_us": 2.0, "costs.barrier_row_us": 0.5, "costs.ll_unpack_us": 1.0, "costs.ll_launch_us": 1.0,
         "costs.sm_op_gbps": 50.0, "costs.ce_op_gbps": 50.0, "costs.ce_launch_us": 5.0,
         "costs.ce_concurrent_gbps": 200.0, "costs.library.launch_us": 2.0,
         "costs.library.graph_call_us": 5.0, "costs.library.eager_call_us": 20.0,
         "costs.library.intra_efficiency": 1.0, "costs.library.sync_us": 5.0}
BY_PATH = {p.path: p for p in PARAMS}


def applicable(topology: Topology) -> list[FitParam]:
    """Parameters this topology has at all (no inter-node ones on one node)."""
    multi = topology.num_nodes > 1 and topology.inter is not None
    return [p for p in PARAMS if multi or not p.path.startswith(("inter.", "costs.nic_"))]


def with_values(topology: Topology, values: dict[str, float]) -> Topology:
    """A copy of `topology` with the given parameters set (validated like a loaded file)."""
    data = topology.model_dump(mode="python")
    for path, value in values.items():
        node = data
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return Topology.model_validate(data)
