"""The timing run: every (rank, channel) replays its ops in order on the simulator's clock.

An op waits for its dependencies, pays the launch cost and the path latency, then moves its
bytes as one fluid flow over every link it touches (network path and HBM, with weights). With a
translation symmetry only the representative ranks run; a dependency on another rank waits for
the same op of that rank's representative, which finishes at the same time by symmetry.

No process per channel: a channel is a cursor into its op list that moves on when its op ends
or when the op it waits on ends (a few dict operations per op, where a simpy process cost a
generator resume and three events; a 1024-GPU ring replays two million ops).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hiercoll.schedule import Op, OpKind, OpRef, OpSource, Schedule
from hiercoll.sim.fluid import EventClock, FluidNetwork
from hiercoll.sim.links import Network


@dataclass
class OpTiming:
    start: dict[tuple[int, int], float]     # dependencies met and channel free
    end: dict[tuple[int, int], float]


# kind, issuing rank, dst rank, accumulate, src ranks, (channel, on a copy engine) when capped
OpShape = tuple[OpKind, int, int, bool, tuple[int, ...], tuple[int, bool] | None]


def op_links(net: Network, op: Op) -> tuple[tuple[tuple[int, float], ...], float]:
    """(links with weights, latency) for one op. A copy streams src HBM -> path -> dst HBM; a
    reduce reads every source into the issuing GPU and writes the result to its destination,
    and so does a relayed copy (issued by neither end: `Op.relayed`), as a reduce of one source.

    A copy's links are distinct but for its two HBMs (a network path holds none), so it is built
    as a tuple, without merging (a dense all-to-all-v has W^2 distinct copies); a reduce's paths
    may share links and are merged. The engine links are the op's own."""
    links: tuple[tuple[int, float], ...]
    if op.kind == OpKind.COPY and not op.relayed:
        links, latency = copy_links(net, op.srcs[0].rank, op.dst.rank)
    else:
        # merged in one dict, in a fixed order (sources, then the destination): the loops are
        # inline because a 4096-GPU `hier` has reduces of 519 sources (5 s of its tables went
        # to a helper call per link)
        weights: dict[int, float] = {}
        get = weights.get
        i = op.rank
        latency = 0.0
        pull = 1.0 / net.topology.costs.pull_efficiency     # a byte pulled costs the link more
        for src in (*op.srcs, op.dst) if op.accumulate else op.srcs:
            r = src.rank
            h = net.hbm(r)
            weights[h] = get(h, 0.0) + 1.0
            for lid, w in net.net_path(r, i):
                weights[lid] = get(lid, 0.0) + w * pull
            latency = max(latency, net.latency_us(r, i))
        h = net.hbm(op.dst.rank)
        weights[h] = get(h, 0.0) + 1.0
        for lid, w in net.net_path(i, op.dst.rank):
            weights[lid] = get(lid, 0.0) + w
        latency += net.latency_us(i, op.dst.rank)
        links = tuple(weights.items())
    ce_all = net.topology.costs.ce_concurrent_gbps
    if ce_all is not None and on_copy_engine(op, net.itemsize, net.topology.costs.ce_threshold_bytes):
        links += ((net.copy_engines(op.rank, ce_all), 1.0),)
    cap = op_engine_cap(net, op)
    far = engine_traffic(op, net.topology.shared_gpu)
    if cap is not None and far:
        links += ((net.engine(op.rank, op.channel, cap[0], cap[1]), far),)
    return links, latency


def engine_traffic(op: Op, shared_gpu: bool = False) -> float:
    """What an op puts through its engine's cap, per byte it stores. On GPUs of their own: one
    unit per access to another rank's memory (each remote source read, a remote destination
    written, and read first where it accumulates). The cap is what one kernel or copy engine
    drives over the fabric (each remote access a round trip its CTAs keep in flight); its own
    HBM it reads and writes at HBM rate, which the HBM links bound. Counting local loads too
    priced a ring's local copy of 256 MiB at 401 GB/s, 670 us against ~150 measured: 4 x H200
    ring all_gather / reduce_scatter of 1 GiB simulated 25-39 % slow, and our plans' error from
    64 MiB on the loop-w4 run went 9.6 -> 4.8 % with the shipped costs
    (bench/results/gpu/regret/README.md). Where every rank shares one GPU (`shared_gpu`: the
    one-GPU harness) every access is to that GPU's HBM through the rank's share of its SMs, so
    loads and stores all count, in copies' units: a copy 1, a reduce (sources + 1) / 2 (what
    `one-gpu-h200x4` was fitted with: 7.1 % held out; 38 % with the remote-only count)."""
    if shared_gpu:
        return 1.0 if op.kind == OpKind.COPY else (len(op.srcs) + op.accumulate + 1) / 2
    remote_dst = op.dst.rank != op.rank
    return float(sum(s.rank != op.rank for s in op.srcs) + remote_dst
                 + (remote_dst and op.accumulate))     # an accumulate reads it first


def copy_links(net: Network, a: int, b: int) -> tuple[tuple[tuple[int, float], ...], float]:
    """(links with weights, latency) of a copy from GPU a to GPU b: a's HBM, the path, b's HBM
    (one HBM twice where a == b), before any engine link."""
    ha, hb = net.hbm(a), net.hbm(b)
    links = (((ha, 2.0),) if ha == hb else ((ha, 1.0), (hb, 1.0))) + net.path(a, b)
    return links, net.latency_us(a, b)


def on_copy_engine(op: Op, itemsize: int, threshold_bytes: int) -> bool:
    """Whether the cuda backend runs `op` on a copy engine: a copy to or from a peer of at least
    the threshold (`lowering._engine` calls this, so both agree)."""
    return (op.kind == OpKind.COPY and op.dst.count * itemsize >= max(threshold_bytes, 1)
            and (op.dst.rank != op.rank or op.srcs[0].rank != op.rank))


def op_engine_cap(net: Network, op: Op) -> tuple[str, float] | None:
    """(engine, GB/s) if the topology caps what one op moves: copies of at least the copy-engine
    threshold run on a copy engine (as the cuda backend lowers them), everything else on SMs."""
    costs = net.topology.costs
    if costs.sm_op_gbps is None and costs.ce_op_gbps is None:
        return None
    if on_copy_engine(op, net.itemsize, costs.ce_threshold_bytes):
        return None if costs.ce_op_gbps is None else ("ce", costs.ce_op_gbps)
    return None if costs.sm_op_gbps is None else ("sm", costs.sm_op_gbps)


class LinkCache:
    """op -> (links with weights, latency), computed once per op shape: ops that move data
    between the same ranks the same way share a path (a ring has a handful of shapes)."""

    def __init__(self, net: Network):
        self.net = net
        self._capped = net.topology.costs.engine_links()
        self._by_shape: dict[OpShape, tuple[tuple[tuple[int, float], ...], float]] = {}
        self._alone: dict[tuple[OpShape, bool], tuple[float, float]] = {}
        self._pairs: dict[tuple[int, int], tuple[tuple[tuple[int, float], ...], float]] = {}

    def _shape(self, op: Op) -> OpShape:
        srcs = (op.srcs[0].rank,) if len(op.srcs) == 1 else tuple(s.rank for s in op.srcs)
        return (op.kind, op.rank, op.dst.rank, op.accumulate, srcs, self.channel_key(op))

    def __call__(self, op: Op) -> tuple[tuple[tuple[int, float], ...], float]:
        if op.kind == OpKind.COPY and not self._capped and not op.relayed:   # its two GPUs decide
            return self._pair(op.srcs[0].rank, op.dst.rank)
        shape = self._shape(op)
        hit = self._by_shape.get(shape)
        if hit is None:
            hit = self._by_shape[shape] = op_links(self.net, op)
        return hit

    def pair_copy(self, a: int, b: int) -> tuple[tuple[tuple[int, float], ...], float] | None:
        """A copy's (links, latency) from its two GPUs alone, where nothing else decides them
        (no engine caps, no shared copy engines), cached per pair for every copy op: a dense
        all-to-all-v has a million copies of distinct ranks, and the compiled tables ask here
        without building a stand-in op per copy. None where the engine decides too (ask with
        the op)."""
        return None if self._capped else self._pair(a, b)

    @property
    def pairs_decide(self) -> bool:
        """Does a copy's pair of GPUs alone decide its links (`pair_copy` answers)?"""
        return not self._capped

    def _pair(self, a: int, b: int) -> tuple[tuple[tuple[int, float], ...], float]:
        hit = self._pairs.get((a, b))
        if hit is None:
            hit = self._pairs[(a, b)] = copy_links(self.net, a, b)
        return hit

    def channel_key(self, op: Op) -> tuple[int, bool] | None:
        """With per-op engine caps (or a GPU's copy engines shared), an op's links depend on its
        channel and engine too."""
        if not self._capped:
            return None
        return (op.channel, on_copy_engine(op, self.net.itemsize,
                                           self.net.topology.costs.ce_threshold_bytes))

    def launch_us(self, op: Op) -> float:
        """Device time before the op's bytes move (topology.costs.op_launch_us)."""
        costs = self.net.topology.costs
        return costs.op_launch_us(on_copy_engine(op, self.net.itemsize, costs.ce_threshold_bytes))

    def alone_us(self, op: Op) -> float:
        """The least time `op` takes: launch, first byte's flight, and its bytes at the best rate
        its path allows with nothing else on the network (its tightest weighted link). The
        per-op term of both lower bounds (one rank's ops in order; the critical path)."""
        costs = self.net.topology.costs
        ce = on_copy_engine(op, self.net.itemsize, costs.ce_threshold_bytes)
        key = (self._shape(op), ce)
        hit = self._alone.get(key)
        if hit is None:
            links, latency = self(op)
            rate = min((self.net.links[lid].bytes_per_us / w for lid, w in links), default=float("inf"))
            hit = self._alone[key] = (costs.op_launch_us(ce) + latency, rate)
        return hit[0] + op.dst.count * self.net.itemsize / hit[1]


@dataclass(frozen=True)
class PinnedOps:
    """An op source holding some ranks' ops built once (the ranks a simulation walks: timing,
    predecessors, op counts, host launches), the rest from the schedule's own source."""

    held: dict[int, Sequence[Op]]
    source: OpSource

    def rank_ops(self, rank: int) -> Sequence[Op]:
        ops = self.held.get(rank)
        return self.source.rank_ops(rank) if ops is None else ops

    def rank_buffers(self, rank: int) -> dict[str, int]:
        return self.source.rank_buffers(rank)

    def check_walk(self, ranks: int, what: str) -> None:
        self.source.check_walk(ranks, what)


def pinned(schedule: Schedule, ranks: Sequence[int]) -> Schedule:
    """`schedule` with `ranks`' ops built once and held (a lazy recipe's LRU would rebuild a
    large world's ranks on every walk over them)."""
    if schedule.is_expanded:
        return schedule
    return Schedule(schedule.meta, PinnedOps({r: schedule.rank_ops(r) for r in ranks}, schedule.source))


class _Channel:
    """One (rank, channel): its ops, the position of the one it runs or waits for, and how many
    of that op's dependencies have already ended (ends are final, so a wake-up resumes there:
    an op waiting on W peers is not re-checked from its first dependency W times). `key`: its
    place in (rank, channel) order, the compiled core's channel number; an instant's events run
    in channel order, a channel's op begin (key 2 x place) before a flow's end (2 x place + 1)."""

    __slots__ = ("ops", "paths", "i", "d", "key")

    def __init__(self, ops: list[Op], paths: list[tuple[tuple[tuple[int, float], ...], float]]):
        self.ops = ops
        self.paths = paths      # per op: (links with weights, launch + first byte's flight us)
        self.i = 0
        self.d = 0
        self.key = 0


# (ops ended, ops to run): a long simulation's progress, reported now and then
Progress = Callable[[int, int], None]


def run_timing(schedule: Schedule, net: Network, ranks: Sequence[int],
               record: bool = False, progress: Progress | None = None) -> tuple[OpTiming, FluidNetwork]:
    isz = schedule.spec.dtype.itemsize
    fold = net.fold
    timing = OpTiming({}, {})
    start, end = timing.start, timing.end
    cached = LinkCache(net)
    clock = EventClock()
    waiting: dict[OpRef, list[_Channel]] = {}   # an op not yet ended -> channels waiting on it
    ready: list[_Channel] = []                   # channels whose next op may start now

    def drain() -> None:
        while ready:
            ch = ready.pop()
            if ch.i == len(ch.ops):
                continue
            op = ch.ops[ch.i]
            deps = op.deps
            while ch.d < len(deps):    # the first dependency not yet ended: wait for it
                d = deps[ch.d]
                if fold is not None:
                    d = (d[0] % fold, d[1])
                if d not in end:
                    waiting.setdefault(d, []).append(ch)
                    break
                ch.d += 1
            else:
                now = clock.now
                start[op.ref] = now
                clock.at(now + ch.paths[ch.i][1], begin, ch, 2 * ch.key)

    def finished(ch: _Channel) -> None:
        ref = ch.ops[ch.i].ref
        end[ref] = clock.now
        ch.i += 1
        ch.d = 0
        ready.append(ch)
        woken = waiting.pop(ref, None)
        if woken:
            ready.extend(woken)
        drain()

    def begin(ch: _Channel) -> None:
        if not fluid.transfer(ch.paths[ch.i][0], ch.ops[ch.i].dst.count * isz, ch, 2 * ch.key + 1):
            finished(ch)               # nothing to move: ends at once

    total = 0
    for r in ranks:
        ops = schedule.rank_ops(r)
        total += len(ops)
        by_channel: dict[int, _Channel] = {}
        for op in ops:
            ch = by_channel.get(op.channel)
            if ch is None:
                ch = by_channel[op.channel] = _Channel([], [])
            links, latency = cached(op)        # every link exists before the network is sized
            ch.ops.append(op)
            ch.paths.append((links, cached.launch_us(op) + latency))   # launch, first byte's flight
        for c in sorted(by_channel):
            by_channel[c].key = len(ready)
            ready.append(by_channel[c])
    crowded = {i: l.crowded_bytes_per_us for i, l in enumerate(net.links)
               if l.crowded_bytes_per_us is not None}
    fluid = FluidNetwork(clock, [l.bytes_per_us for l in net.links], finished, record, crowded)
    ready.reverse()                    # drain pops from the end: start in rank, channel order
    drain()
    clock.run(fluid.settle, None if progress is None else lambda: progress(len(end), total))
    if progress is not None:
        progress(len(end), total)
    if len(end) < total:
        from hiercoll.errors import VerificationError
        missing = next(op.ref for r in ranks for op in schedule.rank_ops(r) if op.ref not in end)
        r, i = missing
        raise VerificationError(f"deadlock: op {r}.{i} and {total - len(end) - 1} others never ran "
                                "(a dependency waits on an op that waits on it)")
    return timing, fluid
