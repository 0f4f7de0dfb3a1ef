"""Independent ops at the head of a channel run on channels of their own.

Why: a plan orders the ops of one (rank, channel), and some plans put independent ops on one
channel because on a switched network one writer per destination port per step is the point
(`direct`'s swizzled pushes). Inside one NVLink domain the kernel can push to every peer at
once, and the order only made the pushes wait for each other: a 2 MiB `direct` all-gather on 4
H100s spent 21 of its 22 us in three pushes run one after another, each behind a grid-wide
signal and wait (bench/results/gpu/w4/README.md, in-kernel stamps), where `hier_2d`, whose
single row moves the same bytes, took 14.

The rule, derived from the schedule: on each (rank, channel), the longest run of ops from the
channel's start that depend on nothing and touch no memory another op of the run touches
(no two write overlapping regions, none reads what another writes), where the run pushes to at
least two peers. A run of one push beside local work gains nothing: the kernel already walks such
rows CTA by CTA without a wait between them, and split it cost two more barrier rows (2 x H200,
all_to_all 1 MiB hier 10.9 us split against 9.8 unsplit; the best family at 16 MiB within 1 %: one A/B run,
bench/results/gpu/w4/README.md). Nothing can be ordered
before such an op but the ops of the run ahead of it, and it conflicts with none of them, so
dropping those orders loses nothing the op itself needed. What others needed is kept: the op
that followed the run on the channel, and every op that depended on a run op, depend on every
run op ahead of it too (they were ordered after all of them). The result is an ordinary
schedule: the checker and the reference executor verify it like any plan
(tests/test_channel_split.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hiercoll.schedule import ExpandedOps, Op, OpRef, Region, Schedule


def split_independent_heads(schedule: Schedule, min_push_peers: int = 2) -> Schedule:
    """`schedule` with each channel's independent head ops on channels of their own (above),
    where a run pushes to at least `min_push_peers` peers (0: any run of two ops, the rule of
    84b9a30 / 2e0de52, which calibration needs to price those commits' bench rows); the same
    object where no channel has such a run."""
    w = schedule.world_size
    extra_deps: dict[OpRef, list[OpRef]] = defaultdict(list)   # next op -> the moved run ops
    ahead: dict[OpRef, list[OpRef]] = {}      # a moved run op -> the run ops ahead of it
    channel: dict[OpRef, int] = {}
    for r in range(w):
        by_channel: dict[int, list[Op]] = defaultdict(list)
        for op in schedule.rank_ops(r):
            by_channel[op.channel].append(op)
        fresh = max(by_channel, default=-1) + 1
        for chain in by_channel.values():
            run = _independent_head(chain)
            if len(run) < 2 or len({op.dst.rank for op in run if op.dst.rank != r}) < min_push_peers:
                continue            # side by side pays only where it loads links to several peers
            for op in run[1:]:
                channel[op.ref] = fresh
                fresh += 1
            if len(chain) > len(run):         # the next op waited for the whole run
                extra_deps[chain[len(run)].ref].extend(op.ref for op in run[1:])
            ahead.update((op.ref, [o.ref for o in run[:i]]) for i, op in enumerate(run) if i)
    if not channel:
        return schedule
    out = []
    for r in range(w):
        fixed = []
        for op in schedule.rank_ops(r):
            # ... and who depended on a moved op waits for the run ops ahead of it too
            more = [a for d in op.deps for a in ahead.get(d, ())]
            deps = tuple(dict.fromkeys((*op.deps, *extra_deps.get(op.ref, ()), *more)))
            fixed.append(replace(op, channel=channel.get(op.ref, op.channel), deps=deps))
        out.append(tuple(fixed))
    buffers = tuple(dict(schedule.buffers(r)) for r in range(w))
    return Schedule(schedule.meta, ExpandedOps(tuple(out), buffers))


def _independent_head(chain: list[Op]) -> list[Op]:
    """The longest prefix of a channel's ops with no dependencies and no memory conflict
    between any two of them (no two write overlapping regions, none reads what another writes).
    Regions are kept per (rank, buffer): a run of pushes to W peers checks each against its own
    peer's few regions, not against the whole run."""
    run: list[Op] = []
    written: dict[tuple[int, str], list[Region]] = defaultdict(list)
    read: dict[tuple[int, str], list[Region]] = defaultdict(list)
    for op in chain:
        dst = (op.dst.rank, op.dst.buffer)
        if op.deps or any(op.dst.overlaps(x) for x in (*written[dst], *read[dst])) or any(
                reg.overlaps(x) for reg in op.reads() for x in written[(reg.rank, reg.buffer)]):
            break
        run.append(op)
        written[dst].append(op.dst)
        for reg in op.reads():
            read[(reg.rank, reg.buffer)].append(reg)
    return run
