"""`simulate(schedule, topology) -> SimResult`: time a schedule on a topology."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from hiercoll.errors import HiercollError
from hiercoll.gcpause import without_cyclic_gc
from hiercoll.ll_protocol import WIRE_FACTOR, CallProtocol
from hiercoll.schedule import Op, OpRef, Schedule, predecessor_map
from hiercoll.schedule_arrays import native_op_arrays, op_arrays_from_ops
from hiercoll.sim.bounds import lower_bound
from hiercoll.sim.compiled import CompiledRun, Engine, requested_engine, run_compiled, use_compiled
from hiercoll.sim.compiled.tables import Tables, tables_from_arrays
from hiercoll.sim.engine import Progress, on_copy_engine, pinned, run_timing
from hiercoll.sim.links import Network, Tier
from hiercoll.sim.result import LinkStat, OpTimes, SimResult, critical_path
from hiercoll.sim.symmetry import choose_fold
from hiercoll.topology import Topology

Mode = Literal["auto", "exact", "trusted"]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]


CallMode = Literal["eager", "graph"]


def simulate(schedule: Schedule, topology: Topology, mode: Mode = "auto",
             record: bool = False, *, costs_from: Topology | None = None,
             call_mode: CallMode = "eager", progress: Progress | None = None,
             engine: Engine | None = None, protocol: CallProtocol | None = None) -> SimResult:
    """Time `schedule` on `topology`. `mode="auto"` folds ranks that a verified translation
    symmetry makes identical (the result says so); `"exact"` simulates every rank; `"trusted"`
    folds on the planner's declaration without re-checking it (the auto-picker's inner loop:
    tests check every algorithm's declaration exhaustively).

    `call_mode`: eager calls pay the host's per-call and per-op launch costs, graph replays
    their own per-call cost (topology.costs.eager / .graph). `costs_from`: time the schedule
    with the bandwidths, latencies and costs of another topology of the same shape (what a
    calibration varies), without re-planning. `progress(ended, total)`: called with the ops
    ended so far every 1024 simulated instants and once at the end (an unfolded 4096-GPU run
    takes minutes).

    `engine`: which core replays the ops; None reads $HIERCOLL_SIM_ENGINE, else `auto`: the
    compiled core (`sim/compiled`, needs numba: the `sim` extra) for runs of
    `compiled.AUTO_MIN_OPS` ops or more, the Python engine below that or without numba.
    `python` is the reference the compiled core is tested against; `compiled` insists on numba.
    `record` traces are the Python engine's alone, whatever is asked.

    `protocol`: how the cuda backend will run the call, where that is known (a bench row's
    lowering knobs: `ll_protocol.call_protocol`): simple pays `costs.sync_us` (its start and end
    barriers) on the device, and `costs.barrier_row_us` per barrier half its fused kernel walks
    as a row of its own (`protocol.barrier_rows`); LL none, its pushes put WIRE_FACTOR times their bytes on the wire,
    each of its ops starts after `costs.ll_launch_us` (where fitted) instead of `launch_us`, and
    a call whose receivers unpack pushes pays `costs.ll_unpack_us`; None times the schedule
    with none of these (any other backend)."""
    with without_cyclic_gc():
        return _simulate(schedule, topology, mode, record, costs_from=costs_from, call_mode=call_mode,
                         progress=progress, engine=engine, protocol=protocol)


def _simulate(schedule: Schedule, topology: Topology, mode: Mode, record: bool, *,
              costs_from: Topology | None, call_mode: CallMode, progress: Progress | None,
              engine: Engine | None, protocol: CallProtocol | None) -> SimResult:
    schedule.refuse_library_call("simulate")
    if schedule.meta.topology_fingerprint != topology.fingerprint():
        raise HiercollError("simulate: the schedule was planned for another topology "
                            f"({schedule.meta.topology_fingerprint} != {topology.fingerprint()})")
    if costs_from is not None:
        if costs_from.shape_fingerprint() != topology.shape_fingerprint():
            raise HiercollError("simulate: costs_from has another shape (ranks, nodes, fabric "
                                "kinds) than the topology the schedule was planned for")
        topology = costs_from
    if protocol is not None and protocol.ll and topology.costs.ll_launch_us is not None:
        topology = topology.with_costs(launch_us=topology.costs.ll_launch_us)
    # shared_gpu: every rank shares one HBM, a folded rank would not see the others (exact)
    sym, fold, fold_note = choose_fold(schedule, topology, mode)
    ranks = list(range(fold if fold else schedule.world_size))
    schedule.check_walk("simulating it" + (f" folded onto {fold} ranks" if fold else " unfolded"),
                        len(ranks))
    net = Network(topology, fold, itemsize=schedule.spec.dtype.itemsize,
                  levels=bool(sym and sym.levels),
                  wire_factor=WIRE_FACTOR if protocol is not None and protocol.ll else 1.0)
    isz = schedule.spec.dtype.itemsize
    run: CompiledRun | None = None
    if requested_engine(engine) != "python" and not record:
        # the planner's array form first: a compiled run then builds no Op at all
        arrays = native_op_arrays(schedule, ranks)
        tables = (tables_from_arrays(arrays, net, isz, consume=True)
                  if arrays is not None and use_compiled(engine, arrays.num_ops, record) else None)
        del arrays          # what the tables hold instead (a 4096-GPU ring's arrays are GBs)
        if tables is not None:
            run = run_compiled(tables, net, progress)
    if run is None:
        schedule = pinned(schedule, ranks)      # every walk below reads the same built ops
        num_ops = sum(len(schedule.rank_ops(r)) for r in ranks)
        if use_compiled(engine, num_ops, record):
            built = op_arrays_from_ops([schedule.rank_ops(r) for r in ranks], ranks)
            if built is not None:
                run = run_compiled(tables_from_arrays(built, net, isz, consume=True), net, progress)
    op_start: Mapping[OpRef, float]
    op_end: Mapping[OpRef, float]
    if run is None:
        timing, fluid = run_timing(schedule, net, ranks, record, progress)
        usage = fluid.usage
        op_start, op_end = timing.start, timing.end
        device_us = max(timing.end.values(), default=0.0)
        launches = None
    else:
        t, usage = run.tables, run.usage
        num_ops = t.num_ops
        op_start, op_end = OpTimes(t.ranks, t.lens, run.op_start), OpTimes(t.ranks, t.lens, run.op_end)
        device_us = float(run.op_end.max()) if num_ops else 0.0
        launches = launch_counts(t)
    if protocol is not None:
        device_us += (topology.costs.ll_unpack_us * protocol.unpacks if protocol.ll
                      else topology.costs.sync_us
                      + topology.costs.barrier_row_us * protocol.barrier_rows)
    end = call_time_us(schedule, topology, ranks, device_us, call_mode, launches)
    copies = schedule.world_size // fold if fold else 1
    links = [LinkStat(name=info.name, tier=info.tier.value, bytes=usage.bytes[i],
                      busy_us=usage.busy_us[i],
                      utilization=(usage.bytes[i]
                                   / ((info.crowded_bytes_per_us or info.bytes_per_us) * end)
                                   if end > 0 else 0.0),
                      copies=copies // info.shared_by)
             for i, info in enumerate(net.links)]
    per_tier = {Tier.INTRA: 0.0, Tier.INTER: 0.0}
    for i, info in enumerate(net.links):
        if info.counts_traffic:
            per_tier[info.tier] += usage.bytes[i] * copies
    bound = lower_bound(schedule.spec, topology)
    algbw, busbw = schedule.spec.bandwidths_gbps(end)
    if run is None:
        path = critical_path(predecessor_map(schedule, ranks, fold), op_start, op_end)
    else:
        path = critical_path_rows(run.tables, run.op_start, run.op_end)
    shortcut = None
    if sym and fold:
        how = ("every rank" if sym.exhaustive else f"{sym.checked_ranks} rank maps (sampled)"
               if sym.checked_ranks else "nothing (declared by the planner, trusted)")
        kind = ("level-shift symmetry" if sym.levels else f"xor symmetry: period {fold}" if sym.xor
                else f"translation symmetry: period {fold}")
        shortcut = (f"{kind}, {len(ranks)} of {schedule.world_size} ranks simulated; "
                    f"symmetry checked on {how}")
    result = SimResult(time_us=end, algbw_gbps=algbw, busbw_gbps=busbw,
                       lower_bound_us=bound.time_us, bound_cut=bound.cut,
                       bytes_intra=per_tier[Tier.INTRA], bytes_inter=per_tier[Tier.INTER],
                       links=links, op_start=op_start, op_end=op_end, critical_path=path,
                       ranks_simulated=ranks, shortcut=shortcut,
                       notes=[fold_note] if fold_note else [],
                       num_ops=num_ops * copies)
    if record:
        result.link_record = usage.record
        result.link_names = [l.name for l in net.links]
    return result


def call_time_us(schedule: Schedule, topology: Topology, ranks: list[int], device_us: float,
                 call_mode: CallMode, launches: dict[int, tuple[int, int]] | None = None) -> float:
    """A call's time, as benchmarks and nccl-tests time calls: back to back.

    Graph: each replayed call pays the graph's per-call cost, then its device work. Eager: the
    host's launch work for a call (call_us, issue_us per kernel launch, ce_issue_us per
    copy-engine op; every rank's on one thread with `shared_gpu`) overlaps the device work of
    the call before it, so a call takes the longer of the two (a host-bound small call, a
    device-bound large one). `launches`: (kernel launches, copy-engine ops) per rank where
    already counted (`launch_counts`), else counted from the ops."""
    costs = topology.costs.for_mode(call_mode)
    if call_mode == "graph":
        return device_us + costs.call_us
    threshold, isz = topology.costs.ce_threshold_bytes, schedule.spec.dtype.itemsize

    def host_us(rank: int) -> float:
        counted = None if launches is None else launches.get(rank)
        kernels, ce = (host_launches(schedule.rank_ops(rank), isz, threshold) if counted is None
                       else counted)
        return costs.issue_us * kernels + costs.ce_issue_us * ce
    if topology.shared_gpu:
        host = sum(host_us(r) for r in range(schedule.world_size))
    else:       # one host per rank; folded ranks run the same program as their representative
        host = max((host_us(r) for r in ranks), default=0.0)
    return max(device_us, costs.call_us + host)


def host_launches(ops: Sequence[Op], itemsize: int, threshold_bytes: int) -> tuple[int, int]:
    """(kernel launches, copy-engine ops) the host issues for one rank's ops in an eager call,
    as the cuda backend lowers them: consecutive SM ops of one channel share a launch; a
    copy-engine op is its own (fence, copy, signal) and ends the channel's open launch."""
    launches = ce = 0
    open_launch: set[int] = set()
    for op in ops:
        if on_copy_engine(op, itemsize, threshold_bytes):
            ce += 1
            open_launch.discard(op.channel)
        elif op.channel not in open_launch:
            launches += 1
            open_launch.add(op.channel)
    return launches, ce


def channel_prev(t: Tables) -> I32:
    """Each row's previous op on its (rank, channel), -1 for a channel's first."""
    prev = np.full(t.num_ops, -1, np.int32)
    if t.num_ops:
        prev[t.ch_ops[1:]] = t.ch_ops[:-1]
        prev[t.ch_ops[t.ch_ptr[:-1]]] = -1
    return prev


def launch_counts(t: Tables) -> dict[int, tuple[int, int]]:
    """`host_launches` of every simulated rank, over the tables: an SM op opens a launch where
    its channel's previous op is a copy-engine op or there is none. Channel groups are in
    (rank, channel) order, so a rank's rows are one run of `ch_ops` as they are of the rows."""
    offsets = np.zeros(len(t.lens), np.int64)
    lens = np.array(t.lens, np.int64)
    np.cumsum(lens[:-1], out=offsets[1:])
    if not t.key_ce.any():          # no copy-engine op: a launch per (rank, channel)
        firsts = t.ch_ptr[:-1]
        kernels = np.searchsorted(firsts, offsets + lens) - np.searchsorted(firsts, offsets)
        return {r: (k, 0) for r, k in zip(t.ranks, kernels.tolist())}
    ce = t.op_ce
    ce_o = ce[t.ch_ops]                                 # in channel order
    opens = np.empty(t.num_ops, bool)
    opens[1:] = ce_o[:-1]
    opens[t.ch_ptr[:-1]] = True                         # a channel's first op
    opens &= ~ce_o
    kernels = _per_rank(opens, offsets, lens).tolist()
    copies = _per_rank(ce, offsets, lens).tolist()
    return {r: (k, c) for r, k, c in zip(t.ranks, kernels, copies)}


def _per_rank(x: npt.NDArray[np.bool_], offsets: I64, lens: I64) -> I64:
    """How many of each rank's rows `x` marks."""
    out = np.zeros(len(lens), np.int64)
    some = lens > 0
    if some.any():
        out[some] = np.add.reduceat(x, offsets[some], dtype=np.int64)
    return out


def critical_path_rows(t: Tables, start: F64, end: F64) -> list[str]:
    """`result.critical_path` over the tables' rows (rows are in (rank, index) order, the
    ranks ascending, so the tie-break on the later ref is the later row); it visits only the
    path's ops and their predecessors, not a predecessor map of every op."""
    if t.num_ops == 0:
        return []
    prev = channel_prev(t)
    cur = int(np.flatnonzero(end == end.max())[-1])
    path = [cur]
    dep_ptr, dep_idx = t.dep_ptr, t.dep_idx
    while True:
        cands = dep_idx[dep_ptr[cur]:dep_ptr[cur + 1]].tolist() + [int(prev[cur])]
        floor = float(start[cur]) - 1e-9
        ready = [p for p in cands if p >= 0 and float(end[p]) >= floor]
        if not ready:
            break
        cur = max(ready, key=lambda p: (float(end[p]), p))
        path.append(cur)
    offsets = np.concatenate([[0], np.cumsum(t.lens)]).astype(np.int64)
    out = []
    for row in reversed(path):
        j = int(np.searchsorted(offsets, row, side="right")) - 1
        out.append(f"{t.ranks[j]}.{row - int(offsets[j])}")
    return out
