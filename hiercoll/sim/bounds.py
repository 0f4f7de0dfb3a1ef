"""Lower bound of a collective on a topology, whatever the schedule: the bytes that must cross
the most loaded cut (one GPU against the rest, one node against the rest) over that cut's
bandwidth, plus one launch and one hop of latency. Every simulated time must be at least this
(a property test checks it); the ratio says how much a better schedule could still gain."""

from __future__ import annotations

from dataclasses import dataclass

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.schedule import OpRef, Schedule, kahn_order, predecessor_map
from hiercoll.topology import Topology


@dataclass(frozen=True)
class Bound:
    time_us: float
    cut: str          # which cut binds: "gpu" or "node"
    bytes: float      # bytes over that cut


def _gpu_capacity(t: Topology) -> float:
    """GB/s a GPU can push out (or take in) over every path at once."""
    path = t.inter.gpu_path_gbps() if t.num_nodes > 1 and t.inter is not None else 0.0
    return t.gpu_intra_gbps() + path


def _node_capacity(t: Topology) -> float:
    assert t.inter is not None
    return t.inter.num_nics * t.inter.nic_gbps / t.inter.oversubscription


def _group_cut_bytes(spec: CollectiveSpec, t: Topology) -> tuple[float, float]:
    """(max bytes into/out of one GPU from other GPUs, max into/out of one node): every remote
    destination GPU must receive its piece; every remote destination node must get it once."""
    isz = spec.dtype.itemsize
    gpu_in = [0.0] * spec.world_size
    gpu_out = [0.0] * spec.world_size
    node_in = [0.0] * t.num_nodes
    node_out = [0.0] * t.num_nodes
    for (s, d), ps in spec.pair_streams.items():
        if s != d:
            gpu_in[d] += ps.total * isz
            gpu_out[s] += ps.total * isz
    assert spec.splits is not None
    cast = spec.kind == Kind.GROUP_CAST
    for r, rs in enumerate(spec.splits.ranks):
        for sp in (rs.input if cast else rs.output):
            nodes = {t.node_of(p) for p in sp.peers} - {t.node_of(r)}
            for n in nodes:   # the piece crosses into (cast) / out of (reduce) node n at least once
                (node_in if cast else node_out)[n] += sp.size * isz
                (node_out if cast else node_in)[t.node_of(r)] += sp.size * isz
    gpu_out_max = max(gpu_out, default=0.0)
    if not cast:   # group_reduce sources can pre-reduce: only the output side is certain
        gpu_out_max = 0.0
    return max(max(gpu_in, default=0.0), gpu_out_max), max(max(node_in), max(node_out))


def cut_bytes(spec: CollectiveSpec, t: Topology) -> tuple[float, float]:
    """(bytes across the busiest one-GPU cut, bytes across the busiest one-node cut)."""
    w, n, s = spec.world_size, t.num_nodes, float(spec.total_bytes)
    k = spec.kind
    if k in (Kind.GROUP_CAST, Kind.GROUP_REDUCE):
        return _group_cut_bytes(spec, t)
    if k == Kind.ALL_REDUCE:
        return 2 * (w - 1) / w * s, 2 * (n - 1) / n * s
    if k in (Kind.REDUCE_SCATTER, Kind.ALL_GATHER):
        return (w - 1) / w * s, (n - 1) / n * s
    if k == Kind.ALL_TO_ALL:
        l = t.gpus_per_node
        return (w - 1) / w * s, l * s * (w - l) / w
    # broadcast / reduce: the root's data must reach (leave) every other GPU and node once
    return (s if w > 1 else 0.0), (s if n > 1 else 0.0)


def lower_bound(spec: CollectiveSpec, t: Topology) -> Bound:
    gpu_bytes, node_bytes = cut_bytes(spec, t)
    gpu_time = gpu_bytes / (_gpu_capacity(t) * 1e3) if gpu_bytes else 0.0
    node_time = node_bytes / (_node_capacity(t) * 1e3) if t.num_nodes > 1 and node_bytes else 0.0
    if not gpu_bytes and not node_bytes:
        return Bound(0.0, "gpu", 0.0)
    latency = 0.0
    if gpu_bytes:
        latency = t.intra.latency_us if t.num_nodes == 1 or t.inter is None else min(
            t.intra.latency_us if t.gpus_per_node > 1 else t.inter.latency_us, t.inter.latency_us)
    if node_time > gpu_time:
        return Bound(node_time + latency + t.costs.min_launch_us(), "node", node_bytes)
    return Bound(gpu_time + latency + t.costs.min_launch_us(), "gpu", gpu_bytes)


def contention_free_us(schedule: Schedule, topology: Topology, verify_symmetry: bool = True) -> float:
    """A lower bound on this schedule's simulated time: the longest path through dependencies
    and channel order when every op runs alone on the network (launch + latency + its bytes at
    the best rate its path allows). Contention only adds to it, so the auto-picker may skip a
    candidate whose bound is already slower than the best simulated time. Linear in the ops
    (of one representative per orbit when a translation symmetry holds). The auto-picker trusts
    the declared symmetry here to stay cheap; the simulation itself always checks it."""
    from hiercoll.sim.engine import LinkCache
    from hiercoll.sim.links import Network
    from hiercoll.sim.symmetry import find_symmetry

    if verify_symmetry:
        sym = find_symmetry(schedule, topology)
        fold = sym.period if sym else None
    else:   # trust the planner's declaration (tests check every algorithm's claim exhaustively)
        fold = declared_period(schedule, topology)
    # unfolded: one op alone sees real links (a folded HBM has weight 2)
    paths = LinkCache(Network(topology, itemsize=schedule.spec.dtype.itemsize))
    ranks = range(fold if fold else schedule.world_size)
    isz = schedule.spec.dtype.itemsize
    cost: dict[OpRef, float] = {}
    for r in ranks:
        for op in schedule.rank_ops(r):
            latency = paths(op)[1]
            cost[op.ref] = paths.launch_us(op) + latency + op.dst.count * isz / paths.best_rate(op)
    preds = predecessor_map(schedule, ranks, fold)
    finish: dict[OpRef, float] = {}
    for ref in kahn_order(preds):
        finish[ref] = max((finish[p] for p in preds[ref]), default=0.0) + cost[ref]
    return max(finish.values(), default=0.0)


def declared_period(schedule: Schedule, topology: Topology) -> int | None:
    p, w = schedule.meta.symmetry_period, schedule.world_size
    if not p or p >= w or w % p or p % topology.gpus_per_node:
        return None
    return p
