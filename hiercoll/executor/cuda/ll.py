"""The LL (low-latency) lowering: one-hop plans without barriers, flags in the data.

Why: a small all-reduce on NVLink costs its chain of dependent round trips, not its bytes. The
simple lowering pays a start barrier (a signal and a wait), a pull (a read round trip) and an end
barrier (another signal and wait): about 8 us at 8 KiB on 4 H200s, where each link crossing is
~1 us (kernel_trace.py stamps). Here every remote edge of the plan becomes a *push* of 8-byte
words, 4 bytes of data and 4 bytes of the call's epoch, into the receiver's LL area; the
receiver reads its own memory until every word carries this call's epoch (a word is stored and
loaded whole, so data and flag arrive together: no release, no acquire fence, no signal). One
link crossing, no barrier: the receiver's own reads are the wait. The cost is twice the bytes on
the wire, which is why only small plans take it (`CudaOptions.ll_threshold_bytes`).

Why no barriers are needed (the start barrier protected a peer's buffers from a fast rank's next
call, the end barrier the copy-out from late pushes):
- the LL area is double-buffered by the epoch's parity, so call k+1's pushes never touch what
  call k still reads;
- a rank pushes into a peer only where that peer also pushes into it (checked below: every LL
  edge r -> p has an edge p -> r). When r runs call k + 2 (which writes parity k again), r's
  call k + 1 has read p's call-k+1 words, which p pushed after its call k, and so its reads of
  parity k, had finished (kernel order on p's stream);
- a peer writes only into this rank's LL area, never its input, output or scratch, so the
  copy-in and copy-out need no fence: the kernel ends only after reading every word it waits
  for.

Which plans (derived from the schedule, not per collective): *one-hop* ones. Every op is either a
push (a copy of this rank's input to another rank, depending on nothing) or a local op of the
destination's owner (copy or reduce) whose sources are its input or lie inside one push's
destination and which depends only on those pushes, writing a region nobody else reads or
writes. A push into the output (a terminal push) gets an unpack row on the receiver. direct
all_reduce / reduce_scatter / all_gather / all_to_all are one-hop; ring, two_shot, tree and hier
are not and keep the simple lowering.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hiercoll.schedule import INPUT, OUTPUT, Op, OpKind, OpRef, Region, Schedule, Transport

MAX_LL_SOURCES = 30         # the table's LL bitmask has one bit per source (and one for dst)


@dataclass(frozen=True)
class LLPlan:
    """Schedule-wide facts of an LL lowering, the same on every rank.

    `area`: element offset of each pushed-into buffer inside a rank's LL area (one parity);
    `elements`: the area's size per parity, in elements (a multiple of the elements per word);
    `reads`: for each local op, for each source, the push whose destination holds it (None: the
    source is the op's own input)."""

    area: dict[str, int]
    elements: int
    pushes: frozenset[OpRef]
    reads: dict[OpRef, tuple[Op | None, ...]]
    unpacked: tuple[OpRef, ...]          # terminal pushes: the receiver copies them out


def elements_per_word(itemsize: int) -> int:
    """Data elements in the 4 data bytes of one LL word."""
    return 4 // itemsize


def ll_plan(schedule: Schedule, max_bytes: int, peer_inter: bool = True) -> LLPlan | None:
    """The LL lowering's plan for `schedule`, or None where it does not apply (the reason is not
    needed: the simple lowering runs any plan)."""
    spec = schedule.spec
    itemsize = spec.dtype.itemsize
    if itemsize not in (2, 4) or schedule.world_size < 2:
        return None
    epw = elements_per_word(itemsize)
    ops = [op for op in schedule.ops()]
    if not ops:
        return None
    pushes: dict[OpRef, Op] = {}
    local: list[Op] = []
    for op in ops:
        if op.dst.count * itemsize > max_bytes or not _words(op, epw):
            return None
        if op.transport == Transport.INTER and not peer_inter:
            return None
        if _is_push(op):
            pushes[op.ref] = op
        elif all(s.rank == op.rank for s in op.srcs) and op.dst.rank == op.rank:
            local.append(op)
        else:
            return None
    if not pushes:
        return None
    if not answered({(op.rank, op.dst.rank) for op in pushes.values()}):
        return None          # a rank could run two calls ahead of a peer it never hears from
    writers: dict[tuple[int, str], list[Op]] = defaultdict(list)
    readers: dict[tuple[int, str], list[Region]] = defaultdict(list)
    for op in ops:
        writers[(op.dst.rank, op.dst.buffer)].append(op)
        for reg in op.reads():
            readers[(reg.rank, reg.buffer)].append(reg)
    if any(_overwritten(op, writers) for op in ops):
        return None          # each region has one writer: no order among writers to keep
    reads: dict[OpRef, tuple[Op | None, ...]] = {}
    read_pushes: set[OpRef] = set()
    for op in local:
        if len(op.srcs) > MAX_LL_SOURCES:
            return None
        if any(reg.overlaps(op.dst) for reg in readers[(op.dst.rank, op.dst.buffer)]
               if reg is not op.dst):
            return None      # a local op's result is read again: not one hop
        holders: list[Op | None] = []
        for src in op.srcs:
            holder = None if src.buffer == INPUT else _holder(src, writers)
            if holder is None and src.buffer != INPUT:
                return None
            holders.append(holder)
            if holder is not None:
                read_pushes.add(holder.ref)
        if not set(op.deps) <= {h.ref for h in holders if h is not None}:
            return None
        if op.accumulate and op.dst.buffer != OUTPUT:
            return None
        reads[op.ref] = tuple(holders)
    unpacked = tuple(sorted(ref for ref, op in pushes.items()
                            if op.dst.buffer == OUTPUT or ref not in read_pushes))
    area: dict[str, int] = {}
    pos = 0
    align = 64 // itemsize           # keep every buffer's words 16-byte aligned in the area
    for name in sorted({op.dst.buffer for op in pushes.values()}):
        size = max(schedule.buffers(r).get(name, 0) for r in range(schedule.world_size))
        area[name] = pos
        pos += -(-size // align) * align
    return LLPlan(area, pos, frozenset(pushes), reads, unpacked)


def answered(edges: set[tuple[int, int]]) -> bool:
    """Every push edge r -> p has a push p -> r: what lets the LL area go without barriers (the
    module docstring's second point; tests remove it to see the emulator catch the hazard)."""
    return all((p, r) in edges for r, p in edges)


def _is_push(op: Op) -> bool:
    return (op.kind == OpKind.COPY and not op.deps and op.srcs[0].rank == op.rank
            and op.srcs[0].buffer == INPUT and op.dst.rank != op.rank and op.dst.buffer != INPUT)


def _overwritten(op: Op, writers: dict[tuple[int, str], list[Op]]) -> bool:
    return any(o is not op and o.dst.overlaps(op.dst) for o in writers[(op.dst.rank, op.dst.buffer)])


def _holder(src: Region, writers: dict[tuple[int, str], list[Op]]) -> Op | None:
    """The push whose destination contains `src` entirely (None: none does)."""
    for op in writers[(src.rank, src.buffer)]:
        d = op.dst
        if _is_push(op) and d.offset <= src.offset and src.offset + src.count <= d.offset + d.count:
            return op
    return None


def _words(op: Op, epw: int) -> bool:
    """Every region of `op` is whole LL words (16-bit types move two elements per word)."""
    return all(r.offset % epw == 0 and r.count % epw == 0 for r in (op.dst, *op.srcs))
