"""Translation symmetry: rank r and r+P run the same program, shifted.

The planner declares a period for schedules built from rank-relative recipes (swizzled visiting
orders; rotation-invariant rings). On topologies made of identical nodes, shifting every rank
by a multiple of gpus_per_node is an automorphism, so ranks in one orbit finish every op at the
same time and only P representatives need simulating. The declaration is checked before use: on
every rank for expanded schedules, on sampled orbits for lazy ones (a 4096-GPU ring cannot be
built in full); a mismatch falls back to the exact simulation.

Tiered fabrics (leaf groups, spines) are not node-shift symmetric: a flow between the last node of
one leaf group and the first of the next climbs to the spine, its neighbours' do not. Whole-group
translations still are (`fabric_fold`), and so are *level shifts*: move every node one position
inside its group at one level (a leaf group's nodes, a pod's leaf groups, ...), which maps each
group onto itself and, where routing sprays (an ECMP hash of the endpoints moves with them),
the fabric onto itself. A schedule built from per-level relative digits (`hier_tiers`, and
`hier` on full tier groups) is symmetric under them; they move any node onto any other, so one
node's ranks are simulated and every switch port counts the shifted copies that share it
(`sim/links.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hiercoll.schedule import Op, OpKind, Schedule
from hiercoll.schedule_arrays import native_op_arrays
from hiercoll.topology import Topology

SAMPLED_ORBITS = 2   # the neighbour orbit and the farthest one


@dataclass(frozen=True)
class Symmetry:
    period: int
    checked_ranks: int      # ranks compared against their representative
    exhaustive: bool        # every rank checked (exact), or sampled orbits
    levels: bool = False    # level shifts (one node simulated), not translations by `period`
    xor: bool = False       # rank r -> r xor kP (the schedule's symmetry_group), not r + kP


# channel, kind, accumulate, dst rank, dst count, (src rank, count)s, deps
TimingView = tuple[int, OpKind, bool, int, int, list[tuple[int, int]], list[tuple[int, int]]]


class Shift:
    """Rank r -> r + by (mod world), indexable like a permutation list."""

    __slots__ = ("by", "world")

    def __init__(self, by: int, world: int):
        self.by, self.world = by, world

    def __getitem__(self, r: int) -> int:
        return (r + self.by) % self.world


class Xor:
    """Rank r -> r xor by: the pairing of recursive doubling / halving maps onto itself."""

    __slots__ = ("by",)

    def __init__(self, by: int):
        self.by = by

    def __getitem__(self, r: int) -> int:
        return r ^ self.by


RankMap = Shift | Xor | Sequence[int]


def timing_view(op: Op, to: RankMap) -> TimingView:  # hot
    """What the timing of an op depends on, with every rank r moved to to[r]: offsets and
    buffer names do not matter, ranks, sizes, channel and dependencies do."""
    srcs = [(to[s.rank], s.count) for s in op.srcs]
    deps = [(to[r], i) for r, i in op.deps]
    if len(srcs) > 1:
        srcs.sort()
    if len(deps) > 1:
        deps.sort()
    return (op.channel, op.kind, op.accumulate, to[op.dst.rank], op.dst.count, srcs, deps)


def _maps_onto(schedule: Schedule, rank: int, to: RankMap) -> bool:
    """Whether rank to[rank] runs rank `rank`'s program with every rank moved by `to`."""
    if isinstance(to, Shift) and not schedule.is_expanded:
        fast = _shift_maps_arrays(schedule, rank, to.by)
        if fast is not None:
            return fast
    a, b = schedule.rank_ops(rank), schedule.rank_ops(to[rank])
    if len(a) != len(b):
        return False
    same = Shift(0, schedule.world_size)
    return all(timing_view(x, to) == timing_view(y, same) for x, y in zip(a, b))


def _shift_maps_arrays(schedule: Schedule, rank: int, by: int) -> bool | None:
    """`_maps_onto` for a shift, read off the two ranks' ops in the planner's array form (None:
    the algorithm has none). Why: the sampled check of a lazy 4096-GPU ring built 212 ranks'
    8190 `Op`s each, 100 of the fold's CPU seconds (more than simulating the folded ranks);
    the arrays are what the compiled core replays: channel, count, prototype (kind, ranks,
    accumulate) and dependencies, compared in each op's own order (stricter than the ops'
    sorted view: a mismatch only costs the fold)."""
    w = schedule.world_size
    arr = native_op_arrays(schedule, [rank, (rank + by) % w])
    if arr is None:
        return None
    la, lb = int(arr.lens[0]), int(arr.lens[1])
    if la != lb:
        return False
    a, b = slice(0, la), slice(la, la + lb)
    if not (np.array_equal(arr.channel[a], arr.channel[b])
            and np.array_equal(arr.count[a], arr.count[b])):
        return False
    ids: dict[tuple[object, ...], int] = {}

    def canon(shift: int) -> npt.NDArray[np.int64]:
        return np.array([ids.setdefault((p.kind, p.accumulate, (p.rank + shift) % w,
                                         (p.dst + shift) % w,
                                         tuple((x + shift) % w for x in p.srcs)), len(ids))
                         for p in arr.protos], np.int64)
    moved, same = canon(by), canon(0)
    if not np.array_equal(moved[arr.proto[a]], same[arr.proto[b]]):
        return False
    pa, pb = arr.dep_ptr[:la + 1], arr.dep_ptr[la:la + lb + 1]
    if not np.array_equal(np.diff(pa), np.diff(pb)):
        return False
    da, db = slice(int(pa[0]), int(pa[-1])), slice(int(pb[0]), int(pb[-1]))
    return bool(np.array_equal((arr.dep_rank[da].astype(np.int64) + by) % w, arr.dep_rank[db])
                and np.array_equal(arr.dep_index[da], arr.dep_index[db]))


def _matches(schedule: Schedule, rep: int, k: int, period: int) -> bool:
    return _maps_onto(schedule, rep, Shift(k * period, schedule.world_size))


def find_symmetry(schedule: Schedule, topology: Topology, period: int | None = None) -> Symmetry | None:
    """The schedule's declared period (or `period`), checked: every rank of an expanded
    schedule, sampled orbits of a lazy one."""
    period = schedule.meta.symmetry_period if period is None else period
    w, l = schedule.world_size, topology.gpus_per_node
    if not period or period >= w or w % period or period % l:
        return None
    if schedule.meta.symmetry_group == "xor":
        return _find_xor_symmetry(schedule, period)
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


def _find_xor_symmetry(schedule: Schedule, period: int) -> Symmetry | None:
    """Xor by every power of two from `period` up (they generate xor by any multiple of it):
    on every rank of an expanded schedule, on the representatives of a lazy one."""
    w = schedule.world_size
    if w & (w - 1) or period & (period - 1):
        return None
    ranks: Sequence[int] = range(w) if schedule.is_expanded else range(period)
    bits = [1 << j for j in range(period.bit_length() - 1, w.bit_length() - 1)]
    for by in bits:
        if not all(_maps_onto(schedule, r, Xor(by)) for r in ranks):
            return None
    return Symmetry(period, len(ranks) * len(bits), schedule.is_expanded, xor=True)


def xor_fabric_fold(topology: Topology, sym: Symmetry) -> tuple[int | None, str | None]:
    """Xor by multiples of a node maps identical nodes onto each other; the network too only
    without tiers (an xor of a node index reorders nodes across leaf groups)."""
    if topology.inter is not None and topology.inter.tiers and topology.num_nodes > 1:
        return None, ("not folded: xor symmetry (recursive doubling / halving pairs) folds only "
                      "nodes under one switch, not a tiered fabric; every rank simulated")
    return sym.period, None


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


def level_shift(radices: tuple[int, ...], gpus: int, j: int) -> list[int]:
    """The rank permutation that moves every node one position inside its level-j group (digit j
    + 1 mod m_j, the other digits kept), local ranks unchanged."""
    stride = math.prod(radices[:j])
    m = radices[j]
    out: list[int] = []
    for node in range(math.prod(radices)):
        d = (node // stride) % m
        to = node + (((d + 1) % m) - d) * stride
        out.extend(range(to * gpus, to * gpus + gpus))
    return out


def find_level_symmetry(schedule: Schedule, topology: Topology) -> Symmetry | None:
    """Level-shift symmetry on a tiered fabric of two or more levels, checked: the schedule maps
    onto itself under each level's shift (they generate every level shift). An expanded schedule
    on every rank; a lazy one on sampled ranks (each check builds two ranks' ops, a 4096-GPU
    rank's thousands): for each level, node 0's first, middle and last local rank, and the first
    and last local rank of the node where that level's digit wraps (its last position)."""
    from hiercoll.topology.fabric import level_radices, level_shifts_keep_paths
    if not topology.symmetric_nodes or topology.shared_gpu or topology.inter is None \
            or not topology.inter.tiers or not level_shifts_keep_paths(topology):
        return None      # ECMP: a level shift moves a flow's hash, not only its ends
    radices = level_radices(topology)
    if radices is None or len([m for m in radices if m > 1]) < 2:
        return None      # one level: a node shift, the translation fold's own case
    g = topology.gpus_per_node
    checked: set[int] = set()
    for j, m in enumerate(radices):
        if m == 1:
            continue
        if schedule.is_expanded:
            ranks: Sequence[int] = range(schedule.world_size)
        else:
            wrap = (m - 1) * math.prod(radices[:j])
            ranks = sorted({0, g // 2, g - 1, wrap * g, wrap * g + g - 1})
        shift = level_shift(radices, g, j)
        if not all(_maps_onto(schedule, r, shift) for r in ranks):
            return None
        checked.update(ranks)
    return Symmetry(g, len(checked), schedule.is_expanded, levels=True)


def choose_fold(schedule: Schedule, topology: Topology, mode: str) -> tuple[Symmetry | None, int | None, str | None]:
    """(symmetry, fold period, note) for simulating `schedule` in `mode` (auto / trusted /
    exact): the schedule's translation symmetry grown to the fabric's period, or level shifts
    when they fold further; the note says why nothing (or less than the schedule's own) folds."""
    if mode == "exact" or topology.shared_gpu:
        return None, None, None
    if not topology.symmetric_nodes:      # no shift maps the network onto itself: check nothing
        return None, None, fabric_fold(topology, schedule.meta.symmetry_period)[1]
    lsym = find_level_symmetry(schedule, topology)      # folds furthest: try it first
    if lsym is not None:
        return lsym, lsym.period, (f"folded by level shifts onto one node ({lsym.period} of "
                                   f"{schedule.world_size} ranks): the fabric's groups repeat "
                                   "at every level and the schedule with them")
    if mode == "trusted":
        period = declared_period(schedule, topology)
        sym = Symmetry(period, 0, False, xor=schedule.meta.symmetry_group == "xor") if period else None
    else:
        sym = find_symmetry(schedule, topology)
    if sym is not None and sym.xor:
        fold, note = xor_fabric_fold(topology, sym)
        return (sym if fold else None), fold, note
    fold, note = fabric_fold(topology, sym.period if sym else None)
    if sym and fold and fold != sym.period and mode == "auto":
        # implied by the period when it holds; re-checked on the new period's own orbits,
        # which a lazy schedule's sampled check of the shorter period did not all visit
        sym = find_symmetry(schedule, topology, fold)
        if sym is None:
            fold, note = None, (f"not folded: the schedule is not symmetric under the "
                                f"fabric's period of {fold} ranks; every rank simulated")
    return sym, fold, note


def declared_period(schedule: Schedule, topology: Topology) -> int | None:
    """The plan's own symmetry claim, where it can hold on this topology (whole nodes that
    divide the world): what a trusted fold uses without checking."""
    p, w = schedule.meta.symmetry_period, schedule.world_size
    if not p or p >= w or w % p or p % topology.gpus_per_node:
        return None
    return p
