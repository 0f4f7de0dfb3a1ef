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
- all-reduce on several nodes: NCCL's tuner picks the ring or its double binary tree
  (`planner/tree.py`) by its own cost model; the library model simulates both with the
  topology's costs and takes the faster (`TREE_KINDS`), so small and medium all-reduces across
  nodes are timed as the tree NCCL runs for them, large ones as the ring.
- engines: NCCL's kernels move every byte with SMs, never a copy engine; its model is timed
  with `sm_only(topology)`'s costs (the copy-engine threshold out of reach), or its large copies would
  take the copy engines' caps and concurrency limit instead of the SMs'.
What it does not model is fitted: per-call cost, per-step cost and link efficiency are the
topology's calibrated costs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.ll_protocol import SIMPLE, CallProtocol
from hiercoll.planner.registry import plan
from hiercoll.schedule import Schedule
from hiercoll.sim.simulate import CallMode
from hiercoll.topology import Topology

MODEL_CHANNELS = 4
SLICE_BYTES = 4 << 20
MAX_CHUNKS = 4
RING_KINDS = (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER)
TREE_KINDS = (Kind.ALL_REDUCE,)     # NCCL's tree is for all-reduce only


def sm_only(topology: Topology) -> Topology:
    """`topology` as NCCL's model is timed: no copy moved by a copy engine, and NCCL's own
    per-op and per-call costs where the topology has them calibrated (`costs.library`)."""
    return topology.model_copy(update={"costs": topology.costs.as_library()})


def library_model(topology: Topology, spec: CollectiveSpec) -> Schedule:
    """The hiercoll plan standing for NCCL's own algorithm for `spec` (see the module doc)."""
    return _candidates_and_choice(topology, spec)[0]


def library_model_timed(topology: Topology, spec: CollectiveSpec,
                        call_mode: CallMode = "eager") -> tuple[Schedule, float]:
    """NCCL's plan and its simulated time (SMs only) in `call_mode`, simulating each plan once:
    where the model chooses between ring and tree, the chosen one's time is the one it chose
    by."""
    from hiercoll.sim import simulate
    schedule, time_us = _candidates_and_choice(topology, spec, call_mode)
    if time_us is None:
        time_us = simulate(schedule, topology, mode="trusted", costs_from=sm_only(topology),
                           call_mode=call_mode, protocol=library_protocols(topology)[0]).time_us
    return schedule, time_us


def model_channels(topology: Topology) -> int:
    """The channels NCCL's model runs: one per GPU of a node (its rails) across nodes."""
    return topology.gpus_per_node if topology.num_nodes > 1 else MODEL_CHANNELS


def library_candidates(topology: Topology, spec: CollectiveSpec) -> list[Schedule]:
    """The plans NCCL chooses among for `spec` (ring, and the tree where NCCL has one): the
    choice itself depends on costs, so whoever times them with other costs (calibration's fit,
    compare) chooses again with those costs, by the same rule (`choose_fastest`)."""
    if spec.kind not in RING_KINDS:
        return [plan(topology, spec, "direct")]
    channels = model_channels(topology)
    per_channel = spec.total_bytes // max(channels, 1)
    chunks = max(1, min(MAX_CHUNKS, per_channel // SLICE_BYTES))
    ring = plan(topology, spec, "ring", {"channels": channels, "chunks": chunks})
    # a comparison column: not worth building past the op limit (8 rings on 4096 GPUs would
    # build ~500k ops a rank to check and fold; a minute a size)
    ring.check_walk("timing it as NCCL's model")
    if spec.kind not in TREE_KINDS or topology.num_nodes == 1:
        return [ring]       # NCCL's tree is for several nodes (NVLS or the ring on one)
    tree = plan(topology, spec, "tree", {"chunks": max(1, min(MAX_CHUNKS,
                                                                spec.total_bytes // SLICE_BYTES))})
    return [ring, tree]


def library_protocols(topology: Topology) -> tuple[CallProtocol | None, ...]:
    """NCCL's protocols its model chooses among: where `costs.library.sync_us` is fitted, Simple
    (that per-call cost on top) and LL (no such cost, twice the bytes on the wire), the faster
    taken as NCCL's tuner takes it; else one protocol, unmodelled (costs fitted without it)."""
    return (None,) if topology.costs.library.sync_us is None else (SIMPLE, CallProtocol(ll=True))


def library_variants(topology: Topology, candidates: Sequence[Schedule],
                     ) -> list[tuple[Schedule, CallProtocol | None]]:
    """Every (plan, protocol) NCCL's model chooses among under `topology`'s costs."""
    return [(s, p) for s in candidates for p in library_protocols(topology)]


T = TypeVar("T")


def choose_fastest(candidates: list[T], time_of: Callable[[T], float]) -> tuple[T, float | None]:
    """The one rule for NCCL's choice: the candidate `time_of` says is fastest (None: one
    candidate, nothing was timed)."""
    if len(candidates) == 1:
        return candidates[0], None
    return min(((s, time_of(s)) for s in candidates), key=lambda st: st[1])


def _candidates_and_choice(topology: Topology, spec: CollectiveSpec,
                           call_mode: CallMode = "eager") -> tuple[Schedule, float | None]:
    """The model's plan, and its simulated time where choosing it took a simulation."""
    from hiercoll.sim import simulate
    timed = sm_only(topology)
    variants = library_variants(topology, library_candidates(topology, spec))
    (schedule, _), time_us = choose_fastest(variants, lambda v: simulate(
        v[0], topology, costs_from=timed, call_mode=call_mode, protocol=v[1]).time_us)
    return schedule, time_us
