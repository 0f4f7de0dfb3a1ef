"""Static validation before any timing: deadlock, races, and the postcondition.

- Deadlock: a cycle through dependencies and channel order (names an op on it).
- Races: two ops touching overlapping memory, at least one writing, that the happens-before
  order (deps + channel order, transitively) does not order — e.g. a buffer overwritten before
  a peer read it, or a reduce reading a region a peer is still writing. Vector clocks over
  (rank, channel) streams answer "is a before b" in O(1).
- Postcondition: symbolic execution (see symbolic.py) in a topological order; every output range
  must hold exactly the contributions the collective defines — none missing, none doubled.
- Rank-identical (reduction_order.py): where ranks must hold the same output (all_reduce,
  all_gather, broadcast), every rank's element must come from the same expression tree (order,
  grouping, scale), so every rank gets the same bits. Not identical is a failure by default
  (replicas that drift apart are a bug); `require_ranks_identical=False` only reports it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hiercoll.errors import ScheduleError
from hiercoll.schedule import (
    INPUT,
    OUTPUT,
    ExpandedOps,
    Op,
    OpRef,
    Region,
    Schedule,
    predecessor_map,
    topological_order,
)
from hiercoll.sim.reduction_order import check_reduction_order
from hiercoll.sim.symbolic import Content, SymbolicMemory, expected_output

# ops x streams: the race check's time grows with it (about 6 s at 6.6e7 on one core); beyond
# it the check is skipped, said in `CheckReport.unchecked`, and `hiercoll verify` exits 3
MAX_CLOCK_CELLS = 1_000_000_000
MAX_PROBLEMS = 20


@dataclass
class CheckReport:
    ok: bool
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # every rank holds the same bits where ranks share outputs (reduction_order.py); None: the
    # kind has no shared outputs, or the check stopped before (deadlock, wrong result)
    ranks_identical: bool | None = None
    # checks that did not run (the race check on a plan over MAX_CLOCK_CELLS): `ok` then says
    # only that what ran found nothing, and `hiercoll verify` does not exit 0 on it
    unchecked: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "notes": self.notes,
                "ranks_identical": self.ranks_identical, "unchecked": self.unchecked}


def check(schedule: Schedule, require_ranks_identical: bool = True) -> CheckReport:
    schedule.refuse_library_call("check")
    schedule.check_walk("checking it")
    problems: list[str] = [f"op {op.id}: a {op.kind.value} with no sources (nothing to read; "
                           "a split nobody sends needs no op)"
                           for r in range(schedule.world_size) for op in schedule.rank_ops(r)
                           if not op.srcs]
    if problems:
        return CheckReport(False, problems[:MAX_PROBLEMS])
    notes: list[str] = []
    unchecked: list[str] = []
    try:
        order = topological_order(schedule)
    except ScheduleError as exc:
        return CheckReport(False, [f"deadlock: {exc}"])
    problems += find_races(schedule, order, unchecked)
    post = check_postcondition(schedule, order)
    problems += post
    identical = None
    if not post:            # the same terms everywhere first; then the same order
        same = check_reduction_order(schedule, order)
        identical, notes = same.identical, notes + same.notes
        if require_ranks_identical:
            problems += same.problems
        else:
            notes += [f"(allowed) {p}" for p in same.problems]
    return CheckReport(not problems, problems[:MAX_PROBLEMS], notes, identical, unchecked)


# ---- happens-before ---------------------------------------------------------------------------
class Clocks:
    """Vector clock per op over (rank, channel) streams: clock[stream] = how many of that
    stream's ops are ordered before (or are) this op.

    Clocks are built as the walk reaches each op (`advance`) and dropped once every successor
    has taken its maximum: a race query only ever asks about the op being walked, so memory is
    the walk's frontier x streams, not ops x streams (a 129k-op, 512-stream ring would hold
    264 MB of clocks otherwise)."""

    def __init__(self, schedule: Schedule):
        self.stream: dict[OpRef, int] = {}
        self.pos: dict[OpRef, int] = {}
        ids: dict[tuple[int, int], int] = {}
        counts: list[int] = []
        for r in range(schedule.world_size):
            for op in schedule.rank_ops(r):
                sid = ids.setdefault((op.rank, op.channel), len(ids))
                if sid == len(counts):
                    counts.append(0)
                counts[sid] += 1
                self.stream[op.ref] = sid
                self.pos[op.ref] = counts[sid]
        self.num_streams = len(ids)
        self.preds = predecessor_map(schedule)
        self.waiting: dict[OpRef, int] = {}          # successors yet to read an op's clock
        for ps in self.preds.values():
            for p in ps:
                self.waiting[p] = self.waiting.get(p, 0) + 1
        self.clock: dict[OpRef, np.ndarray] = {}

    def advance(self, op: Op) -> None:
        """Build `op`'s clock from its predecessors' (all walked: topological order), then drop
        the predecessors' clocks that no later op needs."""
        ps = self.preds[op.ref]
        if not ps:
            vc = np.zeros(self.num_streams, dtype=np.int32)
        elif len(ps) == 1:
            vc = self.clock[ps[0]].copy()
        else:
            vc = np.maximum.reduce([self.clock[p] for p in ps])
        vc[self.stream[op.ref]] = self.pos[op.ref]
        self.clock[op.ref] = vc
        for p in ps:
            left = self.waiting[p] - 1
            self.waiting[p] = left
            if not left:
                del self.clock[p]

    def before(self, a: OpRef, b: OpRef) -> bool:
        """Is a ordered before b? b must be the op walked last (its clock is kept)."""
        return a != b and self.clock[b][self.stream[a]] >= self.pos[a]


def race_check_skipped(num_ops: int, streams: int) -> str | None:
    """The note saying why the race check cannot run on a plan this large, or None."""
    if num_ops * streams > MAX_CLOCK_CELLS:
        return (f"race check SKIPPED: {num_ops} ops x {streams} streams is over "
                f"{MAX_CLOCK_CELLS:.0e} (the check is not done, so the plan is not verified)")
    return None


def find_races(schedule: Schedule, order: list[Op], notes: list[str]) -> list[str]:
    """Races, near-linear in the accesses: walk the ops in topological order keeping, per
    (rank, buffer), an interval map from offsets to the last write and the reads since it
    (FastTrack-style). A new access is compared only with those: if they happen before it, so
    does everything earlier (or that earlier pair was reported already), so a schedule has a
    race iff one is reported. Reads one that happens before a newer read supersedes are dropped,
    so a segment keeps at most one read per stream. A skipped check appends its note to `notes`
    (see `race_check_skipped`)."""
    skipped = race_check_skipped(len(order), len({(op.rank, op.channel) for op in order}))
    if skipped:
        notes.append(skipped)
        return []
    clocks = Clocks(schedule)
    maps: dict[tuple[int, str], _AccessMap] = {}
    problems: list[str] = []
    seen: set[tuple[OpRef, OpRef, int, str]] = set()
    for op in order:
        clocks.advance(op)
        accesses = [(reg, False) for reg in op.srcs if reg.count]
        if op.dst.count:
            accesses.append((op.dst, True))
        for reg, write in accesses:
            key = (reg.rank, reg.buffer)
            amap = maps.get(key)
            if amap is None:
                amap = maps[key] = _AccessMap()
            lo, hi = reg.offset, reg.offset + reg.count
            mine = _Access(op, lo, hi, write)
            for prev in amap.conflicts(lo, hi, write):
                if prev.op is op or clocks.before(prev.op.ref, op.ref):
                    continue
                pair = (prev.op.ref, op.ref, reg.rank, reg.buffer)
                if pair in seen:
                    continue
                seen.add(pair)
                olo, ohi = max(lo, prev.lo), min(hi, prev.hi)
                what = "write/write" if write and prev.write else "read/write"
                problems.append(f"race ({what}) on r{reg.rank}.{reg.buffer}[{olo}:{ohi}]: op "
                                f"{prev.op.id} and op {op.id} are not ordered by dependencies "
                                "or channel order")
                if len(problems) >= MAX_PROBLEMS:
                    return problems
            amap.record(mine, clocks)
    return problems


@dataclass(frozen=True, slots=True)
class _Access:
    op: Op
    lo: int
    hi: int
    write: bool


_NO_READS: tuple[_Access, ...] = ()


class _AccessMap:
    """Offsets of one (rank, buffer) -> (last write, reads since it), as sorted segment starts
    (segment i covers [starts[i], starts[i + 1]), the last one runs to the end)."""

    def __init__(self) -> None:
        self.starts: list[int] = [0]
        self.writes: list[_Access | None] = [None]
        self.reads: list[tuple[_Access, ...]] = [_NO_READS]

    def _split(self, x: int) -> int:
        """Index of the segment that starts at x (splitting the one holding x)."""
        i = bisect_right(self.starts, x) - 1
        if self.starts[i] == x:
            return i
        self.starts.insert(i + 1, x)
        self.writes.insert(i + 1, self.writes[i])
        self.reads.insert(i + 1, self.reads[i])
        return i + 1

    def conflicts(self, lo: int, hi: int, write: bool) -> list[_Access]:
        """Earlier accesses of [lo, hi) that a new access (a write if `write`) conflicts with."""
        i = bisect_right(self.starts, lo) - 1
        j = bisect_left(self.starts, hi)
        out: list[_Access] = []
        for k in range(i, j):
            w = self.writes[k]
            if w is not None:
                out.append(w)
            if write:
                out.extend(self.reads[k])
        return out

    def record(self, acc: _Access, clocks: Clocks) -> None:
        i = self._split(acc.lo)
        j = self._split(acc.hi)
        if acc.write:      # one segment: this write, no reads since
            del self.starts[i + 1:j], self.writes[i + 1:j], self.reads[i + 1:j]
            self.writes[i], self.reads[i] = acc, _NO_READS
            return
        ref = acc.op.ref
        for k in range(i, j):
            kept = tuple(r for r in self.reads[k]
                         if r.op is not acc.op and not clocks.before(r.op.ref, ref))
            self.reads[k] = (*kept, acc)


# ---- in place --------------------------------------------------------------------------------
def in_place_problems(schedule: Schedule) -> list[str]:
    """Why the plan is not right when each rank's output IS its input (the caller's one tensor,
    e.g. `Communicator.all_reduce(t)` on a `comm.empty` tensor run without copies), or [] when it
    is. Checked on the schedule with every output region renamed onto the input: no race there
    (a peer's read of an input element ordered before this rank overwrites it) and the input
    ends holding the collective's output. A lowering that honours every dependency then runs it
    right in place too (the emulator's `in_place` checks the lowered program the same way)."""
    spec, w = schedule.spec, schedule.world_size
    if spec.accumulates_output:
        return [f"{spec.kind.value}: adds into the output's prior values, which in place are "
                "the input"]
    for r in range(w):
        if spec.input_count(r) != spec.output_count(r):
            return [f"rank {r}: input {spec.input_count(r)} and output {spec.output_count(r)} "
                    "elements differ"]

    def onto_input(reg: Region) -> Region:
        return reg if reg.buffer != OUTPUT else Region(reg.rank, INPUT, reg.offset, reg.count)
    ops = tuple(tuple(replace(op, dst=onto_input(op.dst), srcs=tuple(map(onto_input, op.srcs)))
                      for op in schedule.rank_ops(r)) for r in range(w))
    bufs = tuple({k: v for k, v in schedule.buffers(r).items() if k != OUTPUT} for r in range(w))
    aliased = Schedule(schedule.meta, ExpandedOps(ops, bufs))
    try:
        order = topological_order(aliased)
    except ScheduleError as exc:
        return [f"deadlock: {exc}"]
    notes: list[str] = []
    problems = find_races(aliased, order, notes)
    if notes:
        return notes
    return problems or check_postcondition(aliased, order, result=INPUT)


# ---- postcondition ----------------------------------------------------------------------------
def check_postcondition(schedule: Schedule, order: list[Op], result: str = OUTPUT) -> list[str]:
    """`result`: the buffer that must end holding the output (INPUT for an in-place check)."""
    spec = schedule.spec
    mem: SymbolicMemory[Content] = SymbolicMemory(
        spec, [schedule.buffers(r) for r in range(schedule.world_size)])
    last_writer: dict[tuple[int, str], list[tuple[int, int, str]]] = {}
    for op in order:
        mem.run(op)
        if op.dst.buffer == result:
            last_writer.setdefault((op.dst.rank, result), []).append(
                (op.dst.offset, op.dst.offset + op.dst.count, op.id))
    problems = []
    for r in range(schedule.world_size):
        want = expected_output(spec, r)
        got = mem.bufs[r][result]
        for lo, hi, g in got.read(0, got.size):
            for a, b, w in want.read(lo, hi):
                if g != w:
                    problems.append(_describe(r, a, b, got=g, want=w,
                                              writers=last_writer.get((r, result), [])))
                    break
            if problems and len(problems) >= MAX_PROBLEMS:
                return problems
    return problems


def _describe(rank: int, lo: int, hi: int, *, got: Content, want: Content,
              writers: list[tuple[int, int, str]]) -> str:
    who = [w for a, b, w in writers if a < hi and lo < b]
    by = f" (last written by op {who[-1]})" if who else " (never written)"
    if got is None:
        return f"postcondition: r{rank}.output[{lo}:{hi}] holds nothing{by}"
    g = {(s, d): c for s, d, c in got}
    w = {(s, d): c for s, d, c in want or ()}
    missing = sorted(set(w) - set(g))
    wrong = sorted(k for k in g if k in w and g[k] != w[k])
    whole = all(isinstance(g[k], int) and isinstance(w[k], int) for k in wrong)
    extra = sorted(set(g) - set(w))
    parts = []
    if missing:
        parts.append(f"missing contributions of ranks {[_rank(k[0]) for k in missing[:6]]}")
    if wrong and whole:      # copies and sums only: a count of copies
        doubled = [k for k in wrong if g[k] > w[k]]
        fewer = [k for k in wrong if g[k] < w[k]]
        if doubled:
            times = g[doubled[0]] // w[doubled[0]] if g[doubled[0]] % w[doubled[0]] == 0 else None
            how = "twice" if times == 2 else f"{g[doubled[0]]} times (want {w[doubled[0]]})"
            parts.append(f"contributions of ranks {[_rank(k[0]) for k in doubled[:6]]} counted {how}")
        if fewer:
            parts.append(f"contributions of ranks {[_rank(k[0]) for k in fewer[:6]]} counted "
                         f"{g[fewer[0]]} times instead of {w[fewer[0]]}")
    elif wrong:              # a reduce's scale weighed them
        k0 = wrong[0]
        ratio = g[k0] / w[k0]
        parts.append(f"contributions of ranks {[_rank(k[0]) for k in wrong[:6]]} weigh {g[k0]} "
                     f"instead of {w[k0]} (x{float(ratio):.6g}; check the reduces' scale)")
    if extra:
        parts.append(f"unexpected contributions {[(_rank(s), d) for s, d in extra[:6]]}")
    return f"postcondition: r{rank}.output[{lo}:{hi}]: {'; '.join(parts) or 'wrong element mapping'}{by}"


def _rank(source: int) -> str | int:
    return source if source >= 0 else f"out{-1 - source}"
