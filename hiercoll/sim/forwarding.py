"""Copy forwarding: a reader of a copy's destination reads the copy's source instead (a pull
over the peer mapping), and the copy goes.

Why: a push to a peer's scratch followed by the peer's reduce costs a write over NVLink, a
release fence that waits for that write to land, the peer's acquire, and a read of the scratch:
the chain that made a small `direct` all-reduce three times slower than torch's one-shot kernel,
which reads its peers' inputs in place. Forwarding turns that plan into exactly that pull,
derived from the schedule rather than written per collective.

A copy C (src X, dst S) is forwarded only when the result reads the same values under every
legal order:
- X holds its value from C's start to the call's end: nobody writes it during the call, or only
  ops C depends on directly do (the readers inherit C's dependencies, so they come after them);
- S is written by C alone and is not the output (the output must hold the result);
- every op reading S depends on C directly and reads inside C's destination;
- both ends are in this rank's peer-mapped domain, and the copy would run on SMs, or every
  reader is a reduce (`allowed`, given the copy and its readers): a reduce runs on SMs anyway,
  and pulling its operand there is one pass over the link where a copy-engine push into scratch
  and then the reduce are two passes one after the other (2 x H200, 512 MiB: a pull-add at 335
  GB/s against a push at 390 plus a reduce of 512 MiB; bench/results/gpu/link-probe).
The transformed schedule is an ordinary schedule: the static checker and the reference
executor verify it like any plan (tests/test_exec_forwarding.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from hiercoll.schedule import INPUT, OUTPUT, ExpandedOps, Op, OpKind, OpRef, Region, Schedule
from hiercoll.sim.row_merge import Merged, merge_result_copies


def forward_copies(schedule: Schedule, allowed: Callable[[Op, list[Op]], bool]) -> Schedule:
    """`schedule` with every copy that `allowed(copy, its readers)` admits and the rules above
    permit forwarded; the same object when none is."""
    w = schedule.world_size
    ops: dict[OpRef, Op] = {op.ref: op for r in range(w) for op in schedule.rank_ops(r)}
    writers: dict[tuple[int, str], list[OpRef]] = defaultdict(list)
    readers: dict[tuple[int, str], list[OpRef]] = defaultdict(list)
    for op in ops.values():
        writers[(op.dst.rank, op.dst.buffer)].append(op.ref)
        for reg in op.reads():
            readers[(reg.rank, reg.buffer)].append(op.ref)
    removed: dict[OpRef, tuple[OpRef, ...]] = {}    # forwarded copy -> its dependencies
    for ref in sorted(ops):
        c = ops[ref]
        if c.kind != OpKind.COPY:
            continue
        x, s = c.srcs[0], c.dst
        if s.buffer in (OUTPUT, INPUT) or not _stable(x, c, ops, writers):
            continue
        if any(o != ref and o in ops and ops[o].dst.overlaps(s)
               for o in writers[(s.rank, s.buffer)]):
            continue
        users = list(dict.fromkeys(o for o in readers[(s.rank, s.buffer)]
                                   if o in ops and any(reg.overlaps(s) for reg in ops[o].reads())))
        if not users or not all(_forwardable_reader(ops[o], c) for o in users):
            continue
        if not allowed(c, [ops[o] for o in users]):
            continue
        for o in users:
            reader = ops[o]
            srcs = tuple(_remap(reg, s, x) for reg in reader.srcs)
            deps = tuple(dict.fromkeys([d for d in reader.deps if d != ref] + list(c.deps)))
            ops[o] = _replace(reader, srcs=srcs, deps=deps)
            readers[(x.rank, x.buffer)].append(o)
        removed[ref] = c.deps
        del ops[ref]
    if not removed:
        return schedule
    return _renumbered(schedule, ops, removed)


def _stable(x: Region, c: Op, ops: dict[OpRef, Op], writers: dict[tuple[int, str], list[OpRef]],
            ) -> bool:
    """Does X keep its value from C's start to the end of the call?"""
    for o in writers[(x.rank, x.buffer)]:
        if o in ops and ops[o].dst.overlaps(x) and o not in c.deps:
            return False
    return True


def _forwardable_reader(reader: Op, c: Op) -> bool:
    """It depends on C directly, reads C's destination only inside it, and does not write it."""
    s = c.dst
    if c.ref not in reader.deps or reader.dst.overlaps(s):
        return False
    return all(not reg.overlaps(s) or (reg.offset >= s.offset
                                       and reg.offset + reg.count <= s.offset + s.count)
               for reg in reader.srcs)


def _remap(reg: Region, s: Region, x: Region) -> Region:
    if not reg.overlaps(s):
        return reg
    return Region(x.rank, x.buffer, x.offset + reg.offset - s.offset, reg.count)


def _replace(op: Op, **changes: object) -> Op:
    from dataclasses import replace
    return replace(op, **changes)  # type: ignore[arg-type]


def _renumbered(schedule: Schedule, ops: dict[OpRef, Op],
                removed: dict[OpRef, tuple[OpRef, ...]]) -> Schedule:
    """Ops re-indexed densely per rank; a dependency on a removed copy becomes one on the
    copy's own dependencies (ordering after C's predecessors is what C gave)."""
    def resolve(d: OpRef) -> list[OpRef]:
        if d not in removed:
            return [d]
        return [e for dd in removed[d] for e in resolve(dd)]

    new_ref: dict[OpRef, OpRef] = {}
    per_rank: list[list[Op]] = [[] for _ in range(schedule.world_size)]
    for ref in sorted(ops):
        new_ref[ref] = (ref[0], len(per_rank[ref[0]]))
        per_rank[ref[0]].append(ops[ref])
    out: list[tuple[Op, ...]] = []
    for rank_ops in per_rank:
        fixed = []
        for op in rank_ops:
            deps = tuple(dict.fromkeys(new_ref[e] for d in op.deps for e in resolve(d)))
            fixed.append(_replace(op, index=new_ref[op.ref][1], deps=deps))
        out.append(tuple(fixed))
    buffers = tuple(dict(schedule.buffers(r)) for r in range(schedule.world_size))
    return Schedule(schedule.meta, ExpandedOps(tuple(out), buffers))


def forward_on_sms(schedule: Schedule, ce_threshold_bytes: int, inter_peer: bool = False
                   ) -> Schedule:
    """The schedule the cuda backend runs with forwarding on (its default), by the lowering's
    rule: every copy between peer-mapped GPUs of a node forwarded that runs on SMs (not a copy
    engine: `on_copy_engine` with this threshold) or that only reduces read (they pull it);
    `inter_peer`: copies between nodes too (the lowering's `--inter-transport peer`). The
    lowering runs it, and the simulator times it when it predicts the cuda backend rather than
    the plan as written (calibration, --validate)."""
    from hiercoll.sim.engine import on_copy_engine
    itemsize = schedule.spec.dtype.itemsize

    def allowed(op: Op, readers: list[Op]) -> bool:
        return (_over_peer_mappings(op, inter_peer)
                and (not on_copy_engine(op, itemsize, ce_threshold_bytes)
                     or all(r.kind == OpKind.REDUCE for r in readers)))

    return forward_copies(schedule, allowed)


def _over_peer_mappings(op: Op, inter_peer: bool) -> bool:
    """Does the cuda lowering move `op` through peer mappings (not NCCL / NVSHMEM)? Intra-node
    ops always; inter-node ones under `--inter-transport peer`."""
    from hiercoll.schedule import Transport
    return inter_peer or op.transport != Transport.INTER


def as_lowered(schedule: Schedule, ce_threshold_bytes: int, inter_peer: bool = False,
               forward: bool = True, split: bool = True, split_min_peers: int = 2) -> Schedule:
    """The schedule the cuda backend's simple lowering runs: its copies forwarded
    (`forward_on_sms`, unless `forward` is off), then, where the program is one kernel (`split`:
    fused or single-stream, and every op a row on SMs over peer mappings), the independent ops at
    the head of a channel on channels of their own (`channel_split`, `split_min_peers`; in a
    multi-stream program each would be a stream with its own launches). The lowering runs it;
    the simulator times it where it predicts the cuda backend (calibration, autopick's backend
    schedule)."""
    from hiercoll.sim.channel_split import split_independent_heads
    from hiercoll.sim.engine import on_copy_engine
    if forward:
        schedule = forward_on_sms(schedule, ce_threshold_bytes, inter_peer)
    itemsize = schedule.spec.dtype.itemsize
    if not split or not all(_over_peer_mappings(op, inter_peer)
                            and not on_copy_engine(op, itemsize, ce_threshold_bytes)
                            for op in schedule.ops()):
        return schedule
    return split_independent_heads(schedule, split_min_peers)




def as_timed(schedule: Schedule, ce_threshold_bytes: int, inter_peer: bool = False) -> Merged:
    """What the simulator times for the cuda backend's simple lowering at its default knobs:
    `as_lowered`'s schedule with its rows' result copies beside them (`merged_rows`)."""
    return merged_rows(as_lowered(schedule, ce_threshold_bytes, inter_peer), ce_threshold_bytes,
                       inter_peer)


def merged_rows(lowered: Schedule, ce_threshold_bytes: int, inter_peer: bool = False,
                merge: bool = True, one_kernel: bool = True) -> Merged:
    """A lowered schedule with the result copies its rows take as more destinations moved
    beside those rows (`row_merge`, timing only), and how many rows the busiest rank's kernel
    walks. Rows are the ops the lowering runs on SMs over peer mappings; `merge` off: a
    kernel that ran every op as a row of its own (only the count)."""
    from hiercoll.sim.engine import on_copy_engine
    itemsize = lowered.spec.dtype.itemsize
    return merge_result_copies(lowered, lambda op: merge and _over_peer_mappings(op, inter_peer)
                               and not on_copy_engine(op, itemsize, ce_threshold_bytes),
                               one_kernel)


def as_timed_ll(schedule: Schedule) -> Schedule:
    """What the simulator times for the LL lowering: the plan as written (every remote edge a
    push of flagged words, no forwarding), with the independent pushes at the head of a channel
    on channels of their own (`channel_split`): the LL kernel stores to every peer and moves
    on, a push waits for no reply, so a plan's order among them (`direct`'s swizzled pushes on
    one channel) costs nothing there. Timed one after another, `direct`'s all-reduce at 8 KiB
    on 4 x H200 simulated 22.6 us against 6.7 measured."""
    from hiercoll.sim.channel_split import split_independent_heads
    return split_independent_heads(schedule)
