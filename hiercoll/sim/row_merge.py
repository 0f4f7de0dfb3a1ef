"""Result copies that the cuda lowering folds into the row that computes them, for timing.

The lowering stores a row's result to more destinations as each step is computed
(`executor/cuda/lowering._merge_result_copies`): `hier_2d`'s all-gather on one node (a self copy,
then pushes of it to every peer) runs as one row that reads the input once and stores four
copies. Timed as written, those pushes waited for the copy and paid a launch each, one after
another: 22.5 us simulated against 7.8 measured at 8 KiB on 4 x H200
(bench/results/gpu/regret/final-h200-w4). Here such a copy starts with its row instead, on a
channel of its own (its bytes move beside the row's), and the row count says how many rows the
kernel walks, so that two plans the simulator times alike can be told apart by it
(`planner/search/candidates.rank_key`).

The result is for timing only: the moved copy reads its row's destination before the row writes
it, which no schedule to run may do (the lowering keeps the order inside each CTA). The rule is
the lowering's, on ops: a copy whose only dependency is an SM op of its own rank, that reads
exactly that op's destination (same count) and is not a reduce; rows that reduce only up to
MERGE_MAX_BYTES, copy rows of the rank's own memory at any size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hiercoll.schedule import ExpandedOps, Op, OpKind, OpRef, Schedule, kahn_order, predecessor_map

# Reduce rows up to this size take their result copies as more destinations (the executor's
# limit: executor/cuda/lowering.py has the measurements behind it).
MERGE_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Merged:
    schedule: Schedule      # the result copies beside their rows (timing only)
    rows: int               # rows of the busiest rank's kernel: its ops less the merged copies,
    #                         plus its barrier rows
    barrier_rows: int = 0   # of those, the fused kernel's start wait / end arrival that run as
    #                         rows of their own (`barrier_rows`), on the rank with the most


def merge_result_copies(schedule: Schedule, on_sms: Callable[[Op], bool],
                        one_kernel: bool = True) -> Merged:
    """`schedule` with every result copy the lowering folds into its row moved beside it
    (above); `on_sms(op)`: whether the lowering runs `op` as a row of its kernel;
    `one_kernel`: whether the lowering's knobs fuse a call into one kernel where every op is a
    row (its barriers then are rows too: `barrier_rows`)."""
    isz = schedule.spec.dtype.itemsize
    depth = _depths(schedule)
    out: list[tuple[Op, ...]] = []
    rows = 0
    moved = False
    fused = one_kernel and all(on_sms(op) for op in schedule.ops())
    barriers = 0
    for r in range(schedule.world_size):
        ops = schedule.rank_ops(r)
        joined = _joined(ops, depth, isz, on_sms)
        extra = barrier_rows([op for op in ops if op.ref not in joined], depth) if fused else 0
        barriers = max(barriers, extra)
        fresh = max((op.channel for op in ops), default=-1) + 1
        fixed = []
        for op in ops:
            row = joined.get(op.ref)
            if row is not None:
                op = replace(op, deps=row.deps, channel=fresh)
                fresh += 1
            fixed.append(op)
        rows = max(rows, len(ops) - len(joined) + extra)
        moved = moved or bool(joined)
        out.append(tuple(fixed))
    if not moved:
        return Merged(schedule, rows, barriers)
    buffers = tuple(dict(schedule.buffers(r)) for r in range(schedule.world_size))
    return Merged(Schedule(schedule.meta, ExpandedOps(tuple(out), buffers)), rows, barriers)


def barrier_rows(rows: Sequence[Op], depth: dict[OpRef, int]) -> int:
    """How many of the fused kernel's barrier halves run as rows of their own, of a rank whose
    kernel walks `rows` (its ops less the merged copies; every op of the call a row): the start
    barrier's wait rides on the first row and the end arrival on the last, where every CTA runs
    that row (`executor/cuda/lowering._fused`); where the first or last level splits the grid
    among two or more rows (side by side), that half is a row of its own: one more CTA barrier
    and header, and the level's rows wait for it. `direct` all-to-all at 1 MiB on 2 x H200 walks
    two such rows and measured 11.0-11.2 us in three runs, against 9.8-10.2 for bruck's one row
    after another, which the simulator had timed 1.3 us slower."""
    if not rows:
        return 0
    per_level = Counter(depth[op.ref] for op in rows)
    first, last = min(per_level), max(per_level)
    return int(per_level[first] > 1) + int(per_level[last] > 1)


def _depths(schedule: Schedule) -> dict[OpRef, int]:
    """Each op's longest chain of predecessors (deps and channel order): the level the
    single-stream lowering issues it in (`executor/order.levels`' layering)."""
    preds = predecessor_map(schedule)
    depth: dict[OpRef, int] = {}
    for ref in kahn_order(preds):
        depth[ref] = 1 + max((depth[p] for p in preds[ref]), default=-1)
    return depth


def _joined(ops: Sequence[Op], depth: dict[OpRef, int], itemsize: int,
            on_sms: Callable[[Op], bool]) -> dict[OpRef, Op]:
    """A rank's merged copies -> the row each joins. The rows go in issue order (level, then
    index); a copy joins the row just before it when both run on the whole grid (each alone in
    its level: the lowering splits a level's ops over the grid), it reads exactly that row's
    destination and depends on nothing else (the CTAs order it after the row by themselves)."""
    rows = sorted((op for op in ops if on_sms(op)), key=lambda op: (depth[op.ref], op.index))
    per_level = Counter(depth[op.ref] for op in rows)
    joined: dict[OpRef, Op] = {}
    last: Op | None = None          # the row before, merged copies folded in
    for op in rows:
        whole = per_level[depth[op.ref]] == 1
        if last is not None and whole and _takes(last, op, itemsize):
            joined[op.ref] = last
            continue
        last = op if whole else None
    return joined


def _takes(row: Op, op: Op, itemsize: int) -> bool:
    """Does `row` take copy `op` as one more destination?"""
    if op.kind != OpKind.COPY or op.srcs != (row.dst,) or op.dst.count != row.dst.count:
        return False
    if any(d != row.ref for d in op.deps):
        return False
    small = row.dst.count * itemsize <= MERGE_MAX_BYTES
    own_copy = row.kind == OpKind.COPY and all(s.rank == row.rank for s in row.srcs)
    return small or own_copy
