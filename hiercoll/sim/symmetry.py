"""Translation symmetry: rank r and r+P run the same program, shifted.

The planner declares a period for schedules built from rank-relative recipes (swizzled visiting
orders; rotation-invariant rings). On topologies made of identical nodes, shifting every rank
by a multiple of gpus_per_node is an automorphism, so ranks in one orbit finish every op at the
same time and only P representatives need simulating. The declaration is checked before use: on
every rank for expanded schedules, on sampled orbits for lazy ones (a 4096-GPU ring cannot be
built in full); a mismatch falls back to the exact simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hiercoll.schedule import Op, OpKind, Schedule
from hiercoll.topology import Topology

SAMPLED_ORBITS = 2   # the neighbour orbit and the farthest one


@dataclass(frozen=True)
class Symmetry:
    period: int
    checked_ranks: int      # ranks compared against their representative
    exhaustive: bool        # every rank checked (exact), or sampled orbits


# channel, kind, accumulate, dst rank, dst count, (src rank, count)s, deps
TimingView = tuple[int, OpKind, bool, int, int, list[tuple[int, int]], list[tuple[int, int]]]


def timing_view(op: Op, by: int, world: int) -> TimingView:  # hot
    """What the timing of an op depends on, with every rank shifted by `by`: offsets and
    buffer names do not matter, ranks, sizes, channel and dependencies do."""
    srcs = [((s.rank + by) % world, s.count) for s in op.srcs]
    deps = [((r + by) % world, i) for r, i in op.deps]
    if len(srcs) > 1:
        srcs.sort()
    if len(deps) > 1:
        deps.sort()
    return (op.channel, op.kind, op.accumulate, (op.dst.rank + by) % world, op.dst.count, srcs, deps)


def _matches(schedule: Schedule, rep: int, k: int, period: int) -> bool:
    w = schedule.world_size
    other = (rep + k * period) % w
    a, b = schedule.rank_ops(rep), schedule.rank_ops(other)
    if len(a) != len(b):
        return False
    by = k * period
    return all(timing_view(x, by, w) == timing_view(y, 0, w) for x, y in zip(a, b))


def find_symmetry(schedule: Schedule, topology: Topology, period: int | None = None) -> Symmetry | None:
    """The schedule's declared period (or `period`), checked: every rank of an expanded
    schedule, sampled orbits of a lazy one."""
    period = schedule.meta.symmetry_period if period is None else period
    w, l = schedule.world_size, topology.gpus_per_node
    if not period or period >= w or w % period or period % l:
        return None
    orbits = w // period
    if schedule.is_expanded:
        ks = list(range(1, orbits))
    else:
        ks = sorted({1, orbits // 2, orbits - 1} - {0})[:SAMPLED_ORBITS]
    for k in ks:
        for rep in range(period):
            if not _matches(schedule, rep, k, period):
                return None
    return Symmetry(period, len(ks) * period, schedule.is_expanded)


def fabric_fold(topology: Topology, period: int | None) -> tuple[int | None, str | None]:
    """The fold period a schedule's symmetry `period` allows on this topology's network, and a
    note when the network does not allow the schedule's own.

    A schedule symmetric under shifts by P is symmetric under shifts by every multiple of P; the
    network must be too. Identical nodes under one switch (schema 1): any whole-node shift is.
    Tiered fabrics: only shifts by whole groups of the outermost tier's children map leaves onto
    leaves and ECMP paths onto paths (topology.fabric.translation_span), so P grows to the least
    common multiple. Nodes with overrides differ from their orbit: never folded."""
    if period is None:
        return None, None
    if not topology.symmetric_nodes:
        return None, ("not folded: node_overrides / degraded_links make nodes differ (a "
                      "shifted rank would not see the same links); every rank simulated")
    from hiercoll.topology.fabric import translation_span
    span = translation_span(topology) if topology.num_nodes > 1 else 1
    if span is None:
        return None, ("not folded: the outermost tier's groups are not all full, so no shift "
                      "maps the fabric onto itself; every rank simulated")
    fold = math.lcm(period, span * topology.gpus_per_node)
    if fold >= topology.world_size or topology.world_size % fold:
        return None, (f"not folded: the fabric repeats every {span} nodes, the schedule every "
                      f"{period} ranks; no smaller period holds for both")
    if fold != period:
        return fold, (f"folded by {fold} ranks, not the schedule's {period}: the fabric repeats "
                      f"every {span} nodes")
    return fold, None
