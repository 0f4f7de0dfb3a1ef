"""Lower bound of a collective on a topology, whatever the schedule: the bytes that must cross
the most loaded cut (one GPU against the rest, one node against the rest, one full group of a
fabric tier against the rest) over that cut's bandwidth, plus one launch and one hop of latency.
Every simulated time must be at least this (a property test checks it); the ratio says how much
a better schedule could still gain."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hiercoll.collectives import CollectiveSpec, Kind, dense_counts
from hiercoll.schedule import OpRef, Schedule, kahn_order, predecessor_map
from hiercoll.topology import Topology


@dataclass(frozen=True)
class Bound:
    time_us: float
    cut: str          # which cut binds: "gpu", "node" or a fabric tier's name ("leaf", "spine")
    bytes: float      # bytes over that cut


@dataclass(frozen=True)
class Cut:
    """Equal parts of the ranks (a GPU, a node, a full group of a fabric tier): every byte a
    part must send or receive crosses its boundary, at most `gbps[p]` per direction."""

    name: str
    ranks_per_part: int
    gbps: list[float]        # per part

    def part_of(self, rank: int) -> int:
        return rank // self.ranks_per_part


def cuts(t: Topology) -> list[Cut]:
    """The cuts a collective's bytes must cross: each GPU (its scale-up port plus its path to a
    NIC), each node (its NICs, over the schema-1 oversubscription), and each group of every
    fabric tier below the outermost when the groups are full (the group's uplinks). Node
    overrides set their parts' capacities."""
    from hiercoll.topology.fabric import layout
    l, n = t.gpus_per_node, t.num_nodes
    path = t.inter.gpu_path_gbps() if n > 1 and t.inter is not None else 0.0
    gpu = t.gpu_intra_gbps()
    per_node = [gpu + path] * n
    for o in t.node_overrides:      # (only where they are: x * y / y is not always x)
        per_node[o.node] = gpu * t.intra_gbps_of(o.node) / t.intra.gbps + path
    out = [Cut("gpu", 1, [c for c in per_node for _ in range(l)])]
    if n > 1 and t.inter is not None:
        inter = t.inter
        nics = [inter.num_nics * inter.nic_gbps / inter.oversubscription] * n
        for o in t.node_overrides:
            nics[o.node] = sum(t.nic_gbps_of(o.node, k)
                               for k in range(inter.num_nics)) / inter.oversubscription
        out.append(Cut("node", l, nics))
        for tl in layout(t)[:-1]:
            if n % tl.span == 0 and tl.groups > 1:
                out.append(Cut(tl.name, tl.span * l, [tl.group_uplink_gbps] * tl.groups))
    return out


def _part_bytes(spec: CollectiveSpec, ranks_per_part: int) -> float:
    """Bytes each of the equal parts of `ranks_per_part` ranks must move across its boundary in
    one direction (symmetric collectives: every part alike)."""
    w, k, s = spec.world_size, ranks_per_part, float(spec.total_bytes)
    parts = w // k
    kind = spec.kind
    if kind == Kind.ALL_REDUCE:
        return 2 * (parts - 1) / parts * s
    if kind in (Kind.REDUCE_SCATTER, Kind.ALL_GATHER):
        return (parts - 1) / parts * s
    if kind == Kind.ALL_TO_ALL:
        return k * s * (w - k) / w
    # broadcast / reduce: the root's data must reach (leave) every other part once
    return s if parts > 1 else 0.0


def _group_part_bytes(spec: CollectiveSpec, cut: Cut) -> list[float]:
    """Per part, bytes that must cross its boundary in its busier direction (group ops): every
    remote destination GPU must receive its piece; every remote part must get it once."""
    isz = spec.dtype.itemsize
    parts = spec.world_size // cut.ranks_per_part
    cast = spec.kind == Kind.GROUP_CAST
    assert spec.splits is not None
    dense = dense_counts(spec.splits, spec.world_size)
    if dense is not None:
        return _dense_part_bytes(dense * isz, cut, parts, cast)
    into, out = [0.0] * parts, [0.0] * parts
    if cut.ranks_per_part == 1:
        for (src, dst), ps in spec.pair_streams.items():
            if src != dst:
                into[dst] += ps.total * isz
                out[src] += ps.total * isz
        if not cast:   # group_reduce sources can pre-reduce: only the output side is certain
            out = [0.0] * parts
        return [max(a, b) for a, b in zip(into, out)]
    assert spec.splits is not None
    for r, rs in enumerate(spec.splits.ranks):
        for sp in (rs.input if cast else rs.output):
            remote = {cut.part_of(p) for p in sp.peers} - {cut.part_of(r)}
            for q in remote:   # crosses into (cast) / out of (reduce) part q at least once
                (into if cast else out)[q] += sp.size * isz
                (out if cast else into)[cut.part_of(r)] += sp.size * isz
    return [max(a, b) for a, b in zip(into, out)]


def _dense_part_bytes(nbytes: np.ndarray, cut: Cut, parts: int, cast: bool) -> list[float]:
    """`_group_part_bytes` of `GroupSplits.from_counts`' splits (nbytes[s][d]: what s sends d):
    every split has one peer, so each pair crossing the cut counts once into the receiver's
    part and once out of the sender's (a group_reduce's sources may pre-reduce across a cut of
    single ranks: only what enters is certain there)."""
    part = np.array([cut.part_of(r) for r in range(len(nbytes))], np.int64)
    cross = np.where(part[:, None] != part[None, :], nbytes, 0).astype(np.float64)
    into = np.bincount(part, weights=cross.sum(axis=0), minlength=parts).astype(np.float64)
    out = np.bincount(part, weights=cross.sum(axis=1), minlength=parts).astype(np.float64)
    if cut.ranks_per_part == 1 and not cast:
        out = np.zeros(parts, np.float64)
    return [float(x) for x in np.maximum(into, out)]


def _cut_time(spec: CollectiveSpec, cut: Cut) -> tuple[float, float]:
    """(us the cut needs at least, bytes of the part that needs them)."""
    if spec.kind in (Kind.GROUP_CAST, Kind.GROUP_REDUCE):
        per = _group_part_bytes(spec, cut)
        busy = [p for p in range(len(per)) if per[p]]
        if not busy:
            return 0.0, 0.0
        worst = max(busy, key=lambda p: per[p] / cut.gbps[p])
        return per[worst] / (cut.gbps[worst] * 1e3), per[worst]
    b = _part_bytes(spec, cut.ranks_per_part)
    return (b / (min(cut.gbps) * 1e3) if b else 0.0), b


def lower_bound(spec: CollectiveSpec, t: Topology) -> Bound:
    """The slowest cut (ties: the innermost), plus one launch and one hop of latency."""
    times = [(cut.name, *_cut_time(spec, cut)) for cut in cuts(t)]
    if not any(nbytes for _, _, nbytes in times):
        return Bound(0.0, "gpu", 0.0)
    name, time, nbytes = times[0]
    for other in times[1:]:
        if other[1] > time:
            name, time, nbytes = other
    latency = 0.0
    if times[0][2]:      # bytes cross GPUs: at least one hop
        latency = t.intra.latency_us if t.num_nodes == 1 or t.inter is None else min(
            t.intra.latency_us if t.gpus_per_node > 1 else t.inter.latency_us, t.inter.latency_us)
    return Bound(time + latency + t.costs.min_launch_us(), name, nbytes)


def contention_free_us(schedule: Schedule, topology: Topology, verify_symmetry: bool = True) -> float:
    """A lower bound on this schedule's simulated time: the longest path through dependencies
    and channel order when every op runs alone on the network (launch + latency + its bytes at
    the best rate its path allows). Contention only adds to it, so the auto-picker may skip a
    candidate whose bound is already slower than the best simulated time. Linear in the ops
    (of one representative per orbit when a translation symmetry holds). The auto-picker trusts
    the declared symmetry here to stay cheap; the simulation itself always checks it."""
    from hiercoll.sim.engine import LinkCache
    from hiercoll.sim.links import Network
    from hiercoll.sim.symmetry import choose_fold

    # verify_symmetry off: trust the planner's declaration (tests check every algorithm's claim)
    _, fold, _ = choose_fold(schedule, topology, "auto" if verify_symmetry else "trusted")
    # unfolded: one op alone sees real links (a folded HBM has weight 2)
    paths = LinkCache(Network(topology, itemsize=schedule.spec.dtype.itemsize))
    ranks = range(fold if fold else schedule.world_size)
    schedule.check_walk("bounding its critical path", len(ranks))
    cost: dict[OpRef, float] = {}
    for r in ranks:
        for op in schedule.rank_ops(r):
            cost[op.ref] = paths.alone_us(op)
    preds = predecessor_map(schedule, ranks, fold)
    finish: dict[OpRef, float] = {}
    for ref in kahn_order(preds):
        finish[ref] = max((finish[p] for p in preds[ref]), default=0.0) + cost[ref]
    return max(finish.values(), default=0.0)
