"""What NCCL runs, as a hiercoll plan: so a library row can be predicted, fitted and compared
like any other, and the auto-picker can weigh NCCL where nothing was measured.

Model (NCCL 2.2x, NVLS and CollNet off, the Simple protocol's bandwidth):
- all-reduce, reduce-scatter, all-gather: NCCL's ring. On several nodes its rings are
  rail-rotated, one per NIC, which is what hiercoll's `ring` does with channels = GPUs per node;
  on one node NCCL runs 16-32 channels, but in the fluid model channels only split a link's bytes
  (and their per-op costs overlap), so `MODEL_CHANNELS` channels reproduce its time at a fraction
  of the simulation cost. The per-step pipeline (NCCL moves each channel's share in slices of
  its 4 MiB staging buffer) is modelled by chunking the ring once a channel's share exceeds
  `SLICE_BYTES`, up to `MAX_CHUNKS`.
- all-to-all (and group collectives): NCCL's grouped send/recv to every peer, hiercoll's
  `direct`.
- Tree all-reduce (NCCL's choice for small messages on many nodes) is not modelled: a
  calibration on several nodes fits the ring's costs to tree-sized rows, and says so in its
  error, rather than pretending to a tree it does not simulate.
What it does not model is fitted: per-call cost, per-step cost and link efficiency are the
topology's calibrated costs.
"""

from __future__ import annotations

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.registry import plan
from hiercoll.schedule import Schedule
from hiercoll.topology import Topology

MODEL_CHANNELS = 4
SLICE_BYTES = 4 << 20
MAX_CHUNKS = 4
RING_KINDS = (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER)


def library_model(topology: Topology, spec: CollectiveSpec) -> Schedule:
    """The hiercoll plan standing for NCCL's own algorithm for `spec` (see the module doc)."""
    if spec.kind not in RING_KINDS:
        return plan(topology, spec, "direct")
    channels = topology.gpus_per_node if topology.num_nodes > 1 else MODEL_CHANNELS
    per_channel = spec.total_bytes // max(channels, 1)
    chunks = max(1, min(MAX_CHUNKS, per_channel // SLICE_BYTES))
    return plan(topology, spec, "ring", {"channels": channels, "chunks": chunks})
