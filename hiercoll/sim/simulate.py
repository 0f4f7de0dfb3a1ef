"""`simulate(schedule, topology) -> SimResult`: time a schedule on a topology."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from hiercoll.errors import HiercollError
from hiercoll.schedule import Schedule, predecessor_map
from hiercoll.sim.bounds import declared_period, lower_bound
from hiercoll.sim.engine import issue_times, run_timing
from hiercoll.sim.links import Network, Tier
from hiercoll.sim.result import LinkStat, SimResult, critical_path
from hiercoll.sim.symmetry import Symmetry, find_symmetry
from hiercoll.topology import Topology

Mode = Literal["auto", "exact", "trusted"]


@contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Planning and simulating allocate millions of small acyclic objects (ops, events); the
    cyclic collector would rescan them over and over (a third of a 4096-GPU run)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


CallMode = Literal["eager", "graph"]


def simulate(schedule: Schedule, topology: Topology, mode: Mode = "auto",
             record: bool = False, *, costs_from: Topology | None = None,
             call_mode: CallMode = "eager") -> SimResult:
    """Time `schedule` on `topology`. `mode="auto"` folds ranks that a verified translation
    symmetry makes identical (the result says so); `"exact"` simulates every rank; `"trusted"`
    folds on the planner's declaration without re-checking it (the auto-picker's inner loop:
    tests check every algorithm's declaration exhaustively).

    `call_mode`: eager calls pay the host's per-call and per-op launch costs, graph replays
    their own per-call cost (topology.costs.eager / .graph). `costs_from`: time the schedule
    with the bandwidths, latencies and costs of another topology of the same shape (what a
    calibration varies), without re-planning."""
    with _without_cyclic_gc():
        return _simulate(schedule, topology, mode, record, costs_from=costs_from, call_mode=call_mode)


def _simulate(schedule: Schedule, topology: Topology, mode: Mode, record: bool, *,
              costs_from: Topology | None, call_mode: CallMode) -> SimResult:
    schedule.refuse_library_call("simulate")
    if schedule.meta.topology_fingerprint != topology.fingerprint():
        raise HiercollError("simulate: the schedule was planned for another topology "
                            f"({schedule.meta.topology_fingerprint} != {topology.fingerprint()})")
    if costs_from is not None:
        if costs_from.shape_fingerprint() != topology.shape_fingerprint():
            raise HiercollError("simulate: costs_from has another shape (ranks, nodes, fabric "
                                "kinds) than the topology the schedule was planned for")
        topology = costs_from
    if topology.shared_gpu:
        mode = "exact"     # every rank shares one HBM: a folded rank would not see the others
    if mode == "trusted":
        period = declared_period(schedule, topology)
        sym = Symmetry(period, 0, False) if period else None
    else:
        sym = find_symmetry(schedule, topology) if mode == "auto" else None
    fold = sym.period if sym else None
    ranks = list(range(fold if fold else schedule.world_size))
    net = Network(topology, fold, itemsize=schedule.spec.dtype.itemsize)
    per_call = topology.costs.for_mode(call_mode)
    issued = None
    if per_call.call_us or per_call.issue_us:
        issued = issue_times(schedule, ranks, per_call.call_us, per_call.issue_us,
                             topology.shared_gpu)
    timing, fluid = run_timing(schedule, net, ranks, topology.costs.launch_us, record, issued)
    end = max(max(timing.end.values(), default=0.0), per_call.call_us)
    copies = schedule.world_size // fold if fold else 1
    links = [LinkStat(name=info.name, tier=info.tier.value, bytes=fluid.usage.bytes[i],
                      busy_us=fluid.usage.busy_us[i],
                      utilization=(fluid.usage.bytes[i] / (info.bytes_per_us * end)
                                   if end > 0 else 0.0),
                      copies=copies)
             for i, info in enumerate(net.links)]
    per_tier = {Tier.INTRA: 0.0, Tier.INTER: 0.0}
    for i, info in enumerate(net.links):
        if info.counts_traffic:
            per_tier[info.tier] += fluid.usage.bytes[i] * copies
    bound = lower_bound(schedule.spec, topology)
    algbw, busbw = schedule.spec.bandwidths_gbps(end)
    preds = predecessor_map(schedule, ranks, fold)
    shortcut = None
    if sym:
        how = ("every rank" if sym.exhaustive else f"{sym.checked_ranks} ranks (sampled orbits)"
               if sym.checked_ranks else "nothing (declared by the planner, trusted)")
        shortcut = (f"translation symmetry: period {sym.period}, {len(ranks)} of "
                    f"{schedule.world_size} ranks simulated; symmetry checked on {how}")
    result = SimResult(time_us=end, algbw_gbps=algbw, busbw_gbps=busbw,
                       lower_bound_us=bound.time_us, bound_cut=bound.cut,
                       bytes_intra=per_tier[Tier.INTRA], bytes_inter=per_tier[Tier.INTER],
                       links=links, op_start=timing.start, op_end=timing.end,
                       critical_path=critical_path(preds, timing.start, timing.end),
                       ranks_simulated=ranks, shortcut=shortcut,
                       num_ops=sum(len(schedule.rank_ops(r)) for r in ranks) * copies)
    if record:
        result.link_record = fluid.usage.record
        result.link_names = [l.name for l in net.links]
    return result

