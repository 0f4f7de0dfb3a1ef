"""Static validation before any timing: deadlock, races, and the postcondition.

- Deadlock: a cycle through dependencies and channel order (names an op on it).
- Races: two ops touching overlapping memory, at least one writing, that the happens-before
  order (deps + channel order, transitively) does not order — e.g. a buffer overwritten before
  a peer read it, or a reduce reading a region a peer is still writing. Vector clocks over
  (rank, channel) streams answer "is a before b" in O(1).
- Postcondition: symbolic execution (see symbolic.py) in a topological order; every output range
  must hold exactly the contributions the collective defines — none missing, none doubled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hiercoll.errors import ScheduleError
from hiercoll.schedule import OUTPUT, Op, OpRef, Schedule, predecessor_map, topological_order
from hiercoll.sim.symbolic import Content, SymbolicMemory, expected_output

MAX_CLOCK_CELLS = 50_000_000   # ops x streams; beyond this the race check is skipped (and said)
MAX_PROBLEMS = 20


@dataclass
class CheckReport:
    ok: bool
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "notes": self.notes}


def check(schedule: Schedule) -> CheckReport:
    schedule.refuse_library_call("check")
    problems: list[str] = [f"op {op.id}: a {op.kind.value} with no sources (nothing to read; "
                           "a split nobody sends needs no op)"
                           for r in range(schedule.world_size) for op in schedule.rank_ops(r)
                           if not op.srcs]
    if problems:
        return CheckReport(False, problems[:MAX_PROBLEMS])
    notes: list[str] = []
    try:
        order = topological_order(schedule)
    except ScheduleError as exc:
        return CheckReport(False, [f"deadlock: {exc}"])
    problems += find_races(schedule, order, notes)
    problems += check_postcondition(schedule, order)
    return CheckReport(not problems, problems[:MAX_PROBLEMS], notes)


# ---- happens-before ---------------------------------------------------------------------------
class Clocks:
    """Vector clock per op over (rank, channel) streams: clock[stream] = how many of that
    stream's ops are ordered before (or are) this op."""

    def __init__(self, schedule: Schedule, order: list[Op]):
        self.stream: dict[OpRef, int] = {}
        self.pos: dict[OpRef, int] = {}
        ids: dict[tuple[int, int], int] = {}
        for r in range(schedule.world_size):
            for op in schedule.rank_ops(r):
                self.stream[op.ref] = ids.setdefault((op.rank, op.channel), len(ids))
        counts = [0] * len(ids)
        for r in range(schedule.world_size):
            for op in schedule.rank_ops(r):
                sid = self.stream[op.ref]
                counts[sid] += 1
                self.pos[op.ref] = counts[sid]
        self.num_streams = len(ids)
        preds = predecessor_map(schedule)
        self.clock: dict[OpRef, np.ndarray] = {}
        for op in order:
            ps = preds[op.ref]
            vc = (np.max(np.stack([self.clock[p] for p in ps]), axis=0) if ps
                  else np.zeros(self.num_streams, dtype=np.int32))
            vc = vc.copy()
            vc[self.stream[op.ref]] = self.pos[op.ref]
            self.clock[op.ref] = vc

    def before(self, a: OpRef, b: OpRef) -> bool:
        return a != b and self.clock[b][self.stream[a]] >= self.pos[a]


def find_races(schedule: Schedule, order: list[Op], notes: list[str]) -> list[str]:
    num_ops = len(order)
    streams = len({(op.rank, op.channel) for op in order})
    if num_ops * streams > MAX_CLOCK_CELLS:
        notes.append(f"race check skipped: {num_ops} ops x {streams} streams is too large")
        return []
    clocks = Clocks(schedule, order)
    accesses: dict[tuple[int, str], list[tuple[int, int, Op, bool]]] = {}
    for op in order:
        for reg in op.srcs:
            if reg.count:
                accesses.setdefault((reg.rank, reg.buffer), []).append(
                    (reg.offset, reg.offset + reg.count, op, False))
        if op.dst.count:
            accesses.setdefault((op.dst.rank, op.dst.buffer), []).append(
                (op.dst.offset, op.dst.offset + op.dst.count, op, True))
    problems: list[str] = []
    for (rank, buf), items in sorted(accesses.items()):
        items.sort(key=lambda t: (t[0], t[1]))
        active: list[tuple[int, int, Op, bool]] = []
        for lo, hi, op, write in items:
            active = [a for a in active if a[1] > lo]
            for alo, ahi, aop, awrite in active:
                if (write or awrite) and aop is not op and not clocks.before(aop.ref, op.ref) \
                        and not clocks.before(op.ref, aop.ref):
                    olo, ohi = max(lo, alo), min(hi, ahi)
                    what = "write/write" if write and awrite else "read/write"
                    problems.append(f"race ({what}) on r{rank}.{buf}[{olo}:{ohi}]: op {aop.id} "
                                    f"and op {op.id} are not ordered by dependencies or channel order")
                    if len(problems) >= MAX_PROBLEMS:
                        return problems
            active.append((lo, hi, op, write))
    return problems


# ---- postcondition ----------------------------------------------------------------------------
def check_postcondition(schedule: Schedule, order: list[Op]) -> list[str]:
    spec = schedule.spec
    mem = SymbolicMemory(spec, [schedule.buffers(r) for r in range(schedule.world_size)])
    last_writer: dict[tuple[int, str], list[tuple[int, int, str]]] = {}
    for op in order:
        mem.run(op)
        if op.dst.buffer == OUTPUT:
            last_writer.setdefault((op.dst.rank, OUTPUT), []).append(
                (op.dst.offset, op.dst.offset + op.dst.count, op.id))
    problems = []
    for r in range(schedule.world_size):
        want = expected_output(spec, r)
        got = mem.bufs[r][OUTPUT]
        for lo, hi, g in got.read(0, got.size):
            for a, b, w in want.read(lo, hi):
                if g != w:
                    problems.append(_describe(r, a, b, got=g, want=w,
                                              writers=last_writer.get((r, OUTPUT), [])))
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
