"""The LL (low-latency) lowering: plans that push each region once, with no barriers, flags in the data.

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
- a rank pushes into a peer only where it hears back from that peer within the call (checked
  below: r waits, through the plan's dependencies or an unpack, on something p did). When r
  runs call k + 2 (which writes parity k again), r's call k + 1 had waited on p's call k + 1,
  which started after p's call k, and so its reads of parity k, had finished (kernel order on
  p's stream);
- a peer writes only into this rank's LL area, never its input, output or scratch, so the
  copy-in and copy-out need no fence: the kernel ends only after reading every word it waits
  for.

Which plans (derived from the schedule, not per collective): those that push each region once.
Every op reads only its own rank's memory and writes either its own memory (a local op) or a
peer's (a push, a copy or a reduce: its result goes out as LL words). A source is the input, a
region a push filled in this rank (read as LL words: the read is the wait), or exactly the
result of an earlier op of this rank (the same words, so the same CTA made them: rows of one CTA
run in order with a barrier between them). Every region has one writer (the epoch tells a call
from the next, not one write from another), and every push is answered (above). A push into the
output, or one nobody reads, gets an unpack row on the receiver. direct (every collective),
two_shot, rd, hier and ring all_gather qualify; ring all_reduce (a scratch slot written twice),
tree (pulls), rhd (reads half of an earlier result) and broadcast (unanswered) keep the simple
lowering.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from hiercoll.schedule import INPUT, OUTPUT, Op, OpRef, Region, Schedule, Transport

PROTOCOLS = ("auto", "simple", "ll")      # the cuda backend's --protocol choices
DEFAULT_LL_THRESHOLD_BYTES = 256 << 10     # the cuda backend's --ll-threshold default
# --protocol auto takes LL for a plan whose receivers unpack pushes into their output (all-gather,
# all-to-all, the multi-hop all-reduces) only where no rank unpacks pushes from more than this many
# peers. Measured (bench/results/gpu/w4/README.md): on 4 H100s, where direct / hier / two_shot
# receivers unpack from 3 peers, LL lost to simple at every size up to 1 MiB but one (all_gather
# 8 KiB 12.7 us LL against 9.4 simple; all_reduce two_shot 256 KiB 16.2 against 14.2), while ring
# all_gather (each rank unpacks from its one neighbour) won with LL (256 KiB 16.0 against 22.2, one run);
# on 2 H200s (one peer) LL won up to 256 KiB (all_gather 6.8 against 7.1, all_to_all 6.8 against
# 7.6 at 8 KiB, one A/B run).
DEFAULT_LL_UNPACK_PEERS = 1
WIRE_FACTOR = 2.0           # bytes an LL push puts on the wire per data byte (4 + 4 of a word)
MAX_LL_SOURCES = 30         # the table's LL bitmask has one bit per source (and one for dst)


@dataclass(frozen=True)
class LLPlan:
    """Schedule-wide facts of an LL lowering, the same on every rank.

    `area`: element offset of each pushed-into buffer inside a rank's LL area (one parity);
    `elements`: the area's size per parity, in elements (a multiple of the elements per word);
    `ll_reads`: for each op, which of its sources are read from the LL area;
    `order`: each rank's ops in the order its CTAs walk them (by dependency level, pushes first
    within a level: a CTA never waits on something a later row of a peer would produce)."""

    area: dict[str, int]
    elements: int
    pushes: frozenset[OpRef]
    ll_reads: dict[OpRef, tuple[bool, ...]]
    unpacked: tuple[OpRef, ...]          # terminal pushes: the receiver copies them out
    order: tuple[tuple[OpRef, ...], ...]
    in_place: bool = False               # safe with input and output the same memory
    widest: int = 0                      # elements of the plan's largest op (the grid's size)


def elements_per_word(itemsize: int) -> int:
    """Data elements in the 4 data bytes of one LL word."""
    return 4 // itemsize


@dataclass(frozen=True)
class CallProtocol:
    """How the cuda backend runs one call, as the simulator times it: `ll` calls have no
    barriers and put WIRE_FACTOR bytes on the wire per byte pushed; `unpacks`: an LL call whose
    receivers copy pushed words out of their LL area into the output (all-gather, all-to-all),
    a pass after the pushes land that polls every word for the call's epoch."""

    ll: bool
    unpacks: bool = False
    # a simple call's barrier halves that run as rows of their own (`sim/row_merge.barrier_rows`):
    # each costs `costs.barrier_row_us` on top of the call's barriers (`costs.sync_us`)
    barrier_rows: int = 0

    def with_barrier_rows(self, n: int) -> CallProtocol:
        """This protocol for a kernel that walks `n` barrier rows of its own (LL calls have no
        barriers)."""
        return self if self.ll else replace(self, barrier_rows=n)


SIMPLE = CallProtocol(ll=False)


def call_protocol(schedule: Schedule, max_bytes: int | None, peer_inter: bool = True,
                  max_unpack_peers: int | None = None) -> CallProtocol:
    """The protocol `schedule` runs with an LL limit of `max_bytes` (None: simple asked) and,
    for plans whose receivers unpack, of `max_unpack_peers` (None: no other limit)."""
    plan = None if max_bytes is None else ll_plan(schedule, max_bytes, peer_inter,
                                                  max_unpack_peers)
    return SIMPLE if plan is None else CallProtocol(ll=True, unpacks=bool(plan.unpacked))


def default_call_protocol(schedule: Schedule, ce_threshold_bytes: int) -> CallProtocol:
    """The protocol the cuda backend runs `schedule` with at its default knobs (protocol auto,
    fused, LL threshold DEFAULT_LL_THRESHOLD_BYTES, peer mappings across nodes)."""
    return call_protocol(schedule, ll_limit_bytes("auto", True, False, DEFAULT_LL_THRESHOLD_BYTES,
                                                  ce_threshold_bytes), True,
                         ll_unpack_peer_limit("auto", DEFAULT_LL_UNPACK_PEERS))


def ll_limit_bytes(protocol: str, fuse: bool, launch_per_op: bool, ll_threshold_bytes: int,
                   ce_threshold_bytes: int) -> int | None:
    """The largest op (bytes) the cuda lowering may run as LL under these knobs, or None where
    they ask for the simple protocol. Here, not in the backend, because the simulator times a
    call by the protocol it will run (an LL call has no barriers and doubles its wire bytes)."""
    if protocol == "simple" or launch_per_op or (protocol == "auto" and not fuse):
        return None      # --no-fuse asks for the multi-launch form; a per-op profile too
    # auto: never where the simple lowering would put a copy on the copy engine
    return min(ll_threshold_bytes, ce_threshold_bytes - 1) if protocol == "auto" else 1 << 62


def ll_unpack_peer_limit(protocol: str, ll_unpack_peers: int | None) -> int | None:
    """The most peers a rank may unpack pushes from where `protocol` runs a plan as LL (None: no
    limit): auto's own limit (None: none, as before the rule); `ll` forces any qualifying
    plan."""
    return ll_unpack_peers if protocol == "auto" else None


def ll_plan(schedule: Schedule, max_bytes: int, peer_inter: bool = True,
            max_unpack_peers: int | None = None) -> LLPlan | None:
    """The LL lowering's plan for `schedule`, or None where it does not apply (the simple
    lowering runs any plan)."""
    out = ll_plan_or_reason(schedule, max_bytes, peer_inter, max_unpack_peers)
    return out if isinstance(out, LLPlan) else None


def ll_plan_or_reason(schedule: Schedule, max_bytes: int, peer_inter: bool = True,
                      max_unpack_peers: int | None = None) -> LLPlan | str:
    """`ll_plan`, or why not (for notes and tests)."""
    spec = schedule.spec
    itemsize = spec.dtype.itemsize
    if itemsize not in (2, 4) or schedule.world_size < 2:
        return "LL moves 16- and 32-bit types between at least two ranks"
    epw = elements_per_word(itemsize)
    ops = list(schedule.ops())
    if not ops:
        return "no ops"
    writers: dict[tuple[int, str], list[Op]] = defaultdict(list)
    for op in ops:
        if op.dst.count * itemsize > max_bytes:
            return f"op {op.id} moves more than {max_bytes} bytes"
        if not _words(op, epw):
            return f"op {op.id} is not whole 4-byte words"
        if op.transport == Transport.INTER and not peer_inter:
            return "inter-node ops take the NCCL transport"
        if op.dst.buffer == INPUT:
            return f"op {op.id} writes an input"
        if any(s.rank != op.rank for s in op.srcs):
            return f"op {op.id} reads a peer (LL moves data by pushes only)"
        writers[(op.dst.rank, op.dst.buffer)].append(op)
    if any(_overwritten(op, writers) for op in ops):
        return "a region has several writers"
    pushes = {op.ref: op for op in ops if op.dst.rank != op.rank}
    if not pushes:
        return "no op crosses ranks"
    results = {_key(op.dst): op for op in ops if op.ref not in pushes}     # local ops' results
    ll_reads: dict[OpRef, tuple[bool, ...]] = {}
    exact_readers: set[tuple[int, str, int, int]] = set()
    read_pushes: set[OpRef] = set()
    for op in ops:
        allowed: set[OpRef] = set()
        kinds: list[bool] = []
        for src in op.srcs:
            local = results.get(_key(src))
            holder = None if src.buffer == INPUT or local is not None else _holder(src, writers)
            if local is not None:            # a result of this CTA's earlier row (same words)
                allowed.add(local.ref)
                exact_readers.add(_key(src))
            elif holder is not None:             # pushed into this rank: read LL words
                allowed.add(holder.ref)
                read_pushes.add(holder.ref)
            elif src.buffer != INPUT:
                return f"op {op.id} reads {src}, neither its input, a push into it nor a whole earlier result"
            kinds.append(holder is not None)
        if not set(op.deps) <= allowed:
            return f"op {op.id} depends on an op it does not read"
        if op.accumulate and (op.dst.buffer != OUTPUT or op.ref in pushes):
            return f"op {op.id} accumulates outside the output"
        if len(op.srcs) > MAX_LL_SOURCES:
            return f"op {op.id} has more than {MAX_LL_SOURCES} sources"
        ll_reads[op.ref] = tuple(kinds)
    for op in ops:                 # a local result is read only whole, by its own CTA's rows
        for reg in op.reads():
            if reg is op.dst and op.accumulate:
                continue
            key = _key(reg)
            if key not in exact_readers and any(
                    w.ref not in pushes and w.dst.overlaps(reg)
                    for w in writers[(reg.rank, reg.buffer)]):
                return f"op {op.id} reads part of a local result ({reg})"
    unpacked = tuple(sorted(ref for ref, op in pushes.items()
                            if op.dst.buffer == OUTPUT or ref not in read_pushes))
    if max_unpack_peers is not None and unpacked:
        senders: dict[int, set[int]] = defaultdict(set)
        for ref in unpacked:
            senders[pushes[ref].dst.rank].add(ref[0])
        most = max(len(v) for v in senders.values())
        if most > max_unpack_peers:
            return (f"a rank unpacks pushes from {most} peers, more than {max_unpack_peers} "
                    "(--ll-unpack-peers)")
    level = _dep_levels(schedule)
    if not answered(schedule, level, pushes, unpacked):
        return "a rank pushes to a peer it never hears from within a call"
    area: dict[str, int] = {}
    pos = 0
    align = 64 // itemsize           # keep every buffer's words 16-byte aligned in the area
    for name in sorted({op.dst.buffer for op in pushes.values()}):
        size = max(schedule.buffers(r).get(name, 0) for r in range(schedule.world_size))
        area[name] = pos
        pos += -(-size // align) * align
    order = _row_order(schedule, level, pushes)
    return LLPlan(area, pos, frozenset(pushes), ll_reads, unpacked, order,
                  _in_place(schedule, order, pushes, unpacked),
                  max(op.dst.count for op in ops))


def _in_place(schedule: Schedule, order: tuple[tuple[OpRef, ...], ...], pushes: dict[OpRef, Op],
              unpacked: tuple[OpRef, ...]) -> bool:
    """Whether every rank may run with its output where its input is (an all-reduce called in
    place): every row that reads input words a row writes as output reads exactly that row's
    region (same offset and count: the same CTA handles the same words) and comes no later
    (the same row loads before it stores). Rows run in `order`, unpacking last."""
    for r in range(schedule.world_size):
        rows: list[tuple[list[Region], list[Region]]] = []      # (input reads, output writes)
        for ref in order[r]:
            op = schedule.op(ref)
            reads = [s for s in op.srcs if s.buffer == INPUT]
            local_out = ref not in pushes and op.dst.buffer == OUTPUT
            rows.append((reads, [op.dst] if local_out else []))
        for ref in unpacked:
            if pushes[ref].dst.rank == r:
                rows.append(([], [pushes[ref].dst]))
        for j, (_, writes) in enumerate(rows):
            for w in writes:
                for i, (reads, _) in enumerate(rows):
                    for rd in reads:
                        hit = rd.offset < w.offset + w.count and w.offset < rd.offset + rd.count
                        if hit and (i > j or (rd.offset, rd.count) != (w.offset, w.count)):
                            return False
    return True


def _row_order(schedule: Schedule, level: dict[OpRef, int],
               pushes: dict[OpRef, Op]) -> tuple[tuple[OpRef, ...], ...]:
    """Each rank's ops by dependency level, pushes first within a level. Why it cannot
    deadlock: a row of level L waits only on rows of lower levels (its sources) and on the rows
    before it in its own CTA (level <= L, none of which waits on a level-L row)."""
    return tuple(tuple(sorted((op.ref for op in schedule.rank_ops(r)),
                              key=lambda ref: (level[ref], ref not in pushes, ref[1])))
                 for r in range(schedule.world_size))


def answered(schedule: Schedule, level: dict[OpRef, int], pushes: dict[OpRef, Op],
             unpacked: tuple[OpRef, ...]) -> bool:
    """Every push r -> p is answered: r's kernel waits, within the call, on something p did
    (an op r depends on, transitively, or a push r unpacks). Then r finishing call k + 1 means
    p had started call k + 1, so p's reads of call k are over before r's call k + 2 writes the
    same parity (the module docstring's second point; tests remove it to see the emulator catch
    the hazard)."""
    heard = _heard_from(schedule, level, [pushes[ref] for ref in unpacked])
    return all(heard[op.rank] >> op.dst.rank & 1 for op in pushes.values())


def _heard_from(schedule: Schedule, level: dict[OpRef, int], unpacked: list[Op]) -> list[int]:
    """For each rank, a bitset of the ranks that run an op it waits on (transitively): through
    its ops' dependencies and the pushes it unpacks (waits the schedule does not list)."""
    anc: dict[OpRef, int] = {}               # bitset of ranks among an op's ancestors
    for ref in sorted(level, key=level.__getitem__):
        bits = 0
        for d in schedule.op(ref).deps:
            bits |= anc[d] | (1 << d[0])
        anc[ref] = bits
    heard = [0] * schedule.world_size
    for ref, bits in anc.items():
        heard[ref[0]] |= bits
    for op in unpacked:
        heard[op.dst.rank] |= anc[op.ref] | (1 << op.rank)
    return heard


def _dep_levels(schedule: Schedule) -> dict[OpRef, int]:
    """Each op's longest chain of data dependencies (channel order does not exist here: an LL
    row waits only on the words it reads)."""
    ops = {op.ref: op for op in schedule.ops()}
    level: dict[OpRef, int] = {}
    for ref in ops:
        stack = [ref]
        while stack:
            cur = stack[-1]
            if cur in level:
                stack.pop()
                continue
            pending = [d for d in ops[cur].deps if d not in level]
            if pending:
                stack.extend(pending)
            else:
                level[cur] = 1 + max((level[d] for d in ops[cur].deps), default=-1)
                stack.pop()
    return level


def _key(reg: Region) -> tuple[int, str, int, int]:
    return (reg.rank, reg.buffer, reg.offset, reg.count)


def _overwritten(op: Op, writers: dict[tuple[int, str], list[Op]]) -> bool:
    return any(o is not op and o.dst.overlaps(op.dst) for o in writers[(op.dst.rank, op.dst.buffer)])


def _holder(src: Region, writers: dict[tuple[int, str], list[Op]]) -> Op | None:
    """The push whose destination contains `src` entirely (None: none does)."""
    for op in writers[(src.rank, src.buffer)]:
        d = op.dst
        if op.rank != d.rank and d.offset <= src.offset and src.offset + src.count <= d.offset + d.count:
            return op
    return None


def _words(op: Op, epw: int) -> bool:
    """Every region of `op` is whole LL words (16-bit types move two elements per word)."""
    return all(r.offset % epw == 0 and r.count % epw == 0 for r in (op.dst, *op.srcs))
